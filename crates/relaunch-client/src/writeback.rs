//! Early write-out of files while they are being written. A checkpoint is
//! written to the page cache at memory speed and then fsynced: the fsync
//! waits for the whole file to reach the disk, after the writer is done. A
//! [`Flusher`] asks the kernel, every few milliseconds, to start writing
//! out what was added to the files under a directory since its last look
//! (`sync_file_range(SYNC_FILE_RANGE_WRITE)`: start, don't wait), so the
//! disk works while the writer does and the final fsync finds little left.
//! The fsync stays: this only moves work earlier, it promises nothing.

// The one call std and nix do not wrap is `sync_file_range`; the unsafe
// block below is that call, on a descriptor we hold open.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often a [`Flusher`] looks.
const PERIOD: Duration = Duration::from_millis(20);
/// New bytes a file needs before a write-out is started (smaller writes
/// wait for the next look, or the fsync).
const STEP: u64 = 4 << 20;

/// Asks the kernel to start writing `file`'s dirty pages in
/// `offset..offset + len` to disk, and returns without waiting.
pub fn start_writeback(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let (offset, len) = (
        i64::try_from(offset).map_err(io::Error::other)?,
        i64::try_from(len).map_err(io::Error::other)?,
    );
    // SAFETY: `file` keeps its descriptor open for the whole call, and the
    // other arguments are plain integers; nothing of ours is read or written.
    let rc = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A thread that starts the write-out of what is written under a directory
/// (recursively) until [`Flusher::stop`] or drop.
#[derive(Debug)]
pub struct Flusher {
    stop: Arc<AtomicBool>,
    /// Bytes whose write-out it started.
    started: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    pub fn start(dir: &Path) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicU64::new(0));
        let thread = {
            let (dir, stop, total) = (dir.to_path_buf(), stop.clone(), started.clone());
            std::thread::Builder::new()
                .name("relaunch-flush".into())
                .spawn(move || {
                    let mut started = HashMap::new();
                    while !stop.load(Ordering::Relaxed) {
                        look(&dir, &mut started, &total);
                        std::thread::sleep(PERIOD);
                    }
                })?
        };
        Ok(Self {
            stop,
            started,
            thread: Some(thread),
        })
    }

    /// Bytes whose write-out it has started so far.
    pub fn started_bytes(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Stops the thread and waits for it (at most one look).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One look: every regular file under `dir` that grew by [`STEP`] since
/// its last write-out gets the new bytes' write-out started. Errors (a
/// file removed meanwhile, a file system without the call) only mean
/// nothing is started; the fsync does the work then.
fn look(dir: &Path, started: &mut HashMap<PathBuf, u64>, total: &AtomicU64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        if kind.is_dir() {
            look(&path, started, total);
        } else if kind.is_file() {
            let Ok(size) = entry.metadata().map(|m| m.len()) else {
                continue;
            };
            let from = started.get(&path).copied().unwrap_or(0);
            if size >= from + STEP
                && let Ok(file) = File::open(&path)
                && start_writeback(&file, from, size - from).is_ok()
            {
                started.insert(path, size);
                total.fetch_add(size - from, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flusher_starts_the_write_out_of_a_growing_file_and_stops() {
        let dir = std::env::temp_dir().join(format!("relaunch-flush-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let path = dir.join("sub/data.bin");
        let mut flusher = Flusher::start(&dir).unwrap();
        {
            use std::io::Write as _;
            let mut file = File::create(&path).unwrap();
            for _ in 0..16 {
                file.write_all(&[7u8; 1 << 20]).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
            file.sync_all().unwrap();
        }
        flusher.stop();
        flusher.stop(); // twice is fine
        let started = flusher.started_bytes();
        assert!((STEP..=16 << 20).contains(&started), "{started}");
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 16 << 20]);
        let file = File::open(&path).unwrap();
        start_writeback(&file, 0, 16 << 20).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

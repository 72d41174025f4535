//! Progress beats: how a rank tells its launcher that it is still making
//! progress, without a system call.
//!
//! `relaunch run` creates one small file per worker (`beat` in the rank's
//! log directory) and names it in `RELAUNCH_BEAT_FILE`. The first beat of a
//! process maps it; each beat after that is three relaxed atomic stores
//! and a read of the vDSO clock into the shared page (tens of
//! nanoseconds). The launcher maps the same file and reads it whenever it
//! looks, so it sees a rank's progress even while the rank's interpreter
//! is stuck, and needs nothing from it.
//!
//! The record (little-endian words of 8 bytes, at a page-aligned mapping):
//!
//! | word | what |
//! |---|---|
//! | 0 | magic `RLBEAT01` |
//! | 1 | beats so far |
//! | 2 | wall time of the last beat, ns since the Unix epoch |
//! | 3 | the last step given (`i64::MIN`: none yet) |
//! | 4 | wall time when that step was first given, ns |
//! | 5 | the stack-dump signal the rank installed: pid << 32, signal |
//!
//! Wall time, not a monotonic clock: launchers on several hosts compare
//! their ranks' last beats to say which stopped first.

// memmap2 maps files only through `unsafe` calls, and the words of the
// mapping are read and written as atomics through raw pointers (like the
// spool's length words). The mapping is a whole, page-aligned page that
// lives as long as the `Beats` that owns it, so every word is in bounds
// and aligned; no other code touches it as anything but atomics.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use memmap2::MmapMut;

/// The variable that names a worker's beat file.
pub const BEAT_FILE_ENV: &str = "RELAUNCH_BEAT_FILE";

/// The file's length: one page.
const LEN: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"RLBEAT01");
const NO_STEP: i64 = i64::MIN;

const W_MAGIC: usize = 0;
const W_BEATS: usize = 1;
const W_LAST: usize = 2;
const W_STEP: usize = 3;
const W_STEP_AT: usize = 4;
const W_DUMP: usize = 5;

/// One worker's beat record, mapped.
pub struct Beats {
    map: MmapMut,
}

impl std::fmt::Debug for Beats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Beats").field("now", &self.read()).finish()
    }
}

/// What a beat record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BeatState {
    pub beats: u64,
    pub last: Option<SystemTime>,
    pub step: Option<i64>,
    /// When `step` was first given.
    pub step_at: Option<SystemTime>,
    /// The process that installed a stack-dump handler, and its signal.
    pub dump: Option<(u32, i32)>,
}

impl Beats {
    /// Creates (or empties) the record at `path`: what the launcher does
    /// before it starts the worker.
    pub fn create(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.set_len(LEN as u64)?;
        let beats = Self::map(&file)?;
        beats.word(W_STEP).store(NO_STEP as u64, Ordering::Relaxed);
        beats.word(W_MAGIC).store(MAGIC, Ordering::Release);
        Ok(beats)
    }

    /// Maps the record the launcher created at `path`.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        if file.metadata()?.len() != LEN as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a beat file ({LEN} bytes)", path.display()),
            ));
        }
        let beats = Self::map(&file)?;
        if beats.word(W_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a beat file (no magic)", path.display()),
            ));
        }
        Ok(beats)
    }

    fn map(file: &File) -> io::Result<Self> {
        // SAFETY: a shared mapping of a file that only beat records use;
        // its bytes are accessed only as atomics (see `word`), so a write
        // by another process is never a data race on a Rust reference.
        let map = unsafe { MmapMut::map_mut(file)? };
        Ok(Self { map })
    }

    fn word(&self, index: usize) -> &AtomicU64 {
        assert!(index < LEN / 8);
        // SAFETY: in bounds (asserted), 8-byte aligned (the mapping is
        // page-aligned), valid for the mapping's life, which `&self`
        // bounds; every access to these bytes is atomic.
        unsafe { AtomicU64::from_ptr(self.map.as_ptr().add(index * 8).cast::<u64>().cast_mut()) }
    }

    /// A beat: progress now, at `step` if given.
    pub fn beat(&self, step: Option<i64>) {
        let now = now_ns();
        if let Some(step) = step
            && self.word(W_STEP).load(Ordering::Relaxed) as i64 != step
        {
            self.word(W_STEP_AT).store(now, Ordering::Relaxed);
            self.word(W_STEP).store(step as u64, Ordering::Relaxed);
        }
        self.word(W_LAST).store(now, Ordering::Relaxed);
        self.word(W_BEATS).fetch_add(1, Ordering::Relaxed);
    }

    /// Says that process `pid` dumps its stacks on `signal`, unless another
    /// process of the rank said so first (the rank's interpreter imports
    /// relaunch before it starts DataLoader workers, which may import it
    /// again); returns whether this one did.
    pub fn claim_dump_signal(&self, pid: u32, signal: i32) -> bool {
        let word = (u64::from(pid) << 32) | u64::from(signal.unsigned_abs());
        self.word(W_DUMP)
            .compare_exchange(0, word, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub fn read(&self) -> BeatState {
        let at = |ns: u64| (ns != 0).then(|| UNIX_EPOCH + Duration::from_nanos(ns));
        let step = self.word(W_STEP).load(Ordering::Relaxed) as i64;
        let dump = self.word(W_DUMP).load(Ordering::Acquire);
        BeatState {
            beats: self.word(W_BEATS).load(Ordering::Relaxed),
            last: at(self.word(W_LAST).load(Ordering::Relaxed)),
            step: (step != NO_STEP).then_some(step),
            step_at: at(self.word(W_STEP_AT).load(Ordering::Relaxed)),
            dump: (dump != 0).then_some(((dump >> 32) as u32, (dump & 0xffff_ffff) as i32)),
        }
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// This process's record: the file `RELAUNCH_BEAT_FILE` names, mapped at
/// the first call; `None` outside `relaunch run` (or when it cannot be
/// mapped, said once on stderr: beats are never worth failing training).
pub fn this_process() -> Option<&'static Beats> {
    static BEATS: OnceLock<Option<Beats>> = OnceLock::new();
    BEATS
        .get_or_init(|| {
            let path = std::env::var_os(BEAT_FILE_ENV)?;
            match Beats::open(Path::new(&path)) {
                Ok(beats) => Some(beats),
                Err(e) => {
                    // A worker's stderr is where the user looks; tracing may
                    // not be set up in a Python process.
                    #[allow(clippy::print_stderr)]
                    let () = eprintln!(
                        "relaunch: cannot map the beat file {} ({e}); this rank's progress is \
                         not visible to the launcher's hang detection",
                        Path::new(&path).display()
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// A beat of this process, if it runs under `relaunch run`.
pub fn beat(step: Option<i64>) {
    if let Some(beats) = this_process() {
        beats.beat(step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_worker_writes_the_launcher_reads() {
        let dir = std::env::temp_dir().join(format!("relaunch-beat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("beat");
        let launcher = Beats::create(&path).unwrap();
        let fresh = launcher.read();
        assert_eq!(
            (fresh.beats, fresh.last, fresh.step, fresh.dump),
            (0, None, None, None)
        );
        let worker = Beats::open(&path).unwrap();
        let before = SystemTime::now();
        worker.beat(None);
        worker.beat(Some(7));
        let seen = launcher.read();
        assert_eq!((seen.beats, seen.step), (2, Some(7)));
        assert!(seen.last.unwrap() >= before && seen.step_at.unwrap() >= before);
        let first_at = seen.step_at;
        worker.beat(Some(7));
        assert_eq!(
            launcher.read().step_at,
            first_at,
            "the same step keeps its time"
        );
        assert!(worker.claim_dump_signal(4242, 41));
        assert!(
            !worker.claim_dump_signal(4343, 41),
            "the first process keeps it"
        );
        assert_eq!(launcher.read().dump, Some((4242, 41)));
        // A new attempt empties it.
        let again = Beats::create(&path).unwrap();
        assert_eq!(again.read().beats, 0);
        std::fs::write(dir.join("other"), b"not a beat file").unwrap();
        assert!(Beats::open(&dir.join("other")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

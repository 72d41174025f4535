//! Early write-out of a file just written. Where the file system refuses
//! direct I/O, the server's chunk store writes an upload's chunks to the
//! page cache at memory speed and makes them durable when the file
//! commits, with one flush: left alone, the kernel would write gigabytes
//! out only then, and the commit would wait for all of it.
//! [`start_writeback`] asks the kernel to start on a chunk as soon as it is
//! written (`sync_file_range(SYNC_FILE_RANGE_WRITE)`: start, don't wait),
//! so the disk works while the upload goes on and the flush at the commit
//! finds little left. The flush stays: this only moves work earlier, it
//! promises nothing.

// The one call std and nix do not wrap is `sync_file_range`; the unsafe
// block below is that call, on a descriptor we hold open.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd as _;

/// Asks the kernel to start writing `file`'s dirty pages in
/// `offset..offset + len` to disk, and returns without waiting.
pub(crate) fn start_writeback(file: &File, offset: u64, len: u64) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    #[test]
    fn write_out_starts_on_a_written_file_and_leaves_it_intact() {
        let path = std::env::temp_dir().join(format!("relaunch-wb-{}", std::process::id()));
        let mut file = File::create(&path).unwrap();
        file.write_all(&[7u8; 1 << 20]).unwrap();
        start_writeback(&file, 0, 1 << 20).unwrap();
        start_writeback(&file, 0, 0).unwrap(); // 0: to the end of the file
        assert!(start_writeback(&file, u64::MAX, 1).is_err()); // said, not ignored
        file.sync_all().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 1 << 20]);
        std::fs::remove_file(&path).unwrap();
    }
}

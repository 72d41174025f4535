//! BLAKE3 of whole files, as fast as the machine allows: a file that was
//! just written (a checkpoint) is in the page cache, so hashing is bound by
//! the CPU. Used by downloads' checks and by `relaunch.Checkpointer`.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Bytes read per call. Large, so that rayon splits each read over every
/// core with little overhead per read; a power of two, so that BLAKE3's
/// subtrees line up with the reads. Two buffers are live per file.
const READ_BUFFER: usize = 8 << 20;

/// Reads until `buf` is full or the file ends; the bytes read.
fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Below this, splitting the input over threads costs more than it saves
/// (the `blake3` crate's advice for `update_rayon`).
const PARALLEL_MIN: usize = 128 << 10;

fn update(hasher: &mut blake3::Hasher, data: &[u8]) {
    if data.len() < PARALLEL_MIN {
        hasher.update(data);
    } else {
        hasher.update_rayon(data);
    }
}

/// The BLAKE3 hash of the file's contents, read once from start to end.
///
/// A checkpoint's files were just written, so they are usually in the page
/// cache and hashing is bound by the CPU: each buffer is hashed on every
/// core (rayon) while a helper thread reads the next one. Read, not
/// mmapped: a file truncated by someone else mid-hash is then an error (or
/// a hash that no longer matches its size, which the caller checks), never
/// a SIGBUS that kills the training process.
pub fn blake3_of_file(path: &Path) -> io::Result<blake3::Hash> {
    let mut file = File::open(path)?;
    let mut hasher = blake3::Hasher::new();
    let mut current = vec![0u8; READ_BUFFER];
    let mut len = read_full(&mut file, &mut current)?;
    if len < READ_BUFFER {
        // The whole file in one read: nothing to overlap.
        update(&mut hasher, &current[..len]);
        return Ok(hasher.finalize());
    }
    let mut next = vec![0u8; READ_BUFFER];
    while len > 0 {
        len = std::thread::scope(|scope| {
            let reader = scope.spawn(|| read_full(&mut file, &mut next));
            update(&mut hasher, &current[..len]);
            reader
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })?;
        std::mem::swap(&mut current, &mut next);
    }
    Ok(hasher.finalize())
}

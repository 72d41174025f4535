//! BLAKE3 hashes for `relaunch.Checkpointer`, whose manifests name every
//! file's hash and carry one of their own; Python's standard library has no
//! BLAKE3.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

/// Bytes read per call: large enough that BLAKE3 hashes many 1 KiB chunks
/// of each read at once with SIMD, small enough to stay in cache.
const READ_BUFFER: usize = 1 << 20;

/// The BLAKE3 hash of the file's contents, read once from start to end.
fn blake3_of_file(path: &Path) -> io::Result<blake3::Hash> {
    let mut file = File::open(path)?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; READ_BUFFER];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(hasher.finalize()),
            Ok(n) => {
                hasher.update(&buf[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Returns the BLAKE3 hash of the file at `path` as 64 lowercase hex
/// digits. Streams the file (constant memory) with the GIL released, so
/// threads can hash several files at once. Raises `OSError` (its errno
/// subclass, e.g. `FileNotFoundError`) naming the path.
#[pyfunction]
pub(crate) fn hash_file(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    match py.detach(|| blake3_of_file(&path)) {
        Ok(hash) => Ok(hash.to_hex().to_string()),
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(0);
            let message = format!("cannot hash file: {e}");
            let filename = path.display().to_string();
            Err(PyOSError::new_err((errno, message, filename)))
        }
    }
}

/// Returns the BLAKE3 hash of `data` as 64 lowercase hex digits.
#[pyfunction]
pub(crate) fn hash_bytes(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

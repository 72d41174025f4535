//! BLAKE3 hashes for `relaunch.Checkpointer`, whose manifests name every
//! file's hash and carry one of their own; Python's standard library has no
//! BLAKE3.

use std::path::PathBuf;

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

/// Returns the BLAKE3 hash of the file at `path` as 64 lowercase hex
/// digits. Streams the file (constant memory) with the GIL released, so
/// threads can hash several files at once, or fsync one while it is
/// hashed. Raises `OSError` (its errno subclass, e.g. `FileNotFoundError`)
/// naming the path.
#[pyfunction]
pub(crate) fn hash_file(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    match py.detach(|| relaunch_client::hash::blake3_of_file(&path)) {
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

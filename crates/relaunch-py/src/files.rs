//! What `relaunch.Checkpointer` needs of files that Python's standard
//! library lacks: BLAKE3 hashes (its manifests name every file's hash and
//! carry one of their own) and the early write-out of a checkpoint being
//! written ([`Flusher`]).

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

/// Starts the disk write-out of what is written under `dir`, while it is
/// written, so that the fsync at the commit has little left to wait for
/// (`relaunch_client::writeback`). `stop()` ends it and returns the bytes
/// whose write-out it started.
#[pyclass(module = "relaunch._native")]
pub(crate) struct Flusher {
    inner: Option<relaunch_client::writeback::Flusher>,
}

#[pymethods]
impl Flusher {
    #[new]
    fn new(dir: PathBuf) -> PyResult<Self> {
        match relaunch_client::writeback::Flusher::start(&dir) {
            Ok(flusher) => Ok(Self {
                inner: Some(flusher),
            }),
            Err(e) => Err(PyOSError::new_err((
                e.raw_os_error().unwrap_or(0),
                format!("cannot start a write-out thread: {e}"),
                dir.display().to_string(),
            ))),
        }
    }

    fn stop(&mut self, py: Python<'_>) -> u64 {
        match self.inner.take() {
            Some(mut flusher) => py.detach(move || {
                flusher.stop();
                flusher.started_bytes()
            }),
            None => 0,
        }
    }
}

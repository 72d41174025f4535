//! Files of a run from Python: `relaunch.upload_file` and
//! `relaunch.download` call these. Each call runs on a runtime of its own
//! with the GIL released, and Ctrl-C interrupts it (an interrupted upload
//! or download resumes where it stopped when called again).

use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use relaunch_client::{Client, ClientError, files};

use crate::errors::tracking_error;

/// How often a transfer looks for Ctrl-C.
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// Runs `future` to its end with the GIL released, looking for Ctrl-C
/// between slices.
pub(crate) fn run_interruptibly<T: Send>(
    py: Python<'_>,
    future: impl Future<Output = Result<T, ClientError>> + Send,
) -> PyResult<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            pyo3::exceptions::PyRuntimeError::new_err(format!("cannot start a runtime: {e}"))
        })?;
    let mut future = pin!(future);
    loop {
        let slice = py.detach(|| {
            runtime.block_on(async {
                tokio::time::timeout(SIGNAL_CHECK_INTERVAL, future.as_mut()).await
            })
        });
        match slice {
            Ok(result) => return result.map_err(tracking_error),
            Err(_) => py.check_signals()?,
        }
    }
}

/// Uploads `path` to `run` as `name`; returns what was sent.
#[pyfunction]
#[pyo3(signature = (server, token, run, path, name))]
pub(crate) fn upload_file<'py>(
    py: Python<'py>,
    server: &str,
    token: Option<&str>,
    run: String,
    path: PathBuf,
    name: String,
) -> PyResult<Bound<'py, PyDict>> {
    let client = Client::new(server, token).map_err(tracking_error)?;
    let uploaded = run_interruptibly(py, async move {
        files::upload(&client, &run, &path, &name, &|_, _| {}).await
    })?;
    let out = PyDict::new(py);
    out.set_item("name", &uploaded.file.name)?;
    out.set_item("size", uploaded.file.size)?;
    out.set_item("blake3", &uploaded.file.blake3)?;
    out.set_item("chunks", uploaded.chunks)?;
    out.set_item("sent_chunks", uploaded.sent_chunks)?;
    out.set_item("sent_bytes", uploaded.sent_bytes)?;
    Ok(out)
}

/// Downloads `name` of `run` to `dest`; returns its size and hash.
#[pyfunction]
#[pyo3(signature = (server, token, run, name, dest))]
pub(crate) fn download_file<'py>(
    py: Python<'py>,
    server: &str,
    token: Option<&str>,
    run: String,
    name: String,
    dest: PathBuf,
) -> PyResult<Bound<'py, PyDict>> {
    let client = Client::new(server, token).map_err(tracking_error)?;
    let got = run_interruptibly(py, async move {
        files::download(&client, &run, &name, &dest, &|_, _| {}).await
    })?;
    let out = PyDict::new(py);
    out.set_item("size", got.size)?;
    out.set_item("blake3", &got.blake3)?;
    out.set_item("resumed_from", got.resumed_from)?;
    Ok(out)
}

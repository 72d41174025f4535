//! `/api/v1` calls the Python API has no function for, made through
//! relaunch's client (its server list, token, replicas and failover) for
//! the ml-logger shim: read a run, list its files, set its config. Each
//! call has a deadline and Ctrl-C interrupts it. An answer that is not a
//! success comes back as `(status, the server's message)` for the caller
//! to explain in its own terms; a server that does not answer raises.

use std::future::Future;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use relaunch_api::{HistoryQuery, RunPatch};
use relaunch_client::{Client, ClientError};
use serde::Serialize;

use crate::errors::tracking_error;
use crate::transfer::run_interruptibly;

/// A status and a body: JSON on a success, the server's message otherwise.
type Answer = (u16, String);

/// One server list (with its token); share one per list so that every
/// caller moves on together when a replica stops answering.
#[pyclass(module = "relaunch._native", frozen)]
pub(crate) struct ServerApi {
    client: Client,
}

/// A call's `timeout` in seconds as a deadline; 0, a negative or a
/// non-finite number is refused.
fn deadline(timeout: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("timeout={timeout} is not > 0 seconds")))
}

fn answer<T: Serialize>(result: Result<T, ClientError>) -> Result<Answer, ClientError> {
    match result {
        Ok(value) => serde_json::to_string(&value)
            .map(|json| (200, json))
            .map_err(|e| ClientError::Corrupt(format!("cannot write the answer as JSON: {e}"))),
        Err(ClientError::Status {
            status, message, ..
        }) => Ok((status, message)),
        Err(e) => Err(e),
    }
}

impl ServerApi {
    fn call<T: Serialize>(
        &self,
        py: Python<'_>,
        what: &str,
        timeout: f64,
        request: impl Future<Output = Result<T, ClientError>> + Send,
    ) -> PyResult<Answer> {
        let deadline = deadline(timeout)?;
        let url = self.client.url().to_owned();
        run_interruptibly(py, async move {
            match tokio::time::timeout(deadline, request).await {
                Ok(result) => answer(result),
                Err(_) => Err(ClientError::Timeout(format!(
                    "the relaunch server at {url} did not answer {what} within {timeout} s"
                ))),
            }
        })
    }
}

#[pymethods]
impl ServerApi {
    #[new]
    #[pyo3(signature = (server, token=None))]
    fn new(server: &str, token: Option<&str>) -> PyResult<Self> {
        Ok(Self {
            client: Client::new(server, token).map_err(tracking_error)?,
        })
    }

    /// The server in use (the first until one stops answering).
    #[getter]
    fn url(&self) -> String {
        self.client.url().to_owned()
    }

    /// `GET /runs/{run}`.
    fn run(&self, py: Python<'_>, run: String, timeout: f64) -> PyResult<Answer> {
        let what = format!("reading run {run}");
        let client = self.client.clone();
        self.call(
            py,
            &what,
            timeout,
            async move { client.get_run(&run).await },
        )
    }

    /// `GET path?query` (JSON of any shape): the read API's listings.
    fn get(
        &self,
        py: Python<'_>,
        path: String,
        query: Vec<(String, String)>,
        timeout: f64,
    ) -> PyResult<Answer> {
        let what = format!("reading {path}");
        let client = self.client.clone();
        self.call(py, &what.clone(), timeout, async move {
            client.get_value(&what, &path, &query).await
        })
    }

    /// `GET /runs/{run}/history`: `(200, the column body)`, or a status
    /// and the server's message (UTF-8) otherwise. A `bytearray`, so that
    /// the arrays numpy maps over it are writable and a DataFrame can use
    /// them without another copy.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (run, keys, rank, attempt, min_step, max_step, timeout))]
    fn history(
        &self,
        py: Python<'_>,
        run: String,
        keys: Vec<String>,
        rank: Option<u32>,
        attempt: Option<u32>,
        min_step: Option<i64>,
        max_step: Option<i64>,
        timeout: f64,
    ) -> PyResult<(u16, Py<PyByteArray>)> {
        let deadline = deadline(timeout)?;
        let query = HistoryQuery {
            keys,
            rank,
            min_step,
            max_step,
            attempt,
        };
        let client = self.client.clone();
        let url = client.url().to_owned();
        let answer = run_interruptibly(py, async move {
            match tokio::time::timeout(deadline, client.history(&run, &query)).await {
                Ok(Ok(body)) => Ok((200, body)),
                Ok(Err(ClientError::Status {
                    status, message, ..
                })) => Ok((status, bytes::Bytes::from(message))),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(ClientError::Timeout(format!(
                    "the relaunch server at {url} did not answer reading the history of run {run} within {timeout} s"
                ))),
            }
        })?;
        Ok((answer.0, PyByteArray::new(py, &answer.1).unbind()))
    }

    /// `GET /runs/{run}/files`.
    fn files(&self, py: Python<'_>, run: String, timeout: f64) -> PyResult<Answer> {
        let what = format!("listing the files of run {run}");
        let client = self.client.clone();
        self.call(py, &what, timeout, async move { client.files(&run).await })
    }

    /// `PATCH /runs/{run}` with the whole `config` (JSON text).
    fn set_config(
        &self,
        py: Python<'_>,
        run: String,
        config: &str,
        timeout: f64,
    ) -> PyResult<Answer> {
        let config: serde_json::Value = serde_json::from_str(config)
            .map_err(|e| PyValueError::new_err(format!("config is not JSON: {e}")))?;
        let patch = RunPatch {
            config: Some(config),
            ..RunPatch::default()
        };
        let what = format!("saving the config of run {run}");
        let client = self.client.clone();
        self.call(py, &what, timeout, async move {
            client.patch_run(&run, &patch).await
        })
    }
}

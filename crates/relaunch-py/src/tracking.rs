//! `relaunch._native.Run`: the tracking client's run handle. `log` walks the
//! dict in Rust and appends one record to the spool while holding the GIL
//! (a few microseconds, no network); `flush` and `finish` release the GIL
//! while they wait for the server and can be interrupted with Ctrl-C.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyInt, PyString};
use relaunch_client::run::MetricsBody;
use relaunch_client::{ClientError, Run as ClientRun, RunOptions};

use crate::errors::tracking_error;

/// How often a wait for the server looks for Ctrl-C.
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// Nested dicts deeper than this are refused (a cycle, most likely).
const MAX_DEPTH: usize = 16;

#[pyclass(module = "relaunch._native", frozen)]
pub(crate) struct Run {
    inner: ClientRun,
}

/// A `log()` failure: a Python exception raised while reading the dict, or
/// the client's error.
enum LogError {
    Py(PyErr),
    Client(ClientError),
}

impl From<ClientError> for LogError {
    fn from(e: ClientError) -> Self {
        Self::Client(e)
    }
}

impl From<PyErr> for LogError {
    fn from(e: PyErr) -> Self {
        Self::Py(e)
    }
}

/// The value as a float: Python floats and ints directly, anything else
/// through `__float__` (numpy scalars, one-element tensors).
fn number(key: &str, value: &Bound<'_, PyAny>) -> Result<f64, LogError> {
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(f.value());
    }
    if value.is_instance_of::<PyInt>() {
        // Beyond 2**53 an int loses precision as a float, as in every tracker.
        return value.extract::<f64>().map_err(LogError::Py);
    }
    if value.is_instance_of::<PyString>() || value.is_none() {
        return Err(LogError::Py(PyTypeError::new_err(format!(
            "the value of {key:?} is {}, not a number; log numbers (int, float, numpy or \
             one-element torch scalars), and put text in config or notes",
            value.get_type().name()?
        ))));
    }
    value.extract::<f64>().map_err(|_| {
        let type_name = value
            .get_type()
            .name()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string());
        LogError::Py(PyTypeError::new_err(format!(
            "the value of {key:?} ({type_name}) cannot be read as one number; log a Python \
             number, a numpy scalar or a one-element tensor (e.g. loss.item())"
        )))
    })
}

/// Puts every value of `dict` into `body`, nested dicts as `outer/inner`.
fn put_dict(
    body: &mut MetricsBody<'_>,
    prefix: &str,
    dict: &Bound<'_, PyDict>,
    depth: usize,
) -> Result<(), LogError> {
    if depth > MAX_DEPTH {
        return Err(LogError::Py(PyValueError::new_err(format!(
            "metrics nested deeper than {MAX_DEPTH} levels under {prefix:?}; is a dict inside itself?"
        ))));
    }
    for (key, value) in dict.iter() {
        let key = key.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "metric names must be str, not {}: {key}",
                key.get_type()
                    .name()
                    .map_or_else(|_| "?".to_owned(), |n| n.to_string())
            ))
        })?;
        let name = key.to_str()?;
        if let Ok(inner) = value.cast::<PyDict>() {
            let nested = if prefix.is_empty() {
                name.to_owned()
            } else {
                format!("{prefix}/{name}")
            };
            put_dict(body, &nested, inner, depth + 1)?;
            continue;
        }
        if prefix.is_empty() {
            let v = number(name, &value)?;
            body.put(name, v)?;
        } else {
            let full = format!("{prefix}/{name}");
            let v = number(&full, &value)?;
            body.put(&full, v)?;
        }
    }
    Ok(())
}

fn log_error(e: LogError) -> PyErr {
    match e {
        LogError::Py(e) => e,
        LogError::Client(e) => tracking_error(e),
    }
}

fn seconds(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    timeout
        .map(|t| {
            Duration::try_from_secs_f64(t).map_err(|_| {
                PyValueError::new_err(format!("timeout must be seconds >= 0, not {t}"))
            })
        })
        .transpose()
}

/// Runs `wait(step)` with the GIL released in slices of
/// [`SIGNAL_CHECK_INTERVAL`] until it succeeds, fails otherwise than by
/// timing out, or `timeout` passes; Ctrl-C interrupts it.
///
/// It beats for `relaunch run`'s hang detection while the wait goes
/// somewhere: a wait with a timeout before each slice (it ends by itself,
/// so a rank that waits at exit for a server that is gone is not hung),
/// one without whenever `pending()` (what is left to ship) went down since
/// the last slice. A rank shipping its last records to a slow server is
/// then never taken for a hung one, but a wait without a timeout that
/// makes no progress is.
fn wait_interruptibly(
    py: Python<'_>,
    timeout: Option<Duration>,
    pending: impl Fn() -> u64,
    wait: impl Fn(Duration) -> Result<(), ClientError> + Sync,
) -> PyResult<()> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut left = pending();
    loop {
        let slice = match deadline {
            Some(deadline) => deadline
                .saturating_duration_since(Instant::now())
                .min(SIGNAL_CHECK_INTERVAL),
            None => SIGNAL_CHECK_INTERVAL,
        };
        let now_left = pending();
        if deadline.is_some() || now_left < left {
            relaunch_client::beat::beat(None);
        }
        left = now_left;
        let result = py.detach(|| wait(slice));
        match result {
            Ok(()) => {
                relaunch_client::beat::beat(None);
                return Ok(());
            }
            Err(e) if e.kind() == relaunch_client::ErrorKind::Timeout => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    // Report the whole wait, not the last slice.
                    let message = e.to_string().replace(
                        &format!("after {:.1} s", slice.as_secs_f64()),
                        &format!("after {:.1} s", timeout.unwrap_or_default().as_secs_f64()),
                    );
                    return Err(tracking_error(ClientError::Timeout(message)));
                }
                py.check_signals()?;
            }
            Err(e) => return Err(tracking_error(e)),
        }
    }
}

/// `work()`, beating every [`SIGNAL_CHECK_INTERVAL`] from another thread
/// until it returns: for bounded work whose progress cannot be measured.
fn beating<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                relaunch_client::beat::beat(None);
                std::thread::sleep(SIGNAL_CHECK_INTERVAL);
            }
        });
        let out = work();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    })
}

#[pymethods]
impl Run {
    #[new]
    #[pyo3(signature = (*, project=None, id=None, name=None, config_json=None, tags=Vec::new(),
        notes=None, server=None, token=None, offline=false, dir=None, rank=None,
        lifecycle_events=None, ship_interval=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        project: Option<String>,
        id: Option<String>,
        name: Option<String>,
        config_json: Option<String>,
        tags: Vec<String>,
        notes: Option<String>,
        server: Option<String>,
        token: Option<String>,
        offline: bool,
        dir: Option<PathBuf>,
        rank: Option<u32>,
        lifecycle_events: Option<bool>,
        ship_interval: Option<f64>,
    ) -> PyResult<Self> {
        let config = config_json
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("config is not JSON: {e}")))?;
        let options = RunOptions {
            project,
            id,
            name,
            config,
            tags,
            notes,
            server,
            token,
            offline,
            dir,
            rank,
            lifecycle_events,
            ship_interval: seconds(ship_interval)?.unwrap_or_default(),
            ..RunOptions::default()
        };
        let inner = ClientRun::start(options).map_err(tracking_error)?;
        Ok(Self { inner })
    }

    #[getter]
    fn id(&self) -> &str {
        self.inner.id()
    }

    #[getter]
    fn rank(&self) -> u32 {
        self.inner.rank()
    }

    #[getter]
    fn writer(&self) -> &str {
        self.inner.writer()
    }

    #[getter]
    fn dir(&self) -> PathBuf {
        self.inner.dir().to_path_buf()
    }

    #[getter]
    fn server(&self) -> Option<&str> {
        self.inner.server()
    }

    #[getter]
    fn attempt(&self) -> Option<u32> {
        self.inner.attempt()
    }

    #[getter]
    fn pending(&self) -> u64 {
        self.inner.pending()
    }

    #[pyo3(signature = (values, step=None))]
    fn log(&self, values: &Bound<'_, PyDict>, step: Option<i64>) -> PyResult<i64> {
        self.inner
            .log_with(step, |body| put_dict(body, "", values, 0))
            .map_err(log_error)
    }

    #[pyo3(signature = (kind, text="", data_json=None))]
    fn event(&self, kind: &str, text: &str, data_json: Option<&str>) -> PyResult<()> {
        let data = match data_json {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| PyValueError::new_err(format!("event data is not JSON: {e}")))?,
            None => serde_json::Value::Null,
        };
        self.inner.event(kind, text, &data).map_err(tracking_error)
    }

    /// Snapshots the file and uploads it in the background; returns its name.
    #[pyo3(signature = (path, name=None, take=false))]
    fn save_file(
        &self,
        py: Python<'_>,
        path: std::path::PathBuf,
        name: Option<&str>,
        take: bool,
    ) -> PyResult<String> {
        py.detach(|| self.inner.save_file(&path, name, take))
            .map_err(tracking_error)
    }

    #[pyo3(signature = (timeout=None))]
    fn flush(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        wait_interruptibly(
            py,
            seconds(timeout)?,
            || self.inner.pending(),
            |slice| self.inner.flush(Some(slice)),
        )
    }

    #[pyo3(signature = (timeout=None, error=None))]
    fn finish(&self, py: Python<'_>, timeout: Option<f64>, error: Option<&str>) -> PyResult<()> {
        let timeout = seconds(timeout)?;
        self.inner.end(error).map_err(tracking_error)?;
        // Ship everything, interruptibly; finish then finds nothing to wait for.
        wait_interruptibly(
            py,
            timeout,
            || self.inner.pending(),
            |slice| self.inner.flush(Some(slice)),
        )?;
        // Stopping the shipper and the uploads is bounded (5 s): it beats.
        py.detach(|| beating(|| self.inner.finish(Some(Duration::from_secs(5)), error)))
            .map_err(tracking_error)
    }

    /// In a child after `fork`: the handle is the parent's; stop using it.
    fn _disown(&self) {
        self.inner.disown();
    }

    /// Stops shipping now; what is not on the server stays spooled.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.close());
    }
}

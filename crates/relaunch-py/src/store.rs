//! `relaunch._native.Store`: a blocking client over the async Rust client.
//!
//! Keys get a prefix, PyTorch's `/` unless told otherwise, so that this
//! client and `torch.distributed.TCPStore` see the same keys on one server.

use std::future::Future;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use relaunch_store::{ClientOptions, StoreClient, StoreError};
use tokio::runtime::Runtime;

use crate::blocking::{GilPolicy, block_on};

#[pyclass(module = "relaunch._native", frozen)]
pub(crate) struct Store {
    /// A runtime of its own, without threads: calls run on the caller's
    /// thread, which keeps latency low and survives `fork`.
    runtime: Runtime,
    client: StoreClient,
    timeout: Duration,
    gil: GilPolicy,
    /// Put in front of every key on the wire.
    prefix: String,
}

impl Store {
    fn key(&self, k: &str) -> String {
        format!("{}{k}", self.prefix)
    }

    fn keys(&self, ks: &[String]) -> Vec<String> {
        ks.iter().map(|k| self.key(k)).collect()
    }

    fn block<T, F>(&self, py: Python<'_>, op: F) -> PyResult<T>
    where
        T: Send,
        F: Future<Output = Result<T, StoreError>> + Send,
    {
        block_on(py, &self.runtime, Some(&self.gil), op)
    }
}

/// The interpreter's GIL switch interval, `sys.getswitchinterval()`.
fn switch_interval(py: Python<'_>) -> PyResult<Duration> {
    let seconds: f64 = py
        .import("sys")?
        .call_method0("getswitchinterval")?
        .extract()?;
    Ok(Duration::from_secs_f64(seconds))
}

fn seconds(timeout: Option<f64>, default: Duration) -> Duration {
    timeout.map_or(default, Duration::from_secs_f64)
}

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (host, port, timeout, prefix=String::from("/")))]
    fn new(
        py: Python<'_>,
        host: String,
        port: u16,
        timeout: f64,
        prefix: String,
    ) -> PyResult<Self> {
        let timeout = Duration::from_secs_f64(timeout);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let options = ClientOptions {
            timeout,
            connect_timeout: timeout,
            ..ClientOptions::default()
        };
        let client = block_on(
            py,
            &runtime,
            None,
            StoreClient::connect(host, port, options),
        )?;
        Ok(Self {
            runtime,
            client,
            timeout,
            gil: GilPolicy::new(switch_interval(py)?),
            prefix,
        })
    }

    #[getter]
    fn timeout(&self) -> f64 {
        self.timeout.as_secs_f64()
    }

    fn set(&self, py: Python<'_>, key: &str, value: Vec<u8>) -> PyResult<()> {
        self.block(py, self.client.set(self.key(key), value))
    }

    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyBytes>> {
        let value = self.block(py, self.client.get(self.key(key)))?;
        Ok(PyBytes::new(py, &value))
    }

    fn add(&self, py: Python<'_>, key: &str, amount: i64) -> PyResult<i64> {
        self.block(py, self.client.add(self.key(key), amount))
    }

    fn compare_set<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        expected: Vec<u8>,
        desired: Vec<u8>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let value = self.block(
            py,
            self.client.compare_set(self.key(key), expected, desired),
        )?;
        Ok(PyBytes::new(py, &value))
    }

    #[pyo3(signature = (keys, timeout=None))]
    fn wait(&self, py: Python<'_>, keys: Vec<String>, timeout: Option<f64>) -> PyResult<()> {
        let timeout = seconds(timeout, self.timeout);
        self.block(py, self.client.wait(&self.keys(&keys), timeout))
    }

    fn check(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<bool> {
        self.block(py, self.client.check(&self.keys(&keys)))
    }

    fn delete_key(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        self.block(py, self.client.delete_key(self.key(key)))
    }

    fn num_keys(&self, py: Python<'_>) -> PyResult<i64> {
        self.block(py, self.client.num_keys())
    }

    fn append(&self, py: Python<'_>, key: &str, value: Vec<u8>) -> PyResult<()> {
        self.block(py, self.client.append(self.key(key), value))
    }

    fn multi_get<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let values = self.block(py, self.client.multi_get(&self.keys(&keys)))?;
        Ok(values.iter().map(|v| PyBytes::new(py, v)).collect())
    }

    fn multi_set(&self, py: Python<'_>, pairs: Vec<(String, Vec<u8>)>) -> PyResult<()> {
        let pairs: Vec<(String, Vec<u8>)> =
            pairs.into_iter().map(|(k, v)| (self.key(&k), v)).collect();
        self.block(py, self.client.multi_set(&pairs))
    }

    #[pyo3(signature = (key, world_size, timeout=None))]
    fn barrier(
        &self,
        py: Python<'_>,
        key: &str,
        world_size: i64,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let timeout = seconds(timeout, self.timeout);
        self.block(py, self.client.barrier(self.key(key), world_size, timeout))
    }

    fn queue_push(&self, py: Python<'_>, key: &str, value: Vec<u8>) -> PyResult<()> {
        self.block(py, self.client.queue_push(self.key(key), value))
    }

    fn queue_pop<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        block: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let value = self.block(py, self.client.queue_pop(self.key(key), block))?;
        Ok(PyBytes::new(py, &value))
    }

    fn queue_len(&self, py: Python<'_>, key: &str) -> PyResult<i64> {
        self.block(py, self.client.queue_len(self.key(key)))
    }

    /// Keys with values, without the prefix; keys written by clients that
    /// add no prefix are returned as they are.
    fn list_keys(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let keys = self.block(py, self.client.list_keys())?;
        Ok(keys
            .iter()
            .map(|k| {
                let k = String::from_utf8_lossy(k);
                k.strip_prefix(self.prefix.as_str())
                    .unwrap_or(&k)
                    .to_owned()
            })
            .collect())
    }

    fn ping(&self, py: Python<'_>) -> PyResult<()> {
        self.block(py, self.client.ping())
    }
}

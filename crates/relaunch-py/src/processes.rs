//! `relaunch.start_processes`' native side: [`Processes`] wraps the
//! launcher's process handling (`relaunch_launch::processes`) for Python,
//! and [`become_worker`] is what a process forked from Python (the fork
//! start method) runs first.

use std::os::fd::{AsRawFd as _, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use relaunch_launch::processes::{self, Forked, ProcessSpec};
use relaunch_launch::worker::ExitKind;

use crate::errors::launch_error;

/// How often a wait with the GIL released looks for Ctrl-C.
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// A process's exit as Python sees it: `("code", N)` or `("signal", N)`.
type Exit = Option<(&'static str, i32)>;

fn exits(list: Vec<Option<ExitKind>>) -> Vec<Exit> {
    list.into_iter()
        .map(|e| {
            e.map(|kind| match kind {
                ExitKind::Code(code) => ("code", code),
                ExitKind::Signal(signal) => ("signal", signal),
            })
        })
        .collect()
}

fn signal(number: i32) -> PyResult<Signal> {
    Signal::try_from(number).map_err(|_| PyValueError::new_err(format!("{number} is not a signal")))
}

/// The processes of one `start_processes` call.
#[pyclass(module = "relaunch._native")]
pub(crate) struct Processes {
    inner: Option<processes::Processes>,
    /// The pipes of the next forked process: read ends kept here, write
    /// ends closed here once the child has its copies.
    pending: Mutex<Option<[OwnedFd; 4]>>,
}

impl Processes {
    fn inner(&self) -> PyResult<&processes::Processes> {
        self.inner
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("these processes were closed"))
    }
}

fn spec(
    program: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    dir: String,
    prefix: String,
    console_stdout: bool,
    console_stderr: bool,
) -> ProcessSpec {
    ProcessSpec {
        program: program.into(),
        args: args.into_iter().map(Into::into).collect(),
        env: env.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        dir: dir.into(),
        prefix,
        console_stdout,
        console_stderr,
    }
}

#[pymethods]
impl Processes {
    #[new]
    fn new() -> PyResult<Self> {
        Ok(Self {
            inner: Some(processes::Processes::new().map_err(launch_error)?),
            pending: Mutex::new(None),
        })
    }

    /// Starts `program args` with `env` added; its index.
    #[allow(clippy::too_many_arguments)]
    fn spawn(
        &self,
        py: Python<'_>,
        program: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
        dir: String,
        prefix: String,
        console_stdout: bool,
        console_stderr: bool,
    ) -> PyResult<usize> {
        let spec = spec(
            program,
            args,
            env,
            dir,
            prefix,
            console_stdout,
            console_stderr,
        );
        let inner = self.inner()?;
        py.detach(|| inner.spawn(spec)).map_err(launch_error)
    }

    /// Two pipes for the next process to fork: the write ends' descriptors,
    /// for the child's stdout and stderr.
    fn prepare_fork(&self) -> PyResult<(i32, i32)> {
        let (out_read, out_write) = nix::unistd::pipe()
            .map_err(|e| PyRuntimeError::new_err(format!("cannot make a pipe: {e}")))?;
        let (err_read, err_write) = nix::unistd::pipe()
            .map_err(|e| PyRuntimeError::new_err(format!("cannot make a pipe: {e}")))?;
        let fds = (out_write.as_raw_fd(), err_write.as_raw_fd());
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) =
            Some([out_read, out_write, err_read, err_write]);
        Ok(fds)
    }

    /// Watches `pid`, forked after `prepare_fork`, writing to its pipes; its
    /// index. The write ends are closed here.
    #[allow(clippy::too_many_arguments)]
    fn adopt(
        &self,
        py: Python<'_>,
        pid: i32,
        dir: String,
        prefix: String,
        console_stdout: bool,
        console_stderr: bool,
    ) -> PyResult<usize> {
        let Some([out_read, out_write, err_read, err_write]) = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return Err(PyRuntimeError::new_err("adopt() without prepare_fork()"));
        };
        drop((out_write, err_write));
        let spec = spec(
            String::new(),
            Vec::new(),
            Vec::new(),
            dir,
            prefix,
            console_stdout,
            console_stderr,
        );
        let forked = Forked {
            pid,
            stdout: out_read,
            stderr: err_read,
        };
        let inner = self.inner()?;
        py.detach(|| inner.adopt(forked, spec))
            .map_err(launch_error)
    }

    fn pids(&self) -> PyResult<Vec<i32>> {
        Ok(self.inner()?.pids())
    }

    /// Each process's exit so far: `("code", N)`, `("signal", N)` or None.
    fn exits(&self) -> PyResult<Vec<Exit>> {
        Ok(exits(self.inner()?.exits()))
    }

    /// Waits until a process exits or `timeout` seconds pass (Ctrl-C
    /// interrupts it); the exits then.
    fn wait_change(&self, py: Python<'_>, timeout: f64) -> PyResult<Vec<Exit>> {
        let inner = self.inner()?;
        let total = Duration::try_from_secs_f64(timeout.max(0.0)).unwrap_or(Duration::MAX);
        let deadline = std::time::Instant::now().checked_add(total);
        let before = inner.exits();
        loop {
            let left = deadline.map_or(SIGNAL_CHECK_INTERVAL, |d| {
                d.saturating_duration_since(std::time::Instant::now())
            });
            let now = py.detach(|| inner.wait_change(left.min(SIGNAL_CHECK_INTERVAL)));
            if now != before || left <= SIGNAL_CHECK_INTERVAL {
                return Ok(exits(now));
            }
            py.check_signals()?;
        }
    }

    /// Sends signal `signum` to every running process's group.
    fn signal(&self, signum: i32) -> PyResult<()> {
        self.inner()?.signal(signal(signum)?);
        Ok(())
    }

    /// Sends `signum`, waits up to `grace` seconds, then SIGKILL; returns
    /// once every process has exited.
    fn stop(&self, py: Python<'_>, signum: i32, grace: f64) -> PyResult<()> {
        let (signal, inner) = (signal(signum)?, self.inner()?);
        let grace = Duration::try_from_secs_f64(grace.max(0.0)).unwrap_or(Duration::MAX);
        py.detach(|| inner.stop(signal, grace));
        Ok(())
    }

    /// Kills what still runs and ends the owning thread.
    fn close(&mut self, py: Python<'_>) {
        if let Some(mut inner) = self.inner.take() {
            py.detach(|| inner.close());
        }
    }
}

/// Run first by a process forked from Python for `start_processes`: a
/// session of its own and the parent-death signal, exactly as the
/// launcher's workers get them.
#[pyfunction]
pub(crate) fn become_worker(parent: i32) -> PyResult<()> {
    relaunch_launch::worker::become_worker(Pid::from_raw(parent))
        .map_err(|e| PyRuntimeError::new_err(format!("cannot detach this process: {e}")))
}

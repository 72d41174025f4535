//! `relaunch._native`: the Rust side of the Python package. Python classes in
//! `python/relaunch/` wrap these objects; arguments are coerced there.

mod blocking;
mod errors;
mod files;
mod processes;
mod server_api;
mod store;
mod tracking;
mod transfer;

use pyo3::prelude::*;

/// A progress beat for `relaunch run`'s hang detection, at `step` if
/// given: a few stores into a shared page, no system call. Does nothing
/// outside `relaunch run`.
#[pyfunction]
#[pyo3(signature = (step=None))]
fn heartbeat(step: Option<i64>) {
    relaunch_client::beat::beat(step);
}

/// Records in this rank's beat record that process `pid` writes its stacks
/// on `signal`; false outside `relaunch run`, or when another process of
/// the rank did first.
#[pyfunction]
fn claim_stack_signal(pid: u32, signal: i32) -> bool {
    relaunch_client::beat::this_process().is_some_and(|b| b.claim_dump_signal(pid, signal))
}

/// At this process's exit: beats from a thread of its own, which needs no
/// Python, for at most `seconds`, so that a rank whose interpreter takes
/// long to finish after its script ended (a loaded machine, a large heap of
/// modules to tear down) is not taken for a hung one; an exit stuck longer
/// still is. Only in the rank's own process (the one that claimed its stack
/// signal): a DataLoader worker's exit must not beat for its rank.
#[pyfunction]
fn beat_while_exiting(seconds: f64) {
    let Some(beats) = relaunch_client::beat::this_process() else {
        return;
    };
    let ours = beats
        .read()
        .dump
        .is_some_and(|(pid, _)| pid == std::process::id());
    if !ours || !seconds.is_finite() || seconds <= 0.0 {
        return;
    }
    let until = std::time::Instant::now() + std::time::Duration::from_secs_f64(seconds);
    std::thread::spawn(move || {
        while std::time::Instant::now() < until {
            beats.beat(None);
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    });
}

/// Each server of a comma-separated list (`RELAUNCH_SERVER`'s syntax),
/// normalized as relaunch's client uses them; a bad one raises
/// `TrackingConfigError` saying which and why.
#[pyfunction]
fn server_list(servers: &str) -> PyResult<Vec<String>> {
    relaunch_client::http::server_list(servers).map_err(errors::tracking_error)
}

/// The CRC-32C of `data`: what an "RLB3" batch ends with (for code that
/// writes batches by hand: tests, benchmarks).
#[pyfunction]
fn crc32c(data: &[u8]) -> u32 {
    relaunch_api::batch::checksum(data)
}

#[pymodule]
mod _native {
    use pyo3::prelude::*;

    #[pymodule_export]
    use super::files::{hash_bytes, hash_file};
    #[pymodule_export]
    use super::processes::{Processes, become_worker};
    #[pymodule_export]
    use super::server_api::ServerApi;
    #[pymodule_export]
    use super::store::Store;
    #[pymodule_export]
    use super::tracking::Run;
    #[pymodule_export]
    use super::transfer::{download_file, upload_file};
    #[pymodule_export]
    use super::{beat_while_exiting, claim_stack_signal, crc32c, heartbeat, server_list};

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))
    }
}

//! The workers' torch, asked once per launch: which version it is, so
//! that the variables the launcher sets are the names that torch reads
//! without a deprecation warning on every rank.

use std::ffi::OsStr;
use std::time::Duration;

use crate::env::{TORCH_FR_BUFFER_SIZE, TORCH_NCCL_TRACE_BUFFER_SIZE};

/// How long the launcher waits for the answer; a Python that takes longer
/// to start is taken as an unknown torch.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What `python -c '... importlib.metadata.version("torch")'` printed:
/// `2.15.0+cu132` gives `(2, 15)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TorchVersion {
    pub major: u32,
    pub minor: u32,
}

impl TorchVersion {
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split(['.', '+']);
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(Self { major, minor })
    }

    /// torch 2.7 moved the flight recorder out of ProcessGroupNCCL and
    /// renamed its size variable `TORCH_FR_BUFFER_SIZE`; later versions
    /// still read the old name but warn about it on every rank at
    /// `init_process_group`, gloo included. An unknown version (no torch,
    /// a Python that would not answer) gets the new name: only an NCCL
    /// process group reads it.
    pub fn flight_recorder_size_var(version: Option<Self>) -> &'static str {
        match version {
            Some(v) if v < Self { major: 2, minor: 7 } => TORCH_NCCL_TRACE_BUFFER_SIZE,
            _ => TORCH_FR_BUFFER_SIZE,
        }
    }
}

/// The version of the torch that `python` imports, without importing it
/// (its package metadata: tens of milliseconds). `None` when there is no
/// torch, or Python fails or takes longer than [`PROBE_TIMEOUT`].
pub async fn probe(python: &OsStr) -> Option<TorchVersion> {
    let output = tokio::process::Command::new(python)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('torch'))",
        ])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(PROBE_TIMEOUT, output).await {
        Ok(Ok(out)) if out.status.success() => {
            TorchVersion::parse(&String::from_utf8_lossy(&out.stdout))
        }
        Ok(Ok(_)) => None,
        Ok(Err(e)) => {
            tracing::debug!(python = %python.to_string_lossy(), error = %e, "cannot ask python for its torch version");
            None
        }
        Err(_) => {
            tracing::debug!(python = %python.to_string_lossy(), "python took too long to say its torch version");
            None
        }
    }
}

/// [`probe`], for a task of its own.
pub async fn probe_owned(python: std::ffi::OsString) -> Option<TorchVersion> {
    probe(&python).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_choose_the_name_their_torch_reads_quietly() {
        let v = |text| TorchVersion::parse(text);
        assert_eq!(
            v("2.15.0+cu132"),
            Some(TorchVersion {
                major: 2,
                minor: 15
            })
        );
        assert_eq!(v("2.6.0"), Some(TorchVersion { major: 2, minor: 6 }));
        assert_eq!(
            v("2.8.0.dev20250101\n"),
            Some(TorchVersion { major: 2, minor: 8 })
        );
        assert_eq!(v("torch"), None);
        assert_eq!(v(""), None);
        let name = TorchVersion::flight_recorder_size_var;
        assert_eq!(name(v("2.15.0")), TORCH_FR_BUFFER_SIZE);
        assert_eq!(name(v("2.7.1")), TORCH_FR_BUFFER_SIZE);
        assert_eq!(name(v("2.6.0")), TORCH_NCCL_TRACE_BUFFER_SIZE);
        assert_eq!(name(v("1.13.1")), TORCH_NCCL_TRACE_BUFFER_SIZE);
        assert_eq!(name(None), TORCH_FR_BUFFER_SIZE);
    }
}

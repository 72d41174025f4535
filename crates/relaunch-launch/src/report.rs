//! Why a job failed: which worker failed first, how, with its traceback.
//!
//! A worker decorated with torch's `@record` writes its exception to
//! `TORCHELASTIC_ERROR_FILE` as JSON:
//! `{"message": {"message": "RuntimeError: boom", "extraInfo":
//! {"py_callstack": "Traceback ...", "timestamp": "1700000000"}}}`.
//! Without one, the tail of the worker's stderr stands in (a Python worker
//! prints its traceback there anyway).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::worker::ExitKind;

/// What a worker's `@record` wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorFile {
    pub message: String,
    pub traceback: Option<String>,
    /// Seconds since the epoch, as the worker wrote it.
    pub timestamp: Option<u64>,
}

impl ErrorFile {
    /// Reads torch's error file format; `None` if there is no such file or
    /// it is not in that format (a half-written file from a killed worker).
    pub fn read(path: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(path).ok()?;
        let json: Value = serde_json::from_str(&text).ok()?;
        let message = &json["message"];
        if let Some(text) = message.as_str() {
            // The older flat format.
            return Some(Self {
                message: text.to_owned(),
                traceback: None,
                timestamp: json["timestamp"].as_str().and_then(|t| t.parse().ok()),
            });
        }
        let info = &message["extraInfo"];
        Some(Self {
            message: message["message"].as_str()?.to_owned(),
            traceback: info["py_callstack"].as_str().map(str::to_owned),
            timestamp: info["timestamp"]
                .as_str()
                .and_then(|t| t.parse().ok())
                .or_else(|| info["timestamp"].as_u64()),
        })
    }
}

/// One worker that ended badly.
#[derive(Clone, Debug)]
pub struct Failure {
    pub local_rank: usize,
    pub global_rank: usize,
    pub pid: u32,
    pub exit: ExitKind,
    /// When the launcher saw it exit.
    pub at: SystemTime,
    pub error_file: PathBuf,
    pub error: Option<ErrorFile>,
    pub stderr_tail: Vec<String>,
    pub stdout_log: PathBuf,
    pub stderr_log: PathBuf,
    /// Ended because the launcher stopped it, not on its own.
    pub stopped_by_launcher: bool,
}

impl Failure {
    /// When it failed: the error file's time if it wrote one (the exception
    /// happened then), else when the launcher saw it exit.
    fn time(&self) -> SystemTime {
        self.error
            .as_ref()
            .and_then(|e| e.timestamp)
            .map_or(self.at, |t| UNIX_EPOCH + std::time::Duration::from_secs(t))
    }
}

/// The first failure that the launcher did not cause: the root cause.
pub fn root_cause(failures: &[Failure]) -> Option<&Failure> {
    failures
        .iter()
        .filter(|f| !f.stopped_by_launcher)
        .min_by_key(|f| (f.time(), f.at))
        .or_else(|| failures.iter().min_by_key(|f| f.at))
}

/// The report printed when workers fail.
pub fn render(failures: &[Failure], hostname: &str, attempt: u32, max_restarts: u32) -> String {
    let Some(root) = root_cause(failures) else {
        return String::new();
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "relaunch: worker failed (attempt {} of {}) - root cause:",
        attempt + 1,
        max_restarts + 1
    );
    let _ = writeln!(
        s,
        "  rank {} (local rank {}, pid {}) on {hostname}: {}",
        root.global_rank,
        root.local_rank,
        root.pid,
        root.exit.describe()
    );
    match &root.error {
        Some(error) => {
            let _ = writeln!(s, "  error: {}", error.message);
            if let Some(tb) = &error.traceback {
                let _ = writeln!(s, "  traceback (from {}):", root.error_file.display());
                for line in tb.trim_end().lines() {
                    let _ = writeln!(s, "    {line}");
                }
            }
        }
        None if !root.stderr_tail.is_empty() => {
            let _ = writeln!(s, "  last lines of its stderr:");
            for line in &root.stderr_tail {
                let _ = writeln!(s, "    {line}");
            }
        }
        None => {
            let _ = writeln!(s, "  it wrote nothing to stderr and no error file");
        }
    }
    let _ = writeln!(
        s,
        "  logs: {}\n        {}",
        root.stdout_log.display(),
        root.stderr_log.display()
    );
    let others: Vec<&Failure> = failures
        .iter()
        .filter(|f| !std::ptr::eq(*f, root))
        .collect();
    if !others.is_empty() {
        let _ = writeln!(s, "  other workers:");
        for f in others {
            let how = if f.stopped_by_launcher {
                "stopped by relaunch"
            } else {
                "failed too, after the root cause"
            };
            let _ = writeln!(
                s,
                "    rank {} (local rank {}): {} ({how})",
                f.global_rank,
                f.local_rank,
                f.exit.describe()
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(rank: usize, at: u64, stopped: bool) -> Failure {
        Failure {
            local_rank: rank,
            global_rank: rank,
            pid: 100 + rank as u32,
            exit: ExitKind::Code(1),
            at: UNIX_EPOCH + std::time::Duration::from_secs(at),
            error_file: PathBuf::from(format!("/logs/{rank}/error.json")),
            error: None,
            stderr_tail: vec!["ValueError: bad".into()],
            stdout_log: PathBuf::from("/logs/out"),
            stderr_log: PathBuf::from("/logs/err"),
            stopped_by_launcher: stopped,
        }
    }

    #[test]
    fn reads_torchs_error_file() {
        let dir = std::env::temp_dir().join(format!("relaunch-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("error.json");
        std::fs::write(
            &path,
            r#"{"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  x\nRuntimeError: boom\n", "timestamp": "1700000000"}}}"#,
        )
        .unwrap();
        let e = ErrorFile::read(&path).unwrap();
        assert_eq!(e.message, "RuntimeError: boom");
        assert!(e.traceback.unwrap().starts_with("Traceback"));
        assert_eq!(e.timestamp, Some(1_700_000_000));
        std::fs::write(&path, "{truncated").unwrap();
        assert_eq!(ErrorFile::read(&path), None);
        assert_eq!(ErrorFile::read(&dir.join("missing.json")), None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_root_cause_is_the_earliest_failure_relaunch_did_not_cause() {
        let failures = [
            failure(0, 5, true),
            failure(1, 9, false),
            failure(2, 7, false),
        ];
        assert_eq!(root_cause(&failures).unwrap().global_rank, 2);
        let report = render(&failures, "host", 0, 2);
        assert!(
            report.contains("rank 2 (local rank 2, pid 102) on host: exit code 1"),
            "{report}"
        );
        assert!(report.contains("attempt 1 of 3"));
        assert!(report.contains("ValueError: bad"));
        assert!(report.contains("rank 0 (local rank 0): exit code 1 (stopped by relaunch)"));
    }
}

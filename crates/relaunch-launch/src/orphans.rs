//! Processes left behind by workers. The launcher is a subreaper, so a
//! worker's children that outlive it (DataLoader workers, a shell's
//! background jobs) become the launcher's children; this finds them after
//! an attempt, kills them and reaps them.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// How long to wait for killed orphans to be reaped.
const REAP_PATIENCE: Duration = Duration::from_secs(2);

/// Kills and reaps every child of this process that is not in `workers`.
pub(crate) fn kill_and_reap(workers: &[Pid]) {
    let me = nix::unistd::getpid();
    let orphans: Vec<Pid> = children_of(me)
        .into_iter()
        .filter(|pid| !workers.contains(pid))
        .collect();
    if orphans.is_empty() {
        return;
    }
    tracing::info!(
        count = orphans.len(),
        "killing processes that workers left behind"
    );
    for &pid in &orphans {
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    }
    let deadline = Instant::now() + REAP_PATIENCE;
    let mut left = orphans;
    while !left.is_empty() && Instant::now() < deadline {
        left.retain(|&pid| {
            matches!(
                waitpid(pid, Some(WaitPidFlag::WNOHANG)),
                Ok(WaitStatus::StillAlive)
            )
        });
        if !left.is_empty() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Processes whose parent is `parent`, from `/proc`.
fn children_of(parent: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| parent_of(pid) == Some(parent.as_raw()))
        .map(Pid::from_raw)
        .collect()
}

/// The parent pid from `/proc/PID/stat` (the field after the command name,
/// which may itself hold spaces and parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_child_and_its_parent() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        assert_eq!(
            parent_of(pid.as_raw()),
            Some(nix::unistd::getpid().as_raw())
        );
        assert!(children_of(nix::unistd::getpid()).contains(&pid));
        kill_and_reap(&[]);
        assert!(child.try_wait().is_err() || !children_of(nix::unistd::getpid()).contains(&pid));
    }
}

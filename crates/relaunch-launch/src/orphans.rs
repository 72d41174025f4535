//! Processes left behind by workers. The launcher is a subreaper, so a
//! worker's children that outlive it (DataLoader workers, a shell's
//! background jobs, a daemon started in a session of its own such as a
//! logging service) become the launcher's children; this finds them after
//! an attempt, stops them as it stops workers (the stop signal, a grace
//! period, then SIGKILL) and reaps them, so the launcher never waits on a
//! process that is not one of its workers.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// How long to wait for killed orphans to be reaped.
const REAP_PATIENCE: Duration = Duration::from_secs(2);

/// How often a waiting stop looks for leftovers that have exited.
const POLL: Duration = Duration::from_millis(20);

/// Stops every child of this process that is not in `workers`: `signal` to
/// each and to its process group, up to `grace` for them to exit (a
/// future `cut_short` that completes ends the wait), then SIGKILL; every
/// one is reaped. Leftovers of leftovers (reparented here as their parents
/// die) are found and stopped too. Returns how many were found.
pub(crate) async fn stop_leftovers(
    workers: &[Pid],
    signal: Signal,
    grace: Duration,
    cut_short: impl std::future::Future<Output = ()>,
) -> usize {
    let me = nix::unistd::getpid();
    let find = || -> Vec<Pid> {
        children_of(me)
            .into_iter()
            .filter(|pid| !workers.contains(pid))
            .collect()
    };
    let mut left = find();
    if left.is_empty() {
        return 0;
    }
    let mut found = left.len();
    tracing::info!(
        count = left.len(),
        %signal,
        ?grace,
        "stopping processes that workers left behind"
    );
    for &pid in &left {
        send(pid, signal);
    }
    let deadline = tokio::time::Instant::now() + grace;
    tokio::pin!(cut_short);
    loop {
        left.retain(|&pid| !reaped(pid));
        for pid in find() {
            if !left.contains(&pid) {
                found += 1;
                send(pid, signal);
                left.push(pid);
            }
        }
        if left.is_empty() {
            return found;
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = tokio::time::sleep_until(deadline) => break,
            () = &mut cut_short => break,
        }
    }
    tracing::warn!(
        count = left.len(),
        "processes that workers left behind still running; sending SIGKILL"
    );
    kill_and_reap(workers);
    found
}

/// `signal` to a leftover and, when it leads one, its process group (a
/// daemon in a session of its own takes its children with it).
fn send(pid: Pid, signal: Signal) {
    let _ = nix::sys::signal::kill(pid, signal);
    if nix::unistd::getpgid(Some(pid)).is_ok_and(|group| group == pid) {
        let _ = nix::sys::signal::killpg(pid, signal);
    }
}

/// Whether `pid` has exited and is now reaped (or was never ours).
fn reaped(pid: Pid) -> bool {
    !matches!(
        waitpid(pid, Some(WaitPidFlag::WNOHANG)),
        Ok(WaitStatus::StillAlive)
    )
}

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
        send(pid, Signal::SIGKILL);
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

/// Reaps every child of this process, not in `workers`, that has already
/// exited (a zombie): orphans of the workers' descendants, reparented here
/// while the attempt runs. As PID 1 of a container this is what keeps the
/// process table clean; as a subreaper, the same. Live processes are left
/// alone (they are stopped at the attempt's end), and only zombies are
/// waited for, so no other waiter's child is taken. Returns how many.
pub(crate) fn reap_exited(workers: &[Pid]) -> usize {
    let me = nix::unistd::getpid();
    children_of(me)
        .into_iter()
        .filter(|pid| !workers.contains(pid) && state_of(pid.as_raw()) == Some('Z'))
        .filter(|&pid| {
            !matches!(
                waitpid(pid, Some(WaitPidFlag::WNOHANG)),
                Ok(WaitStatus::StillAlive) | Err(_)
            )
        })
        .count()
}

/// The state letter from `/proc/PID/stat` (`R`, `S`, `Z`, ...).
fn state_of(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
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

    /// These tests reap and kill every child of the test process: one at a
    /// time.
    static CHILDREN: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn an_exited_orphan_is_reaped_and_a_live_one_is_not() {
        let _one = CHILDREN.lock().unwrap_or_else(|p| p.into_inner());
        let mut done = std::process::Command::new("true").spawn().unwrap();
        let mut live = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let done_pid = Pid::from_raw(done.id() as i32);
        let deadline = Instant::now() + Duration::from_secs(5);
        while state_of(done_pid.as_raw()) != Some('Z') && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(state_of(done_pid.as_raw()), Some('Z'));
        let live_pid = Pid::from_raw(live.id() as i32);
        // The live one is a "worker" here or not: never touched while alive.
        assert_eq!(reap_exited(&[]), 1);
        assert_eq!(state_of(done_pid.as_raw()), None, "reaped");
        assert!(done.try_wait().is_err(), "its status went to the reaper");
        assert_eq!(live.try_wait().unwrap(), None, "still running, still ours");
        let _ = nix::sys::signal::kill(live_pid, Signal::SIGKILL);
        live.wait().unwrap();
    }

    #[test]
    fn finds_a_child_and_its_parent() {
        let _one = CHILDREN.lock().unwrap_or_else(|p| p.into_inner());
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

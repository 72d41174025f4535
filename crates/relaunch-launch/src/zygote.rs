//! Warm restarts: a Python interpreter (`relaunch._zygote`) that the
//! launcher starts while the job runs, which imports torch and the script's
//! third-party imports and then waits. When the workers fail, the launcher
//! asks it to fork one replacement per rank instead of starting new
//! interpreters, so a restart costs the backoff and joining the process
//! group rather than the imports.
//!
//! The zygote forks twice for each worker; the middle process exits at
//! once, so the worker is reparented to the launcher (a subreaper) and the
//! launcher waits on it, signals its session and kills it at its own death
//! as it does a worker it started itself. The worker's stdout and stderr
//! are the launcher's pipes (or pseudo-terminals), passed over a
//! `SOCK_SEQPACKET` socket with `SCM_RIGHTS`. Every message is one JSON
//! object; the protocol is described in `python/relaunch/_zygote.py`.
//!
//! Anything that goes wrong with the zygote (it is not ready yet, it
//! refused, it died, it did not answer) makes that restart cold: a warm
//! start is only ever faster, never a way for a restart to fail.

use std::ffi::OsString;
use std::io::IoSlice;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, recv, sendmsg, socketpair,
};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::config::{LaunchConfig, WarmTarget};
use crate::console::ConsoleSender;
use crate::worker::{self, ExitKind};

/// Environment variables the zygote reads (`python/relaunch/_zygote.py`).
const ENV_FD: &str = "RELAUNCH_ZYGOTE_FD";
const ENV_SCRIPT: &str = "RELAUNCH_ZYGOTE_SCRIPT";
const ENV_MODULE: &str = "RELAUNCH_ZYGOTE_MODULE";

/// How long a fork request may take: two `fork`s of an interpreter that
/// holds torch, milliseconds unless the machine is swapping.
const FORK_PATIENCE: Duration = Duration::from_secs(10);

/// The largest message either side sends.
const MESSAGE_MAX: usize = 1 << 22;

/// Where the zygote is in its life.
#[derive(Debug)]
enum State {
    /// Importing; no message yet.
    Starting,
    /// It imported these modules and waits for requests.
    Ready(Vec<String>),
    /// It refused, died or broke the protocol: why.
    Gone(String),
}

/// A running warm interpreter.
#[derive(Debug)]
pub struct Zygote {
    child: Child,
    pid: Pid,
    socket: OwnedFd,
    state: State,
    target: WarmTarget,
}

impl Zygote {
    /// Starts `python -u -m relaunch._zygote` for `target` with the
    /// launcher's environment and `env` (what every local rank shares), its
    /// stderr appended to `log`.
    pub fn start(
        python: &OsString,
        target: &WarmTarget,
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Self, String> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| format!("cannot make a socket pair: {e}"))?;
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
        let mut command = Command::new(python);
        command
            .args(["-u", "-m", "relaunch._zygote"])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env(ENV_FD, theirs.as_raw_fd().to_string())
            .env(
                if target.module {
                    ENV_MODULE
                } else {
                    ENV_SCRIPT
                },
                &target.script,
            )
            .stdin(Stdio::inherit())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true);
        worker::arm(&mut command, Some(theirs.as_raw_fd()));
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", python.to_string_lossy()))?;
        drop(theirs);
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .ok_or("the warm interpreter exited at once")?;
        Ok(Self {
            child,
            pid,
            socket: ours,
            state: State::Starting,
            target: target.clone(),
        })
    }

    /// Its process id: the launcher's child, not one of the workers.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The modules it imported once it is ready; `Ok(None)` while it is
    /// still importing; `Err` (why) once it can no longer serve.
    pub fn ready(&mut self) -> Result<Option<&[String]>, String> {
        if let State::Starting = self.state {
            match self.receive(Duration::ZERO) {
                Ok(None) => {
                    if let Some(why) = self.exited() {
                        self.state = State::Gone(why);
                    }
                }
                Ok(Some(message)) => {
                    self.state = if let Some(ready) = message.get("ready") {
                        let imported = ready["imported"]
                            .as_array()
                            .map(|names| {
                                names
                                    .iter()
                                    .filter_map(|n| n.as_str().map(str::to_owned))
                                    .collect()
                            })
                            .unwrap_or_default();
                        State::Ready(imported)
                    } else if let Some(why) = message.get("unfit").and_then(Value::as_str) {
                        State::Gone(why.to_owned())
                    } else {
                        State::Gone(format!("it sent {message} instead of saying it was ready"))
                    }
                }
                Err(why) => self.state = State::Gone(why),
            }
        }
        if let State::Ready(_) = self.state
            && let Some(why) = self.exited()
        {
            self.state = State::Gone(why);
        }
        match &self.state {
            State::Starting => Ok(None),
            State::Ready(imported) => Ok(Some(imported)),
            State::Gone(why) => Err(why.clone()),
        }
    }

    /// Forks a worker with `env` (added to the zygote's environment),
    /// `stdout` and `stderr`; returns its pid. The worker is this process's
    /// child by the time this returns (or a zombie of it).
    pub fn fork<K, V>(
        &mut self,
        env: &[(K, V)],
        stdout: BorrowedFd<'_>,
        stderr: BorrowedFd<'_>,
    ) -> Result<Pid, String>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        if !matches!(self.state, State::Ready(_)) {
            return Err("the warm interpreter is not ready".into());
        }
        let env = env
            .iter()
            .map(|(k, v)| (k.as_ref().to_owned(), Value::from(v.as_ref())))
            .collect();
        let result = self.request(env, stdout, stderr);
        if let Err(why) = &result {
            self.state = State::Gone(why.clone());
        }
        result
    }

    /// One fork request and its answer.
    fn request(
        &mut self,
        env: serde_json::Map<String, Value>,
        stdout: BorrowedFd<'_>,
        stderr: BorrowedFd<'_>,
    ) -> Result<Pid, String> {
        let argv: Vec<String> = self
            .target
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let message = json!({
            "env": env,
            "argv": argv,
            "launcher": nix::unistd::getpid().as_raw(),
        })
        .to_string();
        let fds = [stdout.as_raw_fd(), stderr.as_raw_fd()];
        sendmsg::<()>(
            self.socket.as_raw_fd(),
            &[IoSlice::new(message.as_bytes())],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| format!("cannot ask the warm interpreter for a worker: {e}"))?;
        let reply = self
            .receive(FORK_PATIENCE)?
            .ok_or_else(|| match self.exited() {
                Some(why) => why,
                None => format!("the warm interpreter did not answer in {FORK_PATIENCE:?}"),
            })?;
        if let Some(pid) = reply.get("pid").and_then(Value::as_i64) {
            return i32::try_from(pid)
                .map(Pid::from_raw)
                .map_err(|_| format!("the warm interpreter sent pid {pid}"));
        }
        Err(reply
            .get("error")
            .and_then(Value::as_str)
            .map_or_else(|| format!("it answered {reply}"), str::to_owned))
    }

    /// One message, waiting up to `patience`; `Ok(None)` if none came.
    fn receive(&mut self, patience: Duration) -> Result<Option<Value>, String> {
        let fd = self.socket.as_fd();
        let timeout = PollTimeout::try_from(patience).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Ok(None),
            Err(e) => return Err(format!("cannot wait for the warm interpreter: {e}")),
        }
        let mut buffer = vec![0_u8; MESSAGE_MAX];
        let n = recv(fd.as_raw_fd(), &mut buffer, MsgFlags::MSG_DONTWAIT)
            .map_err(|e| format!("cannot read from the warm interpreter: {e}"))?;
        if n == 0 {
            return Err(self
                .exited()
                .unwrap_or_else(|| "the warm interpreter closed its socket".into()));
        }
        serde_json::from_slice(&buffer[..n])
            .map(Some)
            .map_err(|e| format!("the warm interpreter sent a message that is not JSON: {e}"))
    }

    /// Why it is no longer running, if it is not.
    fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "the warm interpreter exited with {} (its log says why)",
                ExitKind::from_status(status).describe()
            )),
            Ok(None) => None,
            Err(e) => Some(format!("cannot wait for the warm interpreter: {e}")),
        }
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // Its session: whatever it may have started goes with it.
        worker::signal_group(self.pid, nix::sys::signal::Signal::SIGKILL);
        // Reaped before the launcher goes on (or exits): nothing of the
        // job is left once the launcher is gone, not even a dying zygote.
        let deadline = std::time::Instant::now() + REAP_PATIENCE;
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The launcher's warm interpreter across the attempts of a job: started
/// with the first attempt, taken by a restart that forks from it, replaced
/// when it fails, given up after [`Warm::TRIES`] failures.
#[derive(Debug, Default)]
pub struct Warm {
    zygote: Option<Zygote>,
    failures: u32,
}

impl Warm {
    /// How many warm interpreters may fail before restarts stay cold.
    const TRIES: u32 = 3;

    /// The zygote and the modules it imported, taken out if it is ready to
    /// fork workers; left here while it is still importing; dropped (and
    /// said) when it can no longer serve, so a new one is started.
    pub fn take_ready(&mut self, out: &ConsoleSender) -> (Option<Zygote>, Vec<String>) {
        let Some(zygote) = self.zygote.as_mut() else {
            return (None, Vec::new());
        };
        match zygote.ready() {
            Ok(Some(imported)) => {
                let imported = imported.to_vec();
                (self.zygote.take(), imported)
            }
            Ok(None) => {
                out.notice(
                    "relaunch: the warm interpreter is still importing; this restart starts cold",
                );
                (None, Vec::new())
            }
            Err(why) => {
                self.zygote = None;
                self.failed(Some(&format!("no warm restart this time: {why}")), out);
                (None, Vec::new())
            }
        }
    }

    /// Takes back what [`Self::take_ready`] gave out: `None` for a zygote
    /// that was given (`asked`) is one the group dropped after a fork failed.
    pub fn give_back(&mut self, zygote: Option<Zygote>, asked: bool, out: &ConsoleSender) {
        if asked && zygote.is_none() {
            self.failed(None, out); // the group said why
        }
        if zygote.is_some() {
            self.zygote = zygote;
        }
    }

    /// Starts a warm interpreter for the next restarts, with `env` (what
    /// every local rank shares), if there is none, the job restarts
    /// (`--max-restarts` above 0, or an elastic node range) and runs Python,
    /// and fewer than [`Self::TRIES`] failed.
    pub fn refill(
        &mut self,
        config: &LaunchConfig,
        env: &[(String, String)],
        logs: &Path,
        out: &ConsoleSender,
    ) {
        let restarts = config.max_restarts > 0 || config.nnodes.min != config.nnodes.max;
        if self.zygote.is_some()
            || self.failures >= Self::TRIES
            || !config.warm_restarts
            || !restarts
        {
            return;
        }
        let Some(target) = config.entrypoint.warm.as_ref() else {
            return;
        };
        match Zygote::start(
            &config.entrypoint.python,
            target,
            env,
            &logs.join("zygote.log"),
        ) {
            Ok(zygote) => self.zygote = Some(zygote),
            Err(why) => out.notice(format!("relaunch: warning: restarts start cold: {why}")),
        }
    }

    /// The waiting zygote's pid, a child of the launcher that is not a worker.
    pub fn pid(&self) -> Option<Pid> {
        self.zygote.as_ref().map(Zygote::pid)
    }

    /// Counts a failed zygote, saying `what` went wrong (if the group has
    /// not) and, at the last try, that restarts stay cold.
    fn failed(&mut self, what: Option<&str>, out: &ConsoleSender) {
        self.failures += 1;
        let tries = Self::TRIES;
        if let Some(what) = what
            && self.failures < tries
        {
            out.notice(format!(
                "relaunch: warning: {what}; starting a new warm interpreter"
            ));
            return;
        }
        if self.failures == tries {
            let what = what.map(|w| format!("{w}; ")).unwrap_or_default();
            out.notice(format!(
                "relaunch: warning: {what}the warm interpreter failed {tries} times (zygote.log \
                 in the log directory says why); restarts start cold from now on"
            ));
        }
    }
}

/// How long a dropped zygote, killed, may take to be reaped.
const REAP_PATIENCE: Duration = Duration::from_secs(5);

/// How a warm worker ended, if it has; `None` while it runs. Read raw
/// (rustix): nix's `waitpid` fails with EINVAL on a death by a signal its
/// `Signal` cannot name (a real-time one, such as the stack-dump signal
/// reaching a process without its handler), and the exit was lost.
fn exited(pid: Pid) -> Option<ExitKind> {
    let raw = rustix::process::Pid::from_raw(pid.as_raw())?;
    match rustix::process::waitpid(Some(raw), rustix::process::WaitOptions::NOHANG) {
        Ok(Some((_, status))) => {
            if let Some(code) = status.exit_status() {
                Some(ExitKind::Code(code))
            } else {
                // Stopped and continued are not asked for (no WUNTRACED):
                // anything else reported is a death by a signal.
                Some(ExitKind::Signal(status.terminating_signal().unwrap_or(-1)))
            }
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(%pid, error = %e, "cannot wait for a warm worker");
            Some(ExitKind::Code(-1))
        }
    }
}

/// Waits for a worker the zygote forked (this process's child by
/// reparenting, so not a `tokio::process::Child`) to exit.
pub async fn wait(pid: Pid) -> ExitKind {
    use tokio::signal::unix::{SignalKind, signal};
    // SIGCHLD wakes the wait at once; the tick covers a signal that came
    // before the stream existed.
    let mut children = signal(SignalKind::child()).ok();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        if let Some(exit) = exited(pid) {
            return exit;
        }
        match children.as_mut() {
            Some(stream) => {
                tokio::select! {
                    _ = stream.recv() => {}
                    _ = tick.tick() => {}
                }
            }
            None => {
                tick.tick().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 34: a warm worker killed by a real-time signal (the stack-dump
    /// signal, reaching it before its handler) was lost to EINVAL: "cannot
    /// wait for a warm worker", and the exit reported as code -1.
    #[tokio::test]
    #[allow(unsafe_code)]
    // The children are reaped by `wait(pid)`, the code under test, not by
    // `Child::wait`.
    #[allow(clippy::zombie_processes)]
    async fn a_death_by_a_real_time_signal_is_collected_with_its_number() {
        let child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
        let number = nix::libc::SIGRTMIN() + 7;
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        assert_eq!(unsafe { nix::libc::kill(pid.as_raw(), number) }, 0);
        assert_eq!(wait(pid).await, ExitKind::Signal(number));
        let child = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
        assert_eq!(wait(pid).await, ExitKind::Code(3));
    }
}

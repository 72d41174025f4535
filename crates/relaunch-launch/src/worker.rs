//! Starting one worker process so that it can never outlive the launcher.
//!
//! Each worker starts a session of its own (as under torchrun), so a signal
//! for its process group reaches its DataLoader workers too, and a Ctrl-C at
//! the terminal reaches only the launcher, which forwards it once. The
//! kernel sends it SIGKILL when the launcher dies, even by SIGKILL
//! (`PR_SET_PDEATHSIG`).

// One of relaunch's few unsafe blocks (ARCHITECTURE.md lists them):
// `pre_exec` runs between fork and exec, where only async-signal-safe
// calls are allowed. The closure makes three (four, for the warm
// interpreter's socket) system calls through `nix` and allocates nothing.
#![allow(unsafe_code)]

use std::io;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::{ExitStatus, Stdio};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::config::Entrypoint;
use crate::error::LaunchError;

/// How a worker ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    Code(i32),
    Signal(i32),
}

impl ExitKind {
    pub fn from_status(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => Self::Code(code),
            (None, Some(signal)) => Self::Signal(signal),
            // Neither code nor signal: report as a failure rather than guess.
            (None, None) => Self::Code(-1),
        }
    }

    pub fn success(self) -> bool {
        self == Self::Code(0)
    }

    /// `exit code 1`, `signal SIGKILL (9)`.
    pub fn describe(self) -> String {
        match self {
            Self::Code(code) => format!("exit code {code}"),
            Self::Signal(n) => match Signal::try_from(n) {
                Ok(signal) => format!("signal {signal} ({n})"),
                Err(_) => format!("signal {n}"),
            },
        }
    }
}

/// Starts `entrypoint` with `env` added to the launcher's environment, its
/// standard output and error sent to `stdout` and `stderr` (pipes to the
/// launcher, or pseudo-terminals), and its standard input shared with the
/// launcher (as torchrun does, for `breakpoint()`).
pub fn spawn<K, V>(
    entrypoint: &Entrypoint,
    env: &[(K, V)],
    local_rank: usize,
    stdout: Stdio,
    stderr: Stdio,
) -> Result<Child, LaunchError>
where
    K: AsRef<std::ffi::OsStr>,
    V: AsRef<std::ffi::OsStr>,
{
    let mut command = Command::new(&entrypoint.program);
    command
        .args(&entrypoint.args)
        .envs(env.iter().map(|(k, v)| (k.as_ref(), v.as_ref())))
        .stdin(Stdio::inherit())
        .stdout(stdout)
        .stderr(stderr);
    arm(&mut command, None);
    command.spawn().map_err(|source| LaunchError::Spawn {
        local_rank,
        program: entrypoint.program.to_string_lossy().into_owned(),
        source,
    })
}

/// Makes whatever `command` starts a worker ([`become_worker`]) and, with
/// `keep`, lets it inherit that descriptor (made close-on-exec by its
/// owner, so no other child ever inherits it).
pub fn arm(command: &mut Command, keep: Option<std::os::fd::RawFd>) {
    let launcher = nix::unistd::getpid();
    // SAFETY: the closure only makes async-signal-safe system calls (setsid,
    // prctl, getppid, fcntl) and builds errors from raw errno values, which
    // does not allocate.
    unsafe {
        command.as_std_mut().pre_exec(move || {
            become_worker(launcher)?;
            if let Some(fd) = keep {
                // SAFETY: `fd` is open in the parent for as long as the
                // command is being spawned; the child has its copy.
                let fd = std::os::fd::BorrowedFd::borrow_raw(fd);
                nix::fcntl::fcntl(
                    fd,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                )
                .map_err(io::Error::from)?;
            }
            Ok(())
        });
    }
}

/// What makes a process a worker that cannot outlive its launcher: a
/// session of its own (a signal for its process group reaches its children
/// too; a Ctrl-C at the terminal reaches only the launcher), and SIGKILL
/// when the thread that started it ends (`PR_SET_PDEATHSIG`), checked
/// against `launcher` having died before that was armed. Called in the new
/// process before it runs anything else: between fork and exec for a
/// spawned program, and right after `os.fork()` for a Python function
/// started with the fork method (`relaunch.start_processes`). Only
/// async-signal-safe calls, no allocation.
pub fn become_worker(launcher: Pid) -> io::Result<()> {
    nix::unistd::setsid().map_err(io::Error::from)?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
    if nix::unistd::getppid() != launcher {
        return Err(io::Error::from_raw_os_error(nix::libc::ESRCH));
    }
    Ok(())
}

/// Sends `signal` to the worker's whole process group (it leads a session,
/// so its pid is its group id). A group that is already gone is no error.
pub fn signal_group(pid: Pid, signal: Signal) {
    match nix::sys::signal::killpg(pid, signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => {
            tracing::warn!(%pid, %signal, error = %e, "cannot signal a worker's process group")
        }
    }
}

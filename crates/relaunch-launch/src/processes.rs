//! A set of processes started, watched and stopped the way the launcher
//! treats its workers, for `relaunch.start_processes` (torch's and llutil's
//! `start_processes` API): each in a session of its own with the
//! parent-death signal (`worker::become_worker`), its stdout and stderr
//! written to `stdout.log`/`stderr.log` in its directory and, where asked,
//! to the console with a prefix, whole lines only (`logs::pump`, the
//! console thread); signals to their process groups; a stop with a grace
//! period, then SIGKILL.
//!
//! One thread owns the processes and runs a single-threaded runtime: the
//! kernel sends the parent-death signal when the thread that started a
//! process ends, so they die with this object, or with the interpreter that
//! holds it, even by SIGKILL. A process forked by the caller (Python's
//! `os.fork()`, for a function run with the fork method) is adopted: its
//! output pipes and pid handed over, watched the same way.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::config::Entrypoint;
use crate::console::{Console, ConsoleSender, Stream};
use crate::error::LaunchError;
use crate::logs::{Decoder, StreamSink, Tail, pump};
use crate::worker::{self, ExitKind};

/// How long, once a process has exited, its output is still read.
const DRAIN_PATIENCE: Duration = Duration::from_secs(5);

/// One process to start.
#[derive(Clone, Debug)]
pub struct ProcessSpec {
    pub program: OsString,
    pub args: Vec<OsString>,
    /// Added to this process's environment.
    pub env: Vec<(OsString, OsString)>,
    /// Its log directory (created): `stdout.log`, `stderr.log`.
    pub dir: PathBuf,
    /// Put before each of its lines on the console.
    pub prefix: String,
    /// Which of its streams also go to the console (the others to the log
    /// files only).
    pub console_stdout: bool,
    pub console_stderr: bool,
}

/// A process the caller forked itself: its pid and the read ends of the
/// pipes its stdout and stderr write to.
#[derive(Debug)]
pub struct Forked {
    pub pid: i32,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

#[derive(Debug, Default)]
struct State {
    /// Exit of each process, by index; `None` while it runs.
    exits: Vec<Option<ExitKind>>,
    pids: Vec<i32>,
}

enum Command {
    Spawn(ProcessSpec, oneshot::Sender<Result<usize, LaunchError>>),
    Adopt(
        Forked,
        ProcessSpec,
        oneshot::Sender<Result<usize, LaunchError>>,
    ),
    Signal(Signal),
    Stop(Signal, Duration, oneshot::Sender<()>),
    Close(oneshot::Sender<()>),
}

/// The processes, and the thread that owns them.
#[derive(Debug)]
pub struct Processes {
    commands: mpsc::UnboundedSender<Command>,
    state: Arc<(Mutex<State>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Spawn(..) => "Spawn",
            Self::Adopt(..) => "Adopt",
            Self::Signal(..) => "Signal",
            Self::Stop(..) => "Stop",
            Self::Close(..) => "Close",
        })
    }
}

impl Processes {
    /// Starts the owning thread (and the console thread behind it).
    pub fn new() -> Result<Self, LaunchError> {
        let (commands, receiver) = mpsc::unbounded_channel();
        let state: Arc<(Mutex<State>, Condvar)> = Arc::default();
        let shared = state.clone();
        let thread = std::thread::Builder::new()
            .name("relaunch-processes".into())
            .spawn(move || owner(receiver, shared))
            .map_err(|e| LaunchError::io("cannot start the thread that owns the processes", e))?;
        Ok(Self {
            commands,
            state,
            thread: Some(thread),
        })
    }

    /// Starts `spec`; its index (the order of starts) on success.
    pub fn spawn(&self, spec: ProcessSpec) -> Result<usize, LaunchError> {
        self.ask(|reply| Command::Spawn(spec, reply))
    }

    /// Watches a process the caller forked (see [`Forked`]).
    pub fn adopt(&self, forked: Forked, spec: ProcessSpec) -> Result<usize, LaunchError> {
        self.ask(|reply| Command::Adopt(forked, spec, reply))
    }

    fn ask(
        &self,
        command: impl FnOnce(oneshot::Sender<Result<usize, LaunchError>>) -> Command,
    ) -> Result<usize, LaunchError> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(command(reply)).map_err(|_| closed())?;
        answer.blocking_recv().map_err(|_| closed())?
    }

    /// Pids, by index.
    pub fn pids(&self) -> Vec<i32> {
        self.lock().pids.clone()
    }

    /// Exits so far, by index (`None`: still running).
    pub fn exits(&self) -> Vec<Option<ExitKind>> {
        self.lock().exits.clone()
    }

    /// Waits until a process exits that had not when the wait began, or
    /// `timeout` passes; returns the exits then.
    pub fn wait_change(&self, timeout: Duration) -> Vec<Option<ExitKind>> {
        let (lock, changed) = &*self.state;
        let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        let running = guard.exits.iter().filter(|e| e.is_none()).count();
        let deadline = Instant::now() + timeout;
        let mut guard = guard;
        while guard.exits.iter().filter(|e| e.is_none()).count() == running && running > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            guard = changed
                .wait_timeout(guard, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        guard.exits.clone()
    }

    /// Sends `signal` to the process group of every process still running.
    pub fn signal(&self, signal: Signal) {
        let _ = self.commands.send(Command::Signal(signal));
    }

    /// Sends `signal`, waits up to `grace` for every process to exit, then
    /// kills the rest; returns once all have exited.
    pub fn stop(&self, signal: Signal, grace: Duration) {
        let (reply, done) = oneshot::channel();
        if self
            .commands
            .send(Command::Stop(signal, grace, reply))
            .is_ok()
        {
            let _ = done.blocking_recv();
        }
    }

    /// Kills what still runs, writes out what is left of their output and
    /// ends the owning thread.
    pub fn close(&mut self) {
        let (reply, done) = oneshot::channel();
        if self.commands.send(Command::Close(reply)).is_ok() {
            let _ = done.blocking_recv();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.close();
    }
}

fn closed() -> LaunchError {
    LaunchError::io(
        "the processes' owner has stopped",
        std::io::ErrorKind::BrokenPipe.into(),
    )
}

/// The owning thread: starts processes on its runtime, pumps their output,
/// records their exits, and stops them.
fn owner(mut commands: mpsc::UnboundedReceiver<Command>, state: Arc<(Mutex<State>, Condvar)>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the processes' runtime");
            return;
        }
    };
    let console = Console::start();
    runtime.block_on(async {
        let mut tasks = JoinSet::new();
        let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<(usize, ExitKind)>();
        loop {
            tokio::select! {
                Some((index, kind)) = exit_rx.recv() => record_exit(&state, index, kind),
                command = commands.recv() => match command {
                    Some(Command::Spawn(spec, reply)) => {
                        let started = start(&spec, &state, &console.sender(), &mut tasks, &exit_tx);
                        let _ = reply.send(started);
                    }
                    Some(Command::Adopt(forked, spec, reply)) => {
                        let adopted = adopt(forked, &spec, &state, &console.sender(), &mut tasks, &exit_tx);
                        let _ = reply.send(adopted);
                    }
                    Some(Command::Signal(signal)) => signal_running(&state, signal),
                    Some(Command::Stop(signal, grace, reply)) => {
                        stop(&state, &mut exit_rx, signal, grace).await;
                        let _ = reply.send(());
                    }
                    Some(Command::Close(reply)) => {
                        stop(&state, &mut exit_rx, Signal::SIGKILL, Duration::ZERO).await;
                        drain(&mut tasks).await;
                        let _ = reply.send(());
                        break;
                    }
                    None => {
                        stop(&state, &mut exit_rx, Signal::SIGKILL, Duration::ZERO).await;
                        break;
                    }
                },
            }
        }
    });
    console.close();
}

fn record_exit(state: &(Mutex<State>, Condvar), index: usize, kind: ExitKind) {
    let (lock, changed) = state;
    let mut guard = lock.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(slot) = guard.exits.get_mut(index) {
        *slot = Some(kind);
    }
    let pid = guard.pids.get(index).copied();
    drop(guard);
    changed.notify_all();
    // What it left in its process group (children it started) ends with it.
    if let Some(pid) = pid {
        worker::signal_group(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

fn signal_running(state: &(Mutex<State>, Condvar), signal: Signal) {
    let guard = state.0.lock().unwrap_or_else(|p| p.into_inner());
    for (pid, exit) in guard.pids.iter().zip(&guard.exits) {
        if exit.is_none() {
            worker::signal_group(Pid::from_raw(*pid), signal);
        }
    }
}

fn all_exited(state: &(Mutex<State>, Condvar)) -> bool {
    let guard = state.0.lock().unwrap_or_else(|p| p.into_inner());
    guard.exits.iter().all(Option::is_some)
}

async fn stop(
    state: &(Mutex<State>, Condvar),
    exits: &mut mpsc::UnboundedReceiver<(usize, ExitKind)>,
    signal: Signal,
    grace: Duration,
) {
    signal_running(state, signal);
    let deadline = tokio::time::Instant::now() + grace;
    let mut killed = signal == Signal::SIGKILL;
    while !all_exited(state) {
        match tokio::time::timeout_at(deadline, exits.recv()).await {
            Ok(Some((index, kind))) => record_exit(state, index, kind),
            Ok(None) => break,
            Err(_) if !killed => {
                signal_running(state, Signal::SIGKILL);
                killed = true;
            }
            Err(_) => {
                if let Some((index, kind)) = exits.recv().await {
                    record_exit(state, index, kind);
                }
            }
        }
    }
}

async fn drain(tasks: &mut JoinSet<()>) {
    let drained = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_PATIENCE, drained).await.is_err() {
        tasks.abort_all();
    }
}

/// Registers a new process in the state; its index.
fn register(state: &(Mutex<State>, Condvar), pid: i32) -> usize {
    let mut guard = state.0.lock().unwrap_or_else(|p| p.into_inner());
    guard.pids.push(pid);
    guard.exits.push(None);
    guard.pids.len() - 1
}

/// The process's streams' sinks; the index it is about to get orders its
/// live lines on the console.
fn sinks(
    spec: &ProcessSpec,
    console: &ConsoleSender,
    state: &(Mutex<State>, Condvar),
) -> Result<(StreamSink, StreamSink), LaunchError> {
    let order = state.0.lock().map_or(0, |g| g.pids.len());
    std::fs::create_dir_all(&spec.dir).map_err(|source| LaunchError::LogDir {
        path: spec.dir.clone(),
        source,
    })?;
    let prefix: Arc<str> = spec.prefix.as_str().into();
    let sink = |stream, name: &str, shown: bool| StreamSink {
        file: spec.dir.join(name),
        rank: order,
        stream,
        console: shown.then(|| (console.clone(), prefix.clone())),
        tail: Tail::default(),
        tap: None,
        duplicate: None,
    };
    Ok((
        sink(Stream::Stdout, "stdout.log", spec.console_stdout),
        sink(Stream::Stderr, "stderr.log", spec.console_stderr),
    ))
}

fn start(
    spec: &ProcessSpec,
    state: &(Mutex<State>, Condvar),
    console: &ConsoleSender,
    tasks: &mut JoinSet<()>,
    exit_tx: &mpsc::UnboundedSender<(usize, ExitKind)>,
) -> Result<usize, LaunchError> {
    let (out_sink, err_sink) = sinks(spec, console, state)?;
    let entrypoint = Entrypoint {
        program: spec.program.clone(),
        args: spec.args.clone(),
        python: spec.program.clone(),
        warm: None,
    };
    let mut child = worker::spawn(
        &entrypoint,
        &spec.env,
        state.0.lock().map_or(0, |g| g.pids.len()),
        Stdio::piped(),
        Stdio::piped(),
    )?;
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(closed_early)?;
    let index = register(state, pid);
    if let Some(out) = child.stdout.take() {
        tasks.spawn(pump(out, out_sink, Decoder::pipe()));
    }
    if let Some(err) = child.stderr.take() {
        tasks.spawn(pump(err, err_sink, Decoder::pipe()));
    }
    let exit_tx = exit_tx.clone();
    tasks.spawn(async move {
        let kind = match child.wait().await {
            Ok(status) => ExitKind::from_status(status),
            Err(e) => {
                tracing::warn!(error = %e, "cannot wait for a process");
                ExitKind::Code(-1)
            }
        };
        let _ = exit_tx.send((index, kind));
    });
    Ok(index)
}

fn adopt(
    forked: Forked,
    spec: &ProcessSpec,
    state: &(Mutex<State>, Condvar),
    console: &ConsoleSender,
    tasks: &mut JoinSet<()>,
    exit_tx: &mpsc::UnboundedSender<(usize, ExitKind)>,
) -> Result<usize, LaunchError> {
    let (out_sink, err_sink) = sinks(spec, console, state)?;
    let pipe = |fd: OwnedFd| {
        tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
            .map_err(|e| LaunchError::io("cannot read a forked process's output", e))
    };
    let (out, err) = (pipe(forked.stdout)?, pipe(forked.stderr)?);
    let index = register(state, forked.pid);
    tasks.spawn(pump(out, out_sink, Decoder::pipe()));
    tasks.spawn(pump(err, err_sink, Decoder::pipe()));
    let exit_tx = exit_tx.clone();
    let pid = Pid::from_raw(forked.pid);
    tasks.spawn(async move {
        let kind = tokio::task::spawn_blocking(move || {
            loop {
                match waitpid(pid, None) {
                    Ok(WaitStatus::Exited(_, code)) => break ExitKind::Code(code),
                    Ok(WaitStatus::Signaled(_, signal, _)) => {
                        break ExitKind::Signal(signal as i32);
                    }
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => {
                        tracing::warn!(%pid, error = %e, "cannot wait for a forked process");
                        break ExitKind::Code(-1);
                    }
                }
            }
        })
        .await
        .unwrap_or(ExitKind::Code(-1));
        let _ = exit_tx.send((index, kind));
    });
    Ok(index)
}

fn closed_early() -> LaunchError {
    LaunchError::io(
        "a process exited before it could be watched",
        std::io::ErrorKind::Other.into(),
    )
}

//! One attempt's workers on this node: start them all, report each exit,
//! stop them all with a grace period.

use std::os::fd::{AsFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::{DuplicateFilters, LaunchConfig, Placement, WorkerTty};
use crate::console::{ConsoleSender, Stream};
use crate::env::{AttemptEnv, BEAT_FILE, WorkerPlace, job_wide, worker_env};
use crate::error::LaunchError;
use crate::hang::RankBeat;
use crate::logs::{Decoder, Duplicate, LogLayout, StreamSink, Tail, pump};
use crate::pty::{self, Pty};
use crate::report::{ErrorFile, Failure};
use crate::tracking::LineTap;
use crate::worker::{self, ExitKind};
use crate::zygote::{self, Zygote};
use relaunch_client::beat::Beats;
use unicode_width::UnicodeWidthStr as _;

/// A worker's end, as the group reports it.
#[derive(Clone, Copy, Debug)]
pub struct Exit {
    pub local_rank: usize,
    pub kind: ExitKind,
    pub at: SystemTime,
}

struct Member {
    place: WorkerPlace,
    pid: Pid,
    exit: Option<Exit>,
    /// Its log directory.
    dir: PathBuf,
    /// Its beat record; `None` if it could not be created (then the rank
    /// is not watched for hangs).
    beats: Option<Beats>,
    error_file: PathBuf,
    stdout_log: PathBuf,
    stderr_log: PathBuf,
    stderr_tail: Tail,
}

/// How a worker's exit is awaited: a child the launcher started, or one a
/// warm interpreter forked ([`zygote::wait`]).
type ExitFuture = Pin<Box<dyn Future<Output = ExitKind> + Send>>;

/// The running workers of one attempt.
pub struct WorkerGroup {
    members: Vec<Member>,
    /// How many of them a warm interpreter forked.
    warm: usize,
    /// The job-wide variables every worker got the same ([`job_wide`]): a
    /// warm interpreter's environment.
    common_env: Vec<(String, String)>,
    /// Children of the launcher that are not workers and not leftovers of
    /// them: the warm interpreter.
    spared: Vec<Pid>,
    exits: mpsc::UnboundedReceiver<Exit>,
    /// Waiters and output pumps; output is complete once they all finish.
    tasks: JoinSet<()>,
}

impl std::fmt::Debug for WorkerGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerGroup")
            .field("pids", &self.pids())
            .finish_non_exhaustive()
    }
}

/// One attempt's `--duplicate-*-filters` files, shared by its ranks.
#[derive(Debug, Default)]
struct Duplicates {
    stdout: Option<Arc<Duplicate>>,
    stderr: Option<Arc<Duplicate>>,
}

impl WorkerGroup {
    /// Starts one worker per local rank. On a failure to start any of
    /// them, the ones already started are killed.
    /// `number` counts this node's attempts and names their log directories;
    /// `tap` gives, by global rank, where else a worker's lines go.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        config: &LaunchConfig,
        attempt: &AttemptEnv,
        placement: Placement,
        layout: &LogLayout,
        number: u32,
        console: &ConsoleSender,
        hostname: &str,
        tap: &dyn Fn(usize) -> Option<LineTap>,
        zygote: &mut Option<Zygote>,
    ) -> Result<Self, LaunchError> {
        let (exit_tx, exits) = mpsc::unbounded_channel();
        let duplicates = if config.duplicate_filters == DuplicateFilters::default() {
            Duplicates::default()
        } else {
            let dir = layout.attempt_dir(number)?;
            Duplicates {
                stdout: Duplicate::create(
                    dir.join("filtered_stdout.log"),
                    &config.duplicate_filters.stdout,
                ),
                stderr: Duplicate::create(
                    dir.join("filtered_stderr.log"),
                    &config.duplicate_filters.stderr,
                ),
            }
        };
        let mut group = Self {
            members: Vec::with_capacity(config.nproc_per_node),
            warm: 0,
            common_env: Vec::new(),
            spared: zygote.as_ref().map(Zygote::pid).into_iter().collect(),
            exits,
            tasks: JoinSet::new(),
        };
        for local_rank in 0..config.nproc_per_node {
            let place = WorkerPlace {
                local_rank,
                global_rank: placement.first_rank + local_rank,
                node_rank: placement.node_rank,
                local_world_size: config.nproc_per_node,
                world_size: placement.world_size,
                nodes: placement.nodes,
            };
            let started = layout.rank_dir(number, local_rank).and_then(|dir| {
                let tap = tap(place.global_rank);
                group.start_one(
                    config,
                    attempt,
                    place,
                    &dir,
                    console,
                    hostname,
                    tap,
                    &duplicates,
                    &exit_tx,
                    zygote,
                )
            });
            if let Err(e) = started {
                group.kill_all();
                return Err(e);
            }
        }
        Ok(group)
    }

    #[allow(clippy::too_many_arguments)]
    fn start_one(
        &mut self,
        config: &LaunchConfig,
        attempt: &AttemptEnv,
        place: WorkerPlace,
        dir: &Path,
        console: &ConsoleSender,
        hostname: &str,
        tap: Option<LineTap>,
        duplicates: &Duplicates,
        exit_tx: &mpsc::UnboundedSender<Exit>,
        zygote: &mut Option<Zygote>,
    ) -> Result<(), LaunchError> {
        let error_file = dir.join("error.json");
        // A stale file would be read as this attempt's error.
        let _ = std::fs::remove_file(&error_file);
        let env = worker_env(attempt, place, &error_file, dir, |k| std::env::var(k).ok());
        if self.members.is_empty() {
            self.common_env = env
                .iter()
                .filter(|(k, _)| job_wide(k))
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect();
        } else {
            self.common_env
                .retain(|(k, v)| env.iter().any(|(k2, v2)| k == k2 && v == v2));
        }
        // Before the worker starts: its first beat maps the record.
        let beat_file = dir.join(BEAT_FILE);
        let beats = Beats::create(&beat_file)
            .inspect_err(|e| {
                tracing::warn!(file = %beat_file.display(), error = %e, "cannot create a beat record; this rank is not watched for hangs");
            })
            .ok();
        let prefix: Arc<str> = render_prefix(
            &config.log_line_prefix_template,
            &attempt.role,
            place,
            hostname,
        )
        .into();
        let shown = config
            .local_ranks_filter
            .as_ref()
            .is_none_or(|f| f.contains(&place.local_rank));
        let redirected = config.redirects.for_rank(place.local_rank);
        let to_console = [shown && !redirected.stdout, shown && !redirected.stderr];
        // The worker's ends, and ours: a pseudo-terminal for a stream the
        // console shows on a terminal, a pipe otherwise.
        let open = |stream: Stream| -> Result<_, LaunchError> {
            if wants_terminal(config.worker_tty, stream, to_console[stream as usize])
                && let Some(Pty { reader, worker }) = open_terminal(&prefix)
            {
                return Ok(((reader, Decoder::terminal()), worker));
            }
            let (reader, writer) = pipe()?;
            Ok(((reader, Decoder::pipe()), writer))
        };
        let (out_reader, out_writer) = open(Stream::Stdout)?;
        let (err_reader, err_writer) = open(Stream::Stderr)?;
        let readers = [out_reader, err_reader];
        let writers: [OwnedFd; 2] = [out_writer, err_writer];
        let warm = zygote.as_mut().map(|z| {
            z.fork(&env, writers[0].as_fd(), writers[1].as_fd())
                .map_err(|why| {
                    console.notice(format!(
                        "relaunch: warning: rank {} starts cold, and so do the next restarts' \
                         workers until a new warm interpreter is ready: {why}",
                        place.global_rank
                    ));
                })
        });
        let (pid, exited): (Pid, ExitFuture) = match warm {
            Some(Ok(pid)) => {
                self.warm += 1;
                (pid, Box::pin(zygote::wait(pid)))
            }
            failed => {
                if failed.is_some() {
                    // A zygote that failed once is not asked again.
                    *zygote = None;
                }
                let [stdout, stderr] = writers;
                let mut child = worker::spawn(
                    &config.entrypoint,
                    &env,
                    place.local_rank,
                    Stdio::from(stdout),
                    Stdio::from(stderr),
                )?;
                let pid = child
                    .id()
                    .and_then(|id| i32::try_from(id).ok())
                    .map(Pid::from_raw)
                    .ok_or_else(|| {
                        LaunchError::io(
                            "a worker exited before it could be watched",
                            std::io::ErrorKind::Other.into(),
                        )
                    })?;
                let waited = async move {
                    match child.wait().await {
                        Ok(status) => ExitKind::from_status(status),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot wait for a worker");
                            ExitKind::Code(-1)
                        }
                    }
                };
                (pid, Box::pin(waited))
            }
        };
        let tail = Tail::default();
        let (stdout_log, stderr_log) = (dir.join("stdout.log"), dir.join("stderr.log"));
        let streams = [(Stream::Stdout, &stdout_log), (Stream::Stderr, &stderr_log)];
        for ((stream, file), (reader, decoder)) in streams.into_iter().zip(readers) {
            let index = stream as usize;
            let duplicate = match stream {
                Stream::Stdout => &duplicates.stdout,
                Stream::Stderr => &duplicates.stderr,
            };
            let sink = StreamSink {
                file: file.clone(),
                rank: place.global_rank,
                stream,
                console: to_console[index].then(|| (console.clone(), prefix.clone())),
                tail: tail.clone(),
                tap: tap.clone(),
                duplicate: duplicate.clone().filter(|_| to_console[index]),
            };
            self.tasks.spawn(pump(reader, sink, decoder));
        }
        let local_rank = place.local_rank;
        let exit_tx = exit_tx.clone();
        self.tasks.spawn(async move {
            let kind = exited.await;
            let _ = exit_tx.send(Exit {
                local_rank,
                kind,
                at: SystemTime::now(),
            });
        });
        tracing::debug!(local_rank, rank = place.global_rank, %pid, "worker started");
        self.members.push(Member {
            place,
            pid,
            exit: None,
            dir: dir.to_path_buf(),
            beats,
            error_file,
            stdout_log,
            stderr_log,
            stderr_tail: tail,
        });
        Ok(())
    }

    /// How many workers a warm interpreter forked.
    pub fn warm(&self) -> usize {
        self.warm
    }

    /// The environment every worker of this attempt got the same: what a
    /// warm interpreter for the next attempts starts with.
    pub fn common_env(&self) -> &[(String, String)] {
        &self.common_env
    }

    /// Tells the group that `pid`, a child of the launcher, is not a
    /// leftover of its workers.
    pub fn spare(&mut self, pid: Pid) {
        self.spared.push(pid);
    }

    /// The workers' process ids and the spared ones: every child of the
    /// launcher that is not a leftover.
    pub fn ours(&self) -> Vec<Pid> {
        self.pids()
            .into_iter()
            .chain(self.spared.iter().copied())
            .collect()
    }

    /// Process ids of the workers, by local rank.
    pub fn pids(&self) -> Vec<Pid> {
        self.members.iter().map(|m| m.pid).collect()
    }

    /// Local ranks of the workers still running.
    pub fn running_ranks(&self) -> impl Iterator<Item = usize> + '_ {
        self.members
            .iter()
            .filter(|m| m.exit.is_none())
            .map(|m| m.place.local_rank)
    }

    /// The beat records of the workers still running, read now.
    pub fn beats(&self) -> Vec<RankBeat> {
        self.members
            .iter()
            .filter(|m| m.exit.is_none())
            .map(|m| RankBeat {
                local_rank: m.place.local_rank,
                global_rank: m.place.global_rank,
                pid: m.pid,
                dir: m.dir.clone(),
                state: m.beats.as_ref().map(Beats::read),
                tail: m
                    .stderr_tail
                    .lock()
                    .map(|t| t.iter().cloned().collect())
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// The attempt's log directory (its ranks' directories' parent).
    pub fn attempt_dir(&self) -> Option<&Path> {
        self.members.first().and_then(|m| m.dir.parent())
    }

    /// Whether every worker has exited.
    pub fn all_exited(&self) -> bool {
        self.members.iter().all(|m| m.exit.is_some())
    }

    /// The next worker exit; `None` once all have exited.
    pub async fn next_exit(&mut self) -> Option<Exit> {
        if self.all_exited() {
            return None;
        }
        let exit = self.exits.recv().await?;
        if let Some(member) = self.members.get_mut(exit.local_rank) {
            member.exit = Some(exit);
        }
        Some(exit)
    }

    /// Sends `signal` to the process group of every worker still running.
    pub fn signal_all(&self, signal: Signal) {
        for m in self.members.iter().filter(|m| m.exit.is_none()) {
            worker::signal_group(m.pid, signal);
        }
    }

    /// Kills what is left of the process group of a worker that has
    /// exited: its DataLoader workers and other children, which may hold
    /// its sockets (gloo's) open and keep its peers waiting.
    pub fn kill_group_of(&self, local_rank: usize) {
        if let Some(m) = self.members.get(local_rank).filter(|m| m.exit.is_some()) {
            worker::signal_group(m.pid, Signal::SIGKILL);
        }
    }

    /// Global rank, local rank and node of a worker, as text.
    pub fn describe(&self, local_rank: usize) -> String {
        match self.members.get(local_rank) {
            Some(m) => format!(
                "rank {} (node {}, local rank {})",
                m.place.global_rank, m.place.node_rank, m.place.local_rank
            ),
            None => format!("local rank {local_rank}"),
        }
    }

    /// SIGKILL to every worker's process group: what is left of it once
    /// its worker has exited.
    pub fn kill_all(&self) {
        for m in &self.members {
            worker::signal_group(m.pid, Signal::SIGKILL);
        }
    }

    /// Sends `signal` to every worker, waits up to `grace` for them to
    /// exit, then kills the rest. Returns once all have exited.
    pub async fn stop(&mut self, signal: Signal, grace: Duration) {
        self.signal_all(signal);
        let deadline = Instant::now() + grace;
        while !self.all_exited() {
            match tokio::time::timeout_at(deadline, self.next_exit()).await {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(grace = ?grace, "workers still running after the grace period; sending SIGKILL");
                    self.kill_all();
                    while self.next_exit().await.is_some() {}
                    break;
                }
            }
        }
        // Their process groups may still hold children (DataLoader workers).
        self.kill_all();
    }

    /// Waits until every worker's output has been written out, at most
    /// `patience`: a process that is not the launcher's to kill (it left
    /// the launcher's process tree) may hold a worker's output open, and
    /// the launcher must not wait on it forever.
    pub async fn drain(&mut self, patience: Duration) {
        let drained = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(patience, drained).await.is_err() {
            tracing::warn!(
                ?patience,
                "a worker's output is still held open by a process outside the job; stopped reading it"
            );
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
        }
    }

    /// Every worker that did not exit with code 0, with what is known of why.
    /// `stopped` says, from a local rank and its exit, which exits the
    /// launcher caused.
    pub fn failures(&self, stopped: impl Fn(usize, ExitKind) -> bool) -> Vec<Failure> {
        self.members
            .iter()
            .filter_map(|m| {
                let exit = m.exit?;
                if exit.kind.success() {
                    return None;
                }
                Some(Failure {
                    local_rank: m.place.local_rank,
                    global_rank: m.place.global_rank,
                    pid: m.pid.as_raw().unsigned_abs(),
                    exit: exit.kind,
                    at: exit.at,
                    error_file: m.error_file.clone(),
                    error: ErrorFile::read(&m.error_file),
                    stderr_tail: m
                        .stderr_tail
                        .lock()
                        .map(|t| t.iter().cloned().collect())
                        .unwrap_or_default(),
                    stdout_log: m.stdout_log.clone(),
                    stderr_log: m.stderr_log.clone(),
                    stopped_by_launcher: stopped(m.place.local_rank, exit.kind),
                })
            })
            .collect()
    }

    /// Whether every worker exited with code 0.
    pub fn all_succeeded(&self) -> bool {
        self.members
            .iter()
            .all(|m| m.exit.is_some_and(|e| e.kind.success()))
    }
}

impl Drop for WorkerGroup {
    fn drop(&mut self) {
        // Never leave a worker behind, whatever path drops the group.
        for m in self.members.iter().filter(|m| m.exit.is_none()) {
            worker::signal_group(m.pid, Signal::SIGKILL);
        }
    }
}

/// A pipe for a worker's stream: ours to read (registered with Tokio) and
/// the worker's end, both close-on-exec.
fn pipe() -> Result<(tokio::net::unix::pipe::Receiver, OwnedFd), LaunchError> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| LaunchError::io("cannot make a pipe for a worker's output", e.into()))?;
    let reader = tokio::net::unix::pipe::Receiver::from_owned_fd(read)
        .map_err(|e| LaunchError::io("cannot read a worker's output pipe", e))?;
    Ok((reader, write))
}

/// Whether a worker's `stream`, shown on the console or not, gets a
/// pseudo-terminal.
fn wants_terminal(choice: WorkerTty, stream: Stream, to_console: bool) -> bool {
    to_console
        && match choice {
            WorkerTty::Always => true,
            WorkerTty::Never => false,
            WorkerTty::Auto => pty::launcher_has_terminal(stream == Stream::Stdout),
        }
}

/// A pseudo-terminal as wide as the launcher's terminal less `prefix`;
/// `None` (the stream is a pipe, and a warning says so) where none opens.
fn open_terminal(prefix: &str) -> Option<Pty> {
    let size = pty::Size::of_launcher().less(prefix.width());
    pty::open(size)
        .inspect_err(|e| {
            tracing::warn!(error = %e, "cannot open a pseudo-terminal for a worker; its output goes through a pipe");
        })
        .ok()
}

/// torchrun's prefix template: `${role_name}`, `${rank}`, `${local_rank}`,
/// `${hostname}`.
pub fn render_prefix(template: &str, role: &str, place: WorkerPlace, hostname: &str) -> String {
    template
        .replace("${role_name}", role)
        .replace("${local_rank}", &place.local_rank.to_string())
        .replace("${rank}", &place.global_rank.to_string())
        .replace("${hostname}", hostname)
}

//! Hangs: a job that stops making progress without dying.
//!
//! Each worker beats (`relaunch_client::beat`) when it logs a step, reaches
//! `preemption.reached`, saves a checkpoint or calls `relaunch.heartbeat`,
//! and while it waits with a deadline (the exit's flush and checkpoint upload);
//! [`HangWatch`] reads every rank's beat record four times a second. Once a rank
//! has beaten, no beat from it for `--hang-timeout` means the job is hung;
//! with `--startup-timeout`, so does a rank that has not beaten that long
//! after it started.
//!
//! Before anything is killed, [`collect`] takes every running rank's
//! Python stacks (all threads): `py-spy dump` when it is installed and
//! allowed to attach, else the dump the rank writes itself on the signal
//! `import relaunch` registered with `faulthandler` (named in its beat
//! record), else the last lines of its stderr. The [`HangReport`] names the
//! rank that stopped beating first, each rank's last step, and groups the
//! ranks by where their main thread is; it is written to the attempt's log
//! directory (`hang.json`, and `stack.txt` in each rank's directory), shown
//! on the console and recorded on the run as a `hang` event. Then the
//! attempt ends as a failed one: workers stopped, restart with backoff,
//! counted.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::unistd::Pid;
use relaunch_client::beat::BeatState;
use serde_json::json;

use crate::stacks;

/// The hang timeout when `--hang-timeout` is not given.
pub const DEFAULT_HANG_TIMEOUT: Duration = Duration::from_secs(600);

/// How often the beats are read (mapped memory: nearly free), so a hang is
/// found within a quarter second of its timeout.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

/// How long one `py-spy dump` may take.
const PY_SPY_PATIENCE: Duration = Duration::from_secs(10);

/// Last beats this close together count as the same moment (see
/// [`HangReport::first`]).
pub const SAME_MOMENT: Duration = Duration::from_secs(1);

/// How long a rank has to write its stacks after the dump signal.
const DUMP_PATIENCE: Duration = Duration::from_secs(3);

/// What the launcher knows of one rank when it checks for a hang.
#[derive(Clone, Debug)]
pub struct RankBeat {
    pub local_rank: usize,
    pub global_rank: usize,
    pub pid: Pid,
    /// The rank's log directory.
    pub dir: PathBuf,
    /// `None` when its beat record could not be created.
    pub state: Option<BeatState>,
    /// The last lines of its stderr.
    pub tail: Vec<String>,
}

/// When a job counts as hung.
#[derive(Clone, Copy, Debug)]
pub struct HangWatch {
    /// `None`: off.
    pub timeout: Option<Duration>,
    pub startup: Option<Duration>,
    /// When the attempt's workers started.
    pub started: SystemTime,
}

/// Why the watch fired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stall {
    /// Ranks that beat and then went silent for the timeout.
    Silent(Vec<usize>),
    /// Ranks that never beat within the start-up timeout.
    NeverBeat(Vec<usize>),
    /// Another node found the job hung (its headline); these are this
    /// node's ranks at that moment.
    Elsewhere(String),
}

impl HangWatch {
    /// The stalled ranks (local ranks) among `ranks`, all running, at
    /// `now`; `None` when every rank is making progress.
    pub fn check(&self, ranks: &[RankBeat], now: SystemTime) -> Option<Stall> {
        let since = |t: SystemTime| now.duration_since(t).unwrap_or_default();
        let mut silent = Vec::new();
        let mut never = Vec::new();
        for rank in ranks {
            let Some(state) = rank.state else { continue };
            match state.last {
                Some(last) => {
                    if self.timeout.is_some_and(|t| since(last) >= t) {
                        silent.push(rank.local_rank);
                    }
                }
                None => {
                    if self.startup.is_some_and(|t| since(self.started) >= t) {
                        never.push(rank.local_rank);
                    }
                }
            }
        }
        if !silent.is_empty() {
            Some(Stall::Silent(silent))
        } else if !never.is_empty() {
            Some(Stall::NeverBeat(never))
        } else {
            None
        }
    }
}

/// How a rank's stacks were taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    PySpy,
    /// The rank's own `faulthandler` dump, on the signal it registered.
    Signal,
    /// Neither worked: the last lines of its stderr.
    StderrTail,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Self::PySpy => "py-spy",
            Self::Signal => "faulthandler",
            Self::StderrTail => "stderr tail",
        }
    }
}

/// One rank in a hang report.
#[derive(Clone, Debug)]
pub struct RankStack {
    pub rank: RankBeat,
    pub method: Method,
    pub text: String,
    /// Where its main thread is, when the text is a stack.
    pub place: Option<String>,
    /// Whether it waits for its peers there ([`stacks::waits_on_peers`]).
    pub waits: Option<bool>,
    /// `stack.txt` in its log directory, once written.
    pub file: Option<PathBuf>,
    /// The NCCL flight recorder's dumps in its log directory.
    pub nccl_traces: Vec<PathBuf>,
}

/// Everything said about one hang.
#[derive(Clone, Debug)]
pub struct HangReport {
    pub stall: Stall,
    pub timeout: Option<Duration>,
    pub startup: Option<Duration>,
    pub detected: SystemTime,
    pub node_rank: usize,
    pub hostname: String,
    pub ranks: Vec<RankStack>,
    /// Other nodes that did not take their stacks in time when this node
    /// found the hang: stopped, cut off, or their launcher is gone.
    pub silent_nodes: usize,
    /// The other nodes' ranks, as they published them (the node that
    /// found the hang reads them once they took their stacks).
    pub others: Vec<Summary>,
    /// `hang.json`, once written.
    pub file: Option<PathBuf>,
}

/// Takes every rank's stacks, at once for all of them; in the order of
/// `ranks`.
pub async fn collect(ranks: Vec<RankBeat>) -> Vec<RankStack> {
    let py_spy = py_spy();
    let mut takes = tokio::task::JoinSet::new();
    for (i, rank) in ranks.into_iter().enumerate() {
        let py_spy = py_spy.clone();
        takes.spawn(async move { (i, take(rank, py_spy.as_deref()).await) });
    }
    let mut taken: Vec<(usize, RankStack)> = takes.join_all().await;
    taken.sort_by_key(|(i, _)| *i);
    let mut stacks: Vec<RankStack> = taken.into_iter().map(|(_, stack)| stack).collect();
    nccl_dumps(&mut stacks).await;
    stacks
}

/// How long ranks whose NCCL flight recorder was asked for a dump have to
/// write it.
const NCCL_DUMP_PATIENCE: Duration = Duration::from_secs(5);

/// Asks each rank's NCCL flight recorder for a dump (a write to the pipe
/// torch opened for `TORCH_NCCL_DEBUG_INFO_PIPE_FILE`, which `relaunch
/// run` points into the rank's log directory; only a rank with an NCCL
/// process group has one), waits for the dumps, and lists every dump in
/// each rank's directory.
async fn nccl_dumps(stacks: &mut [RankStack]) {
    use std::io::Write as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let mut asked = Vec::new();
    for (i, stack) in stacks.iter().enumerate() {
        for pipe in entries(&stack.rank.dir, crate::env::NCCL_PIPE_PREFIX) {
            let fifo = std::fs::metadata(&pipe).is_ok_and(|m| m.file_type().is_fifo());
            // Non-blocking: a pipe nobody reads (its rank is gone) must
            // not hang the report.
            let wrote = fifo
                && std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(nix::libc::O_NONBLOCK)
                    .open(&pipe)
                    .and_then(|mut p| p.write_all(b"1\n"))
                    .is_ok();
            if wrote {
                asked.push(i);
            }
        }
    }
    let deadline = tokio::time::Instant::now() + NCCL_DUMP_PATIENCE;
    while !asked.is_empty() && tokio::time::Instant::now() < deadline {
        asked.retain(|&i| entries(&stacks[i].rank.dir, crate::env::NCCL_TRACE_PREFIX).is_empty());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for stack in stacks.iter_mut() {
        stack.nccl_traces = entries(&stack.rank.dir, crate::env::NCCL_TRACE_PREFIX);
    }
}

/// The files in `dir` whose names begin with `prefix`, sorted.
fn entries(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = read
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

async fn take(rank: RankBeat, py_spy: Option<&Path>) -> RankStack {
    // The process to look at: the one that registered a dump signal (the
    // interpreter, when the worker is a wrapper script), else the worker.
    let python = rank
        .state
        .and_then(|s| s.dump)
        .map(|(pid, _)| Pid::from_raw(pid as i32))
        .filter(|pid| in_group(*pid, rank.pid))
        .unwrap_or(rank.pid);
    let (method, text) = match py_spy_dump(py_spy, python).await {
        Some(text) => (Method::PySpy, text),
        None => match signal_dump(&rank).await {
            Some(text) => (Method::Signal, text),
            None => (Method::StderrTail, rank.tail.join("\n")),
        },
    };
    let frames = match method {
        Method::StderrTail => Vec::new(),
        _ => stacks::main_thread(&text),
    };
    RankStack {
        rank,
        method,
        text,
        place: stacks::place(&frames),
        waits: stacks::waits_on_peers(&frames),
        file: None,
        nccl_traces: Vec::new(),
    }
}

/// `py-spy` to use: `RELAUNCH_PY_SPY` (a path, or `off`), else the one on
/// `PATH`, else none.
fn py_spy() -> Option<PathBuf> {
    match std::env::var_os("RELAUNCH_PY_SPY") {
        Some(v) if v == "off" || v == "0" || v.is_empty() => None,
        Some(path) => Some(PathBuf::from(path)),
        None => std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("py-spy"))
                .find(|p| p.is_file())
        }),
    }
}

/// `py-spy dump --pid PID` (every thread); `None` when there is no
/// py-spy, it may not attach (ptrace), or it says nothing in time.
async fn py_spy_dump(py_spy: Option<&Path>, pid: Pid) -> Option<String> {
    let py_spy = py_spy?;
    let run = tokio::process::Command::new(py_spy)
        .args(["dump", "--full-filenames", "--pid", &pid.to_string()])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(PY_SPY_PATIENCE, run).await {
        Ok(Ok(out)) if out.status.success() && !out.stdout.is_empty() => {
            Some(String::from_utf8_lossy(&out.stdout).into_owned())
        }
        Ok(Ok(out)) => {
            tracing::debug!(%pid, stderr = %String::from_utf8_lossy(&out.stderr).trim(), "py-spy could not dump the rank's stacks");
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(%pid, error = %e, "cannot run py-spy");
            None
        }
        Err(_) => {
            tracing::debug!(%pid, "py-spy took too long");
            None
        }
    }
}

/// Whether `pid` is in the process group that `leader` leads (a worker's
/// session): the launcher signals only its own workers' processes.
fn in_group(pid: Pid, leader: Pid) -> bool {
    nix::unistd::getpgid(Some(pid)).is_ok_and(|group| group == leader)
}

/// Sends the rank's registered dump signal and reads what it appends to
/// `stacks.txt` in its log directory.
async fn signal_dump(rank: &RankBeat) -> Option<String> {
    let (pid, number) = rank.state?.dump?;
    let pid = Pid::from_raw(i32::try_from(pid).ok()?);
    if !in_group(pid, rank.pid) {
        return None;
    }
    let file = rank.dir.join(crate::env::STACKS_FILE);
    let before = std::fs::metadata(&file).map_or(0, |m| m.len());
    if let Err(e) = kill_realtime(pid, number) {
        tracing::debug!(%pid, number, error = %e, "cannot send the stack-dump signal");
        return None;
    }
    let deadline = tokio::time::Instant::now() + DUMP_PATIENCE;
    let mut seen = before;
    let mut quiet = 0;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let len = std::fs::metadata(&file).map_or(0, |m| m.len());
        if len > before && len == seen {
            quiet += 1;
            if quiet >= 4 {
                break;
            }
        } else {
            quiet = 0;
        }
        seen = len;
    }
    let text = std::fs::read(&file).ok()?;
    let new = text.get(usize::try_from(before).ok()?..)?;
    (!new.is_empty()).then(|| String::from_utf8_lossy(new).into_owned())
}

/// `kill(pid, number)` for a real-time signal, which `nix`'s `Signal`
/// cannot name. Only real-time numbers are sent: the rank registered a
/// handler for this one, and no other number could stop or kill it.
#[allow(unsafe_code)]
fn kill_realtime(pid: Pid, number: i32) -> nix::Result<()> {
    if !(nix::libc::SIGRTMIN()..=nix::libc::SIGRTMAX()).contains(&number) {
        return Err(nix::errno::Errno::EINVAL);
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    let result = unsafe { nix::libc::kill(pid.as_raw(), number) };
    nix::errno::Errno::result(result).map(drop)
}

/// One rank as a report weighs it: this node's, or another node's as that
/// node published it in the store (`workers/hang_ranks/NODE`).
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub rank: usize,
    pub node_rank: usize,
    pub host: String,
    pub last: Option<SystemTime>,
    pub step: Option<i64>,
    pub place: Option<String>,
    pub waits: Option<bool>,
    pub stacks_by: String,
    pub stack_file: Option<String>,
}

/// What singles out the rank a hang report names ([`HangReport::first`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// Its last beat is earlier than every other's by more than
    /// [`SAME_MOMENT`]: the others went on after it stopped.
    Beats,
    /// Its step is behind every other's.
    Steps,
    /// It is the only one not waiting on its peers while others wait in a
    /// collective (or in DDP's backward).
    Stacks,
    /// It is stuck where no other rank is, while the others share a place.
    Place,
}

fn secs(t: Option<SystemTime>) -> Option<f64> {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64())
}

impl Summary {
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "rank": self.rank,
            "node_rank": self.node_rank,
            "host": self.host,
            "last_beat": secs(self.last),
            "last_step": self.step,
            "where": self.place,
            "waits_on_peers": self.waits,
            "stacks_by": self.stacks_by,
            "stack_file": self.stack_file,
        })
    }

    /// What [`to_json`](Self::to_json) wrote; `None` if it is not that.
    pub fn from_json(value: &serde_json::Value) -> Option<Self> {
        let text = |k: &str| value[k].as_str().map(str::to_owned);
        Some(Self {
            rank: usize::try_from(value["rank"].as_u64()?).ok()?,
            node_rank: usize::try_from(value["node_rank"].as_u64()?).ok()?,
            host: text("host")?,
            last: value["last_beat"]
                .as_f64()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .map(|d| UNIX_EPOCH + d),
            step: value["last_step"].as_i64(),
            place: text("where"),
            waits: value["waits_on_peers"].as_bool(),
            stacks_by: text("stacks_by")?,
            stack_file: text("stack_file"),
        })
    }

    fn step_text(&self) -> String {
        self.step
            .map_or(String::new(), |s| format!(", at step {s}"))
    }
}

impl HangReport {
    /// This node's ranks, then the other nodes'.
    pub fn summaries(&self) -> Vec<Summary> {
        let mut all: Vec<Summary> = self
            .ranks
            .iter()
            .map(|r| Summary {
                rank: r.rank.global_rank,
                node_rank: self.node_rank,
                host: self.hostname.clone(),
                last: r.rank.state.and_then(|s| s.last),
                step: r.rank.state.and_then(|s| s.step),
                place: r.place.clone(),
                waits: r.waits,
                stacks_by: r.method.name().to_owned(),
                stack_file: r.file.as_ref().map(|f| f.display().to_string()),
            })
            .collect();
        all.extend(self.others.iter().cloned());
        all
    }

    /// The rank the evidence points at, of every node whose ranks are
    /// known here, and what points at it; `None` where nothing can tell.
    ///
    /// First the beats: a rank whose last beat is earlier than every
    /// other's by more than [`SAME_MOMENT`] (of this node's that never
    /// beat, for a start-up stall). But ranks in lockstep stop within
    /// milliseconds of each other whichever one hung (the others wait for
    /// it in their next collective), and the order of those last beats is
    /// chance. Among them: the one whose step is behind the others'; else
    /// the only one not waiting on its peers while others wait in a
    /// collective; else the one stuck where no other rank is while the
    /// rest share a place. Else none: the report says it cannot tell.
    pub fn first(&self) -> Option<(Summary, Evidence)> {
        let all = self.summaries();
        let last = |r: &Summary| r.last.unwrap_or(UNIX_EPOCH);
        // Every rank that has beaten, not only those past the timeout at
        // this check: the culprit may be a few milliseconds short of it.
        let candidates: Vec<&Summary> = match &self.stall {
            Stall::Elsewhere(_) => return None,
            Stall::Silent(_) => all.iter().filter(|r| r.last.is_some()).collect(),
            Stall::NeverBeat(_) => {
                let stalled = self.global_ranks(self.stalled());
                all.iter().filter(|r| stalled.contains(&r.rank)).collect()
            }
        };
        let earliest = candidates.iter().map(|r| last(r)).min()?;
        let close: Vec<&Summary> = candidates
            .iter()
            .copied()
            .filter(|r| last(r) <= earliest + SAME_MOMENT)
            .collect();
        let only = |found: Vec<&Summary>, evidence| match found.as_slice() {
            [one] => Some(((*one).clone(), evidence)),
            _ => None,
        };
        if close.len() == 1 {
            return only(close, Evidence::Beats);
        }
        let steps: Vec<i64> = close.iter().filter_map(|r| r.step).collect();
        if let Some(&low) = steps.iter().min() {
            let behind: Vec<&Summary> = close
                .iter()
                .copied()
                .filter(|r| r.step == Some(low))
                .collect();
            if steps.len() == close.len()
                && behind.len() < close.len()
                && let Some(found) = only(behind, Evidence::Steps)
            {
                return Some(found);
            }
        }
        let outside: Vec<&Summary> = close
            .iter()
            .copied()
            .filter(|r| r.waits == Some(false))
            .collect();
        if all.iter().any(|r| r.waits == Some(true))
            && let Some(found) = only(outside, Evidence::Stacks)
        {
            return Some(found);
        }
        let sharing = |r: &Summary| {
            all.iter()
                .filter(|o| o.place.is_some() && o.place == r.place)
                .count()
        };
        let alone: Vec<&Summary> = close.iter().copied().filter(|r| sharing(r) == 1).collect();
        let together = all
            .iter()
            .filter(|r| r.place.is_some() && sharing(r) > 1)
            .count();
        if all.len() >= 3 && together == all.len() - 1 {
            return only(alone, Evidence::Place);
        }
        None
    }

    fn stalled(&self) -> &[usize] {
        match &self.stall {
            Stall::Silent(r) | Stall::NeverBeat(r) => r,
            Stall::Elsewhere(_) => &[],
        }
    }

    /// The global ranks of `local_ranks` (of this node).
    fn global_ranks(&self, local_ranks: &[usize]) -> Vec<usize> {
        self.ranks
            .iter()
            .filter(|r| local_ranks.contains(&r.rank.local_rank))
            .map(|r| r.rank.global_rank)
            .collect()
    }

    /// Ranks grouped by where they are, of every node known here.
    fn groups(&self) -> Vec<(String, String)> {
        let places: Vec<(usize, String)> = self
            .summaries()
            .into_iter()
            .map(|r| {
                let place = r
                    .place
                    .unwrap_or_else(|| format!("unknown (no stack: {})", r.stacks_by));
                (r.rank, place)
            })
            .collect();
        stacks::group(&places)
    }

    /// One line: who stopped, since when, and what says so.
    pub fn headline(&self, attempt: u32) -> String {
        match (&self.stall, self.first()) {
            (Stall::Silent(ranks), found) => {
                let stopped = stacks::ranks_text(&self.global_ranks(ranks));
                let tail = format!(
                    "no progress from rank(s) {stopped} for {:.0?} (--hang-timeout) on node {} ({})",
                    self.timeout.unwrap_or_default(),
                    self.node_rank,
                    self.hostname
                );
                let Some((first, evidence)) = found else {
                    return format!(
                        "hang in attempt {attempt}: {tail}; no rank can be singled out: their last \
                         beats are within {SAME_MOMENT:?} of each other, at the same step, and no \
                         stack stands apart (where each is: below)"
                    );
                };
                let silent = first
                    .last
                    .and_then(|l| self.detected.duration_since(l).ok())
                    .unwrap_or_default()
                    .as_secs_f64();
                let who = if first.node_rank == self.node_rank {
                    format!("rank {}", first.rank)
                } else {
                    format!(
                        "rank {} (node {}, {})",
                        first.rank, first.node_rank, first.host
                    )
                };
                let step = first.step_text();
                let why = match evidence {
                    Evidence::Beats => {
                        format!("{who} stopped beating first, {silent:.0}s ago{step}")
                    }
                    Evidence::Steps => {
                        format!("{who} is behind the others, last beat {silent:.0}s ago{step}")
                    }
                    Evidence::Stacks => format!(
                        "{who} is the one the others wait for (the only one not waiting on its \
                         peers), last beat {silent:.0}s ago{step}"
                    ),
                    Evidence::Place => format!(
                        "{who} is stuck where no other rank is, last beat {silent:.0}s ago{step}"
                    ),
                };
                format!("hang in attempt {attempt}: {why}; {tail}")
            }
            (Stall::NeverBeat(ranks), _) => format!(
                "hang in attempt {attempt}: rank(s) {} made no progress in the {:.0?} after they \
                 started (--startup-timeout) on node {} ({})",
                stacks::ranks_text(&self.global_ranks(ranks)),
                self.startup.unwrap_or_default(),
                self.node_rank,
                self.hostname
            ),
            (Stall::Elsewhere(there), _) => format!(
                "stacks of node {} ({}) for a hang found on another node: {there}",
                self.node_rank, self.hostname
            ),
        }
    }

    /// The console's text: the headline, the ranks of every node known
    /// here grouped by where they are, and where the stacks are.
    pub fn render(&self, attempt: u32) -> String {
        let mut s = format!("relaunch: {}\n", self.headline(attempt));
        for (ranks, place) in self.groups() {
            let plural = if ranks.contains(['-', ',']) {
                "ranks"
            } else {
                "rank"
            };
            s.push_str(&format!("  {plural} {ranks}: {place}\n"));
        }
        for r in &self.ranks {
            let last = r
                .rank
                .state
                .and_then(|s| s.last)
                .and_then(|l| self.detected.duration_since(l).ok())
                .map_or("never beat".to_owned(), |d| {
                    format!("last beat {:.1}s before", d.as_secs_f64())
                });
            s.push_str(&format!(
                "  rank {} (local rank {}, pid {}): {last}{}; stacks by {}{}{}\n",
                r.rank.global_rank,
                r.rank.local_rank,
                r.rank.pid,
                step_text(r),
                r.method.name(),
                r.file
                    .as_ref()
                    .map_or(String::new(), |f| format!(" in {}", f.display())),
                match r.nccl_traces.len() {
                    0 => String::new(),
                    n => format!("; {n} NCCL flight recorder dump(s) beside it"),
                }
            ));
        }
        let mut nodes: Vec<(usize, &str)> = self
            .others
            .iter()
            .map(|o| (o.node_rank, o.host.as_str()))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        for (node, host) in nodes {
            let ranks: Vec<usize> = self
                .others
                .iter()
                .filter(|o| o.node_rank == node)
                .map(|o| o.rank)
                .collect();
            s.push_str(&format!(
                "  node {node} ({host}): rank(s) {}, stacks in its own log directory\n",
                stacks::ranks_text(&ranks)
            ));
        }
        if self.silent_nodes > 0 {
            s.push_str(&format!(
                "  {} other node(s) did not take their ranks' stacks in time: stopped, cut off, \
                 or their launcher is gone\n",
                self.silent_nodes
            ));
        }
        if let Some(file) = &self.file {
            s.push_str(&format!("  report: {}\n", file.display()));
        }
        s.truncate(s.trim_end().len());
        s
    }

    /// `hang.json` and the tracking event's data.
    pub fn to_json(&self, attempt: u32) -> serde_json::Value {
        json!({
            "attempt": attempt,
            "kind": match self.stall {
                Stall::Silent(_) => "silent",
                Stall::NeverBeat(_) => "never_beat",
                Stall::Elsewhere(_) => "elsewhere",
            },
            "detected": secs(Some(self.detected)),
            "hang_timeout_s": self.timeout.map(|t| t.as_secs_f64()),
            "startup_timeout_s": self.startup.map(|t| t.as_secs_f64()),
            "node_rank": self.node_rank,
            "host": self.hostname,
            "first_rank": self.first().map(|(r, _)| r.rank),
            "first_by": self.first().map(|(_, e)| format!("{e:?}").to_lowercase()),
            "silent_nodes": self.silent_nodes,
            "groups": self.groups().into_iter()
                .map(|(ranks, place)| json!({"ranks": ranks, "where": place}))
                .collect::<Vec<_>>(),
            "ranks": self.ranks.iter().map(|r| json!({
                "rank": r.rank.global_rank,
                "local_rank": r.rank.local_rank,
                "pid": r.rank.pid.as_raw(),
                "beats": r.rank.state.map(|s| s.beats),
                "last_beat": secs(r.rank.state.and_then(|s| s.last)),
                "last_step": r.rank.state.and_then(|s| s.step),
                "where": r.place,
                "stacks_by": r.method.name(),
                "stack_file": r.file.as_ref().map(|f| f.display().to_string()),
                "nccl_traces": r.nccl_traces.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "other_nodes_ranks": self.others.iter().map(Summary::to_json).collect::<Vec<_>>(),
        })
    }

    /// This node's ranks as the other nodes' reports take them in.
    pub fn published(&self) -> String {
        let local: Vec<serde_json::Value> = self
            .summaries()
            .iter()
            .filter(|r| r.node_rank == self.node_rank)
            .map(Summary::to_json)
            .collect();
        serde_json::Value::Array(local).to_string()
    }

    /// Writes each rank's `stack.txt` and the attempt's `hang.json`
    /// (beside the rank directories). Failing to write is said, not fatal.
    pub fn write(&mut self, attempt_dir: &Path, attempt: u32) {
        for r in &mut self.ranks {
            let file = r.rank.dir.join("stack.txt");
            let text = format!(
                "# rank {} (pid {}), stacks by {}\n{}\n",
                r.rank.global_rank,
                r.rank.pid,
                r.method.name(),
                r.text
            );
            match std::fs::write(&file, text) {
                Ok(()) => r.file = Some(file),
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e, "cannot write a rank's stacks")
                }
            }
        }
        let file = attempt_dir.join("hang.json");
        let json = serde_json::to_string_pretty(&self.to_json(attempt)).unwrap_or_default();
        match std::fs::write(&file, json) {
            Ok(()) => self.file = Some(file),
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "cannot write the hang report")
            }
        }
    }
}

fn step_text(r: &RankStack) -> String {
    match r.rank.state.and_then(|s| s.step) {
        Some(step) => format!(", at step {step}"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(local: usize, last_ago: Option<u64>, now: SystemTime) -> RankBeat {
        RankBeat {
            local_rank: local,
            global_rank: local + 4,
            pid: Pid::from_raw(1000 + local as i32),
            dir: PathBuf::from("/nowhere"),
            state: Some(BeatState {
                beats: u64::from(last_ago.is_some()),
                last: last_ago.map(|s| now - Duration::from_secs(s)),
                step: last_ago.map(|s| 100 - s as i64),
                step_at: None,
                dump: None,
            }),
            tail: vec![],
        }
    }

    #[test]
    fn a_rank_is_hung_only_after_it_has_beaten_and_gone_silent() {
        let now = SystemTime::now();
        let watch = HangWatch {
            timeout: Some(Duration::from_secs(30)),
            startup: None,
            started: now - Duration::from_secs(3600),
        };
        // Never beat, no start-up limit: not watched.
        assert_eq!(watch.check(&[rank(0, None, now)], now), None);
        assert_eq!(
            watch.check(&[rank(0, Some(5), now), rank(1, Some(29), now)], now),
            None
        );
        assert_eq!(
            watch.check(&[rank(0, Some(5), now), rank(1, Some(31), now)], now),
            Some(Stall::Silent(vec![1]))
        );
        let startup = HangWatch {
            startup: Some(Duration::from_secs(60)),
            ..watch
        };
        assert_eq!(
            startup.check(&[rank(0, Some(5), now), rank(1, None, now)], now),
            Some(Stall::NeverBeat(vec![1]))
        );
        let young = HangWatch {
            started: now - Duration::from_secs(10),
            ..startup
        };
        assert_eq!(young.check(&[rank(1, None, now)], now), None);
        let off = HangWatch {
            timeout: None,
            ..watch
        };
        assert_eq!(off.check(&[rank(1, Some(3000), now)], now), None);
    }

    fn stack(r: RankBeat, place: &str) -> RankStack {
        RankStack {
            rank: r,
            method: Method::Signal,
            text: String::new(),
            place: Some(place.to_owned()),
            waits: Some(place.contains("all_reduce") || place.contains("backward")),
            file: None,
            nccl_traces: Vec::new(),
        }
    }

    fn named(report: &HangReport) -> Option<(usize, Evidence)> {
        report.first().map(|(r, e)| (r.rank, e))
    }

    #[test]
    fn the_report_names_the_first_rank_to_stop_and_groups_the_others() {
        let now = SystemTime::now();
        let report = HangReport {
            stall: Stall::Silent(vec![0, 1, 2]),
            timeout: Some(Duration::from_secs(30)),
            startup: None,
            detected: now,
            node_rank: 1,
            hostname: "node1".into(),
            ranks: vec![
                stack(rank(0, Some(31), now), "in all_reduce, train.py:88"),
                stack(rank(1, Some(45), now), "in sleep, train.py:61"),
                stack(rank(2, Some(31), now), "in all_reduce, train.py:88"),
            ],
            silent_nodes: 0,
            others: Vec::new(),
            file: None,
        };
        assert_eq!(named(&report), Some((5, Evidence::Beats)));
        // Stopped at the same moment: the one not waiting where the others
        // wait is named.
        let mut tie = report.clone();
        tie.ranks[1].rank = rank(1, Some(31), now);
        assert_eq!(named(&tie), Some((5, Evidence::Stacks)));
        assert!(
            tie.render(2)
                .contains("rank 5 is the one the others wait for (the only one not waiting"),
            "{}",
            tie.render(2)
        );
        tie.ranks[1] = stack(tie.ranks[1].rank.clone(), "in all_reduce, train.py:88");
        tie.ranks[0] = stack(tie.ranks[0].rank.clone(), "in load, data.py:9");
        assert_eq!(named(&tie), Some((4, Evidence::Stacks)));
        // Another node's ranks count: its rank 9, stuck where no other
        // rank is, stopped at the same moment as this node's three, which
        // all wait in all_reduce.
        let mut merged = report.clone();
        merged.ranks[1] = stack(rank(1, Some(31), now), "in all_reduce, train.py:88");
        let other = Summary {
            rank: 9,
            node_rank: 2,
            host: "node2".into(),
            // Whole seconds: what survives the JSON exactly.
            last: Some(
                UNIX_EPOCH
                    + Duration::from_secs(
                        (now - Duration::from_secs(31))
                            .duration_since(UNIX_EPOCH)
                            .unwrap()
                            .as_secs(),
                    ),
            ),
            step: Some(69),
            place: Some("in stuck_loading, train.py:23".into()),
            waits: Some(false),
            stacks_by: "py-spy".into(),
            stack_file: None,
        };
        assert_eq!(Summary::from_json(&other.to_json()), Some(other.clone()));
        merged.others = vec![other];
        assert_eq!(named(&merged), Some((9, Evidence::Stacks)));
        let text = merged.render(2);
        assert!(
            text.contains("rank 9 (node 2, node2) is the one the others wait for"),
            "{text}"
        );
        assert!(
            text.contains("ranks 4-6: in all_reduce, train.py:88"),
            "{text}"
        );
        assert!(text.contains("node 2 (node2): rank(s) 9"), "{text}");
        assert_eq!(merged.to_json(2)["other_nodes_ranks"][0]["rank"], 9);
        let text = report.render(2);
        assert!(
            text.contains("rank 5 stopped beating first, 45s ago, at step 55"),
            "{text}"
        );
        assert!(
            text.contains("ranks 4,6: in all_reduce, train.py:88"),
            "{text}"
        );
        assert!(text.contains("rank 5: in sleep, train.py:61"), "{text}");
        let json = report.to_json(2);
        assert_eq!(json["first_rank"], 5);
        assert_eq!(json["first_by"], "beats");
        assert_eq!(json["groups"][0]["ranks"], "4,6");
        assert_eq!(json["ranks"][1]["last_step"], 55);
    }

    /// Issue 34: two ranks in lockstep, rank 5 stuck in the user's code,
    /// rank 4 waiting for its gradients in DDP's backward; rank 4's last
    /// beat 2 ms older. The beats' order named rank 4.
    #[test]
    fn ranks_in_lockstep_are_told_apart_by_evidence_or_not_at_all() {
        let now = SystemTime::now();
        let at = |local: usize, ago: Duration, place: &str| {
            let mut beat = rank(local, Some(0), now);
            if let Some(state) = beat.state.as_mut() {
                state.last = Some(now - ago);
                state.step = Some(11);
            }
            stack(beat, place)
        };
        let mut report = HangReport {
            stall: Stall::Silent(vec![0, 1]),
            timeout: Some(Duration::from_secs(10)),
            startup: None,
            detected: now,
            node_rank: 0,
            hostname: "node0".into(),
            ranks: vec![
                at(
                    0,
                    Duration::from_millis(10_002),
                    "in _engine_run_backward, train.py:40",
                ),
                at(
                    1,
                    Duration::from_millis(10_000),
                    "in training_step, train.py:31",
                ),
            ],
            silent_nodes: 0,
            others: Vec::new(),
            file: None,
        };
        assert_eq!(named(&report), Some((5, Evidence::Stacks)));
        // A rank behind the others' step.
        let mut behind = report.clone();
        behind.ranks[1].waits = Some(true);
        if let Some(state) = behind.ranks[0].rank.state.as_mut() {
            state.step = Some(10);
        }
        assert_eq!(named(&behind), Some((4, Evidence::Steps)));
        assert!(behind.headline(0).contains("rank 4 is behind the others"));
        // Stacks that cannot be read, the same step: nothing tells.
        for r in &mut report.ranks {
            r.waits = None;
            r.place = None;
        }
        assert_eq!(named(&report), None);
        let headline = report.headline(0);
        assert!(
            headline.contains("no rank can be singled out")
                && headline.contains("no progress from rank(s) 4-5 for 10s"),
            "{headline}"
        );
        assert_eq!(report.to_json(0)["first_rank"], serde_json::Value::Null);
        // Three ranks, none known to wait: the one alone is named.
        report.ranks = vec![
            at(0, Duration::from_millis(10_000), "in load, data.py:9"),
            at(1, Duration::from_millis(10_001), "in step, train.py:5"),
            at(2, Duration::from_millis(10_002), "in step, train.py:5"),
        ];
        for r in &mut report.ranks {
            r.waits = Some(false);
        }
        assert_eq!(named(&report), Some((4, Evidence::Place)));
    }
}

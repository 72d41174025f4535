//! What a launch is: the validated, resolved form of torchrun's options.
//!
//! The CLI parses flags; the types here parse the values torchrun accepts
//! (`--nnodes 1:4`, `--redirects 0:1,1:2`, `--nproc-per-node gpu`, signal
//! names) and [`LaunchConfig::validate`] refuses contradictions before
//! anything starts.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::error::LaunchError;

/// `--nproc-per-node`: a count, or what the machine has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NProc {
    Count(usize),
    /// GPUs if there are any, else CPUs.
    Auto,
    Cpu,
    Gpu,
}

impl FromStr for NProc {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "gpu" => Ok(Self::Gpu),
            n => match n.parse::<usize>() {
                Ok(0) => Err("--nproc-per-node must be at least 1".into()),
                Ok(n) => Ok(Self::Count(n)),
                Err(_) => Err(format!(
                    "{s:?} is not a worker count; use a number, auto, cpu or gpu"
                )),
            },
        }
    }
}

impl NProc {
    /// The number of workers this node runs.
    pub fn resolve(self) -> Result<usize, LaunchError> {
        let cpus = || std::thread::available_parallelism().map_or(1, usize::from);
        match self {
            Self::Count(n) => Ok(n),
            Self::Cpu => Ok(cpus()),
            Self::Auto => Ok(match visible_gpus() {
                0 => cpus(),
                n => n,
            }),
            Self::Gpu => match visible_gpus() {
                0 => Err(LaunchError::Config(
                    "--nproc-per-node gpu: no GPU is visible (no /dev/nvidia* device, or \
                     CUDA_VISIBLE_DEVICES is empty); give a number instead"
                        .into(),
                )),
                n => Ok(n),
            },
        }
    }
}

/// GPUs a worker would see: `CUDA_VISIBLE_DEVICES` when set, else the
/// NVIDIA device files.
pub fn visible_gpus() -> usize {
    if let Ok(visible) = std::env::var("CUDA_VISIBLE_DEVICES") {
        return visible
            .split(',')
            .filter(|d| !d.trim().is_empty() && d.trim() != "-1")
            .count();
    }
    visible_gpus_from_devices()
}

/// NVIDIA GPU device files: `/dev/nvidia0`, `/dev/nvidia1`, ...
pub fn visible_gpus_from_devices() -> usize {
    std::fs::read_dir("/dev").map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.strip_prefix("nvidia")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .count()
    })
}

/// `--nnodes`: `N`, or `MIN:MAX` for an elastic job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeRange {
    pub min: usize,
    pub max: usize,
}

impl FromStr for NodeRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parse = |n: &str| {
            n.trim()
                .parse::<usize>()
                .map_err(|_| format!("{s:?} is not a node count; use N or MIN:MAX, e.g. 2 or 1:4"))
        };
        let (min, max) = match s.split_once(':') {
            Some((min, max)) => (parse(min)?, parse(max)?),
            None => {
                let n = parse(s)?;
                (n, n)
            }
        };
        if min == 0 || min > max {
            return Err(format!(
                "--nnodes {s}: need 0 < MIN <= MAX (got MIN={min}, MAX={max})"
            ));
        }
        Ok(Self { min, max })
    }
}

impl NodeRange {
    pub fn is_fixed(self) -> bool {
        self.min == self.max
    }
}

/// Which of a worker's standard streams a setting applies to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Streams {
    pub stdout: bool,
    pub stderr: bool,
}

impl Streams {
    pub const NONE: Self = Self {
        stdout: false,
        stderr: false,
    };

    fn from_code(code: &str, whole: &str) -> Result<Self, String> {
        match code.trim() {
            "0" => Ok(Self::NONE),
            "1" => Ok(Self {
                stdout: true,
                stderr: false,
            }),
            "2" => Ok(Self {
                stdout: false,
                stderr: true,
            }),
            "3" => Ok(Self {
                stdout: true,
                stderr: true,
            }),
            other => Err(format!(
                "{whole:?}: {other:?} is not a stream code; use 0 (none), 1 (stdout), \
                 2 (stderr) or 3 (both), or LOCAL_RANK:CODE pairs like 0:1,1:2"
            )),
        }
    }
}

/// `--redirects` and `--tee`: one code for every local rank (`3`) or codes
/// per local rank (`0:1,1:2`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamSpec {
    All(Streams),
    PerRank(BTreeMap<usize, Streams>),
}

impl Default for StreamSpec {
    fn default() -> Self {
        Self::All(Streams::NONE)
    }
}

impl FromStr for StreamSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if !s.contains(':') {
            return Ok(Self::All(Streams::from_code(s, s)?));
        }
        let mut map = BTreeMap::new();
        for pair in s.split(',') {
            let (rank, code) = pair
                .split_once(':')
                .ok_or_else(|| format!("{s:?}: {pair:?} is not LOCAL_RANK:CODE"))?;
            let rank = rank
                .trim()
                .parse::<usize>()
                .map_err(|_| format!("{s:?}: {rank:?} is not a local rank"))?;
            map.insert(rank, Streams::from_code(code, s)?);
        }
        Ok(Self::PerRank(map))
    }
}

impl StreamSpec {
    pub fn for_rank(&self, local_rank: usize) -> Streams {
        match self {
            Self::All(streams) => *streams,
            Self::PerRank(map) => map.get(&local_rank).copied().unwrap_or_default(),
        }
    }

    fn ranks(&self) -> impl Iterator<Item = usize> + '_ {
        match self {
            Self::All(_) => None,
            Self::PerRank(map) => Some(map.keys().copied()),
        }
        .into_iter()
        .flatten()
    }
}

/// Parses a signal name (`SIGTERM`, `TERM`) or number.
pub fn parse_signal(s: &str) -> Result<Signal, String> {
    let t = s.trim();
    if let Ok(n) = t.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| format!("{n} is not a signal number"));
    }
    let name = t.to_ascii_uppercase();
    let name = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    Signal::from_str(&name)
        .map_err(|_| format!("{t:?} is not a signal name (e.g. SIGTERM, SIGUSR1)"))
}

/// Parses `--signals-to-handle`: comma-separated signal names.
pub fn parse_signals(s: &str) -> Result<Vec<Signal>, String> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let signal = parse_signal(part)?;
        if matches!(signal, Signal::SIGKILL | Signal::SIGSTOP) {
            return Err(format!(
                "{signal} cannot be handled; leave it out of --signals-to-handle"
            ));
        }
        if !out.contains(&signal) {
            out.push(signal);
        }
    }
    Ok(out)
}

/// torchrun's default `--signals-to-handle`.
pub const DEFAULT_SIGNALS: &str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";

/// Signals that stop the job when the launcher receives them; the others in
/// `--signals-to-handle` (SIGUSR1, SIGUSR2) are only passed on.
pub fn stops_the_job(signal: Signal) -> bool {
    matches!(
        signal,
        Signal::SIGTERM | Signal::SIGINT | Signal::SIGHUP | Signal::SIGQUIT
    )
}

/// How workers find each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RendezvousConfig {
    /// A fixed set of nodes; node 0's launcher hosts the store at
    /// `master_addr:master_port`. A single node with no port given picks a
    /// free one, so two jobs on one machine never collide.
    Static {
        master_addr: String,
        master_port: Option<u16>,
    },
    /// Nodes join through a store at `endpoint` (hosted by the launcher on
    /// that host), between `--nnodes` MIN and MAX of them.
    Dynamic {
        host: String,
        port: u16,
        id: String,
        conf: BTreeMap<String, String>,
    },
}

/// The program each worker runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entrypoint {
    pub program: OsString,
    pub args: Vec<OsString>,
    /// The Python that runs the workers; with `--no-python`, the one the
    /// launcher would have used, whose torch the program most likely
    /// imports (asked for its version: [`crate::torch`]).
    pub python: OsString,
    /// What a warm interpreter runs in a forked worker ([`crate::zygote`]);
    /// `None` with `--no-python`, which has no Python to keep warm.
    pub warm: Option<WarmTarget>,
}

/// A Python entry point as a warm interpreter runs it: `python -u script
/// args` or `python -u -m module args`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmTarget {
    pub script: OsString,
    pub module: bool,
    pub args: Vec<OsString>,
}

impl Entrypoint {
    /// torchrun's command: `python -u script args`, `python -u -m module
    /// args`, or (`--no-python`) the script itself.
    pub fn new(
        python: OsString,
        script: OsString,
        args: Vec<OsString>,
        module: bool,
        no_python: bool,
    ) -> Result<Self, LaunchError> {
        if module && no_python {
            return Err(LaunchError::Config(
                "--no-python and --module (-m) contradict each other: -m runs a Python \
                 module, --no-python runs the script without Python; drop one"
                    .into(),
            ));
        }
        if no_python {
            return Ok(Self {
                program: script,
                args,
                python,
                warm: None,
            });
        }
        let mut full = vec![OsString::from("-u")];
        if module {
            full.push("-m".into());
        }
        full.push(script.clone());
        full.extend(args.iter().cloned());
        Ok(Self {
            program: python.clone(),
            args: full,
            python,
            warm: Some(WarmTarget {
                script,
                module,
                args,
            }),
        })
    }
}

/// Everything a launch needs, validated.
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    pub nproc_per_node: usize,
    pub nnodes: NodeRange,
    pub node_rank: usize,
    pub rendezvous: RendezvousConfig,
    /// Stable for the whole job, across restarts (`TORCHELASTIC_RUN_ID`).
    pub run_id: String,
    pub role: String,
    pub max_restarts: u32,
    pub monitor_interval: Duration,
    /// SIGTERM (or the forwarded signal) to SIGKILL.
    pub shutdown_timeout: Duration,
    /// No progress beat for this long from a rank that has beaten means
    /// the job is hung (`None`: never).
    pub hang_timeout: Option<Duration>,
    /// No first beat this long after a rank started means the job is hung
    /// (`None`: no limit).
    pub startup_timeout: Option<Duration>,
    /// Where per-attempt, per-rank logs go; a temporary directory if `None`.
    pub log_dir: Option<PathBuf>,
    /// Streams that go to log files only.
    pub redirects: StreamSpec,
    /// Streams that go to log files and the console.
    pub tee: StreamSpec,
    pub local_ranks_filter: Option<BTreeSet<usize>>,
    /// `${role_name}`, `${rank}`, `${local_rank}`, `${hostname}`.
    pub log_line_prefix_template: String,
    pub signals: Vec<Signal>,
    pub entrypoint: Entrypoint,
    /// `--server`: the job is logged as a run of this tracking server.
    pub tracking: Option<TrackingConfig>,
    /// torchrun's `--duplicate-stdout-filters` / `--duplicate-stderr-filters`.
    pub duplicate_filters: DuplicateFilters,
    /// torchrun's `--virtual-local-rank`: `LOCAL_RANK=0` and one GPU each.
    pub virtual_local_rank: bool,
    /// When a worker's console stream is a pseudo-terminal (`--worker-tty`).
    pub worker_tty: WorkerTty,
    /// The memory tier of checkpoints (`--snapshot-memory`); `None`: off.
    pub snapshot: Option<SnapshotConfig>,
    /// Restarted workers fork from a warm interpreter (`--warm-restarts`,
    /// [`crate::zygote`]).
    pub warm_restarts: bool,
}

/// The memory tier of checkpoints (`--snapshot-memory`): where the
/// launcher makes its directory ([`crate::snapshot`]) and how much the
/// job's snapshots may hold there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotConfig {
    /// The directory the tier's directory is made in, absolute
    /// (`$RELAUNCH_SNAPSHOT_ROOT`, else `/dev/shm`).
    pub root: PathBuf,
    /// Bytes the snapshots may take (`RELAUNCH_SNAPSHOT_MEMORY`).
    pub budget: u64,
    /// Asked for explicitly: a directory that cannot be made stops the
    /// launch; without it the job runs without a tier, with a warning.
    pub required: bool,
}

/// Whether workers write to pseudo-terminals ([`crate::pty`]) or pipes.
/// Only streams the console shows get one: a stream redirected to its log
/// file, or of a rank `--local-ranks-filter` hides, is a pipe, as under
/// torchrun, where such a stream is a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkerTty {
    /// A worker's stream is a terminal when the launcher's is.
    #[default]
    Auto,
    /// Always a terminal (colours and live bars into a pipe or a file).
    Always,
    /// Always a pipe.
    Never,
}

/// Console lines that contain any of these strings are also written to
/// `attempt_N/filtered_stdout.log` (or `filtered_stderr.log`), every rank
/// into one file, prefixed as on the console (torchrun's
/// `--duplicate-*-filters`). Only streams the console shows are filtered,
/// as under torchrun, where they are the tee'd ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DuplicateFilters {
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
}

/// torchrun's default console prefix: `[default0]:`.
pub const DEFAULT_PREFIX_TEMPLATE: &str = "[${role_name}${local_rank}]:";

impl LaunchConfig {
    /// Whether the job's nodes may be other hosts: more than one node, met
    /// at a rendezvous host that is not this one's loopback (several
    /// launchers on one machine meet at `localhost`).
    pub fn spans_hosts(&self) -> bool {
        let host = match &self.rendezvous {
            RendezvousConfig::Static { master_addr, .. } => master_addr,
            RendezvousConfig::Dynamic { host, .. } => host,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        self.nnodes.max > 1 && !loopback
    }

    /// Refuses combinations that cannot work, with a message that says what
    /// to change.
    pub fn validate(&self) -> Result<(), LaunchError> {
        let fail = |m: String| Err(LaunchError::Config(m));
        if self.nproc_per_node == 0 {
            return fail("--nproc-per-node must be at least 1".into());
        }
        match &self.rendezvous {
            RendezvousConfig::Static { master_port, .. } => {
                if !self.nnodes.is_fixed() {
                    return fail(format!(
                        "--nnodes {}:{} needs dynamic rendezvous; add --rdzv-backend c10d \
                         --rdzv-endpoint HOST:PORT, or give a fixed --nnodes",
                        self.nnodes.min, self.nnodes.max
                    ));
                }
                if self.node_rank >= self.nnodes.max {
                    return fail(format!(
                        "--node-rank {} is out of range for --nnodes {} (ranks are 0..{})",
                        self.node_rank,
                        self.nnodes.max,
                        self.nnodes.max - 1
                    ));
                }
                if self.nnodes.max > 1 && master_port.is_none() {
                    return fail(
                        "a multi-node static job needs --master-port (and --master-addr), \
                         the same on every node"
                            .into(),
                    );
                }
            }
            RendezvousConfig::Dynamic { port, .. } => {
                if *port == 0 && self.nnodes.max > 1 {
                    return fail(
                        "--rdzv-endpoint HOST:0 picks a random port, which other nodes \
                         cannot know; give a fixed port for a multi-node job"
                            .into(),
                    );
                }
            }
        }
        if let Some(filter) = &self.local_ranks_filter
            && let Some(bad) = filter.iter().find(|&&r| r >= self.nproc_per_node)
        {
            return fail(format!(
                "--local-ranks-filter names local rank {bad}, but there are only {} workers \
                 per node (0..{})",
                self.nproc_per_node,
                self.nproc_per_node - 1
            ));
        }
        for (flag, spec) in [("--redirects", &self.redirects), ("--tee", &self.tee)] {
            if let Some(bad) = spec.ranks().find(|&r| r >= self.nproc_per_node) {
                return fail(format!(
                    "{flag} names local rank {bad}, but there are only {} workers per node",
                    self.nproc_per_node
                ));
            }
        }
        if let Some(dir) = &self.log_dir
            && dir.exists()
            && !dir.is_dir()
        {
            return fail(format!(
                "--log-dir {} exists and is not a directory",
                dir.display()
            ));
        }
        if self.role.is_empty() || self.role.contains(['/', '\0']) {
            return fail(format!(
                "--role {:?} must be a non-empty name without '/'",
                self.role
            ));
        }
        Ok(())
    }

    /// Total workers when `nodes` nodes take part.
    pub fn world_size(&self, nodes: usize) -> usize {
        nodes * self.nproc_per_node
    }
}

/// Where and how the job is tracked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackingConfig {
    /// `http(s)://HOST:PORT[/prefix]`, checked.
    pub server: String,
    pub token: Option<String>,
    /// The run's project; the server's default when `None`.
    pub project: Option<String>,
    /// The client directory (spools), absolute: workers run elsewhere.
    pub dir: PathBuf,
    /// Between system metric samples; zero turns them off.
    pub system_interval: Duration,
    /// How long the end of the job waits for the server.
    pub exit_timeout: Duration,
}

/// Where this node's workers sit in the job, for one attempt.
#[derive(Clone, Copy, Debug)]
pub struct Placement {
    pub node_rank: usize,
    pub nodes: usize,
    /// Global rank of this node's local rank 0.
    pub first_rank: usize,
    pub world_size: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_config() -> LaunchConfig {
        LaunchConfig {
            nproc_per_node: 1,
            nnodes: NodeRange { min: 1, max: 1 },
            node_rank: 0,
            rendezvous: RendezvousConfig::Static {
                master_addr: "localhost".into(),
                master_port: None,
            },
            run_id: "job".into(),
            role: "default".into(),
            max_restarts: 0,
            monitor_interval: Duration::from_millis(100),
            shutdown_timeout: Duration::from_secs(30),
            hang_timeout: None,
            startup_timeout: None,
            log_dir: None,
            redirects: "0".parse().unwrap(),
            tee: "0".parse().unwrap(),
            local_ranks_filter: None,
            log_line_prefix_template: DEFAULT_PREFIX_TEMPLATE.into(),
            signals: vec![Signal::SIGTERM],
            entrypoint: Entrypoint::new("python3".into(), "t.py".into(), vec![], false, false)
                .unwrap(),
            tracking: None,
            duplicate_filters: DuplicateFilters::default(),
            virtual_local_rank: false,
            worker_tty: WorkerTty::Auto,
            snapshot: None,
            warm_restarts: false,
        }
    }

    #[test]
    fn only_nodes_met_at_a_non_loopback_host_span_hosts() {
        let config = |nnodes: usize, rendezvous: RendezvousConfig| LaunchConfig {
            nnodes: NodeRange {
                min: 1,
                max: nnodes,
            },
            rendezvous,
            ..test_config()
        };
        let dynamic = |host: &str| RendezvousConfig::Dynamic {
            host: host.into(),
            port: 29400,
            id: "j".into(),
            conf: BTreeMap::new(),
        };
        let fixed = |addr: &str| RendezvousConfig::Static {
            master_addr: addr.into(),
            master_port: Some(29500),
        };
        assert!(config(2, dynamic("node0")).spans_hosts());
        assert!(config(2, fixed("10.1.2.3")).spans_hosts());
        assert!(!config(2, dynamic("localhost")).spans_hosts());
        assert!(!config(2, dynamic("127.0.0.1")).spans_hosts());
        assert!(!config(2, fixed("[::1]")).spans_hosts());
        assert!(!config(1, dynamic("node0")).spans_hosts());
    }

    #[test]
    fn nproc_values() {
        assert_eq!("4".parse(), Ok(NProc::Count(4)));
        assert_eq!("auto".parse(), Ok(NProc::Auto));
        assert!("0".parse::<NProc>().is_err());
        assert!(
            "many"
                .parse::<NProc>()
                .unwrap_err()
                .contains("auto, cpu or gpu")
        );
        assert!(NProc::Cpu.resolve().unwrap() >= 1);
    }

    #[test]
    fn nnodes_values() {
        assert_eq!("2".parse(), Ok(NodeRange { min: 2, max: 2 }));
        assert_eq!("1:4".parse(), Ok(NodeRange { min: 1, max: 4 }));
        assert!(
            "4:1"
                .parse::<NodeRange>()
                .unwrap_err()
                .contains("MIN <= MAX")
        );
        assert!("0".parse::<NodeRange>().is_err());
        assert!("x:2".parse::<NodeRange>().is_err());
    }

    #[test]
    fn stream_specs() {
        assert_eq!(
            "3".parse::<StreamSpec>().unwrap().for_rank(7),
            Streams {
                stdout: true,
                stderr: true
            }
        );
        let per: StreamSpec = "0:1,1:2".parse().unwrap();
        assert_eq!(
            per.for_rank(0),
            Streams {
                stdout: true,
                stderr: false
            }
        );
        assert_eq!(
            per.for_rank(1),
            Streams {
                stdout: false,
                stderr: true
            }
        );
        assert_eq!(per.for_rank(2), Streams::NONE);
        assert!("4".parse::<StreamSpec>().unwrap_err().contains("0 (none)"));
        assert!("0:x".parse::<StreamSpec>().is_err());
    }

    #[test]
    fn signals() {
        assert_eq!(
            parse_signals(DEFAULT_SIGNALS).unwrap(),
            [
                Signal::SIGTERM,
                Signal::SIGINT,
                Signal::SIGHUP,
                Signal::SIGQUIT
            ]
        );
        assert_eq!(
            parse_signals("usr1, SIGUSR2").unwrap(),
            [Signal::SIGUSR1, Signal::SIGUSR2]
        );
        assert_eq!(parse_signal("15"), Ok(Signal::SIGTERM));
        assert!(parse_signals("SIGKILL").is_err());
        assert!(parse_signals("SIGNOPE").is_err());
    }

    #[test]
    fn entrypoints_like_torchrun() {
        let e = Entrypoint::new(
            "py".into(),
            "t.py".into(),
            vec!["--lr".into()],
            false,
            false,
        )
        .unwrap();
        assert_eq!(e.program, "py");
        assert_eq!(e.args, ["-u", "t.py", "--lr"]);
        let m = Entrypoint::new("py".into(), "pkg.train".into(), vec![], true, false).unwrap();
        assert_eq!(m.args, ["-u", "-m", "pkg.train"]);
        let n = Entrypoint::new("py".into(), "true".into(), vec![], false, true).unwrap();
        assert_eq!((n.program.as_os_str(), n.args.len()), ("true".as_ref(), 0));
        assert!(Entrypoint::new("py".into(), "x".into(), vec![], true, true).is_err());
    }
}

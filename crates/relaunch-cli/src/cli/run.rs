//! `relaunch run`: torchrun's flags, and relaunch's own.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use relaunch_launch::config::{NProc, NodeRange, StreamSpec};

use crate::size::parse_size;

/// `--rdzv-backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RdzvBackend {
    /// Fixed nodes: node 0 hosts the store at --master-addr:--master-port.
    Static,
    /// Nodes join through relaunch's store at --rdzv-endpoint (MIN:MAX nodes).
    C10d,
    /// torchrun's etcd rendezvous: relaunch needs no etcd and runs c10d at --rdzv-endpoint
    /// instead (a line says so).
    Etcd,
    /// As etcd.
    #[value(name = "etcd-v2")]
    EtcdV2,
}

/// `--worker-tty`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkerTtyChoice {
    Auto,
    Always,
    Never,
}

/// `--warm-restarts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WarmRestarts {
    On,
    Off,
}

/// Options of `relaunch run`: torchrun's, under the same names (both
/// `--nproc-per-node` and `--nproc_per_node`, and `PET_*` variables).
#[derive(Clone, Debug, Args)]
#[command(
    after_help = "Exit codes: 0 success; 1 workers failed (no restart left); 2 bad arguments; \
                  75 stopped by a signal with every rank stopping at the agreed step \
                  (relaunch.preemption) and exiting 0 (preempted: requeue); 128+N stopped by \
                  signal N otherwise (a rank failed, was killed, or exited without agreeing on a \
                  step)."
)]
pub struct RunArgs {
    /// Number of nodes, or MIN:MAX for an elastic job [default: $SLURM_NNODES in SLURM, else 1].
    #[arg(long, env = "PET_NNODES", value_name = "N|MIN:MAX")]
    pub nnodes: Option<NodeRange>,

    /// Workers per node: a number, auto, cpu or gpu [default: $SLURM_GPUS_ON_NODE, else $SLURM_NTASKS_PER_NODE, else $SLURM_TASKS_PER_NODE in SLURM; else 1].
    #[arg(
        long = "nproc-per-node",
        visible_alias = "nproc_per_node",
        env = "PET_NPROC_PER_NODE",
        value_name = "N"
    )]
    pub nproc_per_node: Option<NProc>,

    /// Rank of this node (static rendezvous) [default: $SLURM_NODEID in SLURM, else 0].
    #[arg(
        long = "node-rank",
        visible_alias = "node_rank",
        env = "PET_NODE_RANK",
        value_name = "RANK"
    )]
    pub node_rank: Option<usize>,

    /// Address of node 0, which hosts the store (static rendezvous).
    #[arg(
        long = "master-addr",
        visible_alias = "master_addr",
        env = "PET_MASTER_ADDR",
        value_name = "HOST"
    )]
    pub master_addr: Option<String>,

    /// Port of the store on node 0 (static rendezvous) [default: a free port on a single node, else 29500].
    #[arg(
        long = "master-port",
        visible_alias = "master_port",
        env = "PET_MASTER_PORT",
        value_name = "PORT"
    )]
    pub master_port: Option<u16>,

    /// Rendezvous backend: static, or c10d (relaunch's store, elastic).
    #[arg(
        long = "rdzv-backend",
        visible_alias = "rdzv_backend",
        env = "PET_RDZV_BACKEND",
        value_enum,
        default_value = "static"
    )]
    pub rdzv_backend: RdzvBackend,

    /// HOST:PORT of the rendezvous store (c10d); the launcher on HOST hosts it.
    #[arg(
        long = "rdzv-endpoint",
        visible_alias = "rdzv_endpoint",
        env = "PET_RDZV_ENDPOINT",
        value_name = "HOST:PORT"
    )]
    pub rdzv_endpoint: Option<String>,

    /// Job id shared by all nodes (TORCHELASTIC_RUN_ID).
    #[arg(
        long = "rdzv-id",
        visible_alias = "rdzv_id",
        env = "PET_RDZV_ID",
        value_name = "ID"
    )]
    pub rdzv_id: Option<String>,

    /// Rendezvous settings: KEY=VALUE,... (join_timeout, last_call_timeout, ...).
    #[arg(
        long = "rdzv-conf",
        visible_alias = "rdzv_conf",
        env = "PET_RDZV_CONF",
        default_value = "",
        value_name = "CONF"
    )]
    pub rdzv_conf: String,

    /// One node with a store on a free port; overrides the rendezvous options.
    #[arg(long, env = "PET_STANDALONE")]
    pub standalone: bool,

    /// The job's id, stable across restarts and relaunches (same as --rdzv-id) [default: $RELAUNCH_RUN_ID, else new].
    #[arg(long = "run-id", value_name = "ID")]
    pub run_id: Option<String>,

    /// Restarts of all workers after a failure before giving up.
    #[arg(
        long = "max-restarts",
        visible_alias = "max_restarts",
        env = "PET_MAX_RESTARTS",
        default_value_t = 0,
        value_name = "N"
    )]
    pub max_restarts: u32,

    /// Seconds between health checks of the other nodes (elastic jobs).
    #[arg(
        long = "monitor-interval",
        visible_alias = "monitor_interval",
        env = "PET_MONITOR_INTERVAL",
        default_value_t = 0.1,
        value_name = "SECONDS"
    )]
    pub monitor_interval: f64,

    /// Seconds from forwarding a stop signal to SIGKILL [default: $TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30].
    #[arg(
        long = "shutdown-timeout",
        visible_alias = "shutdown_timeout",
        value_name = "SECONDS"
    )]
    pub shutdown_timeout: Option<f64>,

    /// Seconds without a progress beat (run.log, relaunch.heartbeat, preemption.reached, a checkpoint save) from a rank that has beaten before the job counts as hung: every rank's stacks are reported and the workers restarted; 0 turns it off [default: 600].
    #[arg(
        long = "hang-timeout",
        env = "RELAUNCH_HANG_TIMEOUT",
        value_name = "SECONDS"
    )]
    pub hang_timeout: Option<f64>,

    /// Seconds a rank has, from its start, for its first progress beat before the job counts as hung [default: no limit].
    #[arg(
        long = "startup-timeout",
        env = "RELAUNCH_STARTUP_TIMEOUT",
        value_name = "SECONDS"
    )]
    pub startup_timeout: Option<f64>,

    /// Signals to pass on to every worker; each is a stop request to relaunch.preemption (SIGUSR1/SIGUSR2 leave the launcher waiting on the workers instead of starting the shutdown timer) [default: SIGTERM,SIGINT,SIGHUP,SIGQUIT, and SIGUSR1 in SLURM].
    #[arg(
        long = "signals-to-handle",
        visible_alias = "signals_to_handle",
        env = "PET_SIGNALS_TO_HANDLE",
        value_name = "SIGNALS"
    )]
    pub signals_to_handle: Option<String>,

    /// Role of the workers (ROLE_NAME).
    #[arg(long, env = "PET_ROLE", default_value = "default")]
    pub role: String,

    /// Directory for per-attempt, per-rank logs [default: a temporary one, kept on failure or while a report names it].
    #[arg(
        long = "log-dir",
        visible_alias = "log_dir",
        env = "PET_LOG_DIR",
        value_name = "DIR"
    )]
    pub log_dir: Option<PathBuf>,

    /// Streams to keep out of the console (log files only): 0 none, 1 stdout, 2 stderr, 3 both, or 0:1,1:2.
    #[arg(
        short = 'r',
        long,
        env = "PET_REDIRECTS",
        default_value = "0",
        value_name = "SPEC"
    )]
    pub redirects: StreamSpec,

    /// Streams to show on the console and write to log files (the default for all streams).
    #[arg(
        short = 't',
        long,
        env = "PET_TEE",
        default_value = "0",
        value_name = "SPEC"
    )]
    pub tee: StreamSpec,

    /// Console line prefix; ${role_name}, ${rank}, ${local_rank}, ${hostname} [default: [${role_name}${local_rank}]:].
    #[arg(
        long = "log-line-prefix-template",
        visible_alias = "log_line_prefix_template",
        env = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
        value_name = "TEMPLATE"
    )]
    pub log_line_prefix_template: Option<String>,

    /// Show only these local ranks on the console, e.g. 0 or 0,1 (log files keep all).
    #[arg(
        long = "local-ranks-filter",
        visible_alias = "local_ranks_filter",
        env = "PET_LOCAL_RANKS_FILTER",
        value_name = "RANKS"
    )]
    pub local_ranks_filter: Option<String>,

    /// Duplicate the console's stdout lines that contain any of these strings (comma-separated;
    /// ",," is a comma) to attempt_N/filtered_stdout.log, all ranks in one file.
    #[arg(
        long = "duplicate-stdout-filters",
        visible_alias = "duplicate_stdout_filters",
        value_name = "FILTERS"
    )]
    pub duplicate_stdout_filters: Option<String>,

    /// The same for stderr, into attempt_N/filtered_stderr.log.
    #[arg(
        long = "duplicate-stderr-filters",
        visible_alias = "duplicate_stderr_filters",
        value_name = "FILTERS"
    )]
    pub duplicate_stderr_filters: Option<String>,

    /// Give workers a pseudo-terminal for each stream the console shows, so Rich and tqdm draw
    /// live bars in colour, redrawn in place below the output: auto (when the launcher's stream
    /// is a terminal), always, never (pipes, as log files see them).
    #[arg(
        long = "worker-tty",
        env = "RELAUNCH_WORKER_TTY",
        value_enum,
        default_value = "auto",
        value_name = "WHEN"
    )]
    pub worker_tty: WorkerTtyChoice,

    /// Memory on this node for checkpoint snapshots (relaunch.Checkpointer(memory_every=N)), so that a crashed rank loses nothing: a directory in /dev/shm ($RELAUNCH_SNAPSHOT_ROOT) made at start, kept across every restart and removed when relaunch exits; workers get RELAUNCH_SNAPSHOT_DIR and RELAUNCH_SNAPSHOT_MEMORY (bytes). Bytes, or a number with KiB, MiB or GiB; 0 turns it off. A size more than /dev/shm has free refuses to start [default: a quarter of the node's memory, at most what /dev/shm has free].
    #[arg(
        long = "snapshot-memory",
        env = "RELAUNCH_SNAPSHOT_MEMORY",
        value_parser = parse_size,
        value_name = "SIZE"
    )]
    pub snapshot_memory: Option<usize>,

    /// Restarted workers fork from an interpreter that has already imported torch and the
    /// script's third-party imports, kept by the launcher while a job that can restart runs
    /// (--max-restarts above 0, or a range of nodes), so a restart costs the backoff and joining
    /// the process group. It never runs training code; its log is zygote.log in the log
    /// directory. Modules it imports see no rank environment (RANK, LOCAL_RANK) at import time,
    /// and CUDA must be initialised after the fork, as a cold worker does. off: every worker
    /// starts a new interpreter.
    #[arg(
        long = "warm-restarts",
        env = "RELAUNCH_WARM_RESTARTS",
        value_enum,
        default_value = "on",
        value_name = "WHEN"
    )]
    pub warm_restarts: WarmRestarts,

    /// Every worker sees LOCAL_RANK=0 and only its own GPU (CUDA_VISIBLE_DEVICES), as torchrun's
    /// --virtual-local-rank.
    #[arg(long = "virtual-local-rank", visible_alias = "virtual_local_rank")]
    pub virtual_local_rank: bool,

    /// Accepted for torchrun compatibility: relaunch writes its own log layout (--log-dir);
    /// a line says the LogsSpecs entry point is not loaded.
    #[arg(long = "logs-specs", visible_alias = "logs_specs", value_name = "NAME")]
    pub logs_specs: Option<String>,

    /// Accepted for torchrun compatibility: relaunch records its events in the run (--server)
    /// and on the console; a line says the handler is not used.
    #[arg(
        long = "event-log-handler",
        visible_alias = "event_log_handler",
        value_name = "NAME"
    )]
    pub event_log_handler: Option<String>,

    /// Accepted for torchrun compatibility: relaunch does not bind workers to CPUs; a line
    /// says so (wrap the script with numactl under --no-python to bind).
    #[arg(
        long = "numa-binding",
        visible_alias = "numa_binding",
        value_parser = ["node", "socket", "exclusive", "core-complex"],
        value_name = "MODE"
    )]
    pub numa_binding: Option<String>,

    /// Print a shell completion script for relaunch to stdout and exit.
    #[arg(
        long = "print-completion",
        visible_alias = "print_completion",
        value_parser = ["bash", "zsh", "fish", "elvish", "powershell", "tcsh"],
        value_name = "SHELL",
        exclusive = true
    )]
    pub print_completion: Option<String>,

    /// Accepted for torchrun compatibility; has no effect (a warning says so).
    #[arg(
        long = "local-addr",
        visible_alias = "local_addr",
        env = "PET_LOCAL_ADDR",
        value_name = "HOST"
    )]
    pub local_addr: Option<String>,

    /// Accepted for torchrun compatibility; a script always runs in new processes.
    #[arg(long = "start-method", visible_alias = "start_method", value_parser = ["spawn", "fork", "forkserver"], hide = true)]
    pub start_method: Option<String>,

    /// Run the training script as a Python module (python -m).
    #[arg(short = 'm', long)]
    pub module: bool,

    /// Run the training script directly, without python.
    #[arg(long = "no-python", visible_alias = "no_python")]
    pub no_python: bool,

    /// Accepted for torchrun compatibility; the script runs under python as usual.
    #[arg(long = "run-path", visible_alias = "run_path", hide = true)]
    pub run_path: bool,

    /// Log the job to this tracking server (http://HOST:PORT): status, attempts, root causes,
    /// console lines, system metrics; every rank's relaunch.init() joins the run.
    #[arg(
        long,
        env = "RELAUNCH_SERVER",
        value_name = "URL",
        help_heading = "Tracking"
    )]
    pub server: Option<String>,

    /// The tracking server's token [env: RELAUNCH_SERVER_TOKEN].
    #[arg(long, value_name = "TOKEN", help_heading = "Tracking")]
    pub token: Option<String>,

    /// The run's project on the tracking server [default: the first a rank names, else "default"].
    #[arg(
        long,
        env = "RELAUNCH_PROJECT",
        value_name = "NAME",
        help_heading = "Tracking"
    )]
    pub project: Option<String>,

    /// Where records wait until the server has them (spools) [default:
    /// $XDG_STATE_HOME/relaunch/runs, else ~/.local/state/relaunch/runs].
    #[arg(
        long = "tracking-dir",
        env = "RELAUNCH_DIR",
        value_name = "DIR",
        help_heading = "Tracking"
    )]
    pub tracking_dir: Option<PathBuf>,

    /// Seconds between samples of this node's CPU, memory, disk, network and GPUs; 0 turns them off.
    #[arg(
        long = "system-metrics-interval",
        default_value_t = 10.0,
        value_name = "SECONDS",
        help_heading = "Tracking"
    )]
    pub system_metrics_interval: f64,

    /// Mirror DIR (the job's output folder) to the run's files under DIR's name (NODE/DIR's name on several nodes) while the job runs, every --sync-every seconds, and once more after the last worker exits, whatever the exit. Needs --server.
    #[arg(long = "sync-dir", value_name = "DIR", help_heading = "Tracking")]
    pub sync_dir: Option<PathBuf>,

    /// Seconds between --sync-dir passes.
    #[arg(
        long = "sync-every",
        default_value_t = 60.0,
        value_name = "SECONDS",
        help_heading = "Tracking"
    )]
    pub sync_every: f64,

    /// Print the resolved settings and where each came from (flag, scheduler variable, default), then exit without starting anything.
    #[arg(long = "print-config")]
    pub print_config: bool,

    /// After a clean stop by the scheduler's time-limit warning (SLURM: SIGUSR1 from `--signal=B:USR1@SECONDS`; exit code 75: every rank stopped at the agreed step and exited 0), ask the scheduler to run the job again (`scontrol requeue $SLURM_JOB_ID`, from node 0). A SIGTERM stop (scancel) is not requeued.
    #[arg(long = "requeue-on-preempt")]
    pub requeue_on_preempt: bool,

    /// The training script (or module, or program), then its own arguments: everything after
    /// the script is the script's, even what looks like one of relaunch's flags.
    #[arg(
        value_names = ["TRAINING_SCRIPT", "ARGS"],
        required = true,
        num_args = 1..,
        trailing_var_arg = true
    )]
    pub command: Vec<OsString>,
}

impl RunArgs {
    /// The training script (or module, or program), and its own arguments,
    /// passed through untouched. clap requires the script (`num_args = 1..`);
    /// a struct built by hand without one gives an empty script, which
    /// `Entrypoint::new` refuses.
    pub fn script_and_args(&self) -> (OsString, Vec<OsString>) {
        match self.command.split_first() {
            Some((script, args)) => (script.clone(), args.to_vec()),
            None => (OsString::new(), Vec::new()),
        }
    }
}

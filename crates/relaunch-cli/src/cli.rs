//! The command line's shape: clap derive structs, with defaults that tests
//! can build directly.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use relaunch_api::RunStatus;
use relaunch_launch::config::{NProc, NodeRange, StreamSpec};

use crate::size::parse_size;

/// Keep distributed PyTorch jobs alive through crashes, preemptions and relaunches.
#[derive(Debug, Parser)]
#[command(
    name = "relaunch",
    version,
    after_help = "Run `relaunch <command> --help` for the options of one command.\n\
                  Logs go to stderr; set their level with --log or RELAUNCH_LOG."
)]
pub struct Cli {
    /// Log filter: error, warn, info, debug, trace, or a tracing directive.
    #[arg(
        long,
        global = true,
        env = "RELAUNCH_LOG",
        default_value = "info",
        value_name = "FILTER"
    )]
    pub log: String,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Launch a distributed job, like torchrun (same flags, same worker environment).
    Run(Box<RunArgs>),
    /// Check this host for what breaks distributed training, and say what to change.
    Doctor(DoctorArgs),
    /// The tracking server: runs, metrics, console logs and events, stored in a data directory.
    Server(ServerArgs),
    /// The rendezvous store: a key-value server that PyTorch's TCPStore clients use unmodified.
    #[command(subcommand)]
    Store(StoreCommand),
    /// Runs on a tracking server: list them, or show one.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Print a run's console lines, or follow them while it runs.
    Logs(LogsArgs),
    /// Print one metric of a run as CSV or JSON.
    Metrics(MetricsArgs),
    /// Ship runs logged offline, or left behind by processes that died, to a tracking server.
    Sync(SyncArgs),
    /// A run's files on a tracking server: list, upload, download.
    #[command(subcommand)]
    Files(FilesCommand),
    /// Checkpoints a job shipped to a tracking server.
    #[command(subcommand)]
    Ckpt(CkptCommand),
}

#[derive(Debug, Subcommand)]
pub enum CkptCommand {
    /// Bring a shipped checkpoint back into a Checkpointer's directory, so a job resumes on a
    /// machine that never saw its files.
    Pull(CkptPullArgs),
}

/// Options of `relaunch ckpt pull`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
pub struct CkptPullArgs {
    #[command(flatten)]
    pub connection: ServerConnection,

    /// The run's id.
    pub run: String,

    /// The Checkpointer's directory; the checkpoint lands in DIR/step_N.
    pub dir: PathBuf,

    /// The step to pull [default: the newest complete one].
    #[arg(long, value_name = "N")]
    pub step: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum FilesCommand {
    /// List a run's files.
    Ls(FilesLsArgs),
    /// Upload a file to a run; only the chunks the server lacks are sent, and an interrupted
    /// upload resumes.
    Put(FilesPutArgs),
    /// Download a run's file; an interrupted download resumes, and the result is checked.
    Get(FilesGetArgs),
    /// Make a run's files the same as a local directory (or the reverse), sending only what
    /// differs, as rsync does.
    Sync(FilesSyncArgs),
}

/// Options of `relaunch files ls`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
pub struct FilesLsArgs {
    #[command(flatten)]
    pub connection: ServerConnection,

    /// The run's id.
    pub run: String,

    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: ListFormat,
}

/// Options of `relaunch files put`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
pub struct FilesPutArgs {
    #[command(flatten)]
    pub connection: ServerConnection,

    /// The run's id.
    pub run: String,

    /// The file to upload.
    pub path: PathBuf,

    /// Its name in the run, a relative path like ckpt/model.pt [default: the file's name].
    #[arg(long)]
    pub name: Option<String>,
}

/// Options of `relaunch files get`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
pub struct FilesGetArgs {
    #[command(flatten)]
    pub connection: ServerConnection,

    /// The run's id.
    pub run: String,

    /// The file's name in the run.
    pub name: String,

    /// Where to write it [default: its name's last part, here].
    pub dest: Option<PathBuf>,
}

/// Options of `relaunch files sync`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
#[command(after_help = "\
Directions:
  relaunch files sync DIR RUN[:PREFIX]   upload: the run's files under PREFIX become DIR's
  relaunch files sync RUN[:PREFIX] DIR   download: DIR gets the run's files under PREFIX

A file is sent when its size or BLAKE3 differs (a local cache of sizes, times and hashes
saves rehashing what did not change); an upload sends only the chunks the server lacks, so
a log that only grew sends its new tail. With --delete, what the other side has and this
side does not is removed there (never what the filters leave out).

Filters, as rsync's: --include and --exclude in the order given, the first that matches a
path decides (none: included). * and ? stay inside one path part, ** crosses them; a
pattern with a / is matched against the end of the relative path (from the top when it
starts with /), one without against the last part; a trailing / matches directories only,
and an excluded directory is not entered.")]
pub struct FilesSyncArgs {
    #[command(flatten)]
    pub connection: ServerConnection,

    /// From: a local directory (upload), or RUN[:PREFIX] (download).
    pub source: String,

    /// To: RUN[:PREFIX] (upload), or a local directory, created if missing (download).
    pub dest: String,

    /// Sync the paths that match PATTERN (see the rules below); repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub include: Vec<String>,

    /// Leave out the paths that match PATTERN; repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub exclude: Vec<String>,

    /// Say what would be sent, and send nothing.
    #[arg(long, short = 'n')]
    pub dry_run: bool,

    /// Also remove from the other side what this side does not have (rsync's --delete); paths
    /// the filters leave out are never removed.
    #[arg(long)]
    pub delete: bool,

    /// Keep the directory uploaded: a pass every SECONDS until SIGTERM or SIGINT, then a last one.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, conflicts_with = "dry_run")]
    pub watch: Option<Duration>,

    /// --include and --exclude in the order given: (include?, pattern).
    #[arg(skip)]
    pub rules: Vec<(bool, String)>,
}

/// Options of `relaunch server`.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ServerArgs {
    /// Start the server (no subcommand), or a maintenance command.
    #[command(subcommand)]
    pub command: Option<ServerCommand>,

    /// Where the database and files live (created if missing); with --database or --blobs, what
    /// they do not hold.
    #[arg(
        long,
        env = "RELAUNCH_DATA_DIR",
        default_value = "relaunch-data",
        value_name = "DIR"
    )]
    pub data_dir: PathBuf,

    /// Keep runs, metrics, console lines and events in PostgreSQL instead of SQLite in
    /// --data-dir: postgres://USER[:PASSWORD]@HOST:PORT/DB (the password from PGPASSWORD when
    /// the URL has none). The schema is created or migrated at start.
    #[arg(long, value_name = "URL")]
    pub database: Option<String>,

    /// Keep file and checkpoint chunks in an S3-compatible bucket instead of --data-dir:
    /// s3://BUCKET/PREFIX. Credentials and region from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_REGION; the bucket must exist and is checked at start.
    #[arg(long, value_name = "URL")]
    pub blobs: Option<String>,

    /// The S3-compatible service for --blobs (SeaweedFS, MinIO, ...) [default: AWS_ENDPOINT_URL,
    /// else AWS].
    #[arg(long, value_name = "URL", requires = "blobs")]
    pub s3_endpoint: Option<String>,

    /// Address to listen on; anything but loopback needs --token.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on; 0 picks a free one.
    #[arg(long, default_value_t = 8765)]
    pub port: u16,

    /// Token every request must carry (Authorization: Bearer TOKEN) [env: RELAUNCH_SERVER_TOKEN].
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,

    /// Largest request body accepted; larger ones get 413 with this limit in the message.
    #[arg(long, default_value = "64MiB", value_parser = parse_size, value_name = "SIZE")]
    pub max_request_bytes: usize,

    /// What an acknowledged write survives: fsync (power loss) or process (the server being killed).
    #[arg(long, value_enum, default_value = "fsync")]
    pub durability: DurabilityArg,

    /// Seconds a client may take from the first byte of a request to the end of its headers.
    #[arg(long, default_value = "30", value_parser = parse_seconds, value_name = "SECONDS")]
    pub header_timeout: Duration,

    /// Seconds a connection may go without a byte while the server waits for the client
    /// (between requests, within a request body, or for it to read a response); a slow upload
    /// that keeps sending is never cut.
    #[arg(long, default_value = "120", value_parser = parse_seconds, value_name = "SECONDS")]
    pub idle_timeout: Duration,

    /// Connections open at once; more are answered 503 (lowered to fit the open-file limit).
    #[arg(long, default_value_t = relaunch_server::DEFAULT_MAX_CONNECTIONS, value_name = "N")]
    pub max_connections: usize,

    /// Database reads at once; heavy ones (series, log pages, listings) take at most N-1 of them
    /// and more wait their turn without holding a thread, and writes never wait for reads.
    #[arg(long, default_value_t = relaunch_server::storage::sqlite::DEFAULT_MAX_READERS, value_name = "N")]
    pub max_readers: usize,
}

impl Default for ServerArgs {
    fn default() -> Self {
        Self {
            command: None,
            data_dir: "relaunch-data".into(),
            database: None,
            blobs: None,
            s3_endpoint: None,
            host: "127.0.0.1".into(),
            port: 8765,
            token: None,
            max_request_bytes: relaunch_server::DEFAULT_MAX_REQUEST_BYTES,
            durability: DurabilityArg::Fsync,
            header_timeout: relaunch_server::DEFAULT_HEADER_TIMEOUT,
            idle_timeout: relaunch_server::DEFAULT_IDLE_TIMEOUT,
            max_connections: relaunch_server::DEFAULT_MAX_CONNECTIONS,
            max_readers: relaunch_server::storage::sqlite::DEFAULT_MAX_READERS,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Subcommand)]
pub enum ServerCommand {
    /// Copy every project, run, metric, console line, event, file and checkpoint from one
    /// storage into another: a data directory into PostgreSQL (+ S3), or back.
    #[command(after_help = MIGRATE_HELP)]
    Migrate(Box<MigrateArgs>),
}

const MIGRATE_HELP: &str = "\
Examples:
  relaunch server migrate --from relaunch-data --database postgres://relaunch@db:5432/relaunch \\
      --blobs s3://bucket/relaunch
  relaunch server migrate --from-database postgres://relaunch@db:5432/relaunch \\
      --from-blobs s3://bucket/relaunch --to laptop-data

The source is only read. Each run is copied in one transaction, so a migration that is
interrupted resumes where it stopped when run again: runs already in the target are skipped,
chunks already in the target's store are not sent again. A run id in both with different
content is an error, never merged. The end prints a per-table count of the source's rows and
the target's, and the exit status is 1 if any differs.";

/// Options of `relaunch server migrate`: the source as `--from*`, the
/// target with the flags `relaunch server` would start on it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).multiple(true)
    .args(["from", "from_database"])))]
#[command(group(clap::ArgGroup::new("target").required(true).multiple(true)
    .args(["to", "database"])))]
pub struct MigrateArgs {
    /// The --data-dir of the server to copy from: its SQLite database (unless
    /// --from-database), and its file chunks (unless --from-blobs).
    #[arg(long, value_name = "DIR", help_heading = "Source")]
    pub from: Option<PathBuf>,

    /// The PostgreSQL database of the server to copy from (its --database), read in one
    /// read-only snapshot.
    #[arg(long, value_name = "URL", help_heading = "Source")]
    pub from_database: Option<String>,

    /// The S3 location of its file chunks (its --blobs): s3://BUCKET/PREFIX.
    #[arg(long, value_name = "URL", help_heading = "Source")]
    pub from_blobs: Option<String>,

    /// The S3-compatible service of --from-blobs [default: AWS_ENDPOINT_URL, else AWS].
    #[arg(
        long,
        value_name = "URL",
        requires = "from_blobs",
        help_heading = "Source"
    )]
    pub from_s3_endpoint: Option<String>,

    /// The data directory (created if missing) to copy into: SQLite (unless --database)
    /// and file chunks (unless --blobs).
    #[arg(long, value_name = "DIR", help_heading = "Target")]
    pub to: Option<PathBuf>,

    /// The PostgreSQL database to copy into, postgres://USER[:PASSWORD]@HOST:PORT/DB
    /// (the password from PGPASSWORD when the URL has none); its schema is created or migrated.
    #[arg(long, value_name = "URL", help_heading = "Target")]
    pub database: Option<String>,

    /// The S3 location for file chunks, s3://BUCKET/PREFIX (the bucket must exist).
    /// Credentials and region from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, for
    /// both sides.
    #[arg(long, value_name = "URL", help_heading = "Target")]
    pub blobs: Option<String>,

    /// The S3-compatible service of --blobs [default: AWS_ENDPOINT_URL, else AWS].
    #[arg(long, value_name = "URL", requires = "blobs", help_heading = "Target")]
    pub s3_endpoint: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    Fsync,
    Process,
}

/// Options of `relaunch doctor`.
#[derive(Clone, Debug, Args)]
pub struct DoctorArgs {
    /// The rendezvous port to check (--master-port or the --rdzv-endpoint port).
    #[arg(long, default_value_t = 29500)]
    pub port: u16,

    /// Nodes the job will use; more than 1 makes multi-node pitfalls warnings.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub nnodes: usize,

    /// The job's checkpoint directory: the last save's time is compared with the scheduler's warning (SLURM `--signal`) and the grace period.
    #[arg(long, value_name = "DIR")]
    pub ckpt_dir: Option<PathBuf>,

    /// Seconds from the container runtime's SIGTERM to its SIGKILL (Kubernetes' terminationGracePeriodSeconds), which no runtime shows the container.
    #[arg(long, env = "RELAUNCH_GRACE_PERIOD", value_parser = parse_seconds, value_name = "SECONDS")]
    pub grace_period: Option<Duration>,

    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: DoctorFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DoctorFormat {
    Text,
    Json,
}

/// `--rdzv-backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RdzvBackend {
    /// Fixed nodes: node 0 hosts the store at --master-addr:--master-port.
    Static,
    /// Nodes join through relaunch's store at --rdzv-endpoint (MIN:MAX nodes).
    C10d,
}

/// Options of `relaunch run`: torchrun's, under the same names (both
/// `--nproc-per-node` and `--nproc_per_node`, and `PET_*` variables).
#[derive(Clone, Debug, Args)]
#[command(
    after_help = "Exit codes: 0 success; 1 workers failed (no restart left); 2 bad arguments; \
                  75 stopped by a signal with every worker exiting cleanly (preempted: requeue); \
                  128+N stopped by signal N with workers that did not exit cleanly."
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

    /// Directory for per-attempt, per-rank logs [default: a temporary one, kept on failure].
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

    /// Where records wait until the server has them (spools) [default: ./relaunch-runs].
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

    /// After a clean stop by the scheduler's time-limit warning (SLURM: SIGUSR1 from `--signal=B:USR1@SECONDS`; exit code 75: every rank stopped at the agreed step), ask the scheduler to run the job again (`scontrol requeue $SLURM_JOB_ID`, from node 0). A SIGTERM stop (scancel) is not requeued.
    #[arg(long = "requeue-on-preempt")]
    pub requeue_on_preempt: bool,

    /// The training script (or module, or program), then its own arguments.
    #[arg(value_name = "TRAINING_SCRIPT", required = true)]
    pub training_script: OsString,

    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub training_script_args: Vec<OsString>,
}

/// Which tracking server to talk to; shared by every command that reads
/// from one. The environment variables are read when the flags are absent
/// (in `tracking::connect`), so that `relaunch sync` can tell a flag from
/// the environment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
pub struct ServerConnection {
    /// The tracking server, as http://HOST:PORT [env: RELAUNCH_SERVER].
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,

    /// The server's access token [env: RELAUNCH_SERVER_TOKEN].
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// List runs, newest first.
    Ls(RunsLsArgs),
    /// Show one run: its settings, the latest value of every metric, and its events.
    Show(RunsShowArgs),
}

/// Options of `relaunch runs ls`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
pub struct RunsLsArgs {
    #[command(flatten)]
    pub connection: ServerConnection,

    /// Only runs of this project.
    #[arg(long)]
    pub project: Option<String>,

    /// Only runs with this tag.
    #[arg(long)]
    pub tag: Option<String>,

    /// Only runs in this state.
    #[arg(long, value_enum)]
    pub status: Option<StatusArg>,

    /// Only runs whose config has this value at a dotted path, e.g. optim.lr=0.001 (repeatable).
    #[arg(long, value_name = "PATH=VALUE", value_parser = parse_param)]
    pub param: Vec<String>,

    /// Most runs to list [default: the server's, 10000].
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,

    /// Output format: a table for people, or the API's JSON array.
    #[arg(long, value_enum, default_value = "table")]
    pub format: ListFormat,
}

/// `--status`: a run's state, as the server names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StatusArg {
    Running,
    Preempted,
    Restarting,
    Failed,
    Finished,
}

impl From<StatusArg> for RunStatus {
    fn from(status: StatusArg) -> Self {
        match status {
            StatusArg::Running => RunStatus::Running,
            StatusArg::Preempted => RunStatus::Preempted,
            StatusArg::Restarting => RunStatus::Restarting,
            StatusArg::Failed => RunStatus::Failed,
            StatusArg::Finished => RunStatus::Finished,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ListFormat {
    #[default]
    Table,
    Json,
}

/// Options of `relaunch runs show`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
pub struct RunsShowArgs {
    #[command(flatten)]
    pub connection: ServerConnection,

    /// The run's id.
    pub run: String,

    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: ShowFormat,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ShowFormat {
    #[default]
    Text,
    Json,
}

/// Options of `relaunch logs`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
#[command(
    after_help = "Lines print as `[rank R] text`, and `[rank R:err] text` for stderr. \
                  With --follow, Ctrl-C or SIGTERM stops following (exit code 0)."
)]
pub struct LogsArgs {
    #[command(flatten)]
    pub connection: ServerConnection,

    /// The run's id.
    pub run: String,

    /// Only this rank's lines [default: every rank's].
    #[arg(long, value_name = "R")]
    pub rank: Option<u32>,

    /// Keep printing new lines until the run is finished or failed.
    #[arg(short, long)]
    pub follow: bool,

    /// Start after the line with this id (ids only grow), e.g. to resume.
    #[arg(long, default_value_t = 0, value_name = "ID", conflicts_with = "tail")]
    pub after: u64,

    /// Start with the last N lines (with --follow: then the new ones).
    #[arg(short = 'n', long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub tail: Option<u32>,
}

/// Most points of one series read: the server's limit.
pub(crate) const MAX_BUCKETS: u32 = 100_000;

/// Options of `relaunch metrics`.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
#[command(
    after_help = "CSV columns: step,value,wall,attempt; a downsampled series adds min,max,count \
                  (value is then each bucket's last)."
)]
pub struct MetricsArgs {
    #[command(flatten)]
    pub connection: ServerConnection,

    /// The run's id.
    pub run: String,

    /// The metric's name, as logged.
    pub key: String,

    /// The rank whose values to print [default: the lowest rank that logged KEY].
    #[arg(long, value_name = "R")]
    pub rank: Option<u32>,

    /// Only this attempt's values [default: for each step, the newest attempt that logged it].
    #[arg(long, value_name = "A")]
    pub attempt: Option<u32>,

    /// Points at most; longer series come back as this many buckets (1 to 100000).
    #[arg(long, default_value_t = MAX_BUCKETS, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BUCKETS)))]
    pub buckets: u32,

    /// First step to include.
    #[arg(long, value_name = "STEP", allow_negative_numbers = true)]
    pub min_step: Option<i64>,

    /// Last step to include.
    #[arg(long, value_name = "STEP", allow_negative_numbers = true)]
    pub max_step: Option<i64>,

    /// Output format: CSV, or the API's series as JSON.
    #[arg(long, value_enum, default_value = "csv")]
    pub format: MetricsFormat,
}

impl Default for MetricsArgs {
    fn default() -> Self {
        Self {
            connection: ServerConnection::default(),
            run: String::new(),
            key: String::new(),
            rank: None,
            attempt: None,
            buckets: MAX_BUCKETS,
            min_step: None,
            max_step: None,
            format: MetricsFormat::Csv,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum MetricsFormat {
    #[default]
    Csv,
    Json,
}

/// Options of `relaunch sync`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
#[command(
    after_help = "Each spool goes to --server when given, else to the server it was logged for, \
                  else to $RELAUNCH_SERVER. A spool is removed once the server has all of it. \
                  Exit code 1 when any spool was not shipped."
)]
pub struct SyncArgs {
    /// The client's directory (default ./relaunch-runs), one run's, or one writer's.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    #[command(flatten)]
    pub connection: ServerConnection,

    /// Seconds to wait for the server before giving up [default: as long as it takes].
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub timeout: Option<Duration>,
}

/// `--param PATH=VALUE`, checked for its shape before anything is sent.
fn parse_param(text: &str) -> Result<String, String> {
    match text.split_once('=') {
        Some((path, _)) if !path.trim().is_empty() => Ok(text.to_owned()),
        _ => Err(format!(
            "{text:?} is not PATH=VALUE; name a dotted config path and its value, e.g. optim.lr=0.001"
        )),
    }
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("{text:?} is not a number of seconds >= 0, e.g. 30 or 2.5"))
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Serve a store until SIGTERM or SIGINT.
    ///
    /// Point workers at it with MASTER_ADDR and MASTER_PORT (and
    /// TORCHELASTIC_USE_AGENT_STORE=True so that no rank starts its own).
    /// Prints `listening on HOST:PORT` on stderr once it accepts connections.
    Serve(ServeArgs),
}

/// Options of `relaunch store serve`.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct ServeArgs {
    /// Address or name to listen on [default: every interface, IPv6 and IPv4].
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,

    /// Port to listen on; 0 picks a free port.
    #[arg(long, default_value_t = 29400)]
    pub port: u16,

    /// Longest key a request may carry.
    #[arg(long, default_value = "8KiB", value_parser = parse_size, value_name = "SIZE")]
    pub max_key_bytes: usize,

    /// Largest value a request may carry.
    #[arg(long, default_value = "8MiB", value_parser = parse_size, value_name = "SIZE")]
    pub max_value_bytes: usize,

    /// Most keys in one CHECK, WAIT, MULTI_GET or MULTI_SET request.
    #[arg(long, default_value_t = 131072, value_name = "N")]
    pub max_keys: usize,

    /// Largest request as a whole.
    #[arg(long, default_value = "64MiB", value_parser = parse_size, value_name = "SIZE")]
    pub max_frame_bytes: usize,

    /// Threads serving connections [default: one per CPU, at most 16].
    #[arg(long, default_value_t = 0, hide_default_value = true, value_name = "N")]
    pub threads: usize,
}

impl Default for ServeArgs {
    fn default() -> Self {
        let limits = relaunch_store::Limits::default();
        Self {
            host: None,
            port: 29400,
            max_key_bytes: limits.max_key_bytes,
            max_value_bytes: limits.max_value_bytes,
            max_keys: limits.max_keys,
            max_frame_bytes: limits.max_frame_bytes,
            threads: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_agree_with_the_parser() {
        let cli = Cli::try_parse_from(["relaunch", "store", "serve"]).unwrap();
        let Command::Store(StoreCommand::Serve(args)) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(args, ServeArgs::default());

        let cli = Cli::try_parse_from(["relaunch", "server"]).unwrap();
        let Command::Server(args) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(args, ServerArgs::default());

        let cli = Cli::try_parse_from(["relaunch", "metrics", "r", "k"]).unwrap();
        let Command::Metrics(args) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(
            args,
            MetricsArgs {
                run: "r".into(),
                key: "k".into(),
                ..MetricsArgs::default()
            }
        );

        let cli = Cli::try_parse_from(["relaunch", "runs", "ls"]).unwrap();
        let Command::Runs(RunsCommand::Ls(args)) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(args, RunsLsArgs::default());

        let cli = Cli::try_parse_from(["relaunch", "logs", "r"]).unwrap();
        let Command::Logs(args) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(
            args,
            LogsArgs {
                run: "r".into(),
                ..LogsArgs::default()
            }
        );
    }

    #[test]
    fn tracking_arguments_are_checked_while_parsing() {
        for argv in [
            &["relaunch", "runs", "ls", "--param", "lr"][..],
            &["relaunch", "runs", "ls", "--param", "=1"][..],
            &["relaunch", "metrics", "r", "k", "--buckets", "0"][..],
            &["relaunch", "metrics", "r", "k", "--buckets", "100001"][..],
            &["relaunch", "sync", "d", "--timeout", "-1"][..],
            &["relaunch", "sync", "d", "--timeout", "soon"][..],
        ] {
            assert!(Cli::try_parse_from(argv).is_err(), "{argv:?}");
        }
        let cli = Cli::try_parse_from([
            "relaunch",
            "metrics",
            "r",
            "k",
            "--min-step",
            "-5",
            "--max-step=10",
        ])
        .unwrap();
        let Command::Metrics(args) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!((args.min_step, args.max_step), (Some(-5), Some(10)));
    }

    #[test]
    fn run_takes_torchrun_spellings_and_leaves_script_flags_alone() {
        let cli = Cli::try_parse_from([
            "relaunch",
            "run",
            "--nproc_per_node",
            "2",
            "--max-restarts=3",
            "-t",
            "3",
            "train.py",
            "--lr",
            "0.1",
            "--nproc-per-node",
            "9",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(args.nproc_per_node, Some(NProc::Count(2)));
        assert_eq!(args.max_restarts, 3);
        assert_eq!(args.training_script, "train.py");
        assert_eq!(
            args.training_script_args,
            ["--lr", "0.1", "--nproc-per-node", "9"]
        );
    }
}

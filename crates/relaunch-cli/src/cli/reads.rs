//! The commands that read a tracking server: `runs`, `logs`, `metrics`,
//! and `sync`, which ships what was logged offline.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use relaunch_api::RunStatus;

use super::{parse_metric, parse_param, parse_seconds};

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

    /// Only runs whose config has this value at a dotted path, e.g. optim.lr=0.001; also
    /// !=, and <, <=, >, >= with a number (repeatable).
    #[arg(long, value_name = "PATH=VALUE", value_parser = parse_param)]
    pub param: Vec<String>,

    /// Only runs whose newest value of a metric compares so, e.g. 'loss<0.5'; OP one of
    /// = != < <= > >= (repeatable).
    #[arg(long, value_name = "KEY<OP>NUMBER", value_parser = parse_metric)]
    pub metric: Vec<String>,

    /// Only runs whose id, name, project, tags or notes contain this text (any case).
    #[arg(long, value_name = "TEXT")]
    pub search: Option<String>,

    /// Order: created, updated, name, status, attempts, project, config.PATH or summary.KEY;
    /// '-' first for descending [default: -created, newest first].
    #[arg(long, value_name = "FIELD", allow_hyphen_values = true)]
    pub sort: Option<String>,

    /// Runs to skip, in that order, before the first listed (paging with --limit).
    #[arg(long, value_name = "N")]
    pub offset: Option<u32>,

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

/// Options of `relaunch export`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
#[command(
    after_help = "Columns: run,rank,step,key,value,wall,attempt, one row per point, every point \
                  (never sampled). CSV writes nan, inf and -inf as pandas reads them; Parquet \
                  keeps them as doubles, steps as int64. Each step holds the newest attempt's \
                  value unless --attempt names one."
)]
pub struct ExportArgs {
    #[command(flatten)]
    pub connection: ServerConnection,

    /// The runs' ids.
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<String>,

    /// Only this metric (repeat for several) [default: every metric].
    #[arg(long = "key", value_name = "KEY")]
    pub keys: Vec<String>,

    /// Only this rank's points [default: every rank's].
    #[arg(long, value_name = "R")]
    pub rank: Option<u32>,

    /// Only this attempt's points [default: for each step, the newest attempt that logged it].
    #[arg(long, value_name = "A")]
    pub attempt: Option<u32>,

    /// First step to include.
    #[arg(long, value_name = "STEP", allow_negative_numbers = true)]
    pub min_step: Option<i64>,

    /// Last step to include.
    #[arg(long, value_name = "STEP", allow_negative_numbers = true)]
    pub max_step: Option<i64>,

    /// Output format.
    #[arg(long, value_enum, default_value = "csv")]
    pub format: ExportFormat,

    /// Write to this file (whole or not at all: a failed export leaves none) [default: stdout].
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    #[default]
    Csv,
    /// Apache Parquet (Snappy), for pandas, polars, DuckDB, Spark.
    Parquet,
}

/// Options of `relaunch sync`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
#[command(
    after_help = "Each spool goes to --server when given, else to the server it was logged for, \
                  else to $RELAUNCH_SERVER. A spool is removed once the server has all of it. \
                  Exit code 1 when any spool was not shipped."
)]
pub struct SyncArgs {
    /// The client's directory, one run's, or one writer's [default: RELAUNCH_DIR, else
    /// $XDG_STATE_HOME/relaunch/runs, else ~/.local/state/relaunch/runs].
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,

    #[command(flatten)]
    pub connection: ServerConnection,

    /// Seconds to wait for the server before giving up [default: as long as it takes].
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub timeout: Option<Duration>,
}

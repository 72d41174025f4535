//! `relaunch server` and `relaunch server migrate`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

use super::parse_seconds;
use crate::size::parse_size;

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

    /// With --blobs, clients send every chunk through this server instead of straight to the
    /// bucket (for clients that cannot reach it). By default the server hands each client
    /// presigned URLs, each bound to its chunk's SHA-256, which the bucket checks.
    #[arg(long, requires = "blobs")]
    pub no_direct_uploads: bool,

    /// How long a presigned upload URL works.
    #[arg(long, default_value = "3600", value_parser = parse_seconds, value_name = "SECONDS")]
    pub upload_url_expiry: Duration,

    /// How long a chunk sent straight to the bucket waits for a commit that names it before it is
    /// deleted; longer than --upload-url-expiry.
    #[arg(long, default_value = "86400", value_parser = parse_seconds, value_name = "SECONDS")]
    pub unconfirmed_grace: Duration,

    /// Address to listen on; anything but loopback needs --token.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on; 0 picks a free one.
    #[arg(long, default_value_t = 8765)]
    pub port: u16,

    /// Another name this server is reached by (a reverse proxy's, a host name that points
    /// here), as browsers send it in the Host header; repeat for several. On loopback the
    /// server answers only loopback names and these (a page of another site cannot reach it
    /// through a name it made point here); on another address, any name unless some are given.
    #[arg(long = "allowed-host", value_name = "NAME", value_parser = parse_host_name)]
    pub allowed_host: Vec<String>,

    /// Token every request must carry (Authorization: Bearer TOKEN) [env: RELAUNCH_SERVER_TOKEN].
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,

    /// Largest request body accepted; larger ones get 413 with this limit in the message.
    #[arg(long, default_value = "64MiB", value_parser = parse_size, value_name = "SIZE")]
    pub max_request_bytes: usize,

    /// Memory that request bodies being received may hold together (beyond 64 KiB each); past
    /// it a request is answered 503 with Retry-After, which clients retry. At least
    /// --max-request-bytes.
    #[arg(long, default_value = "1GiB", value_parser = parse_size, value_name = "SIZE")]
    pub max_body_memory: usize,

    /// Memory that answers of heavy reads (series, histories, log pages, run listings) not yet
    /// read by their clients may hold together; past it a read waits up to 5 s for room, then is
    /// answered 503 with Retry-After.
    #[arg(long, default_value = "1GiB", value_parser = parse_size, value_name = "SIZE")]
    pub max_response_memory: usize,

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

    /// Connections open at once; at the cap an idle one is closed to make room, and with none
    /// idle a new one is answered 503 (lowered to fit the open-file limit).
    #[arg(long, default_value_t = relaunch_server::DEFAULT_MAX_CONNECTIONS, value_name = "N")]
    pub max_connections: usize,

    /// Database reads at once; heavy ones (series, log pages, listings) take at most N-1 of them
    /// and more wait their turn without holding a thread, and writes never wait for reads.
    #[arg(long, default_value_t = relaunch_server::storage::sqlite::DEFAULT_MAX_READERS, value_name = "N")]
    pub max_readers: usize,

    /// Post alerts to this URL (repeatable): runs that fail, hang, are preempted or finish,
    /// stragglers, run.alert() calls, and --alert rules. Slack's shape ({"text": ...}) for
    /// hooks.slack.com or slack=URL, the alert's fields as JSON otherwise (or json=URL).
    #[arg(long, value_parser = check_webhook, value_name = "[slack=|json=]URL")]
    pub webhook: Vec<String>,

    /// Alert when a metric crosses a rule (repeatable), once per run and attempt: "loss is
    /// nan", "loss is inf", "loss is not finite", or "KEY OP NUMBER" with OP one of > >= < <=
    /// == != (e.g. "loss > 10"). Needs --webhook.
    #[arg(long, value_parser = check_rule, value_name = "RULE")]
    pub alert: Vec<String>,
}

fn check_webhook(given: &str) -> Result<String, String> {
    given
        .parse::<relaunch_server::alerts::Webhook>()
        .map(|_| given.to_owned())
}

fn check_rule(given: &str) -> Result<String, String> {
    given
        .parse::<relaunch_server::alerts::Rule>()
        .map(|_| given.to_owned())
}

/// A host name or address for --allowed-host: no scheme, port or path.
fn parse_host_name(given: &str) -> Result<String, String> {
    let name = given.trim();
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    let ok = !bare.is_empty()
        && bare
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'))
        && (bare.contains(':') == bare.parse::<std::net::Ipv6Addr>().is_ok());
    if ok {
        Ok(bare.to_owned())
    } else {
        Err(format!(
            "{given:?} is not a host name: give the name alone, as in --allowed-host \
             relaunch.example.com (no scheme, port or path)"
        ))
    }
}

impl Default for ServerArgs {
    fn default() -> Self {
        Self {
            command: None,
            data_dir: "relaunch-data".into(),
            database: None,
            blobs: None,
            s3_endpoint: None,
            no_direct_uploads: false,
            upload_url_expiry: Duration::from_secs(3600),
            unconfirmed_grace: Duration::from_secs(86400),
            host: "127.0.0.1".into(),
            port: 8765,
            allowed_host: Vec::new(),
            token: None,
            max_request_bytes: relaunch_server::DEFAULT_MAX_REQUEST_BYTES,
            max_body_memory: relaunch_server::DEFAULT_MAX_BODY_MEMORY,
            max_response_memory: relaunch_server::DEFAULT_MAX_RESPONSE_MEMORY,
            durability: DurabilityArg::Fsync,
            header_timeout: relaunch_server::DEFAULT_HEADER_TIMEOUT,
            idle_timeout: relaunch_server::DEFAULT_IDLE_TIMEOUT,
            max_connections: relaunch_server::DEFAULT_MAX_CONNECTIONS,
            max_readers: relaunch_server::storage::sqlite::DEFAULT_MAX_READERS,
            webhook: Vec::new(),
            alert: Vec::new(),
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

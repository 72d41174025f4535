//! `relaunch files` and `relaunch ckpt`: a run's files and checkpoints.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::{ListFormat, ServerConnection, parse_seconds};

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

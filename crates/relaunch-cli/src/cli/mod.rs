//! The command line's shape: clap derive structs, one module per command
//! (as `commands/`), with defaults that tests can build directly.

mod doctor;
mod files;
mod reads;
mod run;
mod server;
mod store;

use std::time::Duration;

use clap::{Parser, Subcommand};

pub use doctor::DoctorArgs;
pub(crate) use doctor::DoctorFormat;
pub(crate) use files::FilesSyncArgs;
pub use files::{CkptCommand, CkptPullArgs, FilesCommand, FilesGetArgs, FilesLsArgs, FilesPutArgs};
pub use reads::{
    ExportArgs, LogsArgs, MetricsArgs, RunsCommand, RunsLsArgs, RunsShowArgs, ServerConnection,
    SyncArgs,
};
pub(crate) use reads::{ExportFormat, ListFormat, MetricsFormat, ShowFormat};
pub use run::RunArgs;
pub(crate) use run::{RdzvBackend, WarmRestarts, WorkerTtyChoice};
pub(crate) use server::{DurabilityArg, MigrateArgs};
pub use server::{ServerArgs, ServerCommand};
pub use store::{ServeArgs, StoreCommand};

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
    /// Print every point of some runs' metrics as CSV (unsampled, exact).
    Export(ExportArgs),
    /// Ship runs logged offline, or left behind by processes that died, to a tracking server.
    Sync(SyncArgs),
    /// A run's files on a tracking server: list, upload, download.
    #[command(subcommand)]
    Files(FilesCommand),
    /// Checkpoints a job shipped to a tracking server.
    #[command(subcommand)]
    Ckpt(CkptCommand),
}

/// `--param PATH=VALUE`, checked for its shape before anything is sent.
pub(crate) fn parse_param(text: &str) -> Result<String, String> {
    match text.find(['=', '<', '>', '!']) {
        Some(at) if !text[..at].trim().is_empty() => Ok(text.to_owned()),
        _ => Err(format!(
            "{text:?} is not PATH=VALUE; name a dotted config path and its value, e.g. \
             optim.lr=0.001 (or compare: layers>4)"
        )),
    }
}

/// `--metric KEY<OP>NUMBER`: a comparison with a number; the server checks
/// the rest.
pub(crate) fn parse_metric(text: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "{text:?} is not KEY OP NUMBER; name a metric, one of = != < <= > >= and a number, \
             e.g. 'loss<0.5'"
        )
    };
    let at = text.find(['=', '<', '>', '!']).ok_or_else(bad)?;
    let value = text[at..].trim_start_matches(['=', '<', '>', '!']).trim();
    if text[..at].trim().is_empty() || value.parse::<f64>().is_err() {
        return Err(bad());
    }
    Ok(text.to_owned())
}

pub(crate) fn parse_seconds(text: &str) -> Result<Duration, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("{text:?} is not a number of seconds >= 0, e.g. 30 or 2.5"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaunch_launch::config::NProc;

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
        let (script, script_args) = args.script_and_args();
        assert_eq!(script, "train.py");
        assert_eq!(script_args, ["--lr", "0.1", "--nproc-per-node", "9"]);
    }

    /// Regression: a script argument right after the script that matched
    /// one of relaunch's flags (`train.py --log_dir ./tb`) was taken by
    /// relaunch. Every flag of `relaunch run`, and the global ones, in every
    /// spelling (long, torchrun's underscores, short, `=value`), is the
    /// script's once it follows the script.
    #[test]
    fn every_word_after_the_script_is_the_scripts() {
        use clap::CommandFactory;
        let run = Cli::command();
        let run = run
            .find_subcommand("run")
            .expect("relaunch has a run command");
        let mut spellings: Vec<String> = vec!["--help".into(), "-h".into(), "--log".into()];
        for arg in run.get_arguments() {
            for long in arg.get_long_and_visible_aliases().into_iter().flatten() {
                spellings.push(format!("--{long}"));
                spellings.push(format!("--{long}=1"));
            }
            for short in arg.get_short_and_visible_aliases().into_iter().flatten() {
                spellings.push(format!("-{short}"));
                spellings.push(format!("-{short}1"));
            }
        }
        assert!(spellings.len() > 80, "{spellings:?}");
        let defaults = |argv: &[&str]| {
            let Command::Run(mut args) = Cli::try_parse_from(argv).unwrap().command else {
                panic!("{argv:?} is not a run");
            };
            args.command.clear();
            format!("{args:?}")
        };
        let plain = defaults(&["relaunch", "run", "train.py"]);
        for word in &spellings {
            let argv = [
                "relaunch",
                "run",
                "train.py",
                word.as_str(),
                "x",
                "--",
                "-m",
            ];
            let cli = Cli::try_parse_from(argv)
                .unwrap_or_else(|e| panic!("{argv:?} failed to parse: {e}"));
            let Command::Run(args) = cli.command else {
                panic!("{argv:?} parsed as {:?}", cli.command);
            };
            let (script, script_args) = args.script_and_args();
            assert_eq!(script, "train.py", "{argv:?}");
            assert_eq!(script_args, [word.as_str(), "x", "--", "-m"], "{argv:?}");
            assert_eq!(
                defaults(&argv),
                plain,
                "{argv:?} set one of relaunch's options"
            );
        }
        // Before the script they are still relaunch's, and `--` ends them.
        let cli = Cli::try_parse_from(["relaunch", "run", "-m", "--", "-pkg", "--lr"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert!(args.module);
        assert_eq!(args.script_and_args().0, "-pkg");
    }
}

//! The `relaunch` command line as a library: [`run`] parses arguments, sets up
//! logging and dispatches to one module per subcommand. The binary calls it
//! (`python -m relaunch` execs the binary).

mod cli;
mod commands;
mod completion;
mod output;
mod render;
mod size;
mod tracking;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

pub use cli::{
    CkptCommand, CkptPullArgs, Cli, Command, DoctorArgs, ExportArgs, FilesCommand, FilesGetArgs,
    FilesLsArgs, FilesPutArgs, LogsArgs, MetricsArgs, RunArgs, RunsCommand, RunsLsArgs,
    RunsShowArgs, ServeArgs, ServerArgs, ServerCommand, ServerConnection, StoreCommand, SyncArgs,
};

/// The interpreter that ran `python -m relaunch`, which hands it to the
/// native command it execs ([`Context::python`]).
pub const PYTHON_ENV: &str = "RELAUNCH_PYTHON";

/// What the caller knows that the command line does not say.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// The Python interpreter that ran `python -m relaunch` ([`PYTHON_ENV`]):
    /// workers run under it, as under torchrun.
    pub python: Option<OsString>,
}

impl Context {
    /// The interpreter that runs workers and that `doctor` checks:
    /// `PYTHON_EXEC`, else the one `relaunch` runs in (`python -m
    /// relaunch`), else the one installed beside this executable (the
    /// wheel puts the native command in the interpreter's `bin/`, as it
    /// would a console script, so a virtual environment's command runs its
    /// own Python, activated or not), else `python3` or `python` on `PATH`.
    pub fn python(&self) -> OsString {
        if let Some(python) = std::env::var_os("PYTHON_EXEC").or_else(|| self.python.clone()) {
            return python;
        }
        let beside = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(std::path::Path::to_path_buf));
        let named = |dir: &std::path::Path| {
            ["python3", "python"]
                .into_iter()
                .map(|name| dir.join(name))
                .find(|p| p.is_file())
        };
        if let Some(python) = beside.as_deref().and_then(named) {
            return python.into_os_string();
        }
        let on_path = std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| dir.join("python3").is_file())
        });
        (if on_path { "python3" } else { "python" }).into()
    }
}

/// Runs the command line `args` (program name first); see [`run_to_code`].
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    ExitCode::from(run_to_code(args, &Context::default()))
}

/// Runs the command line `args` (program name first) and returns the process
/// exit code: 0 on success, 1 when the command failed, 2 on bad arguments;
/// `relaunch run` returns the launch's own codes (see its `--help`).
pub fn run_to_code<I, T>(args: I, context: &Context) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let parsed = Cli::command()
        .try_get_matches_from(args)
        .and_then(|matches| Ok((Cli::from_arg_matches(&matches)?, matches)));
    let mut cli = match parsed {
        Ok((mut cli, matches)) => {
            order_filters(&mut cli, &matches);
            cli
        }
        Err(e) => {
            // Prints help and --version to stdout, errors to stderr.
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let cli = &mut cli;
    init_logging(&cli.log);
    match execute(&cli.command, context) {
        Ok(code) => code,
        Err(e) if e.is::<commands::run::UsageError>() => {
            output::error(&e);
            2
        }
        Err(e) => {
            output::error(&e);
            1
        }
    }
}

/// `relaunch files sync`'s --include and --exclude, merged in the order
/// they were given (rsync's rules depend on it; clap keeps each list apart).
fn order_filters(cli: &mut Cli, matches: &clap::ArgMatches) {
    let Command::Files(FilesCommand::Sync(args)) = &mut cli.command else {
        return;
    };
    let Some(("files", files)) = matches.subcommand() else {
        return;
    };
    let Some(("sync", sync)) = files.subcommand() else {
        return;
    };
    let mut rules: Vec<(usize, bool, String)> = Vec::new();
    for (id, include, values) in [
        ("include", true, &args.include),
        ("exclude", false, &args.exclude),
    ] {
        if let Some(indices) = sync.indices_of(id) {
            rules.extend(indices.zip(values).map(|(i, v)| (i, include, v.clone())));
        }
    }
    rules.sort_by_key(|(i, _, _)| *i);
    args.rules = rules
        .into_iter()
        .map(|(_, include, v)| (include, v))
        .collect();
}

fn execute(command: &Command, context: &Context) -> anyhow::Result<u8> {
    match command {
        Command::Run(args) => commands::run::run(args, context),
        Command::Doctor(args) => commands::doctor::run(args, context),
        Command::Server(args) => match &args.command {
            Some(ServerCommand::Migrate(migrate)) => commands::migrate::run(migrate),
            None => commands::server::run(args),
        },
        Command::Store(StoreCommand::Serve(args)) => commands::store::serve(args).map(|()| 0),
        Command::Runs(RunsCommand::Ls(args)) => commands::runs::ls(args),
        Command::Runs(RunsCommand::Show(args)) => commands::runs::show(args),
        Command::Logs(args) => commands::logs::run(args),
        Command::Metrics(args) => commands::metrics::run(args),
        Command::Export(args) => commands::export::run(args),
        Command::Sync(args) => commands::sync::run(args),
        Command::Files(FilesCommand::Ls(args)) => commands::files::ls(args),
        Command::Files(FilesCommand::Put(args)) => commands::files::put(args),
        Command::Files(FilesCommand::Get(args)) => commands::files::get(args),
        Command::Files(FilesCommand::Sync(args)) => commands::files::sync(args),
        Command::Ckpt(CkptCommand::Pull(args)) => commands::files::pull(args),
    }
}

fn init_logging(filter: &str) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|e| {
        output::status(&format!("warning: ignoring log filter {filter:?}: {e}"));
        EnvFilter::new("info")
    });
    // A second call (the Python package runs several commands in one
    // process) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

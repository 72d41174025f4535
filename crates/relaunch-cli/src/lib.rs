//! The `relaunch` command line as a library: [`run`] parses arguments, sets up
//! logging and dispatches to one module per subcommand. The binary and the
//! Python package's `relaunch` script both call it.

mod cli;
mod commands;
mod output;
mod size;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

pub use cli::{Cli, Command, ServeArgs, StoreCommand};

/// Runs the command line `args` (program name first); see [`run_to_code`].
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    ExitCode::from(run_to_code(args))
}

/// Runs the command line `args` (program name first) and returns the process
/// exit code: 0 on success, 1 when the command failed, 2 on bad arguments.
pub fn run_to_code<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // Prints help and --version to stdout, errors to stderr.
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    init_logging(&cli.log);
    match execute(&cli.command) {
        Ok(()) => 0,
        Err(e) => {
            output::error(&e);
            1
        }
    }
}

fn execute(command: &Command) -> anyhow::Result<()> {
    match command {
        Command::Store(StoreCommand::Serve(args)) => commands::store::serve(args),
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

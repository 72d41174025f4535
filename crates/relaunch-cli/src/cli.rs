//! The command line's shape: clap derive structs, with defaults that tests
//! can build directly.

use clap::{Args, Parser, Subcommand};

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
    /// The rendezvous store: a key-value server that PyTorch's TCPStore clients use unmodified.
    #[command(subcommand)]
    Store(StoreCommand),
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
        let Command::Store(StoreCommand::Serve(args)) = cli.command;
        assert_eq!(args, ServeArgs::default());
    }
}

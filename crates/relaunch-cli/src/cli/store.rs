//! `relaunch store serve`.

use clap::{Args, Subcommand};

use crate::size::parse_size;

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

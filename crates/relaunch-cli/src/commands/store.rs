//! `relaunch store serve`: a TCPStore-compatible server.

use anyhow::{Context, bail};
use relaunch_store::{Limits, ServerOptions, StoreServer};

use crate::cli::ServeArgs;
use crate::output;

/// Bytes of a SET request around its key and value: command, two lengths.
const SET_OVERHEAD: usize = 1 + 8 + 8;

pub(crate) fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let options = server_options(args)?;
    // The server runs on threads of its own; this runtime only binds and
    // waits for a signal.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        // Handlers first: a SIGTERM right after `listening on` must stop the
        // server cleanly, not kill it.
        let shutdown = super::stop_signal(Some("stopping"))?;
        let server = StoreServer::bind(&options).await?;
        for addr in server.local_addrs() {
            output::status(&format!("listening on {addr}"));
        }
        server.serve_until(shutdown).await?;
        Ok(())
    })
}

fn server_options(args: &ServeArgs) -> anyhow::Result<ServerOptions> {
    let limits = Limits {
        max_key_bytes: args.max_key_bytes,
        max_value_bytes: args.max_value_bytes,
        max_keys: args.max_keys,
        max_frame_bytes: args.max_frame_bytes,
    };
    let smallest_frame = limits.max_key_bytes + limits.max_value_bytes + SET_OVERHEAD;
    if limits.max_frame_bytes < smallest_frame {
        bail!(
            "--max-frame-bytes {} is below --max-key-bytes + --max-value-bytes + {SET_OVERHEAD} = {smallest_frame}, \
             so a SET of the largest key and value would be refused; raise --max-frame-bytes",
            limits.max_frame_bytes
        );
    }
    Ok(ServerOptions {
        host: args.host.clone(),
        port: args.port,
        limits,
        threads: args.threads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_limit_below_the_largest_set_is_refused() {
        let args = ServeArgs {
            max_frame_bytes: 1024,
            ..ServeArgs::default()
        };
        let err = server_options(&args).unwrap_err().to_string();
        assert!(err.contains("raise --max-frame-bytes"), "{err}");
    }
}

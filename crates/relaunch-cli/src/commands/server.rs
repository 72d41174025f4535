//! `relaunch server`: the tracking server on the embedded storage.

use std::sync::Arc;

use anyhow::{Context as _, bail};
use relaunch_server::storage::sqlite::{Durability, SqliteStorage};
use relaunch_server::{AppState, FileStore, TOKEN_ENV, check_exposure};

use crate::cli::{DurabilityArg, ServerArgs};
use crate::output;

pub(crate) fn run(args: &ServerArgs) -> anyhow::Result<u8> {
    let token = args
        .token
        .clone()
        .or_else(|| std::env::var(TOKEN_ENV).ok())
        .filter(|t| !t.is_empty());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("relaunch-server")
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let shutdown = super::stop_signal(Some("stopping: finishing the requests in flight"))?;
        // Refuse an exposed address without a token before listening on it.
        let wanted = tokio::net::lookup_host((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot resolve --host {}", args.host))?
            .next()
            .with_context(|| format!("--host {} resolves to no address", args.host))?;
        if let Err(message) = check_exposure(wanted, token.as_deref()) {
            bail!("{message}");
        }
        let listener = tokio::net::TcpListener::bind(wanted)
            .await
            .with_context(|| format!("cannot listen on {wanted}"))?;
        let addr = listener
            .local_addr()
            .context("cannot read the listening address")?;
        let durability = match args.durability {
            DurabilityArg::Fsync => Durability::Fsync,
            DurabilityArg::Process => Durability::Process,
        };
        let storage = Arc::new(
            SqliteStorage::open(&args.data_dir, durability).with_context(|| {
                format!("cannot open the data directory {}", args.data_dir.display())
            })?,
        );
        let files = FileStore::open_dir(&args.data_dir, durability).with_context(|| {
            format!("cannot open the file store in {}", args.data_dir.display())
        })?;
        let state = AppState::new(storage.clone(), files, token, args.max_request_bytes);
        output::status(&format!(
            "relaunch server: http://{addr} (data in {})",
            args.data_dir.display()
        ));
        relaunch_server::serve(listener, state, shutdown)
            .await
            .context("the server failed")?;
        // Every queued write commits before the process ends.
        storage.close();
        tracing::info!("stopped");
        Ok(0)
    })
}

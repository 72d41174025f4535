//! One module per subcommand.

pub(crate) mod doctor;
pub(crate) mod export;
pub(crate) mod files;
pub(crate) mod logs;
pub(crate) mod metrics;
pub(crate) mod migrate;
pub(crate) mod run;
pub(crate) mod runs;
pub(crate) mod server;
pub(crate) mod store;
pub(crate) mod sync;

use anyhow::Context as _;

/// Completes on the first SIGTERM or SIGINT, logging `announce` with the
/// signal's name when given; the handlers are installed now, so a signal
/// that comes before the future is polled is not lost.
pub(crate) fn stop_signal(
    announce: Option<&'static str>,
) -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        if let Some(announce) = announce {
            tracing::info!(signal = name, "{announce}");
        }
    })
}

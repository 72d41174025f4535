//! The signals the launcher handles (`--signals-to-handle`), as one stream.

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::error::LaunchError;

/// Receives the handled signals in the order they arrive.
#[derive(Debug)]
pub(crate) struct Signals {
    rx: mpsc::UnboundedReceiver<Signal>,
}

impl Signals {
    /// Installs handlers for `signals` now, so none is missed while the
    /// launcher starts.
    pub(crate) fn install(signals: &[Signal]) -> Result<Self, LaunchError> {
        let (tx, rx) = mpsc::unbounded_channel();
        for &sig in signals {
            let mut stream = signal(SignalKind::from_raw(sig as i32))
                .map_err(|e| LaunchError::io(format!("cannot handle {sig}"), e))?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    if tx.send(sig).is_err() {
                        return;
                    }
                }
            });
        }
        Ok(Self { rx })
    }

    /// The next handled signal.
    pub(crate) async fn recv(&mut self) -> Signal {
        match self.rx.recv().await {
            Some(sig) => sig,
            // The senders live as long as the runtime: never reached.
            None => std::future::pending().await,
        }
    }
}

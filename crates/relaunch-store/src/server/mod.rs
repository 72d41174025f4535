//! The TCPStore server: listeners, connection tasks and clean shutdown.

mod conn;
mod listen;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::StoreError;
use crate::state::{ConnId, KvState};
use crate::wire::Limits;
use conn::ConnSignal;

/// How long shutdown waits for connection tasks to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Pause after the process runs out of descriptors, before accepting again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Where and how a server listens.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// Address or name to listen on; `None` means every interface, IPv6 and
    /// IPv4, as PyTorch's server does.
    pub host: Option<String>,
    /// Port to listen on; 0 picks a free one.
    pub port: u16,
    pub limits: Limits,
}

/// A snapshot of a server's load, for logs and leak checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub connections: usize,
    pub keys: usize,
    pub pending_waits: usize,
    pub watched_keys: usize,
}

pub(crate) struct Shared {
    state: Mutex<KvState<ConnSignal>>,
    limits: Limits,
    next_conn: AtomicU64,
    connections: AtomicUsize,
}

impl Shared {
    fn open_connection(&self) -> ConnId {
        self.connections.fetch_add(1, Ordering::Relaxed);
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    fn close_connection(&self, conn: ConnId) {
        self.state.lock().cancel_wait(conn);
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }

    fn stats(&self) -> StoreStats {
        let state = self.state.lock();
        StoreStats {
            connections: self.connections.load(Ordering::Relaxed),
            keys: state.num_keys(),
            pending_waits: state.pending_waits(),
            watched_keys: state.watched_keys(),
        }
    }
}

/// A bound server, not yet accepting.
pub struct StoreServer {
    listeners: Vec<TcpListener>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreServer")
            .field("addrs", &self.local_addrs())
            .finish_non_exhaustive()
    }
}

impl StoreServer {
    /// Binds the listeners. Also raises the process's open-file limit.
    pub async fn bind(options: &ServerOptions) -> Result<Self, StoreError> {
        if let Some(limit) = listen::raise_open_file_limit() {
            tracing::debug!(limit, "open-file limit");
        }
        let listeners = listen::bind(options.host.as_deref(), options.port).await?;
        Ok(Self {
            listeners,
            shared: Arc::new(Shared {
                state: Mutex::new(KvState::new()),
                limits: options.limits.clone(),
                next_conn: AtomicU64::new(1),
                connections: AtomicUsize::new(0),
            }),
        })
    }

    /// The addresses the server listens on.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// The port the server listens on (the same on every address).
    pub fn port(&self) -> u16 {
        self.local_addrs().first().map_or(0, SocketAddr::port)
    }

    /// Serves until `shutdown` completes, then closes every connection.
    pub async fn serve_until(self, shutdown: impl Future<Output = ()>) {
        let token = CancellationToken::new();
        let tracker = TaskTracker::new();
        for listener in self.listeners {
            tracker.spawn(accept_loop(
                listener,
                self.shared.clone(),
                token.clone(),
                tracker.clone(),
            ));
        }
        shutdown.await;
        let stats = self.shared.stats();
        tracing::info!(
            connections = stats.connections,
            keys = stats.keys,
            pending_waits = stats.pending_waits,
            "store shutting down"
        );
        token.cancel();
        tracker.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("connections still open after {SHUTDOWN_GRACE:?}; leaving them");
        }
    }

    /// Serves in a background task of the current runtime.
    pub fn spawn(self) -> RunningServer {
        let addrs = self.local_addrs();
        let shared = self.shared.clone();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(self.serve_until(async move { stopped.cancelled().await }));
        RunningServer {
            addrs,
            shared,
            stop,
            task,
        }
    }
}

/// A server serving in the background; dropping it stops the server.
pub struct RunningServer {
    addrs: Vec<SocketAddr>,
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for RunningServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningServer")
            .field("addrs", &self.addrs)
            .finish_non_exhaustive()
    }
}

impl RunningServer {
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    pub fn port(&self) -> u16 {
        self.addrs.first().map_or(0, SocketAddr::port)
    }

    pub fn stats(&self) -> StoreStats {
        self.shared.stats()
    }

    /// Closes every connection and waits for the server to stop.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        let _ = (&mut self.task).await;
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    token: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            () = token.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
                }
                tracker.spawn(conn::serve(stream, peer, shared.clone(), token.clone()));
            }
            Err(e) if is_resource_exhaustion(&e) => {
                // The pending connection stays queued; accept again once some
                // descriptors are free instead of spinning.
                tracing::warn!(
                    error = %e,
                    connections = shared.connections.load(Ordering::Relaxed),
                    "cannot accept more connections; raise the open-file limit (ulimit -n)"
                );
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
            Err(e) => tracing::debug!(error = %e, "accept failed"),
        }
    }
}

fn is_resource_exhaustion(e: &std::io::Error) -> bool {
    // EMFILE, ENFILE, ENOBUFS, ENOMEM on Linux.
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12))
}

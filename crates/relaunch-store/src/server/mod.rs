//! The TCPStore server: listeners, shards of connections, clean shutdown.
//!
//! Connections are spread over shards, one thread each with a
//! single-threaded runtime (thread per core): a request is read, applied and
//! answered on one thread with no hand-off, and shards run in parallel. They
//! share the store's state behind one lock, held per batch of requests.
//! Shard 0 also accepts connections and deals them out in turn.

mod conn;
mod listen;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::StoreError;
use crate::state::{ConnId, KvState};
use crate::wire::Limits;
use conn::ConnSignal;

/// Default shard count on big machines: every request is applied under the
/// one state lock, so shards beyond this add lock traffic, not throughput.
const MAX_DEFAULT_THREADS: usize = 16;

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
    /// Threads serving connections; 0 means one per CPU, at most 16.
    pub threads: usize,
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
    listeners: Vec<std::net::TcpListener>,
    shared: Arc<Shared>,
    threads: usize,
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreServer")
            .field("addrs", &self.local_addrs())
            .field("threads", &self.threads)
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
        let threads = match options.threads {
            0 => std::thread::available_parallelism()
                .map_or(1, usize::from)
                .min(MAX_DEFAULT_THREADS),
            n => n,
        };
        Ok(Self {
            listeners,
            shared: Arc::new(Shared {
                state: Mutex::new(KvState::new()),
                limits: options.limits.clone(),
                next_conn: AtomicU64::new(1),
                connections: AtomicUsize::new(0),
            }),
            threads,
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
    pub async fn serve_until(self, shutdown: impl Future<Output = ()>) -> Result<(), StoreError> {
        let running = self.spawn()?;
        shutdown.await;
        let stats = running.stats();
        tracing::info!(
            connections = stats.connections,
            keys = stats.keys,
            pending_waits = stats.pending_waits,
            "store shutting down"
        );
        running.shutdown().await;
        Ok(())
    }

    /// Starts serving on threads of its own; does not need a runtime.
    pub fn spawn(self) -> Result<RunningServer, StoreError> {
        let addrs = self.local_addrs();
        let stop = CancellationToken::new();
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..self.threads).map(|_| mpsc::unbounded_channel()).unzip();
        let mut listeners = Some(self.listeners);
        let mut done = Vec::with_capacity(self.threads);
        for (index, connections) in receivers.into_iter().enumerate() {
            let shard = Shard {
                index,
                shared: self.shared.clone(),
                stop: stop.clone(),
                connections,
                acceptor: match index {
                    0 => listeners.take().map(|l| (l, senders.clone())),
                    _ => None,
                },
            };
            let (finished, finished_rx) = oneshot::channel();
            std::thread::Builder::new()
                .name(format!("relaunch-store-{index}"))
                .spawn(move || {
                    shard.run();
                    let _ = finished.send(());
                })
                .map_err(StoreError::Start)?;
            done.push(finished_rx);
        }
        Ok(RunningServer {
            addrs,
            shared: self.shared,
            stop,
            done,
        })
    }
}

/// A server serving on its own threads; dropping it stops the server.
pub struct RunningServer {
    addrs: Vec<SocketAddr>,
    shared: Arc<Shared>,
    stop: CancellationToken,
    done: Vec<oneshot::Receiver<()>>,
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

    /// Deletes every key (and queue) for which `keep` is false; returns how
    /// many went. For a host that reuses one store across jobs or attempts.
    pub fn retain_keys(&self, keep: impl FnMut(&[u8]) -> bool) -> usize {
        self.shared.state.lock().retain_keys(keep)
    }

    /// Stops accepting, closes every connection, and waits until the
    /// server's threads are done.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        for done in self.done.drain(..) {
            let _ = done.await;
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// An accepted connection on its way to a shard.
type Incoming = (std::net::TcpStream, SocketAddr);

/// One serving thread and the connections dealt to it.
struct Shard {
    index: usize,
    shared: Arc<Shared>,
    stop: CancellationToken,
    connections: mpsc::UnboundedReceiver<Incoming>,
    /// Shard 0 accepts for everyone.
    acceptor: Option<(
        Vec<std::net::TcpListener>,
        Vec<mpsc::UnboundedSender<Incoming>>,
    )>,
}

impl Shard {
    fn run(mut self) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                tracing::error!(shard = self.index, error = %e, "cannot start a store thread");
                return;
            }
        };
        runtime.block_on(async {
            if let Some((listeners, senders)) = self.acceptor.take() {
                let dealer = Arc::new(Dealer {
                    shared: self.shared.clone(),
                    shards: senders,
                    next: AtomicUsize::new(0),
                });
                for listener in listeners {
                    match TcpListener::from_std(listener) {
                        Ok(listener) => {
                            tokio::spawn(accept_loop(listener, dealer.clone(), self.stop.clone()));
                        }
                        Err(e) => tracing::error!(error = %e, "cannot watch a listening socket"),
                    }
                }
            }
            loop {
                let (stream, peer) = tokio::select! {
                    () = self.stop.cancelled() => break,
                    Some(incoming) = self.connections.recv() => incoming,
                };
                match TcpStream::from_std(stream) {
                    Ok(stream) => {
                        drop(tokio::spawn(conn::serve(stream, peer, self.shared.clone())))
                    }
                    Err(e) => tracing::warn!(%peer, error = %e, "cannot serve a connection"),
                }
            }
        });
        // Dropping the runtime drops every connection task of this shard,
        // which closes its socket and forgets its waits.
        drop(runtime);
    }
}

/// Deals accepted connections to the shards in turn. Lives on shard 0.
struct Dealer {
    shared: Arc<Shared>,
    shards: Vec<mpsc::UnboundedSender<Incoming>>,
    next: AtomicUsize,
}

impl Dealer {
    fn deal(&self, stream: TcpStream, peer: SocketAddr) {
        let shard = self.next.fetch_add(1, Ordering::Relaxed) % self.shards.len();
        if shard == 0 {
            tokio::spawn(conn::serve(stream, peer, self.shared.clone()));
            return;
        }
        // Another shard's runtime must own the socket's registration.
        match stream.into_std() {
            Ok(stream) => {
                let _ = self.shards[shard].send((stream, peer));
            }
            Err(e) => tracing::warn!(%peer, error = %e, "cannot hand a connection over"),
        }
    }
}

async fn accept_loop(listener: TcpListener, dealer: Arc<Dealer>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
                }
                dealer.deal(stream, peer);
            }
            Err(e) if is_resource_exhaustion(&e) => {
                // The pending connection stays queued; accept again once some
                // descriptors are free instead of spinning.
                tracing::warn!(
                    error = %e,
                    connections = dealer.shared.connections.load(Ordering::Relaxed),
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

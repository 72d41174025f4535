//! The accept loop of `relaunch server` and the limits on its connections:
//! a cap on how many are open, and a watchdog per connection that closes it
//! when the client stops making progress (nginx's model: a header timeout
//! from the first byte of a request head, an idle timeout between requests
//! and between two reads of a body). A slow upload that keeps sending is
//! never cut; a client that stalls is. At the cap, an idle connection is
//! closed to make room (the address holding the most first, then the one
//! idle longest), so idle holders cannot lock active clients out.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tower::Service as _;

/// Default `--header-timeout`.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `--idle-timeout`: longer than the 90 s that HTTP clients
/// (reqwest, urllib3's pools) keep an idle connection, so that the client
/// closes first and never sends a request on a connection the server is
/// closing.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Default `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// Connections over the cap that are answered 503 at the same time; more
/// are closed unanswered.
const REFUSALS_AT_ONCE: usize = 64;
/// How long a refused connection may take to send its request head.
const REFUSAL_TIME: Duration = Duration::from_secs(1);
/// How long a connection over the cap waits for the one closed to make
/// room for it to go.
const ROOM_WAIT: Duration = Duration::from_secs(1);
/// At most one log line per kind of event per this interval.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The limits on connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// From the first byte of a request to the end of its head.
    pub header_timeout: Duration,
    /// Without a byte from the client while the server waits for one:
    /// between requests, or for more of a request's body; and without a
    /// byte taken by a client that does not read its response.
    pub idle_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then lets every
/// connection finish its request in flight.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
    let reports = Arc::new(Reports::default());
    let open_now = Arc::new(Registry::default());
    let tracker = TaskTracker::new();
    let (stop, stopping) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    reports.accept_failed.hit(|n| {
                        tracing::warn!(error = %e, failures = n, "cannot accept a connection");
                    });
                    // Out of file descriptors (or memory): give the open
                    // connections time to close rather than spin.
                    if !is_per_connection(&e) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let serve = Serve {
            router: router.clone(),
            limits,
            stopping: stopping.clone(),
            reports: reports.clone(),
            open_now: open_now.clone(),
            peer,
        };
        match open.clone().try_acquire_owned() {
            Ok(permit) => {
                tracker.spawn(serve.connection(stream, permit));
            }
            // At the cap, an idle connection makes room: closed, its
            // permit goes to this one (bounded like the refusals below).
            Err(_) if open_now.evict_idle() => {
                if let Ok(waiting) = refusals.clone().try_acquire_owned() {
                    let open = open.clone();
                    tracker.spawn(async move {
                        match tokio::time::timeout(ROOM_WAIT, open.acquire_owned()).await {
                            Ok(Ok(permit)) => {
                                drop(waiting);
                                serve.connection(stream, permit).await;
                            }
                            _ => refuse(stream, limits.max_connections, waiting).await,
                        }
                    });
                }
            }
            Err(_) => {
                reports.refused.hit(|n| {
                    tracing::warn!(
                        refused = n,
                        max_connections = limits.max_connections,
                        "connections refused: the server has --max-connections open; \
                         raise it if these are real clients"
                    );
                });
                // Over the cap the server still answers, and says why: a
                // 503 naming the flag, with Retry-After (the relaunch client
                // retries it). Leaving new connections in the kernel's
                // backlog (HAProxy's maxconn, Go's LimitListener) makes a
                // real client wait behind a flood with no word of why, and
                // closing at once (Envoy's connection limit) looks like a
                // crash. The answer costs a short task: at most
                // REFUSALS_AT_ONCE at a time, each at most REFUSAL_TIME;
                // beyond that a connection is closed unanswered, so a flood
                // never holds more than max_connections + REFUSALS_AT_ONCE
                // sockets.
                if let Ok(permit) = refusals.clone().try_acquire_owned() {
                    tracker.spawn(refuse(stream, limits.max_connections, permit));
                }
            }
        }
    }
    drop(listener);
    drop(stopping);
    stop.send_replace(());
    tracker.close();
    tracker.wait().await;
    Ok(())
}

/// Accept errors that concern one connection only (it was reset before
/// being accepted); any other error is the process's (EMFILE, ENOMEM).
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// What serving one connection needs.
struct Serve {
    router: Router,
    limits: ConnLimits,
    stopping: watch::Receiver<()>,
    reports: Arc<Reports>,
    open_now: Arc<Registry>,
    peer: SocketAddr,
}

impl Serve {
    async fn connection(self, stream: TcpStream, _permit: OwnedSemaphorePermit) {
        let Self {
            router,
            limits,
            mut stopping,
            reports,
            open_now,
            peer,
        } = self;
        let activity = Arc::new(Activity::new());
        let entry = open_now.add(peer.ip(), activity.clone());
        let io = TokioIo::new(Watched {
            inner: stream,
            activity: activity.clone(),
        });
        let on_request = activity.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            on_request.request_started();
            let request = request.map(|body| {
                Body::new(RequestBody {
                    inner: body,
                    activity: on_request.clone(),
                })
            });
            let activity = on_request.clone();
            let response = router.clone().call(request);
            async move {
                let response = response.await?;
                Ok::<_, Infallible>(response.map(|body| {
                    Body::new(ResponseBody {
                        inner: body,
                        activity,
                    })
                }))
            }
        });
        // The watchdog below keeps the time; hyper's own header timeout also
        // counts the idle time before a request, which is --idle-timeout's.
        let connection = http1::Builder::new()
            .header_read_timeout(None)
            .serve_connection(io, service);
        tokio::pin!(connection);
        let mut stop_asked = false;
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    return;
                }
                _ = stopping.changed(), if !stop_asked => {
                    stop_asked = true;
                    connection.as_mut().graceful_shutdown();
                }
                expired = activity.expired(limits) => {
                    reports.report(expired, limits);
                    return;
                }
                () = entry.evicted.notified() => {
                    // A request may have come since it was chosen: then it
                    // stays, and the newcomer waiting for room is refused.
                    if activity.is_idle() {
                        reports.evicted.hit(|n| {
                            tracing::info!(
                                closed = n,
                                max_connections = limits.max_connections,
                                "closed idle connections to make room for new ones at \
                                 --max-connections"
                            );
                        });
                        return;
                    }
                }
            }
        }
    }
}

/// The connections open now, so that one idle can be closed to make room.
#[derive(Default)]
struct Registry {
    inner: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    connections: HashMap<u64, Connection>,
    /// Open connections per client address.
    per_address: HashMap<IpAddr, usize>,
}

struct Connection {
    address: IpAddr,
    activity: Arc<Activity>,
    evicted: Arc<Notify>,
}

/// A connection's place in the [`Registry`], given up when it closes.
struct Entry {
    registry: Arc<Registry>,
    id: u64,
    evicted: Arc<Notify>,
}

impl Registry {
    fn add(self: &Arc<Self>, address: IpAddr, activity: Arc<Activity>) -> Entry {
        let evicted = Arc::new(Notify::new());
        let mut open = self.inner.lock();
        let id = open.next_id;
        open.next_id += 1;
        *open.per_address.entry(address).or_default() += 1;
        open.connections.insert(
            id,
            Connection {
                address,
                activity,
                evicted: evicted.clone(),
            },
        );
        Entry {
            registry: self.clone(),
            id,
            evicted,
        }
    }

    /// Asks one idle connection to close: of the address with the most
    /// connections open (one client, or one flood, cannot take the whole
    /// cap while others wait), the one idle longest. False when none is
    /// idle.
    fn evict_idle(&self) -> bool {
        let open = self.inner.lock();
        let victim = open
            .connections
            .values()
            .filter_map(|c| {
                let idle_since = c.activity.idle_since()?;
                let held = open.per_address.get(&c.address).copied().unwrap_or(0);
                Some((held, std::cmp::Reverse(idle_since), c))
            })
            .max_by_key(|(held, since, _)| (*held, *since))
            .map(|(_, _, c)| c.evicted.clone());
        match victim {
            Some(evicted) => {
                evicted.notify_one();
                true
            }
            None => false,
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut open = self.registry.inner.lock();
        if let Some(gone) = open.connections.remove(&self.id)
            && let Some(held) = open.per_address.get_mut(&gone.address)
        {
            *held -= 1;
            if *held == 0 {
                open.per_address.remove(&gone.address);
            }
        }
    }
}

/// Answers one connection over the cap with a 503 and closes it.
async fn refuse(stream: TcpStream, max_connections: usize, _permit: OwnedSemaphorePermit) {
    let body = serde_json::json!({
        "error": format!(
            "the server has {max_connections} connections open, its limit; retry later, \
             or restart the server with a larger --max-connections"
        )
    })
    .to_string();
    let service = service_fn(move |_: Request<Incoming>| {
        let mut response = Response::new(Body::from(body.clone()));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        std::future::ready(Ok::<_, Infallible>(response))
    });
    let connection = http1::Builder::new()
        .keep_alive(false)
        .header_read_timeout(None)
        .serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(REFUSAL_TIME, connection).await;
}

/// Why the watchdog closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expired {
    /// A request head took longer than --header-timeout.
    Header,
    /// No request for --idle-timeout.
    Idle,
    /// A request's body, or the client's reading of a response, stopped
    /// for --idle-timeout.
    Stalled,
}

/// What one connection is doing, as its I/O and its requests report it.
struct Activity {
    state: Mutex<State>,
}

struct State {
    /// Requests whose response has not been sent whole.
    in_flight: u32,
    /// When the first byte of a request head not yet parsed came.
    head_started: Option<Instant>,
    /// A handler waits for more of the request body.
    body_waiting: bool,
    /// The socket's send buffer is full: the client is not reading.
    write_blocked: bool,
    /// The last time a byte went either way, or a response was finished.
    last_progress: Instant,
}

impl Activity {
    fn new() -> Self {
        Self {
            state: Mutex::new(State {
                in_flight: 0,
                head_started: None,
                body_waiting: false,
                write_blocked: false,
                last_progress: Instant::now(),
            }),
        }
    }

    fn request_started(&self) {
        let mut state = self.state.lock();
        state.in_flight += 1;
        state.head_started = None;
    }

    fn response_finished(&self) {
        let mut state = self.state.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        state.last_progress = Instant::now();
    }

    fn read(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let now = Instant::now();
        let mut state = self.state.lock();
        state.last_progress = now;
        if state.in_flight == 0 && state.head_started.is_none() {
            state.head_started = Some(now);
        }
    }

    fn wrote(&self, blocked: bool) {
        let mut state = self.state.lock();
        state.write_blocked = blocked;
        if !blocked {
            state.last_progress = Instant::now();
        }
    }

    fn body_waiting(&self, waiting: bool) {
        self.state.lock().body_waiting = waiting;
    }

    /// Since when the connection has waited for a request, with none in
    /// flight and no byte of the next one; `None` when it is not idle.
    fn idle_since(&self) -> Option<Instant> {
        let state = self.state.lock();
        (state.in_flight == 0 && state.head_started.is_none()).then_some(state.last_progress)
    }

    fn is_idle(&self) -> bool {
        self.idle_since().is_some()
    }

    /// When the connection must be closed if nothing changes, and why.
    fn deadline(&self, limits: ConnLimits) -> Option<(Instant, Expired)> {
        let state = self.state.lock();
        if state.in_flight == 0 {
            Some(match state.head_started {
                Some(started) => (started + limits.header_timeout, Expired::Header),
                None => (state.last_progress + limits.idle_timeout, Expired::Idle),
            })
        } else if state.body_waiting || state.write_blocked {
            Some((state.last_progress + limits.idle_timeout, Expired::Stalled))
        } else {
            // A handler is working (or waiting, like a log follow): the
            // server, not the client, is the one to move.
            None
        }
    }

    /// Completes when a deadline passes. Events move deadlines (later, or
    /// earlier: the first byte of a head sets the header timeout's), but
    /// every deadline lies at least the shorter timeout after the event
    /// that set it, so checking that often never misses one.
    async fn expired(&self, limits: ConnLimits) -> Expired {
        let recheck = limits.header_timeout.min(limits.idle_timeout);
        loop {
            let now = Instant::now();
            match self.deadline(limits) {
                Some((at, why)) if at <= now => return why,
                Some((at, _)) => tokio::time::sleep_until(at.min(now + recheck)).await,
                None => tokio::time::sleep(recheck).await,
            }
        }
    }
}

/// The socket, reporting each read and write to the connection's
/// [`Activity`].
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            self.activity.read(buf.filled().len() - before);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.activity.wrote(polled.is_pending());
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.activity.wrote(polled.is_pending());
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body that says when its handler waits for the client.
struct RequestBody {
    inner: Incoming,
    activity: Arc<Activity>,
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        self.activity.body_waiting(polled.is_pending());
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        self.activity.body_waiting(false);
    }
}

/// A response body that says when hyper is done with it (sent whole, or
/// the connection closed).
struct ResponseBody {
    inner: Body,
    activity: Arc<Activity>,
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        self.activity.response_finished();
    }
}

/// Counts of what the limits did, logged at most once per [`LOG_EVERY`]
/// each: a flood of bad clients makes a line every ten seconds, not one
/// per connection.
#[derive(Default)]
struct Reports {
    refused: Throttled,
    evicted: Throttled,
    header: Throttled,
    stalled: Throttled,
    idle: Throttled,
    accept_failed: Throttled,
}

impl Reports {
    fn report(&self, expired: Expired, limits: ConnLimits) {
        match expired {
            Expired::Header => self.header.hit(|n| {
                tracing::warn!(
                    closed = n,
                    header_timeout = ?limits.header_timeout,
                    "closed connections that did not send a whole request head within \
                     --header-timeout"
                );
            }),
            Expired::Stalled => self.stalled.hit(|n| {
                tracing::warn!(
                    closed = n,
                    idle_timeout = ?limits.idle_timeout,
                    "closed connections whose client stopped sending its body, or stopped \
                     reading its response, for --idle-timeout"
                );
            }),
            // Routine: clients leave idle connections open.
            Expired::Idle => self.idle.hit(|n| {
                tracing::debug!(
                    closed = n,
                    idle_timeout = ?limits.idle_timeout,
                    "closed idle connections"
                );
            }),
        }
    }
}

/// An event counted, and logged with the count since the last line at most
/// once per [`LOG_EVERY`].
struct Throttled {
    count: AtomicU64,
    next_line: Mutex<Option<Instant>>,
}

impl Default for Throttled {
    fn default() -> Self {
        Self {
            count: AtomicU64::new(0),
            next_line: Mutex::new(None),
        }
    }
}

impl Throttled {
    fn hit(&self, log: impl FnOnce(u64)) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let Some(mut next_line) = self.next_line.try_lock() else {
            return;
        };
        let now = Instant::now();
        if next_line.is_none_or(|at| now >= at) {
            *next_line = Some(now + LOG_EVERY);
            log(self.count.swap(0, Ordering::Relaxed));
        }
    }
}

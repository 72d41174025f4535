//! `relaunch server`: the tracking server. [`router`] builds the axum app
//! over any [`Storage`] (tests call it without a socket); [`serve`] binds,
//! guards with a token where needed, and stops cleanly: requests in flight
//! finish and every queued write commits before it returns.

pub mod alerts;
mod api;
mod body;
mod conn;
mod dashboard;
mod error;
pub mod files;
pub mod goodput;
pub mod migrate;
pub mod names;
mod origin;
mod reads;
pub mod storage;
mod trim;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use subtle::ConstantTimeEq as _;
use tokio::sync::watch;

pub use body::DEFAULT_MAX_BODY_MEMORY;
pub use conn::{ConnLimits, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS};
pub use error::AppError;
pub use files::{Direct, FileStore, collect_once, collect_unconfirmed};
pub use reads::DEFAULT_MAX_RESPONSE_MEMORY;
pub use storage::Storage;

/// The environment variable that holds the access token.
pub const TOKEN_ENV: &str = "RELAUNCH_SERVER_TOKEN";

/// Default `--max-request-bytes`.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    storage: Arc<dyn Storage>,
    files: FileStore,
    token: Option<Arc<str>>,
    /// The dashboard's read session (name, value) when there is a token:
    /// see [`Session`].
    session: Option<Arc<Session>>,
    max_request_bytes: usize,
    /// Bumped whenever console lines arrive; log follows wait on it.
    logs_changed: Arc<watch::Sender<u64>>,
    /// Admission of heavy reads (`reads.rs`).
    heavy_reads: reads::HeavyReads,
    /// The memory request bodies in flight may hold (`body.rs`).
    body_budget: body::BodyBudget,
    /// What answers not yet sent may hold together (`reads.rs`).
    max_response_memory: usize,
    /// Webhooks and rules (`alerts/`), when the server was given any.
    alerts: Option<Arc<alerts::Alerts>>,
    /// Which `Host` headers name this server (`origin.rs`); None: any
    /// (a router not served on a socket of its own, as in tests).
    host_check: Option<origin::HostCheck>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("storage", &self.storage.name())
            .field("token", &self.token.is_some())
            .field("max_request_bytes", &self.max_request_bytes)
            .finish_non_exhaustive()
    }
}

impl AppState {
    pub fn new(
        storage: Arc<dyn Storage>,
        files: FileStore,
        token: Option<String>,
        max_request_bytes: usize,
    ) -> Self {
        let logs_changed = Arc::new(watch::channel(0u64).0);
        let wake = logs_changed.clone();
        storage.watch_logs(Box::new(move || {
            wake.send_modify(|n| *n = n.wrapping_add(1))
        }));
        Self {
            storage,
            files,
            session: token.as_deref().map(|t| Arc::new(Session::of(t))),
            token: token.map(Into::into),
            max_request_bytes,
            logs_changed,
            heavy_reads: reads::HeavyReads::new(storage::sqlite::DEFAULT_MAX_READERS),
            body_budget: body::BodyBudget::new(DEFAULT_MAX_BODY_MEMORY.max(max_request_bytes)),
            max_response_memory: DEFAULT_MAX_RESPONSE_MEMORY,
            alerts: None,
            host_check: None,
        }
    }

    /// Sizes the admission of heavy reads (series, log pages, run
    /// listings) for a storage of `max_readers` database readers
    /// (`--max-readers`): they take at most `max_readers - 1` (at least 1),
    /// leaving one to light reads; more wait without holding a thread.
    #[must_use]
    /// Answers only requests whose `Host` names this server, listening on
    /// `listen`, or one of `allowed` (`--allowed-host`): see `origin.rs`.
    pub fn with_host_check(mut self, listen: std::net::SocketAddr, allowed: Vec<String>) -> Self {
        self.host_check = Some(origin::HostCheck::new(listen, allowed));
        self
    }

    pub(crate) fn session(&self) -> Option<&Session> {
        self.session.as_deref()
    }

    pub(crate) fn host_check(&self) -> Option<&origin::HostCheck> {
        self.host_check.as_ref()
    }

    pub fn with_max_readers(mut self, max_readers: usize) -> Self {
        self.heavy_reads =
            reads::HeavyReads::new(max_readers).with_answer_memory(self.max_response_memory);
        self
    }

    /// Caps the memory that heavy reads' answers not yet sent hold
    /// together (`--max-response-memory`): past it a read waits a few
    /// seconds for room, then is answered 503 with `Retry-After`.
    #[must_use]
    pub fn with_max_response_memory(mut self, bytes: usize) -> Self {
        self.max_response_memory = bytes;
        self.heavy_reads = self.heavy_reads.with_answer_memory(bytes);
        self
    }

    /// Caps the memory that request bodies in flight hold together
    /// (`--max-body-memory`), beyond the first 64 KiB of each; past it a
    /// request is answered 503 with `Retry-After`. Never below one
    /// request of `--max-request-bytes`.
    #[must_use]
    pub fn with_max_body_memory(mut self, bytes: usize) -> Self {
        self.body_budget = body::BodyBudget::new(bytes.max(self.max_request_bytes));
        self
    }

    /// Posts alerts to webhooks (`--webhook`, `--alert`).
    #[must_use]
    pub fn with_alerts(mut self, alerts: Arc<alerts::Alerts>) -> Self {
        self.alerts = Some(alerts);
        self
    }

    /// Heavy reads waiting for their turn now.
    pub fn heavy_reads_queued(&self) -> usize {
        self.heavy_reads.queued()
    }
}

/// The whole HTTP API under `/api/v1`, and the dashboard's pages (static,
/// outside the token guard; what they show comes from the guarded API).
pub fn router(state: AppState) -> Router {
    let guarded = Router::new()
        .route("/runs", post(api::open_run).get(api::list_runs))
        .route("/runs/{id}", get(api::get_run).patch(api::patch_run))
        .route("/keys", get(api::metric_names))
        .route("/latest", get(api::latest_of_runs))
        .route("/runs/{id}/batches", post(api::ingest))
        .route("/runs/{id}/watermark", get(api::watermark))
        .route("/runs/{id}/keys", get(api::keys))
        .route("/runs/{id}/series", get(api::series))
        .route("/runs/{id}/latest", get(api::latest))
        .route("/runs/{id}/history", get(api::history))
        .route("/runs/{id}/logs", get(api::logs))
        .route("/runs/{id}/events", get(api::events))
        .route("/runs/{id}/goodput", get(api::goodput))
        .route("/runs/{id}/files", post(files::commit).get(files::list))
        .route(
            "/runs/{id}/files/{*name}",
            get(files::download)
                .put(files::put_file)
                .delete(files::delete),
        )
        .route("/chunks/missing", post(files::missing))
        .route("/chunks/uploads", post(files::uploads))
        .route("/chunks/{hash}", put(files::put_chunk))
        .route("/session", post(api::session))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    let open = Router::new()
        .route("/health", get(api::health))
        .route("/openapi.json", get(api::openapi));
    Router::new()
        .nest(relaunch_api::API_PREFIX, guarded.merge(open))
        .merge(dashboard::routes())
        .fallback(api::not_found)
        .layer(middleware::from_fn_with_state(state.clone(), origin::guard))
        .with_state(state)
}

/// The cookie that lets the browser's own downloads (a link, streamed to
/// disk) read from a server with a token, without the token in it.
///
/// `POST /api/v1/session`, made with the token, sets it: `HttpOnly` (no
/// script reads it, another port's page included: cookies are not kept
/// apart by port), `SameSite=Strict`, `Path=/api/v1`. Its value is derived
/// from the token (BLAKE3 `derive_key`), so it does not give the token
/// away, survives restarts and holds on every replica with that token; it
/// admits `GET` and `HEAD` only. Its name carries a fingerprint of the
/// value, so servers with other tokens on the same host do not overwrite
/// each other's.
#[derive(Debug)]
pub struct Session {
    name: String,
    value: String,
}

impl Session {
    const CONTEXT: &str = "relaunch 2026-12-07 dashboard read session";

    fn of(token: &str) -> Self {
        let value = blake3::Hash::from(blake3::derive_key(Self::CONTEXT, token.as_bytes()))
            .to_hex()
            .to_string();
        let fingerprint = blake3::hash(value.as_bytes()).to_hex();
        Self {
            name: format!("relaunch_session_{}", &fingerprint[..12]),
            value,
        }
    }

    /// The `Set-Cookie` value that `POST /session` answers with.
    pub(crate) fn set_cookie(&self) -> String {
        format!(
            "{}={}; Path={}; HttpOnly; SameSite=Strict",
            self.name,
            self.value,
            relaunch_api::API_PREFIX
        )
    }
}

/// Every guarded request must carry `Authorization: Bearer TOKEN` when the
/// server has a token. A `GET` or `HEAD` may carry the dashboard's
/// [`Session`] cookie instead (nothing that writes is accepted on a cookie).
async fn require_token(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(token) = &state.token else {
        return next.run(request).await;
    };
    let headers = request.headers();
    let reads = matches!(*request.method(), Method::GET | Method::HEAD);
    let bearer_token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .map(str::to_owned);
    if bearer_token.is_none()
        && reads
        && let Some(session) = &state.session
        && let Some(given) = cookie(headers, &session.name)
        && bool::from(given.as_bytes().ct_eq(session.value.as_bytes()))
    {
        return next.run(request).await;
    }
    match bearer_token.as_deref() {
        Some(given) if bool::from(given.as_bytes().ct_eq(token.as_bytes())) => next.run(request).await,
        Some(_) => AppError::Unauthorized("wrong token: send the server's token (its --token or RELAUNCH_SERVER_TOKEN)".into())
            .into_response(),
        None => AppError::Unauthorized(
            "this server needs a token: send `Authorization: Bearer TOKEN` (clients read RELAUNCH_SERVER_TOKEN)".into(),
        )
        .into_response(),
    }
}

/// The value of cookie `name` (percent-decoded) in the request's `Cookie`
/// headers.
fn cookie(headers: &axum::http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| {
            percent_encoding::percent_decode_str(v)
                .decode_utf8_lossy()
                .into_owned()
        })
}

/// The credentials of `Bearer CREDENTIALS`; the scheme's name is
/// case-insensitive (RFC 9110, 11.1).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, credentials) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim_start())
}

/// Whether `ip` only reaches this machine.
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
}

/// Refuses a token that no client can send: one that is only whitespace,
/// or begins or ends with it (HTTP strips it around a header's value, and
/// the server would lock everyone out).
pub fn check_token(token: &str) -> Result<(), String> {
    if token.trim().is_empty() {
        return Err(format!(
            "the token ({} characters of whitespace) could never be sent; set --token or \
             {TOKEN_ENV} to a secret of visible characters, or unset it",
            token.chars().count()
        ));
    }
    if token.trim() != token {
        return Err(format!(
            "the token begins or ends with whitespace, which HTTP strips from the header that \
             carries it, so no client could match it; remove the whitespace from --token or \
             {TOKEN_ENV}"
        ));
    }
    Ok(())
}

/// Refuses to expose a server without a token beyond this machine.
pub fn check_exposure(addr: SocketAddr, token: Option<&str>) -> Result<(), String> {
    if is_loopback(addr.ip()) || token.is_some() {
        return Ok(());
    }
    Err(format!(
        "listening on {addr} would let anyone on the network read and write runs; \
         set a token with --token or {TOKEN_ENV} (clients send it too), or listen on 127.0.0.1"
    ))
}

/// Serves `state` on `listener` with the default [`ConnLimits`] until
/// `shutdown` completes; then finishes the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, state, ConnLimits::default(), shutdown).await
}

/// Serves `state` on `listener` under `limits` until `shutdown` completes;
/// then finishes the requests in flight.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    state: AppState,
    limits: ConnLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let deliveries = match &state.alerts {
        Some(alerts) => alerts::spawn_delivery(alerts, &state.storage),
        None => Vec::new(),
    };
    let served = conn::serve(listener, router(state), limits, shutdown).await;
    for task in deliveries {
        task.abort();
    }
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_no_client_can_send_is_refused() {
        assert!(
            check_token("   ")
                .unwrap_err()
                .contains("3 characters of whitespace")
        );
        assert!(check_token("\t").is_err());
        assert!(
            check_token(" secret")
                .unwrap_err()
                .contains("begins or ends")
        );
        assert!(check_token("secret ").is_err());
        assert!(check_token("s3cret").is_ok());
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer abc"), Some("abc"));
        assert_eq!(bearer("BEARER  abc"), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearerabc"), None);
        assert_eq!(bearer(""), None);
    }
}

//! The HTTP side of the client: one method per endpoint of `/api/v1`.
//!
//! A client may name several servers (`http://a:8765,http://b:8765`,
//! replicas of one tracking server on a shared database): requests go to
//! one of them, and a request that gets no answer (the connection refused,
//! reset or timed out) or a 502/503/504 moves every clone of the client to
//! the next and is sent there, once to each. Every request of the API can
//! be repeated safely (batches are exactly-once by writer sequence, chunks
//! by hash, runs by id), so a request that reached a server that died
//! before answering is repeated, not lost.
//!
//! Proxies come from the usual environment (`HTTPS_PROXY`, `HTTP_PROXY`,
//! `ALL_PROXY`, `NO_PROXY`). No request has a total deadline: a transfer
//! that keeps making progress is never cut; one that stalls for
//! [`READ_STALL`] is.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use relaunch_api::files::check_file_name;
use relaunch_api::{
    API_PREFIX, Ack, ApiError, ChunkQuery, ChunkUpload, ChunkUploads, DirectChunk, Event, FileInfo,
    FileManifest, Health, HistoryQuery, Latest, LogLine, MissingChunks, RunFilter, RunInfo,
    RunInit, RunPatch, Series, SeriesQuery, UploadQuery,
};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;

use crate::error::ClientError;

/// The environment variable naming the server, as `http(s)://host:port`.
pub const SERVER_ENV: &str = "RELAUNCH_SERVER";
/// The environment variable holding the server's access token.
pub const TOKEN_ENV: &str = "RELAUNCH_SERVER_TOKEN";

/// A connection attempt that takes longer fails (and is retried by the shipper).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Silence on an open connection for this long ends the request.
pub const READ_STALL: Duration = Duration::from_secs(120);

/// Redirects followed before a request fails (reqwest's default).
const MAX_REDIRECTS: usize = 10;

/// Whether plain-HTTP requests go through an `https://` proxy (the
/// variables reqwest reads for http URLs), which needs certificates.
fn https_proxy_for_http() -> bool {
    ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
        .iter()
        .filter_map(std::env::var_os)
        .any(|v| {
            v.to_string_lossy()
                .trim()
                .to_ascii_lowercase()
                .starts_with("https://")
        })
}

/// A handle on a tracking server (or on several replicas of one); cheap
/// to clone.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    /// `scheme://host:port/api/v1` of each server, no trailing slash.
    bases: Arc<[String]>,
    /// The server in use, an index into `bases`, shared by every clone.
    active: Arc<AtomicUsize>,
    token: Option<String>,
    /// For chunks sent straight to a bucket, made at the first.
    bucket: Arc<std::sync::OnceLock<reqwest::Client>>,
}

/// What one `PUT` of a chunk to a bucket came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketPut {
    Stored,
    /// The URL's time ran out: ask for a new one.
    Expired,
    /// The bucket saw other bytes than the checksum (damaged on the way).
    Damaged(String),
    /// No connection to the bucket at all.
    Unreachable(String),
    /// A 5xx, a throttle, or a connection lost midway: try again.
    Failed(String),
    /// Anything else the bucket refused (403, ...).
    Refused(String),
}

/// A run query for [`Client::logs`].
#[derive(Clone, Debug, Default)]
pub struct LogsQuery {
    pub rank: Option<u32>,
    pub after: u64,
    pub limit: Option<u32>,
    /// Seconds the server may wait for a line when none is there yet.
    pub wait: f64,
    /// The last this many lines instead (`after` must be 0; no wait).
    pub tail: Option<u32>,
}

impl Client {
    /// `server` is `http://host:port` or `https://host:port` (a bare
    /// `host:port` means http), or several of them separated by commas
    /// (replicas, tried in turn); `token` is sent as a bearer token.
    pub fn new(server: &str, token: Option<&str>) -> Result<Self, ClientError> {
        let bases: Vec<String> = server_list(server)?
            .into_iter()
            .map(|base| format!("{base}{API_PREFIX}"))
            .collect();
        let mut http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_STALL)
            .user_agent(concat!("relaunch/", env!("CARGO_PKG_VERSION")));
        if !bases.iter().any(|b| b.starts_with("https://")) && !https_proxy_for_http() {
            // Plain HTTP end to end: no root certificates to load (reading
            // and parsing the system's costs every command milliseconds
            // before its first request), and a redirect to https is refused
            // with the URL to give instead.
            http = http
                .tls_certs_only([])
                .redirect(reqwest::redirect::Policy::custom(|attempt| {
                    if attempt.url().scheme() == "https" {
                        let to = attempt.url().clone();
                        attempt.error(format!(
                            "the server redirected to {to}: give its https:// address \
                             (--server or {SERVER_ENV})"
                        ))
                    } else if attempt.previous().len() >= MAX_REDIRECTS {
                        attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
                    } else {
                        attempt.follow()
                    }
                }));
        }
        let http = http
            .build()
            .map_err(|e| ClientError::Config(format!("cannot set up HTTP: {e}")))?;
        Ok(Self {
            http,
            bases: bases.into(),
            active: Arc::new(AtomicUsize::new(0)),
            token: token.filter(|t| !t.is_empty()).map(str::to_owned),
            bucket: Arc::default(),
        })
    }

    /// The root URL of the server in use, for messages.
    pub fn url(&self) -> &str {
        let base = self.base();
        base.strip_suffix(API_PREFIX).unwrap_or(base)
    }

    fn base(&self) -> &str {
        &self.bases[self.active.load(Ordering::Relaxed) % self.bases.len()]
    }

    pub async fn health(&self) -> Result<Health, ClientError> {
        self.call("the health check", self.request(Method::GET, "/health"))
            .await
    }

    pub async fn open_run(&self, init: &RunInit) -> Result<RunInfo, ClientError> {
        self.call(
            "opening the run",
            self.request(Method::POST, "/runs").json(init),
        )
        .await
    }

    pub async fn get_run(&self, id: &str) -> Result<RunInfo, ClientError> {
        self.call("reading the run", self.run_request(Method::GET, id, "")?)
            .await
    }

    pub async fn patch_run(&self, id: &str, patch: &RunPatch) -> Result<RunInfo, ClientError> {
        self.call(
            "updating the run",
            self.run_request(Method::PATCH, id, "")?.json(patch),
        )
        .await
    }

    pub async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunInfo>, ClientError> {
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(p) = &filter.project {
            query.push(("project", p.clone()));
        }
        if let Some(t) = &filter.tag {
            query.push(("tag", t.clone()));
        }
        if let Some(s) = filter.status {
            query.push(("status", s.as_str().to_owned()));
        }
        for p in &filter.param {
            query.push(("param", p.clone()));
        }
        for m in &filter.metric {
            query.push(("metric", m.clone()));
        }
        if let Some(q) = &filter.q {
            query.push(("q", q.clone()));
        }
        if let Some(s) = &filter.sort {
            query.push(("sort", s.clone()));
        }
        if let Some(o) = filter.offset {
            query.push(("offset", o.to_string()));
        }
        if let Some(l) = filter.limit {
            query.push(("limit", l.to_string()));
        }
        self.call(
            "listing runs",
            self.request(Method::GET, "/runs").query(&query),
        )
        .await
    }

    /// Sends an encoded batch (`relaunch_api::batch`).
    pub async fn send_batch(&self, run: &str, batch: Vec<u8>) -> Result<Ack, ClientError> {
        self.call(
            "a batch",
            self.run_request(Method::POST, run, "/batches")?
                .header(
                    reqwest::header::CONTENT_TYPE,
                    relaunch_api::batch::CONTENT_TYPE,
                )
                .body(batch),
        )
        .await
    }

    /// The highest sequence number of `writer` the server has stored.
    pub async fn watermark(&self, run: &str, writer: &str) -> Result<u64, ClientError> {
        let ack: Ack = self
            .call(
                "the watermark query",
                self.run_request(Method::GET, run, "/watermark")?
                    .query(&[("writer", writer)]),
            )
            .await?;
        Ok(ack.watermark)
    }

    pub async fn keys(&self, run: &str) -> Result<Vec<String>, ClientError> {
        self.call("listing keys", self.run_request(Method::GET, run, "/keys")?)
            .await
    }

    pub async fn series(&self, run: &str, query: &SeriesQuery) -> Result<Series, ClientError> {
        let mut q: Vec<(&str, String)> = vec![
            ("key", query.key.clone()),
            ("buckets", query.buckets.to_string()),
        ];
        if let Some(r) = query.rank {
            q.push(("rank", r.to_string()));
        }
        if let Some(s) = query.min_step {
            q.push(("min_step", s.to_string()));
        }
        if let Some(s) = query.max_step {
            q.push(("max_step", s.to_string()));
        }
        if let Some(a) = query.attempt {
            q.push(("attempt", a.to_string()));
        }
        self.call(
            "reading a series",
            self.run_request(Method::GET, run, "/series")?.query(&q),
        )
        .await
    }

    /// `GET {path}?{query}` under `/api/v1`, answered as JSON of any
    /// shape: the read API's calls that need no type of their own
    /// (`/runs`, `/latest`, a run's `/latest`, `/events`, `/logs`,
    /// `/files`). `path` must be one of relaunch's (no `..`, no query).
    pub async fn get_value(
        &self,
        what: &str,
        path: &str,
        query: &[(String, String)],
    ) -> Result<serde_json::Value, ClientError> {
        if !path.starts_with('/') || path.contains("..") || path.contains(['?', '#']) {
            return Err(ClientError::Config(format!(
                "{path:?} is not a path of relaunch's API"
            )));
        }
        self.call(what, self.request(Method::GET, path).query(query))
            .await
    }

    /// Every point of the keys `query` asks for, unsampled, as the column
    /// body the server sent (`relaunch_api::columns`).
    pub async fn history(
        &self,
        run: &str,
        query: &HistoryQuery,
    ) -> Result<bytes::Bytes, ClientError> {
        let what = "reading a history";
        let request = self
            .run_request(Method::GET, run, "/history")?
            .query(&query.pairs());
        let mut response = self.send(what, request).await?;
        // One allocation of the announced size (hundreds of megabytes for
        // millions of points), not a buffer that doubles as it fills.
        let announced = response.content_length().unwrap_or(0);
        let mut body = Vec::with_capacity(usize::try_from(announced).unwrap_or(0));
        while let Some(chunk) = response.chunk().await.map_err(|e| self.unreachable(&e))? {
            body.extend_from_slice(&chunk);
        }
        let body = bytes::Bytes::from(body);
        if !body.starts_with(relaunch_api::columns::MAGIC) {
            return Err(ClientError::Status {
                status: 200,
                what: what.to_owned(),
                message: format!(
                    "the answer is not what a relaunch server sends; is {} a relaunch server (of this version or newer)?",
                    self.url()
                ),
                retry_after: None,
            });
        }
        Ok(body)
    }

    pub async fn latest(&self, run: &str) -> Result<Vec<Latest>, ClientError> {
        self.call(
            "reading the latest values",
            self.run_request(Method::GET, run, "/latest")?,
        )
        .await
    }

    pub async fn logs(&self, run: &str, query: &LogsQuery) -> Result<Vec<LogLine>, ClientError> {
        let mut q: Vec<(&str, String)> = vec![
            ("after", query.after.to_string()),
            ("wait", query.wait.to_string()),
        ];
        if let Some(r) = query.rank {
            q.push(("rank", r.to_string()));
        }
        if let Some(l) = query.limit {
            q.push(("limit", l.to_string()));
        }
        if let Some(n) = query.tail {
            q.push(("tail", n.to_string()));
        }
        self.call(
            "reading console lines",
            self.run_request(Method::GET, run, "/logs")?.query(&q),
        )
        .await
    }

    pub async fn events(&self, run: &str) -> Result<Vec<Event>, ClientError> {
        self.call(
            "reading events",
            self.run_request(Method::GET, run, "/events")?,
        )
        .await
    }

    /// Those of `hashes` the server does not have.
    pub async fn missing_chunks(&self, hashes: Vec<String>) -> Result<MissingChunks, ClientError> {
        self.call(
            "the chunk query",
            self.request(Method::POST, "/chunks/missing")
                .json(&ChunkQuery { chunks: hashes }),
        )
        .await
    }

    /// Presigned URLs to send `chunks` straight to the server's bucket
    /// (only for those still missing there).
    pub async fn chunk_uploads(
        &self,
        chunks: Vec<DirectChunk>,
    ) -> Result<ChunkUploads, ClientError> {
        self.call(
            "the upload query",
            self.request(Method::POST, "/chunks/uploads")
                .json(&UploadQuery { chunks }),
        )
        .await
    }

    /// One chunk `PUT` to the bucket through a presigned URL, with the
    /// headers its signature binds.
    pub async fn put_to_bucket(&self, upload: &ChunkUpload, data: bytes::Bytes) -> BucketPut {
        let http = match self.bucket_client() {
            Ok(http) => http,
            Err(e) => return BucketPut::Unreachable(e),
        };
        let mut request = http.put(&upload.url).body(data);
        for (name, value) in &upload.headers {
            request = request.header(name, value);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                let mut reason = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(inner) = source {
                    reason.push_str(": ");
                    reason.push_str(&inner.to_string());
                    source = inner.source();
                }
                return if e.is_connect() {
                    BucketPut::Unreachable(reason)
                } else {
                    BucketPut::Failed(reason)
                };
            }
        };
        let status = response.status();
        if status.is_success() {
            return BucketPut::Stored;
        }
        let body = response.bytes().await.unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        let code = text
            .split_once("<Code>")
            .and_then(|(_, rest)| rest.split_once("</Code>"))
            .map_or("", |(code, _)| code);
        let said = format!("{status} {code}").trim().to_owned();
        if text.contains("expired") || code == "ExpiredToken" {
            BucketPut::Expired
        } else if matches!(
            code,
            "BadDigest" | "InvalidDigest" | "XAmzContentSHA256Mismatch"
        ) || status == StatusCode::BAD_REQUEST
        {
            BucketPut::Damaged(said)
        } else if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            BucketPut::Failed(said)
        } else {
            BucketPut::Refused(said)
        }
    }

    /// The HTTP client for a bucket: its own (the server's may have been
    /// built without root certificates, for a plain-HTTP server).
    fn bucket_client(&self) -> Result<reqwest::Client, String> {
        if let Some(http) = self.bucket.get() {
            return Ok(http.clone());
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_STALL)
            .user_agent(concat!("relaunch/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot set up HTTP for the bucket: {e}"))?;
        Ok(self.bucket.get_or_init(|| http).clone())
    }

    /// Uploads one chunk; the server stores it only if `hash` is its BLAKE3.
    pub async fn put_chunk(&self, hash: &str, data: bytes::Bytes) -> Result<(), ClientError> {
        relaunch_api::files::check_hash(hash).map_err(ClientError::Config)?;
        let request = self
            .request(Method::PUT, &format!("/chunks/{hash}"))
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(data);
        self.send("a chunk", request).await.map(drop)
    }

    /// Makes a file of chunks the server has visible in the run.
    pub async fn commit_file(
        &self,
        run: &str,
        manifest: &FileManifest,
    ) -> Result<FileInfo, ClientError> {
        check_file_name(&manifest.name).map_err(ClientError::Config)?;
        self.call(
            "the file",
            self.run_request(Method::POST, run, "/files")?
                .json(manifest),
        )
        .await
    }

    /// The run's files.
    pub async fn files(&self, run: &str) -> Result<Vec<FileInfo>, ClientError> {
        self.files_as(run).await
    }

    /// The run's files as `T`, which may keep only some of [`FileInfo`]'s
    /// fields: a listing of many files parses faster when the rest are
    /// skipped.
    pub async fn files_as<T: DeserializeOwned>(&self, run: &str) -> Result<Vec<T>, ClientError> {
        self.call(
            "listing files",
            self.run_request(Method::GET, run, "/files")?,
        )
        .await
    }

    /// Removes `name` from the run; what it was.
    pub async fn delete_file(&self, run: &str, name: &str) -> Result<FileInfo, ClientError> {
        check_file_name(name).map_err(ClientError::Config)?;
        self.call(
            "deleting a file",
            self.run_request(Method::DELETE, run, &format!("/files/{name}"))?,
        )
        .await
    }

    /// The response to a download of `name` from byte `from` on (a `Range`
    /// request when `from > 0`), checked to be a success.
    pub async fn download(
        &self,
        run: &str,
        name: &str,
        from: u64,
    ) -> Result<reqwest::Response, ClientError> {
        check_file_name(name).map_err(ClientError::Config)?;
        let mut request = self.run_request(Method::GET, run, &format!("/files/{name}"))?;
        if from > 0 {
            request = request.header(reqwest::header::RANGE, format!("bytes={from}-"));
        }
        self.send("the download", request).await
    }

    /// Sends `request`; a response that is not a success becomes the error
    /// the server's body explains.
    async fn send(
        &self,
        what: &str,
        request: RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let response = self.execute(request).await?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = retry_after(&response);
        let body = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        Err(ClientError::Status {
            status: status.as_u16(),
            what: what.to_owned(),
            message: error_message(status, &body),
            retry_after,
        })
    }

    /// What a failed read of a response body becomes.
    pub fn body_error(&self, e: &reqwest::Error) -> ClientError {
        self.unreachable(e)
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base()));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// A request under `/runs/{id}`; the id is checked here so that no
    /// caller can aim a request elsewhere with `../`.
    fn run_request(
        &self,
        method: Method,
        id: &str,
        rest: &str,
    ) -> Result<RequestBuilder, ClientError> {
        check_run_id(id)?;
        Ok(self.request(method, &format!("/runs/{id}{rest}")))
    }

    async fn call<T: DeserializeOwned>(
        &self,
        what: &str,
        request: RequestBuilder,
    ) -> Result<T, ClientError> {
        let response = self.execute(request).await?;
        let status = response.status();
        let retry_after = retry_after(&response);
        let body = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|e| ClientError::Status {
                status: status.as_u16(),
                what: what.to_owned(),
                message: format!(
                    "the answer is not what a relaunch server sends ({e}); is {} a relaunch server?",
                    self.url()
                ),
                retry_after: None,
            });
        }
        Err(ClientError::Status {
            status: status.as_u16(),
            what: what.to_owned(),
            message: error_message(status, &body),
            retry_after,
        })
    }

    /// Sends `request` to the server in use; with several servers, one that
    /// gives no answer or a 502/503/504 makes every clone move on to the
    /// next, and the request goes there (each server once). A request whose
    /// body cannot be replayed (a stream) is sent once.
    async fn execute(&self, request: RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let mut request = Some(request.build().map_err(|e| self.unreachable(&e))?);
        let servers = self.bases.len();
        for tried in 1..=servers {
            let Some(original) = request.take() else {
                break;
            };
            let last = tried == servers;
            let replay = if last { None } else { original.try_clone() };
            let last = last || replay.is_none();
            let index = self.active.load(Ordering::Relaxed) % servers;
            let mut attempt = original;
            self.aim(&mut attempt, index);
            request = replay;
            match self.http.execute(attempt).await {
                Ok(response)
                    if last
                        || !matches!(
                            response.status(),
                            StatusCode::BAD_GATEWAY
                                | StatusCode::SERVICE_UNAVAILABLE
                                | StatusCode::GATEWAY_TIMEOUT
                        ) =>
                {
                    return Ok(response);
                }
                Ok(response) => {
                    tracing::info!(server = %self.url(), status = %response.status(), "a tracking server is unavailable; trying the next");
                    self.move_on(index);
                }
                Err(e) if last => {
                    self.move_on(index);
                    return Err(self.unreachable_at(&e, index));
                }
                Err(e) => {
                    tracing::info!(server = %self.url(), error = %e, "a tracking server does not answer; trying the next");
                    self.move_on(index);
                }
            }
        }
        Err(ClientError::Config(
            "internal: a request was not sent to any server".into(),
        ))
    }

    /// Points `request`, built for whichever server was in use then, at
    /// server `index`.
    fn aim(&self, request: &mut reqwest::Request, index: usize) {
        let url = request.url().as_str();
        let Some(rest) = self
            .bases
            .iter()
            .filter_map(|base| url.strip_prefix(base.as_str()))
            .min_by_key(|rest| rest.len())
        else {
            return;
        };
        if let Ok(aimed) = reqwest::Url::parse(&format!("{}{rest}", self.bases[index])) {
            *request.url_mut() = aimed;
        }
    }

    /// Moves every clone from server `from` to the next, unless another
    /// request moved them already.
    fn move_on(&self, from: usize) {
        let next = (from + 1) % self.bases.len();
        let _ = self
            .active
            .compare_exchange(from, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    fn unreachable(&self, e: &reqwest::Error) -> ClientError {
        self.unreachable_at(e, self.active.load(Ordering::Relaxed) % self.bases.len())
    }

    fn unreachable_at(&self, e: &reqwest::Error, index: usize) -> ClientError {
        // reqwest's Display stops at the outermost layer; the cause says why.
        let mut reason = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(inner) = source {
            reason.push_str(": ");
            reason.push_str(&inner.to_string());
            source = inner.source();
        }
        let base = &self.bases[index];
        let url = base.strip_suffix(API_PREFIX).unwrap_or(base);
        if let Some((var, proxy)) = proxy_for(url) {
            reason.push_str(&format!(
                " (through the proxy {proxy} that {var} names; add the server's host to \
                 NO_PROXY to bypass it)"
            ));
        }
        if self.bases.len() > 1 {
            reason.push_str(&format!(
                " (and no other of the {} servers answered)",
                self.bases.len()
            ));
        }
        ClientError::Unreachable {
            url: url.to_owned(),
            reason,
        }
    }
}

/// The proxy variable that applies to `url` and the proxy it names, when
/// requests to `url` go through one, for messages. Decided by the matcher
/// reqwest itself uses (hyper-util's, from the same variables: `NO_PROXY`
/// with domains, IP addresses and CIDR ranges, `*`), so a message never
/// blames a proxy that was bypassed.
fn proxy_for(url: &str) -> Option<(&'static str, String)> {
    let uri: http::Uri = url.parse().ok()?;
    let intercept = hyper_util::client::proxy::matcher::Matcher::from_env().intercept(&uri)?;
    let names: &[&'static str] = if url.starts_with("https:") {
        &["https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"]
    } else {
        &["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
    };
    let var = names
        .iter()
        .find(|name| std::env::var(name).is_ok_and(|v| !v.trim().is_empty()))
        .copied()
        .unwrap_or("the environment");
    Some((var, intercept.uri().to_string()))
}

/// Longest `Retry-After` honoured: a server (or a proxy) asking for more
/// is waited on this long, then tried again.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

/// A 429 or 503's `Retry-After` in seconds (the form relaunch's server
/// sends; an HTTP date is not read), at most [`RETRY_AFTER_MAX`].
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let status = response.status().as_u16();
    if status != 429 && status != 503 {
        return None;
    }
    let seconds: u64 = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(RETRY_AFTER_MAX))
}

/// The pause before the next try of a request that failed with `error`,
/// `backoff` being the loop's own: the backoff with ±25 % of jitter (so
/// that many clients that lost the server together do not return
/// together), and never less than the server's `Retry-After`.
pub fn retry_pause(backoff: Duration, error: Option<&ClientError>) -> Duration {
    let jittered = jitter(backoff);
    match error.and_then(ClientError::retry_after) {
        Some(asked) => jittered.max(asked),
        None => jittered,
    }
}

/// `d` times a factor in [0.75, 1.25), drawn anew each call.
pub fn jitter(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // A fresh RandomState is seeded per process and per call: enough to
    // spread clients apart, with no RNG dependency.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_nanos() as u64),
    );
    let factor = 0.75 + (h.finish() % 10_000) as f64 / 20_000.0;
    d.mul_f64(factor)
}

/// The server's own message, or what the body shows (a proxy's page).
fn error_message(status: StatusCode, body: &[u8]) -> String {
    if let Ok(api) = serde_json::from_slice::<ApiError>(body) {
        return api.error;
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let shown: String = text.chars().take(200).collect();
    if shown.is_empty() {
        format!("{status} with no body; is there a proxy in the way?")
    } else {
        format!("{status}: {shown}")
    }
}

/// Each server of a comma-separated list, normalized (see
/// [`normalize_server`]); at least one.
pub fn server_list(servers: &str) -> Result<Vec<String>, ClientError> {
    let list: Vec<String> = servers
        .split(',')
        .map(normalize_one)
        .collect::<Result<_, _>>()?;
    let mut seen = std::collections::BTreeSet::new();
    if let Some(twice) = list.iter().find(|s| !seen.insert(s.as_str())) {
        return Err(ClientError::Config(format!(
            "server {twice} is listed twice in {servers:?}; list each replica once"
        )));
    }
    Ok(list)
}

/// `http(s)://host[:port][/prefix]` without a trailing slash (a prefix is
/// where a reverse proxy serves the API), or several, comma-separated.
pub fn normalize_server(server: &str) -> Result<String, ClientError> {
    Ok(server_list(server)?.join(","))
}

fn normalize_one(server: &str) -> Result<String, ClientError> {
    let trimmed = server.trim();
    let with_scheme = if trimmed.contains("://") {
        trimmed.to_owned()
    } else {
        format!("http://{trimmed}")
    };
    let refuse = |why: String| {
        ClientError::Config(format!(
            "server {trimmed:?} {why}; give it as http://HOST:PORT, e.g. http://127.0.0.1:8765"
        ))
    };
    let url =
        reqwest::Url::parse(&with_scheme).map_err(|e| refuse(format!("is not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refuse(format!(
            "uses {}://, not http:// or https://",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(refuse("has no host".into()));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(refuse("has a query or fragment".into()));
    }
    Ok(format!(
        "{}{}",
        url.origin().ascii_serialization(),
        url.path().trim_end_matches('/')
    ))
}

/// Run ids are plain names: they become directory names in the spool and
/// path segments in URLs.
pub fn check_run_id(id: &str) -> Result<(), ClientError> {
    relaunch_api::names::check_name("run id", id).map_err(ClientError::Config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, retry: Option<&str>) -> reqwest::Response {
        let mut builder = http::Response::builder().status(status);
        if let Some(value) = retry {
            builder = builder.header("retry-after", value);
        }
        reqwest::Response::from(builder.body(Vec::<u8>::new()).unwrap())
    }

    #[test]
    fn retry_after_is_read_from_429_and_503_in_seconds_and_capped() {
        let s = Duration::from_secs;
        assert_eq!(retry_after(&response(503, Some("3"))), Some(s(3)));
        assert_eq!(retry_after(&response(429, Some(" 7 "))), Some(s(7)));
        assert_eq!(
            retry_after(&response(503, Some("86400"))),
            Some(RETRY_AFTER_MAX)
        );
        assert_eq!(retry_after(&response(500, Some("3"))), None);
        assert_eq!(retry_after(&response(503, None)), None);
        assert_eq!(
            retry_after(&response(503, Some("Wed, 21 Oct 2026 07:28:00 GMT"))),
            None
        );
    }

    #[test]
    fn a_retry_waits_the_jittered_backoff_and_at_least_what_the_server_asked() {
        let backoff = Duration::from_millis(400);
        let pauses: Vec<Duration> = (0..200).map(|_| retry_pause(backoff, None)).collect();
        assert!(
            pauses.iter().all(|p| (300..500).contains(&p.as_millis())),
            "{pauses:?}"
        );
        // Spread out, not one value.
        let distinct: std::collections::HashSet<_> = pauses.iter().collect();
        assert!(distinct.len() > 50, "{}", distinct.len());
        let busy = ClientError::Status {
            status: 503,
            what: "x".into(),
            message: "busy".into(),
            retry_after: Some(Duration::from_secs(2)),
        };
        assert!(retry_pause(backoff, Some(&busy)) >= Duration::from_secs(2));
        let soon = ClientError::Status {
            status: 503,
            what: "x".into(),
            message: "busy".into(),
            retry_after: Some(Duration::from_millis(10)),
        };
        assert!(retry_pause(backoff, Some(&soon)) >= Duration::from_millis(300));
    }

    #[test]
    fn servers_are_normalized_or_refused_with_the_fix() {
        assert_eq!(
            normalize_server("127.0.0.1:8765/").unwrap(),
            "http://127.0.0.1:8765"
        );
        assert_eq!(
            normalize_server("https://track.example.com").unwrap(),
            "https://track.example.com"
        );
        assert_eq!(
            normalize_server("https://proxy.example.com/relaunch/").unwrap(),
            "https://proxy.example.com/relaunch"
        );
        for bad in [
            "ftp://x",
            "http://",
            "",
            "http://h:1/?q=1",
            "http://a:1,",
            "a:1,,b:2",
        ] {
            let err = normalize_server(bad).unwrap_err().to_string();
            assert!(err.contains("http://"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn several_servers_are_a_list_of_replicas() {
        assert_eq!(
            normalize_server(" a:1 , https://b/x/ ").unwrap(),
            "http://a:1,https://b/x"
        );
        let err = normalize_server("a:1,http://a:1/").unwrap_err().to_string();
        assert!(err.contains("listed twice"), "{err}");
        let client = Client::new("a:1,b:2", None).unwrap();
        assert_eq!(client.url(), "http://a:1");
        client.move_on(0);
        assert_eq!(client.clone().url(), "http://b:2");
        client.move_on(0);
        assert_eq!(client.url(), "http://b:2", "a stale move changes nothing");
    }

    #[test]
    fn run_ids_cannot_leave_their_directory() {
        for bad in ["../x", "/abs", "a/b", ".hidden", "", "%2e%2e"] {
            assert!(check_run_id(bad).is_err(), "{bad:?}");
        }
        assert!(check_run_id("job-42.b_c").is_ok());
    }
}

//! The handlers of `/api/v1`: each checks its input, calls the storage off
//! the async threads, and answers JSON.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, Query, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use relaunch_api::{
    Ack, Batch, Event, Health, HistoryQuery, Latest, RunFilter, RunInfo, RunInit, RunPatch,
    RunStatus, SeriesQuery, columns,
};
use serde::Deserialize;

use crate::AppState;
use crate::body::{Held, read_limited};
use crate::error::AppError;
use crate::names::{check_key, check_name};
use crate::storage::{Storage, StorageError, filter};

/// Longest `?wait=` of a log follow.
const MAX_FOLLOW: Duration = Duration::from_secs(60);

pub(crate) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The `{id}` of a run's path, checked like every name. A path that does
/// not decode (bad percent-encoding, not UTF-8) gets the API's JSON error
/// like any other bad input, not axum's plain-text rejection.
pub(crate) struct RunId(pub(crate) String);

impl<S: Send + Sync> FromRequestParts<S> for RunId {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                AppError::BadRequest(format!(
                    "the run id in the path is not valid: {}; a run id is letters, digits, \
                     '-', '_' and '.'",
                    e.body_text()
                ))
            })?;
        check_name("run id", &id)?;
        Ok(Self(id))
    }
}

/// Runs a storage call on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    storage: &Arc<dyn Storage>,
    f: impl FnOnce(&dyn Storage) -> Result<T, StorageError> + Send + 'static,
) -> Result<T, AppError> {
    let storage = storage.clone();
    tokio::task::spawn_blocking(move || f(storage.as_ref()))
        .await
        .map_err(|e| AppError::Internal(format!("storage task failed: {e}")))?
        .map_err(AppError::from)
}

/// A heavy read: one whose answer can be large or whose work grows with
/// the data (a series of up to `MAX_BUCKETS` buckets over millions of
/// points, a page of up to 100,000 console lines, a listing of up to
/// 100,000 runs, the keys or latest values of every run a filter selects,
/// a run's goodput over all its chunk summaries). It waits for its turn without holding a thread (`reads.rs`) and answers
/// JSON serialized on the blocking thread. Light reads (one run, a
/// watermark, a run's keys, latest values or events) and every write go
/// through [`blocking`] at once. There is no CSV export on the server: a
/// CLI export is a series read like any other.
async fn heavy<T: serde::Serialize + Send + 'static>(
    state: &AppState,
    f: impl FnOnce(&dyn Storage) -> Result<T, StorageError> + Send + 'static,
) -> Result<Response, AppError> {
    Ok(json_response(
        state.heavy_reads.json(&state.storage, f).await?,
    ))
}

fn json_response(json: Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], json).into_response()
}

/// Reads a body up to the server's limit, refusing a larger one with a 413
/// that names the limit and how to raise it (`body.rs`).
async fn read_body(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Held, AppError> {
    read_limited(
        &state.body_budget,
        headers,
        body,
        state.max_request_bytes,
        "send smaller batches, or restart the server with a larger --max-request-bytes",
    )
    .await
}

pub(crate) fn json_body<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
) -> Result<T, AppError> {
    serde_json::from_slice(bytes).map_err(|e| {
        AppError::BadRequest(format!("{what} is not valid JSON for this request: {e}"))
    })
}

/// `POST /session`: made with the token (the guard checked it), sets the
/// dashboard's read cookie (`crate::Session`); without a token, there is
/// nothing to set.
pub(crate) async fn session(State(state): State<AppState>) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Some(session) = state.session()
        && let Ok(value) = HeaderValue::from_str(&session.set_cookie())
    {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

pub(crate) async fn health(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        storage: state.storage.name().to_owned(),
        limits: [(
            "max_request_bytes".to_owned(),
            state.max_request_bytes as u64,
        )]
        .into(),
    })
}

pub(crate) async fn open_run(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<RunInfo>), AppError> {
    let bytes = read_body(&state, &headers, body).await?;
    let init: RunInit = json_body(&bytes, "the run")?;
    if let Some(project) = &init.project {
        check_name("project", project)?;
    }
    if let Some(id) = &init.id {
        check_name("run id", id)?;
    }
    if init.attempt_token.is_empty() || init.attempt_token.len() > 256 {
        return Err(AppError::BadRequest(
            "attempt_token must be 1 to 256 bytes".into(),
        ));
    }
    let info = blocking(&state.storage, move |s| s.open_run(&init, now())).await?;
    Ok((StatusCode::OK, Json(info)))
}

pub(crate) async fn get_run(
    State(state): State<AppState>,
    RunId(id): RunId,
) -> Result<Json<RunInfo>, AppError> {
    Ok(Json(
        blocking(&state.storage, move |s| s.get_run(&id)).await?,
    ))
}

pub(crate) async fn patch_run(
    State(state): State<AppState>,
    RunId(id): RunId,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<RunInfo>, AppError> {
    let bytes = read_body(&state, &headers, body).await?;
    let patch: RunPatch = json_body(&bytes, "the change")?;
    Ok(Json(
        blocking(&state.storage, move |s| s.patch_run(&id, &patch, now())).await?,
    ))
}

/// Most `param=` filters one request may carry: each is a condition in
/// the query, and the databases refuse an expression past a depth (SQLite's
/// 1,000) with an error that would otherwise be a 500.
const MAX_PARAM_FILTERS: usize = 100;

/// A batch body larger than this is heavy work: the allocator is trimmed
/// after it (`reads::HeavyReads::heavy_work`).
const BIG_BATCH: usize = 8 << 20;

/// The header of a listing's answer that says how many runs its filter
/// selects in all.
const TOTAL_COUNT: HeaderName = HeaderName::from_static("x-total-count");

/// A batch body larger than this is decoded on a blocking thread.
const DECODE_APART: usize = 256 << 10;

/// Most keys one `GET /latest` may ask for.
const MAX_LATEST_KEYS: usize = 100;

/// A run filter from a query string (`project`, `tag`, `status`, `q`,
/// `param=PATH=VALUE`, `metric=KEY<NUMBER`, `sort`, `offset`, `limit`), and
/// its `key`s where `keys` says they are allowed.
fn run_filter(query: Option<String>, keys: bool) -> Result<(RunFilter, Vec<String>), AppError> {
    let mut filter = RunFilter::default();
    let mut wanted = Vec::new();
    let number = |name: &str, v: &str| -> Result<u32, AppError> {
        v.parse()
            .map_err(|_| AppError::BadRequest(format!("{name} {v:?} is not a whole number")))
    };
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "project" => filter.project = Some(v.into_owned()),
            "tag" => filter.tag = Some(v.into_owned()),
            "q" => filter.q = Some(v.into_owned()),
            "status" => {
                filter.status = Some(RunStatus::parse(&v).ok_or_else(|| {
                    AppError::BadRequest(format!(
                        "status {v:?} is not one of running, preempted, restarting, failed, finished"
                    ))
                })?);
            }
            "param" | "metric" => {
                if filter.param.len() + filter.metric.len() == MAX_PARAM_FILTERS {
                    return Err(AppError::BadRequest(format!(
                        "more than {MAX_PARAM_FILTERS} param= and metric= filters in one \
                         request; narrow the query (project=, tag=, status=) and filter the \
                         rest in the client"
                    )));
                }
                if k == "param" {
                    filter.param.push(v.into_owned());
                } else {
                    filter.metric.push(v.into_owned());
                }
            }
            "sort" => filter.sort = Some(v.into_owned()),
            "offset" => filter.offset = Some(number("offset", &v)?),
            "limit" => filter.limit = Some(number("limit", &v)?),
            "key" if keys => {
                check_key(&v)?;
                wanted.push(v.into_owned());
            }
            other => {
                let known = "project, tag, status, q, param=PATH=VALUE, metric=KEY<NUMBER, \
                             sort, offset, limit";
                let known = if keys {
                    format!("key, {known}")
                } else {
                    known.to_owned()
                };
                return Err(AppError::BadRequest(format!(
                    "unknown filter {other:?}; use {known}"
                )));
            }
        }
    }
    Ok((filter, wanted))
}

pub(crate) async fn list_runs(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, AppError> {
    let (filter, _) = run_filter(query, false)?;
    // The page, and how many runs the filter selects in all (a table's
    // scroll bar): `X-Total-Count`.
    let total = Arc::new(AtomicU64::new(0));
    let counted = total.clone();
    let mut answer = heavy(&state, move |s| {
        let runs = s.list_runs(&filter)?;
        let page_is_all =
            filter.offset.unwrap_or(0) == 0 && runs.len() < filter::limit(&filter) as usize;
        let n = if page_is_all {
            runs.len() as u64
        } else {
            s.count_runs(&filter)?
        };
        counted.store(n, Ordering::Relaxed);
        Ok(runs)
    })
    .await?;
    answer.headers_mut().insert(
        TOTAL_COUNT,
        HeaderValue::from(total.load(Ordering::Relaxed)),
    );
    Ok(answer)
}

/// `GET /keys`: the metric names of every run the filter selects (the
/// columns a runs table can show).
pub(crate) async fn metric_names(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, AppError> {
    let (filter, _) = run_filter(query, false)?;
    heavy(&state, move |s| s.metric_names(&filter)).await
}

/// `GET /latest?key=K...`: the newest value of each key in every run the
/// filter selects, in one request however many runs there are.
pub(crate) async fn latest_of_runs(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, AppError> {
    let (filter, keys) = run_filter(query, true)?;
    if keys.is_empty() || keys.len() > MAX_LATEST_KEYS {
        return Err(AppError::BadRequest(format!(
            "ask for 1 to {MAX_LATEST_KEYS} metrics with key=NAME (got {})",
            keys.len()
        )));
    }
    heavy(&state, move |s| s.latest_of_runs(&filter, &keys)).await
}

pub(crate) async fn ingest(
    State(state): State<AppState>,
    RunId(id): RunId,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Ack>, AppError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with(relaunch_api::batch::CONTENT_TYPE) {
        return Err(AppError::BadRequest(format!(
            "a batch must be sent as {}, not {content_type:?}",
            relaunch_api::batch::CONTENT_TYPE
        )));
    }
    let bytes = read_body(&state, &headers, body).await?;
    // Decoding and checking a batch of tens of MiB takes a while: not on
    // the async workers, where it would hold up every other request.
    let big = bytes.len() > BIG_BATCH;
    let (bytes, batch, has_logs) = if bytes.len() > DECODE_APART {
        tokio::task::spawn_blocking(move || decode_batch(&bytes).map(|(b, l)| (bytes, b, l)))
            .await
            .map_err(|e| AppError::Internal(format!("decoding task failed: {e}")))??
    } else {
        let (batch, has_logs) = decode_batch(&bytes)?;
        (bytes, batch, has_logs)
    };
    let alerts = state.alerts.clone().filter(|a| a.may_raise(&batch));
    // A big batch's decoded records are freed in this request's thread's
    // arena: trimmed once no heavy work is left (`trim.rs`).
    let heavy = big.then(|| state.heavy_reads.heavy_work());
    let ack = blocking(&state.storage, move |s| match alerts {
        None => s.ingest(&id, &batch, now()),
        Some(alerts) => {
            // Only records above the old watermark raise alerts: a batch
            // sent again raises nothing twice.
            let old = s.watermark(&id, &batch.writer)?;
            let ack = s.ingest(&id, &batch, now())?;
            alerts.raise(s, &id, &batch, old);
            Ok(ack)
        }
    })
    .await;
    // The body and the batch (dropped by the closure) are freed first.
    drop(bytes);
    drop(heavy);
    let ack = ack?;
    if has_logs {
        state.logs_changed.send_modify(|n| *n = n.wrapping_add(1));
    }
    Ok(Json(ack))
}

/// A batch body decoded and checked, and whether it holds console lines.
fn decode_batch(bytes: &[u8]) -> Result<(Batch, bool), AppError> {
    let batch =
        Batch::decode(bytes).map_err(|e| AppError::BadRequest(format!("malformed batch: {e}")))?;
    if batch.writer.is_empty() || batch.attempt_token.is_empty() {
        return Err(AppError::BadRequest(
            "a batch needs a writer id and an attempt token".into(),
        ));
    }
    check_name("writer id", &batch.writer)?;
    for (_, record) in &batch.records {
        match record {
            relaunch_api::Record::Metrics { values, .. } => {
                for (key, _) in values {
                    check_key(key)?;
                }
            }
            relaunch_api::Record::Event { kind, data, .. } => {
                let bad = AppError::BadRequest;
                relaunch_api::names::check_event_kind(kind).map_err(bad)?;
                relaunch_api::names::check_event_data(data).map_err(bad)?;
            }
            relaunch_api::Record::Log { .. } => {}
        }
    }
    let has_logs = batch
        .records
        .iter()
        .any(|(_, r)| matches!(r, relaunch_api::Record::Log { .. }));
    Ok((batch, has_logs))
}

#[derive(Deserialize)]
pub(crate) struct WatermarkQuery {
    writer: String,
}

pub(crate) async fn watermark(
    State(state): State<AppState>,
    RunId(id): RunId,
    query: Result<Query<WatermarkQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Ack>, AppError> {
    let Query(q) = query
        .map_err(|e| AppError::BadRequest(format!("{e}; a watermark needs ?writer=WRITER_ID")))?;
    let writer = q.writer.clone();
    let mark = blocking(&state.storage, move |s| s.watermark(&id, &writer)).await?;
    Ok(Json(Ack {
        writer: q.writer,
        watermark: mark,
    }))
}

pub(crate) async fn keys(
    State(state): State<AppState>,
    RunId(id): RunId,
) -> Result<Json<Vec<String>>, AppError> {
    Ok(Json(blocking(&state.storage, move |s| s.keys(&id)).await?))
}

/// Most buckets a series read may ask for.
const MAX_BUCKETS: u32 = 100_000;

pub(crate) async fn series(
    State(state): State<AppState>,
    RunId(id): RunId,
    query: Result<Query<SeriesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, AppError> {
    let Query(query) =
        query.map_err(|e| AppError::BadRequest(format!("{e}; a series needs ?key=NAME")))?;
    check_key(&query.key)?;
    if query.buckets == 0 || query.buckets > MAX_BUCKETS {
        return Err(AppError::BadRequest(format!(
            "buckets must be 1 to {MAX_BUCKETS}"
        )));
    }
    heavy(&state, move |s| s.series(&id, &query)).await
}

/// `GET /runs/{id}/history?key=K...&rank=&attempt=&min_step=&max_step=`:
/// every point of the keys asked (all of the run's when none), of one rank
/// or all, unsampled and exact, in the column format
/// (`relaunch_api::columns`): what a DataFrame is made of, 28 bytes a
/// point instead of JSON's ~100.
pub(crate) async fn history(
    State(state): State<AppState>,
    RunId(id): RunId,
    RawQuery(query): RawQuery,
) -> Result<Response, AppError> {
    let query =
        HistoryQuery::parse(query.as_deref().unwrap_or_default()).map_err(AppError::BadRequest)?;
    for key in &query.keys {
        check_key(key)?;
    }
    let body = state
        .heavy_reads
        .encoded(&state.storage, move |s| {
            let logged = s.latest(&id)?;
            for key in &query.keys {
                if !logged.iter().any(|l| &l.key == key) {
                    return Err(AppError::NotFound(format!(
                        "run {id} has no metric {key:?}; its keys are at GET /api/v1/runs/{id}/keys"
                    )));
                }
            }
            let mut body = Vec::new();
            let mut series = Vec::new();
            for l in logged {
                if (!query.keys.is_empty() && !query.keys.contains(&l.key))
                    || query.rank.is_some_and(|r| r != l.rank)
                {
                    continue;
                }
                let read = s.series(
                    &id,
                    &SeriesQuery {
                        key: l.key,
                        rank: Some(l.rank),
                        buckets: u32::MAX,
                        min_step: query.min_step,
                        max_step: query.max_step,
                        attempt: query.attempt,
                    },
                )?;
                if !read.points.is_empty() {
                    series.push(read);
                }
            }
            columns::start(&mut body, series.len() as u32);
            for read in series {
                columns::push_series(&mut body, &read.key, read.rank, &read.points);
            }
            Ok(body)
        })
        .await?;
    Ok(([(header::CONTENT_TYPE, columns::CONTENT_TYPE)], body).into_response())
}

pub(crate) async fn latest(
    State(state): State<AppState>,
    RunId(id): RunId,
) -> Result<Json<Vec<Latest>>, AppError> {
    Ok(Json(
        blocking(&state.storage, move |s| s.latest(&id)).await?,
    ))
}

#[derive(Deserialize)]
pub(crate) struct LogsQuery {
    rank: Option<u32>,
    #[serde(default)]
    after: u64,
    #[serde(default = "default_log_limit")]
    limit: u32,
    /// Seconds to wait for new lines when there are none (a follow).
    #[serde(default)]
    wait: f64,
    /// The last this many lines instead, at once (where a tail starts).
    tail: Option<u32>,
}

fn default_log_limit() -> u32 {
    10_000
}

pub(crate) async fn logs(
    State(state): State<AppState>,
    RunId(id): RunId,
    query: Result<Query<LogsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, AppError> {
    let Query(q) = query.map_err(|e| AppError::BadRequest(e.to_string()))?;
    if let Some(n) = q.tail {
        if q.after != 0 {
            return Err(AppError::BadRequest(
                "tail=N gives the last N lines and after=ID the lines after one: use one of them"
                    .into(),
            ));
        }
        return heavy(&state, move |s| s.log_tail(&id, q.rank, n)).await;
    }
    let wait = Duration::try_from_secs_f64(q.wait)
        .map_err(|_| {
            AppError::BadRequest(format!("wait {} is not a number of seconds >= 0", q.wait))
        })?
        .min(MAX_FOLLOW);
    let deadline = tokio::time::Instant::now() + wait;
    let mut changed = state.logs_changed.subscribe();
    loop {
        changed.mark_unchanged();
        let (id2, rank, after, limit) = (id.clone(), q.rank, q.after, q.limit);
        // The permit is held for each read only, never across the wait.
        let lines = state
            .heavy_reads
            .json(&state.storage, move |s| s.logs(&id2, rank, after, limit))
            .await?;
        let none = lines.as_ref() == b"[]";
        if !none
            || tokio::time::Instant::now() >= deadline
            || tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
        {
            return Ok(json_response(lines));
        }
    }
}

pub(crate) async fn events(
    State(state): State<AppState>,
    RunId(id): RunId,
) -> Result<Json<Vec<Event>>, AppError> {
    Ok(Json(
        blocking(&state.storage, move |s| s.events(&id)).await?,
    ))
}

/// `GET /runs/{id}/goodput`: where the run's time went (`goodput.rs`), at
/// the server's clock. A heavy read: it groups the run's chunk summaries
/// and may decode the chunks a resumed attempt redid.
pub(crate) async fn goodput(
    State(state): State<AppState>,
    RunId(id): RunId,
) -> Result<Response, AppError> {
    heavy(&state, move |s| {
        let timeline = s.timeline(&id)?;
        Ok(crate::goodput::compute(&id, &timeline, now()))
    })
    .await
}

pub(crate) async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("openapi.json"),
    )
}

pub(crate) async fn not_found() -> AppError {
    AppError::NotFound("no such API path; see /api/v1/openapi.json".into())
}

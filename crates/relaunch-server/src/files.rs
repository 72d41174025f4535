//! The handlers of a run's files and of the chunks they are made of.
//!
//! - `POST /chunks/missing`: which of these hashes are not stored (and
//!   whether this server takes chunks straight into its bucket);
//! - `PUT /chunks/{hash}`: one chunk, stored only if its BLAKE3 is `hash`;
//! - `POST /chunks/uploads`: presigned URLs to send missing chunks straight
//!   to the bucket (`--blobs s3://...`), each bound to the chunk's SHA-256,
//!   which the bucket checks; a commit confirms them (size and SHA-256, as
//!   the bucket says) before the manifest is stored, and those never
//!   confirmed are deleted after a grace period ([`collect_unconfirmed`]);
//! - `POST /runs/{id}/files`: commit a file as its list of chunks, all of
//!   which must be stored; the file becomes visible whole, at once;
//! - `GET /runs/{id}/files`: the run's files;
//! - `GET /runs/{id}/files/{name}`: the bytes, streamed chunk by chunk, with
//!   `Range` support (a download resumes where it stopped);
//! - `PUT /runs/{id}/files/{name}`: a plain streaming upload (`curl -T`):
//!   the body goes to a scratch file, is cut into chunks like the client
//!   does, and committed; memory stays bounded whatever its size.

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use relaunch_api::files::{CHUNK_MAX, MAX_MISSING_QUERY, check_file_name, check_hash};
use relaunch_api::{
    ChunkQuery, ChunkRef, ChunkUploads, DirectChunk, FileInfo, FileManifest, MissingChunks,
    UploadQuery,
};

use crate::AppState;
use crate::api::{RunId, json_body, now};
use crate::body::read_limited;
use crate::error::AppError;
use crate::names::check_name;
use crate::storage::StorageError;
use crate::storage::blobs::{BlobStore, DirBlobs};
use crate::storage::s3::S3Blobs;
use crate::storage::sqlite::Durability;

/// Where files' bytes go: the chunks, and a scratch directory for plain
/// uploads being received.
#[derive(Clone)]
pub struct FileStore {
    blobs: Arc<dyn BlobStore>,
    scratch: PathBuf,
    /// Set when clients may send chunks straight to the bucket.
    direct: Option<Direct>,
}

/// How chunks sent straight to the bucket are handed out and collected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Direct {
    /// How long a presigned URL works.
    pub expires: Duration,
    /// How long a chunk handed out and never confirmed by a commit stays
    /// in the bucket; longer than `expires`, so no upload in flight loses one.
    pub grace: Duration,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore")
            .field("scratch", &self.scratch)
            .finish_non_exhaustive()
    }
}

impl FileStore {
    /// `blobs`, with plain uploads received into `scratch` (created; what an
    /// interrupted upload left there is removed).
    pub fn new(blobs: Arc<dyn BlobStore>, scratch: PathBuf) -> Result<Self, StorageError> {
        std::fs::create_dir_all(&scratch).map_err(|e| {
            StorageError::Backend(format!("cannot create {}: {e}", scratch.display()))
        })?;
        if let Ok(entries) = std::fs::read_dir(&scratch) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(Self {
            blobs,
            scratch,
            direct: None,
        })
    }

    /// Hands clients URLs to send chunks straight to the bucket, when the
    /// chunk store takes them (S3); `None` keeps every chunk going
    /// through the server. Refuses a grace period not longer than the
    /// URLs' life.
    pub fn with_direct(mut self, direct: Option<Direct>) -> Result<Self, StorageError> {
        if let Some(d) = direct
            && d.grace <= d.expires
        {
            return Err(StorageError::Invalid(format!(
                "the grace period for unconfirmed chunks ({:?}) must be longer than an upload \
                 URL's life ({:?}), or uploads in flight would lose their chunks",
                d.grace, d.expires
            )));
        }
        self.direct = direct.filter(|_| self.blobs.takes_direct());
        Ok(self)
    }

    /// Chunks in an S3-compatible bucket (`--blobs s3://BUCKET/PREFIX`,
    /// see [`S3Blobs::open`]), scratch in `data_dir/uploads`.
    pub fn open_s3(
        url: &str,
        endpoint: Option<&str>,
        data_dir: &std::path::Path,
    ) -> Result<Self, StorageError> {
        let blobs = Arc::new(S3Blobs::open(url, endpoint, std::env::vars())?);
        Self::new(blobs, data_dir.join("uploads"))
    }

    /// The embedded default: chunks in `data_dir/chunks`, scratch in
    /// `data_dir/uploads`.
    pub fn open_dir(
        data_dir: &std::path::Path,
        durability: Durability,
    ) -> Result<Self, StorageError> {
        let blobs = Arc::new(DirBlobs::open(data_dir, durability)?);
        Self::new(blobs, data_dir.join("uploads"))
    }
}

async fn on_blobs<T: Send + 'static>(
    files: &FileStore,
    f: impl FnOnce(&dyn BlobStore) -> Result<T, StorageError> + Send + 'static,
) -> Result<T, AppError> {
    let blobs = files.blobs.clone();
    tokio::task::spawn_blocking(move || f(blobs.as_ref()))
        .await
        .map_err(|e| AppError::Internal(format!("chunk store task failed: {e}")))?
        .map_err(AppError::from)
}

pub(crate) async fn missing(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<MissingChunks>, AppError> {
    let bytes = read_limited(
        &state.body_budget,
        &headers,
        body,
        state.max_request_bytes,
        "ask about fewer chunks at a time",
    )
    .await?;
    let query: ChunkQuery = json_body(&bytes, "the chunk query")?;
    if query.chunks.len() > MAX_MISSING_QUERY {
        return Err(AppError::TooLarge(format!(
            "{} hashes in one query; ask about at most {MAX_MISSING_QUERY} at a time",
            query.chunks.len()
        )));
    }
    for hash in &query.chunks {
        check_hash(hash).map_err(AppError::BadRequest)?;
    }
    let direct = state.files.direct.is_some();
    let missing = missing_of(&state, query.chunks).await?;
    Ok(Json(MissingChunks { missing, direct }))
}

/// Those of `hashes` not stored, and, where chunks go straight to the
/// bucket, those sent there but not yet confirmed by a commit (they serve
/// no one's dedup until then), in the order asked.
async fn missing_of(state: &AppState, hashes: Vec<String>) -> Result<Vec<String>, AppError> {
    let pending: std::collections::HashSet<String> = if state.files.direct.is_some() {
        let asked = hashes.clone();
        crate::api::blocking(&state.storage, move |s| s.pending_chunks(&asked))
            .await?
            .into_iter()
            .map(|c| c.hash)
            .collect()
    } else {
        Default::default()
    };
    let absent: std::collections::HashSet<String> = {
        let asked = hashes.clone();
        on_blobs(&state.files, move |b| b.missing(&asked))
            .await?
            .into_iter()
            .collect()
    };
    Ok(hashes
        .into_iter()
        .filter(|h| absent.contains(h) || pending.contains(h))
        .collect())
}

/// `POST /chunks/uploads`: a presigned URL for each of the asked chunks
/// that is still missing, bound to its SHA-256; those already stored get
/// none (nothing stored is ever overwritten through a URL).
pub(crate) async fn uploads(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ChunkUploads>, AppError> {
    let Some(direct) = state.files.direct else {
        return Err(AppError::Conflict(
            "this server takes chunks itself, not straight into a bucket: send each with \
             PUT /api/v1/chunks/HASH (its /chunks/missing answer says \"direct\": false)"
                .into(),
        ));
    };
    let bytes = read_limited(
        &state.body_budget,
        &headers,
        body,
        state.max_request_bytes,
        "ask for fewer chunks at a time",
    )
    .await?;
    let query: UploadQuery = json_body(&bytes, "the upload query")?;
    if query.chunks.len() > MAX_MISSING_QUERY {
        return Err(AppError::TooLarge(format!(
            "{} chunks in one query; ask for at most {MAX_MISSING_QUERY} at a time",
            query.chunks.len()
        )));
    }
    for chunk in &query.chunks {
        check_direct_chunk(chunk).map_err(AppError::BadRequest)?;
    }
    // Recorded as pending before the bucket is asked whether they are
    // there: a commit that stores one meanwhile removes its row, so the
    // collector never deletes a chunk some file holds. Those found stored
    // get no URL (nothing stored is overwritten through one) and lose the
    // row again.
    let mut seen = std::collections::HashSet::new();
    let asked: Vec<DirectChunk> = query
        .chunks
        .into_iter()
        .filter(|c| seen.insert(c.hash.clone()))
        .collect();
    let hashes: Vec<String> = asked.iter().map(|c| c.hash.clone()).collect();
    let handed = now();
    let before: std::collections::HashSet<String> = {
        let (pend, hashes) = (asked.clone(), hashes.clone());
        crate::api::blocking(&state.storage, move |s| {
            let before = s.pending_chunks(&hashes)?;
            s.pend_chunks(&pend, handed)?;
            Ok(before)
        })
        .await?
        .into_iter()
        .map(|c| c.hash)
        .collect()
    };
    // One trip to the bucket's thread: which are there, and URLs for the rest.
    let expires = direct.expires;
    let (uploads, stored) = on_blobs(&state.files, move |b| {
        let absent: std::collections::HashSet<String> = b.missing(&hashes)?.into_iter().collect();
        let (wanted, stored): (Vec<DirectChunk>, Vec<DirectChunk>) = asked
            .into_iter()
            .partition(|c| absent.contains(&c.hash) || before.contains(&c.hash));
        Ok((b.presign(&wanted, expires)?, stored))
    })
    .await?;
    if !stored.is_empty() {
        let stored: Vec<String> = stored.into_iter().map(|c| c.hash).collect();
        let until = handed + 1e-3;
        crate::api::blocking(&state.storage, move |s| s.drop_stale_chunks(&stored, until)).await?;
    }
    Ok(Json(ChunkUploads {
        uploads,
        expires_in: expires.as_secs(),
    }))
}

/// A chunk to be sent straight to the bucket: a hash, a size a chunk can
/// have, and a SHA-256 as base64 (44 characters, 32 bytes).
fn check_direct_chunk(chunk: &DirectChunk) -> Result<(), String> {
    use base64::Engine as _;
    check_hash(&chunk.hash)?;
    if chunk.size == 0 || chunk.size > CHUNK_MAX as u64 {
        return Err(format!(
            "chunk {} has size {}; chunks are 1 to {CHUNK_MAX} bytes",
            chunk.hash, chunk.size
        ));
    }
    match base64::engine::general_purpose::STANDARD.decode(&chunk.sha256) {
        Ok(sum) if sum.len() == 32 => Ok(()),
        _ => Err(format!(
            "chunk {}: sha256 {:?} is not a SHA-256 in base64 (44 characters, as S3's \
             x-amz-checksum-sha256)",
            chunk.hash, chunk.sha256
        )),
    }
}

/// Deletes, every so often, the chunks handed out for the bucket that no
/// commit confirmed within the grace period. Runs while the server does.
pub async fn collect_unconfirmed(state: AppState) {
    let Some(direct) = state.files.direct else {
        return;
    };
    let every = (direct.grace / 8).clamp(Duration::from_millis(200), Duration::from_secs(600));
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = collect_once(&state, direct.grace).await {
            tracing::warn!(error = %e, "cannot collect unconfirmed chunks; will try again");
        }
    }
}

/// One round of [`collect_unconfirmed`]; returns how many were deleted.
pub async fn collect_once(state: &AppState, grace: Duration) -> Result<usize, AppError> {
    let before = now() - grace.as_secs_f64();
    let mut deleted = 0;
    loop {
        let stale =
            crate::api::blocking(&state.storage, move |s| s.stale_chunks(before, 1000)).await?;
        if stale.is_empty() {
            return Ok(deleted);
        }
        let n = stale.len();
        let gone = stale.clone();
        on_blobs(&state.files, move |b| b.remove_unconfirmed(&gone)).await?;
        crate::api::blocking(&state.storage, move |s| s.drop_stale_chunks(&stale, before)).await?;
        tracing::info!(
            chunks = n,
            "deleted chunks sent to the bucket and never committed"
        );
        deleted += n;
        if n < 1000 {
            return Ok(deleted);
        }
    }
}

pub(crate) async fn put_chunk(
    State(state): State<AppState>,
    Path(hash): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, AppError> {
    check_hash(&hash).map_err(AppError::BadRequest)?;
    let data = read_limited(
        &state.body_budget,
        &headers,
        body,
        CHUNK_MAX,
        "a chunk is at most 4 MiB: cut files as relaunch's client does (FastCDC: min 256 KiB, \
         average 1 MiB, max 4 MiB)",
    )
    .await?;
    let actual = blake3::hash(&data).to_hex();
    if actual.as_str() != hash {
        return Err(AppError::BadRequest(format!(
            "the chunk's BLAKE3 is {actual}, not the {hash} it was sent as: it was damaged on \
             the way; send it again"
        )));
    }
    // The budget's share is held until the chunk is stored.
    let bytes = Bytes::clone(&data);
    on_blobs(&state.files, move |b| b.put_new(&hash, bytes)).await?;
    drop(data);
    Ok(StatusCode::NO_CONTENT)
}

/// The file path of `/runs/{id}/files/{*name}`, checked.
pub(crate) struct RunFile {
    run: String,
    name: String,
}

impl<S: Send + Sync> FromRequestParts<S> for RunFile {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let Path((run, name)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                AppError::BadRequest(format!(
                    "the run id or file name in the path is not valid: {}",
                    e.body_text()
                ))
            })?;
        check_name("run id", &run)?;
        check_file_name(&name).map_err(AppError::BadRequest)?;
        Ok(Self { run, name })
    }
}

pub(crate) async fn commit(
    State(state): State<AppState>,
    RunId(run): RunId,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<FileInfo>), AppError> {
    let bytes = read_limited(
        &state.body_budget,
        &headers,
        body,
        state.max_request_bytes,
        "a manifest that large is a file of millions of chunks; restart the server with a larger \
         --max-request-bytes",
    )
    .await?;
    let manifest: FileManifest = json_body(&bytes, "the file manifest")?;
    check_manifest(&manifest)?;
    // Chunks sent straight to the bucket and not yet confirmed: the bucket
    // must hold each with the size and SHA-256 it was handed out for.
    let mut direct_chunks = false;
    if state.files.direct.is_some() {
        let hashes: Vec<String> = manifest.chunks.iter().map(|c| c.hash.clone()).collect();
        let pending =
            crate::api::blocking(&state.storage, move |s| s.pending_chunks(&hashes)).await?;
        direct_chunks = !pending.is_empty();
        let confirmed = on_blobs(&state.files, {
            let pending = pending.clone();
            move |b| b.confirm(&pending)
        })
        .await?;
        if let Some((chunk, why)) = pending
            .iter()
            .zip(confirmed)
            .find_map(|(c, why)| why.map(|w| (c, w)))
        {
            return Err(AppError::Conflict(format!(
                "{why}; the file is not committed: ask POST /api/v1/chunks/missing again and \
                 send what it names (chunk {} of {} in the manifest)",
                chunk.hash,
                manifest.chunks.len()
            )));
        }
    }
    let chunks = manifest.chunks.clone();
    let declared = manifest.blake3.clone();
    // Every chunk stored, with the size the manifest says (so the file
    // serves exactly `size` bytes), the whole hashing to the declared
    // BLAKE3, and durable before the manifest names it (one flush for all
    // of them).
    let checked = on_blobs(&state.files, move |b| {
        let hashes: Vec<String> = chunks.iter().map(|c| c.hash.clone()).collect();
        let sizes = b.sizes(&hashes)?;
        let mut missing = Vec::new();
        for (index, (chunk, size)) in chunks.iter().zip(sizes).enumerate() {
            match size {
                None => missing.push(chunk.hash.clone()),
                Some(stored) if stored != chunk.size => {
                    return Ok(Err(AppError::BadRequest(format!(
                        "chunk {index} ({}) is declared as {} bytes, but the stored chunk with \
                         that hash holds {stored}; the manifest is wrong: list each chunk with \
                         the size of its bytes",
                        chunk.hash, chunk.size
                    ))));
                }
                Some(_) => {}
            }
        }
        if !missing.is_empty() {
            return Ok(Ok(missing));
        }
        // A file of several chunks is read whole once, here, so a manifest
        // whose whole-file BLAKE3 is not its bytes' is refused now rather
        // than served as a cut body later. (One chunk or none: checked in
        // `check_manifest` without reading.)
        // A file with chunks sent straight to the bucket is not read back
        // (that would cost the server the bytes it was spared): its whole
        // BLAKE3 is checked by every download as it streams.
        if hashes.len() > 1 && !direct_chunks {
            let actual = whole_hash(b, &hashes)?;
            if actual.as_str() != declared {
                return Ok(Err(AppError::BadRequest(format!(
                    "the file's blake3 is declared as {declared}, but its {} chunks hash to \
                     {actual} as a whole; commit the BLAKE3 of the whole file",
                    hashes.len()
                ))));
            }
        }
        b.persist(&hashes)?;
        Ok(Ok(missing))
    })
    .await?;
    let missing = checked?;
    if !missing.is_empty() {
        return Err(AppError::Conflict(format!(
            "{} of the file's {} chunks are not on the server (the first: {}); upload them with \
             PUT /api/v1/chunks/HASH, then commit again",
            missing.len(),
            manifest.chunks.len(),
            missing[0]
        )));
    }
    let info = crate::api::blocking(&state.storage, move |s| {
        s.commit_file(&run, &manifest, now())
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// Chunks read at once when a committed file is hashed whole: the reads of
/// a bucket overlap, and at most this many chunks are held.
const READ_AHEAD: usize = 8;

/// The BLAKE3 of the chunks `hashes` one after the other: read
/// [`READ_AHEAD`] at a time, hashed in order on every core.
fn whole_hash(b: &dyn BlobStore, hashes: &[String]) -> Result<String, StorageError> {
    let mut whole = blake3::Hasher::new();
    for window in hashes.chunks(READ_AHEAD) {
        let read: Vec<Result<Vec<u8>, StorageError>> = std::thread::scope(|s| {
            let reads: Vec<_> = window.iter().map(|h| s.spawn(move || b.get(h))).collect();
            reads
                .into_iter()
                .map(|r| {
                    r.join().unwrap_or_else(|_| {
                        Err(StorageError::Backend("a chunk read panicked".into()))
                    })
                })
                .collect()
        });
        for data in read {
            whole.update_rayon(&data?);
        }
    }
    Ok(whole.finalize().to_hex().to_string())
}

fn check_manifest(manifest: &FileManifest) -> Result<(), AppError> {
    let bad = AppError::BadRequest;
    check_file_name(&manifest.name).map_err(bad)?;
    check_hash(&manifest.blake3).map_err(|e| bad(format!("the file's blake3: {e}")))?;
    let mut total: u64 = 0;
    for chunk in &manifest.chunks {
        check_hash(&chunk.hash).map_err(bad)?;
        if chunk.size == 0 || chunk.size > CHUNK_MAX as u64 {
            return Err(bad(format!(
                "chunk {} has size {}; chunks are 1 to {CHUNK_MAX} bytes",
                chunk.hash, chunk.size
            )));
        }
        total = total.saturating_add(chunk.size);
    }
    if total != manifest.size {
        return Err(bad(format!(
            "the chunks add up to {total} bytes, but the file's size is {}; the manifest is \
             inconsistent",
            manifest.size
        )));
    }
    // A file of one chunk (or none) is that chunk's bytes: its hash is the
    // chunk's, known without reading anything. Longer files are read whole
    // once their chunks are all stored (`commit`).
    let whole = match manifest.chunks.as_slice() {
        [] => Some(blake3::hash(b"").to_hex().to_string()),
        [only] => Some(only.hash.clone()),
        _ => None,
    };
    if let Some(whole) = whole
        && whole != manifest.blake3
    {
        return Err(bad(format!(
            "the file's blake3 is declared as {}, but its bytes hash to {whole}; commit the \
             BLAKE3 of the whole file",
            manifest.blake3
        )));
    }
    Ok(())
}

pub(crate) async fn list(
    State(state): State<AppState>,
    RunId(run): RunId,
) -> Result<Json<Vec<FileInfo>>, AppError> {
    Ok(Json(
        crate::api::blocking(&state.storage, move |s| s.files(&run)).await?,
    ))
}

/// `DELETE /runs/{id}/files/{name}`: the file leaves the run (its chunks
/// stay: other files may share them); the answer is what it was.
pub(crate) async fn delete(
    State(state): State<AppState>,
    RunFile { run, name }: RunFile,
) -> Result<Json<FileInfo>, AppError> {
    Ok(Json(
        crate::api::blocking(&state.storage, move |s| {
            s.delete_file(&run, &name, crate::api::now())
        })
        .await?,
    ))
}

/// The byte range a `Range` header asks for, inclusive; `None` for the
/// whole file (no header, or one we do not serve partially: several ranges).
fn parse_range(value: &str, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let (start, end) = spec.split_once('-').ok_or(())?;
    let (start, end) = (start.trim(), end.trim());
    let range = if start.is_empty() {
        let suffix: u64 = end.parse().map_err(|_| ())?;
        if suffix == 0 || size == 0 {
            return Err(());
        }
        (size.saturating_sub(suffix), size - 1)
    } else {
        let start: u64 = start.parse().map_err(|_| ())?;
        let end = if end.is_empty() {
            size.saturating_sub(1)
        } else {
            end.parse::<u64>()
                .map_err(|_| ())?
                .min(size.saturating_sub(1))
        };
        if start >= size || end < start {
            return Err(());
        }
        (start, end)
    };
    Ok(Some(range))
}

pub(crate) async fn download(
    State(state): State<AppState>,
    RunFile { run, name }: RunFile,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    let (info, chunks) = {
        let name = name.clone();
        crate::api::blocking(&state.storage, move |s| s.file(&run, &name)).await?
    };
    let size = info.size;
    let range = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        Some(value) => match parse_range(value, size) {
            Ok(range) => range,
            Err(()) => {
                let mut response = AppError::RangeNotSatisfiable(format!(
                    "range {value:?} is not within the file's {size} bytes"
                ))
                .into_response();
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    response.headers_mut().insert(header::CONTENT_RANGE, v);
                }
                return Ok(response);
            }
        },
        None => None,
    };
    let (start, end) = range.unwrap_or((0, size.saturating_sub(1)));
    let length = if size == 0 { 0 } else { end - start + 1 };
    let body = if length == 0 {
        Body::empty()
    } else {
        Body::from_stream(chunk_stream(
            state.files.clone(),
            chunks,
            start,
            end,
            info.blake3.clone(),
        ))
    };
    let mut response = Response::new(body);
    *response.status_mut() = if range.is_some() {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(&name)),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", info.blake3)) {
        h.insert(header::ETAG, v);
    }
    if let Ok(v) = HeaderValue::from_str(&info.blake3) {
        h.insert("x-relaunch-blake3", v);
    }
    let base = name.rsplit('/').next().unwrap_or(&name);
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{base}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    if range.is_some()
        && let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{end}/{size}"))
    {
        h.insert(header::CONTENT_RANGE, v);
    }
    Ok(response)
}

/// What a file is served as: the images and videos the dashboard shows
/// (logged with `relaunch.Image` and `relaunch.Video`) as the image or
/// video they are; anything else as bytes, to be downloaded, never
/// rendered (no HTML or SVG a run could use to script the dashboard's
/// origin).
fn content_type(name: &str) -> &'static str {
    let lower = name.rsplit('.').next().unwrap_or("").to_ascii_lowercase();
    match lower.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        _ => "application/octet-stream",
    }
}

/// Bytes `start..=end` of a file, read one chunk at a time off the async
/// threads. A chunk that cannot be read, or whose length is not the one
/// its manifest says, ends the stream with an error (logged), so the client
/// sees a cut body, never wrong bytes. When the whole file is asked for, its
/// BLAKE3 is computed on the way and the last chunk is sent only if it is
/// `blake3`: a commit checked that, but a chunk store changed since (a disk
/// that rotted, a bucket written by hand) must still not pass as the file.
fn chunk_stream(
    files: FileStore,
    chunks: Vec<ChunkRef>,
    start: u64,
    end: u64,
    blake3: String,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    // The chunks that overlap the range, with their offsets in the file.
    let mut offset = 0u64;
    let mut wanted = Vec::new();
    for chunk in chunks {
        let (from, to) = (offset, offset + chunk.size);
        offset = to;
        if to > start && from <= end {
            wanted.push((from, chunk));
        }
    }
    let whole = (start == 0 && end + 1 == offset).then(blake3::Hasher::new);
    let fail = |chunk: &ChunkRef, message: String| {
        tracing::error!(chunk = %chunk.hash, error = %message, "a download stopped");
        std::io::Error::other(message)
    };
    futures_util::stream::unfold(
        (files, wanted.into_iter(), whole),
        move |(files, mut wanted, mut whole)| {
            let blake3 = blake3.clone();
            async move {
                let (from, chunk) = wanted.next()?;
                let hash = chunk.hash.clone();
                let data = match on_blobs(&files, move |b| b.get(&hash)).await {
                    Ok(data) if data.len() as u64 == chunk.size => data,
                    Ok(data) => {
                        let e = fail(
                            &chunk,
                            format!(
                                "chunk {} holds {} bytes, not the {} its file's manifest says",
                                chunk.hash,
                                data.len(),
                                chunk.size
                            ),
                        );
                        return Some((Err(e), (files, wanted, None)));
                    }
                    Err(e) => {
                        let e = fail(&chunk, e.to_string());
                        return Some((Err(e), (files, wanted, None)));
                    }
                };
                if let Some(hasher) = whole.as_mut() {
                    hasher.update(&data);
                    if wanted.len() == 0 {
                        let actual = hasher.finalize().to_hex();
                        if actual.as_str() != blake3 {
                            let e = fail(
                                &chunk,
                                format!(
                                    "the file's bytes hash to {actual}, not the {blake3} its \
                                 manifest says; upload the file again"
                                ),
                            );
                            return Some((Err(e), (files, wanted, None)));
                        }
                    }
                }
                let lo = start.saturating_sub(from) as usize;
                let hi = ((end + 1).min(from + chunk.size) - from) as usize;
                let piece = bytes::Bytes::from(data).slice(lo.min(hi)..hi);
                Some((Ok(piece), (files, wanted, whole)))
            }
        },
    )
}

pub(crate) async fn put_file(
    State(state): State<AppState>,
    RunFile { run, name }: RunFile,
    body: Body,
) -> Result<(StatusCode, Json<FileInfo>), AppError> {
    {
        let run = run.clone();
        crate::api::blocking(&state.storage, move |s| s.get_run(&run)).await?;
    }
    let scratch = state
        .files
        .scratch
        .join(format!("{}.part", uuid::Uuid::new_v4().simple()));
    let received = receive(body, scratch.clone()).await;
    let manifest = match received {
        Ok(()) => {
            let (files, path, name) = (state.files.clone(), scratch.clone(), name.clone());
            tokio::task::spawn_blocking(move || store_chunks(&files, &path, name))
                .await
                .map_err(|e| AppError::Internal(format!("chunking task failed: {e}")))
                .and_then(|r| r)
        }
        Err(e) => Err(e),
    };
    let _ = tokio::fs::remove_file(&scratch).await;
    let manifest = manifest?;
    let info = crate::api::blocking(&state.storage, move |s| {
        s.commit_file(&run, &manifest, now())
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// Writes the body to `path` as it arrives: memory stays bounded, and a
/// slow upload that keeps sending is never cut off.
async fn receive(mut body: Body, path: PathBuf) -> Result<(), AppError> {
    let mut file = tokio::fs::File::create(&path)
        .await
        .map_err(|e| AppError::Internal(format!("cannot create {}: {e}", path.display())))?;
    use tokio::io::AsyncWriteExt as _;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| AppError::BadRequest(format!("the upload was cut short: {e}")))?;
        if let Ok(data) = frame.into_data() {
            file.write_all(&data)
                .await
                .map_err(|e| AppError::Internal(format!("cannot write {}: {e}", path.display())))?;
        }
    }
    file.flush()
        .await
        .map_err(|e| AppError::Internal(format!("cannot write {}: {e}", path.display())))?;
    Ok(())
}

/// Cuts the file at `path` into chunks as the client does, stores the ones
/// not yet stored, and returns the manifest.
fn store_chunks(
    files: &FileStore,
    path: &std::path::Path,
    name: String,
) -> Result<FileManifest, AppError> {
    let file = File::open(path)
        .map_err(|e| AppError::Internal(format!("cannot read {}: {e}", path.display())))?;
    // `put` of a chunk already stored does nothing (and sends nothing).
    let manifest = relaunch_api::files::cut(BufReader::new(file), &name, |_, data, chunk| {
        files.blobs.put(&chunk.hash, data)?;
        Ok::<_, AppError>(())
    })?;
    let hashes: Vec<String> = manifest.chunks.iter().map(|c| c.hash.clone()).collect();
    files.blobs.persist(&hashes)?;
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_as_rfc_9110_reads_them() {
        assert_eq!(parse_range("bytes=0-99", 1000), Ok(Some((0, 99))));
        assert_eq!(parse_range("bytes=500-", 1000), Ok(Some((500, 999))));
        assert_eq!(parse_range("bytes=-100", 1000), Ok(Some((900, 999))));
        assert_eq!(parse_range("bytes=900-5000", 1000), Ok(Some((900, 999))));
        assert_eq!(parse_range("bytes=0-1,5-6", 1000), Ok(None));
        assert_eq!(parse_range("items=0-1", 1000), Ok(None));
        assert_eq!(parse_range("bytes=1000-", 1000), Err(()));
        assert_eq!(parse_range("bytes=5-1", 1000), Err(()));
        assert_eq!(parse_range("bytes=x-1", 1000), Err(()));
        assert_eq!(parse_range("bytes=-0", 1000), Err(()));
    }

    #[test]
    fn images_and_videos_are_served_as_themselves_and_anything_else_as_bytes() {
        assert_eq!(content_type("media/samples/3-ab.png"), "image/png");
        assert_eq!(content_type("a/b.JPG"), "image/jpeg");
        assert_eq!(content_type("media/clip/0-cd.gif"), "image/gif");
        assert_eq!(content_type("media/clip/0-cd.mp4"), "video/mp4");
        assert_eq!(content_type("media/clip/0-cd.WebM"), "video/webm");
        for name in ["page.html", "plot.svg", "run.js", "noext", "archive.tar"] {
            assert_eq!(content_type(name), "application/octet-stream", "{name}");
        }
    }
}

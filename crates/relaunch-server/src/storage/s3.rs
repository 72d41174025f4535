//! [`S3Blobs`]: file chunks as objects in an S3-compatible bucket
//! (`relaunch server --blobs s3://BUCKET/PREFIX`), one object per chunk at
//! `PREFIX/chunks/ab/HASH`.
//!
//! The client is Arrow's `object_store` (feature `aws`): one small crate
//! that speaks S3 to AWS and to every compatible service (SeaweedFS, MinIO,
//! Ceph, R2), with retries and exponential backoff for transient failures
//! built in, on the `reqwest` and `rustls` the workspace already builds.
//! The AWS SDK would bring its own HTTP stack and some fifty crates for
//! the five calls a chunk store needs (HEAD, PUT, GET, LIST, and the
//! credentials chain, which `object_store` reads from the same variables).
//!
//! `object_store` is async and the [`BlobStore`] trait is not: the handlers
//! call it on tokio's blocking threads. An [`S3Blobs`] owns a small
//! runtime of its own and blocks on it, so it works whatever runtime (or
//! none) calls it, and never blocks a thread that drives async tasks.
//!
//! What each step means here: a PUT is durable once S3 acknowledges it, so
//! a stored chunk is already what `persist` makes of a local one, and
//! `persist` has nothing to do. A commit checks every chunk's stored size
//! against what S3 itself said, never against what a client declares, so a
//! committed file never names a chunk that is not in the bucket.
//!
//! Clients may also send chunks straight here, through presigned PUT URLs
//! bound to each chunk's SHA-256, which the bucket checks
//! ([`BlobStore::presign`]); a commit confirms each with a HEAD that reads
//! back its size and SHA-256 ([`BlobStore::confirm`]).
//!
//! Over HTTPS a PUT's body is not hashed into its signature
//! (`UNSIGNED-PAYLOAD`, as the AWS CLI does there): TLS already protects
//! it, and SHA-256 of every byte was the server's largest cost. Over plain
//! HTTP (a local SeaweedFS or MinIO) it is signed, so the service refuses
//! bytes changed on the way. `AWS_UNSIGNED_PAYLOAD` overrides either.
//!
//! What S3 said is remembered: each chunk this process stored (its PUT
//! acknowledged) or found (a HEAD) is kept with its size in [`Known`], and
//! asked about again only once forgotten. relaunch deletes only chunks a
//! client was handed a URL for and that no commit confirmed within the
//! grace period, so what a commit confirmed stays there. An upload then costs one HEAD
//! (the client's question, which chunks are missing) and one PUT per new
//! chunk, where asking again before the PUT and at the commit cost two
//! HEADs more. Someone who
//! deletes chunk objects behind the servers' backs must restart them (a
//! read that finds one gone or damaged forgets it at once).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use futures_util::{StreamExt as _, TryStreamExt as _};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path;
use object_store::signer::{Method, SignedUrlOptions, Signer as _};
use object_store::{BackoffConfig, ClientConfigKey, ObjectStoreExt as _, PutPayload, RetryConfig};
use relaunch_api::{ChunkUpload, DirectChunk};

use super::StorageError;
use super::blobs::BlobStore;

/// The header a presigned PUT binds to the chunk's SHA-256: the bucket
/// refuses a body that does not have it (`BadDigest`).
pub const CHECKSUM_HEADER: &str = "x-amz-checksum-sha256";

/// HEAD requests in flight at once when many chunks are asked about
/// (`missing`, a commit's sizes): enough to hide the round trips, few
/// enough not to be throttled.
pub const HEADS_IN_FLIGHT: usize = 32;

/// Chunks [`Known`] holds before it forgets them all and starts again
/// (about 20 MiB of memory; a quarter of a million chunks of 1 MiB).
const KNOWN_MOST: usize = 250_000;

/// The chunks S3 has said are in the bucket, with their sizes: those this
/// process stored, and those a HEAD found. See the module docs.
#[derive(Default)]
struct Known(Mutex<HashMap<blake3::Hash, u64>>);

impl Known {
    fn get(&self, hash: &str) -> Option<u64> {
        let hash = blake3::Hash::from_hex(hash).ok()?;
        self.0.lock().ok()?.get(&hash).copied()
    }

    fn insert(&self, hash: &str, size: u64) {
        let (Ok(hash), Ok(mut known)) = (blake3::Hash::from_hex(hash), self.0.lock()) else {
            return;
        };
        if known.len() >= KNOWN_MOST {
            known.clear();
        }
        known.insert(hash, size);
    }

    /// After a read found the object gone or damaged: asked about again,
    /// so that deleting it and uploading the file again repairs it.
    fn forget(&self, hash: &str) {
        if let (Ok(hash), Ok(mut known)) = (blake3::Hash::from_hex(hash), self.0.lock()) {
            known.remove(&hash);
        }
    }
}

/// Retries of a request that failed for a reason that may pass (a dropped
/// connection, a 5xx, `SlowDown`): up to 6, backing off from 100 ms to
/// 5 s, within 30 s; then the request fails with 503.
fn request_retries() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: 6,
        retry_timeout: Duration::from_secs(30),
    }
}

/// At start, one retry within 5 s: a wrong endpoint is said at once.
fn start_retries() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 1,
        retry_timeout: Duration::from_secs(5),
    }
}

/// Chunks in an S3-compatible bucket. See the module docs.
pub struct S3Blobs {
    store: AmazonS3,
    /// `PREFIX/chunks`.
    chunks: Path,
    /// `s3://BUCKET/PREFIX`, for messages.
    url: String,
    /// `None` only while it is dropped.
    runtime: Option<tokio::runtime::Runtime>,
    /// Chunk objects written since open (`put` that found none).
    written: AtomicU64,
    known: Known,
    /// For the HEADs that read a chunk's checksum (`object_store` does not
    /// return it): presigned by the store, sent with this client.
    http: reqwest::Client,
}

impl std::fmt::Debug for S3Blobs {
    // Not the store's own: its configuration holds the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Blobs")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl S3Blobs {
    /// Opens `url` (`s3://BUCKET/PREFIX`; the prefix may be empty) at
    /// `endpoint` (else `AWS_ENDPOINT_URL`, else AWS), with the
    /// credentials and region of the `AWS_*` variables among `vars` (the
    /// process's environment, for the server), and checks that the bucket
    /// is there and these credentials may list and write it. A failure
    /// names what is wrong and the flag or variable that fixes it, never a
    /// secret.
    pub fn open(
        url: &str,
        endpoint: Option<&str>,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, StorageError> {
        let (bucket, prefix) = parse_url(url).map_err(StorageError::Invalid)?;
        let mut builder = AmazonS3Builder::new();
        let mut unsigned_given = false;
        for (key, value) in vars {
            if key.starts_with("AWS_")
                && let Ok(key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>()
            {
                unsigned_given |= key == AmazonS3ConfigKey::UnsignedPayload;
                builder = builder.with_config(key, value);
            }
        }
        let endpoint = endpoint
            .map(str::to_owned)
            .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::Endpoint));
        builder = builder
            .with_bucket_name(&bucket)
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                "5s",
            )
            .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "60s");
        if let Some(endpoint) = &endpoint {
            // A plain-HTTP endpoint named on purpose (a local SeaweedFS or MinIO).
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        if !unsigned_given {
            let tls = endpoint
                .as_deref()
                .is_none_or(|e| e.starts_with("https://"));
            builder = builder.with_unsigned_payload(tls);
        }
        let at = endpoint.as_deref().unwrap_or("AWS");
        let build = |retries: RetryConfig| {
            builder.clone().with_retry(retries).build().map_err(|e| {
                StorageError::Invalid(format!(
                    "--blobs {url}: cannot set up the S3 client for {at}: {e}"
                ))
            })
        };
        let store = build(request_retries())?;
        let probe = build(start_retries())?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("relaunch-s3")
            .enable_all()
            .build()
            .map_err(|e| {
                StorageError::Backend(format!("cannot start the S3 client's runtime: {e}"))
            })?;
        let chunks = prefix.clone().join("chunks");
        let url = format!("s3://{bucket}/{prefix}");
        // On a thread of its own: `open` may be called from async code,
        // where blocking on a runtime is not allowed.
        let handle = runtime.handle().clone();
        let checked = std::thread::scope(|s| {
            s.spawn(|| handle.block_on(check_bucket(&probe, &bucket, &prefix, &url, at)))
                .join()
        });
        let checked = checked.unwrap_or_else(|_| {
            Err(StorageError::Backend(format!(
                "--blobs {url}: the bucket check at {at} panicked"
            )))
        });
        if let Err(e) = checked {
            // Without waiting, as in `drop`: `open` may run on an async thread.
            runtime.shutdown_background();
            return Err(e);
        }
        tracing::info!(%url, endpoint = at, "chunks in S3");
        Ok(Self {
            store,
            chunks,
            url,
            runtime: Some(runtime),
            written: AtomicU64::new(0),
            known: Known::default(),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(60))
                .build()
                .map_err(|e| {
                    StorageError::Backend(format!("cannot set up the S3 checksum client: {e}"))
                })?,
        })
    }

    /// `s3://BUCKET/PREFIX`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// How many chunk objects this store has written since it was opened:
    /// a chunk already in the bucket is never sent again.
    pub fn objects_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    fn path(&self, hash: &str) -> Result<Path, StorageError> {
        relaunch_api::files::check_hash(hash).map_err(StorageError::Invalid)?;
        Ok(self.chunks.clone().join(&hash[..2]).join(hash))
    }

    fn block_on<T>(
        &self,
        work: impl Future<Output = Result<T, StorageError>>,
    ) -> Result<T, StorageError> {
        match &self.runtime {
            Some(runtime) => runtime.block_on(work),
            None => Err(StorageError::Backend("the S3 chunk store is closed".into())),
        }
    }

    /// The stored size of the object at `path`, `None` if there is none.
    async fn head(&self, path: &Path) -> Result<Option<u64>, StorageError> {
        match self.store.head(path).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(failure(&self.url, "look up", path, e)),
        }
    }

    /// The stored size of each of `hashes`, in order: from [`Known`], and
    /// for the others a HEAD, [`HEADS_IN_FLIGHT`] at a time.
    fn heads(&self, hashes: &[String]) -> Result<Vec<Option<u64>>, StorageError> {
        let mut sizes: Vec<Option<u64>> = hashes.iter().map(|h| self.known.get(h)).collect();
        let ask = hashes
            .iter()
            .zip(&sizes)
            .enumerate()
            .filter(|(_, (_, size))| size.is_none())
            .map(|(i, (h, _))| Ok((i, self.path(h)?)))
            .collect::<Result<Vec<_>, StorageError>>()?;
        let found: Vec<Option<u64>> = self.block_on(async {
            futures_util::stream::iter(ask.iter().map(|(_, p)| self.head(p)))
                .buffered(HEADS_IN_FLIGHT)
                .try_collect()
                .await
        })?;
        for ((i, _), size) in ask.iter().zip(found) {
            if let Some(size) = size {
                self.known.insert(&hashes[*i], size);
            }
            sizes[*i] = size;
        }
        Ok(sizes)
    }

    /// One PUT of chunk `hash`, remembered once S3 acknowledged it.
    fn write(&self, hash: &str, data: bytes::Bytes) -> Result<(), StorageError> {
        let path = self.path(hash)?;
        let size = data.len() as u64;
        self.block_on(async {
            self.store
                .put(&path, PutPayload::from(data))
                .await
                .map_err(|e| failure(&self.url, "store", &path, e))
        })?;
        self.written.fetch_add(1, Ordering::Relaxed);
        self.known.insert(hash, size);
        Ok(())
    }
}

impl S3Blobs {
    /// One presigned request for `path`, bound to the header `name: value`.
    async fn signed(
        &self,
        method: Method,
        path: &Path,
        expires: Duration,
        name: &'static str,
        value: &str,
    ) -> Result<String, StorageError> {
        let value = HeaderValue::from_str(value)
            .map_err(|_| StorageError::Invalid(format!("{value:?} cannot be a header value")))?;
        let options =
            SignedUrlOptions::default().with_signed_header(HeaderName::from_static(name), value);
        self.store
            .signed_url_opts(method, path, expires, &options)
            .await
            .map(|url| url.to_string())
            .map_err(|e| failure(&self.url, "sign a request for", path, e))
    }

    /// Whether `chunk` is in the bucket with its size and SHA-256, as the
    /// bucket says (a HEAD with `x-amz-checksum-mode: ENABLED`): `None` if
    /// so, else why not.
    async fn confirm_one(&self, chunk: &DirectChunk) -> Result<Option<String>, StorageError> {
        let path = self.path(&chunk.hash)?;
        if self.known.get(&chunk.hash) == Some(chunk.size) {
            return Ok(None); // this process stored it, or confirmed it
        }
        let mode = "x-amz-checksum-mode";
        let url = self
            .signed(
                Method::HEAD,
                &path,
                Duration::from_secs(300),
                mode,
                "ENABLED",
            )
            .await?;
        let response = self
            .http
            .head(&url)
            .header(mode, "ENABLED")
            .send()
            .await
            .map_err(|e| {
                StorageError::Unavailable(format!(
                    "cannot look up {path} in {}: {e}; the S3 service is unreachable, retry later",
                    self.url
                ))
            })?;
        let status = response.status();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(Some(format!(
                "chunk {} is not in the bucket: its PUT never arrived or was refused",
                chunk.hash
            )));
        }
        if matches!(status.as_u16(), 401 | 403) {
            return Err(StorageError::Backend(format!(
                "S3 refused to look up {path} in {} ({status}); check the server's credentials",
                self.url
            )));
        }
        if !status.is_success() {
            return Err(StorageError::Unavailable(format!(
                "cannot look up {path} in {}: {status}; retry later",
                self.url
            )));
        }
        let size = header("content-length").and_then(|v| v.parse::<u64>().ok());
        if size != Some(chunk.size) {
            return Ok(Some(format!(
                "chunk {} holds {} bytes in the bucket, not the {} it was sent as",
                chunk.hash,
                size.map_or_else(|| "an unknown number of".into(), |s| s.to_string()),
                chunk.size
            )));
        }
        match header(CHECKSUM_HEADER) {
            Some(sum) if sum == chunk.sha256 => {
                self.known.insert(&chunk.hash, chunk.size);
                Ok(None)
            }
            Some(sum) => Ok(Some(format!(
                "chunk {} has SHA-256 {sum} in the bucket, not the {} it was sent with",
                chunk.hash, chunk.sha256
            ))),
            None => Ok(Some(format!(
                "chunk {} is in the bucket without a SHA-256: it was not stored through a URL \
                 this server handed out",
                chunk.hash
            ))),
        }
    }
}

impl BlobStore for S3Blobs {
    fn missing(&self, hashes: &[String]) -> Result<Vec<String>, StorageError> {
        let sizes = self.heads(hashes)?;
        Ok(hashes
            .iter()
            .zip(sizes)
            .filter(|(_, size)| size.is_none())
            .map(|(hash, _)| hash.clone())
            .collect())
    }

    fn put(&self, hash: &str, data: &[u8]) -> Result<(), StorageError> {
        // Content-addressed: an object of the same length is this chunk
        // (the read checks it); one of another length was damaged and is
        // replaced.
        let size = Some(data.len() as u64);
        if self.known.get(hash) == size || self.size(hash)? == size {
            return Ok(());
        }
        self.write(hash, bytes::Bytes::copy_from_slice(data))
    }

    /// Without a HEAD first: the chunk was just reported missing to the
    /// client that sends it (at worst it is written twice, when two
    /// uploads race: the same bytes).
    fn put_new(&self, hash: &str, data: bytes::Bytes) -> Result<(), StorageError> {
        if self.known.get(hash) == Some(data.len() as u64) {
            return Ok(());
        }
        self.write(hash, data)
    }

    /// Always a HEAD: what S3 holds now (the store's checks use it).
    fn size(&self, hash: &str) -> Result<Option<u64>, StorageError> {
        let path = self.path(hash)?;
        let size = self.block_on(self.head(&path))?;
        if let Some(size) = size {
            self.known.insert(hash, size);
        }
        Ok(size)
    }

    fn sizes(&self, hashes: &[String]) -> Result<Vec<Option<u64>>, StorageError> {
        self.heads(hashes)
    }

    /// Nothing to do: S3 acknowledges a PUT once the object is durable.
    fn persist(&self, _hashes: &[String]) -> Result<(), StorageError> {
        Ok(())
    }

    fn takes_direct(&self) -> bool {
        true
    }

    fn presign(
        &self,
        chunks: &[DirectChunk],
        expires: Duration,
    ) -> Result<Vec<ChunkUpload>, StorageError> {
        self.block_on(async {
            let mut uploads = Vec::with_capacity(chunks.len());
            for chunk in chunks {
                let path = self.path(&chunk.hash)?;
                let url = self
                    .signed(Method::PUT, &path, expires, CHECKSUM_HEADER, &chunk.sha256)
                    .await?;
                uploads.push(ChunkUpload {
                    hash: chunk.hash.clone(),
                    url,
                    headers: [(CHECKSUM_HEADER.to_owned(), chunk.sha256.clone())].into(),
                });
            }
            Ok(uploads)
        })
    }

    fn confirm(&self, chunks: &[DirectChunk]) -> Result<Vec<Option<String>>, StorageError> {
        self.block_on(async {
            futures_util::stream::iter(chunks.iter().map(|c| self.confirm_one(c)))
                .buffered(HEADS_IN_FLIGHT)
                .try_collect()
                .await
        })
    }

    fn remove_unconfirmed(&self, hashes: &[String]) -> Result<(), StorageError> {
        let paths = hashes
            .iter()
            .map(|h| self.path(h))
            .collect::<Result<Vec<_>, _>>()?;
        for hash in hashes {
            self.known.forget(hash);
        }
        self.block_on(async {
            futures_util::stream::iter(paths.iter().map(|p| async move {
                match self.store.delete(p).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(failure(&self.url, "delete", p, e)),
                }
            }))
            .buffered(HEADS_IN_FLIGHT)
            .try_collect::<Vec<()>>()
            .await
        })?;
        Ok(())
    }

    fn get(&self, hash: &str) -> Result<Vec<u8>, StorageError> {
        let path = self.path(hash)?;
        let read = self.block_on(async {
            let fetched = match self.store.get(&path).await {
                Ok(fetched) => fetched,
                Err(object_store::Error::NotFound { .. }) => {
                    return Err(StorageError::Corrupt(format!(
                        "chunk {hash} of a committed file is missing from {} (object {path})",
                        self.url
                    )));
                }
                Err(e) => return Err(failure(&self.url, "read", &path, e)),
            };
            fetched
                .bytes()
                .await
                .map_err(|e| failure(&self.url, "read", &path, e))
        });
        let data = read.inspect_err(|e| {
            if matches!(e, StorageError::Corrupt(_)) {
                self.known.forget(hash);
            }
        })?;
        let actual = blake3::hash(&data).to_hex();
        if actual.as_str() != hash {
            self.known.forget(hash);
            return Err(StorageError::Corrupt(format!(
                "object {path} in {} holds {} bytes whose BLAKE3 is {actual}: it was damaged or \
                 overwritten in the bucket; delete it and upload the file again to repair it",
                self.url,
                data.len()
            )));
        }
        Ok(Vec::from(data))
    }
}

impl Drop for S3Blobs {
    fn drop(&mut self) {
        // Without waiting: a drop may happen on an async thread, where a
        // runtime may not block.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A request to S3 that failed after its retries: 503 (the service is
/// away or failing; clients retry), except a refusal, which retrying will
/// not mend.
fn failure(url: &str, what: &str, path: &Path, e: object_store::Error) -> StorageError {
    match e {
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => StorageError::Backend(format!(
            "S3 refused to {what} {path} in {url}: {e}; check the server's credentials \
             (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and the bucket's permissions"
        )),
        e => StorageError::Unavailable(format!(
            "cannot {what} {path} in {url}: {e}; the S3 service is unreachable or failing, \
             retry later"
        )),
    }
}

/// One HEAD and one tiny PUT (of `PREFIX/relaunch-write-check`) that
/// prove, before the server serves anything, that the service answers,
/// takes these credentials, and has the bucket, writable. (Not a LIST:
/// `object_store` does not say the status of a failed one, so a missing
/// bucket could not be told from a failing service.)
async fn check_bucket(
    store: &AmazonS3,
    bucket: &str,
    prefix: &Path,
    url: &str,
    at: &str,
) -> Result<(), StorageError> {
    let probe = prefix.clone().join("relaunch-write-check");
    let fail = |message: String| Err(StorageError::Invalid(format!("--blobs {url}: {message}")));
    match store.head(&probe).await {
        // Absent, or the bucket is (the PUT tells which).
        Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
        Err(
            e @ (object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }),
        ) => {
            return fail(format!(
                "{at} refused these credentials for bucket {bucket} ({e}); set \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY to a key that may read and write it"
            ));
        }
        Err(e) => {
            return fail(format!(
                "cannot reach the S3 service at {at} ({e}); check --s3-endpoint (or \
                 AWS_ENDPOINT_URL) and that the service is running"
            ));
        }
    }
    match store
        .put(&probe, PutPayload::from_static(b"relaunch"))
        .await
    {
        Ok(_) => Ok(()),
        Err(object_store::Error::NotFound { .. }) => fail(format!(
            "bucket {bucket} does not exist at {at}; create it (e.g. `aws s3 mb \
             s3://{bucket}`) or name another in --blobs"
        )),
        Err(
            e @ (object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }),
        ) => fail(format!(
            "bucket {bucket} at {at} cannot be written with these credentials ({e}); the \
             server stores chunks there: grant s3:PutObject on it, or set AWS_ACCESS_KEY_ID \
             and AWS_SECRET_ACCESS_KEY to a key that may"
        )),
        Err(e) => fail(format!("cannot write to bucket {bucket} at {at}: {e}")),
    }
}

/// `s3://BUCKET/PREFIX` as its bucket and its prefix (a valid object path,
/// possibly empty).
fn parse_url(url: &str) -> Result<(String, Path), String> {
    let Some(rest) = url.strip_prefix("s3://") else {
        return Err(format!(
            "--blobs {url}: give an S3 location as s3://BUCKET/PREFIX (for another \
             S3-compatible service, add --s3-endpoint URL)"
        ));
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let valid = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
        && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !valid {
        return Err(format!(
            "--blobs {url}: {bucket:?} is not a bucket name (3 to 63 lowercase letters, digits, \
             dots and hyphens, beginning and ending with a letter or digit)"
        ));
    }
    let prefix = prefix.trim_end_matches('/');
    let parsed = Path::parse(prefix).map_err(|e| {
        format!("--blobs {url}: the prefix {prefix:?} is not a valid object path: {e}")
    })?;
    Ok((bucket.to_owned(), parsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_are_checked_before_any_request() {
        let (bucket, prefix) = parse_url("s3://my-bucket/runs/team-a/").unwrap();
        assert_eq!(
            (bucket.as_str(), prefix.as_ref()),
            ("my-bucket", "runs/team-a")
        );
        let (bucket, prefix) = parse_url("s3://my.bucket").unwrap();
        assert_eq!((bucket.as_str(), prefix.as_ref()), ("my.bucket", ""));
        for (url, says) in [
            ("my-bucket/x", "s3://BUCKET/PREFIX"),
            ("https://host/b", "s3://BUCKET/PREFIX"),
            ("s3://", "not a bucket name"),
            ("s3://ab/x", "not a bucket name"),
            ("s3://My_Bucket/x", "not a bucket name"),
            ("s3://-bucket/x", "not a bucket name"),
            ("s3://bucket/a//b", "not a valid object path"),
            ("s3://bucket/a/../b", "not a valid object path"),
        ] {
            let err = parse_url(url).unwrap_err();
            assert!(err.contains(says), "{url}: {err}");
            assert!(err.starts_with(&format!("--blobs {url}:")), "{err}");
        }
    }
}

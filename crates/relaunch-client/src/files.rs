//! A run's files through the server's chunk store: [`upload`] sends only
//! the chunks the server lacks, several at a time, and commits the file's
//! manifest; [`download`] streams a file into a partial file beside its
//! destination, resumes it with a `Range` request, checks its BLAKE3 and
//! renames it into place. See `relaunch_api::files` for the protocol.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use relaunch_api::files::{Chunks, check_file_name};
use relaunch_api::{ChunkRef, ChunkUpload, DirectChunk, FileInfo, FileManifest};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::error::{ClientError, ErrorKind};
use crate::http::{BucketPut, Client};

/// Chunks in flight at once during an upload.
pub const PARALLEL: usize = 8;
/// Tries of one chunk before an upload gives up (the next upload resumes).
const TRIES: u32 = 5;
/// Chunks cut and hashed ahead of the senders (bounds the memory an upload
/// holds: about this many chunks, plus those in flight).
const AHEAD: usize = 16;
/// Most chunks asked about in one `POST /chunks/missing`.
const BATCH: usize = 256;

/// Called with (bytes done, bytes in all) as a transfer goes.
pub type Progress<'a> = dyn Fn(u64, u64) + Send + Sync + 'a;

/// What an upload did.
#[derive(Clone, Debug, PartialEq)]
pub struct Uploaded {
    pub file: FileInfo,
    /// Chunks the file is made of.
    pub chunks: usize,
    /// Of those, chunks sent (the server had the others).
    pub sent_chunks: usize,
    pub sent_bytes: u64,
}

/// What a download did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Downloaded {
    pub size: u64,
    pub blake3: String,
    /// Bytes a previous, interrupted download had already written.
    pub resumed_from: u64,
}

/// A chunk cut and hashed, on its way to the senders.
struct Hashed {
    chunk: ChunkRef,
    data: Bytes,
}

/// The file's size and modification time: an upload checks they did not
/// change while it read.
fn stamp(path: &Path, file: &File) -> Result<(u64, Option<SystemTime>), ClientError> {
    let meta = file.metadata().map_err(ClientError::io("stat", path))?;
    Ok((meta.len(), meta.modified().ok()))
}

/// Reads `file` once: one thread cuts it into chunks, another hashes each
/// chunk and the whole file, and the chunks go to `out` as they are ready.
/// Returns the file's size and BLAKE3.
fn cut_and_hash(
    path: &Path,
    file: File,
    out: mpsc::Sender<Hashed>,
) -> Result<(u64, String), ClientError> {
    let (pieces_tx, pieces_rx) = std::sync::mpsc::sync_channel(AHEAD);
    let hasher = std::thread::Builder::new()
        .name("relaunch-hash".into())
        .spawn(move || {
            let mut whole = blake3::Hasher::new();
            let mut size = 0u64;
            for data in pieces_rx {
                let data: Bytes = data;
                whole.update(&data);
                size += data.len() as u64;
                let chunk = ChunkRef {
                    hash: blake3::hash(&data).to_hex().to_string(),
                    size: data.len() as u64,
                };
                if out.blocking_send(Hashed { chunk, data }).is_err() {
                    break; // the upload stopped
                }
            }
            (size, whole.finalize().to_hex().to_string())
        })
        .map_err(|e| ClientError::Config(format!("cannot start a hashing thread: {e}")))?;
    let mut read = Ok(());
    for piece in Chunks::new(std::io::BufReader::with_capacity(0, file)) {
        match piece {
            Ok(piece) => {
                if pieces_tx.send(piece.data).is_err() {
                    break;
                }
            }
            Err(e) => {
                read = Err(ClientError::io("read", path)(e));
                break;
            }
        }
    }
    drop(pieces_tx);
    let hashed = hasher
        .join()
        .map_err(|_| ClientError::Config("the hashing thread panicked".into()));
    read?;
    hashed
}

/// Uploads the file at `path` as `name` in `run`: the file is read once,
/// cut into chunks and hashed as it goes; the server is asked which chunks
/// it lacks a batch at a time, and only those travel, [`PARALLEL`] at a
/// time, while the rest is still being read. The file appears on the
/// server whole once its manifest is committed. Run it again after an
/// interruption and it sends only what is still missing.
pub async fn upload(
    client: &Client,
    run: &str,
    path: &Path,
    name: &str,
    progress: &Progress<'_>,
) -> Result<Uploaded, ClientError> {
    let mode = DirectMode::from_env()?;
    let mut direct_used = false;
    match upload_once(client, run, path, name, progress, mode, &mut direct_used).await {
        // A chunk sent to the bucket was not there at the commit (collected,
        // or refused after the URL was handed out): ask and send again, once.
        Err(e) if direct_used && e.kind() == ErrorKind::Conflict => {
            tracing::info!(file = %name, error = %e, "uploading again what the bucket lacks");
            upload_once(client, run, path, name, progress, mode, &mut direct_used).await
        }
        other => other,
    }
}

/// How an upload sends chunks when the server offers its bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectMode {
    /// Straight to the bucket when the server offers it, through the
    /// server once the bucket cannot be reached (the default).
    Auto,
    /// Straight to the bucket, or fail.
    On,
    /// Always through the server.
    Off,
}

/// The variable that sets [`DirectMode`]: `auto` (or unset), `on`, `off`.
pub const DIRECT_ENV: &str = "RELAUNCH_DIRECT_UPLOADS";

impl DirectMode {
    pub fn from_env() -> Result<Self, ClientError> {
        match std::env::var(DIRECT_ENV).ok().as_deref().map(str::trim) {
            None | Some("" | "auto") => Ok(Self::Auto),
            Some("on" | "1" | "true" | "yes") => Ok(Self::On),
            Some("off" | "0" | "false" | "no") => Ok(Self::Off),
            Some(other) => Err(ClientError::Config(format!(
                "{DIRECT_ENV}={other:?}: give auto (straight to the server's bucket when it offers \
                 one), on (always; fail otherwise) or off (always through the server)"
            ))),
        }
    }
}

/// Set once a bucket could not be reached from this process: later chunks
/// go through the server (in `auto` mode).
static BUCKET_UNREACHABLE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Set once a chunk reached the bucket from this process.
static BUCKET_REACHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn bucket_unreachable(reason: &str) {
    if !BUCKET_UNREACHABLE.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            %reason,
            "cannot send chunks straight to the server's bucket; sending them through the \
             server from now on (set {DIRECT_ENV}=off to skip the attempt)"
        );
    }
}

/// SHA-256 of `data`, as base64 (S3's `x-amz-checksum-sha256`).
pub fn sha256_base64(data: &[u8]) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(data))
}

#[allow(clippy::too_many_arguments)]
async fn upload_once(
    client: &Client,
    run: &str,
    path: &Path,
    name: &str,
    progress: &Progress<'_>,
    mode: DirectMode,
    direct_used: &mut bool,
) -> Result<Uploaded, ClientError> {
    check_file_name(name).map_err(ClientError::Config)?;
    let file = File::open(path).map_err(ClientError::io("open", path))?;
    let before = stamp(path, &file)?;
    let total = before.0;
    let (tx, mut rx) = mpsc::channel(AHEAD);
    let cutter = {
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || cut_and_hash(&path, file, tx))
    };
    let mut chunks = Vec::new();
    let mut seen = HashSet::new();
    let mut sends: JoinSet<Result<u64, ClientError>> = JoinSet::new();
    let (mut done, mut sent_chunks, mut sent_bytes) = (0u64, 0usize, 0u64);
    progress(done, total);
    let mut finished = false;
    // Whether the server takes chunks straight into its bucket: its first
    // answer says.
    let mut server_direct: Option<bool> = None;
    while !finished || !sends.is_empty() {
        tokio::select! {
            biased;
            Some(joined) = sends.join_next(), if !sends.is_empty() => {
                done += sent(joined)?;
                progress(done, total);
            }
            first = rx.recv(), if !finished && sends.len() < PARALLEL => {
                let Some(first) = first else {
                    finished = true;
                    continue;
                };
                let mut batch = vec![first];
                while batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                // Each chunk asked about (and sent) once, however often the
                // file repeats it.
                let new: Vec<String> = batch
                    .iter()
                    .filter(|h| seen.insert(h.chunk.hash.clone()))
                    .map(|h| h.chunk.hash.clone())
                    .collect();
                let bucket_ok = match mode {
                    DirectMode::Off => false,
                    DirectMode::On => true,
                    DirectMode::Auto => !BUCKET_UNREACHABLE.load(std::sync::atomic::Ordering::Relaxed),
                };
                // Once the server said it takes chunks into its bucket, one
                // request asks what it lacks and gets their URLs at once.
                let mut missing: HashSet<String> = if new.is_empty() {
                    HashSet::new()
                } else if server_direct == Some(true) && bucket_ok {
                    new.iter().cloned().collect()
                } else {
                    let answer = client.missing_chunks(new).await?;
                    server_direct = Some(answer.direct);
                    if mode == DirectMode::On && !answer.direct && !answer.missing.is_empty() {
                        return Err(ClientError::Config(format!(
                            "{DIRECT_ENV}=on, but the server at {} takes chunks itself (it has \
                             no bucket, or was started with --no-direct-uploads); unset \
                             {DIRECT_ENV}",
                            client.url()
                        )));
                    }
                    answer.missing.into_iter().collect()
                };
                let mut urls: HashMap<String, (ChunkUpload, DirectChunk)> = HashMap::new();
                if server_direct == Some(true) && bucket_ok && !missing.is_empty() {
                    urls = direct_urls(client, &batch, &missing).await?;
                    // No URL: stored by now, nothing to send.
                    missing.retain(|h| urls.contains_key(h));
                    *direct_used |= !urls.is_empty();
                }
                for hashed in batch {
                    chunks.push(hashed.chunk.clone());
                    if missing.remove(&hashed.chunk.hash) {
                        while sends.len() >= PARALLEL {
                            if let Some(joined) = sends.join_next().await {
                                done += sent(joined)?;
                                progress(done, total);
                            }
                        }
                        sent_chunks += 1;
                        sent_bytes += hashed.chunk.size;
                        let client = client.clone();
                        let to_bucket = urls.remove(&hashed.chunk.hash);
                        sends.spawn(async move {
                            match to_bucket {
                                Some((upload, chunk)) => {
                                    send_direct(&client, upload, chunk, hashed.data, mode)
                                        .await?
                                }
                                None => send_chunk(&client, &hashed.chunk, hashed.data).await?,
                            }
                            Ok(hashed.chunk.size)
                        });
                    } else {
                        done += hashed.chunk.size;
                    }
                }
                progress(done, total);
            }
        }
    }
    let (size, blake3) = cutter
        .await
        .map_err(|e| ClientError::Config(format!("the chunking task failed: {e}")))??;
    let file = File::open(path).map_err(ClientError::io("open", path))?;
    if size != total || stamp(path, &file)? != before {
        return Err(ClientError::Corrupt(format!(
            "{} changed while it was being uploaded; upload it again once nothing writes to it",
            path.display()
        )));
    }
    let manifest = FileManifest {
        name: name.to_owned(),
        size,
        blake3,
        chunks,
    };
    let file = client.commit_file(run, &manifest).await?;
    Ok(Uploaded {
        file,
        chunks: manifest.chunks.len(),
        sent_chunks,
        sent_bytes,
    })
}

/// The bytes a finished chunk task sent, or why it failed.
fn sent(
    joined: Result<Result<u64, ClientError>, tokio::task::JoinError>,
) -> Result<u64, ClientError> {
    joined.map_err(|e| ClientError::Config(format!("a chunk upload task failed: {e}")))?
}

/// Sends one chunk, retrying what a retry can fix.
async fn send_chunk(client: &Client, chunk: &ChunkRef, data: Bytes) -> Result<(), ClientError> {
    let mut pause = Duration::from_millis(500);
    for attempt in 1..=TRIES {
        match client.put_chunk(&chunk.hash, data.clone()).await {
            Ok(()) => return Ok(()),
            Err(e)
                if attempt < TRIES
                    && matches!(
                        e.kind(),
                        ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::BadRequest
                    ) =>
            {
                // BadRequest: the server saw other bytes than we sent (a
                // damaged transfer); sending again is the fix.
                tracing::debug!(chunk = %chunk.hash, error = %e, attempt, "retrying a chunk");
                tokio::time::sleep(crate::http::retry_pause(pause, Some(&e))).await;
                pause = (pause * 2).min(Duration::from_secs(8));
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the last try returns")
}

/// URLs for those of `batch` in `wanted` that the server's bucket lacks,
/// each with the SHA-256 it is bound to (computed here, off the async
/// threads); the server gives none for chunks it has.
async fn direct_urls(
    client: &Client,
    batch: &[Hashed],
    wanted: &HashSet<String>,
) -> Result<HashMap<String, (ChunkUpload, DirectChunk)>, ClientError> {
    let todo: Vec<(ChunkRef, Bytes)> = batch
        .iter()
        .filter(|h| wanted.contains(&h.chunk.hash))
        .map(|h| (h.chunk.clone(), h.data.clone()))
        .collect();
    let sums = tokio::task::spawn_blocking(move || {
        let mut once = HashSet::new();
        todo.into_iter()
            .filter(|(c, _)| once.insert(c.hash.clone()))
            .map(|(c, data)| DirectChunk {
                sha256: sha256_base64(&data),
                hash: c.hash,
                size: c.size,
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| ClientError::Config(format!("a checksum task failed: {e}")))?;
    let mut by_hash: HashMap<String, DirectChunk> =
        sums.iter().map(|c| (c.hash.clone(), c.clone())).collect();
    let answer = client.chunk_uploads(sums).await?;
    Ok(answer
        .uploads
        .into_iter()
        .filter_map(|u| by_hash.remove(&u.hash).map(|c| (u.hash.clone(), (u, c))))
        .collect())
}

/// Sends one chunk straight to the bucket through its presigned URL:
/// again after a damaged transfer or a failure that may pass, with a new
/// URL once its time ran out, and through the server instead when the
/// bucket cannot be reached or refuses it (`auto`).
async fn send_direct(
    client: &Client,
    mut upload: ChunkUpload,
    chunk: DirectChunk,
    data: Bytes,
    mode: DirectMode,
) -> Result<(), ClientError> {
    let mut pause = Duration::from_millis(500);
    let through_server = ChunkRef {
        hash: chunk.hash.clone(),
        size: chunk.size,
    };
    for attempt in 1..=TRIES {
        let outcome = client.put_to_bucket(&upload, data.clone()).await;
        let reason = match outcome {
            BucketPut::Stored => {
                BUCKET_REACHED.store(true, std::sync::atomic::Ordering::Relaxed);
                return Ok(());
            }
            BucketPut::Expired => {
                let fresh = client.chunk_uploads(vec![chunk.clone()]).await?;
                match fresh.uploads.into_iter().next() {
                    Some(fresh) => upload = fresh,
                    None => return Ok(()), // stored meanwhile
                }
                continue;
            }
            // Never reached from here (a firewall, a proxy, a private
            // endpoint): through the server. Once reached, losing it is an
            // outage, waited out like the server's.
            BucketPut::Unreachable(reason) | BucketPut::Refused(reason)
                if mode == DirectMode::Auto
                    && !BUCKET_REACHED.load(std::sync::atomic::Ordering::Relaxed) =>
            {
                bucket_unreachable(&reason);
                return send_chunk(client, &through_server, data).await;
            }
            BucketPut::Refused(reason) if mode == DirectMode::On => {
                return Err(ClientError::Config(format!(
                    "the server's bucket refused chunk {} ({reason}); unset {DIRECT_ENV} to send \
                     it through the server",
                    chunk.hash
                )));
            }
            BucketPut::Damaged(reason)
            | BucketPut::Failed(reason)
            | BucketPut::Unreachable(reason)
            | BucketPut::Refused(reason) => reason,
        };
        if attempt == TRIES {
            return Err(ClientError::Bucket {
                url: bucket_of(&upload.url),
                reason: format!(
                    "chunk {} not stored after {TRIES} tries: {reason}",
                    chunk.hash
                ),
            });
        }
        tracing::debug!(chunk = %chunk.hash, %reason, attempt, "sending a chunk to the bucket again");
        tokio::time::sleep(crate::http::retry_pause(pause, None)).await;
        pause = (pause * 2).min(Duration::from_secs(8));
    }
    // Only a URL that expired on the last try ends here.
    Err(ClientError::Bucket {
        url: bucket_of(&upload.url),
        reason: format!(
            "chunk {}: {TRIES} URLs in a row expired before the bucket saw them; is this \
             machine's clock or the server's far off?",
            chunk.hash
        ),
    })
}

/// The bucket's address in a presigned URL, without the signature.
fn bucket_of(url: &str) -> String {
    url.split('?').next().unwrap_or(url).to_owned()
}

/// The partial file a download of `dest` writes into.
pub fn partial_path(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".relaunch-part");
    dest.with_file_name(name)
}

/// Downloads `name` of `run` to `dest`. Bytes go to a partial file beside
/// it (resumed with a `Range` request if an earlier download left one),
/// whose BLAKE3 is checked against the server's before it is renamed to
/// `dest`: `dest` is either absent, the old file, or the whole new one.
pub async fn download(
    client: &Client,
    run: &str,
    name: &str,
    dest: &Path,
    progress: &Progress<'_>,
) -> Result<Downloaded, ClientError> {
    let part = partial_path(dest);
    if let Some(dir) = dest.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(ClientError::io("create", dir))?;
    }
    let existing = std::fs::metadata(&part).map_or(0, |m| m.len());
    let mut response = client.download(run, name, existing).await?;
    let resumed = response.status() == reqwest::StatusCode::PARTIAL_CONTENT;
    let from = if resumed { existing } else { 0 };
    let expected = response
        .headers()
        .get("x-relaunch-blake3")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| {
            ClientError::Corrupt(format!(
                "{} sent no x-relaunch-blake3 header; is it a relaunch server?",
                client.url()
            ))
        })?;
    let total = from + response.content_length().unwrap_or(0);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(resumed)
        .write(true)
        .truncate(!resumed)
        .open(&part)
        .map_err(ClientError::io("create", &part))?;
    let mut done = from;
    progress(done, total);
    while let Some(bytes) = response.chunk().await.map_err(|e| client.body_error(&e))? {
        file.write_all(&bytes)
            .map_err(ClientError::io("write", &part))?;
        done += bytes.len() as u64;
        progress(done, total);
    }
    file.sync_all().map_err(ClientError::io("sync", &part))?;
    drop(file);
    let actual = {
        let part = part.clone();
        tokio::task::spawn_blocking(move || hash_file(&part))
            .await
            .map_err(|e| ClientError::Config(format!("the hashing task failed: {e}")))??
    };
    if actual != expected {
        let _ = std::fs::remove_file(&part);
        return Err(ClientError::Corrupt(format!(
            "the downloaded bytes of {name:?} hash to {actual}, not the server's {expected}; the \
             partial file was removed, download again"
        )));
    }
    std::fs::rename(&part, dest).map_err(ClientError::io("rename", dest))?;
    Ok(Downloaded {
        size: done,
        blake3: actual,
        resumed_from: from,
    })
}

/// BLAKE3 of a file, hex.
pub fn hash_file(path: &Path) -> Result<String, ClientError> {
    crate::hash::blake3_of_file(path)
        .map(|h| h.to_hex().to_string())
        .map_err(ClientError::io("hash", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_cut_the_same_way_twice_and_its_chunks_add_up() {
        let dir = std::env::temp_dir().join(format!("relaunch-cut-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.bin");
        // 6 MiB of pseudo-random bytes: several chunks.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let data: Vec<u8> = (0..6 << 20)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        std::fs::write(&path, &data).unwrap();
        let cut = || {
            let (tx, mut rx) = mpsc::channel(1 << 10);
            let file = File::open(&path).unwrap();
            let (size, whole) = cut_and_hash(&path, file, tx).unwrap();
            let mut chunks = Vec::new();
            while let Ok(h) = rx.try_recv() {
                assert_eq!(blake3::hash(&h.data).to_hex().as_str(), h.chunk.hash);
                chunks.push(h.chunk);
            }
            (size, whole, chunks)
        };
        let (size, whole, a) = cut();
        assert_eq!(cut(), (size, whole.clone(), a.clone())); // the same cuts every time
        assert!(a.len() >= 2, "{}", a.len());
        assert_eq!(a.iter().map(|c| c.size).sum::<u64>(), data.len() as u64);
        assert_eq!(size, data.len() as u64);
        assert_eq!(whole, blake3::hash(&data).to_hex().as_str());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

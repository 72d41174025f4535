//! A run's files through the server's chunk store: [`upload`] sends only
//! the chunks the server lacks, several at a time, and commits the file's
//! manifest; [`download`] streams a file into a partial file beside its
//! destination, resumes it with a `Range` request, checks its BLAKE3 and
//! renames it into place. See `relaunch_api::files` for the protocol.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::{StreamExt as _, TryStreamExt as _};
use relaunch_api::files::{MAX_MISSING_QUERY, check_file_name};
use relaunch_api::{ChunkRef, FileInfo, FileManifest};

use crate::error::{ClientError, ErrorKind};
use crate::http::Client;

/// Chunks in flight at once during an upload.
pub const PARALLEL: usize = 4;
/// Tries of one chunk before an upload gives up (the next upload resumes).
const TRIES: u32 = 5;

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

/// Where a chunk sits in its file.
#[derive(Clone, Debug)]
struct Piece {
    offset: u64,
    chunk: ChunkRef,
}

/// Cuts the file at `path` into the protocol's chunks and hashes them: the
/// manifest that names it `name`, and each chunk's offset.
fn cut(path: &Path, name: &str) -> Result<(FileManifest, Vec<Piece>), ClientError> {
    check_file_name(name).map_err(ClientError::Config)?;
    let file = File::open(path).map_err(ClientError::io("open", path))?;
    let mut pieces = Vec::new();
    let manifest = relaunch_api::files::cut(BufReader::new(file), name, |offset, _, chunk| {
        pieces.push(Piece {
            offset,
            chunk: chunk.clone(),
        });
        Ok::<(), std::io::Error>(())
    })
    .map_err(ClientError::io("read", path))?;
    Ok((manifest, pieces))
}

/// Uploads the file at `path` as `name` in `run`: only the chunks the
/// server lacks travel, [`PARALLEL`] at a time; the file appears on the
/// server whole once its manifest is committed. Run it again after an
/// interruption and it sends only what is still missing.
pub async fn upload(
    client: &Client,
    run: &str,
    path: &Path,
    name: &str,
    progress: &Progress<'_>,
) -> Result<Uploaded, ClientError> {
    let (manifest, pieces) = {
        let (path, name) = (path.to_path_buf(), name.to_owned());
        tokio::task::spawn_blocking(move || cut(&path, &name))
            .await
            .map_err(|e| ClientError::Config(format!("the chunking task failed: {e}")))??
    };
    let total = manifest.size;
    let missing = missing(client, &manifest).await?;
    // Each missing chunk once, however often the file repeats it.
    let mut seen = HashSet::new();
    let to_send: Vec<Piece> = pieces
        .into_iter()
        .filter(|p| missing.contains(&p.chunk.hash) && seen.insert(p.chunk.hash.clone()))
        .collect();
    let sending: u64 = to_send.iter().map(|p| p.chunk.size).sum();
    let done = Arc::new(AtomicU64::new(total - sending));
    progress(done.load(Ordering::Relaxed), total);
    let sent_chunks = to_send.len();
    let path = Arc::new(path.to_path_buf());
    futures_util::stream::iter(to_send)
        .map(|piece| {
            let (path, done) = (path.clone(), done.clone());
            async move {
                send_piece(client, &path, &piece).await?;
                let now = done.fetch_add(piece.chunk.size, Ordering::Relaxed) + piece.chunk.size;
                progress(now, total);
                Ok::<(), ClientError>(())
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<()>()
        .await?;
    let file = client.commit_file(run, &manifest).await?;
    Ok(Uploaded {
        file,
        chunks: manifest.chunks.len(),
        sent_chunks,
        sent_bytes: sending,
    })
}

/// The hashes of `manifest` that the server lacks.
async fn missing(client: &Client, manifest: &FileManifest) -> Result<HashSet<String>, ClientError> {
    let mut unique: Vec<String> = manifest.chunks.iter().map(|c| c.hash.clone()).collect();
    unique.sort_unstable();
    unique.dedup();
    let mut missing = HashSet::new();
    for batch in unique.chunks(MAX_MISSING_QUERY) {
        missing.extend(client.missing_chunks(batch.to_vec()).await?);
    }
    Ok(missing)
}

/// Reads one chunk back from the file (checking it is still what was
/// hashed) and sends it, retrying what a retry can fix.
async fn send_piece(client: &Client, path: &Path, piece: &Piece) -> Result<(), ClientError> {
    let data = {
        let (path, piece) = (path.to_path_buf(), piece.clone());
        tokio::task::spawn_blocking(move || read_piece(&path, &piece))
            .await
            .map_err(|e| ClientError::Config(format!("the read task failed: {e}")))??
    };
    let mut pause = Duration::from_millis(500);
    for attempt in 1..=TRIES {
        match client.put_chunk(&piece.chunk.hash, data.clone()).await {
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
                tracing::debug!(chunk = %piece.chunk.hash, error = %e, attempt, "retrying a chunk");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(8));
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the last try returns")
}

fn read_piece(path: &Path, piece: &Piece) -> Result<Vec<u8>, ClientError> {
    let file = File::open(path).map_err(ClientError::io("open", path))?;
    let mut data = vec![0u8; piece.chunk.size as usize];
    file.read_exact_at(&mut data, piece.offset)
        .map_err(ClientError::io("read", path))?;
    if blake3::hash(&data).to_hex().as_str() != piece.chunk.hash {
        return Err(ClientError::Corrupt(format!(
            "{} changed while it was being uploaded (bytes {}..{} differ); upload it again once \
             nothing writes to it",
            path.display(),
            piece.offset,
            piece.offset + piece.chunk.size
        )));
    }
    Ok(data)
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
        let (a, pieces) = cut(&path, "x/data.bin").unwrap();
        let (b, _) = cut(&path, "x/data.bin").unwrap();
        assert_eq!(a, b); // the same cuts every time
        assert!(a.chunks.len() >= 2, "{}", a.chunks.len());
        assert_eq!(
            a.chunks.iter().map(|c| c.size).sum::<u64>(),
            data.len() as u64
        );
        assert_eq!(a.blake3, blake3::hash(&data).to_hex().as_str());
        for p in &pieces {
            assert_eq!(read_piece(&path, p).unwrap().len() as u64, p.chunk.size);
        }
        assert!(cut(&path, "../x").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

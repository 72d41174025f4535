//! File chunks, stored by their BLAKE3 hash: the [`BlobStore`] trait the
//! file handlers use, and [`DirBlobs`], the embedded backend (one file per
//! chunk under the data directory). `s3.rs` implements the same calls with
//! HEAD, PUT and GET of `PREFIX/chunks/ab/HASH` in a bucket (its PUT is
//! durable when acknowledged, so its `persist` has nothing to do).

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use relaunch_api::{ChunkUpload, DirectChunk};

use super::StorageError;
use super::sqlite::Durability;

/// Where chunks are kept.
pub trait BlobStore: Send + Sync + 'static {
    /// Those of `hashes` that are not stored, in the order asked.
    fn missing(&self, hashes: &[String]) -> Result<Vec<String>, StorageError>;

    /// Stores `data` as `hash`, which the caller has checked is its BLAKE3.
    /// Storing a chunk that is already there does nothing. Once it returns
    /// the chunk is no longer [`missing`](Self::missing) and reads back,
    /// but it may not survive power loss until [`persist`](Self::persist).
    fn put(&self, hash: &str, data: &[u8]) -> Result<(), StorageError>;

    /// [`put`](Self::put) of a chunk that [`missing`](Self::missing) just
    /// reported absent (an upload sends only those), with the bytes given
    /// over: a remote store writes it without asking again whether it is
    /// there, and without copying it.
    fn put_new(&self, hash: &str, data: bytes::Bytes) -> Result<(), StorageError> {
        self.put(hash, &data)
    }

    /// The stored length of chunk `hash`, `None` if it is not stored. A
    /// commit checks each chunk's declared size against it, so a manifest
    /// never makes a file whose bytes differ from its size.
    fn size(&self, hash: &str) -> Result<Option<u64>, StorageError>;

    /// [`size`](Self::size) of each of `hashes`, in order: what a commit
    /// asks of all its chunks (a remote store asks in parallel).
    fn sizes(&self, hashes: &[String]) -> Result<Vec<Option<u64>>, StorageError> {
        hashes.iter().map(|h| self.size(h)).collect()
    }

    /// Makes the stored chunks `hashes` durable. A file's manifest commits
    /// only after its chunks are persisted, so a committed file never
    /// names a chunk that a power loss could take away.
    fn persist(&self, hashes: &[String]) -> Result<(), StorageError>;

    /// The chunk's bytes, checked against its hash: a chunk damaged where
    /// it is stored is an error ([`StorageError::Corrupt`]), never wrong
    /// bytes.
    fn get(&self, hash: &str) -> Result<Vec<u8>, StorageError>;

    /// Whether clients may send chunks straight to this store
    /// ([`presign`](Self::presign)); a directory on the server's disk may not.
    fn takes_direct(&self) -> bool {
        false
    }

    /// A URL for each of `chunks` that stores it, for `expires` from now,
    /// only if its body has the chunk's SHA-256 (the store checks it).
    fn presign(
        &self,
        _chunks: &[DirectChunk],
        _expires: Duration,
    ) -> Result<Vec<ChunkUpload>, StorageError> {
        Err(StorageError::Invalid(
            "this server keeps chunks on its own disk: send them with PUT /api/v1/chunks/HASH"
                .into(),
        ))
    }

    /// Whether each of `chunks`, sent straight to the store, is there with
    /// its size and SHA-256 (what the store itself says): `None` if so,
    /// else why not. A confirmed chunk is then stored like any other.
    fn confirm(&self, chunks: &[DirectChunk]) -> Result<Vec<Option<String>>, StorageError> {
        Ok(chunks
            .iter()
            .map(|c| {
                Some(format!(
                    "chunk {} was never sent straight to the store",
                    c.hash
                ))
            })
            .collect())
    }

    /// Removes chunks sent straight to the store that no commit confirmed
    /// within the grace period.
    fn remove_unconfirmed(&self, _hashes: &[String]) -> Result<(), StorageError> {
        Ok(())
    }
}

/// Chunks as files. A chunk is written to `DIR/chunks/staged/ab/.HASH.*`
/// with direct I/O (from our buffer to the disk, no page-cache copy; where
/// the file system refuses it, a plain write whose write-out is started at
/// once), renamed to `DIR/chunks/staged/ab/HASH` (whole, not yet known
/// durable: the disk's cache and the file's metadata are not flushed), and, when a file that
/// uses it commits, made durable with one `syncfs` for all of that file's
/// staged chunks and renamed to `DIR/chunks/ab/HASH` (the first two hex
/// digits spread them over 256 directories). One flush per file instead of
/// two per chunk is what lets an upload run at disk speed.
///
/// After a crash, staged chunks may be torn (a power loss), so opening the
/// store re-hashes each and removes those that do not match; a chunk whose
/// rename was lost but whose file had committed is still staged, whole and
/// durable, and is read from there.
#[derive(Debug)]
pub struct DirBlobs {
    root: PathBuf,
    durability: Durability,
}

impl DirBlobs {
    /// Opens (creating) `data_dir/chunks`, removes what an interrupted
    /// `put` left (`.`-files in `staged/ab/`), and checks what is staged
    /// (see above).
    pub fn open(data_dir: &Path, durability: Durability) -> Result<Self, StorageError> {
        let root = data_dir.join("chunks");
        let staged = root.join("staged");
        fs::create_dir_all(&staged).map_err(io("create", &staged))?;
        let (mut kept, mut removed) = (0usize, 0usize);
        for dir in fs::read_dir(&staged)
            .map_err(io("list", &staged))?
            .flatten()
        {
            for entry in fs::read_dir(dir.path()).into_iter().flatten().flatten() {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    let _ = fs::remove_file(&path); // a put cut short
                    continue;
                }
                // A chunk is at most 4 MiB: read whole, as `get` does.
                let whole = relaunch_api::files::check_hash(&name).is_ok()
                    && fs::read(&path).is_ok_and(|d| blake3::hash(&d).to_hex().as_str() == name);
                if whole {
                    kept += 1;
                } else {
                    removed += 1;
                    let _ = fs::remove_file(&path);
                }
            }
        }
        if removed > 0 {
            tracing::warn!(
                removed,
                kept,
                "removed staged chunks that a crash left torn; their uploads will send them again"
            );
        }
        Ok(Self { root, durability })
    }

    /// The chunks of `data_dir` to read only (a migration's source): no
    /// directory is made and nothing staged is checked or removed; every
    /// read still checks the hash.
    pub fn open_read_only(data_dir: &Path) -> Self {
        Self {
            root: data_dir.join("chunks"),
            durability: Durability::Fsync,
        }
    }

    fn path(&self, hash: &str) -> Result<PathBuf, StorageError> {
        relaunch_api::files::check_hash(hash).map_err(StorageError::Invalid)?;
        Ok(self.root.join(&hash[..2]).join(hash))
    }

    /// Where a chunk waits for its file's commit: beside the others of its
    /// first two hex digits, so parallel puts rarely share a directory.
    fn staged(&self, hash: &str) -> PathBuf {
        self.root.join("staged").join(&hash[..2]).join(hash)
    }

    fn read(&self, hash: &str) -> Result<(PathBuf, Vec<u8>), StorageError> {
        let path = self.path(hash)?;
        // Final, else staged, else final again: `persist` may have renamed
        // it between the first two looks.
        for candidate in [path.clone(), self.staged(hash), path] {
            match fs::read(&candidate) {
                Ok(data) => return Ok((candidate, data)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("read", &candidate)(e)),
            }
        }
        Err(StorageError::Corrupt(format!(
            "chunk {hash} of a committed file is missing from {}",
            self.root.display()
        )))
    }
}

impl BlobStore for DirBlobs {
    fn missing(&self, hashes: &[String]) -> Result<Vec<String>, StorageError> {
        let mut missing = Vec::new();
        for hash in hashes {
            if !self.path(hash)?.is_file() && !self.staged(hash).is_file() {
                missing.push(hash.clone());
            }
        }
        Ok(missing)
    }

    fn size(&self, hash: &str) -> Result<Option<u64>, StorageError> {
        let path = self.path(hash)?;
        // Final, else staged, else final again, as `read` looks.
        for candidate in [path.clone(), self.staged(hash), path] {
            match fs::metadata(&candidate) {
                Ok(meta) if meta.is_file() => return Ok(Some(meta.len())),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("look at", &candidate)(e)),
            }
        }
        Ok(None)
    }

    fn put(&self, hash: &str, data: &[u8]) -> Result<(), StorageError> {
        let path = self.path(hash)?;
        let staged = self.staged(hash);
        if path.is_file() || staged.is_file() {
            return Ok(());
        }
        let dir = staged.parent().unwrap_or(&self.root);
        let tmp = dir.join(format!(".{hash}.{}", uuid::Uuid::new_v4().simple()));
        let written = (|| {
            fs::create_dir_all(dir)?;
            if !write_direct(&tmp, data)? {
                let mut file = File::create(&tmp)?;
                file.write_all(data)?;
                if self.durability == Durability::Fsync {
                    // The disk starts now, so `persist` finds little to flush.
                    super::writeback::start_writeback(&file, 0, data.len() as u64)?;
                }
            }
            fs::rename(&tmp, &staged)
        })();
        written.map_err(|e: std::io::Error| {
            let _ = fs::remove_file(&tmp);
            io("write", &staged)(e)
        })
    }

    fn persist(&self, hashes: &[String]) -> Result<(), StorageError> {
        let mut staged = Vec::new();
        for hash in hashes.iter().collect::<BTreeSet<_>>() {
            let path = self.path(hash)?;
            if !path.is_file() && self.staged(hash).is_file() {
                staged.push((self.staged(hash), path));
            }
        }
        if staged.is_empty() {
            return Ok(());
        }
        let fsync = self.durability == Durability::Fsync;
        if fsync {
            // One flush of the file system for every staged chunk: their
            // bytes and their names in staged/ are durable after it.
            let dir = File::open(&self.root).map_err(io("open", &self.root))?;
            nix::unistd::syncfs(&dir).map_err(|e| io("sync", &self.root)(e.into()))?;
        }
        let mut dirs = BTreeSet::new();
        for (from, to) in &staged {
            let dir = to.parent().unwrap_or(&self.root);
            if dirs.insert(dir.to_path_buf()) {
                fs::create_dir_all(dir).map_err(io("create", dir))?;
            }
            dirs.insert(from.parent().unwrap_or(&self.root).to_path_buf());
            match fs::rename(from, to) {
                Ok(()) => {}
                // Another commit of the same chunk moved it first.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.is_file() => {}
                Err(e) => return Err(io("store", to)(e)),
            }
        }
        if fsync {
            // The new names; were they lost, the chunks would still be
            // whole and durable in staged/, where reads look too.
            dirs.insert(self.root.clone());
            for dir in &dirs {
                File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(io("sync", dir))?;
            }
        }
        Ok(())
    }

    fn get(&self, hash: &str) -> Result<Vec<u8>, StorageError> {
        let (path, data) = self.read(hash)?;
        let actual = blake3::hash(&data).to_hex();
        if actual.as_str() != hash {
            return Err(StorageError::Corrupt(format!(
                "chunk {} holds data whose BLAKE3 is {actual}: the file was damaged on disk; \
                 upload the file again to repair it",
                path.display()
            )));
        }
        Ok(data)
    }
}

/// The alignment direct I/O needs of buffers, offsets and lengths.
const DIRECT_ALIGN: usize = 4096;

/// Writes `data` to a new file at `path` with `O_DIRECT`: the bytes go from
/// our buffer to the disk, not through the page cache (whose copy and
/// page allocation are most of the server's CPU during an upload). The
/// buffer is padded to whole blocks and the file cut back to its length.
/// `Ok(false)` where the file system refuses direct I/O (tmpfs, some
/// network file systems): the caller writes it the usual way.
fn write_direct(path: &Path, data: &[u8]) -> std::io::Result<bool> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let padded = data.len().div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    // An aligned block inside one allocation (it never grows, so it never
    // moves): zeros up to the alignment, the data, zeros to a whole block.
    let mut buf: Vec<u8> = Vec::with_capacity(padded + DIRECT_ALIGN);
    let start = buf.as_ptr().align_offset(DIRECT_ALIGN).min(DIRECT_ALIGN);
    buf.resize(start, 0);
    buf.extend_from_slice(data);
    buf.resize(start + padded, 0);
    let block = &buf[start..];
    let file = match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut file = file;
    let written = file
        .write_all(block)
        .and_then(|()| file.set_len(data.len() as u64));
    if let Err(e) = written {
        let _ = fs::remove_file(path);
        return if e.raw_os_error() == Some(libc::EINVAL) {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(true)
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl Fn(std::io::Error) -> StorageError + 'a {
    move |e| StorageError::Backend(format!("cannot {what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("relaunch-blobs-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn chunks_are_stored_once_and_checked_when_read() {
        let dir = temp_dir("roundtrip");
        let blobs = DirBlobs::open(&dir, Durability::Process).unwrap();
        let data = b"some bytes".to_vec();
        let hash = blake3::hash(&data).to_hex().to_string();
        let other = blake3::hash(b"other").to_hex().to_string();
        assert_eq!(
            blobs.missing(&[hash.clone(), other.clone()]).unwrap(),
            [hash.clone(), other.clone()]
        );
        assert_eq!(blobs.size(&hash).unwrap(), None);
        blobs.put(&hash, &data).unwrap();
        blobs.put(&hash, &data).unwrap();
        assert_eq!(blobs.size(&hash).unwrap(), Some(data.len() as u64));
        assert_eq!(
            blobs.missing(&[hash.clone(), other.clone()]).unwrap(),
            [other]
        );
        assert_eq!(blobs.get(&hash).unwrap(), data); // staged, read back
        let staged = dir.join("chunks/staged").join(&hash[..2]).join(&hash);
        let stored = dir.join("chunks").join(&hash[..2]).join(&hash);
        assert!(staged.is_file() && !stored.exists());
        blobs.persist(std::slice::from_ref(&hash)).unwrap();
        blobs.persist(std::slice::from_ref(&hash)).unwrap(); // twice is fine
        assert!(!staged.exists() && stored.is_file());
        assert_eq!(blobs.get(&hash).unwrap(), data);
        assert_eq!(blobs.size(&hash).unwrap(), Some(data.len() as u64));
        assert!(
            blobs
                .missing(std::slice::from_ref(&hash))
                .unwrap()
                .is_empty()
        );

        // Damage on disk is found, and said.
        fs::write(&stored, b"rot").unwrap();
        let err = blobs.get(&hash).unwrap_err().to_string();
        assert!(err.contains("damaged on disk"), "{err}");
        assert!(blobs.get("../../etc/passwd").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn direct_writes_keep_every_length_exact() {
        let dir = temp_dir("direct");
        fs::create_dir_all(&dir).unwrap();
        for len in [1, 4095, 4096, 4097, (1 << 20) + 3] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let path = dir.join(format!("c{len}"));
            if write_direct(&path, &data).unwrap() {
                assert_eq!(fs::read(&path).unwrap(), data, "{len}");
            } else {
                // A file system without direct I/O: nothing left behind.
                assert!(!path.exists());
            }
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reopening_keeps_whole_staged_chunks_and_drops_torn_ones() {
        let dir = temp_dir("reopen");
        let blobs = DirBlobs::open(&dir, Durability::Fsync).unwrap();
        let (whole, torn) = (b"whole chunk".to_vec(), b"torn chunk".to_vec());
        let hash = |d: &[u8]| blake3::hash(d).to_hex().to_string();
        blobs.put(&hash(&whole), &whole).unwrap();
        blobs.put(&hash(&torn), &torn).unwrap();
        // A power loss before `persist`: the second lost its tail.
        let torn_path = dir.join("chunks/staged").join(&hash(&torn)[..2]);
        fs::write(torn_path.join(hash(&torn)), b"torn").unwrap();
        fs::write(torn_path.join(".half-written"), b"x").unwrap();
        drop(blobs);

        let blobs = DirBlobs::open(&dir, Durability::Fsync).unwrap();
        assert_eq!(
            blobs.missing(&[hash(&whole), hash(&torn)]).unwrap(),
            [hash(&torn)]
        );
        assert_eq!(blobs.get(&hash(&whole)).unwrap(), whole);
        assert_eq!(fs::read_dir(&torn_path).unwrap().count(), 0);
        // Sent again, then committed: durable and in place.
        blobs.put(&hash(&torn), &torn).unwrap();
        blobs.persist(&[hash(&whole), hash(&torn)]).unwrap();
        let staged: Vec<_> = fs::read_dir(dir.join("chunks/staged"))
            .unwrap()
            .flat_map(|d| fs::read_dir(d.unwrap().path()).unwrap())
            .collect();
        assert!(staged.is_empty(), "{staged:?}");
        assert_eq!(blobs.get(&hash(&torn)).unwrap(), torn);
        fs::remove_dir_all(&dir).unwrap();
    }
}

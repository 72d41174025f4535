//! File chunks, stored by their BLAKE3 hash: the [`BlobStore`] trait the
//! file handlers use, and [`DirBlobs`], the embedded backend (one file per
//! chunk under the data directory). An S3-compatible backend implements the
//! same three calls with HEAD, PUT and GET of `chunks/{hash}`.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::StorageError;
use super::sqlite::Durability;

/// Where chunks are kept.
pub trait BlobStore: Send + Sync + 'static {
    /// Those of `hashes` that are not stored, in the order asked.
    fn missing(&self, hashes: &[String]) -> Result<Vec<String>, StorageError>;

    /// Stores `data` as `hash`, which the caller has checked is its BLAKE3.
    /// Storing a chunk that is already there does nothing. Durable when it
    /// returns.
    fn put(&self, hash: &str, data: &[u8]) -> Result<(), StorageError>;

    /// The chunk's bytes, checked against its hash: a chunk damaged on disk
    /// is an error, never wrong bytes.
    fn get(&self, hash: &str) -> Result<Vec<u8>, StorageError>;
}

/// Chunks as files: `DIR/chunks/ab/abcdef...` (the first two hex digits
/// spread them over 256 directories), written to `DIR/chunks/tmp/` and
/// renamed into place, so a chunk file is always whole.
#[derive(Debug)]
pub struct DirBlobs {
    root: PathBuf,
    durability: Durability,
}

impl DirBlobs {
    /// Opens (creating) `data_dir/chunks`, and removes what an interrupted
    /// `put` left in its `tmp/`.
    pub fn open(data_dir: &Path, durability: Durability) -> Result<Self, StorageError> {
        let root = data_dir.join("chunks");
        let tmp = root.join("tmp");
        fs::create_dir_all(&tmp).map_err(io("create", &tmp))?;
        for entry in fs::read_dir(&tmp).map_err(io("list", &tmp))?.flatten() {
            let _ = fs::remove_file(entry.path());
        }
        Ok(Self { root, durability })
    }

    fn path(&self, hash: &str) -> Result<PathBuf, StorageError> {
        relaunch_api::files::check_hash(hash).map_err(StorageError::Invalid)?;
        Ok(self.root.join(&hash[..2]).join(hash))
    }
}

impl BlobStore for DirBlobs {
    fn missing(&self, hashes: &[String]) -> Result<Vec<String>, StorageError> {
        let mut missing = Vec::new();
        for hash in hashes {
            if !self.path(hash)?.is_file() {
                missing.push(hash.clone());
            }
        }
        Ok(missing)
    }

    fn put(&self, hash: &str, data: &[u8]) -> Result<(), StorageError> {
        let path = self.path(hash)?;
        if path.is_file() {
            return Ok(());
        }
        let dir = path.parent().unwrap_or(&self.root);
        fs::create_dir_all(dir).map_err(io("create", dir))?;
        let tmp = self
            .root
            .join("tmp")
            .join(format!("{hash}.{}", uuid::Uuid::new_v4().simple()));
        let written = (|| {
            let mut file = File::create(&tmp)?;
            file.write_all(data)?;
            if self.durability == Durability::Fsync {
                file.sync_all()?;
            }
            fs::rename(&tmp, &path)?;
            if self.durability == Durability::Fsync {
                File::open(dir)?.sync_all()?;
            }
            Ok(())
        })();
        written.map_err(|e: std::io::Error| {
            let _ = fs::remove_file(&tmp);
            io("write", &path)(e)
        })
    }

    fn get(&self, hash: &str) -> Result<Vec<u8>, StorageError> {
        let path = self.path(hash)?;
        let data = fs::read(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                StorageError::Corrupt(format!(
                    "chunk {hash} of a committed file is missing from {}",
                    self.root.display()
                ))
            } else {
                io("read", &path)(e)
            }
        })?;
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
        blobs.put(&hash, &data).unwrap();
        blobs.put(&hash, &data).unwrap();
        assert_eq!(
            blobs.missing(&[hash.clone(), other.clone()]).unwrap(),
            [other]
        );
        assert_eq!(blobs.get(&hash).unwrap(), data);

        // Damage on disk is found, and said.
        fs::write(dir.join("chunks").join(&hash[..2]).join(&hash), b"rot").unwrap();
        let err = blobs.get(&hash).unwrap_err().to_string();
        assert!(err.contains("damaged on disk"), "{err}");
        assert!(blobs.get("../../etc/passwd").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}

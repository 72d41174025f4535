//! Files of a run, stored as content-defined chunks named by their BLAKE3
//! hash (rsync's lesson: never send what the other side has).
//!
//! An upload: the client cuts the file with FastCDC ([`CHUNK_MIN`],
//! [`CHUNK_AVG`], [`CHUNK_MAX`]), asks `POST /chunks/missing` which chunks
//! the server lacks, `PUT /chunks/{hash}`s those (the server checks each
//! hash), then commits the file's [`FileManifest`] with `POST
//! /runs/{id}/files`; the file is visible only once that commit is. An
//! interrupted upload resumes by asking again: what arrived is not sent
//! twice, and successive checkpoints share their unchanged chunks.

use serde::{Deserialize, Serialize};

/// Smallest chunk FastCDC cuts (except a file's last).
pub const CHUNK_MIN: usize = 256 * 1024;
/// The chunk size FastCDC aims at.
pub const CHUNK_AVG: usize = 1024 * 1024;
/// Largest chunk FastCDC cuts, and the largest `PUT /chunks/{hash}` body.
pub const CHUNK_MAX: usize = 4 * 1024 * 1024;
/// Most hashes in one `POST /chunks/missing`.
pub const MAX_MISSING_QUERY: usize = 100_000;
/// Longest file name, in bytes.
pub const MAX_FILE_NAME: usize = 1024;

/// One chunk of a file, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// BLAKE3 of the chunk's bytes, 64 lowercase hex digits.
    pub hash: String,
    pub size: u64,
}

/// `POST /api/v1/runs/{id}/files`: a file as the list of its chunks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileManifest {
    /// Relative, `/`-separated: `checkpoints/step_100/model.pt`.
    pub name: String,
    pub size: u64,
    /// BLAKE3 of the whole file.
    pub blake3: String,
    pub chunks: Vec<ChunkRef>,
}

/// A committed file, as listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileInfo {
    pub name: String,
    pub size: u64,
    pub blake3: String,
    pub chunks: u64,
    /// When it was committed, seconds since the Unix epoch.
    pub created_at: f64,
}

/// `POST /api/v1/chunks/missing`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkQuery {
    pub chunks: Vec<String>,
}

/// The answer: those of the asked hashes the server does not have.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingChunks {
    pub missing: Vec<String>,
}

/// Cuts what `reader` holds into the protocol's chunks (FastCDC with
/// [`CHUNK_MIN`], [`CHUNK_AVG`], [`CHUNK_MAX`]; BLAKE3 names), calls
/// `each(offset, bytes, chunk)` for each in order, and returns the manifest
/// of the whole as `name`. The client and the server's plain `PUT` both cut
/// with this, so the same bytes give the same chunks whichever way they came.
pub fn cut<E: From<std::io::Error>>(
    reader: impl std::io::Read,
    name: &str,
    mut each: impl FnMut(u64, &[u8], &ChunkRef) -> Result<(), E>,
) -> Result<FileManifest, E> {
    let mut whole = blake3::Hasher::new();
    let mut chunks = Vec::new();
    let mut size = 0u64;
    for piece in fastcdc::v2020::StreamCDC::new(reader, CHUNK_MIN, CHUNK_AVG, CHUNK_MAX) {
        let piece = piece.map_err(|e| std::io::Error::other(e.to_string()))?;
        whole.update(&piece.data);
        let chunk = ChunkRef {
            hash: blake3::hash(&piece.data).to_hex().to_string(),
            size: piece.data.len() as u64,
        };
        each(piece.offset, &piece.data, &chunk)?;
        size += chunk.size;
        chunks.push(chunk);
    }
    Ok(FileManifest {
        name: name.to_owned(),
        size,
        blake3: whole.finalize().to_hex().to_string(),
        chunks,
    })
}

/// A chunk hash: 64 lowercase hex digits (it names a file on the server).
pub fn check_hash(hash: &str) -> Result<(), String> {
    if hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        let shown: String = hash.chars().take(80).collect();
        Err(format!(
            "chunk hash {shown:?} is not a BLAKE3 hash: use 64 lowercase hex digits"
        ))
    }
}

/// A file name: relative, `/`-separated segments of letters, digits, `-`,
/// `_`, `.`, `+`, `=`, `@`, none empty, `.` or `..`; at most
/// [`MAX_FILE_NAME`] bytes. Names never become server paths (chunks are
/// stored by hash), but clients write downloads under them.
pub fn check_file_name(name: &str) -> Result<(), String> {
    let segment_ok = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'+' | b'=' | b'@')
            })
    };
    if !name.is_empty() && name.len() <= MAX_FILE_NAME && name.split('/').all(segment_ok) {
        Ok(())
    } else {
        let shown: String = name.chars().take(80).collect();
        Err(format!(
            "file name {shown:?} is not allowed: use a relative path of '/'-separated parts made \
             of letters, digits, '-', '_', '.', '+', '=', '@' (no empty, '.' or '..' parts, at \
             most {MAX_FILE_NAME} bytes)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_stay_relative_and_plain() {
        for good in ["model.pt", "ckpt/step_10/rank-0.pt", "a+b=c@d"] {
            assert!(check_file_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "a/./b",
            "a/",
            "a\\b",
            "é",
            "%2e%2e",
            "x\0",
            &"x".repeat(1025),
        ] {
            assert!(check_file_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hashes_are_64_lowercase_hex_digits() {
        assert!(check_hash(&"a".repeat(64)).is_ok());
        assert!(check_hash(&"A".repeat(64)).is_err());
        assert!(check_hash(&"a".repeat(63)).is_err());
        assert!(check_hash("../../etc/passwd").is_err());
    }
}

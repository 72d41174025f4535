//! Files of a run, stored as content-defined chunks named by their BLAKE3
//! hash (rsync's lesson: never send what the other side has).
//!
//! An upload: the client cuts the file into chunks ([`Chunks`]: FastCDC
//! with [`CHUNK_MIN`], [`CHUNK_AVG`], [`CHUNK_MAX`], and cuts where a
//! `torch.save` or safetensors file's tensors begin and end, so each large
//! tensor has chunks of its own whatever the file is called), asks `POST
//! /chunks/missing` which chunks
//! the server lacks, `PUT /chunks/{hash}`s those (the server checks each
//! hash), then commits the file's [`FileManifest`] with `POST
//! /runs/{id}/files`; the file is visible only once that commit is. An
//! interrupted upload resumes by asking again: what arrived is not sent
//! twice, and successive checkpoints share their unchanged chunks.

use serde::{Deserialize, Serialize};

pub use crate::chunk_limits::{CHUNK_AVG, CHUNK_MAX, CHUNK_MIN, ENTRY_CUT_MIN, ZIP_ENTRY};

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
    /// Whether this server hands out URLs to send the missing chunks
    /// straight to its bucket (`POST /chunks/uploads`); otherwise they go
    /// through `PUT /chunks/{hash}`. Absent from older servers: false.
    #[serde(default)]
    pub direct: bool,
}

/// One chunk a client will send straight to the bucket: its BLAKE3 name,
/// its size and its SHA-256 (base64, as S3's `x-amz-checksum-sha256`),
/// which the bucket checks the body against.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectChunk {
    pub hash: String,
    pub size: u64,
    pub sha256: String,
}

/// `POST /api/v1/chunks/uploads`: URLs for these chunks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadQuery {
    pub chunks: Vec<DirectChunk>,
}

/// Where one chunk goes: a presigned `PUT` URL and the headers it must be
/// sent with (they are part of its signature).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkUpload {
    pub hash: String,
    pub url: String,
    pub headers: std::collections::BTreeMap<String, String>,
}

/// The answer to an [`UploadQuery`], in its order; the URLs stop working
/// after `expires_in` seconds (ask again).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkUploads {
    pub uploads: Vec<ChunkUpload>,
    pub expires_in: u64,
}

/// One chunk as [`Chunks`] cuts it.
#[derive(Clone, Debug)]
pub struct Piece {
    /// Where it starts in the file.
    pub offset: u64,
    pub data: bytes::Bytes,
}

/// The protocol's chunks of what a reader holds, in order. A chunk ends at
/// the first of: FastCDC's cut ([`CHUNK_MIN`], [`CHUNK_AVG`],
/// [`CHUNK_MAX`], normalization level 1), or where the file's layout says
/// a tensor's bytes begin or end:
/// - in a zip (`torch.save`, [`ZIP_ENTRY`]), at a large entry's header,
///   after it, and after its data, and before a small entry's header once
///   the chunk holds [`ENTRY_GROUP`](crate::zip_cuts::ENTRY_GROUP) bytes
///   ([`crate::zip_cuts::cut`]);
/// - in a safetensors file, after its header and at each large tensor's
///   start and end ([`crate::safetensors_cuts::plan`]).
///
/// FastCDC alone would put a small tensor that changed in the same ~1 MiB
/// chunk as its neighbours, and a zip header (which holds the archive's
/// name, the file's name in a `torch.save` file) in the same chunk as the
/// start of its tensor; cut this way, each large tensor's bytes are chunks
/// of their own, the same whatever the file is called, and runs of small
/// ones (Adam's `step` scalars) are grouped in chunks of about 32 KiB, so
/// a checkpoint where scattered tensors changed sends about those tensors,
/// not a megabyte for each, under any name. The cut depends only on the
/// bytes: the same content gives the same chunks wherever it sits, which
/// is what makes successive uploads share them.
///
/// Chunks are slices of one read buffer (no copy per chunk).
#[derive(Debug)]
pub struct Chunks<R> {
    reader: R,
    /// What was read and not yet cut, from `offset` on.
    block: bytes::Bytes,
    offset: u64,
    eof: bool,
    masks: (u64, u64),
    /// The large zip entry whose data the block starts in.
    inside: Option<crate::zip_cuts::DataEnd>,
    /// A safetensors file's planned cuts still ahead (None: not one).
    planned: Option<std::collections::VecDeque<u64>>,
}

/// How much [`Chunks`] reads at a time.
const READ_SIZE: usize = 16 << 20;

impl<R: std::io::Read> Chunks<R> {
    pub fn new(reader: R) -> Self {
        Self {
            reader,
            block: bytes::Bytes::new(),
            offset: 0,
            eof: false,
            masks: fastcdc::v2020::select_masks(CHUNK_AVG, fastcdc::v2020::Normalization::Level1),
            inside: None,
            planned: None,
        }
    }

    /// Makes the block hold a whole largest chunk and the
    /// [`LOOKAHEAD`](crate::zip_cuts::LOOKAHEAD) bytes that decide an entry
    /// cut after it, or all that is left: the rest of the old block and
    /// [`READ_SIZE`] more bytes in a new one.
    fn fill(&mut self) -> std::io::Result<()> {
        if self.eof || self.block.len() >= CHUNK_MAX + crate::zip_cuts::LOOKAHEAD {
            return Ok(());
        }
        let want = self.block.len() + READ_SIZE;
        let mut next = Vec::with_capacity(want);
        next.extend_from_slice(&self.block);
        while next.len() < want {
            // `read_to_end` reads into the spare capacity without zeroing it.
            let room = (want - next.len()) as u64;
            if std::io::Read::read_to_end(
                &mut std::io::Read::take(&mut self.reader, room),
                &mut next,
            )? == 0
            {
                self.eof = true;
                break;
            }
        }
        self.block = bytes::Bytes::from(next);
        Ok(())
    }

    /// Where the chunk at the start of the block ends: FastCDC's cut, or
    /// a tensor's start or end before it (see [`Chunks`]).
    fn cut_point(&mut self) -> usize {
        let window = &self.block[..self.block.len().min(CHUNK_MAX)];
        let (mask_s, mask_l) = self.masks;
        let (_, cdc) = fastcdc::v2020::cut(
            window,
            CHUNK_MIN,
            CHUNK_AVG,
            CHUNK_MAX,
            mask_s,
            mask_l,
            mask_s << 1,
            mask_l << 1,
        );
        let cdc = cdc.clamp(1, window.len());
        if self.offset == 0 {
            self.planned = crate::safetensors_cuts::plan(&self.block);
        }
        if let Some(planned) = &mut self.planned {
            while planned.front().is_some_and(|&c| c <= self.offset) {
                planned.pop_front();
            }
            return match planned.front() {
                Some(&next) if next - self.offset <= cdc as u64 => (next - self.offset) as usize,
                _ => cdc,
            };
        }
        let (cut, inside) = crate::zip_cuts::cut(&self.block, self.offset, cdc, self.inside);
        self.inside = inside;
        cut
    }
}

impl<R: std::io::Read> Iterator for Chunks<R> {
    type Item = std::io::Result<Piece>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Err(e) = self.fill() {
            return Some(Err(e));
        }
        if self.block.is_empty() {
            return None;
        }
        let cut = self.cut_point();
        let piece = Piece {
            offset: self.offset,
            data: self.block.split_to(cut),
        };
        self.offset += cut as u64;
        Some(Ok(piece))
    }
}

/// Cuts what `reader` holds into the protocol's chunks ([`Chunks`], named
/// by BLAKE3), calls `each(offset, bytes, chunk)` for each in order, and
/// returns the manifest of the whole as `name`. The client and the
/// server's plain `PUT` both cut with [`Chunks`], so the same bytes give
/// the same chunks whichever way they came.
pub fn cut<E: From<std::io::Error>>(
    reader: impl std::io::Read,
    name: &str,
    mut each: impl FnMut(u64, &[u8], &ChunkRef) -> Result<(), E>,
) -> Result<FileManifest, E> {
    let mut whole = blake3::Hasher::new();
    let mut chunks = Vec::new();
    let mut size = 0u64;
    for piece in Chunks::new(reader) {
        let piece = piece?;
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
pub(crate) mod tests {
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

    /// Reproducible incompressible bytes (xorshift) for chunker tests.
    pub(crate) fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect()
    }

    fn pieces(data: &[u8]) -> Vec<Piece> {
        Chunks::new(data).collect::<Result<_, _>>().unwrap()
    }

    #[test]
    fn chunks_cover_the_input_within_the_size_bounds() {
        let data = noise(20 << 20, 7);
        let cut = pieces(&data);
        let mut offset = 0;
        for (i, piece) in cut.iter().enumerate() {
            assert_eq!(piece.offset, offset);
            assert_eq!(
                &data[offset as usize..][..piece.data.len()],
                &piece.data[..]
            );
            assert!(piece.data.len() <= CHUNK_MAX);
            if i + 1 < cut.len() {
                assert!(piece.data.len() >= CHUNK_MIN, "{}", piece.data.len());
            }
            offset += piece.data.len() as u64;
        }
        assert_eq!(offset, data.len() as u64);
        assert!(
            (8..=40).contains(&cut.len()),
            "{} chunks of 20 MiB",
            cut.len()
        );
        // The same bytes cut the same way, however the reader hands them out.
        let trickle = std::io::BufReader::with_capacity(1000, &data[..]);
        let again: Vec<Piece> = Chunks::new(trickle).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            cut.iter().map(|p| p.data.len()).collect::<Vec<_>>(),
            again.iter().map(|p| p.data.len()).collect::<Vec<_>>()
        );
        assert!(pieces(&[]).is_empty());
    }

    #[test]
    fn hashes_are_64_lowercase_hex_digits() {
        assert!(check_hash(&"a".repeat(64)).is_ok());
        assert!(check_hash(&"A".repeat(64)).is_err());
        assert!(check_hash(&"a".repeat(63)).is_err());
        assert!(check_hash("../../etc/passwd").is_err());
    }
}

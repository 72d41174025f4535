//! How big a chunk may be and where the checkpoint-aware cutters may cut:
//! the bounds that [`crate::files::Chunks`], [`crate::zip_cuts`] and
//! [`crate::safetensors_cuts`] share (their own module, so that the
//! cutters do not import the chunker that calls them).

/// Smallest chunk FastCDC cuts (except a file's last).
pub const CHUNK_MIN: usize = 256 * 1024;
/// The chunk size FastCDC aims at.
pub const CHUNK_AVG: usize = 1024 * 1024;
/// Largest chunk FastCDC cuts, and the largest `PUT /chunks/{hash}` body.
pub const CHUNK_MAX: usize = 4 * 1024 * 1024;

/// A zip archive's local file header signature. `torch.save` writes a zip
/// of stored (uncompressed) entries, one per tensor storage, each starting
/// with it.
pub const ZIP_ENTRY: &[u8; 4] = b"PK\x03\x04";
/// A chunk ends before a [`ZIP_ENTRY`] whose entry's size is unknown (see
/// [`crate::zip_cuts`]) only at least this far into it.
pub const ENTRY_CUT_MIN: usize = 512;

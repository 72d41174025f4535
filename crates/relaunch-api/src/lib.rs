//! The tracking server's HTTP API as data: JSON request and response types
//! ([`types`]), the binary batch format for bulk metrics, console lines
//! and events ([`batch`]) and the column format of bulk reads
//! ([`columns`]), the file protocol and its chunker ([`files`],
//! its zip entry cuts in [`zip_cuts`] and safetensors cuts in
//! [`safetensors_cuts`]), and a run's goodput ([`goodput`]).
//! The server and the client both depend on this crate and never on each
//! other.

pub mod batch;
pub mod chunk_limits;
pub mod columns;
pub mod files;
pub mod float;
pub mod goodput;
pub mod names;
pub mod safetensors_cuts;
pub mod types;
pub mod zip_cuts;

pub use batch::{Batch, BatchError, Record};
pub use files::{
    ChunkQuery, ChunkRef, ChunkUpload, ChunkUploads, DirectChunk, FileInfo, FileManifest,
    MissingChunks, UploadQuery,
};
pub use goodput::{AttemptEnd, AttemptGoodput, Goodput, Interruption};
pub use types::*;

/// Every path starts with this.
pub const API_PREFIX: &str = "/api/v1";

/// The header that carries the access token: `Authorization: Bearer TOKEN`.
pub const AUTHORIZATION: &str = "authorization";

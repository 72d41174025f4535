//! Where runs, metrics, console lines and events are kept: the [`Storage`]
//! trait that the HTTP handlers use, and its backends. Every backend passes
//! the same conformance suite (`tests/storage.rs`).

pub mod blobs;
pub mod chunk;
pub mod downsample;
pub mod filter;
pub mod ingest;
pub mod postgres;
pub mod runs;
pub mod s3;
pub mod sqlite;
pub mod timeline;
pub mod transfer;
mod writeback;

use relaunch_api::{
    Ack, Batch, ChunkRef, DirectChunk, Event, FileInfo, FileManifest, Latest, LogLine, RunFilter,
    RunInfo, RunInit, RunLatest, RunPatch, Series, SeriesQuery,
};

/// The kind of a storage failure, for the HTTP status and for retries.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{0}")]
    NotFound(String),
    /// The request contradicts what is stored (a gap in a writer's sequence).
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    /// Stored data that does not decode.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    #[error("storage backend: {0}")]
    Backend(String),
    /// A service the storage needs is away or failing (after retries):
    /// the request may succeed later (503).
    #[error("{0}")]
    Unavailable(String),
}

/// What a backend keeps. Methods block; the server calls them off its
/// async threads. `now` is seconds since the Unix epoch, passed in so that
/// tests control time.
pub trait Storage: Send + Sync + 'static {
    /// For `GET /api/v1/health`.
    fn name(&self) -> &'static str;

    /// Creates the run, or resumes it when `init.id` names an existing one
    /// (then name, config, tags and notes given here update it). The
    /// attempt token maps to an attempt number: the same token always gets
    /// the same one, a new token the next.
    fn open_run(&self, init: &RunInit, now: f64) -> Result<RunInfo, StorageError>;

    fn get_run(&self, id: &str) -> Result<RunInfo, StorageError>;

    fn patch_run(&self, id: &str, patch: &RunPatch, now: f64) -> Result<RunInfo, StorageError>;

    /// The runs `filter` selects, in its order (newest first unless it
    /// names one) and page.
    fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunInfo>, StorageError>;

    /// How many runs `filter` selects, whatever its page.
    fn count_runs(&self, filter: &RunFilter) -> Result<u64, StorageError>;

    /// The metric names logged by any run that `filter` selects, sorted.
    fn metric_names(&self, filter: &RunFilter) -> Result<Vec<String>, StorageError>;

    /// The newest value of each of `keys` in each run that `filter`
    /// selects (its lowest rank that logged the key), ordered by run and
    /// key; a run that never logged a key has no entry for it.
    fn latest_of_runs(
        &self,
        filter: &RunFilter,
        keys: &[String],
    ) -> Result<Vec<RunLatest>, StorageError>;

    /// Stores the batch's records above the writer's watermark, and the new
    /// watermark, atomically: each record is stored exactly once however
    /// often the batch is sent. A batch whose first new record does not
    /// follow the watermark is a [`StorageError::Conflict`] (records would
    /// be missing). A batch whose own sequence numbers have a gap, or
    /// fall outside `1..=2^63-1`, is [`StorageError::Invalid`]
    /// ([`Batch::check_sequence`]). When this returns, the records are
    /// durable.
    fn ingest(&self, run: &str, batch: &Batch, now: f64) -> Result<Ack, StorageError>;

    /// The highest sequence number stored for `writer` (0 if none).
    fn watermark(&self, run: &str, writer: &str) -> Result<u64, StorageError>;

    /// Metric names the run has logged.
    fn keys(&self, run: &str) -> Result<Vec<String>, StorageError>;

    fn series(&self, run: &str, query: &SeriesQuery) -> Result<Series, StorageError>;

    /// The newest value of every key and rank.
    fn latest(&self, run: &str) -> Result<Vec<Latest>, StorageError>;

    /// Console lines with an id above `after`, oldest first, at most `limit`.
    fn logs(
        &self,
        run: &str,
        rank: Option<u32>,
        after: u64,
        limit: u32,
    ) -> Result<Vec<LogLine>, StorageError>;

    /// The last `n` console lines of `run` (of `rank` only, if given), in
    /// order: where a live tail starts.
    fn log_tail(&self, run: &str, rank: Option<u32>, n: u32) -> Result<Vec<LogLine>, StorageError>;

    fn events(&self, run: &str) -> Result<Vec<Event>, StorageError>;

    /// What a run's goodput is computed from ([`timeline::gather`] over
    /// the backend's [`timeline::TimelineSource`], on one read snapshot):
    /// its attempts, lifecycle events and when each attempt's steps were
    /// logged.
    fn timeline(&self, run: &str) -> Result<timeline::Timeline, StorageError>;

    /// Makes `file` visible in the run, replacing a file of the same name,
    /// in one step: a reader sees the old file or the new one, whole. The
    /// caller has checked that every chunk is stored.
    fn commit_file(
        &self,
        run: &str,
        file: &FileManifest,
        now: f64,
    ) -> Result<FileInfo, StorageError>;

    /// The run's files, by name.
    fn files(&self, run: &str) -> Result<Vec<FileInfo>, StorageError>;

    /// One file and its chunks, in order.
    fn file(&self, run: &str, name: &str) -> Result<(FileInfo, Vec<ChunkRef>), StorageError>;

    /// Removes `name` from the run, in one step, and returns what it was.
    /// Its chunks stay stored (other files may share them).
    fn delete_file(&self, run: &str, name: &str, now: f64) -> Result<FileInfo, StorageError>;

    /// Records that a client was handed URLs to send `chunks` straight to
    /// the bucket, at `now` (a chunk asked for again gets the new time).
    fn pend_chunks(&self, chunks: &[DirectChunk], now: f64) -> Result<(), StorageError> {
        let _ = (chunks, now);
        Err(no_direct(self.name()))
    }

    /// Those of `hashes` handed out and not yet confirmed by a commit, with
    /// the size and SHA-256 they were handed out for. [`commit_file`]
    /// (Self::commit_file) removes the rows of the chunks it names.
    fn pending_chunks(&self, hashes: &[String]) -> Result<Vec<DirectChunk>, StorageError> {
        let _ = hashes;
        Err(no_direct(self.name()))
    }

    /// Up to `limit` chunks handed out before `before` and never confirmed.
    fn stale_chunks(&self, before: f64, limit: usize) -> Result<Vec<String>, StorageError> {
        let _ = (before, limit);
        Err(no_direct(self.name()))
    }

    /// Forgets those of `hashes` still handed out before `before` (their
    /// objects were deleted; one handed out again since is kept).
    fn drop_stale_chunks(&self, hashes: &[String], before: f64) -> Result<(), StorageError> {
        let _ = (hashes, before);
        Err(no_direct(self.name()))
    }

    /// Calls `changed` whenever another process that shares this storage
    /// (a replica on the same database) stores console lines, so that log
    /// follows here wake at once; the server announces its own writes
    /// itself. A storage that only this process writes never calls it.
    fn watch_logs(&self, changed: LogsChanged) {
        drop(changed);
    }
}

fn no_direct(name: &str) -> StorageError {
    StorageError::Invalid(format!(
        "the {name} storage keeps no chunks sent straight to a bucket"
    ))
}

/// What [`Storage::watch_logs`] calls.
pub type LogsChanged = Box<dyn Fn() + Send + Sync>;

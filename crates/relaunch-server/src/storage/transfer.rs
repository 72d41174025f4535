//! Moving whole runs between backends (`relaunch server migrate`): the
//! stored rows as plain data, and the [`Transfer`] trait that both the
//! SQLite and the PostgreSQL backend implement to read them out and write
//! them in.
//!
//! Rows travel as stored, not through the read API: metric chunks keep
//! their packed points and block summaries byte for byte (so every point,
//! NaN and the infinities included, arrives as itself, with nothing
//! re-chunked or downsampled), JSON columns keep their exact text, and
//! writers keep their watermarks, so a client that resumes against the
//! target stores nothing twice. What differs between databases (row ids,
//! key and project ids, SQLite's NULL for NaN) stays inside each backend.
//!
//! The large parts of a run (metric chunks, console lines, events) are read
//! in pages; everything else of a run (its row, attempts, writers, files,
//! latest values) is its [`RunHead`], small enough to hold whole.

use super::StorageError;

/// A run's own row.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRow {
    pub id: String,
    pub project: String,
    /// False while the project is the default one no caller asked for.
    pub project_set: bool,
    pub name: String,
    pub status: String,
    /// Wall time of the event that set the status.
    pub status_wall: f64,
    pub created_at: f64,
    pub updated_at: f64,
    pub attempts: u32,
    /// JSON, exactly as stored.
    pub tags: String,
    pub notes: String,
    /// JSON, exactly as stored.
    pub config: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AttemptRow {
    pub token: String,
    pub attempt: u32,
    pub started: f64,
}

/// A writer's watermark: the highest sequence number stored for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterRow {
    pub writer: String,
    pub watermark: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FileRow {
    pub name: String,
    pub size: i64,
    pub blake3: String,
    /// JSON array of `{hash, size}`, exactly as stored.
    pub chunks: String,
    pub n_chunks: i64,
    pub created_at: f64,
}

/// The newest value of a key and rank (derived from the chunks at ingest,
/// copied rather than derived again).
#[derive(Clone, Debug)]
pub struct LatestRow {
    pub key: String,
    pub rank: u32,
    pub step: i64,
    pub value: f64,
    pub wall: f64,
    pub attempt: u32,
}

impl PartialEq for LatestRow {
    fn eq(&self, other: &Self) -> bool {
        (&self.key, self.rank, self.step, self.attempt)
            == (&other.key, other.rank, other.step, other.attempt)
            && same_f64(self.value, other.value)
            && same_f64(self.wall, other.wall)
    }
}

/// Equal, with NaN equal to NaN (SQLite reads its NULL back as one NaN,
/// PostgreSQL keeps another's bits).
fn same_f64(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// Everything of a run but its pages.
#[derive(Clone, Debug, PartialEq)]
pub struct RunHead {
    pub run: RunRow,
    /// By attempt number.
    pub attempts: Vec<AttemptRow>,
    /// By writer.
    pub writers: Vec<WriterRow>,
    /// By name.
    pub files: Vec<FileRow>,
    /// By key, then rank.
    pub latest: Vec<LatestRow>,
}

/// One packed metric chunk, as `chunk.rs` encodes it.
#[derive(Clone, Debug)]
pub struct ChunkRow {
    pub key: String,
    pub rank: u32,
    pub attempt: u32,
    pub first_step: i64,
    pub last_step: i64,
    pub count: i64,
    pub vmin: f64,
    pub vmax: f64,
    pub last_value: f64,
    pub last_wall: f64,
    pub blocks: Vec<u8>,
    pub points: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LogRow {
    pub rank: u32,
    /// 0 stdout, 1 stderr.
    pub stream: i16,
    pub attempt: u32,
    pub wall: f64,
    pub text: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EventRow {
    pub kind: String,
    pub attempt: u32,
    pub wall: f64,
    pub text: String,
    /// JSON, exactly as stored.
    pub data: String,
}

/// How many rows of each table a run has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunCounts {
    pub attempts: u64,
    pub writers: u64,
    pub keys: u64,
    pub chunks: u64,
    /// Metric points: the sum of the chunks' counts.
    pub points: u64,
    pub latest: u64,
    pub logs: u64,
    pub events: u64,
    pub files: u64,
}

impl std::ops::AddAssign for RunCounts {
    fn add_assign(&mut self, o: Self) {
        self.attempts += o.attempts;
        self.writers += o.writers;
        self.keys += o.keys;
        self.chunks += o.chunks;
        self.points += o.points;
        self.latest += o.latest;
        self.logs += o.logs;
        self.events += o.events;
        self.files += o.files;
    }
}

impl RunCounts {
    /// (table, count), in the order a report shows them.
    pub fn tables(&self) -> [(&'static str, u64); 9] {
        [
            ("attempts", self.attempts),
            ("writers", self.writers),
            ("metric keys", self.keys),
            ("metric chunks", self.chunks),
            ("metric points", self.points),
            ("latest values", self.latest),
            ("console lines", self.logs),
            ("events", self.events),
            ("files", self.files),
        ]
    }
}

/// Rows per page when a run's chunks are read (each at most 4096 points,
/// 64 KiB packed): a few MiB in memory at a time.
pub const CHUNK_PAGE: u32 = 64;
/// Console lines or events per page.
pub const ROW_PAGE: u32 = 5000;

/// A backend's rows, read out and written in whole runs. Each page comes
/// with the row's id in the source, the cursor for the next page (`after`).
pub trait Transfer {
    /// Where the data is, without credentials, for messages.
    fn place(&self) -> String;

    /// Every project's name, runs or not.
    fn projects(&mut self) -> Result<Vec<String>, StorageError>;

    /// Every run's id, oldest first.
    fn run_ids(&mut self) -> Result<Vec<String>, StorageError>;

    /// `None` when there is no such run.
    fn run_head(&mut self, id: &str) -> Result<Option<RunHead>, StorageError>;

    fn run_counts(&mut self, id: &str) -> Result<RunCounts, StorageError>;

    /// Up to `limit` of the run's metric chunks with an id above `after`, in
    /// the order they were stored.
    fn chunk_page(
        &mut self,
        run: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<(i64, ChunkRow)>, StorageError>;

    fn log_page(
        &mut self,
        run: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<(i64, LogRow)>, StorageError>;

    fn event_page(
        &mut self,
        run: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<(i64, EventRow)>, StorageError>;

    /// Creates the projects that are missing (a project may have no runs).
    fn add_projects(&mut self, names: &[String]) -> Result<(), StorageError>;

    /// Starts writing a new run: its head now, its pages through the
    /// returned writer, all in one transaction that only
    /// [`RunWriter::commit`] commits. Dropped without a commit (or the
    /// process killed), nothing of the run is stored.
    fn begin_run<'a>(&'a mut self, head: &RunHead)
    -> Result<Box<dyn RunWriter + 'a>, StorageError>;
}

/// The pages of one run being written (see [`Transfer::begin_run`]).
pub trait RunWriter {
    fn chunks(&mut self, rows: &[ChunkRow]) -> Result<(), StorageError>;
    fn logs(&mut self, rows: &[LogRow]) -> Result<(), StorageError>;
    fn events(&mut self, rows: &[EventRow]) -> Result<(), StorageError>;
    fn commit(self: Box<Self>) -> Result<(), StorageError>;
}

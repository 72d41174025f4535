//! The embedded backend: one SQLite database (WAL) in the data directory.
//!
//! Writes go through one thread that commits whatever is queued in one
//! transaction (group commit), each request in a savepoint of its own, so
//! that many concurrent writers share one fsync and one failing request
//! does not undo the others. Reads use their own connections, which WAL
//! lets run beside the writer. A request is answered only after its
//! transaction committed: with `Durability::Fsync` (the default) the data
//! then survives power loss; with `Durability::Process` it survives the
//! server process being killed.

use std::path::{Path, PathBuf};

use relaunch_api::{
    Ack, Batch, ChunkRef, DEFAULT_PROJECT, DirectChunk, Event, FileInfo, FileManifest, Latest,
    LogLine, RunFilter, RunInfo, RunInit, RunLatest, RunPatch, RunStatus, Series, SeriesQuery,
    Stream,
};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use self::batches::{SqliteChunks, attempt_of, attempt_order, watermark};
use self::filters::{counted_runs, filtered_runs};
use self::readers::Readers;
use self::writer::Writer;
pub(crate) use self::writer::open_writer;
use super::chunk::Summary;
use super::downsample::{ChunkMeta, assemble};
use super::ingest;
use super::runs::{self, MAX_PAGE, ProjectRule, now_or};
use super::timeline::{Timeline, gather};
use super::{Storage, StorageError};

mod batches;
mod filters;
mod readers;
mod schema;
mod timeline;
mod transfer;
mod writer;
pub use self::schema::SCHEMA_VERSION;
pub use self::transfer::SqliteTransfer;

/// What an acknowledged write survives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Committed and fsynced: survives power loss.
    #[default]
    Fsync,
    /// Committed to the WAL without fsync: survives the process being
    /// killed, not the machine losing power.
    Process,
}

pub struct SqliteStorage {
    path: PathBuf,
    writer: Writer,
    readers: Readers,
}

/// Default `--max-readers`.
pub const DEFAULT_MAX_READERS: usize = 4;

/// Rows of a batch stored in one transaction at most (about 30 ms here):
/// a bigger batch is stored in parts, small writers' commits between them.
const INGEST_PART_ROWS: usize = 65_536;

impl std::fmt::Debug for SqliteStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStorage")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn backend(e: rusqlite::Error) -> StorageError {
    StorageError::Backend(e.to_string())
}

impl SqliteStorage {
    /// Opens (creating) `dir/relaunch.db`.
    pub fn open(dir: &Path, durability: Durability) -> Result<Self, StorageError> {
        let (path, conn) = open_writer(dir, durability)?;
        Ok(Self {
            path: path.clone(),
            writer: Writer::start(conn)?,
            readers: Readers::new(path, DEFAULT_MAX_READERS),
        })
    }

    /// Finishes every queued write and stops the writer thread.
    pub fn close(&self) {
        self.writer.close();
    }

    fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        self.writer.write(f)
    }

    /// At most `max` reads at once (at least 1); more wait for a reader.
    #[must_use]
    pub fn with_max_readers(mut self, max: usize) -> Self {
        self.readers.set_max(max);
        self
    }

    /// Reader connections open now; never more than `with_max_readers`.
    pub fn readers_open(&self) -> usize {
        self.readers.open()
    }

    fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        self.readers.read(f)
    }
}

impl Drop for SqliteStorage {
    fn drop(&mut self) {
        self.close();
    }
}

fn run_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunInfo> {
    let tags: String = row.get("tags")?;
    let config: String = row.get("config")?;
    let status: String = row.get("status")?;
    Ok(RunInfo {
        id: row.get("id")?,
        project: row.get("project")?,
        name: row.get("name")?,
        status: RunStatus::parse(&status).unwrap_or(RunStatus::Running),
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
        attempts: row.get("attempts")?,
        attempt: None,
        tags: runs::tags_from(&tags),
        notes: row.get("notes")?,
        config: runs::json_from(&config),
    })
}

/// The columns `run_row` reads, of `runs r JOIN projects p`.
const RUN_COLUMNS: &str = "r.id, p.name AS project, r.name, r.status, r.created_at, r.updated_at, \
     r.attempts, r.tags, r.notes, r.config";

const RUN_SELECT: &str = "SELECT r.id, p.name AS project, r.name, r.status, r.created_at, r.updated_at, \
     r.attempts, r.tags, r.notes, r.config FROM runs r JOIN projects p ON p.id = r.project_id";

/// A `logs` row (`id, rank, stream, attempt, wall, text`).
fn log_line(r: &rusqlite::Row<'_>) -> rusqlite::Result<LogLine> {
    Ok(LogLine {
        id: r.get::<_, i64>(0)?.unsigned_abs(),
        rank: r.get(1)?,
        stream: if r.get::<_, i64>(2)? == 0 {
            Stream::Stdout
        } else {
            Stream::Stderr
        },
        attempt: r.get(3)?,
        wall: r.get(4)?,
        text: r.get(5)?,
    })
}

fn get_run(conn: &Connection, id: &str) -> Result<RunInfo, StorageError> {
    conn.query_row(&format!("{RUN_SELECT} WHERE r.id = ?1"), [id], run_row)
        .optional()
        .map_err(backend)?
        .ok_or_else(|| runs::no_run(id))
}

fn project_id(conn: &Connection, name: &str) -> Result<i64, StorageError> {
    conn.execute("INSERT OR IGNORE INTO projects(name) VALUES (?1)", [name])
        .map_err(backend)?;
    conn.query_row("SELECT id FROM projects WHERE name = ?1", [name], |r| {
        r.get(0)
    })
    .map_err(backend)
}

impl Storage for SqliteStorage {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn open_run(&self, init: &RunInit, now: f64) -> Result<RunInfo, StorageError> {
        let init = init.clone();
        let now = now_or(now);
        self.write(move |conn| {
            let project = init.project.as_deref().unwrap_or(DEFAULT_PROJECT);
            let project_id = project_id(conn, project)?;
            let id = init.id.clone().unwrap_or_else(runs::new_run_id);
            let existing = conn
                .query_row("SELECT project_id, project_set FROM runs WHERE id = ?1", [&id], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, bool>(1)?))
                })
                .optional()
                .map_err(backend)?;
            let config = init.config.clone().unwrap_or(Value::Object(Default::default()));
            if let Some((pid, set)) = existing {
                match runs::project_rule(init.project.is_some(), pid == project_id, set) {
                    ProjectRule::Keep => {}
                    ProjectRule::Adopt => {
                        conn.execute(
                            "UPDATE runs SET project_id = ?2, project_set = 1 WHERE id = ?1",
                            params![id, project_id],
                        )
                        .map_err(backend)?;
                    }
                    ProjectRule::Refuse => {
                        let theirs = get_run(conn, &id)?.project;
                        return Err(runs::project_conflict(&id, &theirs, project));
                    }
                }
            }
            match existing {
                Some(_) => {
                    // Resuming: what the caller gives replaces what was. The
                    // status moves with events only: a late spool shipped
                    // after the run finished must not make it running again.
                    conn.execute(
                        "UPDATE runs SET updated_at = ?2 WHERE id = ?1",
                        params![id, now],
                    )
                    .map_err(backend)?;
                    if let Some(name) = &init.name {
                        conn.execute("UPDATE runs SET name = ?2 WHERE id = ?1", params![id, name])
                            .map_err(backend)?;
                    }
                    if init.config.is_some() {
                        conn.execute("UPDATE runs SET config = ?2 WHERE id = ?1", params![id, config.to_string()])
                            .map_err(backend)?;
                    }
                    if !init.tags.is_empty() {
                        conn.execute(
                            "UPDATE runs SET tags = ?2 WHERE id = ?1",
                            params![id, runs::tags_json(&init.tags)],
                        )
                        .map_err(backend)?;
                    }
                    if let Some(notes) = &init.notes {
                        conn.execute("UPDATE runs SET notes = ?2 WHERE id = ?1", params![id, notes])
                            .map_err(backend)?;
                    }
                }
                None => {
                    conn.execute(
                        "INSERT INTO runs(id, project_id, name, status, created_at, updated_at, attempts, project_set, tags, notes, config) \
                         VALUES (?1, ?2, ?3, 'running', ?4, ?4, 0, ?8, ?5, ?6, ?7)",
                        params![
                            id,
                            project_id,
                            init.name.clone().unwrap_or_else(|| id.clone()),
                            now,
                            runs::tags_json(&init.tags),
                            init.notes.clone().unwrap_or_default(),
                            config.to_string(),
                            init.project.is_some(),
                        ],
                    )
                    .map_err(backend)?;
                }
            }
            let attempt = attempt_of(conn, &id, &init.attempt_token, init.attempt_started, now)?;
            let mut info = get_run(conn, &id)?;
            info.attempt = Some(attempt);
            Ok(info)
        })
    }

    fn get_run(&self, id: &str) -> Result<RunInfo, StorageError> {
        self.read(|conn| get_run(conn, id))
    }

    fn patch_run(&self, id: &str, patch: &RunPatch, now: f64) -> Result<RunInfo, StorageError> {
        let (id, patch, now) = (id.to_owned(), patch.clone(), now_or(now));
        self.write(move |conn| {
            get_run(conn, &id)?;
            if let Some(status) = patch.status {
                conn.execute(
                    "UPDATE runs SET status = ?2 WHERE id = ?1",
                    params![id, status.as_str()],
                )
                .map_err(backend)?;
            }
            if let Some(tags) = &patch.tags {
                conn.execute(
                    "UPDATE runs SET tags = ?2 WHERE id = ?1",
                    params![id, runs::tags_json(tags)],
                )
                .map_err(backend)?;
            }
            if let Some(notes) = &patch.notes {
                conn.execute(
                    "UPDATE runs SET notes = ?2 WHERE id = ?1",
                    params![id, notes],
                )
                .map_err(backend)?;
            }
            if let Some(config) = &patch.config {
                conn.execute(
                    "UPDATE runs SET config = ?2 WHERE id = ?1",
                    params![id, config.to_string()],
                )
                .map_err(backend)?;
            }
            conn.execute(
                "UPDATE runs SET updated_at = ?2 WHERE id = ?1",
                params![id, now],
            )
            .map_err(backend)?;
            get_run(conn, &id)
        })
    }

    fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunInfo>, StorageError> {
        let (selected, args) = filtered_runs(filter, RUN_COLUMNS)?;
        self.read(|conn| {
            let mut stmt = conn.prepare(&selected).map_err(backend)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(args), run_row)
                .map_err(backend)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(backend)?;
            Ok(rows)
        })
    }

    fn count_runs(&self, filter: &RunFilter) -> Result<u64, StorageError> {
        let (sql, args) = counted_runs(filter)?;
        self.read(|conn| {
            conn.query_row(&sql, rusqlite::params_from_iter(args), |r| {
                r.get::<_, i64>(0)
            })
            .map(i64::unsigned_abs)
            .map_err(backend)
        })
    }

    fn metric_names(&self, filter: &RunFilter) -> Result<Vec<String>, StorageError> {
        let (selected, args) = filtered_runs(filter, "r.id")?;
        self.read(|conn| {
            let sql = format!(
                "SELECT DISTINCT k.name FROM keys k WHERE k.run_id IN ({selected}) ORDER BY k.name"
            );
            let mut stmt = conn.prepare(&sql).map_err(backend)?;
            let names = stmt
                .query_map(rusqlite::params_from_iter(args), |r| r.get(0))
                .map_err(backend)?
                .collect::<Result<Vec<String>, _>>()
                .map_err(backend)?;
            Ok(names)
        })
    }

    fn latest_of_runs(
        &self,
        filter: &RunFilter,
        keys: &[String],
    ) -> Result<Vec<RunLatest>, StorageError> {
        let (selected, mut args) = filtered_runs(filter, "r.id")?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let first_key = args.len() + 1;
        let placeholders = (first_key..first_key + keys.len())
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        args.extend(keys.iter().map(|k| rusqlite::types::Value::Text(k.clone())));
        self.read(|conn| {
            // The lowest rank that logged each key, as a series read
            // without `rank` shows.
            let sql = format!(
                "SELECT k.run_id, k.name, l.rank, l.step, l.value, l.wall, l.attempt \
                 FROM keys k JOIN latest l ON l.key_id = k.id \
                 WHERE k.name IN ({placeholders}) AND k.run_id IN ({selected}) \
                 AND l.rank = (SELECT MIN(l2.rank) FROM latest l2 WHERE l2.key_id = k.id) \
                 ORDER BY k.run_id, k.name"
            );
            let mut stmt = conn.prepare(&sql).map_err(backend)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(args), |r| {
                    Ok(RunLatest {
                        run: r.get(0)?,
                        latest: Latest {
                            key: r.get(1)?,
                            rank: r.get(2)?,
                            step: r.get(3)?,
                            value: r.get::<_, Option<f64>>(4)?.unwrap_or(f64::NAN),
                            wall: r.get(5)?,
                            attempt: r.get(6)?,
                        },
                    })
                })
                .map_err(backend)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(backend)?;
            Ok(rows)
        })
    }

    fn ingest(&self, run: &str, batch: &Batch, now: f64) -> Result<Ack, StorageError> {
        ingest::check(batch)?;
        let now = now_or(now);
        // A big batch is stored in parts, each a transaction of its own,
        // so that small writers' commits go between them (`writer.rs`);
        // only one part's copy is made at a time.
        let mut ack = None;
        for (range, rows) in ingest::parts(batch, INGEST_PART_ROWS) {
            let part = Batch {
                writer: batch.writer.clone(),
                attempt_token: batch.attempt_token.clone(),
                records: batch.records[range].to_vec(),
            };
            let run = run.to_owned();
            ack = Some(
                self.writer
                    .write_rows(rows, move |conn| batches::ingest(conn, &run, &part, now))?,
            );
        }
        // (`parts` is never empty.)
        Ok(ack.unwrap_or_else(|| ingest::ack(batch, 0)))
    }

    fn watermark(&self, run: &str, writer: &str) -> Result<u64, StorageError> {
        self.read(|conn| watermark(conn, run, writer))
    }

    fn keys(&self, run: &str) -> Result<Vec<String>, StorageError> {
        self.read(|conn| {
            get_run(conn, run)?;
            let mut stmt = conn
                .prepare("SELECT name FROM keys WHERE run_id = ?1 ORDER BY name")
                .map_err(backend)?;
            let keys = stmt
                .query_map([run], |r| r.get(0))
                .map_err(backend)?
                .collect::<Result<Vec<String>, _>>()
                .map_err(backend)?;
            Ok(keys)
        })
    }

    fn series(&self, run: &str, query: &SeriesQuery) -> Result<Series, StorageError> {
        self.read(|conn| {
            get_run(conn, run)?;
            let key_id: i64 = conn
                .query_row("SELECT id FROM keys WHERE run_id = ?1 AND name = ?2", params![run, query.key], |r| r.get(0))
                .optional()
                .map_err(backend)?
                .ok_or_else(|| runs::no_metric(run, &query.key))?;
            let rank: u32 = match query.rank {
                Some(rank) => rank,
                None => conn
                    .query_row("SELECT MIN(rank) FROM chunks WHERE key_id = ?1", [key_id], |r| r.get::<_, Option<u32>>(0))
                    .map_err(backend)?
                    .unwrap_or(0),
            };
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, attempt, first_step, last_step, count, vmin, vmax, last_value, last_wall \
                     FROM chunks WHERE key_id = ?1 AND rank = ?2 ORDER BY first_step, id",
                )
                .map_err(backend)?;
            let order = attempt_order(conn, run)?;
            let chunks = stmt
                .query_map(params![key_id, rank], |r| {
                    let attempt: u32 = r.get(1)?;
                    Ok(ChunkMeta {
                        id: r.get(0)?,
                        attempt,
                        order: order.get(&attempt).copied().unwrap_or(attempt),
                        summary: Summary {
                            first_step: r.get(2)?,
                            last_step: r.get(3)?,
                            count: r.get::<_, i64>(4)?.unsigned_abs(),
                            min: r.get::<_, Option<f64>>(5)?.unwrap_or(f64::NAN),
                            max: r.get::<_, Option<f64>>(6)?.unwrap_or(f64::NAN),
                            last_value: r.get::<_, Option<f64>>(7)?.unwrap_or(f64::NAN),
                            last_wall: r.get(8)?,
                        },
                    })
                })
                .map_err(backend)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(backend)?;
            let mut source = SqliteChunks { conn };
            let (total, points) = assemble(&chunks, query, &mut source)?;
            Ok(runs::series(query, rank, total, points))
        })
    }

    fn latest(&self, run: &str) -> Result<Vec<Latest>, StorageError> {
        self.read(|conn| {
            get_run(conn, run)?;
            let mut stmt = conn
                .prepare(
                    "SELECT k.name, l.rank, l.step, l.value, l.wall, l.attempt FROM latest l \
                     JOIN keys k ON k.id = l.key_id WHERE k.run_id = ?1 ORDER BY k.name, l.rank",
                )
                .map_err(backend)?;
            let rows = stmt
                .query_map([run], |r| {
                    Ok(Latest {
                        key: r.get(0)?,
                        rank: r.get(1)?,
                        step: r.get(2)?,
                        value: r.get::<_, Option<f64>>(3)?.unwrap_or(f64::NAN),
                        wall: r.get(4)?,
                        attempt: r.get(5)?,
                    })
                })
                .map_err(backend)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(backend)?;
            Ok(rows)
        })
    }

    fn logs(
        &self,
        run: &str,
        rank: Option<u32>,
        after: u64,
        limit: u32,
    ) -> Result<Vec<LogLine>, StorageError> {
        self.read(|conn| {
            get_run(conn, run)?;
            let after = i64::try_from(after).unwrap_or(i64::MAX);
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, rank, stream, attempt, wall, text FROM logs \
                     WHERE run_id = ?1 AND id > ?2 AND (?3 IS NULL OR rank = ?3) ORDER BY id LIMIT ?4",
                )
                .map_err(backend)?;
            let rows = stmt
                .query_map(params![run, after, rank, limit.min(MAX_PAGE)], log_line)
                .map_err(backend)?;
            runs::log_page(rows).map_err(backend)
        })
    }

    fn log_tail(&self, run: &str, rank: Option<u32>, n: u32) -> Result<Vec<LogLine>, StorageError> {
        self.read(|conn| {
            get_run(conn, run)?;
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, rank, stream, attempt, wall, text FROM logs \
                     WHERE run_id = ?1 AND (?2 IS NULL OR rank = ?2) ORDER BY id DESC LIMIT ?3",
                )
                .map_err(backend)?;
            let rows = stmt
                .query_map(params![run, rank, n.min(MAX_PAGE)], log_line)
                .map_err(backend)?;
            let mut rows = runs::log_page(rows).map_err(backend)?;
            rows.reverse();
            Ok(rows)
        })
    }

    fn events(&self, run: &str) -> Result<Vec<Event>, StorageError> {
        self.read(|conn| {
            get_run(conn, run)?;
            let mut stmt = conn
                .prepare("SELECT id, kind, attempt, wall, text, data FROM events WHERE run_id = ?1 ORDER BY id")
                .map_err(backend)?;
            let rows = stmt
                .query_map([run], |r| {
                    let data: String = r.get(5)?;
                    Ok(Event {
                        id: r.get::<_, i64>(0)?.unsigned_abs(),
                        kind: r.get(1)?,
                        attempt: r.get(2)?,
                        wall: r.get(3)?,
                        text: r.get(4)?,
                        data: runs::json_from(&data),
                    })
                })
                .map_err(backend)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(backend)?;
            Ok(rows)
        })
    }

    fn timeline(&self, run: &str) -> Result<Timeline, StorageError> {
        self.read(|conn| {
            // One snapshot for every query.
            let tx = conn.unchecked_transaction().map_err(backend)?;
            get_run(&tx, run)?;
            let chunks = SqliteChunks { conn: &tx };
            gather(&mut timeline::SqliteTimeline { run, chunks })
        })
    }

    fn commit_file(
        &self,
        run: &str,
        file: &FileManifest,
        now: f64,
    ) -> Result<FileInfo, StorageError> {
        let (run, file, now) = (run.to_owned(), file.clone(), now_or(now));
        self.write(move |conn| {
            get_run(conn, &run)?;
            let mut clash = conn
                .prepare_cached("SELECT name FROM files WHERE run_id = ?1 AND name = ?2")
                .map_err(backend)?;
            for folder in runs::folders_of(&file.name) {
                if let Some(other) = clash
                    .query_row(params![run, folder], |r| r.get::<_, String>(0))
                    .optional()
                    .map_err(backend)?
                {
                    return Err(runs::file_or_folder(&run, &file.name, &other));
                }
            }
            let below = format!("{}/", file.name);
            if let Some(other) = conn
                .query_row(
                    "SELECT name FROM files WHERE run_id = ?1 \
                     AND substr(name, 1, length(?2)) = ?2 LIMIT 1",
                    params![run, below],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(backend)?
            {
                return Err(runs::file_or_folder(&run, &file.name, &other));
            }
            let chunks = runs::chunks_json(&file.chunks)?;
            // Its chunks sent straight to the bucket are confirmed now.
            let mut settle = conn
                .prepare_cached("DELETE FROM pending_chunks WHERE hash = ?1")
                .map_err(backend)?;
            for chunk in &file.chunks {
                settle.execute([&chunk.hash]).map_err(backend)?;
            }
            conn.execute(
                "INSERT OR REPLACE INTO files (run_id, name, size, blake3, chunks, n_chunks, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    run,
                    file.name,
                    i64::try_from(file.size).unwrap_or(i64::MAX),
                    file.blake3,
                    chunks,
                    file.chunks.len() as i64,
                    now
                ],
            )
            .map_err(backend)?;
            conn.execute(
                "UPDATE runs SET updated_at = ?2 WHERE id = ?1",
                params![run, now],
            )
            .map_err(backend)?;
            Ok(FileInfo {
                name: file.name,
                size: file.size,
                blake3: file.blake3,
                chunks: file.chunks.len() as u64,
                created_at: now,
            })
        })
    }

    fn files(&self, run: &str) -> Result<Vec<FileInfo>, StorageError> {
        self.read(|conn| {
            get_run(conn, run)?;
            let mut stmt = conn
                .prepare_cached(
                    "SELECT name, size, blake3, n_chunks, created_at FROM files
                     WHERE run_id = ?1 ORDER BY name",
                )
                .map_err(backend)?;
            let rows = stmt.query_map(params![run], file_row).map_err(backend)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(backend)
        })
    }

    fn file(&self, run: &str, name: &str) -> Result<(FileInfo, Vec<ChunkRef>), StorageError> {
        self.read(|conn| {
            get_run(conn, run)?;
            let found = conn
                .query_row(
                    "SELECT name, size, blake3, n_chunks, created_at, chunks FROM files
                     WHERE run_id = ?1 AND name = ?2",
                    params![run, name],
                    |row| Ok((file_row(row)?, row.get::<_, String>(5)?)),
                )
                .optional()
                .map_err(backend)?;
            let Some((info, chunks)) = found else {
                return Err(runs::no_file(run, name));
            };
            Ok((info, runs::chunks_from(&chunks, run, name)?))
        })
    }

    fn pend_chunks(&self, chunks: &[DirectChunk], now: f64) -> Result<(), StorageError> {
        let (chunks, now) = (chunks.to_vec(), now_or(now));
        self.write(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "INSERT INTO pending_chunks (hash, size, sha256, handed_at)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (hash) DO UPDATE SET size = excluded.size,
                         sha256 = excluded.sha256, handed_at = excluded.handed_at",
                )
                .map_err(backend)?;
            for c in &chunks {
                let size = i64::try_from(c.size).unwrap_or(i64::MAX);
                stmt.execute(params![c.hash, size, c.sha256, now])
                    .map_err(backend)?;
            }
            Ok(())
        })
    }

    fn pending_chunks(&self, hashes: &[String]) -> Result<Vec<DirectChunk>, StorageError> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare_cached("SELECT size, sha256 FROM pending_chunks WHERE hash = ?1")
                .map_err(backend)?;
            let mut found = Vec::new();
            for hash in hashes {
                if let Some((size, sha256)) = stmt
                    .query_row([hash], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                    })
                    .optional()
                    .map_err(backend)?
                {
                    found.push(DirectChunk {
                        hash: hash.clone(),
                        size: size.max(0) as u64,
                        sha256,
                    });
                }
            }
            Ok(found)
        })
    }

    fn stale_chunks(&self, before: f64, limit: usize) -> Result<Vec<String>, StorageError> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT hash FROM pending_chunks WHERE handed_at < ?1
                     ORDER BY handed_at LIMIT ?2",
                )
                .map_err(backend)?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = stmt
                .query_map(params![before, limit], |r| r.get::<_, String>(0))
                .map_err(backend)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(backend)
        })
    }

    fn drop_stale_chunks(&self, hashes: &[String], before: f64) -> Result<(), StorageError> {
        let hashes = hashes.to_vec();
        self.write(move |conn| {
            let mut stmt = conn
                .prepare_cached("DELETE FROM pending_chunks WHERE hash = ?1 AND handed_at < ?2")
                .map_err(backend)?;
            for hash in &hashes {
                stmt.execute(params![hash, before]).map_err(backend)?;
            }
            Ok(())
        })
    }

    fn delete_file(&self, run: &str, name: &str, now: f64) -> Result<FileInfo, StorageError> {
        let (run, name, now) = (run.to_owned(), name.to_owned(), now_or(now));
        self.write(move |conn| {
            get_run(conn, &run)?;
            let gone = conn
                .query_row(
                    "DELETE FROM files WHERE run_id = ?1 AND name = ?2
                     RETURNING name, size, blake3, n_chunks, created_at",
                    params![run, name],
                    file_row,
                )
                .optional()
                .map_err(backend)?
                .ok_or_else(|| runs::no_file(&run, &name))?;
            conn.execute(
                "UPDATE runs SET updated_at = ?2 WHERE id = ?1",
                params![run, now],
            )
            .map_err(backend)?;
            Ok(gone)
        })
    }
}

fn file_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<FileInfo> {
    Ok(FileInfo {
        name: row.get(0)?,
        size: row.get::<_, i64>(1)?.max(0) as u64,
        blake3: row.get(2)?,
        chunks: row.get::<_, i64>(3)?.max(0) as u64,
        created_at: row.get(4)?,
    })
}

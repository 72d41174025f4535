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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use relaunch_api::{
    Ack, Batch, ChunkRef, DEFAULT_PROJECT, Event, FileInfo, FileManifest, Latest, LogLine, Record,
    RunFilter, RunInfo, RunInit, RunLatest, RunPatch, RunStatus, Series, SeriesQuery, Stream,
};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use self::readers::Readers;
use super::chunk::{self, BLOCK, Point, Summary};
use super::downsample::{ChunkMeta, ChunkSource, assemble};
use super::filter::{self, ParamValue};
use super::ingest::{self, Plan};
use super::runs::{self, MAX_PAGE, ProjectRule, now_or};
use super::{Storage, StorageError};

mod readers;
mod schema;
mod transfer;
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

/// Requests committed together at most.
const GROUP_MAX: usize = 256;

/// A write request for the writer thread: its SQL runs in a savepoint; what
/// it returns is delivered once the transaction commits.
type Job = Box<dyn FnOnce(&Connection) -> Done + Send>;
type Deliver = Box<dyn FnOnce(Result<(), String>) + Send>;

struct Done {
    ok: bool,
    deliver: Deliver,
}

pub struct SqliteStorage {
    path: PathBuf,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    readers: Readers,
}

/// Default `--max-readers`.
pub const DEFAULT_MAX_READERS: usize = 4;

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

/// The writing connection to `dir/relaunch.db` (both made if missing), in
/// WAL mode with `durability`'s sync level, its schema in place; and the
/// database's path.
pub(crate) fn open_writer(
    dir: &Path,
    durability: Durability,
) -> Result<(PathBuf, Connection), StorageError> {
    std::fs::create_dir_all(dir).map_err(|e| {
        StorageError::Backend(format!(
            "cannot create the data directory {}: {e}",
            dir.display()
        ))
    })?;
    let path = dir.join("relaunch.db");
    let conn = Connection::open(&path)
        .map_err(|e| StorageError::Backend(format!("cannot open {}: {e}", path.display())))?;
    let synchronous = match durability {
        Durability::Fsync => "FULL",
        Durability::Process => "NORMAL",
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={synchronous}; PRAGMA busy_timeout=10000;"
    ))
    .map_err(backend)?;
    let applied = schema::migrate(&conn, &path)?;
    if !applied.is_empty() {
        tracing::info!(database = %path.display(), versions = ?applied, "applied schema migrations");
    }
    Ok((path, conn))
}

impl SqliteStorage {
    /// Opens (creating) `dir/relaunch.db`.
    pub fn open(dir: &Path, durability: Durability) -> Result<Self, StorageError> {
        let (path, conn) = open_writer(dir, durability)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let writer = std::thread::Builder::new()
            .name("relaunch-db-writer".into())
            .spawn(move || write_loop(conn, rx))
            .map_err(|e| StorageError::Backend(format!("cannot start the database writer: {e}")))?;
        Ok(Self {
            path: path.clone(),
            jobs: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            readers: Readers::new(path.clone(), DEFAULT_MAX_READERS),
        })
    }

    /// Finishes every queued write and stops the writer thread.
    pub fn close(&self) {
        drop(self.jobs.lock().take());
        if let Some(writer) = self.writer.lock().take() {
            let _ = writer.join();
        }
    }

    fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        let (tx, rx) = mpsc::sync_channel::<Result<T, StorageError>>(1);
        let job: Job = Box::new(move |conn| match f(conn) {
            Ok(value) => Done {
                ok: true,
                deliver: Box::new(move |committed| {
                    let _ = tx.send(committed.map(|()| value).map_err(StorageError::Backend));
                }),
            },
            Err(e) => Done {
                ok: false,
                deliver: Box::new(move |_| {
                    let _ = tx.send(Err(e));
                }),
            },
        });
        let sent = self.jobs.lock().as_ref().map(|jobs| jobs.send(job));
        match sent {
            Some(Ok(())) => rx.recv().unwrap_or_else(|_| {
                Err(StorageError::Backend("the database writer stopped".into()))
            }),
            _ => Err(StorageError::Backend("the database is closed".into())),
        }
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

fn write_loop(conn: Connection, rx: mpsc::Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let mut delivers = Vec::with_capacity(jobs.len());
        let began = conn.execute_batch("BEGIN IMMEDIATE");
        for job in jobs {
            let _ = conn.execute_batch("SAVEPOINT job");
            let done = job(&conn);
            let end = if done.ok {
                "RELEASE job"
            } else {
                "ROLLBACK TO job; RELEASE job"
            };
            if let Err(e) = conn.execute_batch(end) {
                tracing::error!(error = %e, "cannot end a savepoint");
            }
            delivers.push(done.deliver);
        }
        let committed = began
            .and_then(|()| conn.execute_batch("COMMIT"))
            .map_err(|e| {
                let _ = conn.execute_batch("ROLLBACK");
                tracing::error!(error = %e, "commit failed; the requests of this group are refused");
                format!("commit failed: {e}")
            });
        for deliver in delivers {
            deliver(committed.clone());
        }
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

/// The runs that `filter` selects, newest first, as SQL selecting
/// `columns` of `runs r JOIN projects p`, and its arguments; a list or a
/// subquery (`... IN (SQL)`).
fn filtered_runs(
    filter: &RunFilter,
    columns: &str,
) -> Result<(String, Vec<rusqlite::types::Value>), StorageError> {
    let params_filter = filter::params(filter)?;
    let mut sql =
        format!("SELECT {columns} FROM runs r JOIN projects p ON p.id = r.project_id WHERE 1=1");
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    if let Some(project) = &filter.project {
        args.push(project.clone().into());
        sql.push_str(&format!(" AND p.name = ?{}", args.len()));
    }
    if let Some(status) = filter.status {
        args.push(status.as_str().to_owned().into());
        sql.push_str(&format!(" AND r.status = ?{}", args.len()));
    }
    if let Some(tag) = &filter.tag {
        args.push(tag.clone().into());
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM json_each(r.tags) WHERE json_each.value = ?{})",
            args.len()
        ));
    }
    for param in params_filter {
        args.push(json_path(&param.path).into());
        let p = args.len();
        args.push(match param.value {
            ParamValue::Integer(i) => rusqlite::types::Value::Integer(i),
            ParamValue::Real(r) => rusqlite::types::Value::Real(r),
            ParamValue::Text(t) => rusqlite::types::Value::Text(t),
        });
        let v = args.len();
        sql.push_str(&format!(" AND json_extract(r.config, ?{p}) = ?{v}"));
    }
    sql.push_str(" ORDER BY r.created_at DESC, r.id");
    sql.push_str(&format!(" LIMIT {}", filter::limit(filter)));
    Ok((sql, args))
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
        let (run, batch) = (run.to_owned(), batch.clone());
        let now = now_or(now);
        self.write(move |conn| ingest(conn, &run, &batch, now))
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
                .map_err(backend)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(backend)?;
            Ok(rows)
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
            let mut rows = stmt
                .query_map(params![run, rank, n.min(MAX_PAGE)], log_line)
                .map_err(backend)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(backend)?;
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

    fn commit_file(
        &self,
        run: &str,
        file: &FileManifest,
        now: f64,
    ) -> Result<FileInfo, StorageError> {
        let (run, file, now) = (run.to_owned(), file.clone(), now_or(now));
        self.write(move |conn| {
            get_run(conn, &run)?;
            let chunks = runs::chunks_json(&file.chunks)?;
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

/// A param filter's path for `json_extract`.
fn json_path(parts: &[String]) -> String {
    format!(
        "$.{}",
        parts
            .iter()
            .map(|p| format!("\"{p}\""))
            .collect::<Vec<_>>()
            .join(".")
    )
}

fn watermark(conn: &Connection, run: &str, writer: &str) -> Result<u64, StorageError> {
    Ok(conn
        .query_row(
            "SELECT watermark FROM writers WHERE run_id = ?1 AND writer = ?2",
            params![run, writer],
            |r| r.get::<_, i64>(0),
        )
        .optional()
        .map_err(backend)?
        .map_or(0, i64::unsigned_abs))
}

/// The attempt number of `token` in `run`: the same token always gets the
/// same number, a new token the next one. `started` (else `now`) records
/// when it began; a process of the attempt that reports an earlier start
/// moves it back.
fn attempt_of(
    conn: &Connection,
    run: &str,
    token: &str,
    started: Option<f64>,
    now: f64,
) -> Result<u32, StorageError> {
    let known = conn
        .prepare_cached("SELECT attempt FROM attempts WHERE run_id = ?1 AND token = ?2")
        .and_then(|mut s| {
            s.query_row(params![run, token], |r| r.get::<_, u32>(0))
                .optional()
        })
        .map_err(backend)?;
    if let Some(attempt) = known {
        if let Some(started) = started.filter(|t| t.is_finite()) {
            conn.prepare_cached(
                "UPDATE attempts SET started = ?3 WHERE run_id = ?1 AND token = ?2 AND started > ?3",
            )
            .and_then(|mut s| s.execute(params![run, token, started]))
            .map_err(backend)?;
        }
        return Ok(attempt);
    }
    let attempt: u32 = conn
        .query_row("SELECT attempts FROM runs WHERE id = ?1", [run], |r| {
            r.get(0)
        })
        .map_err(backend)?;
    let started = started.filter(|t| t.is_finite()).unwrap_or(now);
    conn.execute(
        "INSERT INTO attempts(run_id, token, attempt, started) VALUES (?1, ?2, ?3, ?4)",
        params![run, token, attempt, started],
    )
    .map_err(backend)?;
    conn.execute(
        "UPDATE runs SET attempts = attempts + 1 WHERE id = ?1",
        [run],
    )
    .map_err(backend)?;
    Ok(attempt)
}

/// Each attempt's place when sorted by start (then number): larger is newer.
fn attempt_order(conn: &Connection, run: &str) -> Result<HashMap<u32, u32>, StorageError> {
    let mut stmt = conn
        .prepare_cached("SELECT attempt FROM attempts WHERE run_id = ?1 ORDER BY started, attempt")
        .map_err(backend)?;
    let attempts = stmt
        .query_map([run], |r| r.get::<_, u32>(0))
        .map_err(backend)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(backend)?;
    Ok(runs::attempt_order(attempts))
}

fn ingest(conn: &Connection, run: &str, batch: &Batch, now: f64) -> Result<Ack, StorageError> {
    ingest::check(batch)?;
    get_run(conn, run)?;
    let mark = watermark(conn, run, &batch.writer)?;
    let new = match ingest::plan(batch, mark)? {
        Plan::Stored(ack) => return Ok(ack),
        Plan::New(new) => new,
    };
    let attempt = attempt_of(conn, run, &batch.attempt_token, None, now)?;
    for record in &new.others {
        match record {
            Record::Log {
                rank,
                stream,
                wall,
                text,
            } => {
                conn.prepare_cached(
                    "INSERT INTO logs(run_id, rank, stream, attempt, wall, text) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .and_then(|mut s| {
                    s.execute(params![run, rank, i64::from(*stream == Stream::Stderr), attempt, wall, text])
                })
                .map_err(backend)?;
            }
            Record::Event {
                kind,
                wall,
                text,
                data,
            } => {
                conn.prepare_cached(
                    "INSERT INTO events(run_id, kind, attempt, wall, text, data) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .and_then(|mut s| s.execute(params![run, kind, attempt, wall, text, ingest::event_data(data)]))
                .map_err(backend)?;
                if let Some(status) = ingest::status_of_event(kind) {
                    conn.execute(
                        "UPDATE runs SET status = ?2, status_wall = ?4, updated_at = ?3 WHERE id = ?1 AND status_wall <= ?4",
                        params![run, status.as_str(), now, now_or(*wall)],
                    )
                    .map_err(backend)?;
                }
            }
            Record::Metrics { .. } => {}
        }
    }
    let mut key_ids: HashMap<&str, i64> = HashMap::new();
    for (key, rank, points) in new.chunks() {
        let key_id = match key_ids.get(key) {
            Some(id) => *id,
            None => {
                let id = key_id(conn, run, key)?;
                key_ids.insert(key, id);
                id
            }
        };
        store_chunk(conn, run, key_id, rank, attempt, points)?;
    }
    conn.prepare_cached(
        "INSERT INTO writers(run_id, writer, watermark) VALUES (?1, ?2, ?3) \
         ON CONFLICT(run_id, writer) DO UPDATE SET watermark = excluded.watermark",
    )
    .and_then(|mut s| {
        s.execute(params![
            run,
            batch.writer,
            i64::try_from(new.last).unwrap_or(i64::MAX)
        ])
    })
    .map_err(backend)?;
    conn.prepare_cached("UPDATE runs SET updated_at = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![run, now]))
        .map_err(backend)?;
    Ok(ingest::ack(batch, new.last))
}

fn key_id(conn: &Connection, run: &str, name: &str) -> Result<i64, StorageError> {
    conn.prepare_cached("INSERT OR IGNORE INTO keys(run_id, name) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![run, name]))
        .map_err(backend)?;
    conn.prepare_cached("SELECT id FROM keys WHERE run_id = ?1 AND name = ?2")
        .and_then(|mut s| s.query_row(params![run, name], |r| r.get(0)))
        .map_err(backend)
}

fn store_chunk(
    conn: &Connection,
    run: &str,
    key_id: i64,
    rank: u32,
    attempt: u32,
    points: &[Point],
) -> Result<(), StorageError> {
    let Some(s) = Summary::of(points) else {
        return Ok(());
    };
    // SQLite keeps the infinities as REAL but has no NaN: NaN is NULL, read
    // back as NaN.
    let finite = |v: f64| (!v.is_nan()).then_some(v);
    conn.prepare_cached(
        "INSERT INTO chunks(key_id, rank, attempt, first_step, last_step, count, vmin, vmax, last_value, last_wall, blocks, points) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            key_id,
            rank,
            attempt,
            s.first_step,
            s.last_step,
            i64::try_from(s.count).unwrap_or(i64::MAX),
            finite(s.min),
            finite(s.max),
            finite(s.last_value),
            s.last_wall,
            chunk::encode_blocks(points),
            chunk::encode_points(points),
        ])
    })
    .map_err(backend)?;
    // The newest value: the newest attempt's (by start), and of its values
    // the highest step's.
    conn.prepare_cached(
        "INSERT INTO latest(key_id, rank, step, value, wall, attempt) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
         ON CONFLICT(key_id, rank) DO UPDATE SET step = excluded.step, value = excluded.value, \
         wall = excluded.wall, attempt = excluded.attempt \
         WHERE (excluded.attempt = latest.attempt AND excluded.step >= latest.step) \
         OR (excluded.attempt != latest.attempt AND \
             (SELECT started, attempt FROM attempts WHERE run_id = ?7 AND attempt = excluded.attempt) > \
             (SELECT started, attempt FROM attempts WHERE run_id = ?7 AND attempt = latest.attempt))",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![key_id, rank, s.last_step, finite(s.last_value), s.last_wall, attempt, run])
    })
    .map_err(backend)?;
    Ok(())
}

struct SqliteChunks<'c> {
    conn: &'c Connection,
}

impl ChunkSource for SqliteChunks<'_> {
    fn blocks(&mut self, id: i64) -> Result<Vec<Summary>, StorageError> {
        let bytes: Vec<u8> = self
            .conn
            .prepare_cached("SELECT blocks FROM chunks WHERE id = ?1")
            .and_then(|mut s| s.query_row([id], |r| r.get(0)))
            .map_err(backend)?;
        chunk::decode_blocks(&bytes).map_err(StorageError::Corrupt)
    }

    fn points(&mut self, id: i64) -> Result<Vec<Point>, StorageError> {
        let bytes: Vec<u8> = self
            .conn
            .prepare_cached("SELECT points FROM chunks WHERE id = ?1")
            .and_then(|mut s| s.query_row([id], |r| r.get(0)))
            .map_err(backend)?;
        chunk::decode_points(&bytes).map_err(StorageError::Corrupt)
    }

    fn block_points(&mut self, id: i64, index: usize) -> Result<Vec<Point>, StorageError> {
        // Incremental blob I/O reads only the pages that hold the block,
        // not the chunk's whole blob.
        let size = BLOCK * chunk::POINT_BYTES;
        let blob = self
            .conn
            .blob_open("main", "chunks", "points", id, true)
            .map_err(backend)?;
        let start = index * size;
        let end = (start + size).min(blob.len());
        let mut bytes = vec![0u8; end.saturating_sub(start)];
        blob.read_at_exact(&mut bytes, start).map_err(backend)?;
        chunk::decode_points(&bytes).map_err(StorageError::Corrupt)
    }
}

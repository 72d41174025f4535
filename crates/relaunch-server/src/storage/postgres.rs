//! The PostgreSQL backend: the same tables and guarantees as SQLite's, for
//! a database that several server processes may share.
//!
//! **Driver.** The [`Storage`] trait is blocking and the server already
//! calls it on tokio's blocking threads (`api::blocking`, `reads.rs`), so
//! this uses the blocking `postgres` crate (a thin wrapper over
//! `tokio-postgres`, same maintainers) with an `r2d2` pool
//! (`r2d2_postgres`): the code reads like the SQLite backend's, and no
//! second async runtime has to be bridged. The catch: a `postgres::Client`
//! runs its own small runtime, which must not be started or dropped on an
//! async thread. Every method is called from blocking threads; `open`
//! connects, and `Drop` closes the pools, on a thread of their own, so both
//! are safe from anywhere.
//!
//! **Several processes, one database.** Nothing is cached in the process.
//! Every write runs in one transaction, which first locks its run's row
//! (`SELECT ... FOR UPDATE`): writes to one run are serialized across every
//! server sharing the database, as SQLite's single writer serializes them,
//! while different runs proceed in parallel. So the watermark check, the
//! records and the new watermark commit together, exactly once, even when
//! a client's retries land on different servers; attempt numbers are given
//! under the same lock; and a run's console lines and events are committed
//! in the order of their ids, so a reader's `after` cursor never skips a
//! line committed late. The one exception: a batch of metrics only locks
//! its writer's row instead (the run's row shared), so one run's writers
//! store metrics in parallel, each writer's batches still one at a time. Rows are locked in one order (the run's row, then
//! keys and latest values by key and rank), which leaves no deadlock; a
//! transaction that still fails with a serialization failure or deadlock
//! is retried.
//!
//! **Durability.** A request is answered after its transaction commits;
//! with [`Durability::Fsync`] PostgreSQL's own `synchronous_commit`
//! decides (on by default: flushed to its WAL), with
//! [`Durability::Process`] it is turned off for our sessions.

mod batches;
mod connect;
mod filters;
mod listen;
pub mod schema;
mod timeline;
mod transfer;

use std::time::Duration;

use postgres::error::SqlState;
use postgres::{IsolationLevel, NoTls, Row, Transaction};
use r2d2::{Pool, PooledConnection};
use r2d2_postgres::PostgresConnectionManager;
use relaunch_api::{
    Ack, Batch, ChunkRef, DEFAULT_PROJECT, DirectChunk, Event, FileInfo, FileManifest, Latest,
    LogLine, RunFilter, RunInfo, RunInit, RunLatest, RunPatch, RunStatus, Series, SeriesQuery,
    Stream,
};
use serde_json::Value;

use self::batches::{PgChunks, attempt_of, attempt_order, watermark};
pub use self::connect::PASSWORD_ENV;
use self::connect::Target;
use self::filters::{Arg, counted_runs, filtered_runs, sql_args};
pub use self::transfer::PgTransfer;
use super::chunk::Summary;
use super::downsample::{ChunkMeta, assemble};
use super::runs::{self, MAX_PAGE, ProjectRule, now_or};
use super::sqlite::Durability;
use super::timeline::{Timeline, gather};
use super::{Storage, StorageError};
use postgres::fallible_iterator::FallibleIterator as _;

type Manager = PostgresConnectionManager<NoTls>;

/// Connections writing at once; more writes wait for one.
pub const DEFAULT_MAX_WRITERS: u32 = 8;
/// How long a request waits for a free connection (or for the database to
/// answer a new one) before it fails with 503.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);
/// Times a transaction that failed to serialize is run again.
const RETRIES: usize = 5;

pub struct PgStorage {
    /// `None` only while dropping (the pools close on a thread of their own).
    pools: Option<Pools>,
    target: Target,
    /// The thread that hears of other replicas' console lines, once asked.
    listener: parking_lot::Mutex<Option<listen::Listener>>,
}

struct Pools {
    writers: Pool<Manager>,
    readers: Pool<Manager>,
}

impl std::fmt::Debug for PgStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStorage")
            .field("database", &self.target)
            .finish_non_exhaustive()
    }
}

/// A failure inside a transaction: PostgreSQL's (which may be retried) or
/// ours.
#[derive(Debug)]
pub(crate) enum PgError {
    Db(postgres::Error),
    Storage(StorageError),
}

impl From<postgres::Error> for PgError {
    fn from(e: postgres::Error) -> Self {
        Self::Db(e)
    }
}

impl From<StorageError> for PgError {
    fn from(e: StorageError) -> Self {
        Self::Storage(e)
    }
}

impl PgError {
    fn retryable(&self) -> bool {
        matches!(self, Self::Db(e) if e.code().is_some_and(|c|
            *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED))
    }

    pub(crate) fn into_storage(self) -> StorageError {
        match self {
            Self::Db(e) if connect::is_unavailable(&e) => StorageError::Unavailable(format!(
                "the database (PostgreSQL) is unavailable: {}; retry once it is back",
                connect::describe_error(&e)
            )),
            Self::Db(e) => {
                StorageError::Backend(format!("postgresql: {}", connect::describe_error(&e)))
            }
            Self::Storage(e) => e,
        }
    }
}

type Tx<'a> = Transaction<'a>;

impl PgStorage {
    /// Connects to `url` (`postgres://USER[:PASSWORD]@HOST:PORT/DB`; the
    /// password from `PGPASSWORD` when the URL has none), applies the
    /// schema's missing migrations and refuses a database whose schema is
    /// newer than this binary's. `max_readers` bounds the connections
    /// that read at once (`--max-readers`); writes have their own.
    pub fn open(
        url: &str,
        durability: Durability,
        max_readers: usize,
    ) -> Result<Self, StorageError> {
        let password = std::env::var(PASSWORD_ENV).ok();
        let mut target = connect::parse(url, password)?;
        if durability == Durability::Process {
            let options = target.config.get_options().unwrap_or_default();
            target
                .config
                .options(&format!("{options} -c synchronous_commit=off"));
        }
        // A `postgres::Client` must not be made or dropped on an async
        // thread, and the server opens its storage on one.
        std::thread::scope(|scope| {
            scope
                .spawn(|| Self::connect(target.clone(), max_readers))
                .join()
                .unwrap_or_else(|_| {
                    Err(StorageError::Backend(
                        "the thread connecting to PostgreSQL panicked".into(),
                    ))
                })
        })
    }

    fn connect(target: Target, max_readers: usize) -> Result<Self, StorageError> {
        let mut client = target
            .config
            .connect(NoTls)
            .map_err(|e| connect::connect_error(&target, &e))?;
        let applied = schema::migrate(&mut client, &target.shown)?;
        if !applied.is_empty() {
            tracing::info!(database = %target.shown, versions = ?applied, "applied schema migrations");
        }
        drop(client);
        let pool = |size: u32| {
            Pool::builder()
                .max_size(size)
                .min_idle(Some(0))
                .connection_timeout(CHECKOUT_TIMEOUT)
                .error_handler(Box::new(r2d2::NopErrorHandler))
                .build_unchecked(Manager::new(target.config.clone(), NoTls))
        };
        let readers = u32::try_from(max_readers.max(1)).unwrap_or(u32::MAX);
        Ok(Self {
            pools: Some(Pools {
                writers: pool(DEFAULT_MAX_WRITERS),
                readers: pool(readers),
            }),
            target,
            listener: parking_lot::Mutex::new(None),
        })
    }

    /// `USER@HOST:PORT/DB`, without the password.
    pub fn database(&self) -> &str {
        &self.target.shown
    }

    fn checkout(
        &self,
        pool: fn(&Pools) -> &Pool<Manager>,
    ) -> Result<PooledConnection<Manager>, StorageError> {
        let pools = self
            .pools
            .as_ref()
            .ok_or_else(|| StorageError::Backend("the database is closed".into()))?;
        pool(pools).get().map_err(|e| {
            StorageError::Unavailable(format!(
                "the database (PostgreSQL at {}) is unavailable: {e}; retry once it is back",
                self.target.shown
            ))
        })
    }

    /// Runs `f` in a read-write transaction, committed before this
    /// returns; retried when PostgreSQL could not serialize it.
    fn write<T>(
        &self,
        mut f: impl FnMut(&mut Tx<'_>) -> Result<T, PgError>,
    ) -> Result<T, StorageError> {
        let mut conn = self.checkout(|p| &p.writers)?;
        let mut tries = 0;
        loop {
            tries += 1;
            let result = conn
                .transaction()
                .map_err(PgError::from)
                .and_then(|mut tx| {
                    let value = f(&mut tx)?;
                    tx.commit()?;
                    Ok(value)
                });
            match result {
                Err(e) if e.retryable() && tries <= RETRIES => {
                    tracing::debug!(error = ?e, tries, "retrying a transaction");
                }
                other => return other.map_err(PgError::into_storage),
            }
        }
    }

    /// Runs `f` in a read-only transaction that sees one snapshot.
    fn read<T>(
        &self,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, PgError>,
    ) -> Result<T, StorageError> {
        let mut conn = self.checkout(|p| &p.readers)?;
        let result = conn
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(PgError::from)
            .and_then(|mut tx| {
                let value = f(&mut tx)?;
                tx.commit()?;
                Ok(value)
            });
        result.map_err(PgError::into_storage)
    }
}

impl Drop for PgStorage {
    fn drop(&mut self) {
        // Closing a client blocks on its runtime, which panics on an async
        // thread; the storage may be dropped on one.
        if let Some(pools) = self.pools.take() {
            let _ = std::thread::spawn(move || drop(pools)).join();
        }
    }
}

fn int(v: u32) -> i64 {
    i64::from(v)
}

/// A stored u32 (rank, attempt), which this backend only ever writes from one.
fn small(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

const RUN_SELECT: &str = "SELECT r.id, p.name AS project, r.name, r.status, r.created_at, \
     r.updated_at, r.attempts, r.tags, r.notes, r.config \
     FROM runs r JOIN projects p ON p.id = r.project_id";

fn run_row(row: &Row) -> RunInfo {
    let status: String = row.get("status");
    RunInfo {
        id: row.get("id"),
        project: row.get("project"),
        name: text(row.get("name")),
        status: RunStatus::parse(&status).unwrap_or(RunStatus::Running),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
        attempts: small(row.get("attempts")),
        attempt: None,
        tags: runs::tags_from(row.get("tags")),
        notes: text(row.get("notes")),
        config: runs::json_from(row.get("config")),
    }
}

fn get_run(tx: &mut Tx<'_>, id: &str) -> Result<RunInfo, PgError> {
    tx.query_opt(&format!("{RUN_SELECT} WHERE r.id = $1"), &[&id])?
        .map(|row| run_row(&row))
        .ok_or_else(|| runs::no_run(id).into())
}

/// Locks the run's row until the transaction ends: the point where every
/// write to one run waits its turn, whichever server it came through.
fn lock_run(tx: &mut Tx<'_>, id: &str) -> Result<(), PgError> {
    match tx.query_opt("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", &[&id])? {
        Some(_) => Ok(()),
        None => Err(runs::no_run(id).into()),
    }
}

fn project_id(tx: &mut Tx<'_>, name: &str) -> Result<i64, PgError> {
    tx.execute(
        "INSERT INTO projects(name) VALUES ($1) ON CONFLICT (name) DO NOTHING",
        &[&name],
    )?;
    Ok(tx
        .query_one("SELECT id FROM projects WHERE name = $1", &[&name])?
        .get(0))
}

fn log_line(r: &Row) -> LogLine {
    LogLine {
        id: r.get::<_, i64>(0).unsigned_abs(),
        rank: small(r.get(1)),
        stream: if r.get::<_, i16>(2) == 0 {
            Stream::Stdout
        } else {
            Stream::Stderr
        },
        attempt: small(r.get(3)),
        wall: r.get(4),
        text: text(r.get(5)),
    }
}

fn file_row(row: &Row) -> FileInfo {
    FileInfo {
        name: row.get(0),
        size: row.get::<_, i64>(1).max(0).unsigned_abs(),
        blake3: row.get(2),
        chunks: row.get::<_, i64>(3).max(0).unsigned_abs(),
        created_at: row.get(4),
    }
}

fn latest_row(r: &Row, first: usize) -> Latest {
    Latest {
        key: r.get(first),
        rank: small(r.get(first + 1)),
        step: r.get(first + 2),
        value: r.get(first + 3),
        wall: r.get(first + 4),
        attempt: small(r.get(first + 5)),
    }
}

impl Storage for PgStorage {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn watch_logs(&self, changed: super::LogsChanged) {
        match listen::Listener::start(self.target.clone(), changed) {
            Ok(listener) => *self.listener.lock() = Some(listener),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the thread that listens for other replicas' console lines; log follows wake only for lines sent here")
            }
        }
    }

    fn open_run(&self, init: &RunInit, now: f64) -> Result<RunInfo, StorageError> {
        let now = now_or(now);
        self.write(|tx| {
            let project = init.project.as_deref().unwrap_or(DEFAULT_PROJECT);
            let project_id = project_id(tx, project)?;
            let id = init.id.clone().unwrap_or_else(runs::new_run_id);
            let config = init
                .config
                .clone()
                .unwrap_or(Value::Object(Default::default()))
                .to_string();
            let name = init.name.clone().unwrap_or_else(|| id.clone());
            let added = tx.execute(
                "INSERT INTO runs(id, project_id, name, status, created_at, updated_at, attempts, \
                 project_set, tags, notes, config) \
                 VALUES ($1, $2, $3, 'running', $4, $4, 0, $5, $6, $7, $8) \
                 ON CONFLICT (id) DO NOTHING",
                &[
                    &id,
                    &project_id,
                    &name.as_bytes(),
                    &now,
                    &init.project.is_some(),
                    &runs::tags_json(&init.tags),
                    &init.notes.clone().unwrap_or_default().as_bytes(),
                    &config,
                ],
            )? == 1;
            if !added {
                let row = tx.query_one(
                    "SELECT project_id, project_set FROM runs WHERE id = $1 FOR UPDATE",
                    &[&id],
                )?;
                let (pid, set): (i64, bool) = (row.get(0), row.get(1));
                match runs::project_rule(init.project.is_some(), pid == project_id, set) {
                    ProjectRule::Keep => {}
                    ProjectRule::Adopt => {
                        tx.execute(
                            "UPDATE runs SET project_id = $2, project_set = true WHERE id = $1",
                            &[&id, &project_id],
                        )?;
                    }
                    ProjectRule::Refuse => {
                        let theirs = get_run(tx, &id)?.project;
                        return Err(runs::project_conflict(&id, &theirs, project).into());
                    }
                }
                // Resuming: what the caller gives replaces what was; the
                // status moves with events only.
                tx.execute(
                    "UPDATE runs SET updated_at = $2, \
                     name = COALESCE($3, name), config = COALESCE($4, config), \
                     tags = COALESCE($5, tags), notes = COALESCE($6, notes) WHERE id = $1",
                    &[
                        &id,
                        &now,
                        &init.name.as_deref().map(str::as_bytes),
                        &init.config.as_ref().map(|_| config.as_str()),
                        &(!init.tags.is_empty()).then(|| runs::tags_json(&init.tags)),
                        &init.notes.as_deref().map(str::as_bytes),
                    ],
                )?;
            }
            let attempt = attempt_of(tx, &id, &init.attempt_token, init.attempt_started, now)?;
            let mut info = get_run(tx, &id)?;
            info.attempt = Some(attempt);
            Ok(info)
        })
    }

    fn get_run(&self, id: &str) -> Result<RunInfo, StorageError> {
        self.read(|tx| get_run(tx, id))
    }

    fn patch_run(&self, id: &str, patch: &RunPatch, now: f64) -> Result<RunInfo, StorageError> {
        let now = now_or(now);
        self.write(|tx| {
            lock_run(tx, id)?;
            tx.execute(
                "UPDATE runs SET updated_at = $2, status = COALESCE($3, status), \
                 tags = COALESCE($4, tags), notes = COALESCE($5, notes), \
                 config = COALESCE($6, config) WHERE id = $1",
                &[
                    &id,
                    &now,
                    &patch.status.map(|s| s.as_str()),
                    &patch.tags.as_deref().map(runs::tags_json),
                    &patch.notes.as_deref().map(str::as_bytes),
                    &patch.config.as_ref().map(Value::to_string),
                ],
            )?;
            get_run(tx, id)
        })
    }

    fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunInfo>, StorageError> {
        let columns = "r.id, p.name AS project, r.name, r.status, r.created_at, r.updated_at, \
                       r.attempts, r.tags, r.notes, r.config";
        let (sql, args) = filtered_runs(filter, columns)?;
        self.read(|tx| {
            Ok(tx
                .query(&sql, &sql_args(&args))?
                .iter()
                .map(run_row)
                .collect())
        })
    }

    fn count_runs(&self, filter: &RunFilter) -> Result<u64, StorageError> {
        let (sql, args) = counted_runs(filter)?;
        self.read(|tx| {
            let n: i64 = tx.query_one(&sql, &sql_args(&args))?.get(0);
            Ok(n.unsigned_abs())
        })
    }

    fn metric_names(&self, filter: &RunFilter) -> Result<Vec<String>, StorageError> {
        let (selected, args) = filtered_runs(filter, "r.id")?;
        let sql = format!(
            "SELECT DISTINCT k.name FROM keys k WHERE k.run_id IN ({selected}) ORDER BY k.name"
        );
        self.read(|tx| {
            Ok(tx
                .query(&sql, &sql_args(&args))?
                .iter()
                .map(|r| r.get(0))
                .collect())
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
        args.push(Arg::Path(keys.to_vec()));
        // The lowest rank that logged each key, as a series read without
        // `rank` shows. (The runs' subquery is ordered and limited, as
        // SQLite's is: the limit picks which runs.)
        let sql = format!(
            "SELECT k.run_id, k.name, l.rank, l.step, l.value, l.wall, l.attempt \
             FROM keys k JOIN latest l ON l.key_id = k.id \
             WHERE k.name = ANY(${}::TEXT[]) AND k.run_id IN ({selected}) \
             AND l.rank = (SELECT MIN(l2.rank) FROM latest l2 WHERE l2.key_id = k.id) \
             ORDER BY k.run_id, k.name",
            args.len()
        );
        self.read(|tx| {
            Ok(tx
                .query(&sql, &sql_args(&args))?
                .iter()
                .map(|r| RunLatest {
                    run: r.get(0),
                    latest: latest_row(r, 1),
                })
                .collect())
        })
    }

    fn ingest(&self, run: &str, batch: &Batch, now: f64) -> Result<Ack, StorageError> {
        let now = now_or(now);
        self.write(|tx| batches::ingest(tx, run, batch, now))
    }

    fn watermark(&self, run: &str, writer: &str) -> Result<u64, StorageError> {
        self.read(|tx| watermark(tx, run, writer))
    }

    fn keys(&self, run: &str) -> Result<Vec<String>, StorageError> {
        self.read(|tx| {
            get_run(tx, run)?;
            Ok(tx
                .query(
                    "SELECT name FROM keys WHERE run_id = $1 ORDER BY name",
                    &[&run],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect())
        })
    }

    fn series(&self, run: &str, query: &SeriesQuery) -> Result<Series, StorageError> {
        self.read(|tx| {
            get_run(tx, run)?;
            let key_id: i64 = tx
                .query_opt(
                    "SELECT id FROM keys WHERE run_id = $1 AND name = $2",
                    &[&run, &query.key],
                )?
                .ok_or_else(|| runs::no_metric(run, &query.key))?
                .get(0);
            let rank = match query.rank {
                Some(rank) => rank,
                None => tx
                    .query_one("SELECT MIN(rank) FROM chunks WHERE key_id = $1", &[&key_id])?
                    .get::<_, Option<i64>>(0)
                    .map_or(0, small),
            };
            let order = attempt_order(tx, run)?;
            let chunks: Vec<ChunkMeta> = tx
                .query(
                    "SELECT id, attempt, first_step, last_step, count, vmin, vmax, last_value, \
                     last_wall FROM chunks WHERE key_id = $1 AND rank = $2 \
                     ORDER BY first_step, id",
                    &[&key_id, &int(rank)],
                )?
                .iter()
                .map(|r| {
                    let attempt = small(r.get(1));
                    ChunkMeta {
                        id: r.get(0),
                        attempt,
                        order: order.get(&attempt).copied().unwrap_or(attempt),
                        summary: Summary {
                            first_step: r.get(2),
                            last_step: r.get(3),
                            count: r.get::<_, i64>(4).unsigned_abs(),
                            min: r.get(5),
                            max: r.get(6),
                            last_value: r.get(7),
                            last_wall: r.get(8),
                        },
                    }
                })
                .collect();
            let mut source = PgChunks { tx };
            let (total, points) = assemble(&chunks, query, &mut source)?;
            Ok(runs::series(query, rank, total, points))
        })
    }

    fn latest(&self, run: &str) -> Result<Vec<Latest>, StorageError> {
        self.read(|tx| {
            get_run(tx, run)?;
            Ok(tx
                .query(
                    "SELECT k.name, l.rank, l.step, l.value, l.wall, l.attempt FROM latest l \
                     JOIN keys k ON k.id = l.key_id WHERE k.run_id = $1 ORDER BY k.name, l.rank",
                    &[&run],
                )?
                .iter()
                .map(|r| latest_row(r, 0))
                .collect())
        })
    }

    fn logs(
        &self,
        run: &str,
        rank: Option<u32>,
        after: u64,
        limit: u32,
    ) -> Result<Vec<LogLine>, StorageError> {
        self.read(|tx| {
            get_run(tx, run)?;
            let after = i64::try_from(after).unwrap_or(i64::MAX);
            // Rows as they arrive (query_raw does not buffer the answer),
            // so a page stops at its byte budget without holding the rest.
            let params: [&(dyn postgres::types::ToSql + Sync); 4] =
                [&run, &after, &rank.map(int), &int(limit.min(MAX_PAGE))];
            let rows = tx.query_raw(
                "SELECT id, rank, stream, attempt, wall, text FROM logs \
                 WHERE run_id = $1 AND id > $2 AND ($3::BIGINT IS NULL OR rank = $3) \
                 ORDER BY id LIMIT $4",
                params,
            )?;
            Ok(runs::log_page(
                rows.iterator().map(|r| r.map(|r| log_line(&r))),
            )?)
        })
    }

    fn log_tail(&self, run: &str, rank: Option<u32>, n: u32) -> Result<Vec<LogLine>, StorageError> {
        self.read(|tx| {
            get_run(tx, run)?;
            let params: [&(dyn postgres::types::ToSql + Sync); 3] =
                [&run, &rank.map(int), &int(n.min(MAX_PAGE))];
            let rows = tx.query_raw(
                "SELECT id, rank, stream, attempt, wall, text FROM logs \
                 WHERE run_id = $1 AND ($2::BIGINT IS NULL OR rank = $2) \
                 ORDER BY id DESC LIMIT $3",
                params,
            )?;
            let mut rows = runs::log_page(rows.iterator().map(|r| r.map(|r| log_line(&r))))?;
            rows.reverse();
            Ok(rows)
        })
    }

    fn events(&self, run: &str) -> Result<Vec<Event>, StorageError> {
        self.read(|tx| {
            get_run(tx, run)?;
            Ok(tx
                .query(
                    "SELECT id, kind, attempt, wall, text, data FROM events \
                     WHERE run_id = $1 ORDER BY id",
                    &[&run],
                )?
                .iter()
                .map(|r| Event {
                    id: r.get::<_, i64>(0).unsigned_abs(),
                    kind: r.get(1),
                    attempt: small(r.get(2)),
                    wall: r.get(3),
                    text: text(r.get(4)),
                    data: runs::json_from(r.get(5)),
                })
                .collect())
        })
    }

    fn timeline(&self, run: &str) -> Result<Timeline, StorageError> {
        self.read(|tx| {
            get_run(tx, run)?;
            let chunks = PgChunks { tx };
            Ok(gather(&mut timeline::PgTimeline { run, chunks })?)
        })
    }

    fn commit_file(
        &self,
        run: &str,
        file: &FileManifest,
        now: f64,
    ) -> Result<FileInfo, StorageError> {
        let now = now_or(now);
        let chunks = runs::chunks_json(&file.chunks)?;
        self.write(|tx| {
            lock_run(tx, run)?;
            let folders: Vec<&str> = runs::folders_of(&file.name);
            let below = format!("{}/", file.name);
            if let Some(row) = tx.query_opt(
                "SELECT name FROM files WHERE run_id = $1 \
                 AND (name = ANY($2) OR substr(name, 1, length($3)) = $3) LIMIT 1",
                &[&run, &folders, &below],
            )? {
                return Err(runs::file_or_folder(run, &file.name, row.get(0)).into());
            }
            // Its chunks sent straight to the bucket are confirmed now.
            let hashes: Vec<&str> = file.chunks.iter().map(|c| c.hash.as_str()).collect();
            tx.execute(
                "DELETE FROM pending_chunks WHERE hash = ANY($1)",
                &[&hashes],
            )?;
            tx.execute(
                "INSERT INTO files (run_id, name, size, blake3, chunks, n_chunks, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (run_id, name) DO UPDATE SET size = EXCLUDED.size, \
                 blake3 = EXCLUDED.blake3, chunks = EXCLUDED.chunks, \
                 n_chunks = EXCLUDED.n_chunks, created_at = EXCLUDED.created_at",
                &[
                    &run,
                    &file.name,
                    &i64::try_from(file.size).unwrap_or(i64::MAX),
                    &file.blake3,
                    &chunks,
                    &i64::try_from(file.chunks.len()).unwrap_or(i64::MAX),
                    &now,
                ],
            )?;
            tx.execute(
                "UPDATE runs SET updated_at = $2 WHERE id = $1",
                &[&run, &now],
            )?;
            Ok(FileInfo {
                name: file.name.clone(),
                size: file.size,
                blake3: file.blake3.clone(),
                chunks: file.chunks.len() as u64,
                created_at: now,
            })
        })
    }

    fn pend_chunks(&self, chunks: &[DirectChunk], now: f64) -> Result<(), StorageError> {
        let now = now_or(now);
        let hashes: Vec<&str> = chunks.iter().map(|c| c.hash.as_str()).collect();
        let sizes: Vec<i64> = chunks
            .iter()
            .map(|c| i64::try_from(c.size).unwrap_or(i64::MAX))
            .collect();
        let sums: Vec<&str> = chunks.iter().map(|c| c.sha256.as_str()).collect();
        self.write(|tx| {
            tx.execute(
                "INSERT INTO pending_chunks (hash, size, sha256, handed_at) \
                 SELECT h, s, c, $4 FROM unnest($1::text[], $2::bigint[], $3::text[]) AS t(h, s, c) \
                 ON CONFLICT (hash) DO UPDATE SET size = EXCLUDED.size, \
                 sha256 = EXCLUDED.sha256, handed_at = EXCLUDED.handed_at",
                &[&hashes, &sizes, &sums, &now],
            )?;
            Ok(())
        })
    }

    fn pending_chunks(&self, hashes: &[String]) -> Result<Vec<DirectChunk>, StorageError> {
        self.read(|tx| {
            let rows = tx.query(
                "SELECT hash, size, sha256 FROM pending_chunks WHERE hash = ANY($1)",
                &[&hashes],
            )?;
            Ok(rows
                .iter()
                .map(|r| DirectChunk {
                    hash: r.get(0),
                    size: r.get::<_, i64>(1).max(0) as u64,
                    sha256: r.get(2),
                })
                .collect())
        })
    }

    fn stale_chunks(&self, before: f64, limit: usize) -> Result<Vec<String>, StorageError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(|tx| {
            let rows = tx.query(
                "SELECT hash FROM pending_chunks WHERE handed_at < $1 \
                 ORDER BY handed_at LIMIT $2",
                &[&before, &limit],
            )?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    fn drop_stale_chunks(&self, hashes: &[String], before: f64) -> Result<(), StorageError> {
        self.write(|tx| {
            tx.execute(
                "DELETE FROM pending_chunks WHERE hash = ANY($1) AND handed_at < $2",
                &[&hashes, &before],
            )?;
            Ok(())
        })
    }

    fn files(&self, run: &str) -> Result<Vec<FileInfo>, StorageError> {
        self.read(|tx| {
            get_run(tx, run)?;
            Ok(tx
                .query(
                    "SELECT name, size, blake3, n_chunks, created_at FROM files \
                     WHERE run_id = $1 ORDER BY name",
                    &[&run],
                )?
                .iter()
                .map(file_row)
                .collect())
        })
    }

    fn file(&self, run: &str, name: &str) -> Result<(FileInfo, Vec<ChunkRef>), StorageError> {
        self.read(|tx| {
            get_run(tx, run)?;
            let row = tx
                .query_opt(
                    "SELECT name, size, blake3, n_chunks, created_at, chunks FROM files \
                     WHERE run_id = $1 AND name = $2",
                    &[&run, &name],
                )?
                .ok_or_else(|| runs::no_file(run, name))?;
            let chunks = runs::chunks_from(row.get(5), run, name)?;
            Ok((file_row(&row), chunks))
        })
    }

    fn delete_file(&self, run: &str, name: &str, now: f64) -> Result<FileInfo, StorageError> {
        let now = now_or(now);
        self.write(|tx| {
            lock_run(tx, run)?;
            let row = tx
                .query_opt(
                    "DELETE FROM files WHERE run_id = $1 AND name = $2 \
                     RETURNING name, size, blake3, n_chunks, created_at",
                    &[&run, &name],
                )?
                .ok_or_else(|| runs::no_file(run, name))?;
            tx.execute(
                "UPDATE runs SET updated_at = $2 WHERE id = $1",
                &[&run, &now],
            )?;
            Ok(file_row(&row))
        })
    }
}

//! [`Transfer`] on a data directory's SQLite database: one connection of
//! its own, apart from the server's writer thread, since a migrated run is
//! written in one transaction that takes many pages.

use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use super::{Durability, backend};
use crate::storage::StorageError;
use crate::storage::transfer::{
    AttemptRow, ChunkRow, EventRow, FileRow, LatestRow, LogRow, RunCounts, RunHead, RunRow,
    RunWriter, Transfer, WriterRow,
};

/// A data directory's database, read or written whole runs at a time.
#[derive(Debug)]
pub struct SqliteTransfer {
    conn: Connection,
    place: String,
}

/// The tables every relaunch data directory has.
const TABLES: &[&str] = &[
    "projects", "runs", "attempts", "writers", "keys", "chunks", "latest", "logs", "events",
    "files",
];

impl SqliteTransfer {
    /// Opens `dir/relaunch.db` read-only, in one read transaction for as
    /// long as this lives, so everything read comes from one snapshot even
    /// if a server still writes. Refuses a directory that is missing or
    /// not a relaunch data directory.
    pub fn open_source(dir: &Path) -> Result<Self, StorageError> {
        let shown = dir.display();
        if !dir.is_dir() {
            return Err(StorageError::Invalid(format!(
                "the data directory {shown} does not exist; give --from the --data-dir that \
                 relaunch server used"
            )));
        }
        let path = dir.join("relaunch.db");
        if !path.is_file() {
            return Err(StorageError::Invalid(format!(
                "{shown} is not a relaunch data directory (it has no relaunch.db); give the \
                 --data-dir that relaunch server used"
            )));
        }
        let not_ours = |e: &dyn std::fmt::Display| {
            StorageError::Invalid(format!(
                "{} is not a relaunch database ({e}); give the --data-dir that relaunch server used",
                path.display()
            ))
        };
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| not_ours(&e))?;
        conn.execute_batch("PRAGMA busy_timeout=10000; BEGIN")
            .map_err(|e| not_ours(&e))?;
        let found = super::schema::version(&conn).map_err(|e| not_ours(&e))?;
        if found > super::SCHEMA_VERSION {
            return Err(super::schema::too_new(&path, found));
        }
        for table in TABLES {
            let found: Option<i64> = conn
                .query_row(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
                    [table],
                    |r| r.get(0),
                )
                .optional()
                .map_err(|e| not_ours(&e))?;
            if found.is_none() {
                return Err(not_ours(&format!("no table {table}")));
            }
        }
        Ok(Self {
            conn,
            place: format!("data directory {shown}"),
        })
    }

    /// Opens (creating) `dir/relaunch.db` to write runs into, with the
    /// schema the server creates.
    pub fn open_target(dir: &Path, durability: Durability) -> Result<Self, StorageError> {
        let (_, conn) = super::open_writer(dir, durability)?;
        Ok(Self {
            conn,
            place: format!("data directory {}", dir.display()),
        })
    }
}

/// SQLite has no NaN: NULL stands for it.
fn nan_null(v: Option<f64>) -> f64 {
    v.unwrap_or(f64::NAN)
}

fn null_nan(v: f64) -> Option<f64> {
    (!v.is_nan()).then_some(v)
}

impl SqliteTransfer {
    fn rows<T>(
        &self,
        sql: &str,
        args: impl rusqlite::Params,
        f: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>, StorageError> {
        let mut stmt = self.conn.prepare_cached(sql).map_err(backend)?;
        let rows = stmt
            .query_map(args, f)
            .map_err(backend)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(backend)?;
        Ok(rows)
    }

    fn count(&self, sql: &str, run: &str) -> Result<u64, StorageError> {
        let n: i64 = self
            .conn
            .query_row(sql, [run], |r| r.get(0))
            .map_err(backend)?;
        Ok(n.unsigned_abs())
    }
}

impl Transfer for SqliteTransfer {
    fn place(&self) -> String {
        self.place.clone()
    }

    fn projects(&mut self) -> Result<Vec<String>, StorageError> {
        self.rows("SELECT name FROM projects ORDER BY name", [], |r| r.get(0))
    }

    fn run_ids(&mut self) -> Result<Vec<String>, StorageError> {
        self.rows("SELECT id FROM runs ORDER BY created_at, id", [], |r| {
            r.get(0)
        })
    }

    fn run_head(&mut self, id: &str) -> Result<Option<RunHead>, StorageError> {
        let run = self
            .conn
            .query_row(
                "SELECT r.id, p.name, r.project_set, r.name, r.status, r.status_wall, \
                 r.created_at, r.updated_at, r.attempts, r.tags, r.notes, r.config \
                 FROM runs r JOIN projects p ON p.id = r.project_id WHERE r.id = ?1",
                [id],
                |r| {
                    Ok(RunRow {
                        id: r.get(0)?,
                        project: r.get(1)?,
                        project_set: r.get(2)?,
                        name: r.get(3)?,
                        status: r.get(4)?,
                        status_wall: r.get(5)?,
                        created_at: r.get(6)?,
                        updated_at: r.get(7)?,
                        attempts: r.get(8)?,
                        tags: r.get(9)?,
                        notes: r.get(10)?,
                        config: r.get(11)?,
                    })
                },
            )
            .optional()
            .map_err(backend)?;
        let Some(run) = run else {
            return Ok(None);
        };
        let attempts = self.rows(
            "SELECT token, attempt, started FROM attempts WHERE run_id = ?1 ORDER BY attempt",
            [id],
            |r| {
                Ok(AttemptRow {
                    token: r.get(0)?,
                    attempt: r.get(1)?,
                    started: r.get(2)?,
                })
            },
        )?;
        let writers = self.rows(
            "SELECT writer, watermark FROM writers WHERE run_id = ?1 ORDER BY writer",
            [id],
            |r| {
                Ok(WriterRow {
                    writer: r.get(0)?,
                    watermark: r.get(1)?,
                })
            },
        )?;
        let files = self.rows(
            "SELECT name, size, blake3, chunks, n_chunks, created_at FROM files \
             WHERE run_id = ?1 ORDER BY name",
            [id],
            |r| {
                Ok(FileRow {
                    name: r.get(0)?,
                    size: r.get(1)?,
                    blake3: r.get(2)?,
                    chunks: r.get(3)?,
                    n_chunks: r.get(4)?,
                    created_at: r.get(5)?,
                })
            },
        )?;
        let latest = self.rows(
            "SELECT k.name, l.rank, l.step, l.value, l.wall, l.attempt \
             FROM latest l JOIN keys k ON k.id = l.key_id WHERE k.run_id = ?1 \
             ORDER BY k.name, l.rank",
            [id],
            |r| {
                Ok(LatestRow {
                    key: r.get(0)?,
                    rank: r.get(1)?,
                    step: r.get(2)?,
                    value: nan_null(r.get(3)?),
                    wall: r.get(4)?,
                    attempt: r.get(5)?,
                })
            },
        )?;
        Ok(Some(RunHead {
            run,
            attempts,
            writers,
            files,
            latest,
        }))
    }

    fn run_counts(&mut self, id: &str) -> Result<RunCounts, StorageError> {
        let (chunks, points): (i64, i64) = self
            .conn
            .query_row(
                "SELECT COUNT(*), COALESCE(SUM(c.count), 0) FROM chunks c \
                 JOIN keys k ON k.id = c.key_id WHERE k.run_id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(backend)?;
        Ok(RunCounts {
            attempts: self.count("SELECT COUNT(*) FROM attempts WHERE run_id = ?1", id)?,
            writers: self.count("SELECT COUNT(*) FROM writers WHERE run_id = ?1", id)?,
            keys: self.count("SELECT COUNT(*) FROM keys WHERE run_id = ?1", id)?,
            chunks: chunks.unsigned_abs(),
            points: points.unsigned_abs(),
            latest: self.count(
                "SELECT COUNT(*) FROM latest l JOIN keys k ON k.id = l.key_id WHERE k.run_id = ?1",
                id,
            )?,
            logs: self.count("SELECT COUNT(*) FROM logs WHERE run_id = ?1", id)?,
            events: self.count("SELECT COUNT(*) FROM events WHERE run_id = ?1", id)?,
            files: self.count("SELECT COUNT(*) FROM files WHERE run_id = ?1", id)?,
        })
    }

    fn chunk_page(
        &mut self,
        run: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<(i64, ChunkRow)>, StorageError> {
        self.rows(
            "SELECT c.id, k.name, c.rank, c.attempt, c.first_step, c.last_step, c.count, \
             c.vmin, c.vmax, c.last_value, c.last_wall, c.blocks, c.points \
             FROM chunks c JOIN keys k ON k.id = c.key_id \
             WHERE k.run_id = ?1 AND c.id > ?2 ORDER BY c.id LIMIT ?3",
            params![run, after, limit],
            |r| {
                Ok((
                    r.get(0)?,
                    ChunkRow {
                        key: r.get(1)?,
                        rank: r.get(2)?,
                        attempt: r.get(3)?,
                        first_step: r.get(4)?,
                        last_step: r.get(5)?,
                        count: r.get(6)?,
                        vmin: nan_null(r.get(7)?),
                        vmax: nan_null(r.get(8)?),
                        last_value: nan_null(r.get(9)?),
                        last_wall: r.get(10)?,
                        blocks: r.get(11)?,
                        points: r.get(12)?,
                    },
                ))
            },
        )
    }

    fn log_page(
        &mut self,
        run: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<(i64, LogRow)>, StorageError> {
        self.rows(
            "SELECT id, rank, stream, attempt, wall, text FROM logs \
             WHERE run_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
            params![run, after, limit],
            |r| {
                Ok((
                    r.get(0)?,
                    LogRow {
                        rank: r.get(1)?,
                        stream: r.get(2)?,
                        attempt: r.get(3)?,
                        wall: r.get(4)?,
                        text: r.get(5)?,
                    },
                ))
            },
        )
    }

    fn event_page(
        &mut self,
        run: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<(i64, EventRow)>, StorageError> {
        self.rows(
            "SELECT id, kind, attempt, wall, text, data FROM events \
             WHERE run_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
            params![run, after, limit],
            |r| {
                Ok((
                    r.get(0)?,
                    EventRow {
                        kind: r.get(1)?,
                        attempt: r.get(2)?,
                        wall: r.get(3)?,
                        text: r.get(4)?,
                        data: r.get(5)?,
                    },
                ))
            },
        )
    }

    fn add_projects(&mut self, names: &[String]) -> Result<(), StorageError> {
        let tx = self.conn.transaction().map_err(backend)?;
        for name in names {
            tx.execute("INSERT OR IGNORE INTO projects(name) VALUES (?1)", [name])
                .map_err(backend)?;
        }
        tx.commit().map_err(backend)
    }

    fn begin_run<'a>(
        &'a mut self,
        head: &RunHead,
    ) -> Result<Box<dyn RunWriter + 'a>, StorageError> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(backend)?;
        let run = &head.run;
        tx.execute(
            "INSERT OR IGNORE INTO projects(name) VALUES (?1)",
            [&run.project],
        )
        .map_err(backend)?;
        tx.execute(
            "INSERT INTO runs(id, project_id, name, status, created_at, updated_at, attempts, \
             project_set, status_wall, tags, notes, config) \
             VALUES (?1, (SELECT id FROM projects WHERE name = ?2), ?3, ?4, ?5, ?6, ?7, ?8, ?9, \
             ?10, ?11, ?12)",
            params![
                run.id,
                run.project,
                run.name,
                run.status,
                run.created_at,
                run.updated_at,
                run.attempts,
                run.project_set,
                run.status_wall,
                run.tags,
                run.notes,
                run.config
            ],
        )
        .map_err(backend)?;
        for a in &head.attempts {
            tx.execute(
                "INSERT INTO attempts(run_id, token, attempt, started) VALUES (?1, ?2, ?3, ?4)",
                params![run.id, a.token, a.attempt, a.started],
            )
            .map_err(backend)?;
        }
        for w in &head.writers {
            tx.execute(
                "INSERT INTO writers(run_id, writer, watermark) VALUES (?1, ?2, ?3)",
                params![run.id, w.writer, w.watermark],
            )
            .map_err(backend)?;
        }
        for f in &head.files {
            tx.execute(
                "INSERT INTO files(run_id, name, size, blake3, chunks, n_chunks, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    run.id,
                    f.name,
                    f.size,
                    f.blake3,
                    f.chunks,
                    f.n_chunks,
                    f.created_at
                ],
            )
            .map_err(backend)?;
        }
        for l in &head.latest {
            let key = key_id(&tx, &run.id, &l.key)?;
            tx.execute(
                "INSERT INTO latest(key_id, rank, step, value, wall, attempt) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![key, l.rank, l.step, null_nan(l.value), l.wall, l.attempt],
            )
            .map_err(backend)?;
        }
        Ok(Box::new(SqliteRunWriter {
            tx,
            run: run.id.clone(),
        }))
    }
}

fn key_id(tx: &Connection, run: &str, name: &str) -> Result<i64, StorageError> {
    tx.prepare_cached("INSERT OR IGNORE INTO keys(run_id, name) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![run, name]))
        .map_err(backend)?;
    tx.prepare_cached("SELECT id FROM keys WHERE run_id = ?1 AND name = ?2")
        .and_then(|mut s| s.query_row(params![run, name], |r| r.get(0)))
        .map_err(backend)
}

struct SqliteRunWriter<'a> {
    tx: rusqlite::Transaction<'a>,
    run: String,
}

impl RunWriter for SqliteRunWriter<'_> {
    fn chunks(&mut self, rows: &[ChunkRow]) -> Result<(), StorageError> {
        for c in rows {
            let key = key_id(&self.tx, &self.run, &c.key)?;
            self.tx
                .prepare_cached(
                    "INSERT INTO chunks(key_id, rank, attempt, first_step, last_step, count, \
                     vmin, vmax, last_value, last_wall, blocks, points) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        key,
                        c.rank,
                        c.attempt,
                        c.first_step,
                        c.last_step,
                        c.count,
                        null_nan(c.vmin),
                        null_nan(c.vmax),
                        null_nan(c.last_value),
                        c.last_wall,
                        c.blocks,
                        c.points
                    ])
                })
                .map_err(backend)?;
        }
        Ok(())
    }

    fn logs(&mut self, rows: &[LogRow]) -> Result<(), StorageError> {
        for l in rows {
            self.tx
                .prepare_cached(
                    "INSERT INTO logs(run_id, rank, stream, attempt, wall, text) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        self.run, l.rank, l.stream, l.attempt, l.wall, l.text
                    ])
                })
                .map_err(backend)?;
        }
        Ok(())
    }

    fn events(&mut self, rows: &[EventRow]) -> Result<(), StorageError> {
        for e in rows {
            self.tx
                .prepare_cached(
                    "INSERT INTO events(run_id, kind, attempt, wall, text, data) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .and_then(|mut s| {
                    s.execute(params![self.run, e.kind, e.attempt, e.wall, e.text, e.data])
                })
                .map_err(backend)?;
        }
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<(), StorageError> {
        self.tx.commit().map_err(backend)
    }
}

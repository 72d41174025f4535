//! [`Transfer`] on a PostgreSQL database: one connection of its own (not
//! the server's pools), since a migrated run is written in one transaction
//! that takes many pages, and a source is read from one snapshot.

use std::collections::HashMap;

use postgres::{Client, NoTls, Row};

use super::connect::{self, PASSWORD_ENV, Target};
use super::schema::{self, SCHEMA_VERSION};
use super::{PgError, int, small, text};
use crate::storage::StorageError;
use crate::storage::transfer::{
    AttemptRow, ChunkRow, EventRow, FileRow, LatestRow, LogRow, RunCounts, RunHead, RunRow,
    RunWriter, Transfer, WriterRow,
};

/// A database, read or written whole runs at a time.
pub struct PgTransfer {
    client: Client,
    target: Target,
}

impl std::fmt::Debug for PgTransfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTransfer")
            .field("database", &self.target)
            .finish_non_exhaustive()
    }
}

fn db(e: postgres::Error) -> StorageError {
    PgError::Db(e).into_storage()
}

/// `flag` where the connect messages say `--database`.
fn for_flag(e: StorageError, flag: &str) -> StorageError {
    let rename = |m: String| m.replace("--database", flag);
    match e {
        StorageError::Invalid(m) => StorageError::Invalid(rename(m)),
        StorageError::Backend(m) => StorageError::Backend(rename(m)),
        other => other,
    }
}

impl PgTransfer {
    fn connect(url: &str, flag: &str) -> Result<Self, StorageError> {
        let password = std::env::var(PASSWORD_ENV).ok();
        let target = connect::parse(url, password).map_err(|e| for_flag(e, flag))?;
        let client = target
            .config
            .connect(NoTls)
            .map_err(|e| for_flag(connect::connect_error(&target, &e), flag))?;
        Ok(Self { client, target })
    }

    /// Connects to the database of `--from-database` and reads it in one
    /// read-only snapshot for as long as this lives. Nothing is written:
    /// a schema this binary does not read as is (older or newer) is
    /// refused, not migrated.
    pub fn open_source(url: &str) -> Result<Self, StorageError> {
        let mut this = Self::connect(url, "--from-database")?;
        let shown = this.target.shown.clone();
        let has_schema: bool = this
            .client
            .query_one("SELECT to_regclass('relaunch_schema') IS NOT NULL", &[])
            .map_err(db)?
            .get(0);
        if !has_schema {
            return Err(StorageError::Invalid(format!(
                "the database {shown} is not a relaunch database (no relaunch_schema table); \
                 give --from-database the database relaunch server used"
            )));
        }
        let version: i32 = this
            .client
            .query_one("SELECT COALESCE(MAX(version), 0) FROM relaunch_schema", &[])
            .map_err(db)?
            .get(0);
        if version != SCHEMA_VERSION {
            let fix = if version > SCHEMA_VERSION {
                "a newer relaunch migrated it; run that version (or newer) of relaunch server migrate"
            } else {
                "start this version of relaunch server on it once to migrate it"
            };
            return Err(StorageError::Invalid(format!(
                "the database {shown} has schema version {version} but this relaunch reads \
                 version {SCHEMA_VERSION}: {fix}"
            )));
        }
        this.client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .map_err(db)?;
        Ok(this)
    }

    /// Connects to the database of `--database`, creating or migrating its
    /// schema as the server does (and refusing one a newer relaunch made).
    pub fn open_target(url: &str) -> Result<Self, StorageError> {
        let mut this = Self::connect(url, "--database")?;
        schema::migrate(&mut this.client, &this.target.shown)?;
        Ok(this)
    }

    fn rows<T>(
        &mut self,
        sql: &str,
        args: &[&(dyn postgres::types::ToSql + Sync)],
        f: impl FnMut(&Row) -> T,
    ) -> Result<Vec<T>, StorageError> {
        Ok(self
            .client
            .query(sql, args)
            .map_err(db)?
            .iter()
            .map(f)
            .collect())
    }

    fn count(&mut self, sql: &str, run: &str) -> Result<u64, StorageError> {
        let n: i64 = self.client.query_one(sql, &[&run]).map_err(db)?.get(0);
        Ok(n.unsigned_abs())
    }
}

impl Drop for PgTransfer {
    fn drop(&mut self) {
        // An open snapshot (a source) ends with the connection; nothing to
        // commit.
        tracing::debug!(database = %self.target.shown, "closing");
    }
}

impl Transfer for PgTransfer {
    fn place(&self) -> String {
        format!("database {}", self.target.shown)
    }

    fn projects(&mut self) -> Result<Vec<String>, StorageError> {
        self.rows("SELECT name FROM projects ORDER BY name", &[], |r| r.get(0))
    }

    fn run_ids(&mut self) -> Result<Vec<String>, StorageError> {
        self.rows("SELECT id FROM runs ORDER BY created_at, id", &[], |r| {
            r.get(0)
        })
    }

    fn run_head(&mut self, id: &str) -> Result<Option<RunHead>, StorageError> {
        let run = self
            .client
            .query_opt(
                "SELECT r.id, p.name, r.project_set, r.name, r.status, r.status_wall, \
                 r.created_at, r.updated_at, r.attempts, r.tags, r.notes, r.config \
                 FROM runs r JOIN projects p ON p.id = r.project_id WHERE r.id = $1",
                &[&id],
            )
            .map_err(db)?;
        let Some(r) = run else {
            return Ok(None);
        };
        let run = RunRow {
            id: r.get(0),
            project: r.get(1),
            project_set: r.get(2),
            name: text(r.get(3)),
            status: r.get(4),
            status_wall: r.get(5),
            created_at: r.get(6),
            updated_at: r.get(7),
            attempts: small(r.get(8)),
            tags: r.get(9),
            notes: text(r.get(10)),
            config: r.get(11),
        };
        let attempts = self.rows(
            "SELECT token, attempt, started FROM attempts WHERE run_id = $1 ORDER BY attempt",
            &[&id],
            |r| AttemptRow {
                token: text(r.get(0)),
                attempt: small(r.get(1)),
                started: r.get(2),
            },
        )?;
        let writers = self.rows(
            "SELECT writer, watermark FROM writers WHERE run_id = $1 ORDER BY writer",
            &[&id],
            |r| WriterRow {
                writer: r.get(0),
                watermark: r.get(1),
            },
        )?;
        let files = self.rows(
            "SELECT name, size, blake3, chunks, n_chunks, created_at FROM files \
             WHERE run_id = $1 ORDER BY name",
            &[&id],
            |r| FileRow {
                name: r.get(0),
                size: r.get(1),
                blake3: r.get(2),
                chunks: r.get(3),
                n_chunks: r.get(4),
                created_at: r.get(5),
            },
        )?;
        let latest = self.rows(
            "SELECT k.name, l.rank, l.step, l.value, l.wall, l.attempt \
             FROM latest l JOIN keys k ON k.id = l.key_id WHERE k.run_id = $1 \
             ORDER BY k.name, l.rank",
            &[&id],
            |r| LatestRow {
                key: r.get(0),
                rank: small(r.get(1)),
                step: r.get(2),
                value: r.get(3),
                wall: r.get(4),
                attempt: small(r.get(5)),
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
        let row = self
            .client
            .query_one(
                "SELECT COUNT(*), COALESCE(SUM(c.count), 0)::BIGINT FROM chunks c \
                 JOIN keys k ON k.id = c.key_id WHERE k.run_id = $1",
                &[&id],
            )
            .map_err(db)?;
        let (chunks, points): (i64, i64) = (row.get(0), row.get(1));
        Ok(RunCounts {
            attempts: self.count("SELECT COUNT(*) FROM attempts WHERE run_id = $1", id)?,
            writers: self.count("SELECT COUNT(*) FROM writers WHERE run_id = $1", id)?,
            keys: self.count("SELECT COUNT(*) FROM keys WHERE run_id = $1", id)?,
            chunks: chunks.unsigned_abs(),
            points: points.unsigned_abs(),
            latest: self.count(
                "SELECT COUNT(*) FROM latest l JOIN keys k ON k.id = l.key_id WHERE k.run_id = $1",
                id,
            )?,
            logs: self.count("SELECT COUNT(*) FROM logs WHERE run_id = $1", id)?,
            events: self.count("SELECT COUNT(*) FROM events WHERE run_id = $1", id)?,
            files: self.count("SELECT COUNT(*) FROM files WHERE run_id = $1", id)?,
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
             WHERE k.run_id = $1 AND c.id > $2 ORDER BY c.id LIMIT $3",
            &[&run, &after, &i64::from(limit)],
            |r| {
                (
                    r.get(0),
                    ChunkRow {
                        key: r.get(1),
                        rank: small(r.get(2)),
                        attempt: small(r.get(3)),
                        first_step: r.get(4),
                        last_step: r.get(5),
                        count: r.get(6),
                        vmin: r.get(7),
                        vmax: r.get(8),
                        last_value: r.get(9),
                        last_wall: r.get(10),
                        blocks: r.get(11),
                        points: r.get(12),
                    },
                )
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
             WHERE run_id = $1 AND id > $2 ORDER BY id LIMIT $3",
            &[&run, &after, &i64::from(limit)],
            |r| {
                (
                    r.get(0),
                    LogRow {
                        rank: small(r.get(1)),
                        stream: r.get(2),
                        attempt: small(r.get(3)),
                        wall: r.get(4),
                        text: text(r.get(5)),
                    },
                )
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
             WHERE run_id = $1 AND id > $2 ORDER BY id LIMIT $3",
            &[&run, &after, &i64::from(limit)],
            |r| {
                (
                    r.get(0),
                    EventRow {
                        kind: r.get(1),
                        attempt: small(r.get(2)),
                        wall: r.get(3),
                        text: text(r.get(4)),
                        data: r.get(5),
                    },
                )
            },
        )
    }

    fn add_projects(&mut self, names: &[String]) -> Result<(), StorageError> {
        let mut tx = self.client.transaction().map_err(db)?;
        for name in names {
            tx.execute(
                "INSERT INTO projects(name) VALUES ($1) ON CONFLICT (name) DO NOTHING",
                &[name],
            )
            .map_err(db)?;
        }
        tx.commit().map_err(db)
    }

    fn begin_run<'a>(
        &'a mut self,
        head: &RunHead,
    ) -> Result<Box<dyn RunWriter + 'a>, StorageError> {
        let mut tx = self.client.transaction().map_err(db)?;
        let run = &head.run;
        tx.execute(
            "INSERT INTO projects(name) VALUES ($1) ON CONFLICT (name) DO NOTHING",
            &[&run.project],
        )
        .map_err(db)?;
        tx.execute(
            "INSERT INTO runs(id, project_id, name, status, created_at, updated_at, attempts, \
             project_set, status_wall, tags, notes, config) \
             VALUES ($1, (SELECT id FROM projects WHERE name = $2), $3, $4, $5, $6, $7, $8, $9, \
             $10, $11, $12)",
            &[
                &run.id,
                &run.project,
                &run.name.as_bytes(),
                &run.status,
                &run.created_at,
                &run.updated_at,
                &int(run.attempts),
                &run.project_set,
                &run.status_wall,
                &run.tags,
                &run.notes.as_bytes(),
                &run.config,
            ],
        )
        .map_err(db)?;
        for a in &head.attempts {
            tx.execute(
                "INSERT INTO attempts(run_id, token, attempt, started) VALUES ($1, $2, $3, $4)",
                &[&run.id, &a.token.as_bytes(), &int(a.attempt), &a.started],
            )
            .map_err(db)?;
        }
        for w in &head.writers {
            tx.execute(
                "INSERT INTO writers(run_id, writer, watermark) VALUES ($1, $2, $3)",
                &[&run.id, &w.writer, &w.watermark],
            )
            .map_err(db)?;
        }
        for f in &head.files {
            tx.execute(
                "INSERT INTO files(run_id, name, size, blake3, chunks, n_chunks, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &run.id,
                    &f.name,
                    &f.size,
                    &f.blake3,
                    &f.chunks,
                    &f.n_chunks,
                    &f.created_at,
                ],
            )
            .map_err(db)?;
        }
        let mut writer = PgRunWriter {
            tx,
            run: run.id.clone(),
            keys: HashMap::new(),
        };
        for l in &head.latest {
            let key = writer.key_id(&l.key)?;
            writer
                .tx
                .execute(
                    "INSERT INTO latest(key_id, rank, step, value, wall, attempt) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                    &[
                        &key,
                        &int(l.rank),
                        &l.step,
                        &l.value,
                        &l.wall,
                        &int(l.attempt),
                    ],
                )
                .map_err(db)?;
        }
        Ok(Box::new(writer))
    }
}

struct PgRunWriter<'a> {
    tx: postgres::Transaction<'a>,
    run: String,
    /// The target's id of each key name written so far.
    keys: HashMap<String, i64>,
}

impl PgRunWriter<'_> {
    fn key_id(&mut self, name: &str) -> Result<i64, StorageError> {
        if let Some(id) = self.keys.get(name) {
            return Ok(*id);
        }
        let id: i64 = self
            .tx
            .query_one(
                "INSERT INTO keys(run_id, name) VALUES ($1, $2) RETURNING id",
                &[&self.run, &name],
            )
            .map_err(db)?
            .get(0);
        self.keys.insert(name.to_owned(), id);
        Ok(id)
    }
}

impl RunWriter for PgRunWriter<'_> {
    fn chunks(&mut self, rows: &[ChunkRow]) -> Result<(), StorageError> {
        let insert = self
            .tx
            .prepare(
                "INSERT INTO chunks(key_id, rank, attempt, first_step, last_step, count, vmin, \
                 vmax, last_value, last_wall, blocks, points) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .map_err(db)?;
        for c in rows {
            let key = self.key_id(&c.key)?;
            self.tx
                .execute(
                    &insert,
                    &[
                        &key,
                        &int(c.rank),
                        &int(c.attempt),
                        &c.first_step,
                        &c.last_step,
                        &c.count,
                        &c.vmin,
                        &c.vmax,
                        &c.last_value,
                        &c.last_wall,
                        &c.blocks,
                        &c.points,
                    ],
                )
                .map_err(db)?;
        }
        Ok(())
    }

    fn logs(&mut self, rows: &[LogRow]) -> Result<(), StorageError> {
        let insert = self
            .tx
            .prepare(
                "INSERT INTO logs(run_id, rank, stream, attempt, wall, text) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .map_err(db)?;
        for l in rows {
            self.tx
                .execute(
                    &insert,
                    &[
                        &self.run,
                        &int(l.rank),
                        &l.stream,
                        &int(l.attempt),
                        &l.wall,
                        &l.text.as_bytes(),
                    ],
                )
                .map_err(db)?;
        }
        Ok(())
    }

    fn events(&mut self, rows: &[EventRow]) -> Result<(), StorageError> {
        let insert = self
            .tx
            .prepare(
                "INSERT INTO events(run_id, kind, attempt, wall, text, data) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .map_err(db)?;
        for e in rows {
            self.tx
                .execute(
                    &insert,
                    &[
                        &self.run,
                        &e.kind,
                        &int(e.attempt),
                        &e.wall,
                        &e.text.as_bytes(),
                        &e.data,
                    ],
                )
                .map_err(db)?;
        }
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<(), StorageError> {
        self.tx.commit().map_err(db)
    }
}

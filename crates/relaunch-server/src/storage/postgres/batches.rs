//! Storing a batch in PostgreSQL: the writer's watermark, the attempt a
//! token names, console lines and events, and metric points cut into
//! chunks (`storage/ingest.rs` decides what is new and how it is cut; this
//! is its SQL), and reading chunks back for a series.

use std::collections::HashMap;

use relaunch_api::{Ack, Batch, Record, Stream};

use super::{PgError, Tx, int, listen, lock_run, small};
use crate::storage::StorageError;
use crate::storage::chunk::{self, BLOCK, Point, Summary};
use crate::storage::downsample::ChunkSource;
use crate::storage::ingest::{self, Plan};
use crate::storage::runs::{self, now_or};

pub(super) fn watermark(tx: &mut Tx<'_>, run: &str, writer: &str) -> Result<u64, PgError> {
    Ok(tx
        .query_opt(
            "SELECT watermark FROM writers WHERE run_id = $1 AND writer = $2",
            &[&run, &writer],
        )?
        .map_or(0, |r| r.get::<_, i64>(0).unsigned_abs()))
}

/// The attempt number of `token` in `run` (see the SQLite backend's
/// `attempt_of`): new tokens are numbered under the run's row lock, so two
/// servers never give one number twice or one token two numbers.
pub(super) fn attempt_of(
    tx: &mut Tx<'_>,
    run: &str,
    token: &str,
    started: Option<f64>,
    now: f64,
) -> Result<u32, PgError> {
    let token = token.as_bytes();
    let started = started.filter(|t| t.is_finite());
    let known = |tx: &mut Tx<'_>| -> Result<Option<u32>, PgError> {
        Ok(tx
            .query_opt(
                "SELECT attempt FROM attempts WHERE run_id = $1 AND token = $2",
                &[&run, &token],
            )?
            .map(|r| small(r.get(0))))
    };
    let found = match known(tx)? {
        Some(attempt) => Some(attempt),
        None => {
            lock_run(tx, run)?;
            // Another server may have numbered it while this one waited.
            known(tx)?
        }
    };
    if let Some(attempt) = found {
        if let Some(started) = started {
            tx.execute(
                "UPDATE attempts SET started = $3 WHERE run_id = $1 AND token = $2 AND started > $3",
                &[&run, &token, &started],
            )?;
        }
        return Ok(attempt);
    }
    let attempt: i64 = tx
        .query_one("SELECT attempts FROM runs WHERE id = $1", &[&run])?
        .get(0);
    tx.execute(
        "INSERT INTO attempts(run_id, token, attempt, started) VALUES ($1, $2, $3, $4)",
        &[&run, &token, &attempt, &started.unwrap_or(now)],
    )?;
    tx.execute(
        "UPDATE runs SET attempts = attempts + 1 WHERE id = $1",
        &[&run],
    )?;
    Ok(small(attempt))
}

pub(super) fn attempt_order(tx: &mut Tx<'_>, run: &str) -> Result<HashMap<u32, u32>, PgError> {
    let rows = tx.query(
        "SELECT attempt FROM attempts WHERE run_id = $1 ORDER BY started, attempt",
        &[&run],
    )?;
    Ok(runs::attempt_order(rows.iter().map(|r| small(r.get(0)))))
}

pub(super) fn ingest(tx: &mut Tx<'_>, run: &str, batch: &Batch, now: f64) -> Result<Ack, PgError> {
    ingest::check(batch)?;
    let ordered = batch
        .records
        .iter()
        .any(|(_, r)| !matches!(r, Record::Metrics { .. }));
    if ordered {
        // Console lines and events get ids in commit order: one writer of
        // the run at a time.
        lock_run(tx, run)?;
    } else {
        // Metrics only: writers of one run store in parallel (on every
        // server), each writer's batches one at a time.
        lock_writer(tx, run, &batch.writer)?;
    }
    // At most once a second per run, so parallel writers do not queue on
    // the run's row for it (a row that no longer matches is not locked);
    // before any other row is locked, so no lock is taken out of order.
    tx.execute(
        "UPDATE runs SET updated_at = $2 WHERE id = $1 AND updated_at < $2::DOUBLE PRECISION - 1",
        &[&run, &now],
    )?;
    let mark = watermark(tx, run, &batch.writer)?;
    let new = match ingest::plan(batch, mark)? {
        Plan::Stored(ack) => return Ok(ack),
        Plan::New(new) => new,
    };
    let attempt = int(attempt_of(tx, run, &batch.attempt_token, None, now)?);
    // Console lines in one statement, ids given in sequence order.
    let (mut ranks, mut streams, mut walls, mut texts) = (vec![], vec![], vec![], vec![]);
    for record in &new.others {
        match record {
            Record::Log {
                rank,
                stream,
                wall,
                text,
            } => {
                ranks.push(int(*rank));
                streams.push(i16::from(*stream == Stream::Stderr));
                walls.push(*wall);
                texts.push(text.as_bytes());
            }
            Record::Event {
                kind,
                wall,
                text,
                data,
            } => {
                tx.execute(
                    "INSERT INTO events(run_id, kind, attempt, wall, text, data) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                    &[
                        &run,
                        kind,
                        &attempt,
                        wall,
                        &text.as_bytes(),
                        &ingest::event_data(data),
                    ],
                )?;
                if let Some(status) = ingest::status_of_event(kind) {
                    tx.execute(
                        "UPDATE runs SET status = $2, status_wall = $4, updated_at = $3 \
                         WHERE id = $1 AND status_wall <= $4",
                        &[&run, &status.as_str(), &now, &now_or(*wall)],
                    )?;
                }
            }
            Record::Metrics { .. } => {}
        }
    }
    if !ranks.is_empty() {
        // Delivered at commit: replicas' log follows wake and read them.
        tx.execute("SELECT pg_notify($1, $2)", &[&listen::CHANNEL, &run])?;
        tx.execute(
            "INSERT INTO logs(run_id, rank, stream, attempt, wall, text) \
             SELECT $1, u.rank, u.stream, $2, u.wall, u.text \
             FROM UNNEST($3::BIGINT[], $4::SMALLINT[], $5::DOUBLE PRECISION[], $6::BYTEA[]) \
             WITH ORDINALITY AS u(rank, stream, wall, text, n) ORDER BY u.n",
            &[&run, &attempt, &ranks, &streams, &walls, &texts],
        )?;
    }
    let mut key_ids: HashMap<&str, i64> = HashMap::new();
    for (key, rank, points) in new.chunks() {
        let key_id = match key_ids.get(key) {
            Some(id) => *id,
            None => {
                let id = key_id(tx, run, key)?;
                key_ids.insert(key, id);
                id
            }
        };
        store_chunk(tx, run, key_id, rank, attempt, points)?;
    }
    let last = i64::try_from(new.last).unwrap_or(i64::MAX);
    tx.execute(
        "INSERT INTO writers(run_id, writer, watermark) VALUES ($1, $2, $3) \
         ON CONFLICT (run_id, writer) DO UPDATE SET watermark = EXCLUDED.watermark",
        &[&run, &batch.writer, &last],
    )?;
    Ok(ingest::ack(batch, new.last))
}

/// Locks writer `writer` of run `run` (its row made if new) for this
/// transaction: its watermark is read and moved by one batch at a time.
/// The run's row is only shared-locked, so it cannot go away meanwhile.
fn lock_writer(tx: &mut Tx<'_>, run: &str, writer: &str) -> Result<(), PgError> {
    if tx
        .query_opt("SELECT 1 FROM runs WHERE id = $1 FOR KEY SHARE", &[&run])?
        .is_none()
    {
        return Err(runs::no_run(run).into());
    }
    tx.execute(
        "INSERT INTO writers(run_id, writer, watermark) VALUES ($1, $2, 0) \
         ON CONFLICT (run_id, writer) DO NOTHING",
        &[&run, &writer],
    )?;
    tx.execute(
        "SELECT 1 FROM writers WHERE run_id = $1 AND writer = $2 FOR UPDATE",
        &[&run, &writer],
    )?;
    Ok(())
}

/// The key's id, added if new. Another writer may add the same key at the
/// same moment: the insert then waits for it and adds nothing, and the
/// statement's snapshot (taken before) does not show its row, so the key
/// is read again in a statement of its own.
fn key_id(tx: &mut Tx<'_>, run: &str, name: &str) -> Result<i64, PgError> {
    if let Some(row) = tx.query_opt(
        "WITH added AS (INSERT INTO keys(run_id, name) VALUES ($1, $2) \
                        ON CONFLICT (run_id, name) DO NOTHING RETURNING id) \
         SELECT id FROM added UNION ALL \
         SELECT id FROM keys WHERE run_id = $1 AND name = $2 LIMIT 1",
        &[&run, &name],
    )? {
        return Ok(row.get(0));
    }
    Ok(tx
        .query_one(
            "SELECT id FROM keys WHERE run_id = $1 AND name = $2",
            &[&run, &name],
        )?
        .get(0))
}

fn store_chunk(
    tx: &mut Tx<'_>,
    run: &str,
    key_id: i64,
    rank: u32,
    attempt: i64,
    points: &[Point],
) -> Result<(), PgError> {
    let Some(s) = Summary::of(points) else {
        return Ok(());
    };
    let count = i64::try_from(s.count).unwrap_or(i64::MAX);
    tx.execute(
        "INSERT INTO chunks(key_id, rank, attempt, first_step, last_step, count, vmin, vmax, \
         last_value, last_wall, blocks, points) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        &[
            &key_id,
            &int(rank),
            &attempt,
            &s.first_step,
            &s.last_step,
            &count,
            &s.min,
            &s.max,
            &s.last_value,
            &s.last_wall,
            &chunk::encode_blocks(points),
            &chunk::encode_points(points),
        ],
    )?;
    // The newest value: the newest attempt's (by start), and of its values
    // the highest step's.
    tx.execute(
        "INSERT INTO latest(key_id, rank, step, value, wall, attempt) \
         VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (key_id, rank) DO UPDATE SET step = EXCLUDED.step, \
         value = EXCLUDED.value, wall = EXCLUDED.wall, attempt = EXCLUDED.attempt \
         WHERE (EXCLUDED.attempt = latest.attempt AND EXCLUDED.step >= latest.step) \
         OR (EXCLUDED.attempt <> latest.attempt AND EXISTS ( \
             SELECT 1 FROM attempts new, attempts old \
             WHERE new.run_id = $7 AND new.attempt = EXCLUDED.attempt \
             AND old.run_id = $7 AND old.attempt = latest.attempt \
             AND (new.started, new.attempt) > (old.started, old.attempt)))",
        &[
            &key_id,
            &int(rank),
            &s.last_step,
            &s.last_value,
            &s.last_wall,
            &attempt,
            &run,
        ],
    )?;
    Ok(())
}

pub(super) struct PgChunks<'t, 'c> {
    pub(super) tx: &'t mut Tx<'c>,
}

impl PgChunks<'_, '_> {
    fn rows(
        &mut self,
        sql: &str,
        args: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<postgres::Row>, StorageError> {
        self.tx
            .query(sql, args)
            .map_err(|e| PgError::from(e).into_storage())
    }

    fn bytes(
        &mut self,
        sql: &str,
        args: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<u8>, StorageError> {
        self.tx
            .query_one(sql, args)
            .map(|r| r.get(0))
            .map_err(|e| PgError::from(e).into_storage())
    }
}

impl ChunkSource for PgChunks<'_, '_> {
    fn blocks(&mut self, id: i64) -> Result<Vec<Summary>, StorageError> {
        let bytes = self.bytes("SELECT blocks FROM chunks WHERE id = $1", &[&id])?;
        chunk::decode_blocks(&bytes).map_err(StorageError::Corrupt)
    }

    fn points(&mut self, id: i64) -> Result<Vec<Point>, StorageError> {
        let bytes = self.bytes("SELECT points FROM chunks WHERE id = $1", &[&id])?;
        chunk::decode_points(&bytes).map_err(StorageError::Corrupt)
    }

    // One query per read of many chunks: a round trip each was most of a
    // 1,000-bucket read's time (bench/scale). `points` is stored
    // uncompressed out of line: substring() reads only the TOAST pages that
    // hold a block.
    fn points_many(&mut self, ids: &[i64]) -> Result<HashMap<i64, Vec<Point>>, StorageError> {
        self.rows("SELECT id, points FROM chunks WHERE id = ANY($1)", &[&ids])?
            .iter()
            .map(|r| {
                let points = chunk::decode_points(r.get(1)).map_err(StorageError::Corrupt)?;
                Ok((r.get(0), points))
            })
            .collect()
    }

    fn blocks_many(&mut self, ids: &[i64]) -> Result<HashMap<i64, Vec<Summary>>, StorageError> {
        self.rows("SELECT id, blocks FROM chunks WHERE id = ANY($1)", &[&ids])?
            .iter()
            .map(|r| {
                let blocks = chunk::decode_blocks(r.get(1)).map_err(StorageError::Corrupt)?;
                Ok((r.get(0), blocks))
            })
            .collect()
    }

    fn block_points_many(
        &mut self,
        wanted: &[(i64, usize)],
    ) -> Result<HashMap<(i64, usize), Vec<Point>>, StorageError> {
        let size = BLOCK * chunk::POINT_BYTES;
        let ids: Vec<i64> = wanted.iter().map(|(id, _)| *id).collect();
        let starts: Vec<i64> = wanted
            .iter()
            .map(|(_, i)| i64::try_from(i * size + 1).unwrap_or(i64::MAX))
            .collect();
        let len = i64::try_from(size).unwrap_or(i64::MAX);
        let rows = self.rows(
            "SELECT u.n, substring(c.points FROM u.start::INT FOR $3::BIGINT::INT) \
             FROM UNNEST($1::BIGINT[], $2::BIGINT[]) WITH ORDINALITY AS u(id, start, n) \
             JOIN chunks c ON c.id = u.id",
            &[&ids, &starts, &len],
        )?;
        rows.iter()
            .map(|r| {
                let n: i64 = r.get(0);
                let key = usize::try_from(n - 1)
                    .ok()
                    .and_then(|n| wanted.get(n))
                    .copied()
                    .ok_or_else(|| StorageError::Corrupt(format!("no block asked as {n}")))?;
                let points = chunk::decode_points(r.get(1)).map_err(StorageError::Corrupt)?;
                Ok((key, points))
            })
            .collect()
    }
}

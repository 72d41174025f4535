//! Storing a batch in the embedded database: the writer's watermark, the
//! attempt a token names, console lines and events, and metric points cut
//! into chunks (`storage/ingest.rs` decides what is new and how it is cut;
//! this is its SQL), and reading chunks back for a series.

use std::collections::HashMap;

use relaunch_api::{Ack, Batch, Record, Stream};
use rusqlite::{Connection, OptionalExtension, params};

use super::{backend, get_run};
use crate::storage::StorageError;
use crate::storage::chunk::{self, BLOCK, Point, Summary};
use crate::storage::downsample::ChunkSource;
use crate::storage::ingest::{self, Plan};
use crate::storage::runs::{self, now_or};

pub(super) fn watermark(conn: &Connection, run: &str, writer: &str) -> Result<u64, StorageError> {
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
pub(super) fn attempt_of(
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
pub(super) fn attempt_order(
    conn: &Connection,
    run: &str,
) -> Result<HashMap<u32, u32>, StorageError> {
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

pub(super) fn ingest(
    conn: &Connection,
    run: &str,
    batch: &Batch,
    now: f64,
) -> Result<Ack, StorageError> {
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

pub(super) struct SqliteChunks<'c> {
    pub(super) conn: &'c Connection,
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

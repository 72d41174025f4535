//! The embedded backend's queries for goodput (`storage/timeline.rs`):
//! attempts, lifecycle events, and chunk summaries of the step keys
//! grouped in SQL. Key ids travel as one JSON array (`json_each`).

use rusqlite::{Connection, params};

use super::backend;
use super::batches::SqliteChunks;
use crate::storage::StorageError;
use crate::storage::downsample::ChunkSource;
use crate::storage::timeline::{AttemptRow, Lifecycle, Span, TimelineSource};

/// The chunks of the keys in the JSON array `?1`.
const OF_KEYS: &str = "key_id IN (SELECT value FROM json_each(?1))";

pub(super) struct SqliteTimeline<'c> {
    pub(super) run: &'c str,
    pub(super) chunks: SqliteChunks<'c>,
}

impl SqliteTimeline<'_> {
    fn conn(&self) -> &Connection {
        self.chunks.conn
    }
}

fn ids(keys: &[i64]) -> String {
    serde_json::to_string(keys).unwrap_or_else(|_| "[]".into())
}

impl TimelineSource for SqliteTimeline<'_> {
    fn attempts(&mut self) -> Result<Vec<AttemptRow>, StorageError> {
        let mut stmt = self
            .conn()
            .prepare_cached(
                "SELECT attempt, token, started FROM attempts WHERE run_id = ?1 \
                 ORDER BY started, attempt",
            )
            .map_err(backend)?;
        let rows = stmt
            .query_map([self.run], |r| {
                Ok(AttemptRow {
                    attempt: r.get(0)?,
                    token: r.get(1)?,
                    started: r.get(2)?,
                })
            })
            .map_err(backend)?;
        rows.collect::<Result<_, _>>().map_err(backend)
    }

    fn lifecycle(&mut self, kinds: &[&str]) -> Result<Vec<Lifecycle>, StorageError> {
        let kinds = serde_json::to_string(kinds).unwrap_or_else(|_| "[]".into());
        let mut stmt = self
            .conn()
            .prepare_cached(
                "SELECT kind, attempt, wall FROM events WHERE run_id = ?1 \
                 AND kind IN (SELECT value FROM json_each(?2)) ORDER BY id",
            )
            .map_err(backend)?;
        let rows = stmt
            .query_map(params![self.run, kinds], |r| {
                Ok(Lifecycle {
                    kind: r.get(0)?,
                    attempt: r.get(1)?,
                    wall: r.get(2)?,
                })
            })
            .map_err(backend)?;
        rows.collect::<Result<_, _>>().map_err(backend)
    }

    fn keys(&mut self) -> Result<Vec<(i64, String)>, StorageError> {
        let mut stmt = self
            .conn()
            .prepare_cached("SELECT id, name FROM keys WHERE run_id = ?1")
            .map_err(backend)?;
        let rows = stmt
            .query_map([self.run], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(backend)?;
        rows.collect::<Result<_, _>>().map_err(backend)
    }

    fn spans(&mut self, keys: &[i64]) -> Result<Vec<Span>, StorageError> {
        let mut stmt = self
            .conn()
            .prepare_cached(&format!(
                "SELECT attempt, MIN(first_step), MAX(last_step), MAX(last_wall) FROM chunks \
                 WHERE {OF_KEYS} GROUP BY attempt"
            ))
            .map_err(backend)?;
        let rows = stmt
            .query_map([ids(keys)], |r| {
                Ok(Span {
                    attempt: r.get(0)?,
                    first_step: r.get(1)?,
                    last_step: r.get(2)?,
                    last_wall: r.get(3)?,
                })
            })
            .map_err(backend)?;
        rows.collect::<Result<_, _>>().map_err(backend)
    }

    fn first_chunks(&mut self, keys: &[i64]) -> Result<Vec<(u32, i64)>, StorageError> {
        // SQLite takes a bare column of a MIN() aggregate from the row that
        // has the minimum: the chunk of lowest first step.
        let mut stmt = self
            .conn()
            .prepare_cached(&format!(
                "SELECT attempt, id, MIN(first_step) FROM chunks WHERE {OF_KEYS} \
                 GROUP BY key_id, rank, attempt"
            ))
            .map_err(backend)?;
        let rows = stmt
            .query_map([ids(keys)], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(backend)?;
        rows.collect::<Result<_, _>>().map_err(backend)
    }

    fn last_wall_before(
        &mut self,
        keys: &[i64],
        attempt: u32,
        before: i64,
    ) -> Result<Option<f64>, StorageError> {
        self.conn()
            .prepare_cached(&format!(
                "SELECT MAX(last_wall) FROM chunks WHERE {OF_KEYS} AND attempt = ?2 \
                 AND last_step < ?3"
            ))
            .and_then(|mut s| s.query_row(params![ids(keys), attempt, before], |r| r.get(0)))
            .map_err(backend)
    }

    fn chunks_from(
        &mut self,
        keys: &[i64],
        attempt: u32,
        from: i64,
    ) -> Result<Vec<i64>, StorageError> {
        let mut stmt = self
            .conn()
            .prepare_cached(&format!(
                "SELECT id FROM chunks WHERE {OF_KEYS} AND attempt = ?2 AND last_step >= ?3"
            ))
            .map_err(backend)?;
        let rows = stmt
            .query_map(params![ids(keys), attempt, from], |r| r.get(0))
            .map_err(backend)?;
        rows.collect::<Result<_, _>>().map_err(backend)
    }

    fn chunks(&mut self) -> &mut dyn ChunkSource {
        &mut self.chunks
    }
}

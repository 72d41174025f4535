//! The PostgreSQL backend's queries for goodput (`storage/timeline.rs`):
//! attempts, lifecycle events, and chunk summaries of the step keys
//! grouped in SQL, each one round trip.

use super::batches::PgChunks;
use super::{PgError, small, text};
use crate::storage::StorageError;
use crate::storage::downsample::ChunkSource;
use crate::storage::timeline::{AttemptRow, Lifecycle, Span, TimelineSource};

pub(super) struct PgTimeline<'r, 't, 'c> {
    pub(super) run: &'r str,
    pub(super) chunks: PgChunks<'t, 'c>,
}

type Args<'a> = [&'a (dyn postgres::types::ToSql + Sync)];

impl PgTimeline<'_, '_, '_> {
    fn rows(&mut self, sql: &str, args: &Args<'_>) -> Result<Vec<postgres::Row>, StorageError> {
        self.chunks
            .tx
            .query(sql, args)
            .map_err(|e| PgError::from(e).into_storage())
    }
}

impl TimelineSource for PgTimeline<'_, '_, '_> {
    fn attempts(&mut self) -> Result<Vec<AttemptRow>, StorageError> {
        let run = self.run;
        Ok(self
            .rows(
                "SELECT attempt, token, started FROM attempts WHERE run_id = $1 \
                 ORDER BY started, attempt",
                &[&run],
            )?
            .into_iter()
            .map(|r| AttemptRow {
                attempt: small(r.get(0)),
                token: text(r.get(1)),
                started: r.get(2),
            })
            .collect())
    }

    fn lifecycle(&mut self, kinds: &[&str]) -> Result<Vec<Lifecycle>, StorageError> {
        let run = self.run;
        Ok(self
            .rows(
                "SELECT kind, attempt, wall FROM events WHERE run_id = $1 AND kind = ANY($2) \
                 ORDER BY id",
                &[&run, &kinds],
            )?
            .into_iter()
            .map(|r| Lifecycle {
                kind: r.get(0),
                attempt: small(r.get(1)),
                wall: r.get(2),
            })
            .collect())
    }

    fn keys(&mut self) -> Result<Vec<(i64, String)>, StorageError> {
        let run = self.run;
        Ok(self
            .rows("SELECT id, name FROM keys WHERE run_id = $1", &[&run])?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    fn spans(&mut self, keys: &[i64]) -> Result<Vec<Span>, StorageError> {
        Ok(self
            .rows(
                "SELECT attempt, MIN(first_step), MAX(last_step), MAX(last_wall) FROM chunks \
                 WHERE key_id = ANY($1) GROUP BY attempt",
                &[&keys],
            )?
            .into_iter()
            .map(|r| Span {
                attempt: small(r.get(0)),
                first_step: r.get(1),
                last_step: r.get(2),
                last_wall: r.get(3),
            })
            .collect())
    }

    fn first_chunks(&mut self, keys: &[i64]) -> Result<Vec<(u32, i64)>, StorageError> {
        Ok(self
            .rows(
                "SELECT DISTINCT ON (key_id, rank, attempt) attempt, id FROM chunks \
                 WHERE key_id = ANY($1) ORDER BY key_id, rank, attempt, first_step, id",
                &[&keys],
            )?
            .into_iter()
            .map(|r| (small(r.get(0)), r.get(1)))
            .collect())
    }

    fn last_wall_before(
        &mut self,
        keys: &[i64],
        attempt: u32,
        before: i64,
    ) -> Result<Option<f64>, StorageError> {
        let rows = self.rows(
            "SELECT MAX(last_wall) FROM chunks WHERE key_id = ANY($1) AND attempt = $2 \
             AND last_step < $3",
            &[&keys, &i64::from(attempt), &before],
        )?;
        Ok(rows.first().and_then(|r| r.get(0)))
    }

    fn chunks_from(
        &mut self,
        keys: &[i64],
        attempt: u32,
        from: i64,
    ) -> Result<Vec<i64>, StorageError> {
        Ok(self
            .rows(
                "SELECT id FROM chunks WHERE key_id = ANY($1) AND attempt = $2 \
                 AND last_step >= $3",
                &[&keys, &i64::from(attempt), &from],
            )?
            .into_iter()
            .map(|r| r.get(0))
            .collect())
    }

    fn chunks(&mut self) -> &mut dyn ChunkSource {
        &mut self.chunks
    }
}

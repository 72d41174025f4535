//! What a batch adds, decided the same way by every backend: the sequence
//! and watermark rules, and the new records grouped for storing (metric
//! points by series, sorted, deduplicated and cut into chunks). A backend
//! reads the writer's watermark, asks [`plan`] what to store, stores it and
//! the new watermark in one transaction.

use std::collections::BTreeMap;
use std::ops::Range;

use relaunch_api::{Ack, Batch, Record, RunStatus};

use super::StorageError;
use super::chunk::{self, CHUNK_MAX, Point};

/// The batch's own sequence numbers are consecutive and in `1..=2^63-1`;
/// checked before anything else, so a bad batch is refused whatever is
/// stored.
pub fn check(batch: &Batch) -> Result<(), StorageError> {
    batch
        .check_sequence()
        .map_err(|e| StorageError::Invalid(e.to_string()))
}

/// Rows a record writes: a point per metric value, one line or event.
fn rows_of(record: &Record) -> usize {
    match record {
        Record::Metrics { values, .. } => values.len().max(1),
        Record::Log { .. } | Record::Event { .. } => 1,
    }
}

/// The batch's records cut into consecutive parts of at most `max` rows
/// each (a record larger than that is a part of its own), with their
/// rows; one empty part for an empty batch. Stored one after another,
/// each in its own transaction, the parts keep the watermark rule: a part
/// stored advances the watermark, and the batch sent again stores only
/// what its stored parts did not.
pub fn parts(batch: &Batch, max: usize) -> Vec<(Range<usize>, usize)> {
    let mut parts = Vec::new();
    let (mut start, mut rows) = (0, 0);
    for (i, (_, record)) in batch.records.iter().enumerate() {
        let r = rows_of(record);
        if rows > 0 && rows + r > max {
            parts.push((start..i, rows));
            (start, rows) = (i, 0);
        }
        rows += r;
    }
    if rows > 0 || parts.is_empty() {
        parts.push((start..batch.records.len(), rows));
    }
    parts
}

/// What to store of a batch, given the writer's watermark.
#[derive(Debug)]
pub enum Plan<'b> {
    /// Every record is stored already (a resend after a lost answer):
    /// acknowledge, store nothing.
    Stored(Ack),
    New(NewRecords<'b>),
}

/// The records above the watermark.
#[derive(Debug)]
pub struct NewRecords<'b> {
    /// The new watermark.
    pub last: u64,
    /// Console lines and events, in sequence order.
    pub others: Vec<&'b Record>,
    /// Metric points by (key, rank), each sorted by step with one point
    /// per step (the newest log call's). Ordered by key and rank, so that
    /// concurrent transactions take row locks in one order.
    pub series: BTreeMap<(&'b str, u32), Vec<Point>>,
}

impl NewRecords<'_> {
    /// Each series cut into chunks of at most [`CHUNK_MAX`] points.
    pub fn chunks(&self) -> impl Iterator<Item = (&str, u32, &[Point])> {
        self.series.iter().flat_map(|(&(key, rank), points)| {
            points.chunks(CHUNK_MAX).map(move |part| (key, rank, part))
        })
    }
}

/// The watermark rule: records at or below `mark` are stored already; the
/// first new one must be `mark + 1`, else records in between would be
/// missing ([`StorageError::Conflict`], naming where to resend from).
pub fn plan(batch: &Batch, mark: u64) -> Result<Plan<'_>, StorageError> {
    let mut fresh = batch
        .records
        .iter()
        .filter(|(seq, _)| *seq > mark)
        .peekable();
    let Some(first) = fresh.peek().map(|(seq, _)| *seq) else {
        return Ok(Plan::Stored(ack(batch, mark)));
    };
    if first != mark + 1 {
        return Err(StorageError::Conflict(format!(
            "writer {:?} has records up to {mark} stored but this batch continues at {first}; \
             send from {} on",
            batch.writer,
            mark + 1
        )));
    }
    let mut new = NewRecords {
        last: mark,
        others: Vec::new(),
        series: BTreeMap::new(),
    };
    for (seq, record) in fresh {
        new.last = *seq;
        match record {
            Record::Metrics {
                step,
                wall,
                rank,
                values,
            } => {
                for (key, value) in values {
                    new.series
                        .entry((key.as_str(), *rank))
                        .or_default()
                        .push(Point {
                            step: *step,
                            value: *value,
                            wall: *wall,
                        });
                }
            }
            Record::Log { .. } | Record::Event { .. } => new.others.push(record),
        }
    }
    for points in new.series.values_mut() {
        chunk::sort_dedup(points);
    }
    Ok(Plan::New(new))
}

/// The acknowledgement of `batch` at `watermark`.
pub fn ack(batch: &Batch, watermark: u64) -> Ack {
    Ack {
        writer: batch.writer.clone(),
        watermark,
    }
}

/// The status a lifecycle event moves its run to; other events leave it.
/// The newest event by wall time decides (backends update only when the
/// event's wall time is at least the stored one's), so events shipped late
/// do not overwrite newer ones.
pub fn status_of_event(kind: &str) -> Option<RunStatus> {
    Some(match kind {
        "start" | "attempt" => RunStatus::Running,
        "restart" => RunStatus::Restarting,
        "preempted" => RunStatus::Preempted,
        "failed" => RunStatus::Failed,
        "finished" => RunStatus::Finished,
        _ => return None,
    })
}

/// Event data as stored: JSON text, `null` when the event has none.
pub fn event_data(data: &str) -> &str {
    if data.is_empty() { "null" } else { data }
}

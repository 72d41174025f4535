//! Admission of heavy reads: at most N at once, the rest wait as futures.
//!
//! A read that waits for a database reader inside `spawn_blocking` holds a
//! thread of tokio's blocking pool, which ingest needs too; a few hundred
//! queued dashboard reads would make a training run's batches wait behind
//! them. Heavy reads therefore take a permit here first, on the async side,
//! and only then a blocking thread: a queued read holds no thread, and
//! ingest (`POST /runs/{id}/batches`) never waits behind one. The answer is
//! serialized while the permit is held, so what many concurrent reads hold
//! at their peak is bounded by the permits too. When the last heavy read in
//! flight has finished and its answer has been sent (or dropped), the
//! allocator is asked to give its free memory back to the system
//! ([`crate::trim`]): trimming when the read ends is not enough, since the
//! answers (megabytes each) are freed only once written to the socket.
//!
//! Those answers are also what a client that does not read pins: hyper
//! holds a response until it is written whole or the connection closes.
//! So every answer takes its size from a budget (`--max-response-memory`)
//! before it is sent, given back when its body is dropped; past the
//! budget a read waits (its read permit held, so no more answers pile up
//! meanwhile) at most [`ANSWER_WAIT`], then gets a 503 with `Retry-After`.
//! A client that stops reading is closed by the connection's watchdog
//! after `--idle-timeout`, which gives its answer's share back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::AppError;
use crate::storage::{Storage, StorageError};

/// Default `--max-response-memory`.
pub const DEFAULT_MAX_RESPONSE_MEMORY: usize = 1 << 30;

/// How long an answer waits for room in the budget before its read is
/// answered 503.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// The budget counts KiB (a semaphore holds at most `u32::MAX` per take).
const UNIT: usize = 1024;

/// The permits of heavy reads, and how many reads wait for one.
#[derive(Clone, Debug)]
pub(crate) struct HeavyReads {
    permits: Arc<Semaphore>,
    /// The memory that answers not yet sent may hold, in [`UNIT`]s.
    answers: Arc<Semaphore>,
    answer_units: u32,
    /// Heavy reads that have a permit, and answers not yet sent.
    live: Arc<AtomicUsize>,
    /// Heavy reads waiting for a permit.
    queued: Arc<AtomicUsize>,
}

impl HeavyReads {
    /// Heavy reads take at most `max_readers - 1` of the database's reader
    /// connections (at least 1), so that a light read (a run, a
    /// watermark, the events the dashboard polls) finds one free.
    pub(crate) fn new(max_readers: usize) -> Self {
        let answer_units = units(DEFAULT_MAX_RESPONSE_MEMORY);
        Self {
            permits: Arc::new(Semaphore::new(max_readers.saturating_sub(1).max(1))),
            answers: Arc::new(Semaphore::new(answer_units as usize)),
            answer_units,
            live: Arc::new(AtomicUsize::new(0)),
            queued: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The same admission with answers not yet sent holding at most
    /// `bytes` together.
    pub(crate) fn with_answer_memory(mut self, bytes: usize) -> Self {
        self.answer_units = units(bytes).max(1);
        self.answers = Arc::new(Semaphore::new(self.answer_units as usize));
        self
    }

    /// Other heavy work in flight (a big batch being stored) until the
    /// guard is dropped: the last heavy work out, read or not, trims the
    /// allocator.
    pub(crate) fn heavy_work(&self) -> Live {
        Live::enter(&self.live)
    }

    /// Reads waiting for a permit now.
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Runs `f` on a blocking thread once a permit is free, and answers its
    /// result as JSON, serialized before the permit is given back.
    pub(crate) async fn json<T: Serialize + Send + 'static>(
        &self,
        storage: &Arc<dyn Storage>,
        f: impl FnOnce(&dyn Storage) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<Bytes, AppError> {
        self.encoded(storage, move |s| {
            let value = f(s)?;
            serde_json::to_vec(&value)
                .map_err(|e| AppError::Internal(format!("cannot serialize the answer: {e}")))
        })
        .await
    }

    /// Runs `f`, which reads and encodes its answer, on a blocking thread
    /// once a permit is free.
    pub(crate) async fn encoded(
        &self,
        storage: &Arc<dyn Storage>,
        f: impl FnOnce(&dyn Storage) -> Result<Vec<u8>, AppError> + Send + 'static,
    ) -> Result<Bytes, AppError> {
        self.queued.fetch_add(1, Ordering::Relaxed);
        let permit = self.permits.clone().acquire_owned().await;
        self.queued.fetch_sub(1, Ordering::Relaxed);
        let permit = permit.map_err(|_| AppError::Internal("the server is stopping".into()))?;
        let storage = storage.clone();
        let live = Live::enter(&self.live);
        let answer = tokio::task::spawn_blocking(move || f(storage.as_ref()))
            .await
            .map_err(|e| AppError::Internal(format!("storage task failed: {e}")))??;
        // An answer larger than the whole budget waits for all of it.
        let needed = units(answer.len()).min(self.answer_units).max(1);
        let share = tokio::time::timeout(
            ANSWER_WAIT,
            self.answers.clone().acquire_many_owned(needed),
        )
        .await
        .map_err(|_| {
            AppError::Busy(format!(
                "the server holds {} bytes of answers its clients have not read yet, its limit \
                 (--max-response-memory); retry shortly",
                self.answer_units as usize * UNIT
            ))
        })?
        .map_err(|_| AppError::Internal("the server is stopping".into()))?;
        drop(permit);
        Ok(Bytes::from_owner(Answer {
            json: answer,
            _share: share,
            _live: live,
        }))
    }
}

/// `bytes` in budget units, rounded up.
fn units(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX)
}

/// One heavy read in [`HeavyReads::live`] until dropped: the last one out
/// trims the allocator, on a blocking thread (it takes milliseconds).
#[derive(Debug)]
pub(crate) struct Live(Arc<AtomicUsize>);

impl Live {
    fn enter(live: &Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::AcqRel);
        Self(live.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if self.0.fetch_sub(1, Ordering::AcqRel) == 1 {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(crate::trim::release_free_memory)),
                Err(_) => crate::trim::release_free_memory(),
            }
        }
    }
}

/// A heavy read's answer, held until the response body is dropped (sent,
/// or its connection closed). Fields drop in order: the JSON is freed
/// before its share of the budget is given back and `Live` trims.
struct Answer {
    json: Vec<u8>,
    _share: OwnedSemaphorePermit,
    _live: Live,
}

impl AsRef<[u8]> for Answer {
    fn as_ref(&self) -> &[u8] {
        &self.json
    }
}

//! The background thread that moves spooled records to the server.
//!
//! It owns a small async runtime of its own, so the caller's thread (the
//! training loop) never runs network code. Each [`Outbox`] is one writer's
//! spool: the shipper opens the writer's run, sends what is past the
//! spool's acknowledged watermark in batches, and trims the spool with the
//! watermark the server answers. Exactly once follows from the sequence
//! numbers: a batch whose answer was lost is sent again and the server skips
//! what it has; a gap is answered 409 and the shipper asks for the
//! watermark and carries on from it.
//!
//! Errors never drop records. One that waiting can cure (no connection,
//! 5xx) is retried with backoff; one that it cannot (wrong token, a record
//! larger than the server takes) stops that writer's shipping, keeps its
//! records spooled, and is what [`Shipper::flush`] reports.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use relaunch_api::RunInfo;
use relaunch_api::batch::{put_checksum, put_header, put_record_with_seq};

use crate::error::{ClientError, ErrorKind};
use crate::http::Client;
use crate::local::{WriterInfo, remove_writer};
use crate::spool::Spool;

/// Largest batch sent, in record bytes; halved when the server answers 413.
pub const MAX_BATCH_BYTES: usize = 4 << 20;
/// Backoff bounds after a failure that waiting may cure.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// How often a writer stopped by an error is tried again, in case the server
/// was fixed.
const STUCK_RETRY: Duration = Duration::from_secs(30);

/// One writer's spool, on its way to the server.
#[derive(Debug)]
pub struct Outbox {
    pub dir: PathBuf,
    pub info: WriterInfo,
    pub spool: Arc<Mutex<Spool>>,
    /// A dead writer's spool taken over: its directory is removed once
    /// everything in it is on the server.
    pub adopted: bool,
}

#[derive(Debug)]
struct Entry {
    outbox: Outbox,
    opened: bool,
    max_batch: usize,
    /// Why this writer is not shipping, when retrying cannot help; since when.
    stuck: Option<(ErrorKind, String, Instant)>,
    /// Records of an adopted spool are all on the server and its directory removed.
    done: bool,
}

#[derive(Debug, Default)]
struct Progress {
    /// The last failure, cleared by the next success.
    last_error: Option<String>,
    /// The run as the server last answered `POST /runs` for the first outbox.
    run: Option<RunInfo>,
    /// Bumped after every round, so waiters re-check their condition.
    rounds: u64,
}

#[derive(Debug)]
struct Shared {
    entries: Mutex<Vec<Entry>>,
    progress: Mutex<Progress>,
    changed: Condvar,
    wake: tokio::sync::Notify,
    stop: AtomicBool,
    stopped: tokio::sync::Notify,
}

/// The shipping thread and the handle to wait on it.
#[derive(Debug)]
pub struct Shipper {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    server: String,
}

/// What [`Shipper::flush`] waits for, per outbox: its last seq at the call.
type Targets = Vec<(Arc<Mutex<Spool>>, u64)>;

impl Shipper {
    /// Starts shipping `outboxes` to `client`, polling every `interval` for
    /// new records (a [`Shipper::flush`] does not wait for the poll).
    pub fn start(
        client: Client,
        outboxes: Vec<Outbox>,
        interval: Duration,
    ) -> Result<Self, ClientError> {
        let shared = Arc::new(Shared {
            entries: Mutex::new(outboxes.into_iter().map(Entry::new).collect()),
            progress: Mutex::new(Progress::default()),
            changed: Condvar::new(),
            wake: tokio::sync::Notify::new(),
            stop: AtomicBool::new(false),
            stopped: tokio::sync::Notify::new(),
        });
        let server = client.url().to_owned();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Config(format!("cannot start the shipper's runtime: {e}")))?;
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("relaunch-shipper".into())
            .spawn(move || {
                runtime.block_on(ship_loop(&thread_shared, &client, interval));
                // Wake flushers so they see the stop.
                thread_shared.progress.lock().rounds += 1;
                thread_shared.changed.notify_all();
            })
            .map_err(|e| ClientError::Config(format!("cannot start the shipper thread: {e}")))?;
        Ok(Self {
            shared,
            thread: Some(thread),
            server,
        })
    }

    /// Ships `outbox` too (a dead writer's spool found after start).
    pub fn add(&self, outbox: Outbox) {
        self.shared.entries.lock().push(Entry::new(outbox));
        self.shared.wake.notify_one();
    }

    /// Returns once the server has acknowledged every record spooled before
    /// the call, in every outbox. Fails at once when a writer is stuck on an
    /// error retrying cannot fix, and after `timeout` otherwise.
    pub fn flush(&self, timeout: Option<Duration>) -> Result<(), ClientError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let targets: Targets = self
            .shared
            .entries
            .lock()
            .iter()
            .filter(|e| !e.done)
            .map(|e| {
                let spool = e.outbox.spool.clone();
                let last = spool.lock().last_seq();
                (spool, last)
            })
            .collect();
        self.shared.wake.notify_one();
        loop {
            // Lock order: entries, then spools, then progress; never the reverse.
            let seen = self.shared.progress.lock().rounds;
            let missing: u64 = targets
                .iter()
                .map(|(spool, target)| target.saturating_sub(spool.lock().acked()))
                .sum();
            if missing == 0 {
                return Ok(());
            }
            if let Some(problem) = self.stuck() {
                return Err(problem);
            }
            if self.thread.as_ref().is_none_or(JoinHandle::is_finished) {
                return Err(ClientError::Config(format!(
                    "{missing} records are not on the server and the shipper has stopped"
                )));
            }
            let mut progress = self.shared.progress.lock();
            let now = Instant::now();
            if let Some(deadline) = deadline
                && now >= deadline
            {
                let why = progress
                    .last_error
                    .clone()
                    .unwrap_or_else(|| "the server is slow to answer".into());
                return Err(ClientError::Timeout(format!(
                    "{missing} records not acknowledged by {} after {:.1} s ({why}); \
                     they stay in the spool and are shipped later",
                    self.server,
                    timeout.unwrap_or_default().as_secs_f64()
                )));
            }
            if progress.rounds == seen {
                let wait = deadline.map_or(Duration::from_millis(500), |d| {
                    (d - now).min(Duration::from_millis(500))
                });
                self.shared.changed.wait_for(&mut progress, wait);
            }
        }
    }

    /// The first writer stuck on an error retrying cannot fix.
    fn stuck(&self) -> Option<ClientError> {
        let entries = self.shared.entries.lock();
        entries.iter().find_map(|e| {
            e.stuck.as_ref().map(|(kind, message, _)| {
                let message = format!(
                    "records of writer {} (run {}) cannot be shipped to {}: {message}; \
                     they stay in {} until this is fixed",
                    e.outbox.info.writer,
                    e.outbox.info.run_id(),
                    self.server,
                    e.outbox.dir.display()
                );
                match kind {
                    ErrorKind::Unauthorized => ClientError::Status {
                        status: 401,
                        what: "the records".into(),
                        message,
                        retry_after: None,
                    },
                    ErrorKind::TooLarge => ClientError::Status {
                        status: 413,
                        what: "the records".into(),
                        message,
                        retry_after: None,
                    },
                    ErrorKind::BadRequest => ClientError::Status {
                        status: 400,
                        what: "the records".into(),
                        message,
                        retry_after: None,
                    },
                    _ => ClientError::Corrupt(message),
                }
            })
        })
    }

    /// The run as the server last described it (attempt number included).
    pub fn run_info(&self) -> Option<RunInfo> {
        self.shared.progress.lock().run.clone()
    }

    /// Records spooled and not yet acknowledged, over every outbox.
    pub fn pending(&self) -> u64 {
        self.shared
            .entries
            .lock()
            .iter()
            .filter(|e| !e.done)
            .map(|e| e.outbox.spool.lock().pending())
            .sum()
    }

    /// Stops the thread now, whatever is in flight; nothing spooled is lost.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.stopped.notify_one();
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Shipper {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Entry {
    fn new(outbox: Outbox) -> Self {
        Self {
            outbox,
            opened: false,
            max_batch: MAX_BATCH_BYTES,
            stuck: None,
            done: false,
        }
    }
}

/// What one pass over the outboxes did.
enum Round {
    /// Sent something; there may be more.
    Sent,
    /// Nothing to send.
    Idle,
    /// Failed in a way that waiting may cure; the server may have said
    /// how long to wait (`Retry-After`).
    Failed(Option<Duration>),
}

async fn ship_loop(shared: &Shared, client: &Client, interval: Duration) {
    let mut backoff = BACKOFF_MIN;
    while !shared.stop.load(Ordering::SeqCst) {
        let round = tokio::select! {
            round = ship_round(shared, client) => round,
            () = shared.stopped.notified() => break,
        };
        {
            let mut progress = shared.progress.lock();
            progress.rounds += 1;
            shared.changed.notify_all();
        }
        let pause = match round {
            Round::Sent => {
                backoff = BACKOFF_MIN;
                continue;
            }
            Round::Idle => {
                backoff = BACKOFF_MIN;
                interval
            }
            Round::Failed(asked) => {
                let pause = crate::http::jitter(backoff).max(asked.unwrap_or_default());
                backoff = (backoff * 2).min(BACKOFF_MAX);
                pause
            }
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shared.wake.notified() => {}
            () = shared.stopped.notified() => break,
        }
    }
}

async fn ship_round(shared: &Shared, client: &Client) -> Round {
    let count = shared.entries.lock().len();
    let mut round = Round::Idle;
    for index in 0..count {
        match ship_one(shared, client, index).await {
            Ok(true) => round = Round::Sent,
            Ok(false) => {}
            Err(e) => {
                let message = e.to_string();
                let mut progress = shared.progress.lock();
                if progress.last_error.as_deref() != Some(message.as_str()) {
                    tracing::warn!(error = %message, "shipping records failed; they stay spooled and are retried");
                }
                progress.last_error = Some(message);
                match round {
                    Round::Idle => round = Round::Failed(e.retry_after()),
                    Round::Failed(asked) => round = Round::Failed(asked.max(e.retry_after())),
                    Round::Sent => {}
                }
            }
        }
    }
    round
}

/// Sends the next batch of outbox `index`; `Ok(true)` when it sent one.
async fn ship_one(shared: &Shared, client: &Client, index: usize) -> Result<bool, ClientError> {
    let (spool, info, opened, max_batch) = {
        let mut entries = shared.entries.lock();
        let entry = &mut entries[index];
        if entry.done {
            return Ok(false);
        }
        if let Some((_, _, since)) = &entry.stuck {
            if since.elapsed() < STUCK_RETRY {
                return Ok(false);
            }
            entry.stuck = None;
        }
        (
            entry.outbox.spool.clone(),
            entry.outbox.info.clone(),
            entry.opened,
            entry.max_batch,
        )
    };
    let result = async {
        if !opened {
            let run = client.open_run(&info.run).await?;
            let mut entries = shared.entries.lock();
            entries[index].opened = true;
            if index == 0 {
                shared.progress.lock().run = Some(run);
            }
        }
        send_next(client, &spool, &info, max_batch).await
    }
    .await;
    match result {
        Ok(sent) => {
            shared.progress.lock().last_error = None;
            if !sent {
                finish_adopted(shared, index);
            }
            Ok(sent)
        }
        Err(e) => {
            let mut entries = shared.entries.lock();
            let entry = &mut entries[index];
            match e.kind() {
                // The run is gone (a wiped server): create it again.
                ErrorKind::NotFound => entry.opened = false,
                // Smaller batches, at once: this is no failure of the server.
                ErrorKind::TooLarge if entry.max_batch > 1 => {
                    entry.max_batch /= 2;
                    return Ok(true);
                }
                ErrorKind::Unavailable | ErrorKind::Timeout => {}
                kind => entry.stuck = Some((kind, e.to_string(), Instant::now())),
            }
            Err(e)
        }
    }
}

/// Sends the records after the acknowledged watermark, up to `max_batch`
/// bytes (at least one record); `Ok(false)` when there was nothing to send.
async fn send_next(
    client: &Client,
    spool: &Arc<Mutex<Spool>>,
    info: &WriterInfo,
    max_batch: usize,
) -> Result<bool, ClientError> {
    let (acked, records) = {
        let spool = spool.lock();
        let acked = spool.acked();
        (acked, spool.read_after(acked, max_batch)?)
    };
    if records.is_empty() {
        return Ok(false);
    }
    // The spool numbers records without gaps and the server refuses a
    // batch with one: a gap here is a damaged spool, said as such.
    if let Some((expected, (seq, _))) = (acked + 1..)
        .zip(&records)
        .find(|(expected, (seq, _))| seq != expected)
    {
        return Err(ClientError::Corrupt(format!(
            "the spool of writer {} holds record {seq} where {expected} should be; its \
             records are not consecutive (a damaged spool directory?)",
            info.writer
        )));
    }
    let size: usize = records.iter().map(|(_, r)| r.len() + 8).sum();
    let mut body = Vec::with_capacity(size + 600);
    put_header(
        &mut body,
        &info.writer,
        &info.run.attempt_token,
        records.len() as u32,
    );
    for (seq, record) in &records {
        put_record_with_seq(&mut body, *seq, record);
    }
    put_checksum(&mut body, 0);
    let run = info.run_id();
    let watermark = match client.send_batch(run, body).await {
        Ok(ack) => ack.watermark,
        Err(e) if e.kind() == ErrorKind::Conflict => {
            // The server has fewer or more records than this spool thinks:
            // continue from what it has.
            let mark = client.watermark(run, &info.writer).await?;
            let acked = spool.lock().acked();
            if mark < acked {
                return Err(ClientError::Corrupt(format!(
                    "the server has records of writer {} only up to {mark}, but it had acknowledged up to \
                     {acked} and those were dropped from the spool; the server lost data (restored from \
                     an older copy?)",
                    info.writer
                )));
            }
            let top = spool.lock().last_seq();
            if mark > top {
                return Err(ClientError::Corrupt(format!(
                    "the server has {mark} records of writer {} but its spool holds {top}; \
                     two processes must not share a spool directory",
                    info.writer
                )));
            }
            mark
        }
        Err(e) if e.kind() == ErrorKind::TooLarge && records.len() == 1 => {
            return Err(ClientError::Status {
                status: 413,
                what: "a record".into(),
                message: format!(
                    "one record of {size} bytes is larger than the server accepts; raise the server's --max-request-bytes"
                ),
                retry_after: None,
            });
        }
        Err(e) => return Err(e),
    };
    spool.lock().ack(watermark)?;
    Ok(true)
}

/// Removes an adopted spool's directory once it is all on the server.
fn finish_adopted(shared: &Shared, index: usize) {
    let mut entries = shared.entries.lock();
    let entry = &mut entries[index];
    if !entry.outbox.adopted || entry.done || entry.outbox.spool.lock().pending() > 0 {
        return;
    }
    let spool = entry.outbox.spool.lock();
    let removed = remove_writer(&spool);
    drop(spool);
    match removed {
        Ok(()) => {
            tracing::info!(dir = %entry.outbox.dir.display(), "shipped a spool left by an earlier process");
            entry.done = true;
        }
        Err(e) => tracing::warn!(error = %e, "cannot remove a shipped spool"),
    }
}

//! A run handle: what `relaunch.init` returns in Python and what the
//! launcher logs through. Every record is appended to this process's spool
//! before the call returns (it then survives the process being killed) and
//! shipped by a background [`Shipper`]; no call here touches the network.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use relaunch_api::batch::{MAX_VALUES, put_log, put_metric_value, put_metrics_header};
use relaunch_api::{Record, RunInit, Stream};
use serde_json::Value;

use crate::env;
use crate::error::ClientError;
use crate::http::{Client, check_run_id, normalize_server};
use crate::local::{self, WriterInfo};
use crate::shipper::{Outbox, Shipper};
use crate::spool::{Spool, SpoolError, SpoolOptions};
use crate::uploads::{self, Uploader};

/// How often the shipper looks for new records when nobody flushes.
pub const DEFAULT_SHIP_INTERVAL: Duration = Duration::from_millis(100);

/// What to open. Unset fields come from the environment (see [`env`]),
/// then from defaults.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub project: Option<String>,
    pub id: Option<String>,
    pub name: Option<String>,
    pub config: Option<Value>,
    pub tags: Vec<String>,
    pub notes: Option<String>,
    /// `http(s)://HOST:PORT`; `RELAUNCH_SERVER` when unset.
    pub server: Option<String>,
    pub token: Option<String>,
    /// Log to the spool only, ship nothing (`relaunch sync` ships it later).
    pub offline: bool,
    /// The client's directory; `RELAUNCH_DIR`, else [`local::default_dir`].
    pub dir: Option<PathBuf>,
    /// The rank records are logged as; `RANK`, else 0.
    pub rank: Option<u32>,
    /// `RELAUNCH_ATTEMPT_TOKEN`, else a new attempt for this process.
    pub attempt_token: Option<String>,
    /// Starts this process's writer id (`rank0` by default).
    pub writer_prefix: Option<String>,
    /// Record `start` and `finished` events. Default: when no launcher
    /// (which records the job's events itself) started this process.
    pub lifecycle_events: Option<bool>,
    /// Zero means [`DEFAULT_SHIP_INTERVAL`].
    pub ship_interval: Duration,
    pub segment_bytes: Option<usize>,
}

/// An open run of this process.
#[derive(Debug)]
pub struct Run {
    id: String,
    rank: u32,
    writer: String,
    writer_dir: PathBuf,
    server: Option<String>,
    spool: Arc<Mutex<Spool>>,
    scratch: Mutex<Scratch>,
    shipper: Mutex<Option<Shipper>>,
    /// Uploads files saved with [`Run::save_file`] (and ones a dead process
    /// of the run left); started when there is something to upload.
    uploader: Mutex<Option<Uploader>>,
    /// The client directory, where saved files wait to be uploaded.
    client_dir: PathBuf,
    token: Option<String>,
    /// The attempt number the shipper learned, kept once it has stopped.
    stopped_attempt: Mutex<Option<u32>>,
    lifecycle: bool,
    finished: AtomicBool,
    /// This handle was copied into a child by `fork`; it must not log.
    disowned: AtomicBool,
}

/// Where the value count sits in a metrics record body: after kind (1),
/// step (8), wall (8) and rank (4).
const COUNT_AT: usize = 21;

/// The values of one metrics record being built.
#[derive(Debug)]
pub struct MetricsBody<'a> {
    body: &'a mut Vec<u8>,
    count: u16,
}

impl MetricsBody<'_> {
    /// Adds `key`'s value; the key must pass `relaunch_api::names::check_key`.
    pub fn put(&mut self, key: &str, value: f64) -> Result<(), ClientError> {
        relaunch_api::names::check_key(key).map_err(ClientError::Config)?;
        if usize::from(self.count) >= MAX_VALUES {
            return Err(ClientError::Config(format!(
                "more than {MAX_VALUES} values in one call; log fewer at a time"
            )));
        }
        put_metric_value(self.body, key, value);
        self.count += 1;
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Scratch {
    body: Vec<u8>,
    next_step: i64,
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn new_id(len: usize) -> String {
    let mut id = uuid::Uuid::new_v4().simple().to_string();
    id.truncate(len);
    id
}

impl Run {
    /// Opens the run: a spool of its own for this process, the run's
    /// settings beside it, and (unless offline) a shipper that also takes
    /// over spools that dead processes of the same run left behind.
    pub fn start(options: RunOptions) -> Result<Self, ClientError> {
        let id = options
            .id
            .clone()
            .or_else(|| env::var(env::RUN_ID))
            .unwrap_or_else(|| new_id(12));
        check_run_id(&id)?;
        let project = options.project.clone().or_else(|| env::var(env::PROJECT));
        if let Some(project) = &project {
            relaunch_api::names::check_name("project", project).map_err(ClientError::Config)?;
        }
        let rank = match options.rank {
            Some(rank) => rank,
            None => match env::var(env::RANK) {
                Some(text) => text.trim().parse().map_err(|_| {
                    ClientError::Config(format!(
                        "{}={text:?} is not a rank; unset it or pass rank=",
                        env::RANK
                    ))
                })?,
                None => 0,
            },
        };
        let under_launcher = env::var(env::ATTEMPT_TOKEN).is_some();
        let attempt_token = options
            .attempt_token
            .clone()
            .or_else(|| env::var(env::ATTEMPT_TOKEN))
            .unwrap_or_else(|| format!("process-{}", new_id(16)));
        let server = if options.offline {
            None
        } else {
            match options.server.clone().or_else(|| env::var(env::SERVER)) {
                Some(server) => Some(normalize_server(&server)?),
                None => None,
            }
        };
        let token = options
            .token
            .clone()
            .or_else(|| env::var(env::SERVER_TOKEN));
        let dir = options
            .dir
            .clone()
            .or_else(|| env::var(env::DIR).map(PathBuf::from))
            .unwrap_or_else(local::default_dir);
        let prefix = options
            .writer_prefix
            .clone()
            .unwrap_or_else(|| format!("rank{rank}"));
        let writer = format!("{prefix}-{}", new_id(12));
        for tag in &options.tags {
            if tag.is_empty() || tag.len() > 256 {
                return Err(ClientError::Config(format!(
                    "tag {tag:?} must be 1 to 256 bytes"
                )));
            }
        }
        let created = now();
        let info = WriterInfo {
            format: 1,
            writer: writer.clone(),
            run: RunInit {
                project,
                id: Some(id.clone()),
                name: options.name.clone(),
                config: options.config.clone(),
                tags: options.tags.clone(),
                notes: options.notes.clone(),
                attempt_token,
                // This process started now; the server keeps the earliest
                // of the attempt's processes.
                attempt_started: Some(created),
            },
            server: server.clone(),
            created,
            pid: std::process::id(),
        };
        let (writer_dir, lock) = local::create_writer(&dir, &info)?;
        let spool_options = SpoolOptions {
            segment_bytes: options
                .segment_bytes
                .unwrap_or(SpoolOptions::default().segment_bytes),
        };
        let spool = Arc::new(Mutex::new(Spool::open_locked(
            &writer_dir,
            lock,
            spool_options,
        )?));
        let shipper = match &server {
            Some(server) => {
                let client = Client::new(server, token.as_deref())?;
                let mut outboxes = vec![Outbox {
                    dir: writer_dir.clone(),
                    info: info.clone(),
                    spool: spool.clone(),
                    adopted: false,
                }];
                outboxes.extend(adopt_orphans(&dir, &id, &writer, spool_options));
                let interval = if options.ship_interval.is_zero() {
                    DEFAULT_SHIP_INTERVAL
                } else {
                    options.ship_interval
                };
                Some(Shipper::start(client, outboxes, interval)?)
            }
            None => None,
        };
        let run = Self {
            id,
            rank,
            writer,
            writer_dir,
            server,
            spool,
            scratch: Mutex::new(Scratch::default()),
            shipper: Mutex::new(shipper),
            uploader: Mutex::new(None),
            client_dir: dir.clone(),
            token: token.clone(),
            stopped_attempt: Mutex::new(None),
            lifecycle: options.lifecycle_events.unwrap_or(!under_launcher),
            finished: AtomicBool::new(false),
            disowned: AtomicBool::new(false),
        };
        if run.server.is_some() {
            // Saved files a dead process of this run did not upload.
            let left = uploads::pending(&run.client_dir, &run.id);
            if !left.is_empty() {
                tracing::info!(
                    files = left.len(),
                    "uploading files saved by an earlier process"
                );
                run.uploader(left)?;
            }
        }
        if run.lifecycle {
            let data = serde_json::json!({
                "pid": std::process::id(),
                "rank": rank,
                "host": hostname(),
            });
            run.event("start", "", &data)?;
        }
        Ok(run)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn writer(&self) -> &str {
        &self.writer
    }

    /// This process's spool directory.
    pub fn dir(&self) -> &Path {
        &self.writer_dir
    }

    /// The server records are shipped to; `None` when offline.
    pub fn server(&self) -> Option<&str> {
        self.server.as_deref()
    }

    /// The attempt number the server gave this process's attempt, once the
    /// run was opened there.
    pub fn attempt(&self) -> Option<u32> {
        match self.shipper.lock().as_ref() {
            Some(shipper) => shipper.run_info().and_then(|r| r.attempt),
            None => *self.stopped_attempt.lock(),
        }
    }

    /// Stops `shipper`, keeping the attempt number it learned for [`Run::attempt`].
    fn stop_shipper(&self, mut shipper: Shipper) {
        if let Some(attempt) = shipper.run_info().and_then(|r| r.attempt) {
            *self.stopped_attempt.lock() = Some(attempt);
        }
        shipper.stop();
    }

    /// Logs the values of one step. Without `step`, the step after the
    /// previous one (0 first); with it, later calls without a step continue
    /// from it. Returns the step used.
    pub fn log(&self, step: Option<i64>, values: &[(&str, f64)]) -> Result<i64, ClientError> {
        self.log_with(step, |body| {
            for (key, value) in values {
                body.put(key, *value)?;
            }
            Ok(())
        })
    }

    /// [`Run::log`] for callers that produce the values one by one (the
    /// Python binding walks a dict): `fill` puts each into the record. When
    /// `fill` fails nothing is logged and the step is not used up.
    pub fn log_with<E: From<ClientError>>(
        &self,
        step: Option<i64>,
        fill: impl FnOnce(&mut MetricsBody<'_>) -> Result<(), E>,
    ) -> Result<i64, E> {
        self.check_open()?;
        let mut scratch = self.scratch.lock();
        let step = step.unwrap_or(scratch.next_step);
        let Scratch { body, next_step } = &mut *scratch;
        body.clear();
        put_metrics_header(body, step, now(), self.rank, 0);
        let mut values = MetricsBody { body, count: 0 };
        fill(&mut values)?;
        let count = values.count;
        body[COUNT_AT..COUNT_AT + 2].copy_from_slice(&count.to_le_bytes());
        self.spool.lock().append(body).map_err(ClientError::from)?;
        *next_step = (*next_step).max(step.saturating_add(1));
        crate::beat::beat(Some(step));
        Ok(step)
    }

    /// Logs one console line of `rank`.
    pub fn log_line(&self, rank: u32, stream: Stream, text: &str) -> Result<(), ClientError> {
        self.check_open()?;
        let mut scratch = self.scratch.lock();
        scratch.body.clear();
        put_log(&mut scratch.body, rank, stream, now(), text);
        self.spool.lock().append(&scratch.body)?;
        Ok(())
    }

    /// Records an event; `start`, `restart`, `preempted`, `failed` and
    /// `finished` also set the run's status.
    pub fn event(&self, kind: &str, text: &str, data: &Value) -> Result<(), ClientError> {
        self.check_open()?;
        relaunch_api::names::check_event_kind(kind).map_err(ClientError::Config)?;
        let data = if data.is_null() {
            String::new()
        } else {
            data.to_string()
        };
        // What the server would refuse never enters the spool (it would
        // hold up every record after it).
        relaunch_api::names::check_event_data(&data).map_err(ClientError::Config)?;
        let mut body = Vec::with_capacity(64 + text.len() + data.len());
        Record::Event {
            kind: kind.to_owned(),
            wall: now(),
            text: text.to_owned(),
            data,
        }
        .encode(&mut body);
        self.spool.lock().append(&body)?;
        Ok(())
    }

    /// Returns once the server has acknowledged everything logged so far
    /// (offline: once it is on disk). Fails with the reason otherwise; the
    /// records stay in the spool either way.
    pub fn flush(&self, timeout: Option<Duration>) -> Result<(), ClientError> {
        self.check_owned()?;
        self.spool.lock().sync()?;
        let began = std::time::Instant::now();
        if let Some(shipper) = self.shipper.lock().as_ref() {
            shipper.flush(timeout)?;
        }
        match self.uploader.lock().as_ref() {
            Some(uploader) => uploader.wait(timeout.map(|t| t.saturating_sub(began.elapsed()))),
            None => Ok(()),
        }
    }

    /// Saves the file at `path` to the run as `name` (default: its file
    /// name): snapshotted at once (a hard link, else a copy; moved when
    /// `take`), then uploaded in the background. Survives the process: a
    /// later `init` of the run or `relaunch sync` uploads what it did not.
    /// Offline, it waits for `relaunch sync`.
    pub fn save_file(
        &self,
        path: &Path,
        name: Option<&str>,
        take: bool,
    ) -> Result<String, ClientError> {
        self.check_open()?;
        let name = match name {
            Some(name) => name.to_owned(),
            None => path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| {
                    ClientError::Config(format!("{} has no file name; give one", path.display()))
                })?,
        };
        let intent = uploads::Intent {
            run: self.id.clone(),
            name: name.clone(),
            server: self.server.clone(),
            source: path.display().to_string(),
        };
        let dir = uploads::enqueue(&self.client_dir, &intent, path, take)?;
        self.uploader(vec![dir])?;
        Ok(name)
    }

    /// Starts the upload thread with `queue` (or adds to it).
    fn uploader(&self, queue: Vec<PathBuf>) -> Result<(), ClientError> {
        let Some(server) = &self.server else {
            return Ok(());
        };
        let mut uploader = self.uploader.lock();
        match uploader.as_ref() {
            Some(running) => queue.into_iter().for_each(|d| running.push(d)),
            None => {
                let client = Client::new(server, self.token.as_deref())?;
                *uploader = Some(Uploader::start(client, queue)?);
            }
        }
        Ok(())
    }

    /// Records unacknowledged (offline: all of them), this process's and
    /// the dead writers' it took over.
    pub fn pending(&self) -> u64 {
        if self.disowned.load(Ordering::Relaxed) {
            return 0;
        }
        match self.shipper.lock().as_ref() {
            Some(shipper) => shipper.pending(),
            None => self.spool.lock().pending(),
        }
    }

    /// Ends logging: records `finished` (or `failed` with `error`) when
    /// this run records lifecycle events; later `log` calls fail. Only the
    /// first call counts.
    pub fn end(&self, error: Option<&str>) -> Result<(), ClientError> {
        self.check_owned()?;
        if self.finished.load(Ordering::SeqCst) {
            return Ok(());
        }
        if self.lifecycle {
            match error {
                Some(text) => self.event("failed", text, &Value::Null)?,
                None => self.event("finished", "", &Value::Null)?,
            }
        }
        self.finished.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Ends the run ([`Run::end`]), flushes, stops shipping and removes this
    /// process's spool once the server has all of it. On failure the
    /// records stay where the error says.
    pub fn finish(
        &self,
        timeout: Option<Duration>,
        error: Option<&str>,
    ) -> Result<(), ClientError> {
        self.end(error)?;
        self.flush(timeout)?;
        if let Some(mut uploader) = self.uploader.lock().take() {
            uploader.stop();
        }
        let mut shipper = self.shipper.lock();
        if let Some(shipper) = shipper.take() {
            self.stop_shipper(shipper);
            // Everything is acknowledged; the spool has done its job. It is
            // removed while its lock is held, so no adopter has it.
            let mut spool = self.spool.lock();
            spool.sync()?;
            local::remove_writer(&spool)?;
            spool.close()?;
        } else if self.server.is_none() {
            // Offline, the spool is the record: let `relaunch sync` open it.
            self.spool.lock().close()?;
        }
        Ok(())
    }

    /// Stops the shipper without waiting and lets go of the spool: what is
    /// not on the server stays there for the next `init` of the run or
    /// `relaunch sync`, which may take it at once, while this handle lives
    /// on. Logging fails afterwards.
    pub fn close(&self) {
        if self.disowned.load(Ordering::SeqCst) {
            // The parent's spool and lock: not ours to release.
            return;
        }
        let shipper = self.shipper.lock().take();
        if let Some(shipper) = shipper {
            self.stop_shipper(shipper);
        }
        if let Some(mut uploader) = self.uploader.lock().take() {
            uploader.stop();
        }
        if let Err(e) = self.spool.lock().close() {
            tracing::warn!(dir = %self.writer_dir.display(), error = %e, "cannot close the spool");
        }
    }

    /// For a child process after `fork`: the handle belongs to the parent.
    /// Logging fails from now on, and nothing the parent owns is released
    /// here: the shipper thread does not exist in the child, and unlocking
    /// the spool's shared flock would unlock it for the parent too.
    pub fn disown(&self) {
        self.disowned.store(true, Ordering::SeqCst);
        if let Some(shipper) = self.shipper.lock().take() {
            std::mem::forget(shipper);
        }
        if let Some(uploader) = self.uploader.lock().take() {
            std::mem::forget(uploader);
        }
        std::mem::forget(self.spool.clone());
    }

    fn check_owned(&self) -> Result<(), ClientError> {
        if self.disowned.load(Ordering::Relaxed) {
            return Err(ClientError::Config(format!(
                "run {} was opened by the parent of this forked process; call init() here to log from it",
                self.id
            )));
        }
        Ok(())
    }

    fn check_open(&self) -> Result<(), ClientError> {
        self.check_owned()?;
        if self.finished.load(Ordering::Relaxed) {
            return Err(ClientError::Config(format!(
                "run {} is finished; start a new one with init() to log more",
                self.id
            )));
        }
        Ok(())
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.close();
    }
}

/// The spools of earlier processes of run `id` in `dir` that no live
/// process holds: shipped by this one. Empty ones are removed.
///
/// Never touches a live writer's spool: a writer's directory gets its name
/// (and, as `.WRITER.creating`, its `writer.json`) only while its creator
/// holds its lock (`local::create_writer`), the lock is taken without
/// waiting and whatever is held is skipped, and a directory is removed only
/// while this process holds its lock.
fn adopt_orphans(dir: &Path, id: &str, own: &str, options: SpoolOptions) -> Vec<Outbox> {
    let Ok(run_dir) = local::run_dir(dir, id) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(&run_dir) else {
        return Vec::new();
    };
    let mut adopted = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        // No writer.json: not a spool (`.uploads`), or one still being created.
        // Names with a leading dot are being created or removed.
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if !is_dir || hidden || entry.file_name() == own || !local::is_writer_dir(&path) {
            continue;
        }
        match local::link_inside(&path) {
            Ok(None) => {}
            Ok(Some(link)) => {
                tracing::warn!(link = %link.display(), "skipping a spool that holds a symbolic link");
                continue;
            }
            // Removed meanwhile by another process that shipped it.
            Err(_) if !path.exists() => continue,
            Err(e) => {
                tracing::warn!(error = %e, "skipping a spool that cannot be read");
                continue;
            }
        }
        let info = match local::read_writer(&path) {
            Ok(info) if info.run_id() == id => info,
            Ok(_) => continue,
            Err(_) if !path.exists() => continue,
            Err(e) => {
                tracing::warn!(error = %e, "skipping a spool that cannot be read");
                continue;
            }
        };
        let spool = match Spool::open_existing(&path, options) {
            Ok(spool) => spool,
            // A live process writes or ships it, or another one shipped it.
            Err(SpoolError::Busy { .. } | SpoolError::Gone { .. }) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "skipping a spool that cannot be opened");
                continue;
            }
        };
        if spool.pending() == 0 {
            // Removed while locked; the lock goes with `spool` after.
            if let Err(e) = local::remove_writer(&spool) {
                tracing::warn!(error = %e, "cannot remove an empty spool");
            }
            drop(spool);
            continue;
        }
        tracing::info!(dir = %path.display(), pending = spool.pending(), "shipping a spool left by an earlier process");
        adopted.push(Outbox {
            dir: path,
            info,
            spool: Arc::new(Mutex::new(spool)),
            adopted: true,
        });
    }
    adopted
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_call_is_one_metrics_record_and_a_failed_one_leaves_nothing() {
        let dir = std::env::temp_dir().join(format!("relaunch-run-unit-{}", std::process::id()));
        let run = Run::start(RunOptions {
            id: Some("unit".into()),
            offline: true,
            dir: Some(dir.clone()),
            rank: Some(3),
            lifecycle_events: Some(false),
            ..RunOptions::default()
        })
        .unwrap();
        assert_eq!(run.log(None, &[("loss", 0.5), ("lr", 1e-3)]).unwrap(), 0);
        let bad = run.log_with(None, |body| {
            body.put("fine", 1.0)?;
            body.put("bad\nkey", 2.0)
        });
        assert!(bad.is_err());
        assert_eq!(
            run.log(None, &[("loss", 0.25)]).unwrap(),
            1,
            "the failed call used no step"
        );
        assert_eq!(run.log(Some(10), &[]).unwrap(), 10);
        let records = run.spool.lock().read_after(0, usize::MAX).unwrap();
        assert_eq!(records.len(), 3);
        match Record::decode(&records[0].1).unwrap() {
            Record::Metrics {
                step, rank, values, ..
            } => {
                assert_eq!((step, rank), (0, 3));
                assert_eq!(
                    values,
                    vec![("loss".to_owned(), 0.5), ("lr".to_owned(), 1e-3)]
                );
            }
            other => panic!("{other:?}"),
        }
        drop(run);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! `relaunch run --server URL`: the job as a run of the tracking server.
//!
//! Every node's launcher logs through its own [`Run`] of the job's run
//! (its id is the job's run id), one per attempt, so that what it records
//! lands in that attempt:
//! - node 0 records the job's status as events: `start` when an attempt
//!   begins, `restart` when workers failed and restart, and at the end
//!   `finished`, `failed` (with the root cause) or `preempted`;
//! - each node records `worker_failed` with its own root-cause report when
//!   one of its workers fails;
//! - each worker's console lines, as whole lines with their global rank;
//! - the node's system metrics (`system/...`, `gpu/{i}/...`) every few
//!   seconds, as rank = node rank, step = milliseconds since the epoch.
//!
//! Workers get the server, the project, the client directory and the
//! attempt's token in their environment, so `relaunch.init()` in every rank
//! joins the same run and attempt. The token is `LAUNCH:ATTEMPT`: `LAUNCH`
//! is agreed once per launch through the store (the first node's wins), so
//! every node of an attempt shares it and a relaunch of the job gets new ones.
//!
//! Nothing here waits on the server: records go to the spool and a
//! background thread ships them. Only the end of the job waits, for at most
//! the exit timeout, and says where the rest is kept when the server did not
//! take it all.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use relaunch_api::Stream as ApiStream;
use relaunch_client::env as client_env;
use relaunch_client::run::{Run, RunOptions};
use relaunch_client::system::SystemSampler;
use serde_json::json;
use tokio::task::JoinHandle;

use crate::config::{Placement, TrackingConfig};
use crate::console::{ConsoleSender, Stream};
use crate::error::LaunchError;
use crate::job_store::JobStore;
use crate::keys;

/// Seconds between system metric samples by default.
pub const DEFAULT_SYSTEM_INTERVAL: Duration = Duration::from_secs(10);
/// Seconds the end of a job waits for the server to take what is left
/// (the Python client's interpreter exit reads it too).
pub const EXIT_TIMEOUT_ENV: &str = "RELAUNCH_EXIT_TIMEOUT";
/// How long the end of a job waits for the server to take what is left,
/// unless [`EXIT_TIMEOUT_ENV`] says otherwise.
pub const DEFAULT_EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// The wait when a signal stopped the job: the scheduler's grace period is
/// running out, and the spool keeps what is not shipped.
const STOPPED_EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long this node waits for the store to agree on the launch id.
const AGREE_TIMEOUT: Duration = Duration::from_secs(30);

/// The run as this node's launcher logs it.
pub(crate) struct Tracker {
    config: TrackingConfig,
    run_id: String,
    launch: String,
    node_rank: usize,
    hostname: String,
    /// This attempt's run handle; the sampler and the output taps log
    /// through it.
    current: Arc<Mutex<Option<Arc<Run>>>>,
    sampler: Option<JoinHandle<()>>,
    /// The last failure this node heard of, for the `failed` event.
    cause: Option<String>,
}

/// Where one worker stream's lines go on the server.
#[derive(Clone, Debug)]
pub struct LineTap {
    run: Arc<Run>,
    rank: u32,
}

impl LineTap {
    /// Spools one whole console line; a failure is logged once per stream
    /// by the caller's `warned` flag and never stops the output.
    pub fn line(&self, stream: Stream, text: &[u8], warned: &mut bool) {
        let stream = match stream {
            Stream::Stdout => ApiStream::Stdout,
            Stream::Stderr => ApiStream::Stderr,
        };
        let text = String::from_utf8_lossy(text);
        if let Err(e) = self.run.log_line(self.rank, stream, &text)
            && !*warned
        {
            *warned = true;
            tracing::warn!(rank = self.rank, error = %e, "cannot spool a console line for the tracking server");
        }
    }
}

impl Tracker {
    /// Agrees on this launch's id with the other nodes through the store.
    pub(crate) async fn open(
        config: TrackingConfig,
        run_id: &str,
        store: &JobStore,
        hostname: &str,
    ) -> Result<Self, LaunchError> {
        let mine = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let key = keys::launch(run_id);
        let agreed = tokio::time::timeout(
            AGREE_TIMEOUT,
            store.client.compare_set(&key, "", mine.as_str()),
        )
        .await
        .map_err(|_| {
            LaunchError::Rendezvous(format!(
                "the store did not answer in {AGREE_TIMEOUT:?} when agreeing on the launch id"
            ))
        })?
        .map_err(|e| LaunchError::Rendezvous(format!("cannot agree on the launch id: {e}")))?;
        let launch = String::from_utf8_lossy(&agreed).into_owned();
        Ok(Self {
            config,
            run_id: run_id.to_owned(),
            launch,
            node_rank: 0,
            hostname: hostname.to_owned(),
            current: Arc::new(Mutex::new(None)),
            sampler: None,
            cause: None,
        })
    }

    fn token_for(&self, attempt: u32) -> String {
        format!("{}:{attempt}", self.launch)
    }

    fn is_leader(&self) -> bool {
        self.node_rank == 0
    }

    fn run(&self) -> Option<Arc<Run>> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Opens attempt `attempt` (agreed by every node): a new run handle
    /// whose records belong to it; node 0 records `start`. The previous
    /// handle's spool, if the server did not take all of it yet, is taken
    /// over by the new handle's shipper.
    pub(crate) fn begin_attempt(
        &mut self,
        attempt: u32,
        place: Placement,
        restarts: u32,
        nproc: usize,
        out: &ConsoleSender,
    ) {
        self.close_attempt();
        self.cause = None;
        self.node_rank = place.node_rank;
        let options = RunOptions {
            project: self.config.project.clone(),
            id: Some(self.run_id.clone()),
            server: Some(self.config.server.clone()),
            token: self.config.token.clone(),
            dir: Some(self.config.dir.clone()),
            rank: Some(u32::try_from(self.node_rank).unwrap_or(u32::MAX)),
            attempt_token: Some(self.token_for(attempt)),
            writer_prefix: Some(format!("launcher-n{}", self.node_rank)),
            lifecycle_events: Some(false),
            ..RunOptions::default()
        };
        let run = match Run::start(options) {
            Ok(run) => Arc::new(run),
            Err(e) => {
                out.notice(format!(
                    "relaunch: warning: cannot log attempt {attempt} to {}: {e}; the job runs on untracked",
                    self.config.server
                ));
                return;
            }
        };
        if self.is_leader() {
            let text = if attempt == 0 {
                format!(
                    "job started: {} node(s), world size {}",
                    place.nodes, place.world_size
                )
            } else {
                format!(
                    "attempt {attempt} started: {} node(s), world size {}, restart {restarts}",
                    place.nodes, place.world_size
                )
            };
            let data = json!({
                "launch": self.launch,
                "attempt": attempt,
                "restarts": restarts,
                "nodes": place.nodes,
                "world_size": place.world_size,
                "nproc_per_node": nproc,
                "host": self.hostname,
            });
            record(&run, "start", &text, &data);
        }
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(run);
        if self.sampler.is_none() && !self.config.system_interval.is_zero() {
            self.sampler = Some(self.start_sampler());
        }
    }

    /// The tap for one worker's output this attempt, if tracking works.
    pub(crate) fn tap(&self, global_rank: usize) -> Option<LineTap> {
        Some(LineTap {
            run: self.run()?,
            rank: u32::try_from(global_rank).unwrap_or(u32::MAX),
        })
    }

    /// What every worker needs to log to the same run and attempt.
    pub(crate) fn worker_env(&self, attempt: u32) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (client_env::SERVER, self.config.server.clone()),
            (client_env::ATTEMPT_TOKEN, self.token_for(attempt)),
            (client_env::DIR, self.config.dir.display().to_string()),
        ];
        if let Some(token) = &self.config.token {
            env.push((client_env::SERVER_TOKEN, token.clone()));
        }
        if let Some(project) = &self.config.project {
            env.push((client_env::PROJECT, project.clone()));
        }
        env
    }

    /// Records this node's root-cause report of a worker failure.
    pub(crate) fn worker_failed(&mut self, report: &str, data: serde_json::Value) {
        if let Some(run) = self.run() {
            record(&run, "worker_failed", report, &data);
        }
        self.cause = Some(report.to_owned());
    }

    /// Records that the job hung (the report's text and `hang.json`).
    pub(crate) fn hang(&mut self, report: &str, data: serde_json::Value) {
        if let Some(run) = self.run() {
            record(&run, "hang", report, &data);
        }
        self.cause = Some(report.to_owned());
    }

    /// Records a straggler (once per rank and attempt).
    pub(crate) fn straggler(&self, text: &str, data: &serde_json::Value) {
        if let Some(run) = self.run() {
            record(&run, "straggler", text, data);
        }
    }

    /// Each rank's step time, as a system metric
    /// (`system/step_time_s/rank_N`, at the wall clock's milliseconds like
    /// the other system metrics).
    pub(crate) fn step_times(&self, times: &[crate::straggler::StepTime]) {
        let Some(run) = self.run() else { return };
        if times.is_empty() {
            return;
        }
        let keys: Vec<String> = times
            .iter()
            .map(|t| format!("system/step_time_s/rank_{}", t.global_rank))
            .collect();
        let pairs: Vec<(&str, f64)> = keys
            .iter()
            .zip(times)
            .map(|(k, t)| (k.as_str(), t.seconds))
            .collect();
        let step = i64::try_from(epoch_millis()).unwrap_or(i64::MAX);
        if let Err(e) = run.log(Some(step), &pairs) {
            tracing::debug!(error = %e, "cannot spool step times");
        }
    }

    /// Node 0 records that the workers restart after `why`.
    pub(crate) fn restarting(
        &mut self,
        why: &str,
        restart: u32,
        max_restarts: u32,
        pause: Duration,
    ) {
        if self.cause.is_none() {
            self.cause = Some(why.to_owned());
        }
        if !self.is_leader() {
            return;
        }
        if let Some(run) = self.run() {
            let data = json!({
                "restart": restart,
                "max_restarts": max_restarts,
                "pause_s": pause.as_secs_f64(),
            });
            record(&run, "restart", why, &data);
        }
    }

    /// Records how the job ended and waits (bounded) for the server to take
    /// everything. Returns a notice for the console when it did not.
    pub(crate) async fn end(mut self, kind: EndKind, text: String) -> Option<String> {
        if let Some(sampler) = self.sampler.take() {
            sampler.abort();
        }
        let run = self.run()?;
        if self.is_leader() {
            let (event, text) = match (kind, self.cause.take()) {
                (EndKind::Finished, _) => ("finished", text),
                (EndKind::Failed, Some(cause)) => ("failed", format!("{text}\n{cause}")),
                (EndKind::Failed, None) => ("failed", text),
                (EndKind::Preempted, _) => ("preempted", text),
            };
            record(&run, event, &text, &serde_json::Value::Null);
        }
        let timeout = match kind {
            EndKind::Preempted => self.config.exit_timeout.min(STOPPED_EXIT_TIMEOUT),
            EndKind::Finished | EndKind::Failed => self.config.exit_timeout,
        };
        let waiting = run.clone();
        let finished = tokio::task::spawn_blocking(move || waiting.finish(Some(timeout), None))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
        match finished {
            Ok(()) => None,
            Err(e) => {
                let pending = run.pending();
                run.close();
                Some(format!(
                    "relaunch: warning: the tracking server did not take everything: {e}; {pending} \
                     record(s) are kept in {} and the next `relaunch run --run-id {}` or \
                     `relaunch sync {}` ships them",
                    run.dir().display(),
                    self.run_id,
                    self.config.dir.display()
                ))
            }
        }
    }

    /// Stops logging this attempt: the handle stops shipping and its spool
    /// is left for the next handle (or `relaunch sync`) when not all shipped.
    fn close_attempt(&mut self) {
        let old = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(old) = old {
            if let Err(e) = old.end(None) {
                tracing::debug!(error = %e, "cannot end the previous attempt's handle");
            }
            old.close();
        }
    }

    fn start_sampler(&self) -> JoinHandle<()> {
        let current = self.current.clone();
        let interval = self.config.system_interval;
        let disk = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        tokio::spawn(async move {
            let sampler = tokio::task::spawn_blocking(move || SystemSampler::new(&disk)).await;
            let Ok(mut sampler) = sampler else { return };
            tracing::debug!(gpus = sampler.gpu_status(), "system metrics");
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let values = sampler.sample();
                let run = current.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let Some(run) = run else { continue };
                if values.is_empty() {
                    continue;
                }
                let step = i64::try_from(epoch_millis()).unwrap_or(i64::MAX);
                let pairs: Vec<(&str, f64)> =
                    values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                if let Err(e) = run.log(Some(step), &pairs) {
                    tracing::debug!(error = %e, "cannot spool system metrics");
                }
            }
        })
    }
}

/// How the job ended, as the run records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EndKind {
    Finished,
    /// Workers failed with no restart left.
    Failed,
    /// A signal stopped the job.
    Preempted,
}

fn record(run: &Run, kind: &str, text: &str, data: &serde_json::Value) {
    if let Err(e) = run.event(kind, text, data) {
        tracing::warn!(kind, error = %e, "cannot spool an event for the tracking server");
    }
}

fn epoch_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

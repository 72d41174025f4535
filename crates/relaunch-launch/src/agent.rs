//! The launch loop: host or join the store, start the workers, watch them,
//! forward signals, restart on failure, and say how the job ended.

use std::collections::BTreeSet;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::config::{LaunchConfig, stops_the_job};
use crate::console::{Console, ConsoleSender};
use crate::coordinate::{Coordinator, Remote, RemoteEvent};
use crate::env::AttemptEnv;
use crate::error::LaunchError;
use crate::group::{Exit, WorkerGroup};
use crate::hang::{self, HangReport, HangWatch};
use crate::hang_nodes::{Here, hang_elsewhere, hung, stacks_for_elsewhere};
use crate::job_store::JobStore;
use crate::keys;
use crate::logs::LogLayout;
use crate::report::{self, Failure};
use crate::signals::Signals;
use crate::snapshot::SnapshotDir;
use crate::straggler::StepTimes;
use crate::torch::TorchVersion;
use crate::tracking::{EndKind, Tracker};
use crate::worker::ExitKind;
use crate::zygote::Warm;
use crate::{Outcome, orphans};

/// First pause before a restart; it doubles each time, up to the maximum.
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A stopping signal this soon after the first is the same request.
const SAME_REQUEST: Duration = Duration::from_millis(200);

/// How long, once every process of the attempt is gone, the launcher reads
/// what is still buffered of the workers' output.
const DRAIN_PATIENCE: Duration = Duration::from_secs(5);

/// Seconds between two samples of the ranks' step times sent to the
/// tracking server.
const STEP_TIMES_EVERY: u64 = 5;

/// Beat checks a second (`hang::CHECK_EVERY` apart); the other work of
/// the watch (another node's hang, stragglers, orphans) runs once a second.
const TICKS_A_SECOND: u64 = 4;

/// How one attempt ended.
enum AttemptEnd {
    Succeeded,
    /// A worker failed or hung here, or the other nodes ended the attempt.
    Failed {
        failures: Vec<Failure>,
        remote: Option<RemoteEvent>,
        hang: Option<Box<HangReport>>,
    },
    /// A signal told the job to stop; `failures` are the workers that did
    /// not then exit with code 0.
    Stopped {
        signal: Signal,
        failures: Vec<Failure>,
    },
}

/// Runs a job to its end.
pub async fn launch(config: LaunchConfig) -> Result<Outcome, LaunchError> {
    config.validate()?;
    // Handlers first: a signal during start-up must not kill the launcher
    // and orphan what it started.
    let mut signals = Signals::install(&config.signals)?;
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!(error = %e, "cannot become a subreaper; orphaned worker children go to init");
    }
    // Asked while the store starts; needed when the first worker does.
    let torch = tokio::spawn(crate::torch::find(
        config.entrypoint.python.clone(),
        config.entrypoint.warm.is_some(),
    ));
    let hostname = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".into());
    // The memory tier's directory, once for every attempt; dropped (and
    // removed) on every way out of this function.
    let (snapshots, snapshot_warning) =
        crate::snapshot::open(config.snapshot.as_ref(), &config.run_id)?;
    let layout = LogLayout::create(config.log_dir.as_deref(), &config.run_id)?;
    let console = Console::start();
    let out = console.sender();
    if let Some(warning) = snapshot_warning {
        out.notice(warning);
    }
    warn_about_host(&config, &out);
    let store = JobStore::open(&config).await?;
    let mut coordinator = Coordinator::new(&config, &store, &hostname).await?;
    let mut tracker = match &config.tracking {
        Some(tracking) => {
            out.notice(format!(
                "relaunch: logging run {} to {}",
                config.run_id, tracking.server
            ));
            Some(Tracker::open(tracking.clone(), &config.run_id, &store, &hostname).await?)
        }
        None => None,
    };
    out.notice(format!(
        "relaunch: run {}: {} worker(s) on this node, {} node(s), store {}:{}, logs in {}",
        config.run_id,
        config.nproc_per_node,
        match (config.nnodes.min, config.nnodes.max) {
            (a, b) if a == b => a.to_string(),
            (a, b) => format!("{a} to {b}"),
        },
        store.addr,
        store.port,
        layout.root().display()
    ));

    let torch = torch.await.unwrap_or(None);
    let outcome = run_attempts(
        &config,
        TorchVersion::flight_recorder_size_var(torch),
        &store,
        &mut coordinator,
        &mut signals,
        &layout,
        &out,
        &hostname,
        &mut tracker,
        snapshots.as_ref(),
    )
    .await;
    if let Some(tracker) = tracker {
        let (kind, text) = match &outcome {
            Ok(Outcome::Succeeded) => (EndKind::Finished, "every worker finished".to_owned()),
            Ok(Outcome::Failed { restarts, .. }) => (
                EndKind::Failed,
                format!("workers failed with no restart left ({restarts} allowed)"),
            ),
            Ok(Outcome::Stopped {
                signal,
                clean: true,
            }) => (
                EndKind::Preempted,
                format!("stopped by {signal}; every rank stopped at the agreed step"),
            ),
            // Not a preemption a requeue can resume from: the run says
            // what happened (the `worker_failed` event names the ranks).
            Ok(Outcome::Stopped {
                signal,
                clean: false,
            }) => (
                EndKind::Failed,
                format!("stopped by {signal}; not every rank stopped cleanly at an agreed step"),
            ),
            Err(e) => (EndKind::Failed, format!("the launcher failed: {e}")),
        };
        if let Some(notice) = tracker.end(kind, text).await {
            out.notice(notice);
        }
    }
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            console.close();
            store.close().await;
            return Err(e);
        }
    };
    match &outcome {
        Outcome::Succeeded => out.notice(format!(
            "relaunch: all {} worker(s) finished",
            config.nproc_per_node
        )),
        Outcome::Stopped {
            signal,
            clean: true,
        } => out.notice(format!(
            "relaunch: stopped by {signal}; every rank stopped at the agreed step (preempted, exit \
             code {})",
            outcome.exit_code()
        )),
        Outcome::Stopped {
            signal,
            clean: false,
        } => out.notice(format!(
            "relaunch: stopped by {signal}; not every rank stopped cleanly at an agreed step (exit \
             code {})",
            outcome.exit_code()
        )),
        Outcome::Failed { .. } => out.notice(format!(
            "relaunch: giving up after {} restart(s); logs are in {}",
            config.max_restarts,
            layout.root().display()
        )),
    }
    if matches!(outcome, Outcome::Succeeded) && layout.is_temporary() && layout.reported() {
        out.notice(format!(
            "relaunch: the reports of earlier attempts name files in {}: kept (remove it when \
             done)",
            layout.root().display()
        ));
    }
    drop(coordinator);
    console.close();
    store.close().await;
    match &outcome {
        Outcome::Succeeded => {
            // After the console, whose files are in it.
            layout.finish();
        }
        Outcome::Stopped { clean: true, .. } => layout.mark_preempted(),
        _ => {}
    }
    Ok(outcome)
}

/// The free preflight checks: one line per problem found, before anything
/// starts (`relaunch doctor` runs them all, and says more).
fn warn_about_host(config: &LaunchConfig, out: &ConsoleSender) {
    for f in crate::doctor::quick(&crate::doctor::Host::probe(), config.spans_hosts()) {
        if f.level >= crate::doctor::Level::Warn {
            let fix = f.fix.map_or(String::new(), |fix| format!("; {fix}"));
            out.notice(format!(
                "relaunch: warning: {}: {}{fix} (see `relaunch doctor`)",
                f.check, f.found
            ));
        }
    }
}

/// Attempts until one ends the job.
#[allow(clippy::too_many_arguments)]
async fn run_attempts(
    config: &LaunchConfig,
    flight_recorder_size_var: &'static str,
    store: &JobStore,
    coordinator: &mut Coordinator,
    signals: &mut Signals,
    layout: &LogLayout,
    out: &ConsoleSender,
    hostname: &str,
    tracker: &mut Option<Tracker>,
    snapshots: Option<&SnapshotDir>,
) -> Result<Outcome, LaunchError> {
    let failed = || Outcome::Failed {
        restarts: config.max_restarts,
        log_dir: layout.root().to_path_buf(),
    };
    // Attempts started on this node; restarts after failures as this node
    // counts them (an elastic job counts them in the store instead).
    let mut number: u32 = 0;
    let mut restarts: u32 = 0;
    // The warm interpreter restarted workers fork from; started with the
    // first attempt, replaced when it fails.
    let mut warm = Warm::default();
    loop {
        let attempt = tokio::select! {
            begun = coordinator.begin(config, store, number, restarts) => begun?,
            signal = signals.recv() => return Ok(Outcome::Stopped { signal, clean: true }),
        };
        if attempt.restarts > config.max_restarts {
            out.notice("relaunch: no restart left".to_string());
            return Ok(failed());
        }
        let place = attempt.placement;
        if place.nodes > 1 || number > 0 {
            out.notice(format!(
                "relaunch: attempt {number}: node {} of {}, ranks {}..{} of {}",
                place.node_rank,
                place.nodes,
                place.first_rank,
                place.first_rank + config.nproc_per_node - 1,
                place.world_size
            ));
        }
        let attempt_id = attempt.id(number);
        if let Some(tracker) = tracker.as_mut() {
            tracker.begin_attempt(
                attempt_id,
                place,
                attempt.restarts,
                config.nproc_per_node,
                out,
            );
        }
        let attempt_env = AttemptEnv {
            role: config.role.clone(),
            master_addr: store.addr.clone(),
            master_port: store.port,
            attempt: attempt_id,
            restart_count: attempt.restarts,
            max_restarts: config.max_restarts,
            run_id: config.run_id.clone(),
            signals: signal_names(&config.signals),
            extra: tracker
                .as_ref()
                .map(|t| t.worker_env(attempt_id))
                .unwrap_or_default(),
            virtual_local_rank: config.virtual_local_rank,
            flight_recorder_size_var,
            snapshot: snapshots.map(|dir| (dir.path().to_path_buf(), dir.budget())),
        };
        let tap = |rank| tracker.as_ref().and_then(|t| t.tap(rank));
        let (mut ready, imported) = warm.take_ready(out);
        let asked = ready.is_some();
        let mut group = WorkerGroup::start(
            config,
            &attempt_env,
            place,
            layout,
            number,
            out,
            hostname,
            &tap,
            &mut ready,
        )?;
        if group.warm() > 0 {
            out.notice(format!(
                "relaunch: {} worker(s) started warm, forked from an interpreter that had \
                 imported {}",
                group.warm(),
                if imported.is_empty() {
                    "nothing".to_owned()
                } else {
                    imported.join(", ")
                },
            ));
        }
        // None back from a zygote it was given: a fork failed, and the
        // group said so.
        warm.give_back(ready, asked, out);
        warm.refill(config, group.common_env(), layout.root(), out);
        if let Some(pid) = warm.pid() {
            group.spare(pid);
        }
        // This node's heartbeats (elastic) go on until the attempt is over
        // here, the grace period and the exit barrier included.
        let _keep_alive;
        let end = {
            let (remote, keep_alive) = coordinator.remote(config, store, &attempt, number).await?;
            _keep_alive = keep_alive;
            let here = Here {
                node_rank: place.node_rank,
                nodes: place.nodes,
                hostname,
                attempt: number,
                attempt_id,
            };
            supervise(
                config,
                store,
                &mut group,
                signals,
                remote,
                out,
                here,
                tracker.as_ref(),
            )
            .await
        };
        // What is left of the workers' process groups (their DataLoader
        // workers, their shells' jobs) ends with them; processes in other
        // sessions (daemons, logging services) get the stop signal and the
        // grace period first. Then nothing of the attempt is running, and
        // its output is complete.
        group.kill_all();
        let second_signal = async { while !stops_the_job(signals.recv().await) {} };
        orphans::stop_leftovers(
            &group.ours(),
            Signal::SIGTERM,
            config.shutdown_timeout,
            second_signal,
        )
        .await;
        group.drain(DRAIN_PATIENCE).await;
        let this = number;
        number += 1;
        let (failures, remote) = match end {
            AttemptEnd::Succeeded => {
                // Asked before the exit barrier: past it, the node that
                // hosts the store may exit, and with it the store, so a
                // node whose ranks stopped for another node's preemption
                // would read nothing and call the job finished.
                let preempted = preempted_elsewhere(store, &config.run_id).await;
                // The workers stopped early because another node was asked
                // to stop (or a rank got the signal itself): this node was
                // preempted too, cleanly if its ranks stopped at the step.
                let outcome = match preempted {
                    Some(signal) => {
                        let stops = StopReports::read(store, &config.run_id, place, config).await;
                        out.notice(stops.describe(signal));
                        Outcome::Stopped {
                            signal,
                            clean: stops.all_stopped(),
                        }
                    }
                    None => Outcome::Succeeded,
                };
                coordinator.finish(config, store, &attempt, this).await;
                return Ok(outcome);
            }
            AttemptEnd::Stopped { signal, failures } => {
                let mut clean = failures.is_empty();
                if clean {
                    let stops = StopReports::read(store, &config.run_id, place, config).await;
                    out.notice(stops.describe(signal));
                    clean = stops.all_stopped();
                } else {
                    let text = unclean_stop(signal, &failures, config.shutdown_timeout);
                    out.notice(text.clone());
                    if let Some(tracker) = tracker.as_mut() {
                        tracker.worker_failed(
                            &text,
                            stop_failure_data(&failures, place.node_rank, hostname),
                        );
                    }
                }
                coordinator.finish(config, store, &attempt, this).await;
                return Ok(Outcome::Stopped { signal, clean });
            }
            AttemptEnd::Failed {
                failures,
                remote,
                hang,
            } => (failures, remote.ok_or(hang)),
        };
        let why = match remote {
            Ok(event) => {
                out.notice(format!("relaunch: {}", event.what));
                if !event.failure {
                    // Members changed: restart at once, not counted.
                    if let Some(tracker) = tracker.as_mut() {
                        tracker.restarting(
                            &event.what,
                            attempt.restarts,
                            config.max_restarts,
                            Duration::ZERO,
                        );
                    }
                    continue;
                }
                event.what
            }
            Err(Some(hang)) => {
                layout.mark_reported();
                let text = hang.render(this);
                out.notice(text.clone());
                if let Some(tracker) = tracker.as_mut() {
                    tracker.hang(&text, hang.to_json(this));
                }
                let what = format!(
                    "node {} ({hostname}) found the job hung in attempt {this}",
                    place.node_rank
                );
                coordinator
                    .report_failure(config, store, &attempt, this, what)
                    .await;
                hang.headline(this)
            }
            Err(None) => {
                layout.mark_reported();
                let text =
                    report::render(&failures, hostname, attempt.restarts, config.max_restarts);
                out.notice(text.clone());
                if let Some(tracker) = tracker.as_mut() {
                    tracker
                        .worker_failed(&text, failure_data(&failures, place.node_rank, hostname));
                }
                let what = format!(
                    "node {} ({hostname}) had a worker fail in attempt {this}",
                    place.node_rank
                );
                coordinator
                    .report_failure(config, store, &attempt, this, what.clone())
                    .await;
                match report::root_cause(&failures) {
                    Some(root) => format!(
                        "rank {} on node {} ({hostname}) failed in attempt {attempt_id}: {}",
                        root.global_rank,
                        place.node_rank,
                        root.exit.describe()
                    ),
                    None => what,
                }
            }
        };
        if !coordinator.counts_restarts_globally() {
            restarts += 1;
        }
        if attempt.restarts >= config.max_restarts {
            return Ok(failed());
        }
        let pause = backoff(attempt.restarts);
        if let Some(tracker) = tracker.as_mut() {
            tracker.restarting(&why, attempt.restarts + 1, config.max_restarts, pause);
        }
        out.notice(format!(
            "relaunch: restarting all workers in {:.0?} (restart {} of {})",
            pause,
            attempt.restarts + 1,
            config.max_restarts
        ));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            signal = signals.recv() => {
                if stops_the_job(signal) {
                    return Ok(Outcome::Stopped { signal, clean: false });
                }
            }
        }
    }
}

/// Watches one attempt until it ends.
#[allow(clippy::too_many_arguments)]
async fn supervise(
    config: &LaunchConfig,
    store: &JobStore,
    group: &mut WorkerGroup,
    signals: &mut Signals,
    mut remote: Remote<'_>,
    out: &ConsoleSender,
    here: Here<'_>,
    tracker: Option<&Tracker>,
) -> AttemptEnd {
    // The first handled signal: once one came, workers that exit are
    // stopping for it, not failing.
    let mut asked: Option<Signal> = None;
    // Where this node says that the attempt failed (see keys::failed).
    let failed_key = keys::failed(&config.run_id, here.attempt_id);
    let watch = HangWatch {
        timeout: config.hang_timeout,
        startup: config.startup_timeout,
        started: std::time::SystemTime::now(),
    };
    // Whether this node took its stacks for a hang another node found.
    let mut stacks_taken = false;
    let mut step_times = StepTimes::default();
    let mut ticks: u64 = 0;
    let mut beats = tokio::time::interval(hang::CHECK_EVERY);
    beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // Exits first: workers that all finished are done, whatever the
            // other nodes say at the same moment.
            biased;
            exit = group.next_exit() => match (exit, asked) {
                (None, None) => return AttemptEnd::Succeeded,
                (None, Some(signal)) => return AttemptEnd::Stopped { signal, failures: stop_failures(group) },
                (Some(exit), _) if exit.kind.success() => {}
                (Some(exit), Some(signal)) => {
                    tracing::debug!(local_rank = exit.local_rank, how = %exit.kind.describe(), "worker ended while stopping");
                    worker_failed(store, &failed_key, group, exit).await;
                    stop_after_signal(config, group, signals).await;
                    return AttemptEnd::Stopped { signal, failures: stop_failures(group) };
                }
                (Some(exit), None) => {
                    let running = running_ranks(group);
                    tracing::debug!(local_rank = exit.local_rank, how = %exit.kind.describe(), "worker failed; stopping the others");
                    worker_failed(store, &failed_key, group, exit).await;
                    group.stop(Signal::SIGTERM, config.shutdown_timeout).await;
                    return AttemptEnd::Failed {
                        // Those still running got SIGTERM (then SIGKILL);
                        // ending by one of those is the launcher's doing.
                        failures: group.failures(|r, how| running.contains(&r) && stopped_by_us(how)),
                        remote: None,
                        hang: None,
                    };
                }
            },
            event = &mut remote, if asked.is_none() => {
                // A node that failed sets the key itself; a lost one
                // cannot. Set before SIGTERM, so that ranks blocked in
                // relaunch's agreement with the lost node's ranks give up,
                // and their SIGTERM ends them at once instead of asking for
                // a stop that rank can never agree on (before: they waited
                // out the grace period, then SIGKILL). Not while the job is
                // stopping for a preemption: its ranks may still be writing
                // the agreed stop step when a node that finished leaves.
                // The price: a node taken for lost that is only slow
                // (heartbeats late past keep_alive_timeout) loses what was
                // not yet saved, where its ranks could have agreed on a
                // stop step.
                if event.failure && preempted_elsewhere(store, &config.run_id).await.is_none() {
                    store
                        .announce(&failed_key, &event.what, "the other node's failure")
                        .await;
                }
                group.stop(Signal::SIGTERM, config.shutdown_timeout).await;
                return AttemptEnd::Failed { failures: Vec::new(), remote: Some(event), hang: None };
            }
            _ = beats.tick(), if asked.is_none() => {
                let ranks = group.beats();
                // Once another node's hang is known here, the failure that
                // follows ends the attempt.
                if !stacks_taken && let Some(stall) = watch.check(&ranks, std::time::SystemTime::now()) {
                    let report = hung(config, store, group, out, &here, stall, ranks).await;
                    return AttemptEnd::Failed { failures: Vec::new(), remote: None, hang: Some(Box::new(report)) };
                }
                ticks += 1;
                // The rest once a second: the store, /proc and the stats.
                if !ticks.is_multiple_of(TICKS_A_SECOND) {
                    continue;
                }
                if !stacks_taken && here.nodes > 1 && let Some(there) = hang_elsewhere(store, &config.run_id, here.attempt_id).await {
                    stacks_taken = true;
                    stacks_for_elsewhere(config, store, group, out, &here, there).await;
                }
                let (times, stragglers) = step_times.observe(&ranks, std::time::SystemTime::now());
                for straggler in stragglers {
                    let text = straggler.text();
                    out.notice(format!("relaunch: {text}"));
                    if let Some(tracker) = tracker {
                        tracker.straggler(&text, &straggler.to_json());
                    }
                }
                let reaped = orphans::reap_exited(&group.ours());
                if reaped > 0 {
                    tracing::debug!(reaped, "reaped exited orphans of the workers");
                }
                if ticks.is_multiple_of(STEP_TIMES_EVERY * TICKS_A_SECOND) && let Some(tracker) = tracker {
                    tracker.step_times(&times);
                }
            }
            signal = signals.recv() => {
                if asked.is_none() {
                    asked = Some(signal);
                    announce_preemption(store, &config.run_id, signal).await;
                }
                group.signal_all(signal);
                if stops_the_job(signal) {
                    out.notice(format!(
                        "relaunch: {signal}: passed to every worker; SIGKILL in {:.0?} for those still running \
                         (send it again to kill them now)",
                        config.shutdown_timeout
                    ));
                    stop_after_signal(config, group, signals).await;
                    return AttemptEnd::Stopped { signal, failures: stop_failures(group) };
                }
                out.notice(format!("relaunch: {signal}: passed to every worker"));
            }
        }
    }
}

/// The root cause of a failure as event data: who failed, and how.
fn failure_data(failures: &[Failure], node_rank: usize, hostname: &str) -> serde_json::Value {
    match report::root_cause(failures) {
        Some(root) => serde_json::json!({
            "rank": root.global_rank,
            "local_rank": root.local_rank,
            "node_rank": node_rank,
            "host": hostname,
            "pid": root.pid,
            "exit": root.exit.describe(),
            "error": root.error.as_ref().map(|e| e.message.clone()),
            "stderr_log": root.stderr_log.display().to_string(),
        }),
        None => serde_json::json!({ "node_rank": node_rank, "host": hostname }),
    }
}

fn stopped_by_us(how: ExitKind) -> bool {
    matches!(how, ExitKind::Signal(s) if s == Signal::SIGTERM as i32 || s == Signal::SIGKILL as i32)
}

/// What this node's ranks reported of their stop (`relaunch.preemption`
/// writes [`keys::stopped`]): where each stopped, and its checkpoint.
struct StopReports {
    /// Global rank, then its report if it wrote one.
    ranks: Vec<(usize, Option<RankStop>)>,
}

#[derive(serde::Deserialize)]
struct RankStop {
    step: u64,
    /// Where its checkpoint of that step is; absent until one is written
    /// (empty when the caller did not say where).
    checkpoint: Option<String>,
}

impl StopReports {
    async fn read(
        store: &JobStore,
        run_id: &str,
        place: crate::config::Placement,
        config: &LaunchConfig,
    ) -> Self {
        let mut ranks = Vec::with_capacity(config.nproc_per_node);
        for rank in place.first_rank..place.first_rank + config.nproc_per_node {
            let report = store
                .read_if_set(
                    &keys::stopped(run_id, rank),
                    Duration::from_secs(2),
                    "a rank's stop",
                )
                .await
                .and_then(|value| match serde_json::from_slice::<RankStop>(&value) {
                    Ok(stop) => Some(stop),
                    Err(e) => {
                        tracing::warn!(rank, error = %e, "a rank's stop report is not what relaunch.preemption writes");
                        None
                    }
                });
            ranks.push((rank, report));
        }
        Self { ranks }
    }

    /// Every rank of this node stopped at the agreed step.
    fn all_stopped(&self) -> bool {
        self.ranks.iter().all(|(_, stop)| stop.is_some())
    }

    /// One line: where the ranks stopped and what they saved, or which did
    /// not stop at an agreed step.
    fn describe(&self, signal: Signal) -> String {
        let missing: Vec<usize> = self
            .ranks
            .iter()
            .filter(|(_, stop)| stop.is_none())
            .map(|(rank, _)| *rank)
            .collect();
        if !missing.is_empty() {
            return format!(
                "relaunch: {signal}: every worker exited 0, but rank(s) {} did not stop at an \
                 agreed step: their work since their last checkpoint may be lost. Use \
                 relaunch.preemption (or a relaunch integration: Lightning, transformers, \
                 accelerate) so that every rank stops at one step with its checkpoint",
                crate::stacks::ranks_text(&missing)
            );
        }
        let mut steps: Vec<u64> = self
            .ranks
            .iter()
            .filter_map(|(_, stop)| stop.as_ref().map(|s| s.step))
            .collect();
        steps.sort_unstable();
        steps.dedup();
        let at = match steps.as_slice() {
            [step] => format!("at step {step}"),
            _ => format!(
                "at steps {}",
                steps
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let unsaved: Vec<usize> = self
            .ranks
            .iter()
            .filter(|(_, stop)| stop.as_ref().is_some_and(|s| s.checkpoint.is_none()))
            .map(|(rank, _)| *rank)
            .collect();
        let mut places: Vec<&str> = self
            .ranks
            .iter()
            .filter_map(|(_, stop)| stop.as_ref().and_then(|s| s.checkpoint.as_deref()))
            .filter(|p| !p.is_empty())
            .collect();
        places.sort_unstable();
        places.dedup();
        let saved = if !unsaved.is_empty() {
            format!(
                "; rank(s) {} did not report a checkpoint of that step (relaunch.preemption.saved)",
                crate::stacks::ranks_text(&unsaved)
            )
        } else if places.is_empty() {
            ", each with its checkpoint".to_owned()
        } else {
            format!(", each with its checkpoint ({})", places.join(", "))
        };
        format!("relaunch: {signal}: every rank on this node stopped {at}{saved}")
    }
}

/// The signal another node (or a worker) announced, if the job was asked to
/// stop.
async fn preempted_elsewhere(store: &JobStore, run_id: &str) -> Option<Signal> {
    let value = store
        .read_if_set(
            &keys::preempt(run_id),
            Duration::from_secs(5),
            "a preemption",
        )
        .await?;
    Some(crate::config::parse_signal(&String::from_utf8_lossy(&value)).unwrap_or(Signal::SIGTERM))
}

/// Tells every rank, on every node, that the job is asked to stop, through
/// the key that `relaunch.preemption` waits on. Bounded: a store that does
/// not answer must not delay forwarding the signal.
async fn announce_preemption(store: &JobStore, run_id: &str, signal: Signal) {
    store
        .announce(&keys::preempt(run_id), signal.as_str(), "the preemption")
        .await;
}

/// A worker failed: what is left of its process group dies at once (its
/// DataLoader workers hold its sockets, and its peers would wait on them),
/// and the job's store says who failed, so ranks blocked in relaunch's own
/// agreement give up now. Bounded: a store that does not answer must not
/// delay stopping the others.
async fn worker_failed(store: &JobStore, failed_key: &str, group: &WorkerGroup, exit: Exit) {
    group.kill_group_of(exit.local_rank);
    let text = format!(
        "{} exited with {}",
        group.describe(exit.local_rank),
        exit.kind.describe()
    );
    store
        .announce(failed_key, &text, "a worker's failure")
        .await;
}

/// The workers that did not exit with code 0 after a stop request.
fn stop_failures(group: &WorkerGroup) -> Vec<Failure> {
    group.failures(|_, how| how == ExitKind::Signal(Signal::SIGKILL as i32))
}

/// What the console and the run say when a stop was not clean.
fn unclean_stop(signal: Signal, failures: &[Failure], grace: Duration) -> String {
    let mut text = format!("relaunch: stopped by {signal}, but not every worker exited cleanly:");
    for f in failures {
        let how = if f.stopped_by_launcher {
            format!("killed after the {grace:.0?} grace period")
        } else {
            f.exit.describe()
        };
        text.push_str(&format!(
            "\n  rank {} (local rank {}, pid {}): {how}",
            f.global_rank, f.local_rank, f.pid
        ));
        if let Some(error) = &f.error {
            text.push_str(&format!(": {}", error.message));
        }
    }
    text
}

/// The workers of an unclean stop as event data.
fn stop_failure_data(failures: &[Failure], node_rank: usize, hostname: &str) -> serde_json::Value {
    let ranks: Vec<_> = failures
        .iter()
        .map(|f| {
            serde_json::json!({
                "rank": f.global_rank,
                "local_rank": f.local_rank,
                "pid": f.pid,
                "exit": f.exit.describe(),
                "killed_after_grace": f.stopped_by_launcher,
                "error": f.error.as_ref().map(|e| e.message.clone()),
                "stderr_log": f.stderr_log.display().to_string(),
            })
        })
        .collect();
    serde_json::json!({ "node_rank": node_rank, "host": hostname, "stop": true, "ranks": ranks })
}

/// After a stopping signal was forwarded: waits for the workers up to the
/// shutdown timeout (a second stopping signal cuts it short), then kills
/// the rest.
async fn stop_after_signal(config: &LaunchConfig, group: &mut WorkerGroup, signals: &mut Signals) {
    let asked = tokio::time::Instant::now();
    let deadline = asked + config.shutdown_timeout;
    loop {
        tokio::select! {
            exit = group.next_exit() => if exit.is_none() { break },
            () = tokio::time::sleep_until(deadline) => {
                tracing::info!(grace = ?config.shutdown_timeout, "the shutdown grace period is over");
                break;
            }
            signal = signals.recv() => {
                if stops_the_job(signal) {
                    // One request delivered twice at once (a scheduler that
                    // signals the launcher and every process of the step,
                    // the launcher included) is not a second request.
                    if asked.elapsed() < SAME_REQUEST {
                        tracing::debug!(%signal, "the stop request again, at once; ignored");
                        continue;
                    }
                    tracing::info!(%signal, "a second stop request: killing the workers now");
                    break;
                }
                group.signal_all(signal);
            }
        }
    }
    // Kills what is left (nothing, when all exited) and their process groups.
    group.stop(Signal::SIGKILL, Duration::ZERO).await;
}

fn running_ranks(group: &WorkerGroup) -> BTreeSet<usize> {
    group.running_ranks().collect()
}

fn backoff(restarts: u32) -> Duration {
    BACKOFF_START
        .saturating_mul(1u32.checked_shl(restarts).unwrap_or(u32::MAX))
        .min(BACKOFF_MAX)
}

fn signal_names(signals: &[Signal]) -> String {
    signals
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_cap() {
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(8));
        assert_eq!(backoff(10), BACKOFF_MAX);
        assert_eq!(backoff(40), BACKOFF_MAX);
    }
}

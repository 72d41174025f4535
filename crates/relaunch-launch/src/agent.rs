//! The launch loop: host or join the store, start the workers, watch them,
//! forward signals, restart on failure, and say how the job ended.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::config::{LaunchConfig, RendezvousConfig, stops_the_job};
use crate::console::{Console, ConsoleSender};
use crate::env::AttemptEnv;
use crate::error::LaunchError;
use crate::group::{Placement, WorkerGroup};
use crate::job_store::JobStore;
use crate::keys;
use crate::logs::LogLayout;
use crate::report::{self, Failure};
use crate::signals::Signals;
use crate::worker::ExitKind;
use crate::{Outcome, orphans};

/// First pause before a restart; it doubles each time, up to the maximum.
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// How one attempt ended.
enum AttemptEnd {
    Succeeded,
    /// A worker failed here or, in a multi-node job, on another node.
    Failed {
        failures: Vec<Failure>,
        remote: Option<String>,
    },
    /// A signal told the job to stop.
    Stopped {
        signal: Signal,
        clean: bool,
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
    let hostname = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".into());
    let layout = LogLayout::create(config.log_dir.as_deref(), &config.run_id)?;
    let console = Console::start();
    let out = console.sender();
    let store = JobStore::open(&config).await?;
    let (nodes, node_rank) = match &config.rendezvous {
        RendezvousConfig::Static { .. } => (config.nnodes.max, config.node_rank),
        RendezvousConfig::Dynamic { .. } => {
            return Err(LaunchError::Config(
                "dynamic rendezvous (--rdzv-backend c10d with --rdzv-endpoint) is not available yet; \
                 use --nnodes N with --node-rank, --master-addr and --master-port"
                    .into(),
            ));
        }
    };
    let placement = Placement {
        node_rank,
        nodes,
        first_rank: node_rank * config.nproc_per_node,
        world_size: config.world_size(nodes),
    };
    out.notice(format!(
        "relaunch: run {}: {} worker(s) on this node (node {} of {}), world size {}, store {}:{}, logs in {}",
        config.run_id,
        config.nproc_per_node,
        node_rank,
        nodes,
        placement.world_size,
        store.addr,
        store.port,
        layout.root().display()
    ));

    let mut attempt: u32 = 0;
    let outcome = loop {
        let prepared = tokio::select! {
            r = prepare_attempt(&store, &config.run_id, attempt, nodes) => r,
            sig = signals.recv() => break Outcome::Stopped { signal: sig, clean: true },
        };
        prepared?;
        let attempt_env = AttemptEnv {
            role: config.role.clone(),
            master_addr: store.addr.clone(),
            master_port: store.port,
            restart_count: attempt,
            max_restarts: config.max_restarts,
            run_id: config.run_id.clone(),
            signals: signal_names(&config.signals),
        };
        let mut group =
            WorkerGroup::start(&config, &attempt_env, placement, &layout, &out, &hostname)?;
        let remote = remote_failure(&store, &config.run_id, attempt, nodes).await?;
        let end = supervise(&config, &store, &mut group, &mut signals, remote, &out).await;
        group.drain().await;
        orphans::kill_and_reap(&group.pids());
        match end {
            AttemptEnd::Succeeded => match preempted_elsewhere(&store, &config.run_id).await {
                // The workers stopped early because another node was asked
                // to stop: this node was preempted too.
                Some(signal) => {
                    break Outcome::Stopped {
                        signal,
                        clean: true,
                    };
                }
                None => break Outcome::Succeeded,
            },
            AttemptEnd::Stopped { signal, clean } => break Outcome::Stopped { signal, clean },
            AttemptEnd::Failed { failures, remote } => {
                if let Some(remote) = &remote {
                    out.notice(format!("relaunch: {remote}"));
                } else {
                    if nodes > 1 {
                        let failed = keys::attempt_failed(&config.run_id, attempt);
                        let what = format!(
                            "node {node_rank} ({hostname}) had a worker fail in attempt {attempt}"
                        );
                        if let Err(e) = store.client.set(&failed, what).await {
                            tracing::warn!(error = %e, "cannot tell the other nodes about the failure");
                        }
                    }
                    out.notice(report::render(
                        &failures,
                        &hostname,
                        attempt,
                        config.max_restarts,
                    ));
                }
                if attempt >= config.max_restarts {
                    break Outcome::Failed {
                        restarts: attempt,
                        log_dir: layout.root().to_path_buf(),
                    };
                }
                let pause = backoff(attempt);
                out.notice(format!(
                    "relaunch: restarting all workers in {:.0?} (restart {} of {})",
                    pause,
                    attempt + 1,
                    config.max_restarts
                ));
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    sig = signals.recv() => {
                        if stops_the_job(sig) {
                            break Outcome::Stopped { signal: sig, clean: false };
                        }
                    }
                }
                attempt += 1;
            }
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
            "relaunch: stopped by {signal}; every worker exited cleanly (preempted, exit code {})",
            outcome.exit_code()
        )),
        Outcome::Stopped {
            signal,
            clean: false,
        } => out.notice(format!(
            "relaunch: stopped by {signal}; not every worker exited cleanly (exit code {})",
            outcome.exit_code()
        )),
        Outcome::Failed { .. } => out.notice(format!(
            "relaunch: giving up after {} restart(s); logs are in {}",
            config.max_restarts,
            layout.root().display()
        )),
    }
    console.close();
    store.close().await;
    if matches!(outcome, Outcome::Succeeded) {
        layout.cleanup();
    }
    Ok(outcome)
}

/// Readies the store for `attempt`: on one node, deletes the previous
/// attempt's worker keys; on several, waits until every node has stopped its
/// previous workers, lets the host delete the keys, and starts all together.
async fn prepare_attempt(
    store: &JobStore,
    run_id: &str,
    attempt: u32,
    nodes: usize,
) -> Result<(), LaunchError> {
    if nodes == 1 {
        if attempt > 0 {
            store.clear_worker_keys();
        }
        return Ok(());
    }
    let timeout = crate::job_store::JOIN_TIMEOUT;
    let failed = |what: &str, e: relaunch_store::StoreError| {
        LaunchError::Rendezvous(format!(
            "not every node {what} attempt {attempt} within {timeout:?}: {e}"
        ))
    };
    store
        .client
        .barrier(keys::attempt_ready(run_id, attempt), nodes as i64, timeout)
        .await
        .map_err(|e| failed("reached", e))?;
    let go = keys::attempt_go(run_id, attempt);
    if store.is_host() {
        store.clear_worker_keys();
        store.client.set(&go, "").await?;
    }
    store
        .client
        .wait(&[go], timeout)
        .await
        .map_err(|e| failed("started", e))
}

/// Watches one attempt until it ends.
async fn supervise(
    config: &LaunchConfig,
    store: &JobStore,
    group: &mut WorkerGroup,
    signals: &mut Signals,
    remote_failure: impl Future<Output = String>,
    out: &ConsoleSender,
) -> AttemptEnd {
    let mut remote_failure = std::pin::pin!(remote_failure);
    // The first handled signal: once one came, workers that exit are
    // stopping for it, not failing.
    let mut asked: Option<Signal> = None;
    loop {
        tokio::select! {
            exit = group.next_exit() => match (exit, asked) {
                (None, None) => return AttemptEnd::Succeeded,
                (None, Some(signal)) => return AttemptEnd::Stopped { signal, clean: group.all_succeeded() },
                (Some(exit), _) if exit.kind.success() => {}
                (Some(exit), Some(signal)) => {
                    tracing::debug!(local_rank = exit.local_rank, how = %exit.kind.describe(), "worker ended while stopping");
                    let clean = stop_after_signal(config, group, signals).await;
                    return AttemptEnd::Stopped { signal, clean };
                }
                (Some(exit), None) => {
                    let running = running_ranks(group);
                    tracing::debug!(local_rank = exit.local_rank, how = %exit.kind.describe(), "worker failed; stopping the others");
                    group.stop(Signal::SIGTERM, config.shutdown_timeout).await;
                    return AttemptEnd::Failed {
                        // Those still running got SIGTERM (then SIGKILL);
                        // ending by one of those is the launcher's doing.
                        failures: group.failures(|r, how| {
                            running.contains(&r)
                                && matches!(how, ExitKind::Signal(s) if s == Signal::SIGTERM as i32 || s == Signal::SIGKILL as i32)
                        }),
                        remote: None,
                    };
                }
            },
            what = &mut remote_failure, if asked.is_none() => {
                group.stop(Signal::SIGTERM, config.shutdown_timeout).await;
                return AttemptEnd::Failed { failures: Vec::new(), remote: Some(what) };
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
                    let clean = stop_after_signal(config, group, signals).await;
                    return AttemptEnd::Stopped { signal, clean };
                }
                out.notice(format!("relaunch: {signal}: passed to every worker"));
            }
        }
    }
}

/// The signal another node (or a worker) announced, if the job was asked to
/// stop.
async fn preempted_elsewhere(store: &JobStore, run_id: &str) -> Option<Signal> {
    let key = keys::preempt(run_id);
    let check = async {
        if store.client.check(&[&key]).await? {
            store.client.get_now(&key).await.map(Some)
        } else {
            Ok(None)
        }
    };
    match tokio::time::timeout(Duration::from_secs(5), check).await {
        Ok(Ok(Some(value))) => Some(
            crate::config::parse_signal(&String::from_utf8_lossy(&value))
                .unwrap_or(Signal::SIGTERM),
        ),
        Ok(Ok(None)) => None,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "cannot check for a preemption");
            None
        }
        Err(_) => None,
    }
}

/// Tells every rank, on every node, that the job is asked to stop, through
/// the key that `relaunch.preemption` waits on. Bounded: a store that does
/// not answer must not delay forwarding the signal.
async fn announce_preemption(store: &JobStore, run_id: &str, signal: Signal) {
    let key = keys::preempt(run_id);
    let set = store.client.compare_set(&key, "", signal.as_str());
    match tokio::time::timeout(Duration::from_secs(2), set).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot announce the preemption in the store"),
        Err(_) => {
            tracing::warn!("the store did not answer in 2 s; preemption announced by signal only")
        }
    }
}

/// After a stopping signal was forwarded: waits for the workers up to the
/// shutdown timeout (a second stopping signal cuts it short), then kills
/// the rest. Returns whether every worker exited with code 0.
async fn stop_after_signal(
    config: &LaunchConfig,
    group: &mut WorkerGroup,
    signals: &mut Signals,
) -> bool {
    let deadline = tokio::time::Instant::now() + config.shutdown_timeout;
    loop {
        tokio::select! {
            exit = group.next_exit() => if exit.is_none() { break },
            () = tokio::time::sleep_until(deadline) => break,
            signal = signals.recv() => {
                if stops_the_job(signal) {
                    break;
                }
                group.signal_all(signal);
            }
        }
    }
    // Kills what is left (nothing, when all exited) and their process groups.
    group.stop(Signal::SIGKILL, Duration::ZERO).await;
    group.all_succeeded()
}

/// Completes when another node reports a failure in `attempt`; never for a
/// single node.
async fn remote_failure(
    store: &JobStore,
    run_id: &str,
    attempt: u32,
    nodes: usize,
) -> Result<impl Future<Output = String> + use<>, LaunchError> {
    // Its own connection: a pending WAIT occupies one.
    let watcher = if nodes > 1 {
        Some(
            relaunch_store::StoreClient::connect(
                store.addr.clone(),
                store.port,
                store.client.options().clone(),
            )
            .await?,
        )
    } else {
        None
    };
    let key = keys::attempt_failed(run_id, attempt);
    Ok(async move {
        let Some(watcher) = watcher else {
            return std::future::pending().await;
        };
        loop {
            match watcher.get(&key).await {
                Ok(what) => return String::from_utf8_lossy(&what).into_owned(),
                // The job runs longer than the store timeout: wait again.
                Err(e) if e.kind() == relaunch_store::ErrorKind::Timeout => {}
                Err(e) => {
                    tracing::warn!(error = %e, "lost the store while watching the other nodes");
                    return std::future::pending().await;
                }
            }
        }
    })
}

fn running_ranks(group: &WorkerGroup) -> BTreeSet<usize> {
    group.running_ranks().collect()
}

fn backoff(attempt: u32) -> Duration {
    BACKOFF_START
        .saturating_mul(1u32.checked_shl(attempt).unwrap_or(u32::MAX))
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

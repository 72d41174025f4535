//! The hang protocol across nodes. `hang.rs` finds a stall on this node
//! and builds its report; this file makes every node take its ranks'
//! stacks while they are all still stuck, and gathers them into the report
//! of the node that found the hang.
//!
//! The node that finds the hang sets `workers/hang/ATTEMPT` (COMPARE_SET:
//! two finders at once agree who was first), takes its stacks, and waits
//! (at most [`OTHER_STACKS_PATIENCE`]) for `workers/hang_stacks_taken/ATTEMPT` to
//! count the others; every other node sees the key on its next tick (once
//! a second), takes its own stacks (`Stall::Elsewhere`), publishes its
//! ranks (`hang::Summary` as JSON in `workers/hang_ranks/ATTEMPT/NODE`) and adds
//! 1 to the count. The first then reads the published ranks into its report
//! (grouping and first rank over every node; `silent_nodes` counts those
//! that never answered) and stops its workers.

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::config::LaunchConfig;
use crate::console::ConsoleSender;
use crate::group::WorkerGroup;
use crate::hang::{self, HangReport};
use crate::job_store::JobStore;
use crate::keys;

/// Where an attempt runs, for its reports.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Here<'a> {
    pub(crate) node_rank: usize,
    /// Nodes in the attempt.
    pub(crate) nodes: usize,
    pub(crate) hostname: &'a str,
    /// This node's attempt number (its log directory's).
    pub(crate) attempt: u32,
    /// The attempt's id across nodes (`RELAUNCH_ATTEMPT`).
    pub(crate) attempt_id: u32,
}

/// The job is hung: every rank's stacks first, written out, then the
/// store says so (ranks blocked in relaunch's agreement give up) and the
/// workers are stopped with the grace period.
pub(crate) async fn hung(
    config: &LaunchConfig,
    store: &JobStore,
    group: &mut WorkerGroup,
    out: &ConsoleSender,
    here: &Here<'_>,
    stall: hang::Stall,
    ranks: Vec<hang::RankBeat>,
) -> HangReport {
    let detected = std::time::SystemTime::now();
    out.notice(format!(
        "relaunch: no progress from rank(s) {}; taking every rank's stacks before stopping them",
        crate::stacks::ranks_text(
            &ranks
                .iter()
                .filter(|r| match &stall {
                    hang::Stall::Silent(l) | hang::Stall::NeverBeat(l) => l.contains(&r.local_rank),
                    hang::Stall::Elsewhere(_) => true,
                })
                .map(|r| r.global_rank)
                .collect::<Vec<_>>()
        )
    ));
    // The other nodes take their stacks too, while their ranks are still
    // stuck: they read this key once a second.
    let headline_key = keys::hang(&config.run_id, here.attempt_id);
    let mut report = HangReport {
        stall,
        timeout: config.hang_timeout,
        startup: config.startup_timeout,
        detected,
        node_rank: here.node_rank,
        hostname: here.hostname.to_owned(),
        ranks: Vec::new(),
        silent_nodes: 0,
        others: Vec::new(),
        file: None,
    };
    // Two nodes may find the same hang at once: the first to set the key
    // waits for the others' stacks; the others count themselves in.
    let mut first = true;
    if here.nodes > 1 {
        // Unique to this node: two finders must tell their values apart.
        let headline = format!(
            "hang in attempt {} found by node {} ({})",
            here.attempt, here.node_rank, here.hostname
        );
        let set = store.client.compare_set(&headline_key, "", &headline);
        match tokio::time::timeout(Duration::from_secs(2), set).await {
            Ok(Ok(value)) => first = value == headline.as_bytes(),
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot announce the hang in the store"),
            Err(_) => tracing::warn!("the store did not answer in 2 s; the hang is not announced"),
        }
    }
    report.ranks = hang::collect(ranks).await;
    if let Some(dir) = group.attempt_dir() {
        report.write(dir, here.attempt);
    }
    if here.nodes > 1 {
        if first {
            report.silent_nodes =
                wait_for_other_stacks(store, &config.run_id, here.attempt_id, here.nodes - 1).await;
            report.others = other_nodes_ranks(store, &config.run_id, here).await;
            // Again, with every node's ranks.
            if let Some(dir) = group.attempt_dir() {
                report.write(dir, here.attempt);
            }
        } else {
            count_my_stacks(store, &config.run_id, here, &report).await;
        }
    }
    store
        .announce(
            &keys::failed(&config.run_id, here.attempt_id),
            &report.headline(here.attempt),
            "the hang",
        )
        .await;
    group.stop(Signal::SIGTERM, config.shutdown_timeout).await;
    report
}

/// How long the node that found a hang waits for the others' stacks.
const OTHER_STACKS_PATIENCE: Duration = Duration::from_secs(15);

/// Waits until `others` nodes have taken their stacks, at most
/// [`OTHER_STACKS_PATIENCE`] (a node that is gone never will); returns how
/// many did not.
async fn wait_for_other_stacks(
    store: &JobStore,
    run_id: &str,
    attempt: u32,
    others: usize,
) -> usize {
    let key = keys::hang_stacks_taken(run_id, attempt);
    let deadline = tokio::time::Instant::now() + OTHER_STACKS_PATIENCE;
    let mut taken = 0;
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(2), store.client.add(&key, 0)).await {
            Ok(Ok(n)) => taken = usize::try_from(n).unwrap_or(0),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot read how many nodes took their stacks")
            }
            Err(_) => {}
        }
        if taken >= others {
            return 0;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::warn!(
        others,
        taken,
        "not every other node took its stacks in time; stopping the workers anyway"
    );
    others - taken.min(others)
}

/// The hang another node found in this attempt, if one did.
pub(crate) async fn hang_elsewhere(store: &JobStore, run_id: &str, attempt: u32) -> Option<String> {
    store
        .read_if_set(
            &keys::hang(run_id, attempt),
            Duration::from_secs(2),
            "a hang on another node",
        )
        .await
        .map(|v| String::from_utf8_lossy(&v).into_owned())
}

/// Another node found the job hung: this node's stacks, written beside its
/// logs and shown, then counted in the store. The workers are left to the
/// failure that follows.
pub(crate) async fn stacks_for_elsewhere(
    config: &LaunchConfig,
    store: &JobStore,
    group: &WorkerGroup,
    out: &ConsoleSender,
    here: &Here<'_>,
    there: String,
) {
    let mut report = HangReport {
        stall: hang::Stall::Elsewhere(there),
        timeout: config.hang_timeout,
        startup: config.startup_timeout,
        detected: std::time::SystemTime::now(),
        node_rank: here.node_rank,
        hostname: here.hostname.to_owned(),
        ranks: hang::collect(group.beats()).await,
        silent_nodes: 0,
        others: Vec::new(),
        file: None,
    };
    if let Some(dir) = group.attempt_dir() {
        report.write(dir, here.attempt);
    }
    out.notice(report.render(here.attempt));
    count_my_stacks(store, &config.run_id, here, &report).await;
}

/// The other nodes' ranks, as each published them with its stacks (those
/// that did not are left out: `silent_nodes` counts them).
async fn other_nodes_ranks(store: &JobStore, run_id: &str, here: &Here<'_>) -> Vec<hang::Summary> {
    let mut others = Vec::new();
    for node in (0..here.nodes).filter(|n| *n != here.node_rank) {
        let key = keys::hang_ranks(run_id, here.attempt_id, node);
        let patience = Duration::from_secs(2);
        let Some(value) = store
            .read_if_set(&key, patience, "a node's ranks in a hang")
            .await
        else {
            continue;
        };
        match serde_json::from_slice::<Vec<serde_json::Value>>(&value) {
            Ok(ranks) => others.extend(ranks.iter().filter_map(hang::Summary::from_json)),
            Err(e) => {
                tracing::warn!(node, error = %e, "a node's ranks for the hang report are not JSON")
            }
        }
    }
    others
}

/// Publishes this node's ranks and tells the node that found the hang that
/// this node's stacks are taken.
async fn count_my_stacks(store: &JobStore, run_id: &str, here: &Here<'_>, report: &HangReport) {
    let (attempt, node) = (here.attempt_id, here.node_rank);
    let set = store
        .client
        .set(keys::hang_ranks(run_id, attempt, node), report.published());
    if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(2), set).await {
        tracing::warn!(error = %e, "cannot publish this node's ranks for the hang report");
    }
    let add = store
        .client
        .add(keys::hang_stacks_taken(run_id, attempt), 1);
    match tokio::time::timeout(Duration::from_secs(2), add).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot say in the store that this node took its stacks")
        }
        Err(_) => {
            tracing::warn!("the store did not answer in 2 s; this node's stacks are not counted")
        }
    }
}

//! Store keys of relaunch's own coordination, all under `relaunch/RUN_ID/`,
//! so they never meet torch's keys (`/worker/...`, `default_pg/...`).
//!
//! Keys under `relaunch/RUN_ID/workers/` belong to one attempt's workers
//! (`relaunch.preemption`) and are deleted with torch's keys between
//! attempts; the rest belong to the launchers and last the whole job.

/// Barrier that every node reaches before starting attempt `attempt`.
pub fn attempt_ready(run_id: &str, attempt: u32) -> String {
    format!("relaunch/{run_id}/attempt/{attempt}/ready")
}

/// Set by the node hosting the store once every node reached
/// [`attempt_ready`] and the previous attempt's worker keys are deleted;
/// nodes start their workers when they see it.
pub fn attempt_go(run_id: &str, attempt: u32) -> String {
    format!("relaunch/{run_id}/attempt/{attempt}/go")
}

/// Exit barrier of a finished attempt: every node arrives before any
/// leaves, so the node hosting the store does not close it under the others.
pub fn done(run_id: &str, attempt: u64) -> String {
    format!("relaunch/{run_id}/attempt/{attempt}/done")
}

/// The launch's id, agreed once per launch by COMPARE_SET (the first
/// node's proposal wins); it starts the attempt tokens of the tracking run,
/// so every node of an attempt names it the same way.
pub fn launch(run_id: &str) -> String {
    format!("relaunch/{run_id}/launch")
}

/// Whether `key` belongs to the launchers (and survives between attempts).
pub fn is_launcher_key(key: &[u8]) -> bool {
    let Some(rest) = key.strip_prefix(b"relaunch/") else {
        return false;
    };
    match rest.iter().position(|&b| b == b'/') {
        Some(slash) => !rest[slash + 1..].starts_with(b"workers/"),
        None => true,
    }
}

/// Set by the first node whose worker failed in `attempt`; its value says
/// which node. The other nodes stop their workers and restart with it.
pub fn attempt_failed(run_id: &str, attempt: u32) -> String {
    format!("relaunch/{run_id}/attempt/{attempt}/failed")
}

/// Set (to the signal's name) when the job is asked to stop: by a signal to
/// any node's launcher, or by a worker that got one. Workers wait on it
/// (`relaunch.preemption`) so that every rank hears of it, on every node.
pub fn preempt(run_id: &str) -> String {
    format!("relaunch/{run_id}/workers/preempt")
}

/// Written by rank `rank`'s `relaunch.preemption` when it stops at the
/// agreed step (JSON: `step`, `agreed`, `checkpoint`, the last once its
/// checkpoint of that step is written). The launcher reads its own ranks'
/// when a stopped attempt ends: exit code 75 needs every one.
pub fn stopped(run_id: &str, rank: usize) -> String {
    format!("relaunch/{run_id}/workers/stopped/{rank}")
}

/// Set by a launcher as soon as one of its workers failed in attempt
/// `attempt` (`RELAUNCH_ATTEMPT`), before it stops the others, or when it
/// stops its workers because another node failed or was lost (a lost node
/// cannot set it); its value says which rank and how, or which node. Ranks
/// blocked in relaunch's own agreement (`relaunch.Checkpointer`) check it,
/// so they give up on a dead peer within a second instead of waiting out
/// their timeout, and `relaunch.preemption` ends a rank whose SIGTERM
/// follows it. Named by the attempt because a
/// launcher may write it late: a node cut off from the store, whose failure
/// notice TCP delivers once the link is back, or one that has not yet heard
/// that the others went on without it; either lands in a key that no rank
/// of the attempt now running reads.
pub fn failed(run_id: &str, attempt: u32) -> String {
    format!("relaunch/{run_id}/workers/failed/{attempt}")
}

/// Set by the launcher that finds the job hung in attempt `attempt` (the
/// attempt's id, so a late write from a node cut off and back lands where
/// no current launcher reads, like [`failed`]), before it stops anything;
/// its value is the hang's headline. Every other launcher, which reads it
/// once a second, takes its own ranks' stacks and then adds 1 to
/// [`hang_stacks_taken`], which the first waits for (bounded) before it
/// stops its workers: every node's stacks are taken while all are stuck.
pub fn hang(run_id: &str, attempt: u32) -> String {
    format!("relaunch/{run_id}/workers/hang/{attempt}")
}

/// Node `node`'s ranks for a hang report (JSON, `hang::Summary`), set
/// before it counts itself in [`hang_stacks_taken`].
pub fn hang_ranks(run_id: &str, attempt: u32, node: usize) -> String {
    format!("relaunch/{run_id}/workers/hang_ranks/{attempt}/{node}")
}

/// How many other nodes have taken their stacks after [`hang`].
pub fn hang_stacks_taken(run_id: &str, attempt: u32) -> String {
    format!("relaunch/{run_id}/workers/hang_stacks_taken/{attempt}")
}

/// The step at which every rank stops, agreed by `relaunch.preemption.reached`:
/// the first rank to propose one sets it with COMPARE_SET; the others adopt it.
pub fn stop_step(run_id: &str) -> String {
    format!("relaunch/{run_id}/workers/stop_step")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_keys_are_not_launcher_keys() {
        assert!(is_launcher_key(attempt_ready("r", 1).as_bytes()));
        assert!(is_launcher_key(b"relaunch/r/rdzv/round/0/joined"));
        assert!(!is_launcher_key(preempt("r").as_bytes()));
        assert!(!is_launcher_key(stop_step("r").as_bytes()));
        assert!(!is_launcher_key(failed("r", 3).as_bytes()));
        assert_eq!(failed("r", 3), "relaunch/r/workers/failed/3");
        assert!(!is_launcher_key(b"/worker/attempt_0/rank_0"));
        assert!(!is_launcher_key(b"default_pg/0//cpu//0/0"));
    }
}

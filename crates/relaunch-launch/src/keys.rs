//! Store keys of the launchers' own coordination, all under
//! `relaunch/RUN_ID/`, so they never meet torch's keys (`/worker/...`,
//! `default_pg/...`).

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

/// Whether `key` belongs to the launchers (and survives between attempts).
pub fn is_launcher_key(key: &[u8]) -> bool {
    key.starts_with(b"relaunch/")
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
    format!("relaunch/{run_id}/preempt")
}

/// The step at which every rank stops, agreed by `relaunch.preemption.reached`:
/// the first rank to propose one sets it with COMPARE_SET; the others adopt it.
pub fn stop_step(run_id: &str) -> String {
    format!("relaunch/{run_id}/stop_step")
}

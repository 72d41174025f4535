//! The environment every worker gets: torchrun's variables, with torchrun's
//! values, plus relaunch's own. Each name is declared once here.

use std::path::{Path, PathBuf};

/// Global rank of the worker.
pub const RANK: &str = "RANK";
/// Rank of the worker on its node.
pub const LOCAL_RANK: &str = "LOCAL_RANK";
/// Rank of the worker's node (its group).
pub const GROUP_RANK: &str = "GROUP_RANK";
/// Rank among the workers of the same role (one role: the global rank).
pub const ROLE_RANK: &str = "ROLE_RANK";
/// `--role`.
pub const ROLE_NAME: &str = "ROLE_NAME";
/// Workers on this node.
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
/// Workers in the job.
pub const WORLD_SIZE: &str = "WORLD_SIZE";
/// Nodes in the job.
pub const GROUP_WORLD_SIZE: &str = "GROUP_WORLD_SIZE";
/// Workers of this role in the job.
pub const ROLE_WORLD_SIZE: &str = "ROLE_WORLD_SIZE";
/// Host of the store that `init_process_group` uses (the launcher's).
pub const MASTER_ADDR: &str = "MASTER_ADDR";
/// Port of that store.
pub const MASTER_PORT: &str = "MASTER_PORT";
/// How many times the workers were restarted so far.
pub const TORCHELASTIC_RESTART_COUNT: &str = "TORCHELASTIC_RESTART_COUNT";
/// `--max-restarts`.
pub const TORCHELASTIC_MAX_RESTARTS: &str = "TORCHELASTIC_MAX_RESTARTS";
/// The job's id, stable across restarts.
pub const TORCHELASTIC_RUN_ID: &str = "TORCHELASTIC_RUN_ID";
/// `True`: a store already runs, so no rank starts one.
pub const TORCHELASTIC_USE_AGENT_STORE: &str = "TORCHELASTIC_USE_AGENT_STORE";
/// Where torch's `@record` writes a failing worker's traceback.
pub const TORCHELASTIC_ERROR_FILE: &str = "TORCHELASTIC_ERROR_FILE";
/// The signals the launcher handles, comma-separated.
pub const TORCHELASTIC_SIGNALS_TO_HANDLE: &str = "TORCHELASTIC_SIGNALS_TO_HANDLE";
/// NCCL watchdog error handling; `1` unless the caller set it.
pub const TORCH_NCCL_ASYNC_ERROR_HANDLING: &str = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
/// torch's NCCL flight recorder, set up for hang reports unless the user set
/// it (either name): its ring of the last collectives (entries; under the
/// name the workers' torch reads without a deprecation warning, see
/// [`crate::torch`]), a dump
/// when NCCL's watchdog times out, where dumps go (`PREFIX` + rank, in the
/// rank's log directory), and a pipe (`PREFIX` + rank) whose write asks
/// for a dump now, which a hang report does. Only NCCL process groups read
/// them.
pub const TORCH_NCCL_TRACE_BUFFER_SIZE: &str = "TORCH_NCCL_TRACE_BUFFER_SIZE";
pub const TORCH_FR_BUFFER_SIZE: &str = "TORCH_FR_BUFFER_SIZE";
pub const TORCH_NCCL_DUMP_ON_TIMEOUT: &str = "TORCH_NCCL_DUMP_ON_TIMEOUT";
pub const TORCH_NCCL_DEBUG_INFO_TEMP_FILE: &str = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE";
pub const TORCH_FR_DUMP_TEMP_FILE: &str = "TORCH_FR_DUMP_TEMP_FILE";
pub const TORCH_NCCL_DEBUG_INFO_PIPE_FILE: &str = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE";
/// Flight recorder entries kept when relaunch sets it up.
pub const FLIGHT_RECORDER_ENTRIES: &str = "2000";
/// The names of its dumps and of its pipe in a rank's log directory
/// (torch appends the rank).
pub const NCCL_TRACE_PREFIX: &str = "nccl_trace_rank_";
pub const NCCL_PIPE_PREFIX: &str = "nccl_trace_pipe_";
/// The GPUs a worker may use; one each under `--virtual-local-rank`.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// `1` when unset and a node runs more than one worker, as torchrun does.
pub const OMP_NUM_THREADS: &str = "OMP_NUM_THREADS";
/// relaunch's run id (the same as `TORCHELASTIC_RUN_ID`).
pub const RELAUNCH_RUN_ID: &str = "RELAUNCH_RUN_ID";
/// The attempt's id, as the tracking run names it (`LAUNCH:ATTEMPT`): the
/// elastic round (a round opened to admit a node is a new attempt, though
/// not a restart), else the attempt number, 0 first (on a static job the
/// same as `TORCHELASTIC_RESTART_COUNT`). Every rank of an attempt sees the
/// same value, and no two attempts of a launch share one.
pub const RELAUNCH_ATTEMPT: &str = "RELAUNCH_ATTEMPT";
/// `HOST:PORT` of the launcher's store, for `relaunch.Store` and
/// `relaunch.preemption`.
pub const RELAUNCH_STORE: &str = "RELAUNCH_STORE";
/// The worker's log directory for this attempt.
pub const RELAUNCH_LOG_DIR: &str = "RELAUNCH_LOG_DIR";
/// The rank's beat record (`relaunch_client::beat`), in its log directory.
pub const RELAUNCH_BEAT_FILE: &str = relaunch_client::beat::BEAT_FILE_ENV;
/// The memory tier of checkpoints on this node ([`crate::snapshot`]): a
/// directory that every rank of every attempt shares, which outlives any
/// worker and every restart and goes when the launcher exits. Set only
/// with a tier (`--snapshot-memory`, not 0).
pub const RELAUNCH_SNAPSHOT_DIR: &str = "RELAUNCH_SNAPSHOT_DIR";
/// The bytes the node's snapshots may take in `RELAUNCH_SNAPSHOT_DIR`, all
/// ranks together. Set with it.
pub const RELAUNCH_SNAPSHOT_MEMORY: &str = "RELAUNCH_SNAPSHOT_MEMORY";
/// The beat record's name in a rank's log directory.
pub const BEAT_FILE: &str = "beat";
/// Where `import relaunch` has a rank write its stacks on the dump signal
/// (`faulthandler`), in its log directory.
pub const STACKS_FILE: &str = "stacks.txt";

/// Where one worker sits in the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerPlace {
    pub local_rank: usize,
    pub global_rank: usize,
    pub node_rank: usize,
    pub local_world_size: usize,
    pub world_size: usize,
    pub nodes: usize,
}

/// What all workers of one attempt share.
#[derive(Clone, Debug)]
pub struct AttemptEnv {
    pub role: String,
    pub master_addr: String,
    pub master_port: u16,
    /// `RELAUNCH_ATTEMPT`.
    pub attempt: u32,
    /// `TORCHELASTIC_RESTART_COUNT`: restarts after failures, as torchrun
    /// counts them.
    pub restart_count: u32,
    pub max_restarts: u32,
    pub run_id: String,
    pub signals: String,
    /// More variables for every worker (the tracking server's, with `--server`).
    pub extra: Vec<(&'static str, String)>,
    /// `--virtual-local-rank`: every worker sees `LOCAL_RANK=0` and only
    /// its own GPU.
    pub virtual_local_rank: bool,
    /// The flight recorder's buffer-size variable of the workers' torch
    /// ([`crate::torch::TorchVersion::flight_recorder_size_var`]).
    pub flight_recorder_size_var: &'static str,
    /// The memory tier's directory and budget in bytes, if the launch has
    /// one (`RELAUNCH_SNAPSHOT_DIR`, `RELAUNCH_SNAPSHOT_MEMORY`).
    pub snapshot: Option<(PathBuf, u64)>,
}

/// The variables one worker gets on top of the launcher's own environment.
/// `inherited` looks up the launcher's environment (a parameter for tests).
pub fn worker_env(
    attempt: &AttemptEnv,
    place: WorkerPlace,
    error_file: &Path,
    log_dir: &Path,
    inherited: impl Fn(&str) -> Option<String>,
) -> Vec<(&'static str, String)> {
    let mut env = vec![
        (RANK, place.global_rank.to_string()),
        (GROUP_RANK, place.node_rank.to_string()),
        (ROLE_RANK, place.global_rank.to_string()),
        (ROLE_NAME, attempt.role.clone()),
        (LOCAL_WORLD_SIZE, place.local_world_size.to_string()),
        (WORLD_SIZE, place.world_size.to_string()),
        (GROUP_WORLD_SIZE, place.nodes.to_string()),
        (ROLE_WORLD_SIZE, place.world_size.to_string()),
        (MASTER_ADDR, attempt.master_addr.clone()),
        (MASTER_PORT, attempt.master_port.to_string()),
        (
            TORCHELASTIC_RESTART_COUNT,
            attempt.restart_count.to_string(),
        ),
        (TORCHELASTIC_MAX_RESTARTS, attempt.max_restarts.to_string()),
        (TORCHELASTIC_RUN_ID, attempt.run_id.clone()),
        (TORCHELASTIC_USE_AGENT_STORE, "True".into()),
        (
            TORCH_NCCL_ASYNC_ERROR_HANDLING,
            inherited(TORCH_NCCL_ASYNC_ERROR_HANDLING).unwrap_or_else(|| "1".into()),
        ),
        (
            LOCAL_RANK,
            if attempt.virtual_local_rank {
                "0".into()
            } else {
                place.local_rank.to_string()
            },
        ),
        (TORCHELASTIC_ERROR_FILE, error_file.display().to_string()),
        (TORCHELASTIC_SIGNALS_TO_HANDLE, attempt.signals.clone()),
        (RELAUNCH_RUN_ID, attempt.run_id.clone()),
        (RELAUNCH_ATTEMPT, attempt.attempt.to_string()),
        (
            RELAUNCH_STORE,
            format!("{}:{}", attempt.master_addr, attempt.master_port),
        ),
        (RELAUNCH_LOG_DIR, log_dir.display().to_string()),
        (
            RELAUNCH_BEAT_FILE,
            log_dir.join(BEAT_FILE).display().to_string(),
        ),
    ];
    if attempt.virtual_local_rank {
        // torchrun's choice: the local rank's entry of the launcher's own
        // list (the CLI checked that it has one), else the GPU of that index.
        let gpu = inherited(CUDA_VISIBLE_DEVICES)
            .and_then(|list| {
                list.split(',')
                    .nth(place.local_rank)
                    .map(|gpu| gpu.trim().to_owned())
            })
            .unwrap_or_else(|| place.local_rank.to_string());
        env.push((CUDA_VISIBLE_DEVICES, gpu));
    }
    let unset = |names: &[&str]| names.iter().all(|n| inherited(n).is_none());
    if unset(&[TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_FR_BUFFER_SIZE]) {
        env.push((
            attempt.flight_recorder_size_var,
            FLIGHT_RECORDER_ENTRIES.into(),
        ));
    }
    if unset(&[TORCH_NCCL_DUMP_ON_TIMEOUT]) {
        env.push((TORCH_NCCL_DUMP_ON_TIMEOUT, "1".into()));
    }
    if unset(&[TORCH_NCCL_DEBUG_INFO_TEMP_FILE, TORCH_FR_DUMP_TEMP_FILE]) {
        let prefix = log_dir.join(NCCL_TRACE_PREFIX);
        env.push((
            TORCH_NCCL_DEBUG_INFO_TEMP_FILE,
            prefix.display().to_string(),
        ));
    }
    if unset(&[TORCH_NCCL_DEBUG_INFO_PIPE_FILE]) {
        let prefix = log_dir.join(NCCL_PIPE_PREFIX);
        env.push((
            TORCH_NCCL_DEBUG_INFO_PIPE_FILE,
            prefix.display().to_string(),
        ));
    }
    if let Some((dir, budget)) = &attempt.snapshot {
        env.push((RELAUNCH_SNAPSHOT_DIR, dir.display().to_string()));
        env.push((RELAUNCH_SNAPSHOT_MEMORY, budget.to_string()));
    }
    match inherited(OMP_NUM_THREADS) {
        Some(value) => env.push((OMP_NUM_THREADS, value)),
        None if place.local_world_size > 1 => env.push((OMP_NUM_THREADS, "1".into())),
        None => {}
    }
    env.extend(attempt.extra.iter().cloned());
    env
}

/// Whether a worker variable has one value for every rank of an attempt
/// and every attempt of a job that keeps its size: what a warm interpreter
/// ([`crate::zygote`]) may start with. Nothing that names a rank, an
/// attempt or a rank's files (`RANK`, `TORCHELASTIC_RESTART_COUNT`,
/// `RELAUNCH_BEAT_FILE`, ...): a module that read one at import time would
/// keep a value that is wrong for the worker forked later.
pub fn job_wide(name: &str) -> bool {
    [
        ROLE_NAME,
        LOCAL_WORLD_SIZE,
        WORLD_SIZE,
        GROUP_WORLD_SIZE,
        ROLE_WORLD_SIZE,
        MASTER_ADDR,
        MASTER_PORT,
        TORCHELASTIC_MAX_RESTARTS,
        TORCHELASTIC_RUN_ID,
        TORCHELASTIC_USE_AGENT_STORE,
        TORCHELASTIC_SIGNALS_TO_HANDLE,
        TORCH_NCCL_ASYNC_ERROR_HANDLING,
        TORCH_NCCL_TRACE_BUFFER_SIZE,
        TORCH_FR_BUFFER_SIZE,
        TORCH_NCCL_DUMP_ON_TIMEOUT,
        OMP_NUM_THREADS,
        RELAUNCH_RUN_ID,
        RELAUNCH_STORE,
        RELAUNCH_SNAPSHOT_DIR,
        RELAUNCH_SNAPSHOT_MEMORY,
    ]
    .contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_wide_variables_are_the_same_for_every_rank_and_attempt() {
        let mut first = attempt();
        first.snapshot = Some(("/dev/shm/x".into(), 1 << 20));
        let mut later = first.clone();
        later.attempt = 3;
        later.restart_count = 3;
        let envs: Vec<_> = [
            (&first, 0, "/logs/a0/0"),
            (&first, 1, "/logs/a0/1"),
            (&later, 1, "/logs/a3/1"),
        ]
        .into_iter()
        .map(|(attempt, rank, dir)| {
            let place = WorkerPlace {
                local_rank: rank,
                global_rank: rank,
                node_rank: 0,
                local_world_size: 2,
                world_size: 2,
                nodes: 1,
            };
            let dir = Path::new(dir);
            worker_env(attempt, place, &dir.join("error.json"), dir, |_| None)
        })
        .collect();
        let value = |env: &Vec<(&str, String)>, name: &str| {
            env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
        };
        let mut shared = 0;
        for (name, _) in envs[0].iter().filter(|(k, _)| job_wide(k)) {
            shared += 1;
            let values: Vec<_> = envs.iter().map(|env| value(env, name)).collect();
            assert!(
                values.windows(2).all(|w| w[0] == w[1]),
                "{name}: {values:?}"
            );
        }
        assert!(shared >= 10, "only {shared} job-wide variables");
        for name in [
            RANK,
            LOCAL_RANK,
            TORCHELASTIC_RESTART_COUNT,
            TORCHELASTIC_ERROR_FILE,
            RELAUNCH_ATTEMPT,
            RELAUNCH_LOG_DIR,
            RELAUNCH_BEAT_FILE,
            TORCH_NCCL_DEBUG_INFO_TEMP_FILE,
            CUDA_VISIBLE_DEVICES,
        ] {
            assert!(!job_wide(name), "{name}");
        }
    }

    fn attempt() -> AttemptEnv {
        AttemptEnv {
            role: "default".into(),
            master_addr: "localhost".into(),
            master_port: 29400,
            attempt: 5,
            restart_count: 2,
            max_restarts: 3,
            run_id: "job".into(),
            signals: "SIGTERM,SIGINT".into(),
            extra: Vec::new(),
            virtual_local_rank: false,
            flight_recorder_size_var: TORCH_FR_BUFFER_SIZE,
            snapshot: None,
        }
    }

    fn place(local_world_size: usize) -> WorkerPlace {
        WorkerPlace {
            local_rank: 1,
            global_rank: 3,
            node_rank: 1,
            local_world_size,
            world_size: 4,
            nodes: 2,
        }
    }

    fn get(env: &[(&str, String)], k: &str) -> Option<String> {
        env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_nccl_flight_recorder_is_set_up_unless_the_user_did() {
        let dir = Path::new("/logs/attempt_0/1");
        let env = worker_env(&attempt(), place(2), &dir.join("error.json"), dir, |_| None);
        assert_eq!(get(&env, TORCH_FR_BUFFER_SIZE).as_deref(), Some("2000"));
        // Only the name the workers' torch reads quietly: torch 2.15 warns
        // on every rank about the old one.
        assert_eq!(get(&env, TORCH_NCCL_TRACE_BUFFER_SIZE), None);
        let old_torch = AttemptEnv {
            flight_recorder_size_var: TORCH_NCCL_TRACE_BUFFER_SIZE,
            ..attempt()
        };
        let env = worker_env(&old_torch, place(2), &dir.join("error.json"), dir, |_| None);
        assert_eq!(
            get(&env, TORCH_NCCL_TRACE_BUFFER_SIZE).as_deref(),
            Some("2000")
        );
        assert_eq!(get(&env, TORCH_FR_BUFFER_SIZE), None);
        assert_eq!(get(&env, TORCH_NCCL_DUMP_ON_TIMEOUT).as_deref(), Some("1"));
        assert_eq!(
            get(&env, TORCH_NCCL_DEBUG_INFO_TEMP_FILE).as_deref(),
            Some("/logs/attempt_0/1/nccl_trace_rank_")
        );
        assert_eq!(
            get(&env, TORCH_NCCL_DEBUG_INFO_PIPE_FILE).as_deref(),
            Some("/logs/attempt_0/1/nccl_trace_pipe_")
        );
        // The user's own, under either name, is left alone.
        let users = |k: &str| {
            matches!(
                k,
                "TORCH_FR_BUFFER_SIZE" | "TORCH_NCCL_DUMP_ON_TIMEOUT" | "TORCH_FR_DUMP_TEMP_FILE"
            )
            .then(|| "theirs".to_owned())
        };
        let env = worker_env(&attempt(), place(2), &dir.join("error.json"), dir, users);
        for name in [
            TORCH_NCCL_TRACE_BUFFER_SIZE,
            TORCH_FR_BUFFER_SIZE,
            TORCH_NCCL_DUMP_ON_TIMEOUT,
            TORCH_NCCL_DEBUG_INFO_TEMP_FILE,
        ] {
            assert_eq!(get(&env, name), None, "{name}");
        }
    }

    #[test]
    fn a_virtual_local_rank_sees_one_gpu_as_local_rank_0() {
        let virtual_ranks = AttemptEnv {
            virtual_local_rank: true,
            ..attempt()
        };
        let env = worker_env(
            &virtual_ranks,
            place(2),
            Path::new("/e"),
            Path::new("/l"),
            |_| None,
        );
        assert_eq!(get(&env, LOCAL_RANK).as_deref(), Some("0"));
        assert_eq!(get(&env, CUDA_VISIBLE_DEVICES).as_deref(), Some("1"));
        let listed = |k: &str| (k == CUDA_VISIBLE_DEVICES).then(|| "4, 6".to_owned());
        let env = worker_env(
            &virtual_ranks,
            place(2),
            Path::new("/e"),
            Path::new("/l"),
            listed,
        );
        assert_eq!(get(&env, CUDA_VISIBLE_DEVICES).as_deref(), Some("6"));
        assert_eq!(get(&env, RANK).as_deref(), Some("3"));
        // Without the flag: the real local rank, and the GPUs left alone.
        let env = worker_env(
            &attempt(),
            place(2),
            Path::new("/e"),
            Path::new("/l"),
            listed,
        );
        assert_eq!(get(&env, LOCAL_RANK).as_deref(), Some("1"));
        assert_eq!(get(&env, CUDA_VISIBLE_DEVICES), None);
    }

    #[test]
    fn torchrun_values() {
        let env = worker_env(
            &attempt(),
            place(2),
            Path::new("/e.json"),
            Path::new("/l"),
            |_| None,
        );
        assert_eq!(get(&env, RANK).as_deref(), Some("3"));
        assert_eq!(get(&env, GROUP_RANK).as_deref(), Some("1"));
        assert_eq!(get(&env, ROLE_WORLD_SIZE).as_deref(), Some("4"));
        assert_eq!(get(&env, TORCHELASTIC_RESTART_COUNT).as_deref(), Some("2"));
        // An elastic round opened to admit a node is an attempt, not a restart.
        assert_eq!(get(&env, RELAUNCH_ATTEMPT).as_deref(), Some("5"));
        assert_eq!(
            get(&env, TORCHELASTIC_USE_AGENT_STORE).as_deref(),
            Some("True")
        );
        assert_eq!(
            get(&env, TORCH_NCCL_ASYNC_ERROR_HANDLING).as_deref(),
            Some("1")
        );
        assert_eq!(
            get(&env, RELAUNCH_STORE).as_deref(),
            Some("localhost:29400")
        );
    }

    #[test]
    fn extra_variables_are_added() {
        let mut attempt = attempt();
        attempt.extra = vec![("RELAUNCH_SERVER", "http://s:1".into())];
        let env = worker_env(&attempt, place(1), Path::new("e"), Path::new("l"), |_| None);
        assert_eq!(get(&env, "RELAUNCH_SERVER").as_deref(), Some("http://s:1"));
        assert_eq!(get(&env, RANK).as_deref(), Some("3"));
    }

    #[test]
    fn the_memory_tier_is_named_only_when_there_is_one() {
        let env = worker_env(&attempt(), place(2), Path::new("e"), Path::new("l"), |_| {
            None
        });
        assert_eq!(get(&env, RELAUNCH_SNAPSHOT_DIR), None);
        assert_eq!(get(&env, RELAUNCH_SNAPSHOT_MEMORY), None);
        let tier = AttemptEnv {
            snapshot: Some(("/dev/shm/relaunch-snap-1-2-0000000a".into(), 1 << 30)),
            ..attempt()
        };
        let env = worker_env(&tier, place(2), Path::new("e"), Path::new("l"), |_| None);
        assert_eq!(
            get(&env, RELAUNCH_SNAPSHOT_DIR).as_deref(),
            Some("/dev/shm/relaunch-snap-1-2-0000000a")
        );
        assert_eq!(
            get(&env, RELAUNCH_SNAPSHOT_MEMORY).as_deref(),
            Some("1073741824")
        );
    }

    #[test]
    fn omp_num_threads_like_torchrun() {
        let two = worker_env(&attempt(), place(2), Path::new("e"), Path::new("l"), |_| {
            None
        });
        assert_eq!(get(&two, OMP_NUM_THREADS).as_deref(), Some("1"));
        let one = worker_env(&attempt(), place(1), Path::new("e"), Path::new("l"), |_| {
            None
        });
        assert_eq!(get(&one, OMP_NUM_THREADS), None);
        let set = worker_env(&attempt(), place(2), Path::new("e"), Path::new("l"), |k| {
            (k == OMP_NUM_THREADS).then(|| "8".to_string())
        });
        assert_eq!(get(&set, OMP_NUM_THREADS).as_deref(), Some("8"));
    }
}

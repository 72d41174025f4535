//! `relaunch run`: torchrun's flags resolved into a launch, the same way
//! torchrun resolves them, then the launch itself.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context as _;
use relaunch_client::http::{TOKEN_ENV, normalize_server};
use relaunch_launch::config::{
    DEFAULT_PREFIX_TEMPLATE, DEFAULT_SIGNALS, DuplicateFilters, Entrypoint, LaunchConfig, NProc,
    NodeRange, RendezvousConfig, SnapshotConfig, WorkerTty, parse_signals,
};
use relaunch_launch::snapshot::{self, Decision, RootSpace};
use relaunch_launch::tracking::{DEFAULT_EXIT_TIMEOUT, EXIT_TIMEOUT_ENV};
use relaunch_launch::{LaunchError, Outcome, TrackingConfig};

use crate::Context;
use crate::cli::{RdzvBackend, RunArgs, WarmRestarts, WorkerTtyChoice};
use scheduler::{Requeue, Source, Sourced};

mod hostlist;
mod kubernetes;
mod scheduler;
mod slurm;
mod sync_dir;

/// torchrun's store port when none is given on several nodes.
const DEFAULT_MASTER_PORT: u16 = 29500;
/// torchrun's `--shutdown-timeout` default.
const DEFAULT_SHUTDOWN_TIMEOUT: f64 = 30.0;

/// Runs the job; returns the launcher's exit code.
pub(crate) fn run(args: &RunArgs, context: &Context) -> anyhow::Result<u8> {
    if let Some(shell) = &args.print_completion {
        let script = crate::completion::script(shell).map_err(UsageError)?;
        crate::output::data(&script)?;
        return Ok(0);
    }
    let resolved = resolve(args, context, &scheduler::process_env).map_err(UsageError)?;
    let sync = sync_dir(args, &resolved.config).map_err(UsageError)?;
    for line in compat_notices(args).iter().chain(&resolved.warnings) {
        crate::output::status(line);
    }
    if args.print_config {
        crate::output::text(&resolved.report());
        return Ok(0);
    }
    let Resolved {
        config, requeue, ..
    } = resolved;
    let mirror = match (sync, &config.tracking) {
        (Some(sync), Some(tracking)) => Some(sync_dir::Mirror::start(
            sync,
            &tracking.server,
            tracking.token.as_deref(),
            config.run_id.clone(),
        )?),
        _ => None,
    };
    // A runtime on this thread: workers are spawned from it, and the kernel
    // sends their death signal when the spawning thread ends, so it must be
    // the thread that lives as long as the launcher.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime.block_on(relaunch_launch::launch(config));
    // Whatever the outcome: the folder as the workers left it.
    if let Some(mirror) = mirror {
        mirror.finish();
    }
    match outcome {
        Ok(outcome) => {
            if let (
                Outcome::Stopped {
                    clean: true,
                    signal,
                },
                Some(requeue),
            ) = (&outcome, &requeue)
            {
                if *signal == requeue.warning {
                    request_requeue(requeue);
                } else {
                    crate::output::status(&format!(
                        "relaunch: stopped cleanly by {signal}, not by the time-limit warning \
                         ({}): the job is not requeued (a cancelled job stays cancelled; SLURM \
                         requeues a preempted one itself under PreemptMode=REQUEUE)",
                        requeue.warning
                    ));
                }
            }
            Ok(outcome.exit_code())
        }
        Err(LaunchError::Config(message)) => Err(UsageError(message).into()),
        Err(e) => Err(e.into()),
    }
}

/// `--requeue-on-preempt` after a clean stop by the scheduler's warning
/// before the time limit: every rank stopped at the agreed step and exited
/// 0 (its checkpoint committed), and on several nodes the exit barrier has
/// seen every node done. A failure is reported
/// and leaves the exit code at 75, for a wrapper to act on.
fn request_requeue(requeue: &Requeue) {
    let shown = requeue.argv.join(" ");
    crate::output::status(&format!(
        "relaunch: stopped cleanly; requeueing the job: {shown}"
    ));
    let Some((program, rest)) = requeue.argv.split_first() else {
        return;
    };
    match std::process::Command::new(program).args(rest).status() {
        Ok(status) if status.success() => {}
        Ok(status) => crate::output::status(&format!(
            "relaunch: warning: `{shown}` failed ({status}); the job was not requeued"
        )),
        Err(e) => crate::output::status(&format!(
            "relaunch: warning: cannot run `{shown}`: {e}; the job was not requeued"
        )),
    }
}

/// A mistake in the command line, reported with exit code 2.
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The launch, with where each setting that a scheduler can supply came
/// from (`--print-config`).
#[derive(Debug)]
pub(crate) struct Resolved {
    pub(crate) config: LaunchConfig,
    /// Setting, value, source; in the order `--print-config` shows them.
    pub(crate) sources: Vec<(&'static str, String, Source)>,
    /// Set with `--requeue-on-preempt`, on the node that requeues.
    pub(crate) requeue: Option<Requeue>,
    /// The scheduler found, if any.
    pub(crate) scheduler: Option<&'static str>,
    /// Lines to show before the launch starts (`relaunch: warning: ...`).
    pub(crate) warnings: Vec<String>,
}

impl Resolved {
    /// What `--print-config` prints: one line per setting, `NAME VALUE <- SOURCE`.
    fn report(&self) -> String {
        let mut out = format!(
            "relaunch run: resolved settings ({})\n",
            self.scheduler
                .map_or("no scheduler".to_owned(), |s| format!("inside {s}"))
        );
        for (name, value, source) in &self.sources {
            let value = crate::render::pad(value, 28);
            out.push_str(&format!("  {name:<20} {value} <- {source}\n"));
        }
        out
    }
}

/// torchrun's resolution of its flags, plus checks it lacks, then what the
/// scheduler says (read from `env`), then the defaults.
fn resolve(
    args: &RunArgs,
    context: &Context,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Resolved, String> {
    let allocation = scheduler::detect(env)?;
    let alloc = allocation.as_ref();
    let mut sources: Vec<(&'static str, String, Source)> = Vec::new();
    let mut note = |name: &'static str, value: String, source: Source| {
        sources.push((name, value, source));
    };

    let nnodes: Sourced<NodeRange> = match (args.nnodes, alloc.and_then(|a| a.nnodes.clone())) {
        (Some(n), _) => Sourced::flag(n, "--nnodes"),
        (None, Some(n)) if !args.standalone => Sourced {
            value: NodeRange {
                min: n.value,
                max: n.value,
            },
            source: n.source,
        },
        (None, _) => Sourced::default(NodeRange { min: 1, max: 1 }, "one node"),
    };
    let nproc: Sourced<NProc> = match (
        args.nproc_per_node,
        alloc.and_then(|a| a.nproc_per_node.clone()),
    ) {
        (Some(n), _) => Sourced::flag(n, "--nproc-per-node"),
        (None, Some(n)) => Sourced {
            value: NProc::Count(n.value),
            source: n.source,
        },
        (None, None) => Sourced::default(NProc::Count(1), "one worker"),
    };
    let nproc_per_node = nproc.value.resolve().map_err(|e| e.to_string())?;
    let is_static = !args.standalone && args.rdzv_backend == RdzvBackend::Static;
    let node_rank: Sourced<usize> = match (args.node_rank, alloc.and_then(|a| a.node_rank.clone()))
    {
        (Some(r), _) => Sourced::flag(r, "--node-rank"),
        (None, Some(r)) if is_static => r,
        (None, _) => Sourced::default(0, "node 0"),
    };
    let args_nnodes = nnodes.value;
    let node_rank_value = node_rank.value;

    let explicit_id = match (&args.run_id, &args.rdzv_id) {
        (Some(a), Some(b)) if a != b => {
            return Err(format!(
                "--run-id {a:?} and --rdzv-id {b:?} disagree; they name the same thing, give one"
            ));
        }
        (Some(id), _) => Some(Sourced::flag(id.clone(), "--run-id")),
        (None, Some(id)) => Some(Sourced::flag(id.clone(), "--rdzv-id")),
        (None, None) => match std::env::var("RELAUNCH_RUN_ID")
            .ok()
            .filter(|id| !id.is_empty())
        {
            Some(id) => Some(Sourced::flag(id, "$RELAUNCH_RUN_ID")),
            None => alloc.map(|a| a.run_id.clone()),
        },
    };
    let rdzv_conf = parse_rdzv_conf(&args.rdzv_conf)?;
    let single_node = args_nnodes.max == 1;
    // Every node must agree without talking first: torchrun's "none" on
    // several nodes, a fresh id on one.
    let explicit = explicit_id.is_some();
    let run_id = explicit_id.unwrap_or_else(|| {
        if single_node {
            Sourced::default(new_run_id(), "a new id (one node)")
        } else {
            Sourced::default("none".into(), "torchrun's on several nodes")
        }
    });
    // The scheduler's host and port matter where nodes must meet.
    let alloc_addr = alloc
        .and_then(|a| a.master_addr.clone())
        .filter(|_| !single_node);
    let alloc_port = alloc
        .and_then(|a| a.master_port.clone())
        .filter(|_| !single_node);

    let rendezvous = if args.standalone {
        if !single_node {
            return Err(format!(
                "--standalone runs one node, but --nnodes is {}:{}",
                args_nnodes.min, args_nnodes.max
            ));
        }
        note(
            "rendezvous",
            "standalone".into(),
            Source::Flag("--standalone"),
        );
        RendezvousConfig::Static {
            master_addr: "localhost".into(),
            master_port: None,
        }
    } else {
        match args.rdzv_backend {
            RdzvBackend::Static => {
                if let Some(endpoint) = &args.rdzv_endpoint {
                    return Err(format!(
                        "--rdzv-endpoint {endpoint} goes with --rdzv-backend c10d; for static \
                         rendezvous give --master-addr and --master-port"
                    ));
                }
                let master_port = match (args.master_port, alloc_port, single_node) {
                    (Some(port), _, _) => Sourced::flag(Some(port), "--master-port"),
                    (None, Some(port), _) => Sourced {
                        value: Some(port.value),
                        source: port.source,
                    },
                    (None, None, true) => Sourced::default(None, "a free port (one node)"),
                    (None, None, false) => {
                        Sourced::default(Some(DEFAULT_MASTER_PORT), "torchrun's on several nodes")
                    }
                };
                let master_addr = match (&args.master_addr, alloc_addr) {
                    (Some(addr), _) => Sourced::flag(addr.clone(), "--master-addr"),
                    (None, Some(addr)) => addr,
                    (None, None) if single_node => Sourced::default("localhost".into(), "one node"),
                    (None, None) => {
                        if node_rank_value > 0 {
                            return Err("a node other than 0 needs --master-addr: the address of \
                                        node 0"
                                .into());
                        }
                        Sourced::default("127.0.0.1".into(), "node 0 hosts the store")
                    }
                };
                note(
                    "rendezvous",
                    "static".into(),
                    Source::Default("--rdzv-backend".into()),
                );
                note("master_addr", master_addr.value.clone(), master_addr.source);
                note(
                    "master_port",
                    master_port
                        .value
                        .map_or_else(|| "(free port)".to_owned(), |p| p.to_string()),
                    master_port.source,
                );
                RendezvousConfig::Static {
                    master_addr: master_addr.value,
                    master_port: master_port.value,
                }
            }
            RdzvBackend::C10d | RdzvBackend::Etcd | RdzvBackend::EtcdV2 => {
                let from_scheduler = match (alloc_addr, alloc_port) {
                    (Some(addr), Some(port)) => Some(Sourced {
                        value: format!("{}:{}", addr.value, port.value),
                        source: addr.source,
                    }),
                    _ => None,
                };
                let endpoint = match (&args.rdzv_endpoint, from_scheduler) {
                    (Some(e), _) => Sourced::flag(e.clone(), "--rdzv-endpoint"),
                    (None, Some(e)) => e,
                    (None, None) if single_node => {
                        Sourced::default("localhost:0".into(), "one node")
                    }
                    (None, None) => {
                        return Err("--rdzv-backend c10d needs --rdzv-endpoint HOST:PORT".into());
                    }
                };
                let (host, port) = parse_endpoint(&endpoint.value)?;
                if args.node_rank.is_some_and(|r| r != 0) {
                    return Err(
                        "--node-rank is for static rendezvous; with c10d, ranks are given out \
                         when nodes join (drop --node-rank)"
                            .into(),
                    );
                }
                note("rendezvous", "c10d".into(), Source::Flag("--rdzv-backend"));
                note("rdzv_endpoint", endpoint.value.clone(), endpoint.source);
                RendezvousConfig::Dynamic {
                    host,
                    port,
                    id: run_id.value.clone(),
                    conf: rdzv_conf,
                }
            }
        }
    };
    check_run_id(&run_id.value)?;
    let signals = match (
        &args.signals_to_handle,
        alloc.and_then(|a| a.stop_signals.clone()),
    ) {
        (Some(text), _) => Sourced::flag(
            parse_signals(text).map_err(|e| format!("--signals-to-handle: {e}"))?,
            "--signals-to-handle",
        ),
        (None, extra) => {
            let mut list =
                parse_signals(DEFAULT_SIGNALS).map_err(|e| format!("--signals-to-handle: {e}"))?;
            match extra {
                Some(extra) => {
                    list.extend(
                        extra
                            .value
                            .iter()
                            .filter(|s| !list.contains(s))
                            .collect::<Vec<_>>(),
                    );
                    Sourced {
                        value: list,
                        source: extra.source,
                    }
                }
                None => Sourced::default(list, "torchrun's"),
            }
        }
    };
    // One node asks for the requeue: node 0 of the allocation.
    let requeue = if args.requeue_on_preempt {
        let Some(alloc) = alloc else {
            return Err(
                "--requeue-on-preempt needs a scheduler that can requeue the job: run it \
                        inside a SLURM allocation (SLURM_JOB_ID is not set)"
                    .into(),
            );
        };
        let scheduler_node = alloc.node_rank.as_ref().map_or(0, |r| r.value);
        (node_rank_value == 0 && scheduler_node == 0)
            .then(|| alloc.requeue.clone())
            .flatten()
    } else {
        None
    };
    let python = context.python();
    let (script, script_args) = args.script_and_args();
    let entrypoint = Entrypoint::new(python, script, script_args, args.module, args.no_python)
        .map_err(|e| e.to_string())?;

    let shutdown_timeout = match args.shutdown_timeout {
        Some(seconds) => seconds,
        None => match std::env::var("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
            Ok(text) => text.parse().map_err(|_| {
                format!("TORCH_ELASTIC_SHUTDOWN_TIMEOUT={text:?} is not a number of seconds")
            })?,
            Err(_) => DEFAULT_SHUTDOWN_TIMEOUT,
        },
    };
    let tracking = tracking(args, args_nnodes, &run_id.value, explicit)?;
    let tier = snapshot_tier(args)?;
    sources.insert(0, ("run_id", run_id.value.clone(), run_id.source));
    sources.insert(1, ("nnodes", node_range_text(args_nnodes), nnodes.source));
    sources.insert(
        2,
        ("node_rank", node_rank_value.to_string(), node_rank.source),
    );
    sources.insert(
        3,
        ("nproc_per_node", nproc_per_node.to_string(), nproc.source),
    );
    sources.push((
        "signals_to_handle",
        signal_list(&signals.value),
        signals.source,
    ));
    sources.push((
        "requeue_on_preempt",
        match (&requeue, args.requeue_on_preempt) {
            (Some(r), _) => r.argv.join(" "),
            (None, true) => "no (not node 0: node 0 requeues)".into(),
            (None, false) => "no".into(),
        },
        if args.requeue_on_preempt {
            Source::Flag("--requeue-on-preempt")
        } else {
            Source::Default("off".into())
        },
    ));
    sources.push(("snapshot_memory", tier.shown, tier.source));
    sources.push(warm_restarts_source(args));
    let config = LaunchConfig {
        nproc_per_node,
        nnodes: args_nnodes,
        node_rank: node_rank_value,
        rendezvous,
        run_id: run_id.value,
        role: args.role.clone(),
        max_restarts: args.max_restarts,
        monitor_interval: seconds("--monitor-interval", args.monitor_interval)?,
        shutdown_timeout: seconds("--shutdown-timeout", shutdown_timeout)?,
        hang_timeout: match args.hang_timeout {
            None => Some(relaunch_launch::hang::DEFAULT_HANG_TIMEOUT),
            Some(0.0) => None,
            Some(s) => Some(seconds("--hang-timeout", s)?),
        },
        startup_timeout: args
            .startup_timeout
            .map(|s| seconds("--startup-timeout", s))
            .transpose()?
            .filter(|t| !t.is_zero()),
        log_dir: args.log_dir.clone(),
        redirects: args.redirects.clone(),
        tee: args.tee.clone(),
        local_ranks_filter: args
            .local_ranks_filter
            .as_deref()
            .map(parse_ranks)
            .transpose()?,
        log_line_prefix_template: args
            .log_line_prefix_template
            .clone()
            .unwrap_or_else(|| DEFAULT_PREFIX_TEMPLATE.into()),
        signals: signals.value,
        entrypoint,
        tracking,
        duplicate_filters: DuplicateFilters {
            stdout: args
                .duplicate_stdout_filters
                .as_deref()
                .map(parse_filters)
                .unwrap_or_default(),
            stderr: args
                .duplicate_stderr_filters
                .as_deref()
                .map(parse_filters)
                .unwrap_or_default(),
        },
        virtual_local_rank: args.virtual_local_rank,
        worker_tty: match args.worker_tty {
            WorkerTtyChoice::Auto => WorkerTty::Auto,
            WorkerTtyChoice::Always => WorkerTty::Always,
            WorkerTtyChoice::Never => WorkerTty::Never,
        },
        snapshot: tier.config,
        warm_restarts: args.warm_restarts == WarmRestarts::On,
    };
    config.validate().map_err(|e| e.to_string())?;
    if args.virtual_local_rank
        && let Ok(list) = std::env::var("CUDA_VISIBLE_DEVICES")
        && list.split(',').count() < config.nproc_per_node
    {
        return Err(format!(
            "--virtual-local-rank gives each of the {} workers one GPU of \
             CUDA_VISIBLE_DEVICES={list}, which lists fewer; list one per worker or lower \
             --nproc-per-node",
            config.nproc_per_node
        ));
    }
    Ok(Resolved {
        config,
        sources,
        requeue,
        scheduler: alloc.map(|a| a.scheduler),
        warnings: tier.warning.into_iter().collect(),
    })
}

/// What `--print-config` says of `--warm-restarts`: whether restarted
/// workers fork from a warm interpreter, and why not where they cannot.
fn warm_restarts_source(args: &RunArgs) -> (&'static str, String, Source) {
    let shown = if args.warm_restarts == WarmRestarts::Off {
        "off".to_owned()
    } else if args.no_python {
        "off (--no-python: no Python to keep warm)".to_owned()
    } else if args.max_restarts == 0 && args.nnodes.is_none_or(|n| n.min == n.max) {
        "on (unused: --max-restarts 0 never restarts)".to_owned()
    } else {
        "on".to_owned()
    };
    let source = if args.warm_restarts == WarmRestarts::Off {
        Source::Flag("--warm-restarts")
    } else {
        Source::Default("on".into())
    };
    ("warm_restarts", shown, source)
}

/// `--snapshot-memory`, resolved: the memory tier of checkpoints.
struct Tier {
    config: Option<SnapshotConfig>,
    /// What `--print-config` shows, and where it came from.
    shown: String,
    source: Source,
    /// Why the default has no tier here.
    warning: Option<String>,
}

/// `--snapshot-memory` (or `RELAUNCH_SNAPSHOT_MEMORY`) against what this
/// node has: the root's free space and its memory. Directories that dead
/// launchers left in the root are swept first, since they take the space
/// measured here (not for `--print-config`, which starts nothing).
fn snapshot_tier(args: &RunArgs) -> Result<Tier, String> {
    let root = snapshot::root(|name| std::env::var(name).ok());
    let requested = args
        .snapshot_memory
        .map(|n| u64::try_from(n).unwrap_or(u64::MAX));
    let decision = if requested == Some(0) {
        Decision::Off
    } else {
        if !args.print_config {
            snapshot::sweep(&root, &snapshot::Here::probe());
        }
        snapshot::decide(
            requested,
            snapshot::node_memory(),
            &root,
            &RootSpace::probe(&root),
        )?
    };
    let source = match requested {
        Some(_) => Source::Flag("--snapshot-memory"),
        None => Source::Default(format!(
            "a quarter of memory, at most what {} has free",
            root.display()
        )),
    };
    let required = requested.is_some();
    Ok(match decision {
        Decision::Budget(budget) => Tier {
            shown: format!("{} in {}", snapshot::human(budget), root.display()),
            config: Some(SnapshotConfig {
                root,
                budget,
                required,
            }),
            source,
            warning: None,
        },
        Decision::Off => Tier {
            config: None,
            shown: "off".into(),
            source,
            warning: None,
        },
        Decision::Unavailable(why) => Tier {
            config: None,
            shown: format!("off ({} cannot hold it)", root.display()),
            source,
            warning: Some(format!("relaunch: warning: {why}")),
        },
    })
}

/// One line for each torchrun flag given that relaunch accepts but does
/// not act on, saying what it does instead, so a torchrun command line runs
/// unchanged and nothing is silently ignored.
fn compat_notices(args: &RunArgs) -> Vec<String> {
    let mut lines = Vec::new();
    let mut say = |text: String| lines.push(format!("relaunch: warning: {text}"));
    if let Some(addr) = &args.local_addr {
        say(format!(
            "--local-addr {addr} has no effect: workers reach the store at the rendezvous host, \
             and Gloo/NCCL choose interfaces from GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME"
        ));
    }
    if matches!(args.rdzv_backend, RdzvBackend::Etcd | RdzvBackend::EtcdV2) {
        say(
            "--rdzv-backend etcd: relaunch needs no etcd server; nodes meet through relaunch's \
             own store at --rdzv-endpoint, hosted by the launcher on that host (as with c10d)"
                .into(),
        );
    }
    if let Some(name) = &args.logs_specs {
        say(format!(
            "--logs-specs {name} is not loaded: relaunch writes LOG_DIR/RUN_ID_XXXXXX/attempt_N/RANK/ \
             {{stdout,stderr}}.log itself (--log-dir, --redirects, --tee)"
        ));
    }
    if let Some(name) = &args.event_log_handler {
        say(format!(
            "--event-log-handler {name} is not used: relaunch records the job's events \
             (attempts, restarts, exits, root causes) in its run with --server, and on the console"
        ));
    }
    if let Some(mode) = &args.numa_binding {
        say(format!(
            "--numa-binding {mode}: relaunch does not bind workers to CPUs; to bind, run the \
             script under numactl with --no-python"
        ));
    }
    if args.start_method.is_some() {
        say("--start-method has no effect: a script always runs in new processes".into());
    }
    if args.run_path {
        say("--run-path: the script runs in a new Python process, as without it".into());
    }
    lines
}

/// torchrun's `--duplicate-*-filters`: comma-separated strings, `,,` for a
/// comma; empty ones are dropped (an empty list duplicates nothing).
fn parse_filters(text: &str) -> Vec<String> {
    let mut filters = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                current.push(',');
            } else {
                filters.push(std::mem::take(&mut current));
            }
        } else {
            current.push(c);
        }
    }
    filters.push(current);
    filters.retain(|f| !f.is_empty());
    filters
}

fn node_range_text(n: NodeRange) -> String {
    if n.min == n.max {
        n.min.to_string()
    } else {
        format!("{}:{}", n.min, n.max)
    }
}

fn signal_list(signals: &[nix::sys::signal::Signal]) -> String {
    signals
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn new_run_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn check_run_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && id != "."
        && id != "..";
    if ok {
        Ok(())
    } else {
        Err(format!(
            "run id {id:?} must be 1 to 128 letters, digits, '-', '_' or '.' (it names the log directory and store keys)"
        ))
    }
}

/// `--sync-dir`: the folder, its prefix in the run (its name; on several
/// nodes under this node's hostname) and the pass interval.
fn sync_dir(args: &RunArgs, config: &LaunchConfig) -> Result<Option<sync_dir::SyncDir>, String> {
    let Some(dir) = &args.sync_dir else {
        return Ok(None);
    };
    if config.tracking.is_none() {
        return Err(format!(
            "--sync-dir {} mirrors the folder to the job's run on a tracking server: give \
             --server URL (or set RELAUNCH_SERVER)",
            dir.display()
        ));
    }
    let every = seconds("--sync-every", args.sync_every)?;
    if every.is_zero() {
        return Err("--sync-every 0: give the seconds between passes, e.g. 60".into());
    }
    let dir = std::path::absolute(dir).map_err(|e| format!("--sync-dir {}: {e}", dir.display()))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| {
            format!(
                "--sync-dir {}: the folder has no name to file it under",
                dir.display()
            )
        })?;
    let prefix = if config.nnodes.max > 1 {
        let host = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("node{}", config.node_rank));
        format!("{host}/{name}")
    } else {
        name
    };
    relaunch_api::files::check_file_name(&prefix).map_err(|e| {
        format!(
            "--sync-dir {}: the run's files would be named {e}",
            dir.display()
        )
    })?;
    Ok(Some(sync_dir::SyncDir { dir, prefix, every }))
}

/// `--server` and its companions; `None` without a server.
fn tracking(
    args: &RunArgs,
    nnodes: NodeRange,
    run_id: &str,
    explicit_id: bool,
) -> Result<Option<TrackingConfig>, String> {
    let Some(server) = args.server.as_deref().filter(|s| !s.trim().is_empty()) else {
        return Ok(None);
    };
    let server = normalize_server(server).map_err(|e| format!("--server: {e}"))?;
    if nnodes.max > 1 && !explicit_id {
        return Err(format!(
            "--server with several nodes needs --run-id (the same on every node): without it every \
             job is run {run_id:?} and they would all log to one run"
        ));
    }
    if let Some(project) = &args.project {
        relaunch_api::names::check_name("project", project)
            .map_err(|e| format!("--project: {e}"))?;
    }
    let token = args
        .token
        .clone()
        .or_else(|| std::env::var(TOKEN_ENV).ok())
        .filter(|t| !t.trim().is_empty());
    let dir = args
        .tracking_dir
        .clone()
        .unwrap_or_else(relaunch_client::local::default_dir);
    // Workers may change directory; they get it absolute.
    let dir =
        std::path::absolute(&dir).map_err(|e| format!("--tracking-dir {}: {e}", dir.display()))?;
    let exit_timeout = match std::env::var(EXIT_TIMEOUT_ENV) {
        Ok(text) if !text.trim().is_empty() => text
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .ok_or_else(|| {
                format!("{EXIT_TIMEOUT_ENV}={text:?} is not a number of seconds >= 0")
            })?,
        _ => DEFAULT_EXIT_TIMEOUT,
    };
    Ok(Some(TrackingConfig {
        server,
        token,
        project: args.project.clone().filter(|p| !p.is_empty()),
        dir,
        system_interval: seconds("--system-metrics-interval", args.system_metrics_interval)?,
        exit_timeout,
    }))
}

fn seconds(flag: &str, value: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| format!("{flag} {value} is not a number of seconds >= 0"))
}

fn parse_endpoint(endpoint: &str) -> Result<(String, u16), String> {
    let bad = || {
        format!("--rdzv-endpoint {endpoint:?} is not HOST:PORT (e.g. node0:29400 or [::1]:29400)")
    };
    let (host, port) = endpoint.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_owned(), port.parse().map_err(|_| bad())?))
}

fn parse_ranks(text: &str) -> Result<BTreeSet<usize>, String> {
    text.split(',')
        .map(|r| {
            r.trim()
                .parse::<usize>()
                .map_err(|_| format!("--local-ranks-filter {text:?}: {r:?} is not a local rank"))
        })
        .collect()
}

fn parse_rdzv_conf(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .filter(|kv| !kv.trim().is_empty())
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("--rdzv-conf {text:?}: {kv:?} is not KEY=VALUE"))?;
            Ok((k.trim().to_owned(), v.trim().to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn resolved(argv: &[&str]) -> Result<LaunchConfig, String> {
        resolved_in(&[], argv).map(|r| r.config)
    }

    /// Resolves `argv` with `env` as the scheduler's environment.
    fn resolved_in(env: &[(&str, &str)], argv: &[&str]) -> Result<Resolved, String> {
        let mut full = vec!["relaunch", "run"];
        full.extend_from_slice(argv);
        let cli = Cli::try_parse_from(full).map_err(|e| e.to_string())?;
        let Command::Run(args) = cli.command else {
            panic!("not a run command");
        };
        let env: std::collections::HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        resolve(
            &args,
            &Context {
                python: Some("py".into()),
            },
            &|name| env.get(name).cloned(),
        )
    }

    #[test]
    fn duplicate_filters_split_on_commas_and_keep_doubled_ones() {
        assert_eq!(parse_filters("apple,orange"), ["apple", "orange"]);
        assert_eq!(parse_filters("a,,b,c"), ["a,b", "c"]);
        assert_eq!(parse_filters(""), Vec::<String>::new());
        assert_eq!(parse_filters(",loss,"), ["loss"]);
        let c = resolved(&["--duplicate-stdout-filters", "loss,,x,step", "t.py"]).unwrap();
        assert_eq!(c.duplicate_filters.stdout, ["loss,x", "step"]);
        assert!(c.duplicate_filters.stderr.is_empty());
    }

    #[test]
    fn torchrun_flags_relaunch_does_not_act_on_each_get_one_line() {
        let cli = Cli::try_parse_from([
            "relaunch",
            "run",
            "--logs-specs",
            "mine",
            "--event-log-handler",
            "console",
            "--numa-binding",
            "node",
            "--local-addr",
            "10.0.0.1",
            "--rdzv-backend",
            "etcd-v2",
            "--rdzv-endpoint",
            "h:2379",
            "t.py",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not a run command");
        };
        let lines = compat_notices(&args);
        assert_eq!(lines.len(), 5, "{lines:#?}");
        for (line, flag) in lines.iter().zip([
            "--local-addr",
            "--rdzv-backend etcd",
            "--logs-specs",
            "--event-log-handler",
            "--numa-binding",
        ]) {
            assert!(line.starts_with("relaunch: warning: "), "{line}");
            assert!(line.contains(flag), "{line}");
        }
        let plain = Cli::try_parse_from(["relaunch", "run", "t.py"]).unwrap();
        let Command::Run(plain) = plain.command else {
            panic!("not a run command");
        };
        assert!(compat_notices(&plain).is_empty());
        // etcd runs relaunch's own c10d rendezvous at the endpoint.
        let c = resolved(&[
            "--rdzv-backend",
            "etcd",
            "--rdzv-endpoint",
            "h:2379",
            "t.py",
        ])
        .unwrap();
        assert!(
            matches!(c.rendezvous, RendezvousConfig::Dynamic { ref host, port: 2379, .. } if host == "h")
        );
    }

    const SLURM_TWO_NODES: &[(&str, &str)] = &[
        ("SLURM_JOB_ID", "777"),
        ("SLURM_NNODES", "2"),
        ("SLURM_NODEID", "1"),
        ("SLURM_JOB_NODELIST", "gpu[09-10]"),
        ("SLURM_NTASKS_PER_NODE", "4"),
    ];

    #[test]
    fn inside_slurm_the_allocation_fills_in_the_node_flags() {
        let r = resolved_in(SLURM_TWO_NODES, &["t.py"]).unwrap();
        let c = &r.config;
        assert_eq!((c.nnodes.max, c.node_rank, c.nproc_per_node), (2, 1, 4));
        assert_eq!(c.run_id, "slurm-777");
        assert_eq!(
            c.rendezvous,
            RendezvousConfig::Static {
                master_addr: "gpu09".into(),
                master_port: Some(10_777)
            }
        );
        assert!(c.signals.contains(&nix::sys::signal::Signal::SIGUSR1));
        assert_eq!(r.scheduler, Some("SLURM"));
        let report = r.report();
        for needle in [
            "inside SLURM",
            "run_id               slurm-777",
            "<- $SLURM_JOB_ID",
            "nnodes               2",
            "<- $SLURM_NNODES",
            "<- $SLURM_NODEID",
            "<- $SLURM_NTASKS_PER_NODE",
            "gpu09",
            "<- $SLURM_JOB_NODELIST (first of 2 host(s))",
            "10777",
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        ] {
            assert!(report.contains(needle), "{needle:?} not in\n{report}");
        }
        // Only node 0 requeues.
        let r = resolved_in(SLURM_TWO_NODES, &["--requeue-on-preempt", "t.py"]).unwrap();
        assert_eq!(r.requeue, None);
        assert!(r.report().contains("not node 0"));
    }

    #[test]
    fn in_a_kubernetes_indexed_job_the_pod_gives_its_node_rank_and_the_run() {
        // The master's address needs the pod's /etc/hosts (kubernetes.rs
        // tests it); here the Job's command names it, as the example does.
        let pod = &[("JOB_COMPLETION_INDEX", "1"), ("HOSTNAME", "train-1")];
        let r = resolved_in(
            pod,
            &["--nnodes", "2", "--master-addr", "train-0.trainers", "t.py"],
        )
        .unwrap();
        let c = &r.config;
        assert_eq!((c.nnodes.max, c.node_rank), (2, 1));
        assert_eq!(c.run_id, "k8s-train");
        assert_eq!(r.scheduler, Some("Kubernetes"));
        let report = r.report();
        for needle in ["<- $JOB_COMPLETION_INDEX", "k8s-train", "train-0.trainers"] {
            assert!(report.contains(needle), "{needle:?} not in\n{report}");
        }
    }

    #[test]
    fn flags_win_over_slurm() {
        let r = resolved_in(
            SLURM_TWO_NODES,
            &[
                "--nnodes",
                "3",
                "--node-rank",
                "2",
                "--nproc-per-node",
                "1",
                "--master-addr",
                "head",
                "--master-port",
                "1234",
                "--run-id",
                "mine",
                "--signals-to-handle",
                "SIGTERM",
                "t.py",
            ],
        )
        .unwrap();
        let c = &r.config;
        assert_eq!((c.nnodes.max, c.node_rank, c.nproc_per_node), (3, 2, 1));
        assert_eq!(c.run_id, "mine");
        assert_eq!(
            c.rendezvous,
            RendezvousConfig::Static {
                master_addr: "head".into(),
                master_port: Some(1234)
            }
        );
        assert_eq!(c.signals, [nix::sys::signal::Signal::SIGTERM]);
        let report = r.report();
        assert!(!report.contains("$SLURM"), "{report}");
        assert!(report.contains("<- flag --master-port"), "{report}");
    }

    #[test]
    fn one_slurm_node_keeps_a_free_port_and_requeues() {
        let env = &[
            ("SLURM_JOB_ID", "5"),
            ("SLURM_NNODES", "1"),
            ("SLURM_NODEID", "0"),
        ];
        let r = resolved_in(env, &["--requeue-on-preempt", "t.py"]).unwrap();
        assert_eq!(
            r.config.rendezvous,
            RendezvousConfig::Static {
                master_addr: "localhost".into(),
                master_port: None
            }
        );
        assert_eq!(r.config.run_id, "slurm-5");
        assert_eq!(r.requeue.unwrap().argv, ["scontrol", "requeue", "5"]);
    }

    #[test]
    fn c10d_inside_slurm_meets_at_the_first_host() {
        let r = resolved_in(SLURM_TWO_NODES, &["--rdzv-backend", "c10d", "t.py"]).unwrap();
        let RendezvousConfig::Dynamic { host, port, id, .. } = r.config.rendezvous else {
            panic!("not dynamic");
        };
        assert_eq!(
            (host.as_str(), port, id.as_str()),
            ("gpu09", 10_777, "slurm-777")
        );
        assert_eq!(r.config.node_rank, 0);
    }

    #[test]
    fn slurm_mistakes_are_usage_errors() {
        let mut env = SLURM_TWO_NODES.to_vec();
        env[2] = ("SLURM_NODEID", "2");
        let err = resolved_in(&env, &["t.py"]).unwrap_err();
        assert!(
            err.contains("SLURM_NODEID=2 is out of range for 2 node(s)"),
            "{err}"
        );
        env[2] = ("SLURM_NODEID", "0");
        env[3] = ("SLURM_JOB_NODELIST", "gpu[09-10");
        let err = resolved_in(&env, &["t.py"]).unwrap_err();
        assert!(
            err.contains("SLURM_JOB_NODELIST: hostlist \"gpu[09-10\""),
            "{err}"
        );
        let err = resolved_in(&[], &["--requeue-on-preempt", "t.py"]).unwrap_err();
        assert!(err.contains("SLURM_JOB_ID is not set"), "{err}");
    }

    #[test]
    fn one_node_picks_a_free_port_and_a_fresh_id() {
        let c = resolved(&["--nproc-per-node", "2", "t.py"]).unwrap();
        assert_eq!(
            c.rendezvous,
            RendezvousConfig::Static {
                master_addr: "localhost".into(),
                master_port: None
            }
        );
        assert_eq!(c.run_id.len(), 36);
        assert_eq!(c.entrypoint.program, "py");
        assert_eq!(c.entrypoint.args, ["-u", "t.py"]);
    }

    #[test]
    fn contradictions_are_refused() {
        for (argv, needle) in [
            (&["--no-python", "-m", "x"][..], "contradict"),
            (
                &[
                    "--nnodes",
                    "2",
                    "--node-rank",
                    "2",
                    "--master-addr",
                    "h",
                    "t.py",
                ][..],
                "out of range",
            ),
            (&["--nnodes", "1:2", "t.py"][..], "needs dynamic rendezvous"),
            (
                &["--standalone", "--nnodes", "2", "t.py"][..],
                "--standalone runs one node",
            ),
            (&["--run-id", "a", "--rdzv-id", "b", "t.py"][..], "disagree"),
            (&["--run-id", "../x", "t.py"][..], "must be 1 to 128"),
            (
                &["--rdzv-endpoint", "h:1", "t.py"][..],
                "goes with --rdzv-backend c10d",
            ),
            (
                &[
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    "nohost",
                    "t.py",
                ][..],
                "is not HOST:PORT",
            ),
            (
                &["--nproc-per-node", "2", "--local-ranks-filter", "5", "t.py"][..],
                "only 2 workers",
            ),
            (
                &["--signals-to-handle", "SIGKILL", "t.py"][..],
                "cannot be handled",
            ),
            (
                &["--nnodes", "2", "--node-rank", "1", "t.py"][..],
                "needs --master-addr",
            ),
            (
                &["--shutdown-timeout=-1", "t.py"][..],
                "--shutdown-timeout -1",
            ),
        ] {
            let err = resolved(argv).unwrap_err();
            assert!(err.contains(needle), "{argv:?}: {err}");
        }
    }

    #[test]
    fn the_memory_tier_is_resolved_with_its_source() {
        let off = resolved_in(&[], &["--snapshot-memory", "0", "t.py"]).unwrap();
        assert_eq!(off.config.snapshot, None);
        assert!(off.warnings.is_empty());
        let report = off.report();
        assert!(
            report.contains("snapshot_memory      off")
                && report.contains("<- flag --snapshot-memory"),
            "{report}"
        );
        // More than any root has free: refused before anything starts.
        let err = resolved(&["--snapshot-memory", "1000000GiB", "t.py"]).unwrap_err();
        assert!(
            err.starts_with("--snapshot-memory 1000000.0 GiB (1073741824000000 bytes)"),
            "{err}"
        );
        // The default: a tier, or a warning saying why there is none.
        let default = resolved_in(&[], &["--print-config", "t.py"]).unwrap();
        match &default.config.snapshot {
            Some(tier) => {
                assert!(tier.budget > 0 && !tier.required);
                assert!(default.warnings.is_empty());
            }
            None => assert!(default.warnings[0].starts_with("relaunch: warning: ")),
        }
        assert!(
            default.report().contains("<- default (a quarter of memory"),
            "{}",
            default.report()
        );
    }

    #[test]
    fn several_static_nodes_default_like_torchrun() {
        let c = resolved(&[
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "n0",
            "t.py",
        ])
        .unwrap();
        assert_eq!(
            c.rendezvous,
            RendezvousConfig::Static {
                master_addr: "n0".into(),
                master_port: Some(29500)
            }
        );
        assert_eq!(c.run_id, "none");
    }
}

//! `relaunch run`: torchrun's flags resolved into a launch, the same way
//! torchrun resolves them, then the launch itself.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::time::Duration;

use anyhow::Context as _;
use relaunch_client::http::{TOKEN_ENV, normalize_server};
use relaunch_client::local::DEFAULT_DIR;
use relaunch_launch::config::{
    DEFAULT_PREFIX_TEMPLATE, Entrypoint, LaunchConfig, RendezvousConfig, parse_signals,
};
use relaunch_launch::tracking::{DEFAULT_EXIT_TIMEOUT, EXIT_TIMEOUT_ENV};
use relaunch_launch::{LaunchError, TrackingConfig};

use crate::Context;
use crate::cli::{RdzvBackend, RunArgs};

/// torchrun's store port when none is given on several nodes.
const DEFAULT_MASTER_PORT: u16 = 29500;
/// torchrun's `--shutdown-timeout` default.
const DEFAULT_SHUTDOWN_TIMEOUT: f64 = 30.0;

/// Runs the job; returns the launcher's exit code.
pub(crate) fn run(args: &RunArgs, context: &Context) -> anyhow::Result<u8> {
    let config = resolve(args, context).map_err(UsageError)?;
    // A runtime on this thread: workers are spawned from it, and the kernel
    // sends their death signal when the spawning thread ends, so it must be
    // the thread that lives as long as the launcher.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime.block_on(relaunch_launch::launch(config));
    match outcome {
        Ok(outcome) => Ok(outcome.exit_code()),
        Err(LaunchError::Config(message)) => Err(UsageError(message).into()),
        Err(e) => Err(e.into()),
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

/// torchrun's resolution of its flags, plus checks it lacks.
fn resolve(args: &RunArgs, context: &Context) -> Result<LaunchConfig, String> {
    let nproc_per_node = args.nproc_per_node.resolve().map_err(|e| e.to_string())?;
    let explicit_id = match (&args.run_id, &args.rdzv_id) {
        (Some(a), Some(b)) if a != b => {
            return Err(format!(
                "--run-id {a:?} and --rdzv-id {b:?} disagree; they name the same thing, give one"
            ));
        }
        (Some(id), _) | (None, Some(id)) => Some(id.clone()),
        (None, None) => std::env::var("RELAUNCH_RUN_ID")
            .ok()
            .filter(|id| !id.is_empty()),
    };
    let rdzv_conf = parse_rdzv_conf(&args.rdzv_conf)?;
    let single_node = args.nnodes.max == 1;
    // Every node must agree without talking first: torchrun's "none" on
    // several nodes, a fresh id on one.
    let explicit = explicit_id.is_some();
    let run_id = explicit_id.unwrap_or_else(|| {
        if single_node {
            new_run_id()
        } else {
            "none".into()
        }
    });

    let rendezvous = if args.standalone {
        if !single_node {
            return Err(format!(
                "--standalone runs one node, but --nnodes is {}:{}",
                args.nnodes.min, args.nnodes.max
            ));
        }
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
                let master_port = match (args.master_port, single_node) {
                    (Some(port), _) => Some(port),
                    (None, true) => None,
                    (None, false) => Some(DEFAULT_MASTER_PORT),
                };
                let master_addr = args.master_addr.clone().unwrap_or_else(|| {
                    if single_node {
                        "localhost"
                    } else {
                        "127.0.0.1"
                    }
                    .into()
                });
                if !single_node && args.node_rank > 0 && args.master_addr.is_none() {
                    return Err(
                        "a node other than 0 needs --master-addr: the address of node 0".into(),
                    );
                }
                RendezvousConfig::Static {
                    master_addr,
                    master_port,
                }
            }
            RdzvBackend::C10d => {
                let endpoint = args.rdzv_endpoint.as_deref().unwrap_or(if single_node {
                    "localhost:0"
                } else {
                    ""
                });
                if endpoint.is_empty() {
                    return Err("--rdzv-backend c10d needs --rdzv-endpoint HOST:PORT".into());
                }
                let (host, port) = parse_endpoint(endpoint)?;
                if args.node_rank != 0 {
                    return Err(
                        "--node-rank is for static rendezvous; with c10d, ranks are given out \
                         when nodes join (drop --node-rank)"
                            .into(),
                    );
                }
                RendezvousConfig::Dynamic {
                    host,
                    port,
                    id: run_id.clone(),
                    conf: rdzv_conf,
                }
            }
        }
    };
    check_run_id(&run_id)?;

    let python = std::env::var_os("PYTHON_EXEC")
        .or_else(|| context.python.clone())
        .unwrap_or_else(default_python);
    let entrypoint = Entrypoint::new(
        python,
        args.training_script.clone(),
        args.training_script_args.clone(),
        args.module,
        args.no_python,
    )
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
    let tracking = tracking(args, &run_id, explicit)?;
    let config = LaunchConfig {
        nproc_per_node,
        nnodes: args.nnodes,
        node_rank: args.node_rank,
        rendezvous,
        run_id,
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
        signals: parse_signals(&args.signals_to_handle)
            .map_err(|e| format!("--signals-to-handle: {e}"))?,
        entrypoint,
        tracking,
    };
    config.validate().map_err(|e| e.to_string())?;
    if let Some(addr) = &args.local_addr {
        // Accepted so that torchrun command lines work; say it does nothing.
        tracing::warn!(
            "--local-addr {addr} has no effect: workers reach the store at the rendezvous host, \
             and Gloo/NCCL choose interfaces from GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME"
        );
    }
    Ok(config)
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

fn default_python() -> OsString {
    // The cargo-built binary has no interpreter of its own; the Python
    // package passes the one it runs in.
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
    };
    if on_path("python3") {
        "python3"
    } else {
        "python"
    }
    .into()
}

/// `--server` and its companions; `None` without a server.
fn tracking(
    args: &RunArgs,
    run_id: &str,
    explicit_id: bool,
) -> Result<Option<TrackingConfig>, String> {
    let Some(server) = args.server.as_deref().filter(|s| !s.trim().is_empty()) else {
        return Ok(None);
    };
    let server = normalize_server(server).map_err(|e| format!("--server: {e}"))?;
    if args.nnodes.max > 1 && !explicit_id {
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
        .unwrap_or_else(|| DEFAULT_DIR.into());
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
        let mut full = vec!["relaunch", "run"];
        full.extend_from_slice(argv);
        let cli = Cli::try_parse_from(full).map_err(|e| e.to_string())?;
        let Command::Run(args) = cli.command else {
            panic!("not a run command");
        };
        resolve(
            &args,
            &Context {
                python: Some("py".into()),
            },
        )
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

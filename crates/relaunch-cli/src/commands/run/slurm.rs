//! SLURM: the launch as an allocation's variables describe it.
//!
//! Inside an allocation (`SLURM_JOB_ID` set, in an `sbatch` script or an
//! `srun` step), `relaunch run` needs no node flags:
//!
//! | setting | from |
//! |---|---|
//! | `--nnodes` | `SLURM_NNODES`, else `SLURM_JOB_NUM_NODES` |
//! | `--node-rank` | `SLURM_NODEID` (must be below the node count) |
//! | `--master-addr` | the first host of `SLURM_JOB_NODELIST` (several nodes) |
//! | `--master-port` | `10000 + SLURM_JOB_ID % 20000` (several nodes) |
//! | `--nproc-per-node` | `SLURM_GPUS_ON_NODE` when above 0, else `SLURM_NTASKS_PER_NODE`, else `SLURM_TASKS_PER_NODE` |
//! | `--run-id` | `slurm-$SLURM_JOB_ID` (kept across requeues) |
//! | `--signals-to-handle` | torchrun's, plus SIGUSR1 (`--signal=[B:]USR1@SECONDS`) |
//!
//! The port is derived from the job id so that every node computes the
//! same one without talking; 10000-29999 stays below Linux's ephemeral
//! range (32768 and up), and two jobs collide only when their ids differ
//! by a multiple of 20000 and they share node 0.

use nix::sys::signal::Signal;

use super::hostlist::HostList;
use super::scheduler::{Allocation, Requeue, Sourced};

/// The lowest port [`master_port`] gives.
pub(crate) const PORT_BASE: u16 = 10_000;
/// How many ports [`master_port`] spreads job ids over.
pub(crate) const PORT_SPAN: u16 = 20_000;

/// The store's port for job `job_id` when none is given.
pub(crate) fn master_port(job_id: u64) -> u16 {
    // The remainder is below PORT_SPAN, so it fits in a u16.
    PORT_BASE + u16::try_from(job_id % u64::from(PORT_SPAN)).unwrap_or(0)
}

/// The allocation, or `None` outside SLURM.
pub(crate) fn allocation(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Allocation>, String> {
    let Some(job_id_text) = env("SLURM_JOB_ID") else {
        return Ok(None);
    };
    let job_id: u64 = job_id_text
        .trim()
        .parse()
        .map_err(|_| format!("SLURM_JOB_ID={job_id_text:?} is not a job id (a number)"))?;
    let count = |var: &'static str| -> Result<Option<Sourced<usize>>, String> {
        env(var)
            .map(|text| {
                text.trim()
                    .parse::<usize>()
                    .map(|n| Sourced::scheduler(n, var, ""))
                    .map_err(|_| format!("{var}={text:?} is not a number"))
            })
            .transpose()
    };
    let nnodes = match count("SLURM_NNODES")? {
        Some(n) => Some(n),
        None => count("SLURM_JOB_NUM_NODES")?,
    };
    if let Some(n) = &nnodes
        && n.value == 0
    {
        return Err(format!("{} is 0; a job has at least one node", n.source));
    }
    let node_rank = count("SLURM_NODEID")?;
    if let (Some(rank), Some(n)) = (&node_rank, &nnodes)
        && rank.value >= n.value
    {
        return Err(format!(
            "SLURM_NODEID={} is out of range for {} node(s) ({}); run relaunch inside the job's \
             allocation, or give --node-rank and --nnodes",
            rank.value, n.value, n.source
        ));
    }
    let master_addr = match env("SLURM_JOB_NODELIST").or_else(|| env("SLURM_NODELIST")) {
        Some(text) => {
            let hosts = HostList::parse(&text).map_err(|e| format!("SLURM_JOB_NODELIST: {e}"))?;
            Some(Sourced::scheduler(
                hosts.first(),
                "SLURM_JOB_NODELIST",
                format!("first of {} host(s)", hosts.len()),
            ))
        }
        None => None,
    };
    let gpus = count("SLURM_GPUS_ON_NODE")?.filter(|g| g.value > 0);
    let nproc_per_node = match gpus {
        Some(g) => Some(g),
        None => tasks_per_node(env)?,
    };
    let port = master_port(job_id);
    Ok(Some(Allocation {
        scheduler: "SLURM",
        run_id: Sourced::scheduler(format!("slurm-{job_id}"), "SLURM_JOB_ID", ""),
        nnodes,
        node_rank,
        master_addr,
        master_port: Some(Sourced::scheduler(
            port,
            "SLURM_JOB_ID",
            format!("{PORT_BASE} + job id % {PORT_SPAN}"),
        )),
        nproc_per_node,
        stop_signals: Some(Sourced::scheduler(
            vec![Signal::SIGUSR1],
            "SLURM_JOB_ID",
            "SIGUSR1 added: sbatch --signal=[B:]USR1@SECONDS warns before the time limit",
        )),
        requeue: Some(Requeue {
            argv: vec!["scontrol".into(), "requeue".into(), job_id.to_string()],
            warning: Signal::SIGUSR1,
        }),
    }))
}

/// Workers per node from the task layout: `SLURM_NTASKS_PER_NODE` (set
/// when the job asked for `--ntasks-per-node`), else
/// `SLURM_TASKS_PER_NODE` (always set: `sbatch --ntasks=4 --nodes=2`
/// gives `2(x2)`). Slurm writes both `2` or, on uneven allocations,
/// `2(x3),1`; every node must then have the same count, as relaunch starts
/// the same number of workers on each.
fn tasks_per_node(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Sourced<usize>>, String> {
    let (var, text) = match (env("SLURM_NTASKS_PER_NODE"), env("SLURM_TASKS_PER_NODE")) {
        (Some(text), _) => ("SLURM_NTASKS_PER_NODE", text),
        (None, Some(text)) => ("SLURM_TASKS_PER_NODE", text),
        (None, None) => return Ok(None),
    };
    let bad = || format!("{var}={text:?} is not one count for every node; give --nproc-per-node");
    let mut counts = text.split(',').map(|part| {
        let number = part.trim().split_once('(').map_or(part.trim(), |(n, _)| n);
        number.parse::<usize>().map_err(|_| bad())
    });
    let first = counts.next().ok_or_else(bad)??;
    for n in counts {
        if n? != first {
            return Err(bad());
        }
    }
    if first == 0 {
        return Err(bad());
    }
    Ok(Some(Sourced::scheduler(first, var, "")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::run::scheduler::Source;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Result<Option<Allocation>, String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        allocation(&|name| map.get(name).cloned())
    }

    #[test]
    fn outside_slurm_there_is_no_allocation() {
        assert_eq!(from(&[("SLURM_NNODES", "2")]), Ok(None));
    }

    #[test]
    fn an_sbatch_environment() {
        let a = from(&[
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_NNODES", "4"),
            ("SLURM_NODEID", "2"),
            ("SLURM_JOB_NODELIST", "gpu[07-08,10],cpu3"),
            ("SLURM_GPUS_ON_NODE", "8"),
            ("SLURM_NTASKS_PER_NODE", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(a.run_id.value, "slurm-4242");
        assert_eq!(a.nnodes.unwrap().value, 4);
        assert_eq!(a.node_rank.unwrap().value, 2);
        let addr = a.master_addr.unwrap();
        assert_eq!(addr.value, "gpu07");
        assert_eq!(
            addr.source.to_string(),
            "$SLURM_JOB_NODELIST (first of 4 host(s))"
        );
        let nproc = a.nproc_per_node.unwrap();
        assert_eq!(nproc.value, 8);
        assert_eq!(
            nproc.source,
            Source::Scheduler {
                var: "SLURM_GPUS_ON_NODE",
                how: String::new()
            }
        );
        assert_eq!(a.master_port.unwrap().value, 10_000 + 4242);
        let requeue = a.requeue.unwrap();
        assert_eq!(requeue.argv, ["scontrol", "requeue", "4242"]);
        assert_eq!(requeue.warning, Signal::SIGUSR1);
    }

    #[test]
    fn fallbacks() {
        let a = from(&[
            ("SLURM_JOB_ID", "30001"),
            ("SLURM_JOB_NUM_NODES", "1"),
            ("SLURM_GPUS_ON_NODE", "0"),
            ("SLURM_NTASKS_PER_NODE", "2(x3)"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(a.nnodes.unwrap().value, 1);
        assert_eq!(a.nproc_per_node.unwrap().value, 2);
        assert_eq!(a.master_port.unwrap().value, 10_000 + 10_001);
        assert!(a.node_rank.is_none() && a.master_addr.is_none());
    }

    #[test]
    fn tasks_per_node_when_the_job_gave_only_a_task_count() {
        // `sbatch --nodes=2 --ntasks=4`: no SLURM_NTASKS_PER_NODE.
        let a = from(&[
            ("SLURM_JOB_ID", "7"),
            ("SLURM_NNODES", "2"),
            ("SLURM_TASKS_PER_NODE", "2(x2)"),
        ])
        .unwrap()
        .unwrap();
        let nproc = a.nproc_per_node.unwrap();
        assert_eq!(nproc.value, 2);
        assert_eq!(
            nproc.source,
            Source::Scheduler {
                var: "SLURM_TASKS_PER_NODE",
                how: String::new()
            }
        );
        // An explicit --ntasks-per-node wins over the layout.
        let a = from(&[
            ("SLURM_JOB_ID", "7"),
            ("SLURM_NTASKS_PER_NODE", "3"),
            ("SLURM_TASKS_PER_NODE", "3(x2)"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(a.nproc_per_node.unwrap().value, 3);
    }

    #[test]
    fn ports_stay_in_their_range() {
        for id in [0, 1, 19_999, 20_000, 123_456_789, u64::MAX] {
            let p = master_port(id);
            assert!((10_000..30_000).contains(&p), "{id}: {p}");
        }
    }

    #[test]
    fn bad_variables_are_named() {
        for (vars, needle) in [
            (
                &[("SLURM_JOB_ID", "x1")][..],
                "SLURM_JOB_ID=\"x1\" is not a job id",
            ),
            (
                &[
                    ("SLURM_JOB_ID", "1"),
                    ("SLURM_NNODES", "2"),
                    ("SLURM_NODEID", "2"),
                ][..],
                "SLURM_NODEID=2 is out of range for 2 node(s)",
            ),
            (&[("SLURM_JOB_ID", "1"), ("SLURM_NNODES", "0")][..], "is 0"),
            (
                &[("SLURM_JOB_ID", "1"), ("SLURM_NNODES", "two")][..],
                "SLURM_NNODES=\"two\"",
            ),
            (
                &[("SLURM_JOB_ID", "1"), ("SLURM_JOB_NODELIST", "n[1-")][..],
                "SLURM_JOB_NODELIST: hostlist \"n[1-\"",
            ),
            (
                &[("SLURM_JOB_ID", "1"), ("SLURM_NTASKS_PER_NODE", "2(x3),1")][..],
                "not one count for every node",
            ),
            (
                &[("SLURM_JOB_ID", "1"), ("SLURM_TASKS_PER_NODE", "4,2")][..],
                "SLURM_TASKS_PER_NODE=\"4,2\" is not one count for every node",
            ),
        ] {
            let err = from(vars).unwrap_err();
            assert!(err.contains(needle), "{vars:?}: {err}");
        }
    }
}

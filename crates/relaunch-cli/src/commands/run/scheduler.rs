//! What the batch scheduler around `relaunch run` says about the launch,
//! read once from the environment during resolution.
//!
//! Settings come from flags (and torchrun's `PET_*` variables), then from
//! the scheduler, then from defaults; no code reads a scheduler's
//! variables after [`detect`]. A scheduler is one module that turns its
//! variables into an [`Allocation`]: SLURM in `slurm.rs`, a Kubernetes
//! Indexed Job in `kubernetes.rs`. Another is a sibling module added to
//! [`detect`]'s list; the rest of `relaunch run` does not change.

use std::fmt;

use nix::sys::signal::Signal;

use super::{kubernetes, slurm};

/// Where a resolved setting came from, as `--print-config` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// A flag, or its torchrun variable (`--nnodes` / `PET_NNODES`).
    Flag(&'static str),
    /// A scheduler's variable, with how it was used where that is not plain.
    Scheduler { var: &'static str, how: String },
    /// relaunch's default, with why.
    Default(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Flag(flag) => write!(f, "flag {flag}"),
            Self::Scheduler { var, how } if how.is_empty() => write!(f, "${var}"),
            Self::Scheduler { var, how } => write!(f, "${var} ({how})"),
            Self::Default(why) => write!(f, "default ({why})"),
        }
    }
}

/// A value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sourced<T> {
    pub(crate) value: T,
    pub(crate) source: Source,
}

impl<T> Sourced<T> {
    pub(crate) fn flag(value: T, flag: &'static str) -> Self {
        Self {
            value,
            source: Source::Flag(flag),
        }
    }

    pub(crate) fn scheduler(value: T, var: &'static str, how: impl Into<String>) -> Self {
        Self {
            value,
            source: Source::Scheduler {
                var,
                how: how.into(),
            },
        }
    }

    pub(crate) fn default(value: T, why: impl Into<String>) -> Self {
        Self {
            value,
            source: Source::Default(why.into()),
        }
    }
}

/// Asks the scheduler to run the job again, from its beginning, after a
/// clean stop (`--requeue-on-preempt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Requeue {
    /// The command, program first (`scontrol requeue 42`).
    pub(crate) argv: Vec<String>,
    /// The stop that asks for it: the scheduler's warning before the time
    /// limit (SLURM's `--signal=B:USR1@SECONDS`). A SIGTERM is not one: it
    /// is also how `scancel` ends a job, which must stay ended (SLURM 22.05
    /// takes a requeue of a cancelled job and runs it again, and shows it as
    /// COMPLETING, not CANCELLED, while its processes stop); a job
    /// preempted under `PreemptMode=REQUEUE` is requeued by SLURM itself.
    pub(crate) warning: Signal,
}

/// What one scheduler's variables say about this launch; each field is
/// `None` where the scheduler has nothing to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Allocation {
    /// The scheduler's name, for messages (`SLURM`).
    pub(crate) scheduler: &'static str,
    /// The job's id, the same on every node and across requeues.
    pub(crate) run_id: Sourced<String>,
    pub(crate) nnodes: Option<Sourced<usize>>,
    pub(crate) node_rank: Option<Sourced<usize>>,
    pub(crate) master_addr: Option<Sourced<String>>,
    /// The store's port when several nodes must agree on one without
    /// talking first.
    pub(crate) master_port: Option<Sourced<u16>>,
    pub(crate) nproc_per_node: Option<Sourced<usize>>,
    /// Signals that stop the job here, besides torchrun's defaults (SLURM's
    /// warning before the time limit).
    pub(crate) stop_signals: Option<Sourced<Vec<Signal>>>,
    /// How to requeue the job, where the scheduler can.
    pub(crate) requeue: Option<Requeue>,
}

/// The scheduler this process runs under, if any, from `env` (the process
/// environment in `relaunch run`; a map in tests).
pub(crate) fn detect(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Allocation>, String> {
    // Each scheduler in turn; the first that finds its job wins.
    if let Some(found) = slurm::allocation(env)? {
        return Ok(Some(found));
    }
    kubernetes::allocation(env, &|| std::fs::read_to_string("/etc/hosts").ok())
}

/// The process environment, with empty variables as unset (as Slurm's own
/// tools read them).
pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

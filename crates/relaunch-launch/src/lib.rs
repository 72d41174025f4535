//! `relaunch run`: a torchrun-compatible launcher that keeps a job alive.
//!
//! It hosts the job's store (the [`relaunch_store`] server) so that
//! `init_process_group` works unmodified, starts the workers with torchrun's
//! environment ([`env`]), never lets them outlive it ([`worker`]), writes
//! their output to per-rank logs and one tidy console ([`logs`],
//! [`console`]), forwards signals with a grace period, restarts them on
//! failure and explains failures ([`report`]). It owns the memory tier of
//! checkpoints on its node ([`snapshot`]): a directory that outlives every
//! worker and restart, and not the launcher.

mod agent;
pub mod config;
pub mod console;
mod coordinate;
pub mod doctor;
pub mod env;
mod error;
pub mod group;
pub mod hang;
mod hang_nodes;
mod job_store;
pub mod keys;
pub mod lines;
pub mod logs;
mod orphans;
pub mod processes;
pub mod pty;
pub mod rendezvous;
pub mod report;
mod signals;
pub mod snapshot;
pub mod stacks;
pub mod straggler;
pub mod torch;
pub mod tracking;
pub mod vterm;
pub mod worker;
pub mod zygote;

use std::path::PathBuf;

use nix::sys::signal::Signal;

pub use agent::launch;
pub use config::LaunchConfig;
pub use config::TrackingConfig;
pub use error::LaunchError;

/// Exit code when a signal stopped the job and every rank stopped at the
/// step they agreed on (`relaunch.preemption`) and exited 0: the job was
/// preempted, lost nothing, and should be requeued (EX_TEMPFAIL).
pub const EXIT_PREEMPTED: u8 = 75;

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every worker exited with code 0.
    Succeeded,
    /// Workers failed and no restart was left.
    Failed { restarts: u32, log_dir: PathBuf },
    /// A signal stopped the job; `clean` when every rank then stopped at
    /// the agreed step and exited 0.
    Stopped { signal: Signal, clean: bool },
}

impl Outcome {
    /// The launcher's exit code: 0 success, 1 workers failed,
    /// [`EXIT_PREEMPTED`] (75) stopped cleanly, 128 + N stopped by signal N
    /// with ranks that did not stop cleanly (failed, killed, or exited
    /// without agreeing on a stop step).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Succeeded => 0,
            Self::Failed { .. } => 1,
            Self::Stopped { clean: true, .. } => EXIT_PREEMPTED,
            Self::Stopped {
                signal,
                clean: false,
            } => 128u8.saturating_add(u8::try_from(*signal as i32).unwrap_or(0)),
        }
    }
}

//! `relaunch doctor`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::parse_seconds;

/// Options of `relaunch doctor`.
#[derive(Clone, Debug, Args)]
pub struct DoctorArgs {
    /// The rendezvous port to check (--master-port or the --rdzv-endpoint port).
    #[arg(long, default_value_t = 29500)]
    pub port: u16,

    /// Nodes the job will use; more than 1 makes multi-node pitfalls warnings.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub nnodes: usize,

    /// The job's checkpoint directory: the last save's time is compared with the scheduler's warning (SLURM `--signal`) and the grace period.
    #[arg(long, value_name = "DIR")]
    pub ckpt_dir: Option<PathBuf>,

    /// Seconds from the container runtime's SIGTERM to its SIGKILL (Kubernetes' terminationGracePeriodSeconds), which no runtime shows the container.
    #[arg(long, env = "RELAUNCH_GRACE_PERIOD", value_parser = parse_seconds, value_name = "SECONDS")]
    pub grace_period: Option<Duration>,

    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: DoctorFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DoctorFormat {
    Text,
    Json,
}

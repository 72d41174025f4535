//! Errors of the launcher itself (a worker's failure is not one of these:
//! it is an outcome, see [`crate::Outcome`]).

use std::io;
use std::path::PathBuf;

use relaunch_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The options cannot work together; nothing was started.
    #[error("{0}")]
    Config(String),
    #[error("cannot start worker {local_rank} ({program}): {source}")]
    Spawn {
        local_rank: usize,
        program: String,
        source: io::Error,
    },
    #[error("cannot create the log directory {}: {source}", path.display())]
    LogDir { path: PathBuf, source: io::Error },
    #[error("rendezvous store: {0}")]
    Store(#[from] StoreError),
    #[error("rendezvous failed: {0}")]
    Rendezvous(String),
    /// The job's store stopped answering an elastic node for good.
    #[error(
        "the job's store at {addr} is unreachable ({source}); the job cannot go on without it. \
         A store hosted by a launcher (the first on the --rdzv-endpoint host) ends with that \
         node: to outlive any node, run `relaunch store serve --host HOST --port PORT` on a \
         machine of its own and give every launcher --rdzv-endpoint HOST:PORT"
    )]
    StoreUnreachable { addr: String, source: StoreError },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
}

impl LaunchError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

//! How this node's attempts line up with the other nodes': none (one node),
//! fixed nodes (static rendezvous), or elastic rounds ([`crate::rendezvous`]).

use std::future::Future;
use std::pin::Pin;

use relaunch_store::{ErrorKind, StoreClient};

use crate::config::{LaunchConfig, Placement, RendezvousConfig};
use crate::error::LaunchError;
use crate::job_store::{JOIN_TIMEOUT, JobStore};
use crate::keys;
use crate::rendezvous::{DynamicRendezvous, KeepAlive, Membership, NewRound, RendezvousSettings};

/// How long a node whose workers are done waits for the others before it
/// leaves (torchrun's exit barrier).
const EXIT_BARRIER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// What the next attempt is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attempt {
    pub(crate) placement: Placement,
    /// `TORCHELASTIC_RESTART_COUNT`: restarts after failures so far.
    pub(crate) restarts: u32,
    membership: Option<Membership>,
}

impl Attempt {
    /// The attempt's number as every node names it: the rendezvous round
    /// when elastic (rounds only grow, whatever nodes join late), else
    /// `number`, which nodes of a static job count in lockstep.
    pub(crate) fn id(&self, number: u32) -> u32 {
        self.membership
            .map_or(number, |m| u32::try_from(m.round).unwrap_or(u32::MAX))
    }
}

/// A reason, from elsewhere, to end the running attempt.
pub(crate) type Remote<'a> = Pin<Box<dyn Future<Output = RemoteEvent> + 'a>>;

#[derive(Clone, Debug)]
pub(crate) struct RemoteEvent {
    pub(crate) what: String,
    /// A restart after a failure (counted), or only a change of members.
    pub(crate) failure: bool,
}

pub(crate) enum Coordinator {
    Single,
    Static { nodes: usize, node_rank: usize },
    Dynamic(Box<DynamicRendezvous>),
}

impl Coordinator {
    pub(crate) async fn new(
        config: &LaunchConfig,
        store: &JobStore,
        hostname: &str,
    ) -> Result<Self, LaunchError> {
        Ok(match &config.rendezvous {
            RendezvousConfig::Static { .. } if config.nnodes.max == 1 => Self::Single,
            RendezvousConfig::Static { .. } => Self::Static {
                nodes: config.nnodes.max,
                node_rank: config.node_rank,
            },
            RendezvousConfig::Dynamic { conf, .. } => {
                let settings = RendezvousSettings::from_conf(
                    conf,
                    config.monitor_interval,
                    config.shutdown_timeout,
                )?;
                let client = store
                    .connect_with(settings.client_options(store.client.options()))
                    .await?;
                Self::Dynamic(Box::new(DynamicRendezvous::new(
                    client,
                    &config.run_id,
                    config.nproc_per_node,
                    config.nnodes.min,
                    config.nnodes.max,
                    hostname.to_owned(),
                    settings,
                )))
            }
        })
    }

    /// Waits until attempt `number` (0 first) can start on this node, and
    /// readies the store: the previous attempt's worker keys are deleted.
    /// `restarts` counts this node's restarts after failures.
    pub(crate) async fn begin(
        &mut self,
        config: &LaunchConfig,
        store: &JobStore,
        number: u32,
        restarts: u32,
    ) -> Result<Attempt, LaunchError> {
        let nproc = config.nproc_per_node;
        match self {
            Self::Single => {
                if number > 0 {
                    store.clear_worker_keys();
                }
                Ok(Attempt {
                    placement: Placement {
                        node_rank: 0,
                        nodes: 1,
                        first_rank: 0,
                        world_size: nproc,
                    },
                    restarts,
                    membership: None,
                })
            }
            Self::Static { nodes, node_rank } => {
                let (nodes, node_rank) = (*nodes, *node_rank);
                let failed = |what: &str, e: relaunch_store::StoreError| {
                    LaunchError::Rendezvous(format!(
                        "not every node {what} attempt {number} within {JOIN_TIMEOUT:?}: {e}"
                    ))
                };
                store
                    .client
                    .barrier(
                        keys::attempt_ready(&config.run_id, number),
                        nodes as i64,
                        JOIN_TIMEOUT,
                    )
                    .await
                    .map_err(|e| failed("reached", e))?;
                let go = keys::attempt_go(&config.run_id, number);
                if store.is_host() {
                    store.clear_worker_keys();
                    store.client.set(&go, "").await?;
                }
                store
                    .client
                    .wait(&[go], JOIN_TIMEOUT)
                    .await
                    .map_err(|e| failed("started", e))?;
                Ok(Attempt {
                    placement: Placement {
                        node_rank,
                        nodes,
                        first_rank: node_rank * nproc,
                        world_size: nodes * nproc,
                    },
                    restarts,
                    membership: None,
                })
            }
            Self::Dynamic(rdzv) => {
                let unreachable = |e| store_unreachable(store, e);
                let m = rdzv.join().await.map_err(unreachable)?;
                rdzv.start(&m).await.map_err(unreachable)?;
                Ok(Attempt {
                    placement: Placement {
                        node_rank: m.index - 1,
                        nodes: m.nodes,
                        first_rank: m.first_rank,
                        world_size: m.world_size,
                    },
                    restarts: m.restarts,
                    membership: Some(m),
                })
            }
        }
    }

    /// Completes when the other nodes end the attempt: a failure elsewhere
    /// (static), or a new round (elastic). Never, for one node. Elastic,
    /// also this node's heartbeats, sent until the [`KeepAlive`] is dropped:
    /// keep it until this node is done with the attempt, exit barrier
    /// included.
    pub(crate) async fn remote(
        &self,
        config: &LaunchConfig,
        store: &JobStore,
        attempt: &Attempt,
        number: u32,
    ) -> Result<(Remote<'_>, Option<KeepAlive>), LaunchError> {
        match self {
            Self::Single => Ok((Box::pin(std::future::pending()), None)),
            Self::Static { .. } => {
                let watcher = store.connect_again().await?;
                let key = keys::attempt_failed(&config.run_id, number);
                let remote: Remote<'_> = Box::pin(async move {
                    RemoteEvent {
                        what: wait_forever(&watcher, &key).await,
                        failure: true,
                    }
                });
                Ok((remote, None))
            }
            Self::Dynamic(rdzv) => {
                let options = rdzv.settings.watcher_options(store.client.options());
                let watcher = store
                    .connect_with(options.clone())
                    .await
                    .map_err(|e| store_unreachable(store, e))?;
                let beater = store
                    .connect_with(options)
                    .await
                    .map_err(|e| store_unreachable(store, e))?;
                let m = attempt.membership.ok_or_else(|| {
                    LaunchError::Rendezvous("an elastic attempt without a membership".into())
                })?;
                let keep_alive = rdzv.keep_alive(beater, &m);
                let remote: Remote<'_> = Box::pin(async move {
                    let why = rdzv.watch(watcher, m).await;
                    RemoteEvent {
                        what: why.describe(),
                        failure: why.counts_as_restart(),
                    }
                });
                Ok((remote, Some(keep_alive)))
            }
        }
    }

    /// Tells the other nodes that a worker failed here.
    pub(crate) async fn report_failure(
        &self,
        config: &LaunchConfig,
        store: &JobStore,
        attempt: &Attempt,
        number: u32,
        what: String,
    ) {
        let result = match self {
            Self::Single => Ok(()),
            Self::Static { .. } => store
                .client
                .set(keys::attempt_failed(&config.run_id, number), what)
                .await
                .map_err(LaunchError::from),
            Self::Dynamic(rdzv) => match &attempt.membership {
                Some(m) => rdzv
                    .open_next(m, &NewRound::Failure(what))
                    .await
                    .map(|_| ()),
                None => Ok(()),
            },
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot tell the other nodes about the failure");
        }
    }

    /// After this node's workers finished, or stopped for a signal: waits (a
    /// bounded time) until every node's have, so that the node hosting the
    /// store does not close it under the others.
    pub(crate) async fn finish(
        &self,
        config: &LaunchConfig,
        store: &JobStore,
        attempt: &Attempt,
        number: u32,
    ) {
        let (nodes, id) = match (self, &attempt.membership) {
            (Self::Single, _) => return,
            (Self::Static { nodes, .. }, _) => (*nodes, u64::from(number)),
            (Self::Dynamic(_), Some(m)) => (m.nodes, m.round),
            (Self::Dynamic(_), None) => return,
        };
        let key = keys::done(&config.run_id, id);
        let barrier = store
            .client
            .barrier(&key, nodes as i64, EXIT_BARRIER_TIMEOUT);
        // Bounded as a whole: a store that went silent would leave the
        // barrier's cancellation waiting for the client's own timeout.
        match tokio::time::timeout(EXIT_BARRIER_TIMEOUT * 2, barrier).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "not every node finished within {EXIT_BARRIER_TIMEOUT:?}; leaving anyway");
            }
            Err(_) => tracing::warn!("the store did not answer the exit barrier; leaving anyway"),
        }
    }

    /// Whether restarts are counted by the job (elastic) rather than here.
    pub(crate) fn counts_restarts_globally(&self) -> bool {
        matches!(self, Self::Dynamic(_))
    }
}

/// An elastic node's store error, once the rendezvous gave up on it: a
/// store that does not answer, or takes no connection, is unreachable.
fn store_unreachable(store: &JobStore, e: LaunchError) -> LaunchError {
    match e {
        LaunchError::Store(source)
            if matches!(source.kind(), ErrorKind::Connection | ErrorKind::Timeout) =>
        {
            LaunchError::StoreUnreachable {
                addr: format!("{}:{}", store.addr, store.port),
                source,
            }
        }
        other => other,
    }
}

/// Waits for `key`, however long the job runs, and returns its value.
async fn wait_forever(client: &StoreClient, key: &str) -> String {
    loop {
        match client.get(key).await {
            Ok(value) => return String::from_utf8_lossy(&value).into_owned(),
            Err(e) if e.kind() == relaunch_store::ErrorKind::Timeout => {}
            Err(e) => {
                tracing::warn!(error = %e, "lost the store while watching the other nodes");
                return std::future::pending().await;
            }
        }
    }
}

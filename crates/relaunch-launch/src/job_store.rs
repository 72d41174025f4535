//! The job's store: hosted by this launcher (one node, or node 0 of a static
//! job) or joined at the master's address. Workers' `init_process_group`
//! and the launchers' own coordination both go through it.

use std::net::IpAddr;
use std::time::Duration;

use relaunch_store::{
    ClientOptions, RunningServer, ServerOptions, StoreClient, StoreError, StoreServer,
};

use crate::config::{LaunchConfig, RendezvousConfig};
use crate::error::LaunchError;

/// How long a node waits for the master's store to come up.
pub(crate) const JOIN_TIMEOUT: Duration = Duration::from_secs(600);

/// The store as this node sees it.
pub(crate) struct JobStore {
    /// Set when this launcher hosts the store.
    pub(crate) server: Option<RunningServer>,
    /// `MASTER_ADDR` and `MASTER_PORT` for the workers.
    pub(crate) addr: String,
    pub(crate) port: u16,
    /// The launcher's own connection, for coordination keys.
    pub(crate) client: StoreClient,
}

impl JobStore {
    pub(crate) async fn open(config: &LaunchConfig) -> Result<Self, LaunchError> {
        let (addr, port, host) = match &config.rendezvous {
            RendezvousConfig::Static {
                master_addr,
                master_port,
            } => (
                master_addr.clone(),
                master_port.unwrap_or(0),
                config.node_rank == 0,
            ),
            RendezvousConfig::Dynamic { host, port, .. } => {
                (host.clone(), *port, is_local_host(host).await)
            }
        };
        let elastic = matches!(config.rendezvous, RendezvousConfig::Dynamic { .. });
        let server = if host {
            let options = ServerOptions {
                host: bind_host(&addr).await,
                port,
                ..ServerOptions::default()
            };
            match StoreServer::bind(&options).await {
                Ok(server) => Some(server.spawn()?),
                // Elastic: another launcher on this host got there first and
                // hosts it; join, as torchrun's agents do.
                Err(StoreError::Bind { source, .. })
                    if elastic && source.kind() == std::io::ErrorKind::AddrInUse =>
                {
                    None
                }
                Err(e) => {
                    return Err(LaunchError::Rendezvous(format!(
                        "cannot host the job's store on {addr}:{port}: {e}; another job may use \
                         that port (omit --master-port on a single node to pick a free one)"
                    )));
                }
            }
        } else {
            None
        };
        let host = server.is_some();
        let port = server.as_ref().map_or(port, RunningServer::port);
        let options = ClientOptions {
            timeout: JOIN_TIMEOUT,
            connect_timeout: if host {
                Duration::from_secs(10)
            } else {
                JOIN_TIMEOUT
            },
            ..ClientOptions::default()
        };
        let client = StoreClient::connect(addr.clone(), port, options).await?;
        Ok(Self {
            server,
            addr,
            port,
            client,
        })
    }

    /// Deletes the workers' keys (everything but the launchers' own), so an
    /// attempt starts from an empty store as under torchrun, which makes a
    /// new store for each. Only the host can; others do nothing.
    pub(crate) fn clear_worker_keys(&self) {
        if let Some(server) = &self.server {
            let gone = server.retain_keys(crate::keys::is_launcher_key);
            tracing::debug!(gone, "deleted the previous attempt's keys");
        }
    }

    /// Another connection to the same store, for a task that blocks in a
    /// WAIT while the launcher goes on using its own.
    pub(crate) async fn connect_again(&self) -> Result<StoreClient, LaunchError> {
        self.connect_with(self.client.options().clone()).await
    }

    /// Another connection to the same store, with other timeouts.
    pub(crate) async fn connect_with(
        &self,
        options: ClientOptions,
    ) -> Result<StoreClient, LaunchError> {
        Ok(StoreClient::connect(self.addr.clone(), self.port, options).await?)
    }

    /// Whether this launcher hosts the store.
    pub(crate) fn is_host(&self) -> bool {
        self.server.is_some()
    }

    /// Closes the store if this launcher hosts it.
    pub(crate) async fn close(self) {
        if let Some(server) = self.server {
            server.shutdown().await;
        }
    }
}

/// Where to listen for `addr`: that address itself when it is a loopback
/// one (a single-node job stays off the network), else every interface, as
/// PyTorch's store does, so that other nodes reach it by any of its names.
async fn bind_host(addr: &str) -> Option<String> {
    let loopback = match addr.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => tokio::net::lookup_host((addr, 0))
            .await
            .map(|mut addrs| addrs.all(|a| a.ip().is_loopback()))
            .unwrap_or(false),
    };
    loopback.then(|| addr.to_owned())
}

/// Whether `host` names this machine: loopback, one of its addresses, or
/// its hostname.
async fn is_local_host(host: &str) -> bool {
    if host == "localhost" {
        return true;
    }
    if let Ok(name) = nix::unistd::gethostname()
        && name.to_string_lossy() == host
    {
        return true;
    }
    let Ok(addrs) = tokio::net::lookup_host((host, 0)).await else {
        return false;
    };
    addrs
        .into_iter()
        .any(|a| a.ip().is_loopback() || std::net::TcpListener::bind((a.ip(), 0)).is_ok())
}

impl JobStore {
    /// The value of `key` if it is set, without waiting for it; `None` when
    /// it is not, or the store does not answer within `patience` (said at
    /// debug level: these reads are checks the launcher makes again).
    pub(crate) async fn read_if_set(
        &self,
        key: &str,
        patience: Duration,
        what: &str,
    ) -> Option<Vec<u8>> {
        let read = async {
            if self.client.check(&[key]).await? {
                self.client.get_now(key).await.map(Some)
            } else {
                Ok(None)
            }
        };
        match tokio::time::timeout(patience, read).await {
            Ok(Ok(value)) => value,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot check the store for {what}");
                None
            }
            Err(_) => None,
        }
    }

    /// Sets `key` to `value` unless it is set already, waiting at most 2 s
    /// for the store.
    pub(crate) async fn announce(&self, key: &str, value: &str, what: &str) {
        let set = self.client.compare_set(key, "", value);
        match tokio::time::timeout(Duration::from_secs(2), set).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot announce {what} in the store"),
            Err(_) => {
                tracing::warn!("the store did not answer in 2 s; {what} is not announced there")
            }
        }
    }
}

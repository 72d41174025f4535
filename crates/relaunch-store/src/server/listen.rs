//! Listening sockets: which addresses to bind, like PyTorch's server, and the
//! process limits that thousands of connections need.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};
use std::net::TcpListener;

use crate::error::StoreError;

/// Pending connections the kernel may queue; it caps this at
/// `net.core.somaxconn`. A rendezvous storm connects every rank at once.
const BACKLOG: i32 = 65_535;

/// Binds the listeners for `host` (all interfaces when `None`) and `port`
/// (any free port when 0; every listener then shares the one chosen).
///
/// All interfaces means one dual-stack IPv6 socket that also accepts IPv4,
/// falling back to IPv4 alone where IPv6 is unavailable, as PyTorch does. A
/// name that resolves to several addresses (`localhost`) gets a listener on
/// each one that can be bound.
pub(crate) async fn bind(host: Option<&str>, port: u16) -> Result<Vec<TcpListener>, StoreError> {
    let host = host.filter(|h| !h.is_empty() && *h != "*");
    let Some(host) = host else {
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
        return match listen(v6) {
            Ok(listener) => Ok(vec![listener]),
            Err(e) => {
                tracing::debug!(error = %e, "no IPv6, listening on IPv4 only");
                let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
                Ok(vec![listen(v4).map_err(|source| bind_error(v4, source))?])
            }
        };
    };
    let addrs = resolve(host, port).await?;
    let mut listeners: Vec<TcpListener> = Vec::new();
    let mut first_error = None;
    for mut addr in addrs {
        if let Some(first) = listeners.first() {
            addr.set_port(first.local_addr().map_err(|e| bind_error(addr, e))?.port());
        }
        match listen(addr) {
            Ok(listener) => listeners.push(listener),
            Err(e) => {
                tracing::debug!(%addr, error = %e, "cannot listen on one of the host's addresses");
                first_error.get_or_insert((addr, e));
            }
        }
    }
    match (listeners.is_empty(), first_error) {
        (false, _) => Ok(listeners),
        (true, Some((addr, e))) => Err(bind_error(addr, e)),
        (true, None) => Err(StoreError::Resolve {
            addr: format!("{host}:{port}"),
            detail: "the name resolves to no address".into(),
        }),
    }
}

async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, StoreError> {
    let found = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| StoreError::Resolve {
            addr: format!("{host}:{port}"),
            detail: e.to_string(),
        })?;
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for addr in found {
        if !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
    Ok(addrs)
}

fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        // Only the unspecified address is dual-stack; `::1` must not claim
        // 127.0.0.1's port, which gets its own listener.
        socket.set_only_v6(!addr.ip().is_unspecified())?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

fn bind_error(addr: SocketAddr, source: io::Error) -> StoreError {
    StoreError::Bind {
        addr: addr.to_string(),
        source,
    }
}

/// Raises this process's open-file limit as far as the hard limit allows, so
/// that each connection can have its descriptor. Returns the new limit.
pub(crate) fn raise_open_file_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => Some(limit),
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit; the store may refuse connections beyond it");
            None
        }
    }
}

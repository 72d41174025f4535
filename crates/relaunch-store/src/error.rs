//! Errors of the store: what a peer did wrong on the wire, and what a client or
//! server caller sees.

use std::io;
use std::time::Duration;

/// A request that breaks the wire format or one of the server's limits.
///
/// The server closes the offending connection with this message in its log;
/// the client refuses to send such a request in the first place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error(
        "unknown command byte {0:#04x} (known: 0x00..=0x12); the peer is not a TCPStore client or speaks a newer protocol"
    )]
    UnknownCommand(u8),
    #[error("key of {len} bytes exceeds max_key_bytes = {max}")]
    KeyTooLong { len: u64, max: usize },
    #[error("value of {len} bytes exceeds max_value_bytes = {max}")]
    ValueTooLarge { len: u64, max: usize },
    #[error("{count} keys in one request exceed max_keys = {max}")]
    TooManyKeys { count: u64, max: usize },
    #[error("request of at least {len} bytes exceeds max_frame_bytes = {max}")]
    FrameTooLarge { len: u64, max: usize },
}

/// A sequence of requests that the server refuses on one connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("first request was {command}, not VALIDATE: the peer is not a TCPStore client")]
    NotValidated { command: &'static str },
    #[error(
        "VALIDATE carried magic {0:#010x}, expected 0x3c85f7ce: the peer is not a TCPStore client"
    )]
    BadMagic(u32),
    #[error("VALIDATE is only valid as the first request on a connection")]
    RepeatedValidate,
    #[error(
        "{command} while a WAIT or BARRIER is pending on this connection; wait for its reply or send CANCEL_WAIT first"
    )]
    WaitPending { command: &'static str },
    #[error("{command} on key {key} whose value {value} is not a decimal integer")]
    NotAnInteger {
        command: &'static str,
        key: String,
        value: String,
    },
}

/// The broad class of a [`StoreError`], for callers that retry or report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A deadline passed; the store is reachable and the operation may succeed later.
    Timeout,
    /// The store cannot be reached or the connection broke.
    Connection,
    /// The store answered something this client does not understand.
    Protocol,
    /// The caller asked for something invalid (too large, bad address).
    InvalidInput,
    /// The thing asked for is not there (an empty queue).
    NotFound,
}

/// An error from the store client or from starting a server.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout { what: String, timeout: Duration },
    #[error(
        "cannot reach the store at {addr} (tried for {waited:?}): {source}; is `relaunch store serve` running there?"
    )]
    Connect {
        addr: String,
        waited: Duration,
        source: io::Error,
    },
    #[error("lost the connection to the store at {addr}: {source}")]
    ConnectionLost { addr: String, source: io::Error },
    #[error("the store at {addr} sent an unexpected reply to {command}: {detail}")]
    BadReply {
        addr: String,
        command: &'static str,
        detail: String,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: io::Error },
    #[error("cannot start the store's threads: {0}")]
    Start(io::Error),
    #[error("cannot resolve store address {addr}: {detail}")]
    Resolve { addr: String, detail: String },
    #[error("request refused before sending: {0}")]
    Frame(#[from] FrameError),
    #[error("queue {key} is empty")]
    QueueEmpty { key: String },
}

impl StoreError {
    /// The class of this error, so callers match on kinds instead of messages.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Timeout { .. } => ErrorKind::Timeout,
            Self::Connect { .. }
            | Self::ConnectionLost { .. }
            | Self::Bind { .. }
            | Self::Start(_) => ErrorKind::Connection,
            Self::BadReply { .. } => ErrorKind::Protocol,
            Self::Resolve { .. } | Self::Frame(_) => ErrorKind::InvalidInput,
            Self::QueueEmpty { .. } => ErrorKind::NotFound,
        }
    }
}

/// Renders key or value bytes for a message: quoted, escaped, cut at 64 bytes.
pub(crate) fn preview(bytes: &[u8]) -> String {
    const MAX: usize = 64;
    let shown = &bytes[..bytes.len().min(MAX)];
    let mut s = format!("{:?}", String::from_utf8_lossy(shown));
    if bytes.len() > MAX {
        s.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    s
}

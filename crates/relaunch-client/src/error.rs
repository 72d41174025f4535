//! Errors of the tracking client, each with a [`ErrorKind`] that retry code
//! and the Python bindings match on.

use crate::spool::SpoolError;

/// What went wrong, for callers that decide (retry, give up, which Python
/// exception) without reading messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A bad argument or setting: fix the call.
    Config,
    /// The server cannot be reached, or answered 5xx: try again later.
    Unavailable,
    Unauthorized,
    NotFound,
    Conflict,
    TooLarge,
    /// The server refused the request as malformed.
    BadRequest,
    Timeout,
    /// Local files that do not decode.
    Corrupt,
    Io,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Config(String),
    #[error("cannot reach the tracking server at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// A chunk sent straight to the server's bucket did not get there.
    #[error(
        "cannot store a chunk in the server's bucket at {url}: {reason} (RELAUNCH_DIRECT_UPLOADS=off \
         sends chunks through the server instead)"
    )]
    Bucket { url: String, reason: String },
    #[error("the tracking server refused {what} ({status}): {message}")]
    Status {
        status: u16,
        what: String,
        message: String,
        /// How long the server asked to wait before trying again
        /// (`Retry-After` in seconds, on a 429 or 503), if it said.
        retry_after: Option<std::time::Duration>,
    },
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Corrupt(String),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Spool(#[from] SpoolError),
}

impl ClientError {
    /// The wait the server asked for with `Retry-After`, if it did.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Config(_) => ErrorKind::Config,
            Self::Unreachable { .. } | Self::Bucket { .. } => ErrorKind::Unavailable,
            Self::Status { status, .. } => match status {
                400 | 422 => ErrorKind::BadRequest,
                401 | 403 => ErrorKind::Unauthorized,
                404 => ErrorKind::NotFound,
                409 => ErrorKind::Conflict,
                413 => ErrorKind::TooLarge,
                408 | 504 => ErrorKind::Timeout,
                _ => ErrorKind::Unavailable,
            },
            Self::Timeout(_) => ErrorKind::Timeout,
            Self::Corrupt(_) => ErrorKind::Corrupt,
            Self::Io { .. } => ErrorKind::Io,
            Self::Spool(e) => match e {
                SpoolError::CorruptAck { .. } => ErrorKind::Corrupt,
                SpoolError::TooLarge { .. } => ErrorKind::TooLarge,
                SpoolError::Busy { .. } => ErrorKind::Conflict,
                SpoolError::Closed { .. } => ErrorKind::Config,
                _ => ErrorKind::Io,
            },
        }
    }

    /// Worth sending again later: the server may come back.
    pub fn is_transient(&self) -> bool {
        matches!(self.kind(), ErrorKind::Unavailable | ErrorKind::Timeout)
    }

    pub(crate) fn io<'a>(
        op: &'static str,
        path: &'a std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> Self + 'a {
        // The path is written out only on an error: walks call this per file.
        move |source| Self::Io {
            op,
            path: path.display().to_string(),
            source,
        }
    }
}

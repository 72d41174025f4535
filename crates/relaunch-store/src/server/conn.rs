//! One client connection: read what arrived, apply every whole request under
//! one lock, write all replies in one go, and deliver deferred wait replies.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::error::ProtocolError;
use crate::session::{Session, Signal};
use crate::state::{ConnId, Wake};
use crate::wire::{Decoded, decode_request};

/// Room kept free for the next read.
const READ_CHUNK: usize = 16 * 1024;
/// Most buffer grown ahead of bytes actually received.
const MAX_RESERVE: usize = 1024 * 1024;
/// Buffers larger than this are given back once empty, so that a connection
/// that once moved a large value does not hold its memory forever.
const KEEP_CAPACITY: usize = 256 * 1024;

/// Wakes a connection whose WAIT or BARRIER was released by another one.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConnSignal(Arc<SignalInner>);

#[derive(Debug, Default)]
struct SignalInner {
    released: AtomicBool,
    notify: Notify,
}

impl Wake for ConnSignal {
    fn wake(&self) {
        self.0.released.store(true, Ordering::Release);
        self.0.notify.notify_one();
    }
}

impl Signal for ConnSignal {
    fn take_release(&self) -> bool {
        self.0.released.swap(false, Ordering::AcqRel)
    }
}

/// Why a connection ended, for the log.
enum End {
    /// The peer closed it, or the server is shutting down.
    Closed,
    /// The peer closed it in the middle of a request.
    Truncated(usize),
    Io(std::io::Error),
    Protocol(ProtocolError),
}

/// Serves one connection until the peer leaves, breaks the protocol, or the
/// server shuts down.
pub(crate) async fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let conn = shared.open_connection();
    // Whatever way this task ends, the connection's waits are forgotten.
    let _guard = ConnGuard {
        shared: &shared,
        conn,
    };
    let signal = ConnSignal::default();
    let mut session = Session::new(conn, signal.clone());
    let mut inbuf = BytesMut::with_capacity(READ_CHUNK);
    let mut out = Vec::with_capacity(READ_CHUNK);

    let end = loop {
        if inbuf.capacity() - inbuf.len() < READ_CHUNK / 4 {
            inbuf.reserve(READ_CHUNK);
        }
        tokio::select! {
            () = shutdown.cancelled() => break End::Closed,
            () = signal.0.notify.notified() => session.deliver_release(&mut out),
            read = stream.read_buf(&mut inbuf) => match read {
                Ok(0) if inbuf.is_empty() => break End::Closed,
                Ok(0) => break End::Truncated(inbuf.len()),
                Ok(_) => {
                    if let Err(e) = process(&shared, &mut session, &mut inbuf, &mut out) {
                        break End::Protocol(e);
                    }
                }
                Err(e) => break End::Io(e),
            },
        }
        if !out.is_empty() {
            tokio::select! {
                () = shutdown.cancelled() => break End::Closed,
                written = stream.write_all(&out) => if let Err(e) = written {
                    break End::Io(e);
                },
            }
            out.clear();
            out.shrink_to(KEEP_CAPACITY);
        }
        if inbuf.is_empty() && inbuf.capacity() > KEEP_CAPACITY {
            inbuf = BytesMut::with_capacity(READ_CHUNK);
        }
    };

    match end {
        End::Closed => tracing::debug!(%peer, conn, "connection closed"),
        End::Truncated(pending) => tracing::debug!(
            %peer, conn, pending,
            "peer closed the connection in the middle of a request"
        ),
        End::Io(e) => tracing::debug!(%peer, conn, error = %e, "connection failed"),
        End::Protocol(e) => {
            // A well-behaved client never gets here, so say it loudly.
            tracing::warn!(%peer, conn, validated = session.is_validated(), "closing connection: {e}");
            // Send what earlier requests produced; the close follows anyway.
            let _ = stream.write_all(&out).await;
        }
    }
}

/// Applies every whole request in `inbuf`, appending replies to `out`, and
/// drops the bytes it consumed.
fn process(
    shared: &Shared,
    session: &mut Session<ConnSignal>,
    inbuf: &mut BytesMut,
    out: &mut Vec<u8>,
) -> Result<(), ProtocolError> {
    // Most reads hold a whole request; a partial one is not worth the lock.
    if let Decoded::Incomplete { needed } = decode_request(inbuf, &shared.limits)? {
        reserve_for(inbuf, needed);
        return Ok(());
    }
    let mut consumed = 0;
    let result = {
        let mut state = shared.state.lock();
        loop {
            match decode_request(&inbuf[consumed..], &shared.limits) {
                Ok(Decoded::Request(request, len)) => {
                    if let Err(e) = session.handle(&mut state, request, out) {
                        break Err(e);
                    }
                    consumed += len;
                }
                Ok(Decoded::Incomplete { needed }) => break Ok(needed),
                Err(e) => break Err(e.into()),
            }
        }
    };
    inbuf.advance(consumed);
    reserve_for(inbuf, result?);
    Ok(())
}

/// Makes room towards a request of `needed` bytes, but never trusts a length
/// the peer sent for more than [`MAX_RESERVE`] ahead of the bytes it sent.
fn reserve_for(inbuf: &mut BytesMut, needed: usize) {
    inbuf.reserve(needed.saturating_sub(inbuf.len()).min(MAX_RESERVE));
}

struct ConnGuard<'a> {
    shared: &'a Shared,
    conn: ConnId,
}

impl Drop for ConnGuard<'_> {
    fn drop(&mut self) {
        self.shared.close_connection(self.conn);
    }
}

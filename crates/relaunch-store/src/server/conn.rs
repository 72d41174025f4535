//! One client connection: read what arrived, apply every whole request under
//! one lock, write all replies in one go, and deliver deferred wait replies.
//!
//! The task ends when the peer leaves or breaks the protocol; at shutdown its
//! shard drops it. Either way [`ConnGuard`] forgets the connection's waits.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use bytes::{Buf, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::io::poll_read_buf;

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

/// Wakes a connection whose WAIT or BARRIER was released by another one,
/// possibly on another shard's thread.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConnSignal(Arc<SignalInner>);

#[derive(Debug, Default)]
struct SignalInner {
    released: AtomicBool,
    waker: AtomicWaker,
}

impl Wake for ConnSignal {
    fn wake(&self) {
        self.0.released.store(true, Ordering::Release);
        self.0.waker.wake();
    }
}

impl Signal for ConnSignal {
    fn take_release(&self) -> bool {
        self.0.released.swap(false, Ordering::AcqRel)
    }
}

impl ConnSignal {
    /// Ready once a release is waiting to be taken.
    fn poll_released(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.released.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        self.0.waker.register(cx.waker());
        // A wake between the check and the registration must not be lost.
        if self.0.released.load(Ordering::Acquire) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Why a connection ended, for the log.
enum End {
    /// The peer closed it.
    Closed,
    /// The peer closed it in the middle of a request.
    Truncated(usize),
    Io(std::io::Error),
    Protocol(ProtocolError),
}

enum Event {
    Released,
    Read(std::io::Result<usize>),
}

/// Serves one connection until the peer leaves or breaks the protocol.
pub(crate) async fn serve(mut stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let conn = shared.open_connection();
    // However this task ends (returning or dropped at shutdown), the
    // connection's waits are forgotten.
    let _guard = ConnGuard {
        shared: shared.clone(),
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
        let event = poll_fn(|cx| {
            if signal.poll_released(cx).is_ready() {
                return Poll::Ready(Event::Released);
            }
            poll_read_buf(Pin::new(&mut stream), cx, &mut inbuf).map(Event::Read)
        })
        .await;
        match event {
            Event::Released => session.deliver_release(&mut out),
            Event::Read(Ok(0)) if inbuf.is_empty() => break End::Closed,
            Event::Read(Ok(0)) => break End::Truncated(inbuf.len()),
            Event::Read(Ok(_)) => {
                if let Err(e) = process(&shared, &mut session, &mut inbuf, &mut out) {
                    break End::Protocol(e);
                }
            }
            Event::Read(Err(e)) => break End::Io(e),
        }
        if !out.is_empty() {
            if let Err(e) = stream.write_all(&out).await {
                break End::Io(e);
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

struct ConnGuard {
    shared: Arc<Shared>,
    conn: ConnId,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.shared.close_connection(self.conn);
    }
}

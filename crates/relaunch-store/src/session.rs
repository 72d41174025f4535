//! One connection's side of the protocol: the VALIDATE handshake, the
//! one-pending-wait rule, and the encoding of every reply. No I/O: requests
//! come in decoded, reply bytes go out into a buffer.

use crate::error::{ProtocolError, preview};
use crate::state::{AlreadyWaiting, ConnId, KvState, NotAnInteger, WaitOutcome, Wake};
use crate::wire::{
    CHECK_NOT_READY, CHECK_READY, Command, Request, STOP_WAITING, VALIDATION_MAGIC, WAIT_CANCELED,
    put_bytes, put_i64,
};

/// A [`Wake`] that also remembers that it fired until the connection takes
/// the news, so the deferred STOP_WAITING is written exactly once and in
/// order with the connection's other replies.
pub trait Signal: Wake + Clone {
    /// Returns whether the pending wait was released since the last call.
    fn take_release(&self) -> bool;
}

/// Protocol state of one connection.
#[derive(Debug)]
pub struct Session<S> {
    conn: ConnId,
    validated: bool,
    signal: S,
}

impl<S: Signal> Session<S> {
    pub fn new(conn: ConnId, signal: S) -> Self {
        Self {
            conn,
            validated: false,
            signal,
        }
    }

    /// Whether the peer has completed the VALIDATE handshake.
    pub fn is_validated(&self) -> bool {
        self.validated
    }

    /// Appends STOP_WAITING to `out` if this connection's wait was released
    /// and the reply has not been written yet.
    pub fn deliver_release(&self, out: &mut Vec<u8>) {
        if self.signal.take_release() {
            out.push(STOP_WAITING);
        }
    }

    /// Applies one request to `state` and appends its reply, if it has one,
    /// to `out`. An error means the connection must be closed.
    pub fn handle(
        &mut self,
        state: &mut KvState<S>,
        request: Request<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), ProtocolError> {
        if !self.validated {
            return match request {
                Request::Validate {
                    magic: VALIDATION_MAGIC,
                } => {
                    self.validated = true;
                    Ok(())
                }
                Request::Validate { magic } => Err(ProtocolError::BadMagic(magic)),
                other => Err(ProtocolError::NotValidated {
                    command: other.command().name(),
                }),
            };
        }
        // A release that happened since this connection last wrote comes
        // before the reply to this request, and one this request causes
        // (a WAIT then a SET of its key) comes right after it.
        self.deliver_release(out);
        let result = self.apply(state, request, out);
        self.deliver_release(out);
        result
    }

    fn apply(
        &mut self,
        state: &mut KvState<S>,
        request: Request<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), ProtocolError> {
        match request {
            Request::Validate { .. } => return Err(ProtocolError::RepeatedValidate),
            Request::Ping { nonce } => out.extend_from_slice(&nonce.to_le_bytes()),
            Request::Set { key, value } => state.set(key, value),
            Request::CompareSet {
                key,
                expected,
                desired,
            } => put_bytes(out, state.compare_set(key, expected, desired)),
            Request::Get { key } => put_bytes(out, state.get(key)),
            Request::Add { key, delta } => {
                let sum = state
                    .add(key, delta)
                    .map_err(|e| not_an_integer(Command::Add, key, e))?;
                put_i64(out, sum);
            }
            Request::Check { keys } => out.push(if state.check(&keys) {
                CHECK_READY
            } else {
                CHECK_NOT_READY
            }),
            Request::Wait { keys } => {
                let outcome = state
                    .wait(self.conn, &keys, self.signal.clone())
                    .map_err(|AlreadyWaiting| ProtocolError::WaitPending { command: "WAIT" })?;
                if outcome == WaitOutcome::Ready {
                    out.push(STOP_WAITING);
                }
            }
            Request::GetNumKeys => put_i64(out, count(state.num_keys())),
            Request::DeleteKey { key } => put_i64(out, i64::from(state.delete_key(key))),
            Request::Append { key, value } => state.append(key, value),
            Request::MultiGet { keys } => {
                for key in keys {
                    put_bytes(out, state.get(key));
                }
            }
            Request::MultiSet { pairs } => {
                for (key, value) in pairs {
                    state.set(key, value);
                }
            }
            Request::CancelWait => {
                state.cancel_wait(self.conn);
                // A release that raced the cancel is written first, as
                // PyTorch's server does; its client expects either order.
                self.deliver_release(out);
                out.push(WAIT_CANCELED);
            }
            Request::QueuePush { key, value } => state.queue_push(key, value),
            Request::QueuePop { key } => {
                let (len, item) = state.queue_pop(key);
                put_i64(out, count(len));
                if let Some(item) = item {
                    put_bytes(out, &item);
                }
            }
            Request::QueueLen { key } => put_i64(out, count(state.queue_len(key))),
            Request::ListKeys => {
                let keys = state.keys();
                put_i64(out, count(keys.len()));
                for key in keys {
                    put_bytes(out, key);
                }
            }
            Request::Barrier { key, world_size } => {
                let outcome = state
                    .barrier(self.conn, key, world_size, self.signal.clone())
                    .map_err(|e| not_an_integer(Command::Barrier, key, e))?
                    .map_err(|AlreadyWaiting| ProtocolError::WaitPending { command: "BARRIER" })?;
                if outcome == WaitOutcome::Ready {
                    out.push(STOP_WAITING);
                }
            }
        }
        Ok(())
    }
}

fn not_an_integer(command: Command, key: &[u8], e: NotAnInteger) -> ProtocolError {
    ProtocolError::NotAnInteger {
        command: command.name(),
        key: preview(key),
        value: preview(&e.value),
    }
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[derive(Clone, Default)]
    struct Flag(Rc<Cell<bool>>);
    impl Wake for Flag {
        fn wake(&self) {
            self.0.set(true);
        }
    }
    impl Signal for Flag {
        fn take_release(&self) -> bool {
            self.0.replace(false)
        }
    }

    fn validated(conn: ConnId) -> (Session<Flag>, Flag) {
        let flag = Flag::default();
        let mut session = Session::new(conn, flag.clone());
        let mut state = KvState::new();
        let hello = Request::Validate {
            magic: VALIDATION_MAGIC,
        };
        session.handle(&mut state, hello, &mut Vec::new()).unwrap();
        (session, flag)
    }

    #[test]
    fn the_first_request_must_be_validate() {
        let mut state = KvState::new();
        let mut s = Session::new(1, Flag::default());
        let err = s.handle(&mut state, Request::GetNumKeys, &mut Vec::new());
        assert_eq!(
            err,
            Err(ProtocolError::NotValidated {
                command: "GETNUMKEYS"
            })
        );
        let mut s = Session::new(2, Flag::default());
        let err = s.handle(&mut state, Request::Validate { magic: 1 }, &mut Vec::new());
        assert_eq!(err, Err(ProtocolError::BadMagic(1)));
        let (mut s, _) = validated(3);
        let again = Request::Validate {
            magic: VALIDATION_MAGIC,
        };
        assert_eq!(
            s.handle(&mut state, again, &mut Vec::new()),
            Err(ProtocolError::RepeatedValidate)
        );
    }

    #[test]
    fn a_release_caused_by_the_same_batch_is_written_in_order() {
        let mut state = KvState::new();
        let (mut s, _) = validated(1);
        let mut out = Vec::new();
        s.handle(&mut state, Request::Wait { keys: vec![b"k"] }, &mut out)
            .unwrap();
        assert!(out.is_empty(), "the wait is deferred");
        s.handle(
            &mut state,
            Request::Set {
                key: b"k",
                value: b"v",
            },
            &mut out,
        )
        .unwrap();
        s.handle(&mut state, Request::Get { key: b"k" }, &mut out)
            .unwrap();
        assert_eq!(out, b"\x00\x01\x00\x00\x00\x00\x00\x00\x00v");
    }

    #[test]
    fn cancel_after_a_racing_release_writes_both_replies() {
        let mut state = KvState::new();
        let (mut waiter, flag) = validated(1);
        let (mut setter, _) = validated(2);
        let mut out = Vec::new();
        waiter
            .handle(&mut state, Request::Wait { keys: vec![b"k"] }, &mut out)
            .unwrap();
        setter
            .handle(
                &mut state,
                Request::Set {
                    key: b"k",
                    value: b"",
                },
                &mut Vec::new(),
            )
            .unwrap();
        assert!(flag.0.get(), "the release is noted but not yet written");
        waiter
            .handle(&mut state, Request::CancelWait, &mut out)
            .unwrap();
        assert_eq!(out, [STOP_WAITING, WAIT_CANCELED]);
    }

    #[test]
    fn add_on_text_is_a_protocol_error_naming_key_and_value() {
        let mut state = KvState::new();
        let (mut s, _) = validated(1);
        s.handle(
            &mut state,
            Request::Set {
                key: b"k",
                value: b"abc",
            },
            &mut Vec::new(),
        )
        .unwrap();
        let err = s
            .handle(
                &mut state,
                Request::Add {
                    key: b"k",
                    delta: 1,
                },
                &mut Vec::new(),
            )
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "ADD on key \"k\" whose value \"abc\" is not a decimal integer"
        );
    }
}

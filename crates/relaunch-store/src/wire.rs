//! PyTorch's TCPStore wire format (the libuv-era protocol of PyTorch 2.4 and
//! later), byte for byte.
//!
//! A request is one command byte followed by its arguments. Integers are
//! little-endian; a key or a value is a `u64` length followed by the bytes; a
//! key list is a `u64` count followed by that many keys. A torch client opens
//! every connection with `VALIDATE` and then `PING`.
//!
//! | byte | command     | arguments                 | reply                                  |
//! |------|-------------|---------------------------|----------------------------------------|
//! | 0x00 | VALIDATE    | `u32` magic 0x3C85F7CE    | none                                   |
//! | 0x01 | SET         | key, value                | none                                   |
//! | 0x02 | COMPARE_SET | key, expected, desired    | value                                  |
//! | 0x03 | GET         | key                       | value (empty when missing)             |
//! | 0x04 | ADD         | key, `i64` delta          | `i64` new value                        |
//! | 0x05 | CHECK       | key list                  | `u8` 0 ready, 1 not ready              |
//! | 0x06 | WAIT        | key list                  | `u8` 0, deferred until all keys exist  |
//! | 0x07 | GETNUMKEYS  |                           | `i64`                                  |
//! | 0x08 | DELETE_KEY  | key                       | `i64` number deleted                   |
//! | 0x09 | APPEND      | key, value                | none                                   |
//! | 0x0a | MULTI_GET   | key list                  | one value per key                      |
//! | 0x0b | MULTI_SET   | `u64` n, n × (key, value) | none                                   |
//! | 0x0c | CANCEL_WAIT |                           | `u8` 1 (after a 0 if the wait ended)   |
//! | 0x0d | PING        | `u32` nonce               | `u32` the same nonce                   |
//! | 0x0e | QUEUE_PUSH  | key, value                | none                                   |
//! | 0x0f | QUEUE_POP   | key                       | `i64` length before, then value if > 0 |
//! | 0x10 | QUEUE_LEN   | key                       | `i64`                                  |
//! | 0x11 | LIST_KEYS   |                           | `i64` n, then n keys                   |
//! | 0x12 | BARRIER     | key, `i64` world size     | `u8` 0, deferred until all arrived     |

use crate::error::FrameError;

/// The number a client sends in `VALIDATE` to prove it speaks this protocol.
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// Reply byte to `WAIT`, `BARRIER` and `CANCEL_WAIT`: the wait is over.
pub const STOP_WAITING: u8 = 0;
/// Reply byte to `CANCEL_WAIT`: the cancellation is done.
pub const WAIT_CANCELED: u8 = 1;
/// Reply byte to `CHECK`: every key exists.
pub const CHECK_READY: u8 = 0;
/// Reply byte to `CHECK`: some key is missing.
pub const CHECK_NOT_READY: u8 = 1;

macro_rules! commands {
    ($($variant:ident = $byte:literal, $name:literal;)*) => {
        /// A request's command byte.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Command {
            $($variant = $byte,)*
        }

        impl Command {
            /// Every command, in byte order.
            pub const ALL: &'static [Command] = &[$(Command::$variant,)*];

            /// The command for a request's first byte, if there is one.
            pub fn from_byte(byte: u8) -> Option<Self> {
                match byte {
                    $($byte => Some(Command::$variant),)*
                    _ => None,
                }
            }

            /// PyTorch's name for the command, as used in logs.
            pub fn name(self) -> &'static str {
                match self {
                    $(Command::$variant => $name,)*
                }
            }
        }
    };
}

commands! {
    Validate = 0, "VALIDATE";
    Set = 1, "SET";
    CompareSet = 2, "COMPARE_SET";
    Get = 3, "GET";
    Add = 4, "ADD";
    Check = 5, "CHECK";
    Wait = 6, "WAIT";
    GetNumKeys = 7, "GETNUMKEYS";
    DeleteKey = 8, "DELETE_KEY";
    Append = 9, "APPEND";
    MultiGet = 10, "MULTI_GET";
    MultiSet = 11, "MULTI_SET";
    CancelWait = 12, "CANCEL_WAIT";
    Ping = 13, "PING";
    QueuePush = 14, "QUEUE_PUSH";
    QueuePop = 15, "QUEUE_POP";
    QueueLen = 16, "QUEUE_LEN";
    ListKeys = 17, "LIST_KEYS";
    Barrier = 18, "BARRIER";
}

/// Size limits on requests. The defaults are PyTorch's own server limits,
/// plus a cap on a whole request that PyTorch lacks, so that one connection
/// cannot make the server buffer an unbounded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest key, in bytes (PyTorch: 8 KiB).
    pub max_key_bytes: usize,
    /// Largest value, in bytes (PyTorch: 8 MiB).
    pub max_value_bytes: usize,
    /// Most keys in one CHECK, WAIT, MULTI_GET or MULTI_SET (PyTorch: 128 Ki).
    pub max_keys: usize,
    /// Largest request as a whole, in bytes.
    pub max_frame_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_key_bytes: 8 * 1024,
            max_value_bytes: 8 * 1024 * 1024,
            max_keys: 128 * 1024,
            max_frame_bytes: 64 * 1024 * 1024,
        }
    }
}

/// One request, borrowing its keys and values from the receive buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Validate {
        magic: u32,
    },
    Set {
        key: &'a [u8],
        value: &'a [u8],
    },
    CompareSet {
        key: &'a [u8],
        expected: &'a [u8],
        desired: &'a [u8],
    },
    Get {
        key: &'a [u8],
    },
    Add {
        key: &'a [u8],
        delta: i64,
    },
    Check {
        keys: Vec<&'a [u8]>,
    },
    Wait {
        keys: Vec<&'a [u8]>,
    },
    GetNumKeys,
    DeleteKey {
        key: &'a [u8],
    },
    Append {
        key: &'a [u8],
        value: &'a [u8],
    },
    MultiGet {
        keys: Vec<&'a [u8]>,
    },
    MultiSet {
        pairs: Vec<(&'a [u8], &'a [u8])>,
    },
    CancelWait,
    Ping {
        nonce: u32,
    },
    QueuePush {
        key: &'a [u8],
        value: &'a [u8],
    },
    QueuePop {
        key: &'a [u8],
    },
    QueueLen {
        key: &'a [u8],
    },
    ListKeys,
    Barrier {
        key: &'a [u8],
        world_size: i64,
    },
}

impl Request<'_> {
    /// The request's command.
    pub fn command(&self) -> Command {
        match self {
            Request::Validate { .. } => Command::Validate,
            Request::Set { .. } => Command::Set,
            Request::CompareSet { .. } => Command::CompareSet,
            Request::Get { .. } => Command::Get,
            Request::Add { .. } => Command::Add,
            Request::Check { .. } => Command::Check,
            Request::Wait { .. } => Command::Wait,
            Request::GetNumKeys => Command::GetNumKeys,
            Request::DeleteKey { .. } => Command::DeleteKey,
            Request::Append { .. } => Command::Append,
            Request::MultiGet { .. } => Command::MultiGet,
            Request::MultiSet { .. } => Command::MultiSet,
            Request::CancelWait => Command::CancelWait,
            Request::Ping { .. } => Command::Ping,
            Request::QueuePush { .. } => Command::QueuePush,
            Request::QueuePop { .. } => Command::QueuePop,
            Request::QueueLen { .. } => Command::QueueLen,
            Request::ListKeys => Command::ListKeys,
            Request::Barrier { .. } => Command::Barrier,
        }
    }

    /// Appends the request's wire encoding to `out`, after checking it
    /// against `limits` so that a server with those limits accepts it.
    pub fn encode(&self, limits: &Limits, out: &mut Vec<u8>) -> Result<(), FrameError> {
        let start = out.len();
        let result = self.encode_unchecked(limits, out);
        let len = out.len() - start;
        let result = if result.is_ok() && len > limits.max_frame_bytes {
            Err(FrameError::FrameTooLarge {
                len: len as u64,
                max: limits.max_frame_bytes,
            })
        } else {
            result
        };
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    fn encode_unchecked(&self, limits: &Limits, out: &mut Vec<u8>) -> Result<(), FrameError> {
        out.push(self.command() as u8);
        let mut w = Writer { out, limits };
        match self {
            Request::Validate { magic } => w.u32(*magic),
            Request::Ping { nonce } => w.u32(*nonce),
            Request::Set { key, value }
            | Request::Append { key, value }
            | Request::QueuePush { key, value } => {
                w.key(key)?;
                w.value(value)?;
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                w.key(key)?;
                w.value(expected)?;
                w.value(desired)?;
            }
            Request::Get { key }
            | Request::DeleteKey { key }
            | Request::QueuePop { key }
            | Request::QueueLen { key } => w.key(key)?,
            Request::Add { key, delta } => {
                w.key(key)?;
                w.i64(*delta);
            }
            Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
                w.count(keys.len())?;
                for key in keys {
                    w.key(key)?;
                }
            }
            Request::MultiSet { pairs } => {
                w.count(pairs.len())?;
                for (key, value) in pairs {
                    w.key(key)?;
                    w.value(value)?;
                }
            }
            Request::Barrier { key, world_size } => {
                w.key(key)?;
                w.i64(*world_size);
            }
            Request::GetNumKeys | Request::CancelWait | Request::ListKeys => {}
        }
        Ok(())
    }
}

struct Writer<'o, 'l> {
    out: &'o mut Vec<u8>,
    limits: &'l Limits,
}

impl Writer<'_, '_> {
    fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn count(&mut self, n: usize) -> Result<(), FrameError> {
        if n > self.limits.max_keys {
            return Err(FrameError::TooManyKeys {
                count: n as u64,
                max: self.limits.max_keys,
            });
        }
        put_u64(self.out, n as u64);
        Ok(())
    }
    fn key(&mut self, key: &[u8]) -> Result<(), FrameError> {
        if key.len() > self.limits.max_key_bytes {
            return Err(FrameError::KeyTooLong {
                len: key.len() as u64,
                max: self.limits.max_key_bytes,
            });
        }
        put_bytes(self.out, key);
        Ok(())
    }
    fn value(&mut self, value: &[u8]) -> Result<(), FrameError> {
        if value.len() > self.limits.max_value_bytes {
            return Err(FrameError::ValueTooLarge {
                len: value.len() as u64,
                max: self.limits.max_value_bytes,
            });
        }
        put_bytes(self.out, value);
        Ok(())
    }
}

/// The outcome of decoding the front of a receive buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole request, and how many bytes it took.
    Request(Request<'a>, usize),
    /// The buffer holds only part of a request; it needs at least `needed`
    /// bytes in all before decoding can make progress.
    Incomplete { needed: usize },
}

/// Decodes the request at the front of `buf`.
///
/// Limits are checked as soon as a length is read, so an oversized request is
/// refused before its bytes are buffered.
pub fn decode_request<'a>(buf: &'a [u8], limits: &Limits) -> Result<Decoded<'a>, FrameError> {
    let mut r = Reader {
        buf,
        pos: 0,
        limits,
    };
    match r.request() {
        Ok(request) => Ok(Decoded::Request(request, r.pos)),
        Err(Stop::Incomplete(needed)) => Ok(Decoded::Incomplete { needed }),
        Err(Stop::Invalid(e)) => Err(e),
    }
}

enum Stop {
    Incomplete(usize),
    Invalid(FrameError),
}

impl From<FrameError> for Stop {
    fn from(e: FrameError) -> Self {
        Stop::Invalid(e)
    }
}

struct Reader<'a, 'l> {
    buf: &'a [u8],
    pos: usize,
    limits: &'l Limits,
}

impl<'a> Reader<'a, '_> {
    fn take(&mut self, n: u64) -> Result<&'a [u8], Stop> {
        let end = (self.pos as u64).saturating_add(n);
        if end > self.limits.max_frame_bytes as u64 {
            return Err(FrameError::FrameTooLarge {
                len: end,
                max: self.limits.max_frame_bytes,
            }
            .into());
        }
        // `end` fits in usize: it is at most max_frame_bytes.
        let end = end as usize;
        if end > self.buf.len() {
            return Err(Stop::Incomplete(end));
        }
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Stop> {
        let bytes = self.take(N as u64)?;
        let mut a = [0u8; N];
        a.copy_from_slice(bytes);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, Stop> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, Stop> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, Stop> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    fn key(&mut self) -> Result<&'a [u8], Stop> {
        let len = self.u64()?;
        if len > self.limits.max_key_bytes as u64 {
            return Err(FrameError::KeyTooLong {
                len,
                max: self.limits.max_key_bytes,
            }
            .into());
        }
        self.take(len)
    }

    fn value(&mut self) -> Result<&'a [u8], Stop> {
        let len = self.u64()?;
        if len > self.limits.max_value_bytes as u64 {
            return Err(FrameError::ValueTooLarge {
                len,
                max: self.limits.max_value_bytes,
            }
            .into());
        }
        self.take(len)
    }

    fn count(&mut self) -> Result<usize, Stop> {
        let count = self.u64()?;
        if count > self.limits.max_keys as u64 {
            return Err(FrameError::TooManyKeys {
                count,
                max: self.limits.max_keys,
            }
            .into());
        }
        // Fits: at most max_keys.
        Ok(count as usize)
    }

    fn keys(&mut self) -> Result<Vec<&'a [u8]>, Stop> {
        let count = self.count()?;
        // Each key needs at least its 8-byte length, so what is buffered
        // bounds how many can be read now; never trust `count` for memory.
        let mut keys = Vec::with_capacity(count.min(self.buf.len() / 8 + 1));
        for _ in 0..count {
            keys.push(self.key()?);
        }
        Ok(keys)
    }

    fn request(&mut self) -> Result<Request<'a>, Stop> {
        let [byte] = self.array::<1>()?;
        let command = Command::from_byte(byte).ok_or(FrameError::UnknownCommand(byte))?;
        Ok(match command {
            Command::Validate => Request::Validate { magic: self.u32()? },
            Command::Ping => Request::Ping { nonce: self.u32()? },
            Command::Set => Request::Set {
                key: self.key()?,
                value: self.value()?,
            },
            Command::CompareSet => Request::CompareSet {
                key: self.key()?,
                expected: self.value()?,
                desired: self.value()?,
            },
            Command::Get => Request::Get { key: self.key()? },
            Command::Add => Request::Add {
                key: self.key()?,
                delta: self.i64()?,
            },
            Command::Check => Request::Check { keys: self.keys()? },
            Command::Wait => Request::Wait { keys: self.keys()? },
            Command::GetNumKeys => Request::GetNumKeys,
            Command::DeleteKey => Request::DeleteKey { key: self.key()? },
            Command::Append => Request::Append {
                key: self.key()?,
                value: self.value()?,
            },
            Command::MultiGet => Request::MultiGet { keys: self.keys()? },
            Command::MultiSet => {
                let count = self.count()?;
                let mut pairs = Vec::with_capacity(count.min(self.buf.len() / 16 + 1));
                for _ in 0..count {
                    pairs.push((self.key()?, self.value()?));
                }
                Request::MultiSet { pairs }
            }
            Command::CancelWait => Request::CancelWait,
            Command::QueuePush => Request::QueuePush {
                key: self.key()?,
                value: self.value()?,
            },
            Command::QueuePop => Request::QueuePop { key: self.key()? },
            Command::QueueLen => Request::QueueLen { key: self.key()? },
            Command::ListKeys => Request::ListKeys,
            Command::Barrier => Request::Barrier {
                key: self.key()?,
                world_size: self.i64()?,
            },
        })
    }
}

/// Appends a `u64` in wire order.
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends an `i64` in wire order.
pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a length-prefixed byte string (a key or a value).
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u64(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(request: Request<'_>) {
        let limits = Limits::default();
        let mut buf = Vec::new();
        request.encode(&limits, &mut buf).unwrap();
        assert_eq!(
            decode_request(&buf, &limits).unwrap(),
            Decoded::Request(request.clone(), buf.len())
        );
        // Every strict prefix is incomplete, and says how much more it needs.
        for cut in 0..buf.len() {
            match decode_request(&buf[..cut], &limits).unwrap() {
                Decoded::Incomplete { needed } => assert!(needed > cut && needed <= buf.len()),
                other => panic!("prefix of {cut} bytes decoded as {other:?}"),
            }
        }
    }

    #[test]
    fn every_request_roundtrips_and_prefixes_are_incomplete() {
        let cases = vec![
            Request::Validate {
                magic: VALIDATION_MAGIC,
            },
            Request::Ping { nonce: 7 },
            Request::Set {
                key: b"/k",
                value: b"v",
            },
            Request::CompareSet {
                key: b"k",
                expected: b"",
                desired: b"d",
            },
            Request::Get { key: b"/k" },
            Request::Add {
                key: b"c",
                delta: -5,
            },
            Request::Check {
                keys: vec![b"a", b"bb"],
            },
            Request::Wait { keys: vec![] },
            Request::GetNumKeys,
            Request::DeleteKey { key: b"k" },
            Request::Append {
                key: b"k",
                value: b"xyz",
            },
            Request::MultiGet { keys: vec![b"a"] },
            Request::MultiSet {
                pairs: vec![(b"a", b"1"), (b"b", b"")],
            },
            Request::CancelWait,
            Request::QueuePush {
                key: b"q",
                value: b"item",
            },
            Request::QueuePop { key: b"q" },
            Request::QueueLen { key: b"q" },
            Request::ListKeys,
            Request::Barrier {
                key: b"bar",
                world_size: 4,
            },
        ];
        assert_eq!(cases.len(), Command::ALL.len());
        for case in cases {
            roundtrip(case);
        }
    }

    #[test]
    fn decodes_bytes_captured_from_a_torch_client() {
        // torch 2.15 `store.set("k", "v")`: the client prefixes keys with "/".
        let set = b"\x01\x02\x00\x00\x00\x00\x00\x00\x00/k\x01\x00\x00\x00\x00\x00\x00\x00v";
        assert_eq!(
            decode_request(set, &Limits::default()).unwrap(),
            Decoded::Request(
                Request::Set {
                    key: b"/k",
                    value: b"v"
                },
                set.len()
            )
        );
        // The connection handshake: VALIDATE then PING, in one segment.
        let hello = b"\x00\xce\xf7\x85\x3c\x0d\x05\x08\x00\x00";
        assert_eq!(
            decode_request(hello, &Limits::default()).unwrap(),
            Decoded::Request(
                Request::Validate {
                    magic: VALIDATION_MAGIC
                },
                5
            )
        );
    }

    #[test]
    fn oversized_lengths_are_refused_before_the_bytes_arrive() {
        let limits = Limits::default();
        let mut frame = vec![Command::Set as u8];
        put_u64(&mut frame, 9 * 1024);
        assert_eq!(
            decode_request(&frame, &limits),
            Err(FrameError::KeyTooLong {
                len: 9 * 1024,
                max: 8 * 1024
            })
        );

        let mut frame = vec![Command::Set as u8];
        put_bytes(&mut frame, b"k");
        put_u64(&mut frame, u64::MAX);
        assert_eq!(
            decode_request(&frame, &limits),
            Err(FrameError::ValueTooLarge {
                len: u64::MAX,
                max: 8 * 1024 * 1024
            })
        );

        let mut frame = vec![Command::Wait as u8];
        put_u64(&mut frame, 1 << 40);
        assert!(matches!(
            decode_request(&frame, &limits),
            Err(FrameError::TooManyKeys { .. })
        ));

        let small = Limits {
            max_frame_bytes: 64,
            ..Limits::default()
        };
        let mut frame = vec![Command::Set as u8];
        put_bytes(&mut frame, b"k");
        put_u64(&mut frame, 100);
        assert!(matches!(
            decode_request(&frame, &small),
            Err(FrameError::FrameTooLarge { .. })
        ));
    }

    #[test]
    fn unknown_command_bytes_are_refused() {
        for byte in 19..=255u8 {
            assert_eq!(
                decode_request(&[byte], &Limits::default()),
                Err(FrameError::UnknownCommand(byte))
            );
        }
    }

    #[test]
    fn the_client_refuses_what_the_server_would() {
        let limits = Limits {
            max_key_bytes: 4,
            ..Limits::default()
        };
        let mut out = vec![1, 2, 3];
        let err = Request::Get { key: b"toolong" }.encode(&limits, &mut out);
        assert_eq!(err, Err(FrameError::KeyTooLong { len: 7, max: 4 }));
        assert_eq!(
            out,
            [1, 2, 3],
            "a refused request leaves the buffer as it was"
        );
    }
}

//! An async client for any TCPStore server (ours or PyTorch's).
//!
//! Keys are raw: this client adds no prefix. PyTorch's `TCPStore` client puts
//! `/` in front of every key, so the key `k` of a torch client is `/k` here.
//!
//! One request is in flight per client at a time, as with PyTorch's client;
//! open several clients for concurrent waits. If a call's future is dropped
//! half-way, or a call fails, the connection is replaced on the next call.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::error::{StoreError, preview};
use crate::wire::{
    CHECK_NOT_READY, CHECK_READY, Command, Limits, Request, STOP_WAITING, VALIDATION_MAGIC,
    WAIT_CANCELED,
};

/// PyTorch's default store timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

const CONNECT_RETRY_MIN: Duration = Duration::from_millis(10);
const CONNECT_RETRY_MAX: Duration = Duration::from_secs(1);
/// The longest a TCP connection may take to open before a fresh attempt.
const CONNECT_ATTEMPT_MAX: Duration = Duration::from_secs(5);

/// How a client connects and how long it waits.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Deadline for each call; also how long `get`, `multi_get` and a
    /// blocking `queue_pop` wait for their keys, as in PyTorch.
    pub timeout: Duration,
    /// How long to keep retrying the first connection (a server that is
    /// still starting refuses it).
    pub connect_timeout: Duration,
    /// Requests beyond these limits are refused before they are sent.
    pub limits: Limits,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_TIMEOUT,
            limits: Limits::default(),
        }
    }
}

/// A connection to a store.
#[derive(Debug)]
pub struct StoreClient {
    host: String,
    port: u16,
    options: ClientOptions,
    conn: Mutex<Option<Connection>>,
}

impl StoreClient {
    /// Connects to the store at `host:port`, retrying until
    /// `options.connect_timeout`, and performs the VALIDATE/PING handshake.
    pub async fn connect(
        host: impl Into<String>,
        port: u16,
        options: ClientOptions,
    ) -> Result<Self, StoreError> {
        let client = Self {
            host: host.into(),
            port,
            options,
            conn: Mutex::new(None),
        };
        let conn = client.open(client.options.connect_timeout).await?;
        *client.conn.lock().await = Some(conn);
        Ok(client)
    }

    /// `host:port` of the store.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    pub async fn set(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<(), StoreError> {
        let request = Request::Set {
            key: key.as_ref(),
            value: value.as_ref(),
        };
        self.send_only(&request).await
    }

    /// Waits for `key` (up to the client's timeout), then returns its value,
    /// as PyTorch's `get` does.
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Vec<u8>, StoreError> {
        let key = key.as_ref();
        self.wait_for(&[key], self.options.timeout).await?;
        self.get_now(key).await
    }

    /// The value of `key` without waiting: empty when the key is missing.
    pub async fn get_now(&self, key: impl AsRef<[u8]>) -> Result<Vec<u8>, StoreError> {
        let request = Request::Get { key: key.as_ref() };
        self.call(&request, async |c: &mut Connection, d| {
            c.read_value(d).await
        })
        .await
    }

    pub async fn add(&self, key: impl AsRef<[u8]>, delta: i64) -> Result<i64, StoreError> {
        let request = Request::Add {
            key: key.as_ref(),
            delta,
        };
        self.call(&request, async |c: &mut Connection, d| c.read_i64(d).await)
            .await
    }

    /// PyTorch's compare-and-set; see [`crate::state::KvState::compare_set`].
    pub async fn compare_set(
        &self,
        key: impl AsRef<[u8]>,
        expected: impl AsRef<[u8]>,
        desired: impl AsRef<[u8]>,
    ) -> Result<Vec<u8>, StoreError> {
        let request = Request::CompareSet {
            key: key.as_ref(),
            expected: expected.as_ref(),
            desired: desired.as_ref(),
        };
        self.call(&request, async |c: &mut Connection, d| {
            c.read_value(d).await
        })
        .await
    }

    /// Whether every key exists.
    pub async fn check<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<bool, StoreError> {
        let request = Request::Check {
            keys: keys.iter().map(AsRef::as_ref).collect(),
        };
        self.call(&request, async |c: &mut Connection, d| {
            match c.read_u8(d).await? {
                CHECK_READY => Ok(true),
                CHECK_NOT_READY => Ok(false),
                other => Err(c.bad_reply(Command::Check, format!("byte {other}"))),
            }
        })
        .await
    }

    /// Waits until every key exists, or fails with a timeout after `timeout`.
    pub async fn wait<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let keys: Vec<&[u8]> = keys.iter().map(AsRef::as_ref).collect();
        self.wait_for(&keys, timeout).await
    }

    async fn wait_for(&self, keys: &[&[u8]], timeout: Duration) -> Result<(), StoreError> {
        let request = Request::Wait {
            keys: keys.to_vec(),
        };
        let what = || {
            format!(
                "keys {}",
                keys.iter()
                    .map(|k| preview(k))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        self.deferred(&request, Command::Wait, timeout, what).await
    }

    /// Arrives at the barrier `key` and waits until `world_size` callers have.
    pub async fn barrier(
        &self,
        key: impl AsRef<[u8]>,
        world_size: i64,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let key = key.as_ref();
        let request = Request::Barrier { key, world_size };
        let what = || format!("barrier {} of {world_size}", preview(key));
        self.deferred(&request, Command::Barrier, timeout, what)
            .await
    }

    /// Number of keys (queues not counted).
    pub async fn num_keys(&self) -> Result<i64, StoreError> {
        self.call(&Request::GetNumKeys, async |c: &mut Connection, d| {
            c.read_i64(d).await
        })
        .await
    }

    /// Deletes `key`; returns whether it existed.
    pub async fn delete_key(&self, key: impl AsRef<[u8]>) -> Result<bool, StoreError> {
        let request = Request::DeleteKey { key: key.as_ref() };
        self.call(&request, async |c: &mut Connection, d| {
            Ok(c.read_i64(d).await? == 1)
        })
        .await
    }

    pub async fn append(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<(), StoreError> {
        let request = Request::Append {
            key: key.as_ref(),
            value: value.as_ref(),
        };
        self.send_only(&request).await
    }

    /// Waits for every key (up to the client's timeout), then returns their
    /// values, as PyTorch's `multi_get` does.
    pub async fn multi_get<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Vec<u8>>, StoreError> {
        let keys: Vec<&[u8]> = keys.iter().map(AsRef::as_ref).collect();
        self.wait_for(&keys, self.options.timeout).await?;
        let n = keys.len();
        let request = Request::MultiGet { keys };
        self.call(&request, async |c: &mut Connection, d| {
            let mut values = Vec::with_capacity(n);
            for _ in 0..n {
                values.push(c.read_value(d).await?);
            }
            Ok(values)
        })
        .await
    }

    pub async fn multi_set<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        pairs: &[(K, V)],
    ) -> Result<(), StoreError> {
        let request = Request::MultiSet {
            pairs: pairs
                .iter()
                .map(|(k, v)| (k.as_ref(), v.as_ref()))
                .collect(),
        };
        self.send_only(&request).await
    }

    pub async fn queue_push(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<(), StoreError> {
        let request = Request::QueuePush {
            key: key.as_ref(),
            value: value.as_ref(),
        };
        self.send_only(&request).await
    }

    /// Pops the oldest item of queue `key`. With `block`, first waits (up to
    /// the client's timeout) for the queue to be non-empty, as PyTorch does.
    pub async fn queue_pop(
        &self,
        key: impl AsRef<[u8]>,
        block: bool,
    ) -> Result<Vec<u8>, StoreError> {
        let key = key.as_ref();
        if block {
            self.wait_for(&[key], self.options.timeout).await?;
        }
        let request = Request::QueuePop { key };
        let item = self
            .call(&request, async |c: &mut Connection, d| {
                if c.read_i64(d).await? > 0 {
                    Ok(Some(c.read_value(d).await?))
                } else {
                    Ok(None)
                }
            })
            .await?;
        item.ok_or_else(|| StoreError::QueueEmpty { key: preview(key) })
    }

    pub async fn queue_len(&self, key: impl AsRef<[u8]>) -> Result<i64, StoreError> {
        let request = Request::QueueLen { key: key.as_ref() };
        self.call(&request, async |c: &mut Connection, d| c.read_i64(d).await)
            .await
    }

    /// Every key with a value, in no particular order.
    pub async fn list_keys(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        self.call(&Request::ListKeys, async |c: &mut Connection, d| {
            let n = c.read_i64(d).await?;
            let n = usize::try_from(n)
                .map_err(|_| c.bad_reply(Command::ListKeys, format!("count {n}")))?;
            let mut keys = Vec::with_capacity(n.min(1 << 16));
            for _ in 0..n {
                keys.push(c.read_value(d).await?);
            }
            Ok(keys)
        })
        .await
    }

    /// Round trip with a nonce; proves the server is alive and in sync.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let nonce = std::process::id();
        self.call(&Request::Ping { nonce }, async |c: &mut Connection, d| {
            let echoed = c.read_u32(d).await?;
            if echoed == nonce {
                Ok(())
            } else {
                Err(c.bad_reply(Command::Ping, format!("nonce {echoed}, sent {nonce}")))
            }
        })
        .await
    }

    /// Sends a request that has no reply (SET, APPEND, MULTI_SET, QUEUE_PUSH).
    async fn send_only(&self, request: &Request<'_>) -> Result<(), StoreError> {
        self.call(request, async |_: &mut Connection, _| Ok(()))
            .await
    }

    /// Sends `request` and reads its reply with `read`, within the client's
    /// timeout. The connection is dropped on any failure.
    async fn call<T>(
        &self,
        request: &Request<'_>,
        read: impl AsyncFnOnce(&mut Connection, Instant) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut slot = self.conn.lock().await;
        let conn = self.ready(&mut slot).await?;
        // The call's time starts once it has a connection (a reconnect has
        // its own deadline).
        let deadline = Instant::now() + self.options.timeout;
        let result = async {
            conn.send(request, &self.options.limits, deadline).await?;
            read(conn, deadline).await
        }
        .await;
        self.settle(&mut slot, result, request.command())
    }

    /// A WAIT or BARRIER: on timeout, cancels it on the server and drains the
    /// replies so the connection stays usable, as PyTorch's client does.
    async fn deferred(
        &self,
        request: &Request<'_>,
        command: Command,
        timeout: Duration,
        what: impl FnOnce() -> String,
    ) -> Result<(), StoreError> {
        let mut slot = self.conn.lock().await;
        let conn = self.ready(&mut slot).await?;
        let deadline = Instant::now() + timeout;
        // Ok(true): released; Ok(false): timed out and cancelled cleanly.
        let released = async {
            conn.send(request, &self.options.limits, deadline).await?;
            match conn.read_u8(deadline).await {
                Ok(STOP_WAITING) => Ok(true),
                Ok(other) => Err(conn.bad_reply(command, format!("byte {other}"))),
                Err(StoreError::Timeout { .. }) => {
                    let cancel_deadline = Instant::now() + self.options.timeout;
                    conn.send(&Request::CancelWait, &self.options.limits, cancel_deadline)
                        .await?;
                    let mut reply = conn.read_u8(cancel_deadline).await?;
                    if reply == STOP_WAITING {
                        // Released just before the cancel arrived.
                        reply = conn.read_u8(cancel_deadline).await?;
                    }
                    if reply == WAIT_CANCELED {
                        Ok(false)
                    } else {
                        Err(conn.bad_reply(Command::CancelWait, format!("byte {reply}")))
                    }
                }
                Err(e) => Err(e),
            }
        }
        .await;
        match self.settle(&mut slot, released, command)? {
            true => Ok(()),
            false => Err(StoreError::Timeout {
                what: what(),
                timeout,
            }),
        }
    }

    /// The connection in `slot`, opened anew if it is missing or was left
    /// mid-request by a dropped call; marked busy until the call settles.
    async fn ready<'s>(
        &self,
        slot: &'s mut Option<Connection>,
    ) -> Result<&'s mut Connection, StoreError> {
        if slot.as_ref().is_some_and(|c| c.busy) {
            tracing::debug!(addr = %self.addr(), "replacing a connection left mid-request");
            *slot = None;
        }
        let conn = match slot {
            Some(conn) => conn,
            None => slot.insert(self.open(self.options.connect_timeout).await?),
        };
        conn.busy = true;
        Ok(conn)
    }

    fn settle<T>(
        &self,
        slot: &mut Option<Connection>,
        result: Result<T, StoreError>,
        command: Command,
    ) -> Result<T, StoreError> {
        match result {
            Ok(value) => {
                if let Some(conn) = slot.as_mut() {
                    conn.busy = false;
                }
                Ok(value)
            }
            Err(e) => {
                tracing::debug!(addr = %self.addr(), command = command.name(), error = %e, "dropping the connection");
                *slot = None;
                Err(match e {
                    StoreError::Timeout { .. } => StoreError::Timeout {
                        what: format!(
                            "the reply to {} from the store at {}",
                            command.name(),
                            self.addr()
                        ),
                        timeout: self.options.timeout,
                    },
                    other => other,
                })
            }
        }
    }

    async fn open(&self, patience: Duration) -> Result<Connection, StoreError> {
        let start = Instant::now();
        let mut delay = CONNECT_RETRY_MIN;
        loop {
            let connect_within = patience
                .saturating_sub(start.elapsed())
                .clamp(CONNECT_RETRY_MIN, CONNECT_ATTEMPT_MAX);
            let error = match self.try_open(connect_within).await {
                Ok(conn) => return Ok(conn),
                Err(e) => e,
            };
            let waited = start.elapsed();
            if waited + delay > patience {
                return Err(StoreError::Connect {
                    addr: self.addr(),
                    waited,
                    source: error,
                });
            }
            tokio::time::sleep(jitter(delay)).await;
            delay = (delay * 2).min(CONNECT_RETRY_MAX);
        }
    }

    async fn try_open(&self, connect_within: Duration) -> std::io::Result<Connection> {
        // Bounded: a host that is cut off answers nothing, and the kernel
        // would retry the SYN for minutes, with pauses that grow, so the
        // host's return would go unnoticed for as long.
        let connect = TcpStream::connect((self.host.as_str(), self.port));
        let stream = tokio::time::timeout(connect_within, connect)
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer to a connection within {connect_within:?}"),
                )
            })??;
        stream.set_nodelay(true)?;
        let mut conn = Connection {
            stream,
            addr: self.addr(),
            rbuf: BytesMut::with_capacity(4096),
            wbuf: Vec::with_capacity(4096),
            max_reply: self.options.limits.max_frame_bytes,
            busy: false,
        };
        // VALIDATE and PING in one segment, as PyTorch's client sends them.
        let nonce = std::process::id();
        let limits = Limits::default();
        for request in [
            Request::Validate {
                magic: VALIDATION_MAGIC,
            },
            Request::Ping { nonce },
        ] {
            request
                .encode(&limits, &mut conn.wbuf)
                .map_err(std::io::Error::other)?;
        }
        let deadline = Instant::now() + self.options.timeout;
        let handshake = async {
            conn.flush(deadline).await?;
            conn.read_u32(deadline).await
        };
        match handshake.await {
            Ok(echoed) if echoed == nonce => Ok(conn),
            Ok(echoed) => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the server answered PING {nonce} with {echoed}; is it a TCPStore?"),
            )),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }
}

/// One TCP connection and its buffers.
#[derive(Debug)]
pub(crate) struct Connection {
    stream: TcpStream,
    addr: String,
    rbuf: BytesMut,
    wbuf: Vec<u8>,
    /// Largest value accepted in a reply.
    max_reply: usize,
    /// Set while a call owns the connection; still set afterwards means the
    /// call was dropped mid-request and the stream is out of sync.
    busy: bool,
}

impl Connection {
    async fn send(
        &mut self,
        request: &Request<'_>,
        limits: &Limits,
        deadline: Instant,
    ) -> Result<(), StoreError> {
        self.wbuf.clear();
        request.encode(limits, &mut self.wbuf)?;
        self.flush(deadline).await
    }

    async fn flush(&mut self, deadline: Instant) -> Result<(), StoreError> {
        let write = self.stream.write_all(&self.wbuf);
        match tokio::time::timeout_at(deadline, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(self.lost(source)),
            Err(_) => Err(timed_out()),
        }
    }

    async fn fill(&mut self, n: usize, deadline: Instant) -> Result<(), StoreError> {
        while self.rbuf.len() < n {
            // Grow towards `n` as bytes arrive, not all at once.
            self.rbuf.reserve((n - self.rbuf.len()).min(1 << 20));
            let read = self.stream.read_buf(&mut self.rbuf);
            match tokio::time::timeout_at(deadline, read).await {
                Ok(Ok(0)) => {
                    return Err(self.lost(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    )));
                }
                Ok(Ok(_)) => {}
                Ok(Err(source)) => return Err(self.lost(source)),
                Err(_) => return Err(timed_out()),
            }
        }
        Ok(())
    }

    async fn read_u8(&mut self, deadline: Instant) -> Result<u8, StoreError> {
        self.fill(1, deadline).await?;
        Ok(self.rbuf.get_u8())
    }

    async fn read_u32(&mut self, deadline: Instant) -> Result<u32, StoreError> {
        self.fill(4, deadline).await?;
        Ok(self.rbuf.get_u32_le())
    }

    async fn read_i64(&mut self, deadline: Instant) -> Result<i64, StoreError> {
        self.fill(8, deadline).await?;
        Ok(self.rbuf.get_i64_le())
    }

    async fn read_value(&mut self, deadline: Instant) -> Result<Vec<u8>, StoreError> {
        self.fill(8, deadline).await?;
        let len = self.rbuf.get_u64_le();
        let len = usize::try_from(len)
            .ok()
            .filter(|&len| len <= self.max_reply)
            .ok_or_else(|| {
                self.bad_reply(
                    Command::Get,
                    format!(
                        "value length {len} beyond max_frame_bytes = {}",
                        self.max_reply
                    ),
                )
            })?;
        self.fill(len, deadline).await?;
        Ok(self.rbuf.split_to(len).to_vec())
    }

    fn lost(&self, source: std::io::Error) -> StoreError {
        StoreError::ConnectionLost {
            addr: self.addr.clone(),
            source,
        }
    }

    fn bad_reply(&self, command: Command, detail: String) -> StoreError {
        StoreError::BadReply {
            addr: self.addr.clone(),
            command: command.name(),
            detail,
        }
    }
}

/// A deadline passed inside a call; the caller fills in what and how long.
fn timed_out() -> StoreError {
    StoreError::Timeout {
        what: String::new(),
        timeout: Duration::ZERO,
    }
}

/// `d` times a factor in [0.75, 1.25), drawn anew each call: workers that
/// lost the store together do not all knock again at the same instant.
fn jitter(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_nanos()),
    );
    d.mul_f64(0.75 + (h.finish() % 10_000) as f64 / 20_000.0)
}

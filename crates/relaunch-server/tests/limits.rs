//! The server under attack: connections that stall, a flood of them, and
//! what must still work meanwhile (a slow upload, a graceful stop). Real
//! sockets on 127.0.0.1, raw HTTP so that a test can stop mid-request.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use relaunch_server::storage::sqlite::{Durability, SqliteStorage};
use relaunch_server::{AppState, ConnLimits, FileStore};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

/// Longest any step of these tests may take before it counts as hung.
const HUNG: Duration = Duration::from_secs(20);

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    dir: std::path::PathBuf,
}

impl Server {
    async fn start(limits: ConnLimits) -> Self {
        Self::start_with(limits, 64 << 20, |state| state).await
    }

    async fn start_with(
        limits: ConnLimits,
        max_request_bytes: usize,
        configure: impl FnOnce(AppState) -> AppState,
    ) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "relaunch-limits-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let storage = Arc::new(SqliteStorage::open(&dir, Durability::Process).unwrap());
        let files = FileStore::open_dir(&dir, Durability::Process).unwrap();
        let state = configure(AppState::new(storage, files, None, max_request_bytes));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(relaunch_server::serve_with(
            listener,
            state,
            limits,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            addr,
            stop: Some(stop),
            task: Some(task),
            dir,
        }
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.unwrap()
    }

    /// Stops the server and waits until it has finished.
    async fn stop(mut self) {
        self.stop.take().map(|s| s.send(()));
        let task = self.task.take().unwrap();
        timeout(HUNG, task).await.unwrap().unwrap().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn limits(header: Duration, idle: Duration, max_connections: usize) -> ConnLimits {
    ConnLimits {
        header_timeout: header,
        idle_timeout: idle,
        max_connections,
    }
}

/// Reads until the server closes the connection; what it sent.
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match timeout(HUNG, stream.read(&mut buf)).await {
            Err(_) => panic!("the server kept the connection open for {HUNG:?}"),
            Ok(Ok(0) | Err(_)) => return String::from_utf8_lossy(&got).into_owned(),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// One request on a new connection that closes after it; the response.
async fn request(addr: SocketAddr, head: &str, body: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("{head}Host: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    stream.write_all(body).await.unwrap();
    read_until_closed(&mut stream).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_request_head_is_closed_after_the_header_timeout() {
    let header = Duration::from_millis(300);
    let server = Server::start(limits(header, Duration::from_secs(600), 100)).await;
    let mut stream = server.connect().await;
    let started = Instant::now();
    stream
        .write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut stream).await;
    assert!(started.elapsed() >= header);
    assert!(!answer.contains("200 OK"), "{answer}");
    drop(stream);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let idle = Duration::from_millis(300);
    let server = Server::start(limits(Duration::from_secs(600), idle, 100)).await;
    // Before any request, and after one (keep-alive).
    let mut silent = server.connect().await;
    let mut kept = server.connect().await;
    kept.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut kept).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(read_until_closed(&mut silent).await, "");
    drop((silent, kept));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_coming_is_closed_after_the_idle_timeout() {
    let server = Server::start(limits(
        Duration::from_secs(600),
        Duration::from_millis(300),
        100,
    ))
    .await;
    let mut stream = server.connect().await;
    let hash = blake3::hash(&[0u8; 1000]).to_hex();
    stream
        .write_all(
            format!(
                "PUT /api/v1/chunks/{hash} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    stream.write_all(&[0u8; 10]).await.unwrap();
    let answer = read_until_closed(&mut stream).await;
    assert!(!answer.contains("204"), "{answer}");
    drop(stream);
    server.stop().await;
}

/// Sends `chunk` as a PUT /chunks body in pieces, one every `every`, for
/// longer than the idle timeout; the response.
async fn trickle(stream: &mut TcpStream, chunk: &[u8], pieces: usize, every: Duration) -> String {
    let hash = blake3::hash(chunk).to_hex();
    stream
        .write_all(
            format!(
                "PUT /api/v1/chunks/{hash} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
                 Content-Length: {}\r\n\r\n",
                chunk.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    for piece in chunk.chunks(chunk.len().div_ceil(pieces)) {
        tokio::time::sleep(every).await;
        stream.write_all(piece).await.unwrap();
    }
    read_until_closed(stream).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_that_keeps_sending_is_not_cut() {
    let idle = Duration::from_millis(300);
    let server = Server::start(limits(idle, idle, 100)).await;
    let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    let mut stream = server.connect().await;
    let started = Instant::now();
    // 16 pieces of 4 KiB, 100 ms apart: 1.6 s, over five idle timeouts.
    let answer = trickle(&mut stream, &chunk, 16, Duration::from_millis(100)).await;
    assert!(started.elapsed() > idle * 3);
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    drop(stream);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_lets_an_upload_in_flight_finish() {
    let server = Server::start(ConnLimits::default()).await;
    let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 241) as u8).collect();
    let mut stream = server.connect().await;
    // One answered request first: the server has accepted this connection
    // (one still in the listen backlog when the stop comes is reset).
    stream
        .write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answered = Vec::new();
    while !answered.ends_with(b"}") {
        let mut buf = [0u8; 1024];
        let n = timeout(HUNG, stream.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "closed before answering the health check");
        answered.extend_from_slice(&buf[..n]);
    }
    let hash = blake3::hash(&chunk).to_hex();
    // `Expect: 100-continue`: the server says "100 Continue" once the
    // handler reads the body, so the stop below comes while the upload is
    // in flight, not (on a loaded machine) before the server has read the
    // request's head, when the connection is still idle and a stop closes
    // it (CI saw the rest of the body meet a broken pipe).
    stream
        .write_all(
            format!(
                "PUT /api/v1/chunks/{hash} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\
                 Expect: 100-continue\r\n\r\n",
                chunk.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut continued = Vec::new();
    while !continued.ends_with(b"\r\n\r\n") {
        let mut buf = [0u8; 256];
        let n = timeout(HUNG, stream.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "closed before continuing the upload");
        continued.extend_from_slice(&buf[..n]);
    }
    assert!(
        continued.starts_with(b"HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&continued)
    );
    stream.write_all(&chunk[..1000]).await.unwrap();
    let Server {
        addr, stop, task, ..
    } = &mut { server };
    stop.take().map(|s| s.send(()));
    // New connections are no longer accepted once the stop is seen.
    let deadline = Instant::now() + HUNG;
    while TcpStream::connect(*addr).await.is_ok() {
        assert!(Instant::now() < deadline, "still accepting after the stop");
        tokio::task::yield_now().await;
    }
    stream.write_all(&chunk[1000..]).await.unwrap();
    let answer = read_until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    timeout(HUNG, task.take().unwrap())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_connection_cap_the_server_answers_503_naming_the_flag() {
    let server = Server::start(limits(
        Duration::from_secs(600),
        Duration::from_secs(600),
        2,
    ))
    .await;
    // Two connections in the middle of a request head hold the cap (idle
    // ones would be closed to make room).
    let mut holders = [server.connect().await, server.connect().await];
    for holder in &mut holders {
        holder
            .write_all(b"GET /api/v1/health HTTP/1.1\r\n")
            .await
            .unwrap();
    }
    // The server has read both heads' first bytes before the next comes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let answer = request(server.addr, "GET /api/v1/health HTTP/1.1\r\n", b"").await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(
        answer.contains(r#"{"error":"the server has 2 connections open, its limit"#)
            && answer.contains("--max-connections"),
        "{answer}"
    );
    // Once one closes, new clients are served again.
    drop(holders);
    let deadline = Instant::now() + HUNG;
    loop {
        let answer = request(server.addr, "GET /api/v1/health HTTP/1.1\r\n", b"").await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(
            Instant::now() < deadline,
            "still refused after the holders left"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stop().await;
}

/// A connection from `source` (any address of 127.0.0.0/8 is this host's).
async fn connect_from(source: &str, server: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(server).await.unwrap()
}

/// True once the server has closed `stream` (reads end or fail at once).
async fn is_closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        timeout(Duration::from_millis(100), stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_idle_connections_make_room_those_of_the_biggest_holder_first() {
    let server = Server::start(limits(
        Duration::from_secs(600),
        Duration::from_secs(600),
        4,
    ))
    .await;
    // One client's connection, idle longest; then three of a flood from
    // another address, idle too.
    let mut first = connect_from("127.0.0.2", server.addr).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut flood = Vec::new();
    for _ in 0..3 {
        flood.push(connect_from("127.0.0.3", server.addr).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A new client is served rather than refused.
    let answer = request(server.addr, "GET /api/v1/health HTTP/1.1\r\n", b"").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The room came from the flood's address, its oldest connection.
    assert!(is_closed(&mut flood[0]).await);
    assert!(!is_closed(&mut flood[1]).await);
    assert!(!is_closed(&mut flood[2]).await);
    assert!(!is_closed(&mut first).await);
    // More clients in turn: idle connections keep making room.
    for _ in 0..3 {
        let answer = request(server.addr, "GET /api/v1/health HTTP/1.1\r\n", b"").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    drop((first, flood));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_with_a_request_in_flight_is_never_closed_to_make_room() {
    let server = Server::start(limits(
        Duration::from_secs(600),
        Duration::from_secs(600),
        1,
    ))
    .await;
    // An upload under way: a request in flight, its body still coming.
    let mut uploader = server.connect().await;
    uploader
        .write_all(b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let answer = request(server.addr, "GET /api/v1/health HTTP/1.1\r\n", b"").await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(!is_closed(&mut uploader).await);
    drop(uploader);
    server.stop().await;
}

/// This process's virtual memory, in bytes.
fn virtual_memory() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_content_length_reserves_no_memory() {
    let server = Server::start(limits(
        Duration::from_secs(600),
        Duration::from_secs(600),
        1000,
    ))
    .await;
    let before = virtual_memory();
    // Fifty clients each declare 60 MiB and send a few bytes of it.
    let mut clients = Vec::new();
    for _ in 0..50 {
        let mut stream = server.connect().await;
        stream
            .write_all(
                b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Length: 62914560\r\n\r\n{\"a\":",
            )
            .await
            .unwrap();
        clients.push(stream);
    }
    // The server has read them all once a request behind them is answered.
    let answer = request(server.addr, "GET /api/v1/health HTTP/1.1\r\n", b"").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let grown = virtual_memory().saturating_sub(before);
    // Reserving what was declared would be 3 GB.
    assert!(grown < 1 << 30, "virtual memory grew by {grown} bytes");
    drop(clients);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_body_memory_cap_a_request_is_answered_503_and_small_ones_still_pass() {
    let mib = 1 << 20;
    let server = Server::start_with(
        limits(Duration::from_secs(600), Duration::from_secs(600), 100),
        4 * mib,
        |state| state.with_max_body_memory(4 * mib),
    )
    .await;
    // Two uploads of a declared 4 MiB each send 3 MiB and stall: the two
    // cannot both be held in a budget of 4 MiB.
    let mut uploads = Vec::new();
    for _ in 0..2 {
        let mut stream = server.connect().await;
        stream
            .write_all(
                format!(
                    "POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                    4 * mib
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        uploads.push(stream);
    }
    let (mut a, mut b) = (uploads.remove(0), uploads.remove(0));
    let chunk = vec![b' '; 3 * mib];
    let (sent_a, sent_b) = tokio::join!(a.write_all(&chunk), b.write_all(&chunk));
    // The one refused gets its answer while the other still waits (its
    // write may fail, as the server stops reading once it answers).
    let _ = (sent_a, sent_b);
    let (mut buf_a, mut buf_b) = (vec![0u8; 4096], vec![0u8; 4096]);
    let (buf, n) = tokio::select! {
        n = a.read(&mut buf_a) => (&buf_a, n),
        n = b.read(&mut buf_b) => (&buf_b, n),
        () = tokio::time::sleep(HUNG) => panic!("neither upload was refused"),
    };
    let answer = n.unwrap();
    let answer = String::from_utf8_lossy(&buf[..answer]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("--max-body-memory"), "{answer}");
    // A small request is not refused for what the big one holds.
    let run = br#"{"project":"p","id":"small","attempt_token":"t"}"#;
    let answer = request(
        server.addr,
        &format!(
            "POST /api/v1/runs HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            run.len()
        ),
        run,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop((a, b));
    server.stop().await;
}

/// A connection whose receive buffer is small, so that an answer it does
/// not read stays in the server rather than in the kernel's buffers.
async fn connect_small_window(server: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(server).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_clients_do_not_read_hold_at_most_the_response_memory_cap() {
    let mib = 1 << 20;
    let server = Server::start_with(
        limits(Duration::from_secs(600), Duration::from_secs(600), 100),
        64 * mib,
        |state| state.with_max_response_memory(12 * mib),
    )
    .await;
    // A run whose listing is 8 MiB of JSON.
    let config = format!(r#"{{"blob":"{}"}}"#, "x".repeat(8 * mib));
    let run = format!(r#"{{"project":"p","id":"big","attempt_token":"t","config":{config}}}"#);
    let answer = request(
        server.addr,
        &format!(
            "POST /api/v1/runs HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            run.len()
        ),
        run.as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let listing = b"GET /api/v1/runs HTTP/1.1\r\nHost: x\r\n\r\n";
    // One client asks for it and reads only the start of the answer.
    let mut stalled = connect_small_window(server.addr).await;
    stalled.write_all(listing).await.unwrap();
    let mut start = [0u8; 12];
    stalled.read_exact(&mut start).await.unwrap();
    assert_eq!(&start, b"HTTP/1.1 200");
    // The next answer does not fit beside it: a 503 that says why.
    let answer = request(server.addr, "GET /api/v1/runs HTTP/1.1\r\n", b"").await;
    assert!(
        answer.starts_with("HTTP/1.1 503"),
        "{}",
        &answer[..answer.len().min(300)]
    );
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("--max-response-memory"), "{answer}");
    // Light reads are not held back by it.
    let answer = request(server.addr, "GET /api/v1/runs/big HTTP/1.1\r\n", b"").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{}", &answer[..300]);
    // Once the client that did not read is gone, its share is free again.
    drop(stalled);
    let deadline = Instant::now() + HUNG;
    loop {
        let answer = request(server.addr, "GET /api/v1/runs HTTP/1.1\r\n", b"").await;
        if answer.starts_with("HTTP/1.1 200") {
            assert!(answer.len() > 8 * mib);
            break;
        }
        assert!(Instant::now() < deadline, "the share was never given back");
    }
    server.stop().await;
}

#[test]
fn concurrent_reads_never_open_more_readers_than_the_limit() {
    use relaunch_server::Storage as _;
    let dir = std::env::temp_dir().join(format!(
        "relaunch-readers-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let storage = SqliteStorage::open(&dir, Durability::Process)
        .unwrap()
        .with_max_readers(2);
    let start = std::sync::Barrier::new(16);
    std::thread::scope(|s| {
        for _ in 0..16 {
            s.spawn(|| {
                start.wait();
                for _ in 0..50 {
                    storage
                        .list_runs(&relaunch_api::RunFilter::default())
                        .unwrap();
                }
            });
        }
    });
    // Every read finished, and never on more than two connections (they
    // are kept, so the count now is the most there ever were).
    assert!(
        (1..=2).contains(&storage.readers_open()),
        "{}",
        storage.readers_open()
    );
    drop(storage);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A storage whose series reads wait at a gate until the test opens it;
/// everything else goes straight to SQLite.
struct GatedSeries {
    inner: SqliteStorage,
    open: parking_lot::Mutex<bool>,
    opened: parking_lot::Condvar,
    entered: std::sync::atomic::AtomicUsize,
}

impl GatedSeries {
    fn entered(&self) -> usize {
        self.entered.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn open_gate(&self) {
        *self.open.lock() = true;
        self.opened.notify_all();
    }
}

mod gated {
    use relaunch_api::*;
    use relaunch_server::Storage;
    use relaunch_server::storage::StorageError;

    impl Storage for super::GatedSeries {
        fn name(&self) -> &'static str {
            "gated"
        }
        fn series(&self, run: &str, query: &SeriesQuery) -> Result<Series, StorageError> {
            self.entered
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut open = self.open.lock();
            while !*open {
                self.opened.wait(&mut open);
            }
            drop(open);
            self.inner.series(run, query)
        }
        fn open_run(&self, init: &RunInit, now: f64) -> Result<RunInfo, StorageError> {
            self.inner.open_run(init, now)
        }
        fn get_run(&self, id: &str) -> Result<RunInfo, StorageError> {
            self.inner.get_run(id)
        }
        fn patch_run(&self, id: &str, patch: &RunPatch, now: f64) -> Result<RunInfo, StorageError> {
            self.inner.patch_run(id, patch, now)
        }
        fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunInfo>, StorageError> {
            self.inner.list_runs(filter)
        }
        fn count_runs(&self, filter: &RunFilter) -> Result<u64, StorageError> {
            self.inner.count_runs(filter)
        }
        fn metric_names(&self, filter: &RunFilter) -> Result<Vec<String>, StorageError> {
            self.inner.metric_names(filter)
        }
        fn latest_of_runs(
            &self,
            filter: &RunFilter,
            keys: &[String],
        ) -> Result<Vec<RunLatest>, StorageError> {
            self.inner.latest_of_runs(filter, keys)
        }
        fn ingest(&self, run: &str, batch: &Batch, now: f64) -> Result<Ack, StorageError> {
            self.inner.ingest(run, batch, now)
        }
        fn watermark(&self, run: &str, writer: &str) -> Result<u64, StorageError> {
            self.inner.watermark(run, writer)
        }
        fn keys(&self, run: &str) -> Result<Vec<String>, StorageError> {
            self.inner.keys(run)
        }
        fn latest(&self, run: &str) -> Result<Vec<Latest>, StorageError> {
            self.inner.latest(run)
        }
        fn logs(
            &self,
            run: &str,
            rank: Option<u32>,
            after: u64,
            limit: u32,
        ) -> Result<Vec<LogLine>, StorageError> {
            self.inner.logs(run, rank, after, limit)
        }
        fn log_tail(
            &self,
            run: &str,
            rank: Option<u32>,
            n: u32,
        ) -> Result<Vec<LogLine>, StorageError> {
            self.inner.log_tail(run, rank, n)
        }
        fn events(&self, run: &str) -> Result<Vec<Event>, StorageError> {
            self.inner.events(run)
        }
        fn timeline(
            &self,
            run: &str,
        ) -> Result<relaunch_server::storage::timeline::Timeline, StorageError> {
            self.inner.timeline(run)
        }
        fn commit_file(
            &self,
            run: &str,
            file: &FileManifest,
            now: f64,
        ) -> Result<FileInfo, StorageError> {
            self.inner.commit_file(run, file, now)
        }
        fn files(&self, run: &str) -> Result<Vec<FileInfo>, StorageError> {
            self.inner.files(run)
        }
        fn file(&self, run: &str, name: &str) -> Result<(FileInfo, Vec<ChunkRef>), StorageError> {
            self.inner.file(run, name)
        }
        fn delete_file(&self, run: &str, name: &str, now: f64) -> Result<FileInfo, StorageError> {
            self.inner.delete_file(run, name, now)
        }
    }
}

/// One step of `loss`, as the body of `POST /runs/r/batches`.
fn loss_batch(seq: u64) -> Vec<u8> {
    let batch = relaunch_api::Batch {
        writer: "w".into(),
        attempt_token: "t".into(),
        records: vec![(
            seq,
            relaunch_api::Record::Metrics {
                step: seq as i64,
                wall: 0.0,
                rank: 0,
                values: vec![("loss".into(), seq as f64)],
            },
        )],
    };
    let mut body = Vec::new();
    batch.encode(&mut body);
    body
}

async fn send(app: &axum::Router, request: axum::http::Request<axum::body::Body>) -> u16 {
    use tower::ServiceExt as _;
    app.clone()
        .oneshot(request)
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn post_batch(seq: u64) -> axum::http::Request<axum::body::Body> {
    axum::http::Request::post("/api/v1/runs/r/batches")
        .header("content-type", relaunch_api::batch::CONTENT_TYPE)
        .body(axum::body::Body::from(loss_batch(seq)))
        .unwrap()
}

/// Regression: reads waiting for a database reader held threads of the
/// blocking pool, which ingest needs too, so a burst of chart reads
/// delayed a training run's batches. Here the blocking pool has 4 threads
/// and 40 series reads arrive while those that got their turn are stuck:
/// a batch must still be stored while every one of them is held.
#[test]
fn a_batch_is_stored_while_heavy_reads_hold_every_reader() {
    const BLOCKING_THREADS: usize = 4;
    const READS: usize = 40;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
        .unwrap();
    let dir = std::env::temp_dir().join(format!(
        "relaunch-gated-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let storage = Arc::new(GatedSeries {
        inner: SqliteStorage::open(&dir, Durability::Process).unwrap(),
        open: parking_lot::Mutex::new(false),
        opened: parking_lot::Condvar::new(),
        entered: Default::default(),
    });
    let files = FileStore::open_dir(&dir, Durability::Process).unwrap();
    // Three readers: two for heavy reads, one kept for light ones.
    let state = AppState::new(storage.clone(), files, None, 64 << 20).with_max_readers(3);
    let app = relaunch_server::router(state.clone());
    // Whatever happens, the gate opens before the runtime waits for its
    // blocking threads on drop (a failing test must not hang).
    struct OpenOnDrop(Arc<GatedSeries>);
    impl Drop for OpenOnDrop {
        fn drop(&mut self) {
            self.0.open_gate();
        }
    }
    let _gate = OpenOnDrop(storage.clone());
    runtime.block_on(async {
        let open = axum::http::Request::post("/api/v1/runs")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(
                r#"{"id": "r", "attempt_token": "t"}"#,
            ))
            .unwrap();
        assert_eq!(send(&app, open).await, 200);
        assert_eq!(send(&app, post_batch(1)).await, 200);

        let reads: Vec<_> = (0..READS)
            .map(|_| {
                let app = app.clone();
                tokio::spawn(async move {
                    let get =
                        axum::http::Request::get("/api/v1/runs/r/series?key=loss&buckets=100000")
                            .body(axum::body::Body::empty())
                            .unwrap();
                    send(&app, get).await
                })
            })
            .collect();
        // Every read is either in the storage, stuck at the gate, or waiting
        // for its turn; or, were reads let through unbounded, the blocking
        // pool is full of them.
        let deadline = Instant::now() + HUNG;
        loop {
            let (entered, queued) = (storage.entered(), state.heavy_reads_queued());
            if entered + queued == READS || entered == BLOCKING_THREADS {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the reads did not arrive: {entered} in the storage, {queued} queued"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let status = timeout(HUNG, send(&app, post_batch(2)))
            .await
            .expect("the batch waited behind the reads");
        assert_eq!(status, 200);
        // The reads were all still held while the batch was stored.
        assert_eq!(storage.entered(), 2, "only two reads at once");
        assert!(reads.iter().all(|r| !r.is_finished()));

        storage.open_gate();
        for read in reads {
            assert_eq!(timeout(HUNG, read).await.unwrap().unwrap(), 200);
        }
        assert_eq!(storage.entered(), READS);
    });
    drop(app);
    drop(state);
    let _ = std::fs::remove_dir_all(&dir);
}

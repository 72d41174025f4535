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
        let dir = std::env::temp_dir().join(format!(
            "relaunch-limits-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let storage = Arc::new(SqliteStorage::open(&dir, Durability::Process).unwrap());
        let files = FileStore::open_dir(&dir, Durability::Process).unwrap();
        let state = AppState::new(storage, files, None, 64 << 20);
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
    let hash = blake3::hash(&chunk).to_hex();
    stream
        .write_all(
            format!(
                "PUT /api/v1/chunks/{hash} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                chunk.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
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
    // Two connections that send nothing hold the cap.
    let holders = [server.connect().await, server.connect().await];
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

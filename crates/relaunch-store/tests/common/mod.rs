//! Helpers shared by the store's integration tests: a server on loopback, a
//! raw socket that speaks bytes, and waiting on a condition with a deadline.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use relaunch_store::wire::{Limits, Request, VALIDATION_MAGIC};
use relaunch_store::{ClientOptions, RunningServer, ServerOptions, StoreClient, StoreServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const SHORT: Duration = Duration::from_secs(10);

pub async fn server() -> RunningServer {
    server_with(Limits::default()).await
}

pub async fn server_with(limits: Limits) -> RunningServer {
    let options = ServerOptions {
        host: Some("127.0.0.1".into()),
        port: 0,
        limits,
        // Two shards, so that tests cross threads as production does.
        threads: 2,
    };
    StoreServer::bind(&options).await.unwrap().spawn().unwrap()
}

pub async fn client(server: &RunningServer) -> StoreClient {
    let options = ClientOptions {
        timeout: SHORT,
        connect_timeout: SHORT,
        ..ClientOptions::default()
    };
    StoreClient::connect("127.0.0.1", server.port(), options)
        .await
        .unwrap()
}

/// A connection that sends whatever bytes a test gives it.
pub struct Raw {
    pub stream: TcpStream,
}

impl Raw {
    /// Connects without any handshake.
    pub async fn connect(server: &RunningServer) -> Self {
        let stream = TcpStream::connect(("127.0.0.1", server.port()))
            .await
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Self { stream }
    }

    /// Connects and sends VALIDATE, as every torch client does first.
    pub async fn validated(server: &RunningServer) -> Self {
        let mut raw = Self::connect(server).await;
        raw.send(&Request::Validate {
            magic: VALIDATION_MAGIC,
        })
        .await;
        raw
    }

    pub async fn send(&mut self, request: &Request<'_>) {
        let mut buf = Vec::new();
        request.encode(&Limits::default(), &mut buf).unwrap();
        self.stream.write_all(&buf).await.unwrap();
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    pub async fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        tokio::time::timeout(SHORT, self.stream.read_exact(&mut buf))
            .await
            .expect("reply within the deadline")
            .unwrap();
        buf
    }

    /// Whether the server closed the connection (reads EOF or a reset)
    /// within the deadline.
    pub async fn closed_by_server(&mut self) -> bool {
        let mut buf = [0u8; 256];
        let deadline = tokio::time::Instant::now() + SHORT;
        loop {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
            }
        }
    }

    /// Whether nothing arrives within `quiet`.
    pub async fn silent_for(&mut self, quiet: Duration) -> bool {
        let mut buf = [0u8; 1];
        tokio::time::timeout(quiet, self.stream.read(&mut buf))
            .await
            .is_err()
    }
}

/// Polls `condition` until it holds, failing the test after a deadline.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + SHORT;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

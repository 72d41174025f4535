//! The client against a real server in this process: delivery exactly once
//! through server outages, crashed writers, size limits and wrong tokens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use relaunch_api::SeriesQuery;
use relaunch_client::sync::{Outcome, SyncOptions, sync};
use relaunch_client::{ErrorKind, Run, RunOptions};
use relaunch_server::storage::Storage;
use relaunch_server::storage::sqlite::{Durability, SqliteStorage};
use relaunch_server::{AppState, FileStore};

struct TestServer {
    addr: SocketAddr,
    storage: Arc<SqliteStorage>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    data: PathBuf,
    /// A replica serves another's storage and leaves it to that one.
    replica: bool,
}

impl TestServer {
    fn start(listener: TcpListener, token: Option<&str>, max_request_bytes: usize) -> Self {
        let data = temp_dir("server");
        let storage = Arc::new(SqliteStorage::open(&data, Durability::Process).unwrap());
        Self::serve(listener, token, max_request_bytes, storage, data, false)
    }

    /// Another server on this one's storage and files, as replicas on one
    /// database share them.
    fn replica(&self) -> Self {
        let storage = self.storage.clone();
        Self::serve(loopback(), None, 64 << 20, storage, self.data.clone(), true)
    }

    fn serve(
        listener: TcpListener,
        token: Option<&str>,
        max_request_bytes: usize,
        storage: Arc<SqliteStorage>,
        data: PathBuf,
        replica: bool,
    ) -> Self {
        let files = FileStore::open_dir(&data, Durability::Process).unwrap();
        let state = AppState::new(
            storage.clone(),
            files,
            token.map(Into::into),
            max_request_bytes,
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                relaunch_server::serve(listener, state, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        Self {
            addr,
            storage,
            stop: Some(stop),
            thread: Some(thread),
            data,
            replica,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops answering; the storage stays open for its replicas.
    fn stop_serving(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    fn total(&self, run: &str, key: &str, rank: u32) -> u64 {
        let q = SeriesQuery {
            key: key.into(),
            rank: Some(rank),
            buckets: 100_000,
            min_step: None,
            max_step: None,
            attempt: None,
        };
        self.storage.series(run, &q).map(|s| s.total).unwrap_or(0)
    }

    fn steps(&self, run: &str, key: &str) -> Vec<i64> {
        let q = SeriesQuery {
            key: key.into(),
            rank: Some(0),
            buckets: 100_000,
            min_step: None,
            max_step: None,
            attempt: None,
        };
        self.storage
            .series(run, &q)
            .unwrap()
            .points
            .iter()
            .map(|p| p.step)
            .collect()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if self.replica {
            return;
        }
        self.storage.close();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "relaunch-client-{what}-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn loopback() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").unwrap()
}

/// A port no server listens on yet, kept ours until one does: bound but
/// not listening, so connecting is refused, and no other test's server can
/// be given it in the meantime (releasing it and binding again later could
/// hand it to one running in parallel).
struct Reserved(socket2::Socket);

impl Reserved {
    fn new() -> Self {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        socket.bind(&any.into()).unwrap();
        Self(socket)
    }

    fn addr(&self) -> SocketAddr {
        self.0.local_addr().unwrap().as_socket().unwrap()
    }

    /// The same port, now listening.
    fn listen(self) -> TcpListener {
        self.0.listen(128).unwrap();
        self.0.into()
    }
}

fn options(dir: &Path, server: Option<String>, id: &str) -> RunOptions {
    RunOptions {
        project: Some("tests".into()),
        id: Some(id.into()),
        server,
        offline: false,
        dir: Some(dir.to_path_buf()),
        rank: Some(0),
        attempt_token: Some(format!("attempt-{}", rand::random::<u32>())),
        lifecycle_events: Some(true),
        ship_interval: Duration::from_millis(20),
        segment_bytes: Some(64 * 1024),
        ..RunOptions::default()
    }
}

fn log_steps(run: &Run, steps: std::ops::Range<i64>) {
    for step in steps {
        run.log(
            Some(step),
            &[
                ("loss", 1.0 / (step + 1) as f64),
                ("lr", 0.1),
                ("acc", 0.5),
                ("gnorm", 2.0),
            ],
        )
        .unwrap();
    }
}

#[test]
fn logged_values_reach_the_server_once_and_the_spool_is_removed() {
    let server = TestServer::start(loopback(), None, 64 << 20);
    let dir = temp_dir("once");
    let run = Run::start(options(&dir, Some(server.url()), "once")).unwrap();
    log_steps(&run, 0..5000);
    run.flush(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(server.total("once", "loss", 0), 5000);
    assert_eq!(server.total("once", "gnorm", 0), 5000);
    assert_eq!(run.pending(), 0);
    assert_eq!(run.attempt(), Some(0));
    let writer_dir = run.dir().to_path_buf();
    run.finish(Some(Duration::from_secs(30)), None).unwrap();
    assert!(!writer_dir.exists(), "a finished run's spool is removed");
    assert_eq!(
        server.storage.get_run("once").unwrap().status,
        relaunch_api::RunStatus::Finished
    );
    let err = run.log(None, &[("loss", 1.0)]).unwrap_err();
    assert!(err.to_string().contains("finished"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_server_that_is_down_gets_everything_when_it_returns() {
    let port = Reserved::new();
    let addr = port.addr();
    let dir = temp_dir("down");
    let run = Run::start(options(&dir, Some(format!("http://{addr}")), "down")).unwrap();
    log_steps(&run, 0..1000);
    let started = Instant::now();
    let err = run.flush(Some(Duration::from_millis(500))).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(started.elapsed() < Duration::from_secs(5));
    let message = err.to_string();
    assert!(
        message.contains("not acknowledged") && message.contains("cannot reach"),
        "{message}"
    );
    // log() keeps working while the server is away.
    log_steps(&run, 1000..2000);
    let server = TestServer::start(port.listen(), None, 64 << 20);
    run.flush(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(server.steps("down", "loss"), (0..2000).collect::<Vec<_>>());
    run.finish(Some(Duration::from_secs(30)), None).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_next_process_of_a_run_ships_what_a_dead_one_left() {
    let port = Reserved::new();
    let addr = port.addr();
    let dir = temp_dir("adopt");
    // The first process logs while the server is down, then dies.
    let first = Run::start(options(&dir, Some(format!("http://{addr}")), "adopt")).unwrap();
    log_steps(&first, 0..700);
    let first_dir = first.dir().to_path_buf();
    drop(first);
    assert!(first_dir.exists());
    let server = TestServer::start(port.listen(), None, 64 << 20);
    let second = Run::start(options(&dir, Some(server.url()), "adopt")).unwrap();
    log_steps(&second, 500..900);
    second.flush(Some(Duration::from_secs(30))).unwrap();
    // Both attempts' values are kept; reads show the newer attempt's from step 500.
    let q = SeriesQuery {
        key: "loss".into(),
        rank: Some(0),
        buckets: 100_000,
        min_step: None,
        max_step: None,
        attempt: None,
    };
    let series = server.storage.series("adopt", &q).unwrap();
    assert_eq!(series.points.len(), 900);
    let attempts: Vec<u32> = series.points.iter().map(|p| p.attempt).collect();
    assert!(attempts[..500].iter().all(|&a| a == attempts[0]));
    assert!(attempts[500..].iter().all(|&a| a != attempts[0]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while first_dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !first_dir.exists(),
        "the dead writer's spool is removed once shipped"
    );
    second.finish(Some(Duration::from_secs(30)), None).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn batches_shrink_to_fit_the_server_limit_and_an_oversized_record_is_reported() {
    let server = TestServer::start(loopback(), None, 16 * 1024);
    let dir = temp_dir("limit");
    let run = Run::start(options(&dir, Some(server.url()), "limit")).unwrap();
    log_steps(&run, 0..3000);
    run.flush(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(server.total("limit", "loss", 0), 3000);
    run.log_line(0, relaunch_api::Stream::Stdout, &"x".repeat(64 * 1024))
        .unwrap();
    let err = run.flush(Some(Duration::from_secs(30))).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    assert!(err.to_string().contains("--max-request-bytes"), "{err}");
    assert_eq!(run.pending(), 1, "the record stays spooled");
    drop(run);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_wrong_token_fails_flush_at_once_and_keeps_the_records() {
    let server = TestServer::start(loopback(), Some("right"), 64 << 20);
    let dir = temp_dir("token");
    let mut opts = options(&dir, Some(server.url()), "token");
    opts.token = Some("wrong".into());
    let run = Run::start(opts).unwrap();
    log_steps(&run, 0..10);
    let started = Instant::now();
    let err = run.flush(Some(Duration::from_secs(60))).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(err.to_string().contains("wrong token"), "{err}");
    let spool = run.dir().to_path_buf();
    drop(run);
    // `relaunch sync` with the right token ships them.
    let reports = sync(
        &dir,
        &SyncOptions {
            server: None,
            token: Some("right".into()),
            timeout: Some(Duration::from_secs(30)),
        },
    )
    .unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(
        reports[0].outcome,
        Outcome::Shipped { records: 11 },
        "10 steps and the start event"
    );
    assert!(!spool.exists());
    assert_eq!(server.total("token", "loss", 0), 10);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn offline_runs_are_synced_later_and_links_are_not_followed() {
    let dir = temp_dir("offline");
    let mut opts = options(&dir, None, "offline");
    opts.offline = true;
    let run = Run::start(opts).unwrap();
    assert!(run.server().is_none());
    log_steps(&run, 0..250);
    run.finish(None, None).unwrap();
    assert!(run.dir().exists(), "offline, the spool is the record");
    let elsewhere = temp_dir("elsewhere");
    std::os::unix::fs::symlink(&elsewhere, dir.join("linked")).unwrap();
    // No server anywhere: a clear failure per spool, nothing removed.
    let no_server = sync(
        &dir,
        &SyncOptions {
            timeout: Some(Duration::from_secs(1)),
            ..SyncOptions::default()
        },
    )
    .unwrap();
    assert!(
        no_server
            .iter()
            .any(|r| matches!(&r.outcome, Outcome::Failed(m) if m.contains("--server"))),
        "{no_server:?}"
    );
    let server = TestServer::start(loopback(), None, 64 << 20);
    let reports = sync(
        &dir,
        &SyncOptions {
            server: Some(server.url()),
            token: None,
            timeout: Some(Duration::from_secs(30)),
        },
    )
    .unwrap();
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert!(
        matches!(&reports[0].outcome, Outcome::Failed(m) if m.contains("symbolic link")),
        "{reports:?}"
    );
    assert_eq!(reports[1].outcome, Outcome::Shipped { records: 252 });
    assert_eq!(server.total("offline", "loss", 0), 250);
    assert_eq!(
        server.storage.get_run("offline").unwrap().status,
        relaunch_api::RunStatus::Finished
    );
    // A second sync finds nothing left to ship.
    let again = sync(
        &dir,
        &SyncOptions {
            server: Some(server.url()),
            token: None,
            timeout: Some(Duration::from_secs(30)),
        },
    )
    .unwrap();
    assert!(
        again
            .iter()
            .all(|r| !matches!(r.outcome, Outcome::Shipped { .. })),
        "{again:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&elsewhere).unwrap();
}

#[test]
fn bad_arguments_are_refused_before_anything_is_written() {
    let dir = temp_dir("bad");
    for (mut opts, needle) in [
        (options(&dir, None, "../escape"), "run id"),
        (options(&dir, Some("ftp://x".into()), "ok"), "http://"),
        (
            RunOptions {
                project: Some("a/b".into()),
                ..options(&dir, None, "ok2")
            },
            "project",
        ),
    ] {
        opts.offline = opts.server.is_none();
        let err = Run::start(opts).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.to_string().contains(needle), "{err}");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let mut opts = options(&dir, None, "keys");
    opts.offline = true;
    let run = Run::start(opts).unwrap();
    let err = run.log(None, &[("bad\nkey", 1.0)]).unwrap_err();
    assert!(err.to_string().contains("metric key"), "{err}");
    drop(run);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Regression: `Run::start` in one rank adopted orphans while a sibling rank
/// was creating its spool, and locked or removed the sibling's fresh
/// directory ("cannot create segment ... No such file", "already open by
/// another writer"), losing its points. Many ranks of one run start at once,
/// some finishing (and removing their spools) while others still start;
/// every point must arrive exactly once. Bounded: 12 rounds or 60 s.
#[test]
fn ranks_of_one_run_starting_at_once_never_take_each_others_spools() {
    const RANKS: u32 = 12;
    const STEPS: i64 = 40;
    let server = TestServer::start(loopback(), None, 64 << 20);
    let dir = temp_dir("siblings");
    let started = Instant::now();
    let mut rounds = 0;
    while rounds < 12 && started.elapsed() < Duration::from_secs(60) {
        let id = format!("siblings-{rounds}");
        let token = format!("attempt-{rounds}");
        let barrier = Arc::new(std::sync::Barrier::new(RANKS as usize));
        let ranks: Vec<_> = (0..RANKS)
            .map(|rank| {
                let options = RunOptions {
                    rank: Some(rank),
                    attempt_token: Some(token.clone()),
                    ..options(&dir, Some(server.url()), &id)
                };
                let barrier = barrier.clone();
                std::thread::spawn(move || -> Result<(), String> {
                    barrier.wait();
                    let run = Run::start(options).map_err(|e| format!("start: {e}"))?;
                    log_steps(&run, 0..STEPS);
                    run.finish(Some(Duration::from_secs(30)), None)
                        .map_err(|e| format!("finish: {e}"))
                })
            })
            .collect();
        let errors: Vec<String> = ranks
            .into_iter()
            .enumerate()
            .filter_map(|(rank, thread)| match thread.join().unwrap() {
                Ok(()) => None,
                Err(e) => Some(format!("rank {rank}: {e}")),
            })
            .collect();
        assert!(errors.is_empty(), "round {rounds}: {errors:#?}");
        for rank in 0..RANKS {
            assert_eq!(
                server.total(&id, "loss", rank),
                STEPS as u64,
                "round {rounds}, rank {rank}"
            );
        }
        assert!(
            !dir.join(&id).exists(),
            "round {rounds}: every finished rank removed its spool"
        );
        rounds += 1;
    }
    assert!(rounds >= 3, "only {rounds} rounds ran in 60 s");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Replicas: with two servers named, the run moves to the second when the
/// first goes away mid-run (and starts on the second when the first is
/// down from the start), and every step is stored once.
#[test]
fn a_run_moves_to_the_next_replica_and_stores_every_step_once() {
    let dir = temp_dir("replicas");
    let mut first = TestServer::start(loopback(), None, 64 << 20);
    let second = first.replica();
    let both = format!("{},{}", first.url(), second.url());
    let run = Run::start(options(&dir, Some(both), "replicas")).unwrap();
    log_steps(&run, 0..200);
    run.flush(Some(Duration::from_secs(30))).unwrap();
    first.stop_serving();
    log_steps(&run, 200..400);
    run.finish(Some(Duration::from_secs(30)), None).unwrap();
    assert_eq!(second.total("replicas", "loss", 0), 400);
    assert_eq!(
        second.steps("replicas", "loss"),
        (0..400).collect::<Vec<_>>()
    );
    assert_eq!(
        second.storage.get_run("replicas").unwrap().status,
        relaunch_api::RunStatus::Finished
    );

    // The first one listed does not answer at all: the second takes it all.
    let dead = Reserved::new();
    let run = Run::start(options(
        &dir,
        Some(format!("http://{},{}", dead.addr(), second.url())),
        "first-down",
    ))
    .unwrap();
    log_steps(&run, 0..50);
    run.finish(Some(Duration::from_secs(30)), None).unwrap();
    assert_eq!(second.total("first-down", "loss", 0), 50);
    std::fs::remove_dir_all(&dir).unwrap();
}

//! What only the PostgreSQL backend has: schema migrations, errors at
//! start that say what to fix, and several storages (as several server
//! processes would) on one database at once. Needs `RELAUNCH_TEST_POSTGRES`
//! (see `backends/mod.rs`); without it each test says it is skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backends;

use std::sync::Arc;

use relaunch_api::{Batch, Record, RunInit, SeriesQuery};
use relaunch_server::storage::Storage;
use relaunch_server::storage::postgres::PgStorage;
use relaunch_server::storage::postgres::schema::SCHEMA_VERSION;
use relaunch_server::storage::sqlite::Durability;

use backends::{POSTGRES_ENV, TestDb, admin_url, with_database};

fn database(test: &str) -> Option<TestDb> {
    match admin_url() {
        Some(admin) => Some(TestDb::create(&admin)),
        None => {
            backends::say_skipped(&format!("{test} ({POSTGRES_ENV} is not set)"));
            None
        }
    }
}

fn open(db: &TestDb) -> Result<PgStorage, String> {
    PgStorage::open(&db.url, Durability::Fsync, 4).map_err(|e| e.to_string())
}

#[test]
fn migrations_are_applied_once_even_by_servers_starting_together() {
    let Some(db) = database("migrations") else {
        return;
    };
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let url = db.url.clone();
            std::thread::spawn(move || PgStorage::open(&url, Durability::Fsync, 2).map(drop))
        })
        .collect();
    for start in starts {
        start.join().unwrap().unwrap();
    }
    open(&db).unwrap();
    assert_eq!(
        db.query_text("SELECT count(*) FROM relaunch_schema"),
        SCHEMA_VERSION.to_string()
    );
    assert_eq!(
        db.query_text("SELECT max(version) FROM relaunch_schema"),
        SCHEMA_VERSION.to_string()
    );
}

#[test]
fn a_database_with_a_newer_schema_is_refused_saying_so() {
    let Some(db) = database("newer schema") else {
        return;
    };
    drop(open(&db).unwrap());
    let newer = SCHEMA_VERSION + 1;
    db.execute(&format!(
        "INSERT INTO relaunch_schema(version, description) VALUES ({newer}, 'from the future')"
    ));
    let err = open(&db).unwrap_err();
    assert!(
        err.contains(&format!("schema version {newer}"))
            && err.contains(&format!("knows up to {SCHEMA_VERSION}"))
            && err.contains("newer relaunch"),
        "{err}"
    );
    // Refused before touching anything: the future's row is still the newest.
    assert_eq!(
        db.query_text("SELECT max(version) FROM relaunch_schema"),
        newer.to_string()
    );
}

#[test]
fn a_wrong_password_says_what_to_check_and_never_shows_the_password() {
    let Some(db) = database("wrong password") else {
        return;
    };
    // The admin URL carries a password: swap it for a wrong one.
    let (scheme_user, rest) = db.url.split_once('@').unwrap();
    let user = scheme_user.rsplit_once(':').map_or(scheme_user, |(u, _)| u);
    let wrong = format!("{user}:not-the-password@{rest}");
    let err = PgStorage::open(&wrong, Durability::Fsync, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("password authentication failed"), "{err}");
    assert!(err.contains("PGPASSWORD"), "{err}");
    assert!(!err.contains("not-the-password"), "{err}");
}

#[test]
fn an_unreachable_server_and_a_missing_database_say_what_to_do() {
    let Some(db) = database("unreachable") else {
        return;
    };
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = PgStorage::open(
        &format!("postgres://me:pw@127.0.0.1:{port}/db"),
        Durability::Fsync,
        1,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains(&format!(
            "cannot connect to PostgreSQL at me@127.0.0.1:{port}/db"
        )) && err.contains("check that PostgreSQL is running"),
        "{err}"
    );
    let missing = with_database(&db.url, "no_such_database_here");
    let err = PgStorage::open(&missing, Durability::Fsync, 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("does not exist") && err.contains("create the database"),
        "{err}"
    );
}

fn batch(writer: &str, seqs: std::ops::RangeInclusive<u64>, key: &str) -> Batch {
    Batch {
        writer: writer.into(),
        attempt_token: "t0".into(),
        records: seqs
            .map(|seq| {
                (
                    seq,
                    Record::Metrics {
                        step: seq as i64,
                        wall: 0.0,
                        rank: 0,
                        values: vec![(key.into(), seq as f64)],
                    },
                )
            })
            .collect(),
    }
}

fn total(s: &dyn Storage, key: &str) -> u64 {
    s.series(
        "r",
        &SeriesQuery {
            key: key.into(),
            rank: None,
            buckets: 100_000,
            min_step: None,
            max_step: None,
            attempt: None,
        },
    )
    .unwrap()
    .total
}

/// Two storages on one database stand for two server processes: a client
/// whose retries land on both, and writers of one run spread over both,
/// still store every record exactly once, with no deadlock.
#[test]
fn two_servers_on_one_database_store_each_record_once() {
    let Some(db) = database("two servers") else {
        return;
    };
    let a: Arc<dyn Storage> = Arc::new(open(&db).unwrap());
    let b: Arc<dyn Storage> = Arc::new(open(&db).unwrap());
    a.open_run(
        &RunInit {
            id: Some("r".into()),
            attempt_token: "t0".into(),
            ..RunInit::default()
        },
        0.0,
    )
    .unwrap();
    let mut threads = Vec::new();
    for writer in 0..4 {
        for (i, server) in [a.clone(), b.clone(), a.clone(), b.clone()]
            .into_iter()
            .enumerate()
        {
            threads.push(std::thread::spawn(move || {
                let (w, key) = (format!("w{writer}"), format!("k{writer}"));
                // Every copy sends the same batches, in order, racing the others.
                for first in (1..=200).step_by(50) {
                    let ack = server
                        .ingest(
                            "r",
                            &batch(&w, first..=first + 49, &key),
                            f64::from(i as u8),
                        )
                        .unwrap();
                    assert!(ack.watermark >= first + 49, "{ack:?}");
                }
            }));
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    for writer in 0..4 {
        let key = format!("k{writer}");
        assert_eq!(a.watermark("r", &format!("w{writer}")).unwrap(), 200);
        assert_eq!(total(a.as_ref(), &key), 200, "{key} through a");
        assert_eq!(total(b.as_ref(), &key), 200, "{key} through b");
    }
    assert_eq!(a.get_run("r").unwrap().attempts, 1);
    // Stored once, not merely read back once: 4 writers of 200 points.
    assert_eq!(db.query_text("SELECT sum(count) FROM chunks"), "800");
}

/// Replicas: a log follow waiting on one server wakes at once when another
/// server on the same database stores console lines (a dashboard's live
/// log on replica B, the job logging through replica A).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_follow_on_one_replica_wakes_for_lines_stored_through_another() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode, header};
    use relaunch_server::{AppState, FileStore, router};
    use tower::ServiceExt as _;

    let Some(db) = database("replica log follow") else {
        return;
    };
    let files = backends::temp_dir("replica-files");
    let replica = |url: String| {
        let storage: Arc<dyn Storage> =
            Arc::new(PgStorage::open(&url, Durability::Fsync, 4).unwrap());
        AppState::new(
            storage,
            FileStore::open_dir(&files, Durability::Process).unwrap(),
            None,
            1 << 20,
        )
    };
    let (a, b) = (replica(db.url.clone()), replica(db.url.clone()));
    let init = serde_json::json!({"project": "p", "id": "r", "attempt_token": "t"});
    let open = Request::builder()
        .method("POST")
        .uri("/api/v1/runs")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(init.to_string()))
        .unwrap();
    let opened = router(a.clone()).oneshot(open).await.unwrap();
    assert!(opened.status().is_success(), "{}", opened.status());

    let lines = |seq: u64, text: &str| {
        let mut bytes = Vec::new();
        Batch {
            writer: "w".into(),
            attempt_token: "t".into(),
            records: vec![(
                seq,
                Record::Log {
                    rank: 0,
                    stream: relaunch_api::Stream::Stdout,
                    wall: 0.0,
                    text: text.into(),
                },
            )],
        }
        .encode(&mut bytes);
        Request::builder()
            .method("POST")
            .uri("/api/v1/runs/r/batches")
            .header(header::CONTENT_TYPE, relaunch_api::batch::CONTENT_TYPE)
            .body(Body::from(bytes))
            .unwrap()
    };
    // A line already there: the follow waits for the ones after it, as the
    // dashboard's live log does.
    let sent = router(a.clone()).oneshot(lines(1, "before")).await.unwrap();
    assert_eq!(sent.status(), StatusCode::OK);
    let follow = tokio::spawn(
        router(b.clone()).oneshot(
            Request::builder()
                .uri("/api/v1/runs/r/logs?after=1&wait=30")
                .body(Body::empty())
                .unwrap(),
        ),
    );
    // Longer than the listener's stop check (1 s): it must still hear.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert!(
        !follow.is_finished(),
        "the follow waits while there is nothing"
    );
    let sent = router(a.clone())
        .oneshot(lines(2, "through a"))
        .await
        .unwrap();
    assert_eq!(sent.status(), StatusCode::OK);
    let response = tokio::time::timeout(std::time::Duration::from_secs(5), follow)
        .await
        .expect("the follow on the other replica did not wake within 5 s")
        .unwrap()
        .unwrap();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let got: Vec<relaunch_api::LogLine> = serde_json::from_slice(&body).unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].text, "through a");
    drop((a, b));
    let _ = std::fs::remove_dir_all(&files);
}

//! The chunk stores (`BlobStore`): the same tests on a directory and, when
//! `RELAUNCH_TEST_S3` names a location, on S3 (see `backends`); then what
//! only S3 has: errors at start that say what to fix, and a service that
//! goes away while the server runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backends;

use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use relaunch_server::storage::StorageError;
use relaunch_server::storage::blobs::BlobStore;
use relaunch_server::storage::s3::S3Blobs;
use relaunch_server::storage::sqlite::{Durability, SqliteStorage};
use relaunch_server::{AppState, FileStore, router};
use tower::ServiceExt as _;

use backends::{BlobPlace, S3_ENV};

fn hex(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

#[test]
fn chunks_are_stored_once_and_read_back_checked() {
    for place in backends::blob_places("blobs") {
        let name = place.name();
        let blobs = place.open();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let (hash, other) = (hex(&data), hex(b"other"));
        assert_eq!(
            blobs.missing(&[hash.clone(), other.clone()]).unwrap(),
            [hash.clone(), other.clone()],
            "{name}"
        );
        assert_eq!(blobs.size(&hash).unwrap(), None, "{name}");
        blobs.put(&hash, &data).unwrap();
        blobs.put(&hash, &data).unwrap();
        assert_eq!(
            blobs.missing(&[other.clone(), hash.clone()]).unwrap(),
            std::slice::from_ref(&other),
            "{name}"
        );
        assert_eq!(
            blobs.sizes(&[hash.clone(), other.clone()]).unwrap(),
            [Some(data.len() as u64), None],
            "{name}"
        );
        blobs.persist(std::slice::from_ref(&hash)).unwrap();
        assert_eq!(blobs.get(&hash).unwrap(), data, "{name}");
        // Names that are not hashes never reach a path or an object key.
        for bad in ["../../etc/passwd", "AB", ""] {
            assert!(
                matches!(blobs.get(bad), Err(StorageError::Invalid(_))),
                "{name}: {bad}"
            );
            assert!(blobs.put(bad, b"x").is_err(), "{name}: {bad}");
        }
    }
}

#[test]
fn many_chunks_are_asked_about_at_once_in_order() {
    for place in backends::blob_places("blobs-many") {
        let name = place.name();
        let blobs = place.open();
        let chunks: Vec<Vec<u8>> = (0..300u32).map(|i| i.to_le_bytes().repeat(10)).collect();
        let hashes: Vec<String> = chunks.iter().map(|c| hex(c)).collect();
        for (chunk, hash) in chunks.iter().zip(&hashes).step_by(3) {
            blobs.put(hash, chunk).unwrap();
        }
        let missing = blobs.missing(&hashes).unwrap();
        let expected: Vec<String> = hashes
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != 0)
            .map(|(_, h)| h.clone())
            .collect();
        assert_eq!(missing, expected, "{name}");
        let sizes = blobs.sizes(&hashes).unwrap();
        for (i, size) in sizes.iter().enumerate() {
            assert_eq!(*size, (i % 3 == 0).then_some(40), "{name}: chunk {i}");
        }
    }
}

#[test]
fn a_damaged_chunk_reads_as_an_error() {
    for place in backends::blob_places("blobs-damage") {
        let name = place.name();
        let blobs = place.open();
        let data = vec![5u8; 4096];
        let hash = hex(&data);
        blobs.put(&hash, &data).unwrap();
        blobs.persist(std::slice::from_ref(&hash)).unwrap();
        place.damage(&hash, &[6u8; 4096]);
        let err = blobs.get(&hash).unwrap_err();
        assert!(matches!(err, StorageError::Corrupt(_)), "{name}: {err}");
        assert!(
            err.to_string().contains(&hex(&[6u8; 4096])),
            "{name}: {err}"
        );
        // A damaged object of another length is replaced by the next put.
        if let BlobPlace::S3(_) = place {
            place.damage(&hash, b"torn");
            assert_eq!(blobs.size(&hash).unwrap(), Some(4));
            blobs.put(&hash, &data).unwrap();
            assert_eq!(blobs.get(&hash).unwrap(), data, "{name}");
        }
    }
}

#[test]
fn a_chunk_deleted_behind_the_stores_back_is_asked_for_again_once_a_read_misses_it() {
    // The repair the corruption message prescribes: delete the object,
    // upload the file again. The S3 store remembers what it stored, so it
    // must forget a chunk that a read found gone, or the new upload would
    // skip it and commit a file naming a chunk the bucket lacks.
    for place in backends::blob_places("blobs-deleted") {
        let name = place.name();
        let blobs = place.open();
        let data = vec![9u8; 5000];
        let hash = hex(&data);
        blobs.put(&hash, &data).unwrap();
        blobs.persist(std::slice::from_ref(&hash)).unwrap();
        place.delete(&hash);
        let err = blobs.get(&hash).unwrap_err();
        assert!(matches!(err, StorageError::Corrupt(_)), "{name}: {err}");
        let one = std::slice::from_ref(&hash);
        assert_eq!(blobs.missing(one).unwrap(), one, "{name}");
        blobs.put(&hash, &data).unwrap();
        blobs.persist(std::slice::from_ref(&hash)).unwrap();
        assert_eq!(blobs.get(&hash).unwrap(), data, "{name}");
    }
}

#[test]
fn a_chunk_in_the_bucket_is_never_sent_again() {
    let Some(base) = s3_or_skip("a_chunk_in_the_bucket_is_never_sent_again") else {
        return;
    };
    let url = backends::s3_prefix(&base, "dedup");
    let first = S3Blobs::open(&url, None, std::env::vars()).unwrap();
    let data = vec![1u8; 300_000];
    first.put(&hex(&data), &data).unwrap();
    first.put(&hex(&data), &data).unwrap();
    assert_eq!(first.objects_written(), 1);
    // Another server on the same bucket finds it there too.
    let second = S3Blobs::open(&url, None, std::env::vars()).unwrap();
    assert!(second.missing(&[hex(&data)]).unwrap().is_empty());
    second.put(&hex(&data), &data).unwrap();
    assert_eq!(second.objects_written(), 0);
    assert_eq!(second.get(&hex(&data)).unwrap(), data);
}

fn s3_or_skip(test: &str) -> Option<String> {
    let base = backends::s3_url();
    if base.is_none() {
        backends::say_skipped(&format!("{test} ({S3_ENV} is not set)"));
    }
    base
}

/// The test's AWS_* variables, with `changes` applied.
fn vars_with(changes: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| !changes.iter().any(|(c, _)| c == k))
        .collect();
    vars.extend(
        changes
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    vars
}

fn start_error(url: &str, endpoint: Option<&str>, vars: Vec<(String, String)>) -> String {
    let started = std::time::Instant::now();
    let err = S3Blobs::open(url, endpoint, vars).unwrap_err().to_string();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "took {:?} to say: {err}",
        started.elapsed()
    );
    err
}

#[test]
fn an_unreachable_endpoint_is_refused_at_start_saying_so() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let err = start_error(
        "s3://some-bucket/x",
        Some(&endpoint),
        vars_with(&[
            ("AWS_ACCESS_KEY_ID", "key"),
            ("AWS_SECRET_ACCESS_KEY", "not-a-real-secret"),
        ]),
    );
    assert!(err.contains("cannot reach the S3 service"), "{err}");
    assert!(
        err.contains(&endpoint) && err.contains("--s3-endpoint"),
        "{err}"
    );
    assert!(!err.contains("not-a-real-secret"), "{err}");
}

#[test]
fn a_missing_bucket_or_wrong_credentials_are_refused_at_start() {
    let Some(base) = s3_or_skip("a_missing_bucket_or_wrong_credentials_are_refused_at_start")
    else {
        return;
    };
    let err = start_error("s3://no-such-bucket-here/x", None, vars_with(&[]));
    assert!(
        err.contains("bucket no-such-bucket-here does not exist") && err.contains("--blobs"),
        "{err}"
    );
    let err = start_error(
        &base,
        None,
        vars_with(&[("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")]),
    );
    assert!(
        err.contains("refused") && err.contains("AWS_SECRET_ACCESS_KEY"),
        "{err}"
    );
    assert!(!err.contains("wrong-secret-value"), "{err}");
    // A key that may read but not write: the server could store nothing.
    match std::env::var("RELAUNCH_TEST_S3_READONLY") {
        Ok(reader) => {
            let (key, secret) = reader.split_once(':').unwrap();
            let err = start_error(
                &base,
                None,
                vars_with(&[
                    ("AWS_ACCESS_KEY_ID", key),
                    ("AWS_SECRET_ACCESS_KEY", secret),
                ]),
            );
            assert!(err.contains("cannot be written"), "{err}");
        }
        Err(_) => backends::say_skipped(
            "the read-only bucket check (RELAUNCH_TEST_S3_READONLY is not set)",
        ),
    }
}

#[test]
fn s3_runs_under_ci() {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false") {
        assert!(
            backends::s3_url().is_some(),
            "CI is set but {S3_ENV} is not: the S3 runs of the chunk store tests would be \
             skipped; run the tests through scripts/test.sh, which starts SeaweedFS"
        );
    }
}

/// A TCP proxy to the S3 service that can be cut, as a network or a
/// service that goes away while the server runs.
struct Proxy {
    url: String,
    addr: std::net::SocketAddr,
    stopped: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn to(endpoint: &str) -> Self {
        let target = endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stopped = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (stop, open) = (stopped.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break; // the listener closes: new connections are refused
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let mut open = open.lock().unwrap();
                open.push(client.try_clone().unwrap());
                open.push(server.try_clone().unwrap());
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Self {
            url: format!("http://{addr}"),
            addr,
            stopped,
            conns,
        }
    }

    /// Closes every connection and refuses new ones.
    fn cut(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
        for conn in self.conns.lock().unwrap().drain(..) {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}

/// S3 going away while the server runs: requests that need it fail with a
/// 503 and a message that says so (after the retries), never a panic.
#[tokio::test]
async fn s3_going_away_is_a_503_saying_so() {
    let Some(base) = s3_or_skip("s3_going_away_is_a_503_saying_so") else {
        return;
    };
    let proxy = Proxy::to(&std::env::var("AWS_ENDPOINT_URL").unwrap());
    let url = backends::s3_prefix(&base, "away");
    let blobs = Arc::new(S3Blobs::open(&url, Some(&proxy.url), std::env::vars()).unwrap());
    let data = vec![3u8; 1000];
    let dir = backends::temp_dir("s3-away");
    let storage = Arc::new(SqliteStorage::open(&dir, Durability::Process).unwrap());
    let state = AppState::new(
        storage,
        FileStore::new(blobs, dir.join("uploads")).unwrap(),
        None,
        1 << 20,
    );
    let ask = || {
        let body = serde_json::json!({"chunks": [hex(&data)]}).to_string();
        router(state.clone()).oneshot(
            Request::builder()
                .method("POST")
                .uri("/api/v1/chunks/missing")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body))
                .unwrap(),
        )
    };
    assert_eq!(ask().await.unwrap().status(), StatusCode::OK);

    proxy.cut();
    let started = std::time::Instant::now();
    let response = ask().await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let error: relaunch_api::ApiError = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{}", error.error);
    assert!(
        error.error.contains("unreachable or failing") && error.error.contains(&url),
        "{}",
        error.error
    );
    // The retries are bounded (30 s), not endless.
    assert!(started.elapsed() < std::time::Duration::from_secs(40));
    let _ = std::fs::remove_dir_all(&dir);
}

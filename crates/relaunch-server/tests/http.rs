//! The HTTP API through `router(..).oneshot(..)`: no socket, real handlers,
//! real storage. What clients see: statuses and the messages in bodies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backends;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use relaunch_api::{Ack, ApiError, Batch, Record, RunInfo, Series};
use std::sync::Arc;

use relaunch_server::storage::blobs::BlobStore;
use relaunch_server::storage::s3::S3Blobs;
use relaunch_server::storage::sqlite::Durability;
use relaunch_server::{AppState, FileStore, router};
use tower::ServiceExt as _;

struct Server {
    state: AppState,
    dir: std::path::PathBuf,
    /// The PostgreSQL database, when the storage is PostgreSQL.
    _place: backends::Place,
    /// Where the chunks are: `dir/chunks`, or a prefix in S3.
    blobs: backends::BlobPlace,
    /// The S3 chunk store, when the chunks are in S3.
    s3: Option<Arc<S3Blobs>>,
}

impl Server {
    /// A server on each storage backend available (see `backends`), with
    /// its files in a directory of its own.
    fn each(token: Option<&str>, max_request_bytes: usize) -> Vec<Self> {
        backends::places("http")
            .into_iter()
            .map(|place| {
                let dir = match backends::dir_of(&place) {
                    Some(dir) => dir.to_owned(),
                    None => backends::temp_dir("http-files"),
                };
                let blobs = backends::BlobPlace::Dir(dir.clone());
                Self::new(place, dir, blobs, token, max_request_bytes)
            })
            .collect()
    }

    /// [`each`](Self::each), and the same again with the chunks in S3
    /// when `RELAUNCH_TEST_S3` names a location (SQLite + S3, PostgreSQL
    /// + S3): what the file tests run on.
    fn each_with_s3(token: Option<&str>, max_request_bytes: usize) -> Vec<Self> {
        let mut servers = Self::each(token, max_request_bytes);
        let Some(base) = backends::s3_url() else {
            backends::blob_places("http"); // says that S3 is skipped
            return servers;
        };
        for place in backends::places("http-s3") {
            let dir = match backends::dir_of(&place) {
                Some(dir) => dir.to_owned(),
                None => backends::temp_dir("http-files"),
            };
            let blobs = backends::BlobPlace::S3(backends::s3_prefix(&base, "http"));
            servers.push(Self::new(place, dir, blobs, token, max_request_bytes));
        }
        servers
    }

    fn new(
        place: backends::Place,
        dir: std::path::PathBuf,
        blobs: backends::BlobPlace,
        token: Option<&str>,
        max_request_bytes: usize,
    ) -> Self {
        let storage = place.open(Durability::Process);
        let (store, s3): (Arc<dyn BlobStore>, _) = match &blobs {
            backends::BlobPlace::S3(url) => {
                let s3 = Arc::new(S3Blobs::open(url, None, std::env::vars()).unwrap());
                (s3.clone(), Some(s3))
            }
            dir_blobs => (dir_blobs.open(), None),
        };
        Self {
            state: AppState::new(
                storage,
                FileStore::new(store, dir.join("uploads")).unwrap(),
                token.map(Into::into),
                max_request_bytes,
            ),
            dir,
            _place: place,
            blobs,
            s3,
        }
    }

    /// Which backends, for assertion messages.
    fn name(&self) -> String {
        format!("{} + {}", self._place.name(), self.blobs.name())
    }

    async fn send(&self, request: Request<Body>) -> (StatusCode, Vec<u8>) {
        let response = router(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, body.to_vec())
    }

    async fn json(
        &self,
        method: &str,
        uri: &str,
        body: serde_json::Value,
    ) -> (StatusCode, Vec<u8>) {
        self.send(
            Request::builder()
                .method(method)
                .uri(uri)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
    }

    /// The whole response to a GET of `uri`, its body unread.
    async fn response(&self, uri: &str) -> axum::response::Response {
        let request = Request::builder().uri(uri).body(Body::empty()).unwrap();
        router(self.state.clone()).oneshot(request).await.unwrap()
    }

    /// Opens run `id` (attempt token "t").
    async fn open_run(&self, id: &str) {
        let (status, body) = self
            .json(
                "POST",
                "/api/v1/runs",
                serde_json::json!({"id": id, "attempt_token": "t"}),
            )
            .await;
        assert!(
            status.is_success(),
            "{status}: {}",
            String::from_utf8_lossy(&body)
        );
    }

    async fn get(&self, uri: &str) -> (StatusCode, Vec<u8>) {
        self.send(Request::builder().uri(uri).body(Body::empty()).unwrap())
            .await
    }

    async fn batch(&self, run: &str, batch: &Batch) -> (StatusCode, Vec<u8>) {
        let mut bytes = Vec::new();
        batch.encode(&mut bytes);
        self.send(
            Request::builder()
                .method("POST")
                .uri(format!("/api/v1/runs/{run}/batches"))
                .header(header::CONTENT_TYPE, relaunch_api::batch::CONTENT_TYPE)
                .body(Body::from(bytes))
                .unwrap(),
        )
        .await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn error(body: &[u8]) -> ApiError {
    serde_json::from_slice(body).unwrap()
}

fn loss(writer: &str, steps: std::ops::Range<i64>) -> Batch {
    Batch {
        writer: writer.into(),
        attempt_token: "t".into(),
        records: steps
            .map(|s| {
                (
                    s as u64 + 1,
                    Record::Metrics {
                        step: s,
                        wall: 0.0,
                        rank: 0,
                        values: vec![("loss".into(), s as f64)],
                    },
                )
            })
            .collect(),
    }
}

#[tokio::test]
async fn a_run_logs_and_reads_back() {
    for server in Server::each(None, 1 << 20) {
        let (status, body) = server
        .json("POST", "/api/v1/runs", serde_json::json!({"project": "p", "id": "r1", "attempt_token": "t", "config": {"lr": 0.1}}))
        .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let run: RunInfo = serde_json::from_slice(&body).unwrap();
        assert_eq!((run.id.as_str(), run.attempt), ("r1", Some(0)));
        let (status, body) = server.batch("r1", &loss("w", 0..2000)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            serde_json::from_slice::<Ack>(&body).unwrap().watermark,
            2000
        );
        let (status, body) = server
            .get("/api/v1/runs/r1/series?key=loss&buckets=100")
            .await;
        assert_eq!(status, StatusCode::OK);
        let series: Series = serde_json::from_slice(&body).unwrap();
        assert!(series.points.len() <= 100 && series.total == 2000 && series.downsampled);
        let (status, body) = server.get("/api/v1/runs?project=p&param=lr=0.1").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            serde_json::from_slice::<Vec<RunInfo>>(&body).unwrap().len(),
            1
        );
        let (status, body) = server.get("/api/v1/openapi.json").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["paths"]["/runs/{id}/batches"]
            .is_object()
    );
    }
}

#[tokio::test]
async fn a_token_guards_every_data_path() {
    for server in Server::each(Some("s3cret"), 1 << 20) {
        let (status, body) = server.get("/api/v1/runs").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(error(&body).error.contains("Authorization: Bearer TOKEN"));
        let wrong = Request::builder()
            .uri("/api/v1/runs")
            .header(header::AUTHORIZATION, "Bearer nope")
            .body(Body::empty())
            .unwrap();
        let (status, body) = server.send(wrong).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(error(&body).error.contains("wrong token"));
        let right = Request::builder()
            .uri("/api/v1/runs")
            .header(header::AUTHORIZATION, "Bearer s3cret")
            .body(Body::empty())
            .unwrap();
        assert_eq!(server.send(right).await.0, StatusCode::OK);
        // The dashboard's read cookie, which `POST /session` sets when made
        // with the token: good for reads (a download link), never for
        // writes. Issue 35: the token itself was the cookie, set by script.
        let session = Request::builder()
            .method("POST")
            .uri("/api/v1/session")
            .header(header::AUTHORIZATION, "Bearer s3cret")
            .body(Body::empty())
            .unwrap();
        let response = router(server.state.clone()).oneshot(session).await.unwrap();
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
        let set = response.headers()[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            set.contains("; Path=/api/v1; HttpOnly; SameSite=Strict") && !set.contains("s3cret"),
            "{set}"
        );
        let pair = set.split(';').next().unwrap().to_owned();
        assert!(pair.starts_with("relaunch_session_"), "{pair}");
        let with_cookie = |method: &str, cookie: &str| {
            Request::builder()
                .method(method)
                .uri("/api/v1/runs")
                .header(header::COOKIE, cookie)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(r#"{"project": "p", "attempt_token": "t"}"#))
                .unwrap()
        };
        let cookie = format!("theme=dark; {pair}");
        assert_eq!(
            server.send(with_cookie("GET", &cookie)).await.0,
            StatusCode::OK
        );
        let (status, body) = server.send(with_cookie("POST", &cookie)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(error(&body).error.contains("Authorization: Bearer TOKEN"));
        let (name, _) = pair.split_once('=').unwrap();
        for refused in [format!("{name}=nope"), "relaunch_token=s3cret".to_owned()] {
            let (status, _) = server.send(with_cookie("GET", &refused)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{refused}");
        }
        // Health stays open, for load balancers.
        assert_eq!(server.get("/api/v1/health").await.0, StatusCode::OK);
    }
}

#[tokio::test]
async fn an_oversized_request_gets_413_naming_the_limit() {
    for server in Server::each(None, 1000) {
        server
            .json(
                "POST",
                "/api/v1/runs",
                serde_json::json!({"project": "p", "id": "r", "attempt_token": "t"}),
            )
            .await;
        let (status, body) = server.batch("r", &loss("w", 0..1000)).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        let e = error(&body);
        assert_eq!(e.kind, "too_large");
        assert!(
            e.error.contains("limit of 1000 bytes") && e.error.contains("--max-request-bytes"),
            "{}",
            e.error
        );
        // Without a Content-Length (a stream), the limit holds too.
        let mut bytes = Vec::new();
        loss("w", 0..1000).encode(&mut bytes);
        let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
            bytes.chunks(100).map(|c| Ok(c.to_vec())).collect();
        let request = Request::builder()
            .method("POST")
            .uri("/api/v1/runs/r/batches")
            .header(header::CONTENT_TYPE, relaunch_api::batch::CONTENT_TYPE)
            .body(Body::from_stream(tokio_stream::iter(pieces)))
            .unwrap();
        assert_eq!(server.send(request).await.0, StatusCode::PAYLOAD_TOO_LARGE);
    }
}

/// Regression: bits flipped on the way were stored as other values.
#[tokio::test]
async fn a_damaged_batch_is_refused_whole_and_stores_nothing() {
    for server in Server::each(None, 1 << 20) {
        server
            .json(
                "POST",
                "/api/v1/runs",
                serde_json::json!({"project": "p", "id": "r", "attempt_token": "t"}),
            )
            .await;
        let mut bytes = Vec::new();
        loss("w", 0..100).encode(&mut bytes);
        // One bit of one value.
        let at = bytes.len() / 2;
        bytes[at] ^= 0x10;
        let (status, body) = server
            .send(
                Request::builder()
                    .method("POST")
                    .uri("/api/v1/runs/r/batches")
                    .header(header::CONTENT_TYPE, relaunch_api::batch::CONTENT_TYPE)
                    .body(Body::from(bytes))
                    .unwrap(),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let e = error(&body).error;
        assert!(
            e.contains("damaged on the way") && e.contains("send it again"),
            "{e}"
        );
        let (status, body) = server.get("/api/v1/runs/r/keys").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(String::from_utf8_lossy(&body), "[]");
        // Sent again undamaged, it is stored.
        let (status, _) = server.batch("r", &loss("w", 0..100)).await;
        assert_eq!(status, StatusCode::OK);
        // A wall time that is not a time is refused, not stored as null.
        let mut bad_wall = loss("w", 100..101);
        bad_wall.records[0].0 = 101;
        if let Record::Metrics { wall, .. } = &mut bad_wall.records[0].1 {
            *wall = f64::NAN;
        }
        let (status, body) = server.batch("r", &bad_wall).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            error(&body).error.contains("wall time NaN"),
            "{}",
            error(&body).error
        );
    }
}

#[tokio::test]
async fn bad_input_gets_clear_errors() {
    for server in Server::each(None, 1 << 20) {
        server
            .json(
                "POST",
                "/api/v1/runs",
                serde_json::json!({"project": "p", "id": "r", "attempt_token": "t"}),
            )
            .await;
        // Names that could leave a directory, plain or encoded.
        for bad in [
            "..",
            ".hidden",
            "%2e%2e",
            "a%2Fb",
            "%2Fetc%2Fpasswd",
            "a%00b",
            "%5C..%5Cx",
        ] {
            let (status, body) = server.get(&format!("/api/v1/runs/{bad}")).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(error(&body).error.contains("is not allowed"), "{bad}");
        }
        let (status, body) = server
            .json(
                "POST",
                "/api/v1/runs",
                serde_json::json!({"project": "../etc", "attempt_token": "t"}),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(error(&body).error.contains("project"));
        let (status, body) = server
            .json("POST", "/api/v1/runs", serde_json::json!({"project": 5}))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            error(&body)
                .error
                .contains("not valid JSON for this request")
        );
        // A batch that is not one.
        let garbage = Request::builder()
            .method("POST")
            .uri("/api/v1/runs/r/batches")
            .header(header::CONTENT_TYPE, relaunch_api::batch::CONTENT_TYPE)
            .body(Body::from("{\"loss\": 1}"))
            .unwrap();
        let (status, body) = server.send(garbage).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(error(&body).error.contains("malformed batch"));
        let json_batch = server
            .json("POST", "/api/v1/runs/r/batches", serde_json::json!({}))
            .await;
        assert_eq!(json_batch.0, StatusCode::BAD_REQUEST);
        assert!(
            error(&json_batch.1)
                .error
                .contains("application/x-relaunch-batch")
        );
        // A gap in a writer's records.
        server.batch("r", &loss("w", 0..10)).await;
        let mut gap = loss("w", 20..30);
        gap.records.iter_mut().for_each(|(seq, _)| *seq += 5);
        let (status, body) = server.batch("r", &gap).await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert!(error(&body).error.contains("send from 11"));
        // Unknown things.
        assert_eq!(
            server.get("/api/v1/runs/nope").await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(server.get("/api/v1/nothing").await.0, StatusCode::NOT_FOUND);
        let (status, body) = server.get("/api/v1/runs?colour=red").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(error(&body).error.contains("unknown filter"));
        let (status, _) = server.get("/api/v1/runs/r/series").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) = server.get("/api/v1/runs/r/series?key=loss&buckets=0").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
}

#[tokio::test]
async fn a_log_follow_wakes_when_lines_arrive() {
    for server in Server::each(None, 1 << 20) {
        server
            .json(
                "POST",
                "/api/v1/runs",
                serde_json::json!({"project": "p", "id": "r", "attempt_token": "t"}),
            )
            .await;
        let state = server.state.clone();
        let follow = tokio::spawn(async move {
            let request = Request::builder()
                .uri("/api/v1/runs/r/logs?wait=30")
                .body(Body::empty())
                .unwrap();
            let response = router(state).oneshot(request).await.unwrap();
            axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap()
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(
            !follow.is_finished(),
            "the follow waits while there is nothing"
        );
        let lines = Batch {
            writer: "w".into(),
            attempt_token: "t".into(),
            records: vec![(
                1,
                Record::Log {
                    rank: 0,
                    stream: relaunch_api::Stream::Stdout,
                    wall: 0.0,
                    text: "hi".into(),
                },
            )],
        };
        server.batch("r", &lines).await;
        let body = tokio::time::timeout(std::time::Duration::from_secs(10), follow)
            .await
            .unwrap()
            .unwrap();
        let got: Vec<relaunch_api::LogLine> = serde_json::from_slice(&body).unwrap();
        assert_eq!(got[0].text, "hi");
    }
}

/// Regression: a batch numbered [1, 3] was stored (then record 2 was
/// acknowledged and dropped), and numbers above 2^63-1 were clamped.
#[tokio::test]
async fn batches_with_gaps_or_huge_sequence_numbers_get_400() {
    for server in Server::each(None, 1 << 20) {
        server.open_run("r").await;
        let mut gap = loss("w", 0..3);
        gap.records.remove(1);
        let (status, body) = server.batch("r", &gap).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            error(&body)
                .error
                .contains("must be consecutive: 3 follows 1"),
            "{}",
            error(&body).error
        );
        let mut huge = loss("w", 0..1);
        huge.records[0].0 = 1 << 63;
        let (status, body) = server.batch("r", &huge).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            error(&body).error.contains("1 to 9223372036854775807"),
            "{}",
            error(&body).error
        );
        let (_, body) = server.get("/api/v1/runs/r/watermark?writer=w").await;
        assert_eq!(serde_json::from_slice::<Ack>(&body).unwrap().watermark, 0);
    }
}

/// Regression: NaN and the infinities were written as JSON null.
#[tokio::test]
async fn non_finite_values_are_strings_in_json() {
    for server in Server::each(None, 1 << 20) {
        server.open_run("r").await;
        let mut batch = loss("w", 0..3);
        for ((_, record), v) in
            batch
                .records
                .iter_mut()
                .zip([f64::NAN, f64::INFINITY, f64::NEG_INFINITY])
        {
            if let Record::Metrics { values, .. } = record {
                values[0].1 = v;
            }
        }
        assert_eq!(server.batch("r", &batch).await.0, StatusCode::OK);
        let (status, body) = server.get("/api/v1/runs/r/series?key=loss").await;
        assert_eq!(status, StatusCode::OK);
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let values: Vec<&serde_json::Value> = json["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| &p["value"])
            .collect();
        assert_eq!(values, ["NaN", "Infinity", "-Infinity"]);
        let series: Series = serde_json::from_slice(&body).unwrap();
        assert!(series.points[0].value.is_nan());
        assert_eq!(series.points[2].min, f64::NEG_INFINITY);
        let (_, body) = server.get("/api/v1/runs/r/latest").await;
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json[0]["value"], "-Infinity");
        let (_, body) = server.get("/api/v1/latest?key=loss").await;
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json[0]["value"], "-Infinity", "{json}");
    }
}

/// Regression: event data that was not JSON, or nested too deep, was
/// stored and read back as null; writer ids skipped the name rules; event
/// kinds could hold control characters.
#[tokio::test]
async fn event_data_kinds_and_writer_ids_are_checked() {
    for server in Server::each(None, 1 << 20) {
        server.open_run("r").await;
        let event = |kind: &str, data: String| Batch {
            writer: "w".into(),
            attempt_token: "t".into(),
            records: vec![(
                1,
                Record::Event {
                    kind: kind.into(),
                    wall: 1.0,
                    text: String::new(),
                    data,
                },
            )],
        };
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        for (batch, says) in [
            (event("note", "{not json".into()), "not valid JSON"),
            (event("note", deep(65)), "more than 64"),
            (event("bad\u{1b}[2Jkind", "{}".into()), "printable text"),
            (
                Batch {
                    writer: "../w".into(),
                    ..loss("w", 0..1)
                },
                "writer id \"../w\" is not allowed",
            ),
        ] {
            let (status, body) = server.batch("r", &batch).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{says}");
            assert!(error(&body).error.contains(says), "{}", error(&body).error);
        }
        let (status, _) = server.batch("r", &event("note", deep(64))).await;
        assert_eq!(status, StatusCode::OK);
        let (_, body) = server.get("/api/v1/runs/r/events").await;
        let events: Vec<relaunch_api::Event> = serde_json::from_slice(&body).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data.to_string(), deep(64));
    }
}

// --- files ---------------------------------------------------------------

fn hex(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

impl Server {
    async fn put_chunk(&self, hash: &str, data: &[u8]) -> (StatusCode, Vec<u8>) {
        self.send(
            Request::builder()
                .method("PUT")
                .uri(format!("/api/v1/chunks/{hash}"))
                .body(Body::from(data.to_vec()))
                .unwrap(),
        )
        .await
    }

    async fn range(&self, uri: &str, range: &str) -> (StatusCode, Vec<u8>, Option<String>) {
        let response = router(self.state.clone())
            .oneshot(
                Request::builder()
                    .uri(uri)
                    .header(header::RANGE, range)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let content_range = response
            .headers()
            .get(header::CONTENT_RANGE)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, body.to_vec(), content_range)
    }
}

#[tokio::test]
async fn a_file_is_committed_from_its_chunks_and_read_back_in_ranges() {
    for server in Server::each_with_s3(None, 1 << 20) {
        let (status, _) = server
            .json(
                "POST",
                "/api/v1/runs",
                serde_json::json!({"id": "r", "attempt_token": "t"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        let (a, b) = (vec![1u8; 1000], vec![2u8; 500]);
        let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
        let manifest = serde_json::json!({
            "name": "ckpt/model.pt",
            "size": 1500,
            "blake3": hex(&whole),
            "chunks": [{"hash": hex(&a), "size": 1000}, {"hash": hex(&b), "size": 500}],
        });

        let (status, body) = server
            .json(
                "POST",
                "/api/v1/chunks/missing",
                serde_json::json!({"chunks": [hex(&a), hex(&b)]}),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        let missing: relaunch_api::MissingChunks = serde_json::from_slice(&body).unwrap();
        assert_eq!(missing.missing, [hex(&a), hex(&b)]);

        // Not visible before every chunk is in.
        assert_eq!(
            server.put_chunk(&hex(&a), &a).await.0,
            StatusCode::NO_CONTENT
        );
        let (status, body) = server
            .json("POST", "/api/v1/runs/r/files", manifest.clone())
            .await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert!(
            error(&body)
                .error
                .contains("1 of the file's 2 chunks are not on the server")
        );
        assert_eq!(
            server.get("/api/v1/runs/r/files/ckpt/model.pt").await.0,
            StatusCode::NOT_FOUND
        );

        // A chunk whose bytes do not match its name is refused.
        let (status, body) = server.put_chunk(&hex(&b), b"tampered").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            error(&body).error.contains("damaged on the way"),
            "{}",
            error(&body).error
        );

        assert_eq!(
            server.put_chunk(&hex(&b), &b).await.0,
            StatusCode::NO_CONTENT
        );
        let (status, _) = server.json("POST", "/api/v1/runs/r/files", manifest).await;
        assert_eq!(status, StatusCode::CREATED);
        let (status, body) = server.get("/api/v1/runs/r/files/ckpt/model.pt").await;
        assert_eq!((status, body), (StatusCode::OK, whole.clone()));
        let (status, body, range) = server
            .range("/api/v1/runs/r/files/ckpt/model.pt", "bytes=990-1009")
            .await;
        assert_eq!(status, StatusCode::PARTIAL_CONTENT);
        assert_eq!(body, whole[990..1010]);
        assert_eq!(range.as_deref(), Some("bytes 990-1009/1500"));
        let (status, _, range) = server
            .range("/api/v1/runs/r/files/ckpt/model.pt", "bytes=1500-")
            .await;
        assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE);
        assert_eq!(range.as_deref(), Some("bytes */1500"));

        let (_, body) = server.get("/api/v1/runs/r/files").await;
        let files: Vec<relaunch_api::FileInfo> = serde_json::from_slice(&body).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!((files[0].size, files[0].chunks), (1500, 2));
    }
}

#[tokio::test]
async fn bad_file_requests_get_clear_errors() {
    for server in Server::each_with_s3(None, 1 << 20) {
        server.open_run("r").await;
        let data = vec![7u8; 10];
        let good = serde_json::json!({"hash": hex(&data), "size": 10});
        for (manifest, says) in [
            (
                serde_json::json!({"name": "../x", "size": 10, "blake3": hex(&data), "chunks": [good]}),
                "file name",
            ),
            (
                serde_json::json!({"name": "/abs", "size": 10, "blake3": hex(&data), "chunks": [good]}),
                "file name",
            ),
            (
                serde_json::json!({"name": "x", "size": 11, "blake3": hex(&data), "chunks": [good]}),
                "add up to 10 bytes",
            ),
            (
                serde_json::json!({"name": "x", "size": 10, "blake3": "zz", "chunks": [good]}),
                "not a BLAKE3 hash",
            ),
            (
                serde_json::json!({"name": "x", "size": 0, "blake3": hex(&data), "chunks": [{"hash": hex(&data), "size": 0}]}),
                "1 to",
            ),
            (serde_json::json!({"name": "x"}), "not valid JSON"),
        ] {
            let (status, body) = server
                .json("POST", "/api/v1/runs/r/files", manifest.clone())
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{manifest}");
            assert!(
                error(&body).error.contains(says),
                "{manifest}: {}",
                error(&body).error
            );
        }
        let (status, body) = server.put_chunk("../../etc/passwd", &data).await;
        assert!(status.is_client_error(), "{status}");
        assert!(!body.is_empty());
        let big = vec![0u8; relaunch_api::files::CHUNK_MAX + 1];
        let (status, body) = server.put_chunk(&hex(&big), &big).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(error(&body).error.contains("4194304 bytes"));
        for path in [
            "/api/v1/runs/r/files/..%2f..%2fetc/passwd",
            "/api/v1/runs/r/files/a//b",
            "/api/v1/runs/nope/files/x",
        ] {
            let (status, body) = server.get(path).await;
            assert!(status.is_client_error(), "{path}: {status}");
            assert!(!error(&body).error.is_empty());
        }
        let (status, body) = server
            .json(
                "POST",
                "/api/v1/chunks/missing",
                serde_json::json!({"chunks": ["nope"]}),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(error(&body).error.contains("64 lowercase hex digits"));
    }
}

/// Regression: a manifest whose chunk sizes or hash were not those of its
/// chunks was committed, and its download panicked mid-response (declared
/// larger) or served truncated bytes (declared smaller).
#[tokio::test]
async fn a_manifest_must_match_its_chunks_bytes() {
    for server in Server::each_with_s3(None, 1 << 20) {
        server.open_run("r").await;
        let (a, b) = (vec![1u8; 1000], vec![2u8; 500]);
        let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
        server.put_chunk(&hex(&a), &a).await;
        server.put_chunk(&hex(&b), &b).await;
        let manifest = |name: &str, blake3: &str, sizes: [u64; 2]| {
            serde_json::json!({
                "name": name,
                "size": sizes[0] + sizes[1],
                "blake3": blake3,
                "chunks": [
                    {"hash": hex(&a), "size": sizes[0]},
                    {"hash": hex(&b), "size": sizes[1]},
                ],
            })
        };
        for (sizes, says) in [
            ([4000, 500], "chunk 0 ("),
            ([1000, 499], "chunk 1 ("),
            (
                [999, 500],
                "declared as 999 bytes, but the stored chunk with that hash holds 1000",
            ),
        ] {
            let (status, body) = server
                .json(
                    "POST",
                    "/api/v1/runs/r/files",
                    manifest("x", &hex(&whole), sizes),
                )
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{sizes:?}");
            assert!(error(&body).error.contains(says), "{}", error(&body).error);
        }
        assert_eq!(
            server.get("/api/v1/runs/r/files/x").await.0,
            StatusCode::NOT_FOUND
        );

        // One chunk: the file's hash is the chunk's, checked at commit.
        let one = serde_json::json!({
            "name": "one", "size": 1000, "blake3": hex(&b),
            "chunks": [{"hash": hex(&a), "size": 1000}],
        });
        let (status, body) = server.json("POST", "/api/v1/runs/r/files", one).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            error(&body).error.contains("its bytes hash to"),
            "{}",
            error(&body).error
        );
        let empty = serde_json::json!({"name": "e", "size": 0, "blake3": hex(&a), "chunks": []});
        let (status, _) = server.json("POST", "/api/v1/runs/r/files", empty).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);

        // Several chunks with a wrong whole hash: refused at commit (the
        // server reads them whole once), so nothing is served as the file.
        let (status, body) = server
            .json(
                "POST",
                "/api/v1/runs/r/files",
                manifest("lie", &hex(b"lie"), [1000, 500]),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            error(&body).error.contains("its 2 chunks hash to")
                && error(&body).error.contains(&hex(&whole)),
            "{}",
            error(&body).error
        );
        assert_eq!(
            server.get("/api/v1/runs/r/files/lie").await.0,
            StatusCode::NOT_FOUND
        );

        // The true manifest commits and reads back whole.
        let (status, _) = server
            .json(
                "POST",
                "/api/v1/runs/r/files",
                manifest("x", &hex(&whole), [1000, 500]),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(
            server.get("/api/v1/runs/r/files/x").await,
            (StatusCode::OK, whole)
        );
    }
}

impl Server {
    async fn put_file(&self, name: &str, data: &[u8]) -> (StatusCode, Vec<u8>) {
        self.send(
            Request::builder()
                .method("PUT")
                .uri(format!("/api/v1/runs/r/files/{name}"))
                .body(Body::from(data.to_vec()))
                .unwrap(),
        )
        .await
    }

    async fn body_of(
        &self,
        uri: &str,
        range: Option<&str>,
    ) -> (StatusCode, Result<Vec<u8>, String>) {
        let mut request = Request::builder().uri(uri);
        if let Some(range) = range {
            request = request.header(header::RANGE, range);
        }
        let response = router(self.state.clone())
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .map(|b| b.to_vec())
            .map_err(|e| e.to_string());
        (status, body)
    }
}

/// A chunk the store already holds is never sent again: `/chunks/missing`
/// leaves it out, and a plain upload of bytes already stored writes
/// nothing new (counted on S3, where a write is a PUT to the bucket).
#[tokio::test]
async fn a_chunk_already_stored_is_not_sent_again() {
    for server in Server::each_with_s3(None, 1 << 20) {
        let name = server.name();
        server.open_run("r").await;
        let (a, b, c) = (vec![1u8; 1000], vec![2u8; 500], vec![3u8; 700]);
        server.put_chunk(&hex(&a), &a).await;
        server.put_chunk(&hex(&b), &b).await;
        let (status, body) = server
            .json(
                "POST",
                "/api/v1/chunks/missing",
                serde_json::json!({"chunks": [hex(&a), hex(&c), hex(&b)]}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{name}");
        let missing: relaunch_api::MissingChunks = serde_json::from_slice(&body).unwrap();
        assert_eq!(missing.missing, [hex(&c)], "{name}");

        let written = || server.s3.as_ref().map(|s| s.objects_written());
        let before = written();
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
        assert_eq!(
            server.put_file("one.bin", &data).await.0,
            StatusCode::CREATED,
            "{name}"
        );
        let after_one = written();
        assert_eq!(
            server.put_file("two.bin", &data).await.0,
            StatusCode::CREATED,
            "{name}"
        );
        if server.s3.is_some() {
            assert_eq!(
                after_one,
                before.map(|n| n + 1),
                "{name}: the first upload writes its chunk"
            );
            assert_eq!(
                written(),
                after_one,
                "{name}: the second sends nothing to the bucket"
            );
        }
        assert_eq!(
            server.get("/api/v1/runs/r/files/two.bin").await,
            (StatusCode::OK, data),
            "{name}"
        );
    }
}

/// A chunk whose stored bytes changed behind the server's back (a disk's
/// rot, someone writing into the bucket) is never served: the body is cut
/// where it would begin, and the other chunks still read.
#[tokio::test]
async fn a_damaged_chunk_is_an_error_never_wrong_bytes() {
    for server in Server::each_with_s3(None, 1 << 20) {
        let name = server.name();
        server.open_run("r").await;
        let (a, b) = (vec![1u8; 1000], vec![2u8; 500]);
        let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
        server.put_chunk(&hex(&a), &a).await;
        server.put_chunk(&hex(&b), &b).await;
        let manifest = serde_json::json!({
            "name": "x", "size": 1500, "blake3": hex(&whole),
            "chunks": [{"hash": hex(&a), "size": 1000}, {"hash": hex(&b), "size": 500}],
        });
        let (status, _) = server.json("POST", "/api/v1/runs/r/files", manifest).await;
        assert_eq!(status, StatusCode::CREATED, "{name}");
        assert_eq!(
            server.get("/api/v1/runs/r/files/x").await.1,
            whole,
            "{name}"
        );

        // The same length: only the hash can tell.
        server.blobs.damage(&hex(&b), &[7u8; 500]);
        let (status, body) = server.body_of("/api/v1/runs/r/files/x", None).await;
        assert_eq!(status, StatusCode::OK, "{name}");
        assert!(body.is_err(), "{name}: damaged bytes were served");
        let (status, body) = server
            .body_of("/api/v1/runs/r/files/x", Some("bytes=1000-1009"))
            .await;
        assert_eq!(status, StatusCode::PARTIAL_CONTENT, "{name}");
        assert!(body.is_err(), "{name}: damaged bytes were served");
        let (status, body) = server
            .body_of("/api/v1/runs/r/files/x", Some("bytes=0-9"))
            .await;
        assert_eq!(
            (status, body),
            (StatusCode::PARTIAL_CONTENT, Ok(whole[..10].to_vec())),
            "{name}"
        );
    }
}

/// The dashboard's pages are static and open; the data they show is not.
#[tokio::test]
async fn the_dashboard_is_served_outside_the_token_guard() {
    for server in Server::each(Some("s3cret"), 1 << 20) {
        for page in ["/", "/runs/abc", "/runs/a.b-c", "/compare"] {
            let response = server.response(page).await;
            assert_eq!(response.status(), StatusCode::OK, "{page}");
            assert_eq!(
                response.headers()[header::CONTENT_TYPE],
                "text/html; charset=utf-8"
            );
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            assert!(String::from_utf8_lossy(&body).contains("/assets/app.js"));
        }
        let response = server.response("/assets/vendor/uplot/uPlot.esm.js").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/javascript; charset=utf-8"
        );
        let etag = response.headers()[header::ETAG].clone();
        let again = Request::builder()
            .uri("/assets/vendor/uplot/uPlot.esm.js")
            .header(header::IF_NONE_MATCH, etag)
            .body(Body::empty())
            .unwrap();
        assert_eq!(server.send(again).await.0, StatusCode::NOT_MODIFIED);
        assert_eq!(server.get("/assets/nope.js").await.0, StatusCode::NOT_FOUND);
        // The API stays guarded, and unknown API paths stay JSON errors.
        assert_eq!(
            server.get("/api/v1/latest?key=loss").await.0,
            StatusCode::UNAUTHORIZED
        );
        let (status, body) = server.get("/api/v1/nope").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(error(&body).error.contains("no such API path"));
    }
}

#[tokio::test]
async fn latest_values_of_many_runs_in_one_request() {
    for server in Server::each(None, 1 << 20) {
        for id in ["r1", "r2"] {
            let (status, _) = server
                .json(
                    "POST",
                    "/api/v1/runs",
                    serde_json::json!({"project": "p", "id": id, "attempt_token": "t"}),
                )
                .await;
            assert_eq!(status, StatusCode::OK);
        }
        assert_eq!(
            server.batch("r1", &loss("w", 0..10)).await.0,
            StatusCode::OK
        );
        let (status, body) = server.get("/api/v1/keys?project=p").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            serde_json::from_slice::<Vec<String>>(&body).unwrap(),
            ["loss"]
        );
        let (status, body) = server.get("/api/v1/latest?project=p&key=loss").await;
        assert_eq!(status, StatusCode::OK);
        let latest: Vec<relaunch_api::RunLatest> = serde_json::from_slice(&body).unwrap();
        assert_eq!(latest.len(), 1);
        assert_eq!((latest[0].run.as_str(), latest[0].latest.step), ("r1", 9));
        let (status, body) = server.get("/api/v1/latest?project=p").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(error(&body).error.contains("key=NAME"));
        let (status, body) = server.get("/api/v1/keys?color=red").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(error(&body).error.contains("unknown filter"));
    }
}

/// Metrics of `rank` at `steps`, in attempt `token`, from writer `writer`.
fn points(writer: &str, token: &str, rank: u32, key: &str, steps: &[(i64, f64)]) -> Batch {
    Batch {
        writer: writer.into(),
        attempt_token: token.into(),
        records: steps
            .iter()
            .enumerate()
            .map(|(i, &(step, value))| {
                let record = Record::Metrics {
                    step,
                    wall: 1000.0 + step as f64,
                    rank,
                    values: vec![(key.into(), value)],
                };
                (i as u64 + 1, record)
            })
            .collect(),
    }
}

#[tokio::test]
async fn history_answers_every_point_exactly_in_columns() {
    use relaunch_api::columns::{self, Columns};
    for server in Server::each(None, 1 << 20) {
        server.open_run("h").await;
        let first: Vec<(i64, f64)> = (0..10).map(|s| (s, s as f64)).collect();
        let other: Vec<(i64, f64)> = (0..10).map(|s| (s, -(s as f64))).collect();
        let odd = [
            (0, f64::NAN),
            (1, f64::INFINITY),
            (i64::MAX, f64::NEG_INFINITY),
        ];
        for batch in [
            points("w0", "t", 0, "loss", &first),
            points("w1", "t", 1, "loss", &other),
            points("w2", "t", 0, "odd", &odd),
        ] {
            let (status, body) = server.batch("h", &batch).await;
            assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        }
        // The run resumes from step 5 in a second attempt.
        let (status, _) = server
            .json(
                "POST",
                "/api/v1/runs",
                serde_json::json!({"id": "h", "attempt_token": "t2"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        let resumed: Vec<(i64, f64)> = (5..8).map(|s| (s, 100.0 + s as f64)).collect();
        let (status, _) = server
            .batch("h", &points("w3", "t2", 0, "loss", &resumed))
            .await;
        assert_eq!(status, StatusCode::OK);

        let read = |query: &'static str| {
            let server = &server;
            async move {
                let response = server
                    .response(&format!("/api/v1/runs/h/history{query}"))
                    .await;
                assert_eq!(response.status(), StatusCode::OK, "{query}");
                assert_eq!(
                    response.headers()[header::CONTENT_TYPE],
                    columns::CONTENT_TYPE
                );
                let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .unwrap();
                columns::decode(&body).unwrap()
            }
        };
        let find = |all: &[Columns], key: &str, rank: u32| {
            all.iter()
                .find(|c| c.key == key && c.rank == rank)
                .cloned()
                .unwrap_or_else(|| panic!("no {key} of rank {rank} in {all:?}"))
        };
        // Everything: each step from the newest attempt that logged it.
        let all = read("").await;
        assert_eq!(all.len(), 3, "{all:?}");
        let loss0 = find(&all, "loss", 0);
        assert_eq!(loss0.step, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(loss0.value, [0.0, 1.0, 2.0, 3.0, 4.0, 105.0, 106.0, 107.0]);
        assert_eq!(loss0.attempt, [0, 0, 0, 0, 0, 1, 1, 1]);
        assert_eq!(loss0.wall[2], 1002.0);
        let odd_read = find(&all, "odd", 0);
        assert_eq!(odd_read.step, [0, 1, i64::MAX]);
        assert!(odd_read.value[0].is_nan());
        assert_eq!(odd_read.value[1..], [f64::INFINITY, f64::NEG_INFINITY]);
        // One attempt, one rank, some keys, a step range.
        let before = read("?key=loss&rank=0&attempt=0").await;
        assert_eq!(before.len(), 1);
        assert_eq!(before[0].step, (0..10).collect::<Vec<_>>());
        let other_rank = read("?key=loss&rank=1&min_step=2&max_step=4").await;
        assert_eq!(other_rank.len(), 1);
        assert_eq!(other_rank[0].value, [-2.0, -3.0, -4.0]);
        assert!(read("?rank=7").await.is_empty());

        // Bad input: a key the run never logged, a parameter that is not one.
        let (status, body) = server.get("/api/v1/runs/h/history?key=nope").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(
            error(&body).error.contains("no metric \"nope\""),
            "{}",
            error(&body).error
        );
        let (status, body) = server.get("/api/v1/runs/h/history?rank=x").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            error(&body)
                .error
                .contains("rank \"x\" is not a whole number")
        );
        let (status, body) = server.get("/api/v1/runs/h/history?buckets=9").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(error(&body).error.contains("unknown parameter \"buckets\""));
        let (status, _) = server.get("/api/v1/runs/nope/history").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
}

/// A listing's page comes with how many runs its filter selects in all,
/// and a bad order, page or metric filter is a 400 that says what to write.
#[tokio::test]
async fn a_listing_page_says_how_many_runs_match_in_all() {
    for server in Server::each(None, 1 << 20) {
        for i in 0..5 {
            server.open_run(&format!("r{i}")).await;
            server.batch(&format!("r{i}"), &loss("w", 0..(i + 1))).await;
        }
        let page = |uri: &str| {
            let request = Request::builder().uri(uri).body(Body::empty()).unwrap();
            let app = router(server.state.clone());
            async move {
                let response = app.oneshot(request).await.unwrap();
                let total = response
                    .headers()
                    .get("x-total-count")
                    .map(|v| v.to_str().unwrap().to_owned());
                let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .unwrap();
                let runs: Vec<RunInfo> = serde_json::from_slice(&body).unwrap();
                (runs.into_iter().map(|r| r.id).collect::<Vec<_>>(), total)
            }
        };
        // The loss of r{i} ends at i: the highest first, two a page.
        let (ids, total) = page("/api/v1/runs?sort=-summary.loss&limit=2&offset=2").await;
        assert_eq!(ids, ["r2", "r1"]);
        assert_eq!(total.as_deref(), Some("5"));
        let (ids, total) = page("/api/v1/runs?metric=loss%3E1.5&sort=created").await;
        assert_eq!(ids, ["r2", "r3", "r4"]);
        assert_eq!(total.as_deref(), Some("3"));
        let (ids, total) = page("/api/v1/runs?q=R4").await;
        assert_eq!(
            (ids.as_slice(), total.as_deref()),
            (&["r4".to_owned()][..], Some("1"))
        );
        for (query, says) in [
            ("sort=size", "sort by created"),
            ("offset=-1", "offset \"-1\" is not a whole number"),
            ("metric=loss", "KEY OP NUMBER"),
            ("param=lr%3Cadam", "compares numbers"),
        ] {
            let (status, body) = server.get(&format!("/api/v1/runs?{query}")).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
            assert!(
                error(&body).error.contains(says),
                "{query}: {}",
                error(&body).error
            );
        }
    }
}

/// Regression: 996 `param=` filters made the database refuse the query's
/// expression, answered as a 500.
#[tokio::test]
async fn too_many_config_filters_are_a_400_that_names_the_limit() {
    for server in Server::each(None, 1 << 20) {
        server.open_run("r").await;
        let params = |n: usize| {
            (0..n)
                .map(|i| format!("param=a{i}=1"))
                .collect::<Vec<_>>()
                .join("&")
        };
        for path in ["/api/v1/runs", "/api/v1/keys"] {
            let (status, body) = server.get(&format!("{path}?{}", params(100))).await;
            assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
            let (status, body) = server.get(&format!("{path}?{}", params(996))).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
            assert!(
                error(&body)
                    .error
                    .contains("more than 100 param= and metric= filters")
            );
        }
        let (status, _) = server
            .get(&format!("/api/v1/latest?key=loss&{}", params(100)))
            .await;
        assert_eq!(status, StatusCode::OK);
        let (status, body) = server
            .get(&format!("/api/v1/latest?key=loss&{}", params(101)))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            error(&body)
                .error
                .contains("more than 100 param= and metric= filters")
        );
    }
}

#[tokio::test]
async fn goodput_answers_per_attempt_and_404_for_an_unknown_run() {
    for server in Server::each(None, 1 << 20) {
        let (status, body) = server.get("/api/v1/runs/nope/goodput").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{}", server.name());
        let e = error(&body);
        assert_eq!(e.kind, "not_found");
        assert!(e.error.contains("nope"), "{}", e.error);

        // Two attempts: steps 0..=9 then, from a restart, 5..=14.
        for (token, started) in [("L:0", 0.0), ("L:1", 20.0)] {
            let init =
                serde_json::json!({"id": "g", "attempt_token": token, "attempt_started": started});
            let (status, _) = server.json("POST", "/api/v1/runs", init).await;
            assert_eq!(status, StatusCode::OK);
        }
        let batch = |token: &str,
                     steps: std::ops::RangeInclusive<i64>,
                     base: f64,
                     events: &[(&str, f64)]| {
            let mut records: Vec<Record> = events
                .iter()
                .map(|(kind, wall)| Record::Event {
                    kind: (*kind).into(),
                    wall: *wall,
                    text: String::new(),
                    data: String::new(),
                })
                .collect();
            records.extend(steps.map(|step| Record::Metrics {
                step,
                wall: base + step as f64,
                rank: 0,
                values: vec![("loss".into(), 1.0)],
            }));
            Batch {
                writer: format!("w-{}", token.replace(':', "-")),
                attempt_token: token.into(),
                records: records
                    .into_iter()
                    .enumerate()
                    .map(|(i, r)| (i as u64 + 1, r))
                    .collect(),
            }
        };
        let first = batch("L:0", 0..=9, 1.0, &[("start", 0.0), ("restart", 12.0)]);
        let second = batch("L:1", 5..=14, 20.0, &[("start", 20.0), ("finished", 40.0)]);
        for b in [first, second] {
            assert_eq!(server.batch("g", &b).await.0, StatusCode::OK);
        }
        let (status, body) = server.get("/api/v1/runs/g/goodput").await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let g: relaunch_api::Goodput = serde_json::from_slice(&body).unwrap();
        assert_eq!((g.run.as_str(), g.running, g.wall_s), ("g", false, 40.0));
        // Attempt 0: start-up 1, steps 0..=4 kept (1 to 5), re-run 5..=9
        // (5 to 10), stop to 12, restart to 20. Attempt 1: start-up 5,
        // steps 25 to 34, stop to 40.
        let a: Vec<(f64, f64, f64, f64, f64, u64)> = g
            .attempts
            .iter()
            .map(|a| {
                (
                    a.startup_s,
                    a.productive_s,
                    a.rerun_s,
                    a.stop_s,
                    a.restart_s,
                    a.steps_re_run,
                )
            })
            .collect();
        assert_eq!(
            a,
            [(1.0, 4.0, 5.0, 2.0, 8.0, 5), (5.0, 9.0, 0.0, 6.0, 0.0, 0)]
        );
        assert_eq!(g.goodput, Some(13.0 / 40.0));
        assert_eq!(g.interruptions[0].lost_s, 5.0 + 2.0 + 8.0 + 5.0);
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["attempts"][0]["ended"], "restart");
    }
}

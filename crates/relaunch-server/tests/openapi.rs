//! `openapi.json` against the code it describes: every schema against the
//! Rust type it names (the same fields, of the same JSON types, required
//! exactly when the type cannot do without them), and its paths against
//! the router's routes, both ways. A field or route added without its
//! description fails here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use relaunch_api::{
    Ack, ApiError, AttemptEnd, AttemptGoodput, ChunkQuery, ChunkRef, ChunkUpload, ChunkUploads,
    DirectChunk, Event, FileInfo, FileManifest, Goodput, Health, Interruption, Latest, LogLine,
    MissingChunks, RunInfo, RunInit, RunLatest, RunPatch, RunStatus, Series, SeriesPoint, Stream,
    UploadQuery,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const OPENAPI: &str = include_str!("../src/openapi.json");
const ROUTER: &str = include_str!("../src/lib.rs");

fn document() -> Value {
    serde_json::from_str(OPENAPI).expect("openapi.json is JSON")
}

/// Checks the schema `name` against `sample`, a value of its type with
/// every field present.
fn check<T: Serialize + DeserializeOwned>(name: &str, sample: &T) {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    let schema = &schemas[name];
    assert!(schema.is_object(), "openapi.json has no schema {name}");
    let full = serde_json::to_value(sample).unwrap();
    let fields: BTreeSet<&str> = full
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let described: BTreeSet<&str> = schema["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{name} has no properties"))
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        described, fields,
        "openapi.json's {name} describes these fields; the type has those"
    );
    for (field, value) in full.as_object().unwrap() {
        let described = &schema["properties"][field];
        if let Err(e) = check_type(schemas, described, value, &format!("{name}.{field}")) {
            panic!("{e}");
        }
    }
    // Required: exactly the fields the type cannot be read without.
    let required: BTreeSet<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().map(|v| v.as_str().unwrap()).collect())
        .unwrap_or_default();
    let mut wrong = Vec::new();
    for field in &fields {
        let mut without = full.clone();
        without.as_object_mut().unwrap().remove(*field);
        let needed = serde_json::from_value::<T>(without).is_err();
        if needed != required.contains(field) {
            wrong.push(format!(
                "{name}.{field}: the type {} it, openapi.json {} it as required",
                if needed { "needs" } else { "does without" },
                if needed { "does not list" } else { "lists" },
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `value` is of the JSON type `schema` says; what is not, when not.
fn check_type(schemas: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.trim_start_matches("#/components/schemas/");
        return check_type(schemas, &schemas[name], value, at);
    }
    if let Some(choices) = schema["oneOf"].as_array() {
        return if choices
            .iter()
            .any(|choice| check_type(schemas, choice, value, at).is_ok())
        {
            Ok(())
        } else {
            Err(format!("{at}: {value} fits none of {schema}"))
        };
    }
    let fits = match schema["type"].as_str() {
        None => true,
        Some("object") => value.is_object(),
        Some("array") => match value.as_array() {
            Some(items) => {
                for item in items {
                    check_type(schemas, &schema["items"], item, &format!("{at}[]"))?;
                }
                true
            }
            None => false,
        },
        Some("string") => value.as_str().is_some_and(|s| {
            schema["enum"]
                .as_array()
                .is_none_or(|choices| choices.iter().any(|c| c == s))
        }),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some(other) => return Err(format!("{at}: no check for the type {other}")),
    };
    if fits {
        Ok(())
    } else {
        Err(format!(
            "{at}: {value} is not what openapi.json says ({schema})"
        ))
    }
}

fn sample_latest() -> Latest {
    Latest {
        key: "loss".into(),
        rank: 0,
        step: 3,
        value: f64::NAN,
        wall: 1.5,
        attempt: 1,
    }
}

fn sample_point() -> SeriesPoint {
    SeriesPoint {
        step: 1,
        wall: 2.0,
        value: f64::INFINITY,
        min: 0.5,
        max: 2.5,
        count: 2,
        attempt: 0,
    }
}

#[test]
fn every_schema_is_its_type() {
    check(
        "RunInit",
        &RunInit {
            project: Some("p".into()),
            id: Some("r".into()),
            name: Some("n".into()),
            config: Some(json!({"lr": 0.1})),
            tags: vec!["t".into()],
            notes: Some("n".into()),
            attempt_token: "a".into(),
            attempt_started: Some(1.0),
        },
    );
    check(
        "RunInfo",
        &RunInfo {
            id: "r".into(),
            project: "p".into(),
            name: "n".into(),
            status: RunStatus::Running,
            created_at: 1.0,
            updated_at: 2.0,
            attempts: 1,
            attempt: Some(0),
            tags: vec!["t".into()],
            notes: String::new(),
            config: json!({}),
        },
    );
    check(
        "RunPatch",
        &RunPatch {
            status: Some(RunStatus::Finished),
            tags: Some(vec![]),
            notes: Some(String::new()),
            config: Some(json!({})),
        },
    );
    check(
        "Ack",
        &Ack {
            writer: "w".into(),
            watermark: 3,
        },
    );
    check("SeriesPoint", &sample_point());
    check(
        "Series",
        &Series {
            key: "loss".into(),
            rank: 0,
            total: 1,
            downsampled: false,
            points: vec![sample_point()],
        },
    );
    check("Latest", &sample_latest());
    check(
        "RunLatest",
        &RunLatest {
            run: "r".into(),
            latest: sample_latest(),
        },
    );
    check(
        "LogLine",
        &LogLine {
            id: 1,
            rank: 0,
            stream: Stream::Stderr,
            attempt: 0,
            wall: 1.0,
            text: "x".into(),
        },
    );
    check(
        "Event",
        &Event {
            id: 1,
            kind: "restart".into(),
            attempt: 0,
            wall: 1.0,
            text: "x".into(),
            data: json!({"a": 1}),
        },
    );
    check(
        "Error",
        &ApiError {
            error: "e".into(),
            kind: "bad_request".into(),
        },
    );
    let chunk = ChunkRef {
        hash: "h".into(),
        size: 1,
    };
    check("ChunkRef", &chunk);
    check(
        "FileManifest",
        &FileManifest {
            name: "f".into(),
            size: 1,
            blake3: "b".into(),
            chunks: vec![chunk],
        },
    );
    check(
        "FileInfo",
        &FileInfo {
            name: "f".into(),
            size: 1,
            blake3: "b".into(),
            chunks: 1,
            created_at: 1.0,
        },
    );
    check(
        "ChunkQuery",
        &ChunkQuery {
            chunks: vec!["h".into()],
        },
    );
    check(
        "MissingChunks",
        &MissingChunks {
            missing: vec!["h".into()],
            direct: true,
        },
    );
    let direct = DirectChunk {
        hash: "h".into(),
        size: 1,
        sha256: "s".into(),
    };
    check("DirectChunk", &direct);
    check(
        "UploadQuery",
        &UploadQuery {
            chunks: vec![direct],
        },
    );
    let upload = ChunkUpload {
        hash: "h".into(),
        url: "u".into(),
        headers: [("x-amz-checksum-sha256".to_owned(), "s".to_owned())].into(),
    };
    check("ChunkUpload", &upload);
    check(
        "ChunkUploads",
        &ChunkUploads {
            uploads: vec![upload],
            expires_in: 60,
        },
    );
    check(
        "Health",
        &Health {
            version: "0".into(),
            storage: "sqlite".into(),
            limits: [("max_request_bytes".to_owned(), 1)].into(),
        },
    );
}

fn sample_attempt_goodput() -> AttemptGoodput {
    AttemptGoodput {
        attempt: 1,
        launch: 0,
        launch_attempt: Some(1),
        start: 1.0,
        first_step_at: Some(2.0),
        kept_step_at: Some(3.0),
        last_step_at: Some(4.0),
        end: 5.0,
        ended: AttemptEnd::Restart,
        first_step: Some(0),
        last_step: Some(9),
        redone_from: Some(5),
        startup_s: 1.0,
        productive_s: 1.0,
        rerun_s: 1.0,
        stop_s: 1.0,
        restart_s: 1.0,
        steps_re_run: 5,
    }
}

fn sample_interruption() -> Interruption {
    Interruption {
        attempt: 1,
        reason: AttemptEnd::Restart,
        at: 5.0,
        rerun_s: 1.0,
        steps_re_run: 5,
        stop_s: 1.0,
        restart_s: 1.0,
        startup_s: 1.0,
        lost_s: 4.0,
    }
}

#[test]
fn the_goodput_schemas_are_their_types() {
    check("AttemptGoodput", &sample_attempt_goodput());
    check("Interruption", &sample_interruption());
    check(
        "Goodput",
        &Goodput {
            run: "r".into(),
            now: 9.0,
            running: false,
            started: Some(1.0),
            ended: Some(6.0),
            wall_s: 5.0,
            productive_s: 1.0,
            goodput: Some(0.2),
            startup_s: 1.0,
            rerun_s: 1.0,
            stop_s: 1.0,
            restart_s: 1.0,
            steps_re_run: 5,
            attempts: vec![sample_attempt_goodput()],
            interruptions: vec![sample_interruption()],
        },
    );
    let doc = document();
    let described: BTreeSet<String> = doc["components"]["schemas"]["AttemptEnd"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let ends: BTreeSet<String> = AttemptEnd::ALL
        .iter()
        .map(|e| e.as_str().to_owned())
        .collect();
    assert_eq!(described, ends);
    for end in AttemptEnd::ALL {
        assert_eq!(serde_json::to_value(end).unwrap(), end.as_str());
    }
}

#[test]
fn every_run_status_is_in_its_enum() {
    let doc = document();
    let described: BTreeSet<String> = doc["components"]["schemas"]["RunStatus"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let statuses: BTreeSet<String> = RunStatus::ALL
        .iter()
        .map(|s| s.as_str().to_owned())
        .collect();
    assert_eq!(described, statuses);
}

/// The API paths the router serves, as written in `lib.rs`'s `.route(...)`
/// calls (the dashboard's pages are routed in `dashboard.rs`) (a `{*rest}` wildcard written as OpenAPI writes it, `{rest}`).
fn routed_paths() -> BTreeSet<String> {
    let api = &ROUTER[ROUTER.find("pub fn router(").unwrap()..];
    let api = &api[..api.find("\n}\n").unwrap()];
    api.split(".route(")
        .skip(1)
        .map(|rest| {
            let rest = rest.trim_start().strip_prefix('"').unwrap();
            rest[..rest.find('"').unwrap()].replace("{*", "{")
        })
        .collect()
}

#[test]
fn every_route_is_described_and_every_described_path_is_routed() {
    let doc = document();
    let described: BTreeSet<String> = doc["paths"].as_object().unwrap().keys().cloned().collect();
    let routed = routed_paths();
    assert_eq!(
        described, routed,
        "openapi.json's paths (left) and the router's API routes (right) differ"
    );
}

#[test]
fn the_served_description_is_the_file() {
    let dir = std::env::temp_dir().join(format!("relaunch-openapi-{}", rand::random::<u64>()));
    let storage = Arc::new(
        relaunch_server::storage::sqlite::SqliteStorage::open(
            &dir,
            relaunch_server::storage::sqlite::Durability::Process,
        )
        .unwrap(),
    );
    let files = relaunch_server::FileStore::open_dir(
        &dir,
        relaunch_server::storage::sqlite::Durability::Process,
    )
    .unwrap();
    let state = relaunch_server::AppState::new(storage, files, None, 1 << 20);
    let app = relaunch_server::router(state);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body = runtime.block_on(async {
        use tower::ServiceExt as _;
        let response = app
            .oneshot(
                axum::http::Request::get("/api/v1/openapi.json")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap()
    });
    let served: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(served, document());
    std::fs::remove_dir_all(&dir).unwrap();
}

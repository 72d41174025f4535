//! `relaunch server migrate`, the real binary against the real PostgreSQL
//! and SeaweedFS that `scripts/postgres.sh` and `scripts/s3.sh` start
//! (`RELAUNCH_TEST_POSTGRES`, `RELAUNCH_TEST_S3`): a data directory filled
//! through the `Storage` and `BlobStore` calls the server makes, copied
//! into PostgreSQL + S3 and back, everything read back through the same
//! calls and compared; a migration SIGKILLed inside a run and run again;
//! a conflicting run; bad sources and targets. Without the services the
//! tests that need them print `skipped:` and the reason; under `CI` they
//! fail instead.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

#[path = "../../relaunch-server/tests/backends/mod.rs"]
mod backends;

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use backends::{TestDb, admin_url, s3_prefix, s3_url, say_skipped, temp_dir};
use relaunch_api::{
    Batch, ChunkRef, FileManifest, Record, RunFilter, RunInit, SeriesQuery, Stream,
};
use relaunch_server::Storage;
use relaunch_server::storage::blobs::{BlobStore, DirBlobs};
use relaunch_server::storage::postgres::PgStorage;
use relaunch_server::storage::s3::S3Blobs;
use relaunch_server::storage::sqlite::{Durability, SqliteStorage};

const BIN: &str = env!("CARGO_BIN_EXE_relaunch");
const RUNS: &[&str] = &["r-a", "r-b", "r-c", "r-d", "r-e"];

fn migrate(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["server", "migrate"])
        .args(args)
        .env_remove("RELAUNCH_MIGRATE_TEST_PAUSE")
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn init(project: &str, id: &str, token: &str) -> RunInit {
    RunInit {
        project: Some(project.into()),
        id: Some(id.into()),
        attempt_token: token.into(),
        ..RunInit::default()
    }
}

fn metrics(writer: &str, token: &str, first: u64, rank: u32, steps: &[(i64, f64)]) -> Batch {
    Batch {
        writer: writer.into(),
        attempt_token: token.into(),
        records: steps
            .iter()
            .enumerate()
            .map(|(i, &(step, v))| {
                (
                    first + i as u64,
                    Record::Metrics {
                        step,
                        wall: step as f64 / 7.0,
                        rank,
                        values: vec![("loss".into(), v), ("lr".into(), v * 0.5)],
                    },
                )
            })
            .collect(),
    }
}

/// Several projects and runs: two attempts with overlapping steps, two
/// ranks, NaN and the infinities, steps up to `i64::MAX`, more points than
/// a chunk holds, console lines (one with a NUL), events that set a
/// status, files sharing chunks, a run with nothing logged, runs without
/// a project or adopted into one.
fn fill(s: &dyn Storage, blobs: &dyn BlobStore) {
    let mut now = 1_000.0;
    let mut tick = || {
        now += 1.0;
        now
    };
    s.open_run(
        &RunInit {
            name: Some("first run".into()),
            config: Some(serde_json::json!({"lr": 0.1, "model": {"layers": 12}, "x": 1e-300})),
            tags: vec!["base".into(), "ünï".into()],
            notes: Some("notes\nwith lines".into()),
            ..init("vision", "r-a", "L:0")
        },
        tick(),
    )
    .unwrap();
    let steps: Vec<(i64, f64)> = (0..5000)
        .map(|i| {
            let v = match i % 97 {
                3 => f64::NAN,
                5 => f64::INFINITY,
                7 => f64::NEG_INFINITY,
                _ => f64::from(i) * 0.25,
            };
            (i64::from(i), v)
        })
        .collect();
    s.ingest("r-a", &metrics("w0", "L:0", 1, 0, &steps), tick())
        .unwrap();
    s.ingest("r-a", &metrics("w1", "L:0", 1, 1, &steps[..300]), tick())
        .unwrap();
    // A second attempt repeats steps 4000.. and goes to the end of i64.
    s.open_run(&init("vision", "r-a", "L:1"), tick()).unwrap();
    let mut again: Vec<(i64, f64)> = (4000..4100).map(|i| (i, -(i as f64))).collect();
    again.push((i64::MAX - 1, f64::NAN));
    again.push((i64::MAX, 1.5));
    s.ingest("r-a", &metrics("w0-1", "L:1", 1, 0, &again), tick())
        .unwrap();
    let lines = Batch {
        writer: "launcher".into(),
        attempt_token: "L:1".into(),
        records: (1..=1200u64)
            .map(|i| {
                let record = if i % 400 == 0 {
                    Record::Event {
                        kind: if i == 1200 { "finished" } else { "restart" }.into(),
                        wall: 2_000.0 + i as f64,
                        text: format!("event {i}"),
                        data: format!("{{\"i\":{i},\"nested\":{{\"a\":[1,2.5]}}}}"),
                    }
                } else {
                    Record::Log {
                        rank: (i % 3) as u32,
                        stream: if i % 2 == 0 {
                            Stream::Stdout
                        } else {
                            Stream::Stderr
                        },
                        wall: 2_000.0 + i as f64,
                        text: if i == 7 {
                            "a NUL \0 inside, ✓".into()
                        } else {
                            format!("line {i}")
                        },
                    }
                };
                (i, record)
            })
            .collect(),
    };
    s.ingest("r-a", &lines, tick()).unwrap();
    // Files: two share a chunk; the third is empty.
    let chunk = |seed: u8, len: usize| -> ChunkRef {
        let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect();
        let hash = blake3::hash(&data).to_hex().to_string();
        blobs.put(&hash, &data).unwrap();
        ChunkRef {
            hash,
            size: len as u64,
        }
    };
    let (c1, c2, c3) = (chunk(3, 70_000), chunk(5, 1_000), chunk(7, 123_457));
    let file = |name: &str, chunks: Vec<ChunkRef>| FileManifest {
        name: name.into(),
        size: chunks.iter().map(|c| c.size).sum(),
        blake3: "0".repeat(64),
        chunks,
    };
    let hashes: Vec<String> = [&c1, &c2, &c3].iter().map(|c| c.hash.clone()).collect();
    blobs.persist(&hashes).unwrap();
    s.commit_file(
        "r-a",
        &file("checkpoints/step_10/model.pt", vec![c1.clone(), c2.clone()]),
        tick(),
    )
    .unwrap();
    s.commit_file("r-a", &file("notes.txt", vec![c2, c3]), tick())
        .unwrap();
    s.commit_file("r-a", &file("empty", vec![]), tick())
        .unwrap();

    s.open_run(&init("vision", "r-b", "t"), tick()).unwrap();
    s.ingest(
        "r-b",
        &metrics("w", "t", 1, 0, &[(0, 1.0), (1, 2.0)]),
        tick(),
    )
    .unwrap();
    s.commit_file("r-b", &file("again.bin", vec![c1]), tick())
        .unwrap();
    s.open_run(&init("text", "r-c", "t"), tick()).unwrap();
    // Only NaN: a chunk whose extremes and last value are NaN, a NaN latest.
    s.ingest("r-c", &metrics("w", "t", 1, 3, &[(5, f64::NAN)]), tick())
        .unwrap();
    // A run opened without a project, and one with nothing logged.
    s.open_run(
        &RunInit {
            id: Some("r-d".into()),
            attempt_token: "t".into(),
            ..RunInit::default()
        },
        tick(),
    )
    .unwrap();
    // Opened before its project was known, then adopted into it.
    s.open_run(
        &RunInit {
            id: Some("r-e".into()),
            attempt_token: "t".into(),
            ..RunInit::default()
        },
        tick(),
    )
    .unwrap();
    s.open_run(&init("audio", "r-e", "t"), tick()).unwrap();
}

/// Everything a client can read of `ids`, through the Storage and
/// BlobStore calls, the same in both (console line and event ids are the
/// databases' own and are left out; their order is compared).
fn assert_same(
    a: &dyn Storage,
    a_blobs: &dyn BlobStore,
    b: &dyn Storage,
    b_blobs: &dyn BlobStore,
    ids: &[&str],
) {
    let all = RunFilter {
        limit: Some(10_000),
        ..RunFilter::default()
    };
    let listed = |s: &dyn Storage| {
        let runs = s.list_runs(&all).unwrap();
        format!(
            "{:?}",
            runs.into_iter()
                .filter(|r| ids.contains(&r.id.as_str()))
                .collect::<Vec<_>>()
        )
    };
    assert_eq!(listed(a), listed(b));
    for id in ids {
        assert_eq!(a.get_run(id).unwrap(), b.get_run(id).unwrap(), "run {id}");
        let keys = a.keys(id).unwrap();
        assert_eq!(keys, b.keys(id).unwrap(), "keys of {id}");
        let latest = a.latest(id).unwrap();
        assert_eq!(
            format!("{latest:?}"),
            format!("{:?}", b.latest(id).unwrap()),
            "latest of {id}"
        );
        let attempts = a.get_run(id).unwrap().attempts;
        for key in &keys {
            for rank in [None, Some(0), Some(1), Some(3)] {
                for attempt in std::iter::once(None).chain((0..attempts).map(Some)) {
                    let q = SeriesQuery {
                        key: key.clone(),
                        rank,
                        buckets: 100_000,
                        min_step: None,
                        max_step: None,
                        attempt,
                    };
                    let (x, y) = (a.series(id, &q), b.series(id, &q));
                    // Debug shows NaN as NaN; bits compared below.
                    assert_eq!(format!("{x:?}"), format!("{y:?}"), "{id} {q:?}");
                    if let (Ok(x), Ok(y)) = (x, y) {
                        let bits = |s: &relaunch_api::Series| {
                            s.points
                                .iter()
                                .map(|p| (p.step, p.value.to_bits()))
                                .collect::<Vec<_>>()
                        };
                        let (bx, by) = (bits(&x), bits(&y));
                        // NaN's payload may differ between databases; the rest is exact.
                        assert_eq!(bx.len(), by.len());
                        for ((s1, v1), (s2, v2)) in bx.iter().zip(&by) {
                            assert_eq!(s1, s2);
                            assert!(
                                v1 == v2
                                    || (f64::from_bits(*v1).is_nan()
                                        && f64::from_bits(*v2).is_nan())
                            );
                        }
                    }
                }
            }
            // Downsampled reads too (summaries copied, not recomputed).
            let q = SeriesQuery {
                key: key.clone(),
                rank: None,
                buckets: 50,
                min_step: None,
                max_step: None,
                attempt: None,
            };
            assert_eq!(
                format!("{:?}", a.series(id, &q).unwrap()),
                format!("{:?}", b.series(id, &q).unwrap())
            );
        }
        let lines = |s: &dyn Storage| {
            s.logs(id, None, 0, 100_000)
                .unwrap()
                .into_iter()
                .map(|l| (l.rank, l.stream, l.attempt, l.wall.to_bits(), l.text))
                .collect::<Vec<_>>()
        };
        assert_eq!(lines(a), lines(b), "console lines of {id}");
        let events = |s: &dyn Storage| {
            s.events(id)
                .unwrap()
                .into_iter()
                .map(|e| (e.kind, e.attempt, e.wall.to_bits(), e.text, e.data))
                .collect::<Vec<_>>()
        };
        assert_eq!(events(a), events(b), "events of {id}");
        for writer in ["w", "w0", "w1", "w0-1", "launcher"] {
            assert_eq!(
                a.watermark(id, writer).unwrap(),
                b.watermark(id, writer).unwrap()
            );
        }
        let files = a.files(id).unwrap();
        assert_eq!(files, b.files(id).unwrap(), "files of {id}");
        for f in &files {
            let (info, chunks) = a.file(id, &f.name).unwrap();
            assert_eq!((info, chunks.clone()), b.file(id, &f.name).unwrap());
            for c in chunks {
                assert_eq!(a_blobs.get(&c.hash).unwrap(), b_blobs.get(&c.hash).unwrap());
            }
        }
    }
}

/// Hashes of the files in a data directory that hold data (the database,
/// its WAL and the chunks), to show the source was not written. SQLite
/// makes the `-shm` index and an empty `-wal` to read a WAL database
/// (even read-only); those hold no data and are left out.
fn snapshot(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if !p.to_string_lossy().ends_with("-shm") {
                let bytes = std::fs::read(&p).unwrap();
                if bytes.is_empty() && p.to_string_lossy().ends_with("-wal") {
                    continue;
                }
                out.push((
                    p.display().to_string(),
                    blake3::hash(&bytes).to_hex().to_string(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// A filled data directory.
fn source_dir(label: &str) -> std::path::PathBuf {
    let dir = temp_dir(label);
    let s = SqliteStorage::open(&dir, Durability::Process).unwrap();
    let blobs = DirBlobs::open(&dir, Durability::Process).unwrap();
    fill(&s, &blobs);
    s.close();
    dir
}

fn sqlite(dir: &Path) -> (SqliteStorage, DirBlobs) {
    (
        SqliteStorage::open(dir, Durability::Process).unwrap(),
        DirBlobs::open(dir, Durability::Process).unwrap(),
    )
}

/// PostgreSQL and S3, or `None` after saying why the test is skipped.
fn services(test: &str) -> Option<(String, String)> {
    match (admin_url(), s3_url()) {
        (Some(pg), Some(s3)) => Some((pg, s3)),
        _ => {
            say_skipped(&format!(
                "{test}: needs RELAUNCH_TEST_POSTGRES and RELAUNCH_TEST_S3 (scripts/test.sh \
                 starts PostgreSQL and SeaweedFS and sets them)"
            ));
            None
        }
    }
}

fn pg(url: &str) -> PgStorage {
    PgStorage::open(url, Durability::Process, 2).unwrap()
}

fn s3(url: &str) -> S3Blobs {
    S3Blobs::open(url, None, std::env::vars()).unwrap()
}

#[test]
fn a_data_directory_moves_to_postgres_and_s3_and_back_whole() {
    let Some((admin, s3_base)) = services("a_data_directory_moves_to_postgres_and_s3_and_back")
    else {
        return;
    };
    let src = source_dir("migrate-src");
    let before = snapshot(&src);
    let db = TestDb::create(&admin);
    let bucket = s3_prefix(&s3_base, "migrate");
    // The target's own run, which the migration must leave alone.
    {
        let target = pg(&db.url);
        target
            .open_run(&init("theirs", "unrelated", "t"), 5.0)
            .unwrap();
        target
            .ingest("unrelated", &metrics("w", "t", 1, 0, &[(1, 9.0)]), 6.0)
            .unwrap();
    }
    let src_arg = src.to_str().unwrap();
    let out = migrate(&["--from", src_arg, "--database", &db.url, "--blobs", &bucket]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    eprintln!("{stdout}{stderr}");
    assert!(stderr.contains("5 run(s) in the source, 0 already in the target, 5 to copy"));
    assert!(stderr.contains("every count matches"));
    for table in [
        "projects",
        "runs",
        "metric points",
        "console lines",
        "events",
        "writers",
    ] {
        assert!(stdout.contains(table), "{table} in\n{stdout}");
    }
    assert!(!stdout.contains("DIFFERS"));
    assert_eq!(snapshot(&src), before, "the source was written");

    let (source, source_blobs) = sqlite(&src);
    let (target, target_blobs) = (pg(&db.url), s3(&bucket));
    assert_same(&source, &source_blobs, &target, &target_blobs, RUNS);
    assert_eq!(target.watermark("unrelated", "w").unwrap(), 1);
    assert_eq!(target.get_run("unrelated").unwrap().project, "theirs");

    // Again: nothing left to copy, nothing stored twice.
    let out = migrate(&["--from", src_arg, "--database", &db.url, "--blobs", &bucket]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("5 already in the target, 0 to copy"),
        "{stderr}"
    );
    assert_same(&source, &source_blobs, &target, &target_blobs, RUNS);

    // A client resuming r-a's writer w0 against the target: what it sends
    // again is acknowledged and not stored twice; what is new is stored.
    let n = source.watermark("r-a", "w0").unwrap();
    assert_eq!(target.watermark("r-a", "w0").unwrap(), n);
    let before_points = target.series("r-a", &full("loss", 0)).unwrap().total;
    let mut resend = metrics("w0", "L:0", n - 1, 0, &[(3998, 0.0), (3999, 0.0)]);
    resend
        .records
        .extend(metrics("w0", "L:0", n + 1, 0, &[(6000, 6.0), (6001, 7.0)]).records);
    let ack = target.ingest("r-a", &resend, 9_999.0).unwrap();
    assert_eq!(ack.watermark, n + 2);
    let after_points = target.series("r-a", &full("loss", 0)).unwrap().total;
    assert_eq!(after_points, before_points + 2);

    // And back to a data directory, for a laptop.
    let back = temp_dir("migrate-back");
    let out = migrate(&[
        "--from-database",
        &db.url,
        "--from-blobs",
        &bucket,
        "--to",
        back.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let (laptop, laptop_blobs) = sqlite(&back);
    let mut with_unrelated = RUNS.to_vec();
    with_unrelated.push("unrelated");
    assert_same(
        &target,
        &target_blobs,
        &laptop,
        &laptop_blobs,
        &with_unrelated,
    );
    drop((laptop, source));
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(&back);
}

/// Every point of attempt 0 (the first token) of one rank.
fn full(key: &str, rank: u32) -> SeriesQuery {
    SeriesQuery {
        key: key.into(),
        rank: Some(rank),
        buckets: 100_000,
        min_step: None,
        max_step: None,
        attempt: Some(0),
    }
}

/// Kills `relaunch server migrate` while the second run it copies is
/// written but not committed, then runs it again.
fn interrupt_and_resume(
    target_args: &[&str],
    open: impl Fn() -> (Arc<dyn Storage>, Arc<dyn BlobStore>),
) {
    let src = source_dir("migrate-kill");
    let src_arg = src.to_str().unwrap();
    let mut child = Command::new(BIN)
        .args(["server", "migrate", "--from", src_arg])
        .args(target_args)
        .env("RELAUNCH_MIGRATE_TEST_PAUSE", "2")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("paused before committing run") {
            break;
        }
    }
    assert!(seen.contains("paused before committing run r-b"), "{seen}");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    {
        let (target, _) = open();
        assert!(target.get_run("r-a").is_ok(), "the first run was committed");
        assert!(
            target.get_run("r-b").is_err(),
            "a half-copied run is visible"
        );
    }
    let out = migrate(&[&["--from", src_arg][..], target_args].concat());
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("1 already in the target, 4 to copy"),
        "{stderr}"
    );
    assert!(!stdout.contains("DIFFERS"), "{stdout}");
    let (source, source_blobs) = sqlite(&src);
    let (target, target_blobs) = open();
    assert_same(
        &source,
        &source_blobs,
        target.as_ref(),
        target_blobs.as_ref(),
        RUNS,
    );
    let _ = std::fs::remove_dir_all(&src);
}

#[test]
fn a_migration_killed_inside_a_run_resumes_without_duplicates_into_a_data_directory() {
    let to = temp_dir("migrate-kill-to");
    let to_arg = to.to_str().unwrap().to_owned();
    interrupt_and_resume(&["--to", &to_arg], || {
        let (s, b) = sqlite(&to);
        (Arc::new(s), Arc::new(b))
    });
    let _ = std::fs::remove_dir_all(&to);
}

#[test]
fn a_migration_killed_inside_a_run_resumes_without_duplicates_into_postgres_and_s3() {
    let Some((admin, s3_base)) = services("a_migration_killed_inside_a_run_resumes (postgres)")
    else {
        return;
    };
    let db = TestDb::create(&admin);
    let bucket = s3_prefix(&s3_base, "migrate-kill");
    interrupt_and_resume(&["--database", &db.url, "--blobs", &bucket], || {
        (Arc::new(pg(&db.url)), Arc::new(s3(&bucket)))
    });
}

#[test]
fn a_run_in_both_with_other_content_is_refused_and_nothing_is_copied() {
    let Some((admin, s3_base)) = services("a_run_in_both_with_other_content_is_refused") else {
        return;
    };
    let src = source_dir("migrate-conflict");
    let db = TestDb::create(&admin);
    let bucket = s3_prefix(&s3_base, "migrate-conflict");
    pg(&db.url)
        .open_run(&init("vision", "r-c", "other"), 1.0)
        .unwrap();
    let out = migrate(&[
        "--from",
        src.to_str().unwrap(),
        "--database",
        &db.url,
        "--blobs",
        &bucket,
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("1 run(s) are in both the source and the target")
            && stderr.contains("different content: r-c;"),
        "{stderr}"
    );
    let target = pg(&db.url);
    assert!(target.get_run("r-a").is_err(), "a run was copied");
    assert_eq!(target.get_run("r-c").unwrap().attempts, 1, "r-c was merged");
    let _ = std::fs::remove_dir_all(&src);
}

/// Each bad source or target: exit 1, one line naming what to fix, no
/// secret.
#[test]
fn bad_sources_and_targets_are_one_line_each() {
    let to = temp_dir("migrate-bad-to");
    let to_arg = to.to_str().unwrap();
    let empty = temp_dir("migrate-bad-empty");
    let garbage = temp_dir("migrate-bad-garbage");
    std::fs::write(garbage.join("relaunch.db"), b"not a database, not at all").unwrap();
    let src = source_dir("migrate-bad-src");
    let src_arg = src.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--from", "/nonexistent/relaunch-data", "--to", to_arg],
            "does not exist; give --from",
        ),
        (
            vec!["--from", empty.to_str().unwrap(), "--to", to_arg],
            "is not a relaunch data directory",
        ),
        (
            vec!["--from", garbage.to_str().unwrap(), "--to", to_arg],
            "is not a relaunch database",
        ),
        (
            vec![
                "--from",
                src_arg,
                "--database",
                "postgres://me:hunter2secret@127.0.0.1:1/db",
                "--to",
                to_arg,
            ],
            "cannot connect to PostgreSQL at me@127.0.0.1:1/db",
        ),
        (
            vec![
                "--from",
                src_arg,
                "--to",
                to_arg,
                "--blobs",
                "s3://bucket/prefix",
                "--s3-endpoint",
                "http://127.0.0.1:1",
            ],
            "--s3-endpoint",
        ),
        (vec!["--from", src_arg, "--to", src_arg], "same directory"),
    ];
    for (args, says) in cases {
        let out = Command::new(BIN)
            .args(["server", "migrate"])
            .args(&args)
            .env("AWS_ACCESS_KEY_ID", "AKIDTEST")
            .env("AWS_SECRET_ACCESS_KEY", "s3cretkey")
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stdout}{stderr}");
        // (object_store logs its retries at info level before giving up)
        assert_eq!(errors(&stderr), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        for secret in ["hunter2secret", "s3cretkey"] {
            assert!(!stderr.contains(secret), "{args:?}: {stderr}");
        }
    }
    // A target schema newer than this binary.
    if let Some(admin) = admin_url() {
        let db = TestDb::create(&admin);
        drop(pg(&db.url));
        db.execute("INSERT INTO relaunch_schema(version, description) VALUES (99, 'future')");
        let out = migrate(&["--from", src_arg, "--database", &db.url, "--to", to_arg]);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("schema version 99"), "{stderr}");
        assert_eq!(errors(&stderr), 1, "{stderr}");
    } else {
        say_skipped("bad_sources_and_targets: the newer-schema case needs RELAUNCH_TEST_POSTGRES");
    }
    for dir in [&to, &empty, &garbage, &src] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn errors(stderr: &str) -> usize {
    stderr.lines().filter(|l| l.starts_with("error:")).count()
}

/// CI must run the migrations into PostgreSQL and S3, not skip them.
#[test]
fn migrations_run_under_ci() {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false") {
        assert!(
            admin_url().is_some() && s3_url().is_some(),
            "CI is set but RELAUNCH_TEST_POSTGRES or RELAUNCH_TEST_S3 is not: the migration \
             tests would be skipped; run them through scripts/test.sh"
        );
    }
}

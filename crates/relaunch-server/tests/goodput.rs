//! The storage conformance suite's goodput part: what `Storage::timeline`
//! reads (attempts, lifecycle events, each attempt's step times from chunk
//! summaries and the chunks a resumed attempt redid) is the same on every
//! backend, and gives the goodput computed from it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backends;

use relaunch_api::{AttemptEnd, Batch, Record, RunInit};
use relaunch_server::goodput::compute;
use relaunch_server::storage::sqlite::Durability;
use relaunch_server::storage::timeline::Lifecycle;
use relaunch_server::storage::{Storage, StorageError};

fn each_backend(test: impl Fn(&dyn Storage, &str)) {
    for place in backends::places("goodput") {
        let storage = place.open(Durability::Process);
        test(storage.as_ref(), place.name());
        drop(storage);
        backends::remove(&place);
    }
}

fn open(s: &dyn Storage, token: &str, started: f64) {
    let init = RunInit {
        id: Some("g".into()),
        attempt_token: token.into(),
        attempt_started: Some(started),
        ..RunInit::default()
    };
    s.open_run(&init, started).unwrap();
}

/// Events of the launcher of attempt `token`, as one batch of writer
/// `launcher-TOKEN`.
fn events(s: &dyn Storage, token: &str, events: &[(&str, f64)]) {
    let batch = Batch {
        writer: format!("launcher-{}", token.replace(':', "-")),
        attempt_token: token.into(),
        records: events
            .iter()
            .enumerate()
            .map(|(i, (kind, wall))| {
                let record = Record::Event {
                    kind: (*kind).into(),
                    wall: *wall,
                    text: String::new(),
                    data: String::new(),
                };
                (i as u64 + 1, record)
            })
            .collect(),
    };
    s.ingest("g", &batch, 0.0).unwrap();
}

/// `key` at `steps` from rank `rank` of attempt `token`, step s at wall
/// `wall(s)`, as one batch of its own writer.
fn steps(
    s: &dyn Storage,
    token: &str,
    rank: u32,
    key: &str,
    steps: std::ops::RangeInclusive<i64>,
    wall: impl Fn(i64) -> f64,
) {
    let batch = Batch {
        writer: format!(
            "rank{rank}-{}-{}",
            token.replace(':', "-"),
            key.replace('/', "-")
        ),
        attempt_token: token.into(),
        records: steps
            .enumerate()
            .map(|(i, step)| {
                let record = Record::Metrics {
                    step,
                    wall: wall(step),
                    rank,
                    values: vec![(key.into(), 1.0)],
                };
                (i as u64 + 1, record)
            })
            .collect(),
    };
    s.ingest("g", &batch, 0.0).unwrap();
}

#[test]
fn a_runs_timeline_reads_the_same_on_every_backend() {
    each_backend(|s, name| {
        // Launch L: attempt 0 crashes after step 5000 (two ranks, a chunk
        // and a half each), attempt 1 resumes at step 4000 and is
        // preempted; launch M resumes at 6001 and finishes.
        let w0 = |step: i64| 110.0 + step as f64 * 0.025;
        let w1 = |step: i64| 310.0 + (step - 4000) as f64 * 0.025;
        let w2 = |step: i64| 1010.0 + (step - 6001) as f64 * 0.1;
        open(s, "L:0", 100.0);
        events(s, "L:0", &[("start", 100.0), ("worker_failed", 249.0)]);
        steps(s, "L:0", 0, "loss", 0..=5000, w0);
        // A system metric's step is a time, and its point comes first.
        steps(s, "L:0", 0, "system/cpu_percent", 100_000..=100_002, |_| {
            105.0
        });
        open(s, "L:1", 300.0);
        events(s, "L:1", &[("start", 300.0), ("preempted", 370.0)]);
        steps(s, "L:1", 0, "loss", 4000..=6000, w1);
        // Rank 1 of attempt 0 reaches the server late, a second ahead of
        // rank 0 all along; the restart event later still.
        steps(s, "L:0", 1, "loss", 0..=5000, |step| w0(step) - 1.0);
        let batch = Batch {
            writer: "launcher-late".into(),
            attempt_token: "L:0".into(),
            records: vec![(
                1,
                Record::Event {
                    kind: "restart".into(),
                    wall: 250.0,
                    text: "rank 1 failed".into(),
                    data: String::new(),
                },
            )],
        };
        s.ingest("g", &batch, 0.0).unwrap();
        open(s, "M:0", 1000.0);
        events(s, "M:0", &[("start", 1000.0), ("finished", 1030.0)]);
        steps(s, "M:0", 0, "loss", 6001..=6100, w2);

        let t = s.timeline("g").unwrap();
        let tokens: Vec<&str> = t.attempts.iter().map(|a| a.token.as_str()).collect();
        assert_eq!(tokens, ["L:0", "L:1", "M:0"], "{name}");
        let kinds: Vec<(&str, u32)> = t
            .events
            .iter()
            .map(|e| (e.kind.as_str(), e.attempt))
            .collect();
        assert_eq!(
            kinds,
            [
                ("start", 0),
                ("start", 1),
                ("preempted", 1),
                ("restart", 0),
                ("start", 2),
                ("finished", 2)
            ],
            "{name}: lifecycle events only, in the order stored"
        );
        assert_eq!(
            t.events[3],
            Lifecycle {
                kind: "restart".into(),
                attempt: 0,
                wall: 250.0
            }
        );
        let a0 = t.attempts[0].steps.unwrap();
        assert_eq!((a0.first_step, a0.last_step), (0, 5000), "{name}");
        assert_eq!(
            a0.first_wall,
            w0(0) - 1.0,
            "{name}: rank 1's step 0, not the system metric"
        );
        assert_eq!(a0.last_wall, w0(5000), "{name}");
        assert_eq!(a0.redone_from, Some(4000), "{name}");
        assert_eq!(a0.kept_wall, Some(w0(3999)), "{name}");
        assert_eq!(a0.steps_redone, 1001, "{name}: steps 4000 to 5000");
        let a1 = t.attempts[1].steps.unwrap();
        assert_eq!(
            (a1.first_step, a1.last_step, a1.first_wall),
            (4000, 6000, 310.0),
            "{name}"
        );
        assert_eq!(
            (a1.redone_from, a1.kept_wall, a1.steps_redone),
            (None, Some(w1(6000)), 0)
        );
        let a2 = t.attempts[2].steps.unwrap();
        assert_eq!((a2.first_wall, a2.last_wall), (1010.0, w2(6100)), "{name}");

        let g = compute("g", &t, 5000.0);
        assert!(!g.running);
        assert_eq!((g.started, g.ended), (Some(100.0), Some(1030.0)), "{name}");
        let productive = (w0(3999) - (w0(0) - 1.0)) + (w1(6000) - 310.0) + (w2(6100) - 1010.0);
        assert!((g.productive_s - productive).abs() < 1e-9, "{name}: {g:?}");
        assert_eq!(g.steps_re_run, 1001);
        let ended: Vec<AttemptEnd> = g.attempts.iter().map(|a| a.ended).collect();
        assert_eq!(
            ended,
            [
                AttemptEnd::Restart,
                AttemptEnd::Preempted,
                AttemptEnd::Finished
            ]
        );
        let launches: Vec<(u32, Option<u32>)> = g
            .attempts
            .iter()
            .map(|a| (a.launch, a.launch_attempt))
            .collect();
        assert_eq!(launches, [(0, Some(0)), (0, Some(1)), (1, Some(0))]);
        assert_eq!(g.attempts[1].restart_s, 1000.0 - 370.0);
        assert_eq!(g.interruptions.len(), 2);
    });
}

#[test]
fn a_run_with_events_only_has_a_timeline_without_steps() {
    each_backend(|s, name| {
        open(s, "L:0", 10.0);
        events(s, "L:0", &[("start", 10.0), ("failed", 40.0)]);
        steps(s, "L:0", 0, "gpu/0/util", 10_000..=10_003, |_| 20.0);
        let t = s.timeline("g").unwrap();
        assert_eq!(t.attempts.len(), 1, "{name}");
        assert_eq!(t.attempts[0].steps, None, "{name}");
        let g = compute("g", &t, 100.0);
        assert_eq!(
            (g.wall_s, g.goodput, g.startup_s),
            (30.0, None, 30.0),
            "{name}"
        );
        assert!(
            matches!(s.timeline("nope"), Err(StorageError::NotFound(_))),
            "{name}"
        );
    });
}

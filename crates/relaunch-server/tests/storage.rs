//! The storage conformance suite: every backend must pass all of it. A new
//! backend adds a `Place` in `backends/mod.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backends;

use relaunch_api::{Batch, Record, RunFilter, RunInit, RunPatch, RunStatus, SeriesQuery, Stream};
use relaunch_server::storage::sqlite::Durability;
use relaunch_server::storage::{Storage, StorageError};

use backends::POSTGRES_ENV;

/// Runs `test` against a fresh instance of every backend (its name the
/// second argument, for messages).
fn each_backend(test: impl Fn(&dyn Storage, &str)) {
    for place in backends::places("storage") {
        let storage = place.open(Durability::Fsync);
        assert_eq!(storage.name(), place.name());
        test(storage.as_ref(), place.name());
        drop(storage);
        backends::remove(&place);
    }
}

fn init(project: &str, id: Option<&str>, token: &str) -> RunInit {
    RunInit {
        project: Some(project.into()),
        id: id.map(Into::into),
        attempt_token: token.into(),
        ..RunInit::default()
    }
}

/// Steps of `key` from one writer of attempt token `t{attempt}`; the value
/// of step s is 10 s + attempt.
fn metrics(
    writer: &str,
    first_seq: u64,
    key: &str,
    steps: std::ops::Range<i64>,
    attempt: u32,
) -> Batch {
    Batch {
        writer: writer.into(),
        attempt_token: format!("t{attempt}"),
        records: steps
            .enumerate()
            .map(|(i, step)| {
                (
                    first_seq + i as u64,
                    Record::Metrics {
                        step,
                        wall: step as f64,
                        rank: 0,
                        values: vec![(key.into(), step as f64 * 10.0 + f64::from(attempt))],
                    },
                )
            })
            .collect(),
    }
}

fn all(key: &str) -> SeriesQuery {
    SeriesQuery {
        key: key.into(),
        rank: None,
        buckets: 100_000,
        min_step: None,
        max_step: None,
        attempt: None,
    }
}

#[test]
fn runs_are_created_resumed_and_given_attempts() {
    each_backend(|s, _| {
        let a = s.open_run(&init("proj", Some("run1"), "t0"), 1.0).unwrap();
        assert_eq!((a.id.as_str(), a.attempt, a.attempts), ("run1", Some(0), 1));
        assert_eq!(a.status, RunStatus::Running);
        // The same token is the same attempt (every rank of one launch).
        let again = s.open_run(&init("proj", Some("run1"), "t0"), 2.0).unwrap();
        assert_eq!((again.attempt, again.attempts), (Some(0), 1));
        // A new token: the next attempt.
        let next = s.open_run(&init("proj", Some("run1"), "t1"), 3.0).unwrap();
        assert_eq!((next.attempt, next.attempts), (Some(1), 2));
        assert_eq!(next.created_at, 1.0);
        // A generated id when none is given.
        let fresh = s.open_run(&init("proj", None, "x"), 4.0).unwrap();
        assert!(!fresh.id.is_empty() && fresh.id != "run1");
        // A run belongs to one project.
        let clash = s.open_run(&init("other", Some("run1"), "t2"), 5.0);
        assert!(matches!(clash, Err(StorageError::Conflict(_))));
        assert!(matches!(s.get_run("nope"), Err(StorageError::NotFound(_))));
    });
}

#[test]
fn a_run_opened_without_a_project_takes_the_first_one_named() {
    each_backend(|s, _| {
        // The launcher opens the job's run before the script names its project.
        let launcher = RunInit {
            project: None,
            ..init("", Some("job"), "l0")
        };
        assert_eq!(
            s.open_run(&launcher, 1.0).unwrap().project,
            relaunch_api::DEFAULT_PROJECT
        );
        let rank = s.open_run(&init("mnist", Some("job"), "l0"), 2.0).unwrap();
        assert_eq!((rank.project.as_str(), rank.attempt), ("mnist", Some(0)));
        // From then on it stays there, and the launcher still joins it.
        assert_eq!(s.open_run(&launcher, 3.0).unwrap().project, "mnist");
        let err = s
            .open_run(&init("other", Some("job"), "l0"), 4.0)
            .unwrap_err();
        assert!(
            matches!(&err, StorageError::Conflict(m) if m.contains("\"mnist\"")),
            "{err}"
        );
    });
}

#[test]
fn runs_are_listed_and_filtered() {
    each_backend(|s, _| {
        let mut a = init("p1", Some("a"), "t");
        a.tags = vec!["baseline".into()];
        a.config = Some(serde_json::json!({"optim": {"lr": 0.001, "name": "adam"}, "layers": 4}));
        s.open_run(&a, 1.0).unwrap();
        let mut b = init("p1", Some("b"), "t");
        b.config = Some(serde_json::json!({"optim": {"lr": 0.01}, "layers": 8}));
        s.open_run(&b, 2.0).unwrap();
        s.open_run(&init("p2", Some("c"), "t"), 3.0).unwrap();
        s.patch_run(
            "b",
            &RunPatch {
                status: Some(RunStatus::Finished),
                ..Default::default()
            },
            4.0,
        )
        .unwrap();

        let ids = |f: RunFilter| -> Vec<String> {
            s.list_runs(&f).unwrap().into_iter().map(|r| r.id).collect()
        };
        assert_eq!(ids(RunFilter::default()), ["c", "b", "a"]);
        assert_eq!(
            ids(RunFilter {
                project: Some("p1".into()),
                ..Default::default()
            }),
            ["b", "a"]
        );
        assert_eq!(
            ids(RunFilter {
                tag: Some("baseline".into()),
                ..Default::default()
            }),
            ["a"]
        );
        assert_eq!(
            ids(RunFilter {
                status: Some(RunStatus::Finished),
                ..Default::default()
            }),
            ["b"]
        );
        assert_eq!(
            ids(RunFilter {
                param: vec!["optim.lr=0.01".into()],
                ..Default::default()
            }),
            ["b"]
        );
        assert_eq!(
            ids(RunFilter {
                param: vec!["optim.name=adam".into(), "layers=4".into()],
                ..Default::default()
            }),
            ["a"]
        );
        assert!(matches!(
            s.list_runs(&RunFilter {
                param: vec!["no-equals".into()],
                ..Default::default()
            }),
            Err(StorageError::Invalid(_))
        ));
    });
}

/// A runs table of thousands of runs pages, sorts and filters on the
/// server: by config and latest metric values (NaN and missing values
/// last either way), by text, a page at a time, with the total count.
#[test]
fn runs_are_sorted_filtered_and_paged_by_config_and_latest_values() {
    each_backend(|s, _| {
        // run, lr (config), layers, latest loss (None: never logged it).
        let table: [(&str, serde_json::Value, Option<f64>); 6] = [
            (
                "r0",
                serde_json::json!({"lr": 0.1, "opt": "sgd"}),
                Some(0.9),
            ),
            (
                "r1",
                serde_json::json!({"lr": 0.01, "opt": "adam"}),
                Some(0.3),
            ),
            ("r2", serde_json::json!({"lr": "auto"}), Some(f64::NAN)),
            ("r3", serde_json::json!({"lr": 0.001, "opt": "adam"}), None),
            ("r4", serde_json::json!({"lr": 1}), Some(0.5)),
            ("r5", serde_json::json!({}), Some(f64::INFINITY)),
        ];
        for (i, (id, config, loss)) in table.iter().enumerate() {
            let mut run = init("p", Some(id), "t0");
            run.name = Some(format!("Name {}", 5 - i));
            run.config = Some(config.clone());
            run.notes = Some(if i == 3 {
                "the Baseline".into()
            } else {
                String::new()
            });
            s.open_run(&run, i as f64).unwrap();
            if let Some(v) = loss {
                let mut b = metrics("w", 1, "loss", 0..2, 0);
                if let Record::Metrics { values, .. } = &mut b.records[1].1 {
                    values[0].1 = *v;
                }
                s.ingest(id, &b, 1.0).unwrap();
            }
        }
        let ids = |f: RunFilter| -> Vec<String> {
            s.list_runs(&f).unwrap().into_iter().map(|r| r.id).collect()
        };
        let by = |sort: &str| RunFilter {
            sort: Some(sort.into()),
            ..Default::default()
        };
        assert_eq!(ids(by("created")), ["r0", "r1", "r2", "r3", "r4", "r5"]);
        assert_eq!(ids(by("-created")), ["r5", "r4", "r3", "r2", "r1", "r0"]);
        assert_eq!(ids(by("name")), ["r5", "r4", "r3", "r2", "r1", "r0"]);
        // NaN and a run without the metric last, either way (newest first
        // among them).
        assert_eq!(
            ids(by("summary.loss")),
            ["r1", "r4", "r0", "r5", "r3", "r2"]
        );
        assert_eq!(
            ids(by("-summary.loss")),
            ["r5", "r0", "r4", "r1", "r3", "r2"]
        );
        // Numbers by value before strings, then runs without the value.
        assert_eq!(ids(by("config.lr")), ["r3", "r1", "r0", "r4", "r2", "r5"]);
        assert_eq!(ids(by("-config.lr")), ["r4", "r0", "r1", "r3", "r2", "r5"]);

        let filtered = |param: &[&str], metric: &[&str]| {
            ids(RunFilter {
                param: param.iter().map(|p| (*p).to_owned()).collect(),
                metric: metric.iter().map(|m| (*m).to_owned()).collect(),
                sort: Some("created".into()),
                ..Default::default()
            })
        };
        assert_eq!(filtered(&[], &["loss<0.6"]), ["r1", "r4"]);
        assert_eq!(filtered(&[], &["loss>=0.5"]), ["r0", "r4", "r5"]);
        assert_eq!(filtered(&[], &["loss=0.3"]), ["r1"]);
        // != passes NaN and runs without the metric, as NaN != 0.3 is true.
        assert_eq!(
            filtered(&[], &["loss!=0.3"]),
            ["r0", "r2", "r3", "r4", "r5"]
        );
        assert_eq!(
            filtered(&[], &["loss>-inf", "loss<inf"]),
            ["r0", "r1", "r4"]
        );
        // Orders on config compare numbers only: "auto" is not > 0.005.
        assert_eq!(filtered(&["lr>0.005"], &[]), ["r0", "r1", "r4"]);
        assert_eq!(filtered(&["lr<=0.01"], &[]), ["r1", "r3"]);
        assert_eq!(filtered(&["opt!=adam"], &[]), ["r0", "r2", "r4", "r5"]);
        assert_eq!(filtered(&["opt=adam"], &["loss<1"]), ["r1"]);

        // Text in the id, name, project, tags or notes, in any case.
        let q = |text: &str| {
            ids(RunFilter {
                q: Some(text.into()),
                sort: Some("created".into()),
                ..Default::default()
            })
        };
        assert_eq!(q("baseline"), ["r3"]);
        assert_eq!(q("NAME 4"), ["r1"]);

        // Pages of 4: the second holds the rest; the count is the whole.
        let page = |offset: u32| RunFilter {
            sort: Some("-summary.loss".into()),
            limit: Some(4),
            offset: Some(offset),
            ..Default::default()
        };
        assert_eq!(ids(page(0)), ["r5", "r0", "r4", "r1"]);
        assert_eq!(ids(page(4)), ["r3", "r2"]);
        assert!(ids(page(10)).is_empty());
        assert_eq!(s.count_runs(&page(4)).unwrap(), 6);
        assert_eq!(
            s.count_runs(&RunFilter {
                metric: vec!["loss<0.6".into()],
                ..page(0)
            })
            .unwrap(),
            2
        );
        // The latest values and metric names of a page are the page's.
        let keys = ["loss".to_owned()];
        let latest: Vec<String> = s
            .latest_of_runs(&page(4), &keys)
            .unwrap()
            .into_iter()
            .map(|l| l.run)
            .collect();
        assert_eq!(latest, ["r2"]);

        for bad in [
            by("size"),
            by("summary."),
            RunFilter {
                metric: vec!["loss<abc".into()],
                ..Default::default()
            },
        ] {
            assert!(
                matches!(s.list_runs(&bad), Err(StorageError::Invalid(_))),
                "{bad:?}"
            );
            assert!(
                matches!(s.count_runs(&bad), Err(StorageError::Invalid(_))),
                "{bad:?}"
            );
        }
    });
}

/// What a runs table of many runs reads in two requests: the metric names
/// of the selected runs, and each run's newest value of the chosen ones.
#[test]
fn the_latest_values_of_many_runs_in_one_read() {
    each_backend(|s, _| {
        s.open_run(&init("p1", Some("a"), "t0"), 1.0).unwrap();
        s.open_run(&init("p1", Some("b"), "t0"), 2.0).unwrap();
        s.open_run(&init("p2", Some("c"), "t0"), 3.0).unwrap();
        s.ingest("a", &metrics("w", 1, "loss", 0..10, 0), 1.0)
            .unwrap();
        s.ingest("a", &metrics("w", 11, "acc", 0..5, 0), 1.0)
            .unwrap();
        s.ingest("b", &metrics("w", 1, "loss", 0..3, 0), 1.0)
            .unwrap();
        s.ingest("c", &metrics("w", 1, "lr", 0..3, 0), 1.0).unwrap();
        // Rank 1 of `b` logs a later loss; the lowest rank's value is read.
        let mut rank1 = metrics("w1", 1, "loss", 0..20, 0);
        for (_, r) in &mut rank1.records {
            if let Record::Metrics { rank, .. } = r {
                *rank = 1;
            }
        }
        s.ingest("b", &rank1, 1.0).unwrap();

        let all_runs = RunFilter::default();
        let p1 = RunFilter {
            project: Some("p1".into()),
            ..Default::default()
        };
        assert_eq!(s.metric_names(&all_runs).unwrap(), ["acc", "loss", "lr"]);
        assert_eq!(s.metric_names(&p1).unwrap(), ["acc", "loss"]);

        let keys = ["loss".to_owned(), "lr".to_owned()];
        let got: Vec<(String, String, u32, i64, f64)> = s
            .latest_of_runs(&all_runs, &keys)
            .unwrap()
            .into_iter()
            .map(|l| {
                (
                    l.run,
                    l.latest.key,
                    l.latest.rank,
                    l.latest.step,
                    l.latest.value,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a".into(), "loss".into(), 0, 9, 90.0),
                ("b".into(), "loss".into(), 0, 2, 20.0),
                ("c".into(), "lr".into(), 0, 2, 20.0),
            ]
        );
        let in_p1 = s.latest_of_runs(&p1, &keys).unwrap();
        assert_eq!(
            in_p1.iter().map(|l| l.run.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(s.latest_of_runs(&all_runs, &[]).unwrap().is_empty());
        assert!(matches!(
            s.latest_of_runs(
                &RunFilter {
                    param: vec!["no-equals".into()],
                    ..Default::default()
                },
                &keys
            ),
            Err(StorageError::Invalid(_))
        ));
    });
}

#[test]
fn a_batch_is_stored_exactly_once_however_often_it_is_sent() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        let batch = metrics("w1", 1, "loss", 0..100, 0);
        for _ in 0..3 {
            let ack = s.ingest("r", &batch, 1.0).unwrap();
            assert_eq!(ack.watermark, 100);
        }
        // Overlapping resend: 51..=150 after 1..=100 stores only 101..=150.
        let overlap = metrics("w1", 51, "loss", 50..150, 0);
        assert_eq!(s.ingest("r", &overlap, 2.0).unwrap().watermark, 150);
        let series = s.series("r", &all("loss")).unwrap();
        assert_eq!(series.total, 150);
        assert_eq!(
            series.points.iter().map(|p| p.step).collect::<Vec<_>>(),
            (0..150).collect::<Vec<_>>()
        );
        assert_eq!(s.watermark("r", "w1").unwrap(), 150);
        assert_eq!(s.watermark("r", "other").unwrap(), 0);
    });
}

/// The embedded backend stores a batch of more than 65,536 rows in parts,
/// a transaction each (so small writers commit between them): the batch
/// still reads back whole, a resend stores nothing twice, and one whose
/// first part was stored before stores only the rest.
#[test]
fn a_batch_larger_than_a_part_is_stored_whole_and_exactly_once() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        let mut big = metrics("w", 1, "loss", 0..90_000, 0);
        big.records.push((
            90_001,
            Record::Event {
                kind: "finished".into(),
                wall: 5.0,
                text: String::new(),
                data: String::new(),
            },
        ));
        // The first 70,000 records came in a batch of their own, earlier.
        let first = metrics("w", 1, "loss", 0..70_000, 0);
        assert_eq!(s.ingest("r", &first, 1.0).unwrap().watermark, 70_000);
        for _ in 0..2 {
            assert_eq!(s.ingest("r", &big, 2.0).unwrap().watermark, 90_001);
        }
        let series = s.series("r", &all("loss")).unwrap();
        assert_eq!(series.total, 90_000);
        assert!(!series.downsampled);
        assert!(
            series
                .points
                .iter()
                .enumerate()
                .all(|(i, p)| p.step == i as i64 && p.value == i as f64 * 10.0),
            "a point is missing, doubled or changed"
        );
        assert_eq!(s.get_run("r").unwrap().status, RunStatus::Finished);
        let events = s.events("r").unwrap();
        assert_eq!(events.iter().filter(|e| e.kind == "finished").count(), 1);
    });
}

#[test]
fn a_gap_after_the_watermark_is_refused_and_nothing_is_stored() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        s.ingest("r", &metrics("w", 1, "loss", 0..10, 0), 1.0)
            .unwrap();
        let gap = metrics("w", 20, "loss", 10..20, 0);
        let err = s.ingest("r", &gap, 2.0).unwrap_err();
        assert!(
            matches!(&err, StorageError::Conflict(m) if m.contains("send from 11")),
            "{err}"
        );
        assert_eq!(s.series("r", &all("loss")).unwrap().total, 10);
        assert!(matches!(
            s.ingest("missing", &metrics("w", 1, "x", 0..1, 0), 0.0),
            Err(StorageError::NotFound(_))
        ));
    });
}

/// Regression: a batch numbered [1, 3] was stored, and record 2, sent
/// later, acknowledged and dropped.
#[test]
fn a_gap_inside_a_batch_is_refused_and_nothing_is_stored() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        let mut gap = metrics("w", 1, "loss", 0..3, 0);
        gap.records.remove(1);
        let err = s.ingest("r", &gap, 1.0).unwrap_err();
        assert!(
            matches!(&err, StorageError::Invalid(m) if m.contains("3 follows 1")),
            "{err}"
        );
        assert_eq!(s.watermark("r", "w").unwrap(), 0);
        assert!(s.keys("r").unwrap().is_empty());
        // Sent whole, every record is stored.
        let ack = s.ingest("r", &metrics("w", 1, "loss", 0..3, 0), 2.0);
        assert_eq!(ack.unwrap().watermark, 3);
        assert_eq!(s.series("r", &all("loss")).unwrap().total, 3);
    });
}

/// Regression: sequence numbers above 2^63-1 were clamped when stored (the
/// answer said one watermark, the database held another), so a resend was
/// stored again.
#[test]
fn sequence_numbers_are_stored_exactly_up_to_the_limit() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        let max = relaunch_api::batch::MAX_SEQ;
        for seq in [0, max + 1, u64::MAX] {
            let err = s
                .ingest("r", &metrics("w", seq, "loss", 0..1, 0), 1.0)
                .unwrap_err();
            assert!(
                matches!(&err, StorageError::Invalid(m) if m.contains("9223372036854775807")),
                "{err}"
            );
        }
        // Across the limit inside one batch.
        let err = s.ingest("r", &metrics("w", max, "loss", 0..2, 0), 1.0);
        assert!(matches!(err, Err(StorageError::Invalid(_))));
        assert_eq!(s.watermark("r", "w").unwrap(), 0);
    });
}

/// Regression: a point at step 2^63-1 was stored and shown by `latest`
/// but never returned by series reads (the largest step stood for "no
/// limit"). Every i64 is a step, read back whole, in a range and across
/// attempts.
#[test]
fn every_step_value_reads_back() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        let steps = [i64::MIN, -5, 0, 7, i64::MAX];
        let batch = |token: &str, first: u64, steps: &[i64]| Batch {
            writer: format!("w-{token}"),
            attempt_token: token.into(),
            records: steps
                .iter()
                .enumerate()
                .map(|(i, &step)| {
                    (
                        first + i as u64,
                        Record::Metrics {
                            step,
                            wall: 0.0,
                            rank: 0,
                            values: vec![("x".into(), i as f64)],
                        },
                    )
                })
                .collect(),
        };
        s.ingest("r", &batch("t0", 1, &steps), 1.0).unwrap();
        let read = |q: SeriesQuery| -> Vec<i64> {
            s.series("r", &q)
                .unwrap()
                .points
                .iter()
                .map(|p| p.step)
                .collect()
        };
        assert_eq!(read(all("x")), steps);
        let range = |lo, hi| SeriesQuery {
            min_step: lo,
            max_step: hi,
            ..all("x")
        };
        assert_eq!(read(range(Some(i64::MAX), Some(i64::MAX))), [i64::MAX]);
        assert_eq!(read(range(Some(i64::MIN), Some(i64::MIN))), [i64::MIN]);
        assert_eq!(read(range(Some(0), None)), [0, 7, i64::MAX]);
        assert_eq!(read(range(None, Some(-5))), [i64::MIN, -5]);
        // Downsampled, the extreme steps keep their buckets.
        let two = SeriesQuery {
            buckets: 2,
            ..all("x")
        };
        let buckets = s.series("r", &two).unwrap();
        assert_eq!(buckets.total, 5);
        assert_eq!(buckets.points.last().unwrap().step, i64::MAX);
        let latest = s.latest("r").unwrap();
        assert_eq!(latest[0].step, i64::MAX);

        // A newer attempt that starts at i64::MAX replaces only that step.
        s.open_run(&init("p", Some("r"), "t1"), 2.0).unwrap();
        s.ingest("r", &batch("t1", 1, &[i64::MAX]), 3.0).unwrap();
        let series = s.series("r", &all("x")).unwrap();
        let shown: Vec<(i64, u32)> = series.points.iter().map(|p| (p.step, p.attempt)).collect();
        assert_eq!(
            shown,
            [(i64::MIN, 0), (-5, 0), (0, 0), (7, 0), (i64::MAX, 1)]
        );
    });
}

/// Regression: NaN and the infinities read back as nothing (JSON null) or
/// as NaN. Each reads back as itself, in full reads, in buckets (whose
/// extremes skip NaN) and in `latest`.
#[test]
fn non_finite_values_read_back_as_themselves() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        let values = [
            1.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            2.0,
            f64::NAN,
        ];
        let batch = Batch {
            writer: "w".into(),
            attempt_token: "t0".into(),
            records: values
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    (
                        i as u64 + 1,
                        Record::Metrics {
                            step: i as i64,
                            wall: 0.0,
                            rank: 0,
                            values: vec![("x".into(), v), ("nan".into(), f64::NAN)],
                        },
                    )
                })
                .collect(),
        };
        s.ingest("r", &batch, 1.0).unwrap();
        let bits = |v: &[f64]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let series = s.series("r", &all("x")).unwrap();
        let read: Vec<f64> = series.points.iter().map(|p| p.value).collect();
        assert_eq!(bits(&read), bits(&values));
        // Two buckets of three: last values, extremes without NaN.
        let two = s
            .series(
                "r",
                &SeriesQuery {
                    buckets: 2,
                    ..all("x")
                },
            )
            .unwrap();
        let b: Vec<(f64, f64, f64, u64)> = two
            .points
            .iter()
            .map(|p| (p.value, p.min, p.max, p.count))
            .collect();
        assert_eq!(b[0], (f64::INFINITY, 1.0, f64::INFINITY, 3));
        assert_eq!((b[1].1, b[1].2, b[1].3), (f64::NEG_INFINITY, 2.0, 3));
        assert!(b[1].0.is_nan());
        // One bucket: the chunk's stored summary.
        let one = s
            .series(
                "r",
                &SeriesQuery {
                    buckets: 1,
                    ..all("x")
                },
            )
            .unwrap();
        let p = &one.points[0];
        assert_eq!(
            (p.min, p.max, p.count),
            (f64::NEG_INFINITY, f64::INFINITY, 6)
        );
        assert!(p.value.is_nan());
        // All NaN: NaN everywhere, not infinities or zeros.
        let nan = s
            .series(
                "r",
                &SeriesQuery {
                    buckets: 2,
                    ..all("nan")
                },
            )
            .unwrap();
        assert!(
            nan.points
                .iter()
                .all(|p| p.value.is_nan() && p.min.is_nan() && p.max.is_nan())
        );
        let latest = s.latest("r").unwrap();
        assert!(latest.iter().find(|l| l.key == "x").unwrap().value.is_nan());
    });
}

#[test]
fn writers_are_independent() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        let mut rank1 = metrics("rank1", 1, "loss", 0..5, 0);
        for (_, r) in &mut rank1.records {
            if let Record::Metrics { rank, .. } = r {
                *rank = 1;
            }
        }
        s.ingest("r", &metrics("rank0", 1, "loss", 0..5, 0), 0.0)
            .unwrap();
        s.ingest("r", &rank1, 0.0).unwrap();
        assert_eq!(s.series("r", &all("loss")).unwrap().rank, 0);
        let q = SeriesQuery {
            rank: Some(1),
            ..all("loss")
        };
        assert_eq!(s.series("r", &q).unwrap().total, 5);
    });
}

#[test]
fn a_resumed_attempt_replaces_the_steps_it_repeats() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        s.ingest("r", &metrics("a0", 1, "loss", 0..100, 0), 0.0)
            .unwrap();
        // Preempted after step 99, resumed from the checkpoint of step 60.
        s.ingest("r", &metrics("a1", 1, "loss", 61..120, 1), 0.0)
            .unwrap();
        let series = s.series("r", &all("loss")).unwrap();
        assert_eq!(series.total, 120);
        let at = |step: i64| {
            series
                .points
                .iter()
                .find(|p| p.step == step)
                .unwrap()
                .clone()
        };
        assert_eq!((at(60).attempt, at(60).value), (0, 600.0));
        assert_eq!((at(61).attempt, at(61).value), (1, 611.0));
        // The old attempt's values are kept with it.
        let old = s
            .series(
                "r",
                &SeriesQuery {
                    attempt: Some(0),
                    ..all("loss")
                },
            )
            .unwrap();
        assert_eq!(old.total, 100);
        let latest = s.latest("r").unwrap();
        assert_eq!((latest[0].step, latest[0].attempt), (119, 1));
    });
}

/// A full read takes points as they are when their steps only increase, and
/// sorts them otherwise: steps logged again in the same attempt (the newest
/// value wins), or logged going back.
#[test]
fn a_full_read_is_in_step_order_whatever_order_the_steps_came_in() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        s.ingest("r", &metrics("w", 1, "loss", 10..20, 0), 0.0)
            .unwrap();
        s.ingest("r", &metrics("w", 11, "loss", 0..12, 0), 0.0)
            .unwrap();
        let series = s.series("r", &all("loss")).unwrap();
        let steps: Vec<i64> = series.points.iter().map(|p| p.step).collect();
        assert_eq!(steps, (0..20).collect::<Vec<_>>());
        assert!(
            series
                .points
                .iter()
                .all(|p| p.value == p.step as f64 * 10.0)
        );
        // In order, in several batches: the same points.
        s.ingest("r", &metrics("v", 1, "acc", 0..5, 0), 0.0)
            .unwrap();
        s.ingest("r", &metrics("v", 6, "acc", 5..9, 0), 0.0)
            .unwrap();
        let series = s.series("r", &all("acc")).unwrap();
        let steps: Vec<i64> = series.points.iter().map(|p| p.step).collect();
        assert_eq!(steps, (0..9).collect::<Vec<_>>());
    });
}

#[test]
fn large_series_are_downsampled_keeping_extremes() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        let n = 200_000i64;
        let mut seq = 1;
        for part in (0..n).collect::<Vec<_>>().chunks(50_000) {
            let batch = metrics("w", seq, "loss", part[0]..part[part.len() - 1] + 1, 0);
            seq += part.len() as u64;
            s.ingest("r", &batch, 0.0).unwrap();
        }
        let q = SeriesQuery {
            buckets: 500,
            ..all("loss")
        };
        let series = s.series("r", &q).unwrap();
        assert!(series.downsampled && series.points.len() <= 500);
        assert_eq!(series.total, n as u64);
        assert_eq!(series.points.iter().map(|p| p.count).sum::<u64>(), n as u64);
        assert_eq!(series.points[0].min, 0.0);
        assert_eq!(series.points.last().unwrap().max, (n - 1) as f64 * 10.0);
        let window = SeriesQuery {
            min_step: Some(1000),
            max_step: Some(1099),
            ..all("loss")
        };
        let w = s.series("r", &window).unwrap();
        assert_eq!((w.total, w.points.first().unwrap().step), (100, 1000));
    });
}

#[test]
fn console_lines_and_events() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        let batch = Batch {
            writer: "launcher".into(),
            attempt_token: "t0".into(),
            records: vec![
                (
                    1,
                    Record::Log {
                        rank: 0,
                        stream: Stream::Stdout,
                        wall: 1.0,
                        text: "hello".into(),
                    },
                ),
                (
                    2,
                    Record::Log {
                        rank: 1,
                        stream: Stream::Stderr,
                        wall: 1.1,
                        text: "warn".into(),
                    },
                ),
                (
                    3,
                    Record::Event {
                        kind: "preempted".into(),
                        wall: 2.0,
                        text: "SIGTERM".into(),
                        data: "{\"step\":42}".into(),
                    },
                ),
            ],
        };
        s.ingest("r", &batch, 3.0).unwrap();
        let lines = s.logs("r", None, 0, 100).unwrap();
        assert_eq!(
            lines.iter().map(|l| l.text.as_str()).collect::<Vec<_>>(),
            ["hello", "warn"]
        );
        assert_eq!(s.logs("r", Some(1), 0, 100).unwrap().len(), 1);
        assert!(s.logs("r", None, lines[1].id, 100).unwrap().is_empty());
        // The tail: the last lines, in order, of every rank or of one.
        assert_eq!(s.log_tail("r", None, 1).unwrap(), lines[1..]);
        assert_eq!(s.log_tail("r", None, 10).unwrap(), lines);
        assert_eq!(s.log_tail("r", Some(0), 10).unwrap(), lines[..1]);
        assert!(s.log_tail("r", Some(7), 10).unwrap().is_empty());
        assert!(s.log_tail("nope", None, 10).is_err());
        let events = s.events("r").unwrap();
        assert_eq!(events[0].kind, "preempted");
        assert_eq!(events[0].data["step"], 42);
        assert_eq!(s.get_run("r").unwrap().status, RunStatus::Preempted);
        assert_eq!(s.keys("r").unwrap(), Vec::<String>::new());
    });
}

/// A page of console lines stops once its text reaches 8 MiB (the first
/// line always): pages of huge lines are not read whole into memory, and
/// reading on after the last line gets the rest.
#[test]
fn a_page_of_huge_console_lines_stops_at_its_byte_budget() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        let big = |c: char| c.to_string().repeat(5 << 20);
        let records = ['a', 'b', 'c']
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    i as u64 + 1,
                    Record::Log {
                        rank: 0,
                        stream: Stream::Stdout,
                        wall: 1.0,
                        text: big(c),
                    },
                )
            })
            .chain(std::iter::once((
                4,
                Record::Log {
                    rank: 0,
                    stream: Stream::Stdout,
                    wall: 1.0,
                    text: "small".into(),
                },
            )))
            .collect();
        let batch = Batch {
            writer: "w".into(),
            attempt_token: "t0".into(),
            records,
        };
        s.ingest("r", &batch, 1.0).unwrap();
        let first = s.logs("r", None, 0, 100).unwrap();
        assert_eq!(first.len(), 2, "5 + 5 MiB reach the 8 MiB budget");
        assert!(first[0].text == big('a') && first[1].text == big('b'));
        let rest = s.logs("r", None, first[1].id, 100).unwrap();
        assert_eq!(
            rest.iter().map(|l| l.text.len()).collect::<Vec<_>>(),
            [5 << 20, 5]
        );
        assert!(s.logs("r", None, rest[1].id, 100).unwrap().is_empty());
        // One line over the budget alone still comes whole.
        assert_eq!(s.logs("r", None, 0, 1).unwrap()[0].text.len(), 5 << 20);
        // The tail is the newest lines within the budget, in order.
        let tail = s.log_tail("r", None, 100).unwrap();
        assert_eq!(
            tail.iter().map(|l| l.text.len()).collect::<Vec<_>>(),
            [5 << 20, 5 << 20, 5]
        );
        assert_eq!(tail[2].text, "small");
    });
}

#[test]
fn one_log_call_of_several_keys_and_a_batch_of_a_new_attempt() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        let call = |step: i64| Record::Metrics {
            step,
            wall: 0.0,
            rank: 2,
            values: vec![
                ("loss".into(), 1.0 / (step + 1) as f64),
                ("lr".into(), 0.1),
                ("acc".into(), f64::NAN),
            ],
        };
        // A writer whose attempt token the run has not seen (a relaunched
        // process that shipped before it could open the run) starts the next attempt.
        let batch = Batch {
            writer: "w".into(),
            attempt_token: "launch-2:0".into(),
            records: vec![(1, call(0)), (2, call(1))],
        };
        s.ingest("r", &batch, 1.0).unwrap();
        assert_eq!(s.keys("r").unwrap(), ["acc", "loss", "lr"]);
        let q = SeriesQuery {
            rank: Some(2),
            ..all("lr")
        };
        let lr = s.series("r", &q).unwrap();
        assert_eq!((lr.total, lr.points[1].attempt), (2, 1));
        assert!(
            s.series(
                "r",
                &SeriesQuery {
                    rank: Some(2),
                    ..all("acc")
                }
            )
            .unwrap()
            .points[0]
                .value
                .is_nan()
        );
        let run = s.get_run("r").unwrap();
        assert_eq!(run.attempts, 2);
        // The same token, opened afterwards, is that same attempt.
        assert_eq!(
            s.open_run(&init("p", Some("r"), "launch-2:0"), 2.0)
                .unwrap()
                .attempt,
            Some(1)
        );
    });
}

#[test]
fn data_survives_reopening() {
    for place in backends::places("reopen") {
        {
            let s = place.open(Durability::Fsync);
            s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
            s.ingest("r", &metrics("w", 1, "loss", 0..10, 0), 0.0)
                .unwrap();
        }
        let s = place.open(Durability::Fsync);
        assert_eq!(s.watermark("r", "w").unwrap(), 10);
        assert_eq!(s.series("r", &all("loss")).unwrap().total, 10);
        drop(s);
        backends::remove(&place);
    }
}

#[test]
fn the_newest_event_sets_the_status_even_when_shipped_late() {
    each_backend(|s, _| {
        s.open_run(&init("p", Some("r"), "t0"), 0.0).unwrap();
        let event = |writer: &str, kind: &str, wall: f64| Batch {
            writer: writer.into(),
            attempt_token: "t0".into(),
            records: vec![(
                1,
                Record::Event {
                    kind: kind.into(),
                    wall,
                    text: String::new(),
                    data: String::new(),
                },
            )],
        };
        s.ingest("r", &event("launcher", "finished", 20.0), 21.0)
            .unwrap();
        // A rank's spool synced later still holds its start event.
        s.ingest("r", &event("rank0", "start", 10.0), 30.0).unwrap();
        assert_eq!(s.get_run("r").unwrap().status, RunStatus::Finished);
        // Resuming the run does not change the status either; its start event does.
        s.open_run(&init("p", Some("r"), "t1"), 40.0).unwrap();
        assert_eq!(s.get_run("r").unwrap().status, RunStatus::Finished);
        s.ingest("r", &event("rank0-b", "start", 41.0), 41.0)
            .unwrap();
        assert_eq!(s.get_run("r").unwrap().status, RunStatus::Running);
    });
}

#[test]
fn attempts_are_ordered_by_when_they_started_not_when_they_arrived() {
    each_backend(|s, _| {
        // The resumed process (started at 200) reaches the server first and
        // ships the spool of the dead one (started at 100) afterwards.
        let open = |token: &str, started: f64| RunInit {
            attempt_started: Some(started),
            ..init("p", Some("r"), token)
        };
        assert_eq!(
            s.open_run(&open("new", 200.0), 201.0).unwrap().attempt,
            Some(0)
        );
        s.ingest(
            "r",
            &Batch {
                attempt_token: "new".into(),
                ..metrics("w-new", 1, "loss", 50..80, 0)
            },
            202.0,
        )
        .unwrap();
        assert_eq!(
            s.open_run(&open("old", 100.0), 203.0).unwrap().attempt,
            Some(1)
        );
        s.ingest(
            "r",
            &Batch {
                attempt_token: "old".into(),
                ..metrics("w-old", 1, "loss", 0..70, 0)
            },
            204.0,
        )
        .unwrap();
        let series = s.series("r", &all("loss")).unwrap();
        assert_eq!(series.total, 80);
        assert!(
            series.points[..50].iter().all(|p| p.attempt == 1),
            "the old attempt up to where the new one resumed"
        );
        assert!(series.points[50..].iter().all(|p| p.attempt == 0));
        let latest = s.latest("r").unwrap();
        assert_eq!((latest[0].step, latest[0].attempt), (79, 0));
    });
}

#[test]
fn a_committed_file_replaces_the_one_of_the_same_name_whole() {
    use relaunch_api::{ChunkRef, FileManifest};
    each_backend(|s, _| {
        let file = |name: &str, hashes: &[char]| FileManifest {
            name: name.into(),
            size: 10 * hashes.len() as u64,
            blake3: "f".repeat(64),
            chunks: hashes
                .iter()
                .map(|c| ChunkRef {
                    hash: c.to_string().repeat(64),
                    size: 10,
                })
                .collect(),
        };
        assert!(matches!(
            s.commit_file("nope", &file("a", &['a']), 1.0),
            Err(StorageError::NotFound(_))
        ));
        s.open_run(&init("p", Some("r"), "t"), 1.0).unwrap();
        s.commit_file("r", &file("b/model.pt", &['a', 'b']), 2.0)
            .unwrap();
        s.commit_file("r", &file("a.txt", &['c']), 3.0).unwrap();
        s.commit_file("r", &file("b/model.pt", &['d', 'e', 'f']), 4.0)
            .unwrap();
        let names: Vec<_> = s
            .files("r")
            .unwrap()
            .into_iter()
            .map(|f| (f.name, f.chunks))
            .collect();
        assert_eq!(
            names,
            [("a.txt".to_owned(), 1), ("b/model.pt".to_owned(), 3)]
        );
        let (info, chunks) = s.file("r", "b/model.pt").unwrap();
        assert_eq!((info.size, info.created_at), (30, 4.0));
        let hashes: String = chunks.iter().map(|c| &c.hash[..1]).collect();
        assert_eq!(hashes, "def");
        assert!(matches!(
            s.file("r", "missing"),
            Err(StorageError::NotFound(_))
        ));
        // A deleted file is gone from the list and from reads; deleting it
        // again, or from a run that does not exist, is NotFound.
        let gone = s.delete_file("r", "b/model.pt", 5.0).unwrap();
        assert_eq!(
            (gone.name.as_str(), gone.size, gone.chunks),
            ("b/model.pt", 30, 3)
        );
        let names: Vec<_> = s.files("r").unwrap().into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["a.txt"]);
        assert!(matches!(
            s.file("r", "b/model.pt"),
            Err(StorageError::NotFound(_))
        ));
        for (run, name) in [("r", "b/model.pt"), ("nope", "a.txt")] {
            assert!(matches!(
                s.delete_file(run, name, 6.0),
                Err(StorageError::NotFound(_))
            ));
        }
        // And committed again under its name, it is back.
        s.commit_file("r", &file("b/model.pt", &['a']), 7.0)
            .unwrap();
        assert_eq!(s.files("r").unwrap().len(), 2);
    });
}

#[test]
fn a_file_cannot_also_be_a_folder_of_files() {
    use relaunch_api::{ChunkRef, FileManifest};
    each_backend(|s, _| {
        let file = |name: &str| FileManifest {
            name: name.into(),
            size: 10,
            blake3: "a".repeat(64),
            chunks: vec![ChunkRef {
                hash: "a".repeat(64),
                size: 10,
            }],
        };
        s.open_run(&init("p", Some("r"), "t"), 1.0).unwrap();
        for name in ["dir", "a/b/c", "dir-x", "dir.y/z", "dirz/w"] {
            s.commit_file("r", &file(name), 2.0).unwrap();
        }
        // Below a file, or above one: refused, naming the other.
        for (name, other) in [
            ("dir/file", "dir"),
            ("dir/deeper/file", "dir"),
            ("a/b", "a/b/c"),
            ("a", "a/b/c"),
            ("a/b/c/d", "a/b/c"),
        ] {
            match s.commit_file("r", &file(name), 3.0) {
                Err(StorageError::Conflict(m)) => {
                    assert!(m.contains(&format!("already has a file {other:?}")), "{m}");
                    assert!(m.contains("both a file and the folder"), "{m}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        // Names that only start alike are no folder of each other, and a
        // file replaced under its own name is no conflict.
        for name in ["dirx", "di", "a/bc", "a/b/cc", "dir"] {
            s.commit_file("r", &file(name), 4.0).unwrap();
        }
        let names: Vec<_> = s.files("r").unwrap().into_iter().map(|f| f.name).collect();
        assert_eq!(
            names,
            [
                "a/b/c", "a/b/cc", "a/bc", "di", "dir", "dir-x", "dir.y/z", "dirx", "dirz/w"
            ]
        );
        // Deleted, the file no longer stands in the folder's way.
        s.delete_file("r", "dir", 5.0).unwrap();
        s.commit_file("r", &file("dir/file"), 6.0).unwrap();
    });
}

#[test]
fn chunks_handed_out_for_the_bucket_are_pending_until_a_commit_names_them() {
    use relaunch_api::{ChunkRef, DirectChunk, FileManifest};
    each_backend(|s, name| {
        let chunk = |c: char, sum: &str| DirectChunk {
            hash: c.to_string().repeat(64),
            size: 10,
            sha256: sum.into(),
        };
        let hashes = |v: &[DirectChunk]| v.iter().map(|c| c.hash.clone()).collect::<Vec<_>>();
        s.pend_chunks(&[chunk('a', "s1"), chunk('b', "s2")], 10.0)
            .unwrap();
        s.pend_chunks(&[chunk('c', "s3")], 20.0).unwrap();
        // Asked for again: the new time and checksum.
        s.pend_chunks(&[chunk('a', "s1-again")], 30.0).unwrap();
        let all = hashes(&[
            chunk('a', ""),
            chunk('b', ""),
            chunk('c', ""),
            chunk('d', ""),
        ]);
        let mut pending = s.pending_chunks(&all).unwrap();
        pending.sort_by(|x, y| x.hash.cmp(&y.hash));
        assert_eq!(
            pending,
            [chunk('a', "s1-again"), chunk('b', "s2"), chunk('c', "s3")],
            "{name}"
        );
        // Stale: handed out before 25 and never confirmed, oldest first.
        assert_eq!(
            s.stale_chunks(25.0, 10).unwrap(),
            hashes(&[chunk('b', ""), chunk('c', "")]),
            "{name}"
        );
        assert_eq!(s.stale_chunks(25.0, 1).unwrap().len(), 1);
        // A commit that names a chunk confirms it.
        s.open_run(&init("p", Some("r"), "t"), 1.0).unwrap();
        let file = FileManifest {
            name: "f".into(),
            size: 10,
            blake3: "e".repeat(64),
            chunks: vec![ChunkRef {
                hash: "c".repeat(64),
                size: 10,
            }],
        };
        s.commit_file("r", &file, 40.0).unwrap();
        assert_eq!(s.stale_chunks(25.0, 10).unwrap(), hashes(&[chunk('b', "")]));
        // Collected: dropped only if still as old (one handed out again is kept).
        s.pend_chunks(&[chunk('b', "s2")], 50.0).unwrap();
        s.drop_stale_chunks(&hashes(&[chunk('a', ""), chunk('b', "")]), 25.0)
            .unwrap();
        assert_eq!(hashes(&s.pending_chunks(&all).unwrap()).len(), 2, "{name}");
        s.drop_stale_chunks(&hashes(&[chunk('a', ""), chunk('b', "")]), 60.0)
            .unwrap();
        assert!(s.pending_chunks(&all).unwrap().is_empty(), "{name}");
    });
}

/// CI must run the PostgreSQL half of the suite, not skip it quietly.
#[test]
fn postgres_runs_under_ci() {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false") {
        assert!(
            backends::admin_url().is_some(),
            "CI is set but {POSTGRES_ENV} is not: the PostgreSQL runs of the storage suite \
             would be skipped; run the tests through scripts/test.sh, which starts PostgreSQL"
        );
    }
}

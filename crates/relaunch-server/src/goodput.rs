//! A run's goodput from its timeline (`storage/timeline.rs`), computed
//! without I/O: each attempt's time cut into start-up, productive, re-run,
//! stop and restart, each interruption's cost, and productive / wall.
//!
//! Attempts are taken one after another in the order they started, as the
//! launcher runs them; their times are made to follow one another (a start
//! before the previous end, from clocks apart on two nodes, is moved to
//! that end), so the segments always add up to the wall time. Per attempt:
//! its start is its `start` event (else when its first process opened the
//! run); its end its first `restart`, `finished`, `failed` or `preempted`
//! event, else `now` for the newest attempt (running), else its last step
//! (unknown: a newer attempt started without this one's end recorded).

use std::collections::HashMap;

use relaunch_api::{AttemptEnd, AttemptGoodput, Goodput, Interruption};

use crate::storage::timeline::{AttemptTimeline, Timeline};

/// The goodput of run `run` at `now` (the server's clock, seconds since
/// the epoch).
pub fn compute(run: &str, timeline: &Timeline, now: f64) -> Goodput {
    let launches = launches(&timeline.attempts);
    let mut attempts: Vec<AttemptGoodput> = Vec::with_capacity(timeline.attempts.len());
    let mut boundary = f64::NEG_INFINITY;
    for (i, a) in timeline.attempts.iter().enumerate() {
        let newest = i + 1 == timeline.attempts.len();
        let (launch, launch_attempt) = launches[i];
        let row = segments(a, timeline, boundary, newest, now, launch, launch_attempt);
        if let Some(previous) = attempts.last_mut() {
            previous.restart_s = row.start - previous.end;
        }
        boundary = row.end;
        attempts.push(row);
    }
    // A restart under way: the newest attempt ended and the next has not
    // started yet, unless the job ended during the pause (a signal).
    let mut running = false;
    if let Some(last) = attempts.last_mut() {
        match last.ended {
            AttemptEnd::Running => running = true,
            AttemptEnd::Restart => {
                let stopped = timeline
                    .events
                    .iter()
                    .filter(|e| e.attempt == last.attempt && e.kind != "restart")
                    .filter(|e| AttemptEnd::of_event(&e.kind).is_some())
                    .map(|e| e.wall)
                    .reduce(f64::max);
                running = stopped.is_none();
                last.restart_s = (stopped.unwrap_or(now) - last.end).max(0.0);
            }
            _ => {}
        }
    }
    let interruptions = interruptions(&attempts);
    let sum = |f: fn(&AttemptGoodput) -> f64| attempts.iter().map(f).sum::<f64>();
    let productive_s = sum(|a| a.productive_s);
    let started = attempts.first().map(|a| a.start);
    let ended = attempts.last().map(|a| a.end + a.restart_s);
    let wall_s = match (started, ended) {
        (Some(s), Some(e)) => e - s,
        _ => 0.0,
    };
    let stepped = attempts.iter().any(|a| a.first_step_at.is_some());
    Goodput {
        run: run.to_owned(),
        now,
        running,
        started,
        ended,
        wall_s,
        productive_s,
        goodput: (stepped && wall_s > 0.0).then(|| (productive_s / wall_s).clamp(0.0, 1.0)),
        startup_s: sum(|a| a.startup_s),
        rerun_s: sum(|a| a.rerun_s),
        stop_s: sum(|a| a.stop_s),
        restart_s: sum(|a| a.restart_s),
        steps_re_run: attempts.iter().map(|a| a.steps_re_run).sum(),
        attempts,
        interruptions,
    }
}

/// One attempt's times and segments; its `restart_s` is filled in once
/// the next attempt's start is known. `boundary`: where the previous
/// attempt ended (nothing of this one comes before it).
fn segments(
    a: &AttemptTimeline,
    timeline: &Timeline,
    boundary: f64,
    newest: bool,
    now: f64,
    launch: u32,
    launch_attempt: Option<u32>,
) -> AttemptGoodput {
    let mine = || timeline.events.iter().filter(|e| e.attempt == a.attempt);
    let start_event = mine()
        .filter(|e| e.kind == "start")
        .map(|e| e.wall)
        .reduce(f64::min);
    let end_event = mine()
        .filter_map(|e| AttemptEnd::of_event(&e.kind).map(|end| (end, e.wall)))
        .reduce(|x, y| if y.1 < x.1 { y } else { x });
    let start = start_event.unwrap_or(a.started).max(boundary);
    // Each time no earlier than the one before it.
    let steps = a.steps.map(|s| {
        let first = s.first_wall.max(start);
        let kept = s.kept_wall.map(|k| k.max(first));
        let last = s.last_wall.max(kept.unwrap_or(first));
        (s, first, kept, last)
    });
    let active = steps.map_or(start, |(_, _, _, last)| last);
    let (ended, end) = match end_event {
        Some((how, wall)) => (how, wall.max(active)),
        None if newest => (AttemptEnd::Running, now.max(active)),
        None => (AttemptEnd::Unknown, active),
    };
    let mut row = AttemptGoodput {
        attempt: a.attempt,
        launch,
        launch_attempt,
        start,
        first_step_at: None,
        kept_step_at: None,
        last_step_at: None,
        end,
        ended,
        first_step: None,
        last_step: None,
        redone_from: None,
        startup_s: end - start,
        productive_s: 0.0,
        rerun_s: 0.0,
        stop_s: 0.0,
        restart_s: 0.0,
        steps_re_run: 0,
    };
    if let Some((s, first, kept, last)) = steps {
        row.first_step_at = Some(first);
        row.kept_step_at = kept;
        row.last_step_at = Some(last);
        row.first_step = Some(s.first_step);
        row.last_step = Some(s.last_step);
        row.redone_from = s.redone_from;
        row.startup_s = first - start;
        // Every step redone: nothing of it was productive.
        let kept = kept.unwrap_or(first);
        row.productive_s = kept - first;
        row.rerun_s = last - kept;
        row.stop_s = end - last;
        row.steps_re_run = s.steps_redone;
    }
    row
}

/// Each attempt that a next one followed (or will, a restart under way),
/// with the next one's start-up.
fn interruptions(attempts: &[AttemptGoodput]) -> Vec<Interruption> {
    let mut out = Vec::new();
    for (i, a) in attempts.iter().enumerate() {
        let next = attempts.get(i + 1);
        if next.is_none() && a.ended != AttemptEnd::Restart {
            continue;
        }
        let startup_s = next.map_or(0.0, |n| n.startup_s);
        out.push(Interruption {
            attempt: a.attempt,
            reason: a.ended,
            at: a.end,
            rerun_s: a.rerun_s,
            steps_re_run: a.steps_re_run,
            stop_s: a.stop_s,
            restart_s: a.restart_s,
            startup_s,
            lost_s: a.rerun_s + a.stop_s + a.restart_s + startup_s,
        });
    }
    out
}

/// Each attempt's launch (numbered from 0 as launches first appear) and
/// its number within it, from its token: `LAUNCH:ATTEMPT` under
/// `relaunch run`; any other token is a launch of its own.
fn launches(attempts: &[AttemptTimeline]) -> Vec<(u32, Option<u32>)> {
    let mut seen: HashMap<&str, u32> = HashMap::new();
    attempts
        .iter()
        .map(|a| {
            let (launch, number) = match a.token.rsplit_once(':') {
                Some((launch, n)) => match n.parse::<u32>() {
                    Ok(n) => (launch, Some(n)),
                    Err(_) => (a.token.as_str(), None),
                },
                None => (a.token.as_str(), None),
            };
            let next = seen.len() as u32;
            (*seen.entry(launch).or_insert(next), number)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::timeline::{Lifecycle, StepTimes};

    fn event(kind: &str, attempt: u32, wall: f64) -> Lifecycle {
        Lifecycle {
            kind: kind.into(),
            attempt,
            wall,
        }
    }

    fn attempt(
        attempt: u32,
        token: &str,
        started: f64,
        steps: Option<StepTimes>,
    ) -> AttemptTimeline {
        AttemptTimeline {
            attempt,
            token: token.into(),
            started,
            steps,
        }
    }

    /// Steps `first..=last` logged from `first_wall` to `last_wall`, none redone.
    fn steps(first: i64, last: i64, first_wall: f64, last_wall: f64) -> StepTimes {
        StepTimes {
            first_step: first,
            last_step: last,
            first_wall,
            last_wall,
            redone_from: None,
            kept_wall: Some(last_wall),
            steps_redone: 0,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// The segments of every attempt add up to the wall time.
    fn adds_up(g: &Goodput) {
        let total: f64 = g
            .attempts
            .iter()
            .map(|a| a.startup_s + a.productive_s + a.rerun_s + a.stop_s + a.restart_s)
            .sum();
        assert!(close(total, g.wall_s), "{total} != {}", g.wall_s);
        for a in &g.attempts {
            for s in [
                a.startup_s,
                a.productive_s,
                a.rerun_s,
                a.stop_s,
                a.restart_s,
            ] {
                assert!(s >= 0.0, "{a:?}");
            }
        }
    }

    #[test]
    fn a_clean_run_is_its_steps_span_over_its_wall_time() {
        // Start at 100, steps from 110 to 190, finished at 200.
        let t = Timeline {
            attempts: vec![attempt(0, "L:0", 99.0, Some(steps(0, 80, 110.0, 190.0)))],
            events: vec![event("start", 0, 100.0), event("finished", 0, 200.0)],
        };
        let g = compute("r", &t, 1_000.0);
        adds_up(&g);
        assert!(!g.running);
        assert_eq!(
            (g.started, g.ended, g.wall_s),
            (Some(100.0), Some(200.0), 100.0)
        );
        assert_eq!(g.goodput, Some(0.8));
        let a = &g.attempts[0];
        assert_eq!((a.startup_s, a.productive_s, a.stop_s), (10.0, 80.0, 10.0));
        assert_eq!(
            (a.ended, a.launch, a.launch_attempt),
            (AttemptEnd::Finished, 0, Some(0))
        );
        assert!(g.interruptions.is_empty());
    }

    #[test]
    fn a_crash_redoes_the_steps_after_the_checkpoint() {
        // Attempt 0: steps 0..=50 from 10 to 60, crashed; restart event at
        // 65. Attempt 1 starts at 70, resumes at step 40 (first step at
        // 80), runs to step 100 at 140, finishes at 150.
        let mut a0 = steps(0, 50, 10.0, 60.0);
        a0.redone_from = Some(40);
        a0.kept_wall = Some(49.0);
        a0.steps_redone = 11;
        let t = Timeline {
            attempts: vec![
                attempt(0, "L:0", 0.0, Some(a0)),
                attempt(1, "L:1", 70.0, Some(steps(40, 100, 80.0, 140.0))),
            ],
            events: vec![
                event("start", 0, 0.0),
                event("restart", 0, 65.0),
                event("start", 1, 70.0),
                event("finished", 1, 150.0),
            ],
        };
        let g = compute("r", &t, 1_000.0);
        adds_up(&g);
        assert_eq!(g.wall_s, 150.0);
        assert_eq!(g.productive_s, 39.0 + 60.0);
        assert_eq!(g.goodput, Some(99.0 / 150.0));
        assert_eq!((g.steps_re_run, g.rerun_s), (11, 11.0));
        let a = &g.attempts[0];
        assert_eq!(
            (
                a.startup_s,
                a.productive_s,
                a.rerun_s,
                a.stop_s,
                a.restart_s
            ),
            (10.0, 39.0, 11.0, 5.0, 5.0)
        );
        assert_eq!(a.ended, AttemptEnd::Restart);
        let [i] = g.interruptions.as_slice() else {
            panic!("one interruption: {:?}", g.interruptions)
        };
        assert_eq!((i.attempt, i.reason, i.at), (0, AttemptEnd::Restart, 65.0));
        // Re-run 11 + stop 5 + restart 5 + the next start-up 10.
        assert_eq!((i.startup_s, i.lost_s), (10.0, 31.0));
    }

    #[test]
    fn a_preemption_relaunch_is_a_second_launch_whose_wait_is_restart_time() {
        // Launch "a" preempted at 50 after a clean stop at its step 40
        // (nothing redone); launch "b" starts at 1050 (an hour in a queue,
        // say) and resumes at step 41.
        let t = Timeline {
            attempts: vec![
                attempt(0, "a:0", 0.0, Some(steps(0, 40, 5.0, 45.0))),
                attempt(1, "b:0", 1050.0, Some(steps(41, 80, 1060.0, 1100.0))),
            ],
            events: vec![
                event("start", 0, 0.0),
                event("preempted", 0, 50.0),
                event("start", 1, 1050.0),
                event("finished", 1, 1110.0),
            ],
        };
        let g = compute("r", &t, 5_000.0);
        adds_up(&g);
        let launches: Vec<_> = g
            .attempts
            .iter()
            .map(|a| (a.launch, a.launch_attempt))
            .collect();
        assert_eq!(launches, [(0, Some(0)), (1, Some(0))]);
        assert_eq!(g.attempts[0].restart_s, 1000.0);
        assert_eq!(g.steps_re_run, 0);
        assert_eq!(g.interruptions[0].reason, AttemptEnd::Preempted);
        assert_eq!(g.interruptions[0].lost_s, 5.0 + 1000.0 + 10.0);
        assert_eq!(g.goodput, Some(80.0 / 1110.0));
    }

    #[test]
    fn an_attempt_that_never_reached_a_step_is_all_start_up() {
        // Attempt 1 fails at start-up (an import error); attempt 2 runs.
        let t = Timeline {
            attempts: vec![
                attempt(0, "L:0", 0.0, Some(steps(0, 9, 2.0, 11.0))),
                attempt(1, "L:1", 20.0, None),
                attempt(2, "L:2", 40.0, Some(steps(10, 19, 45.0, 54.0))),
            ],
            events: vec![
                event("start", 0, 0.0),
                event("restart", 0, 15.0),
                event("start", 1, 20.0),
                event("restart", 1, 30.0),
                event("start", 2, 40.0),
                event("finished", 2, 60.0),
            ],
        };
        let g = compute("r", &t, 100.0);
        adds_up(&g);
        let a = &g.attempts[1];
        assert_eq!((a.first_step_at, a.startup_s, a.stop_s), (None, 10.0, 0.0));
        assert_eq!(a.restart_s, 10.0);
        assert_eq!(g.interruptions.len(), 2);
        assert_eq!(
            g.interruptions[0].startup_s, 10.0,
            "the failed attempt's start-up"
        );
        assert_eq!(g.goodput, Some(18.0 / 60.0));
    }

    #[test]
    fn a_running_run_ends_now_and_a_run_without_steps_has_no_goodput() {
        let t = Timeline {
            attempts: vec![attempt(0, "L:0", 0.0, Some(steps(0, 9, 10.0, 19.0)))],
            events: vec![event("start", 0, 0.0)],
        };
        let g = compute("r", &t, 25.0);
        adds_up(&g);
        assert!(g.running);
        assert_eq!(
            (g.attempts[0].ended, g.attempts[0].end),
            (AttemptEnd::Running, 25.0)
        );
        assert_eq!((g.wall_s, g.goodput), (25.0, Some(9.0 / 25.0)));

        // Events only: the time is known, the goodput is not.
        let t = Timeline {
            attempts: vec![attempt(0, "L:0", 0.0, None)],
            events: vec![event("start", 0, 0.0), event("finished", 0, 30.0)],
        };
        let g = compute("r", &t, 100.0);
        adds_up(&g);
        assert_eq!((g.wall_s, g.goodput), (30.0, None));
        assert_eq!(g.startup_s, 30.0);

        // No attempt at all.
        let g = compute("r", &Timeline::default(), 100.0);
        assert_eq!((g.started, g.wall_s, g.goodput), (None, 0.0, None));
    }

    #[test]
    fn a_restart_under_way_counts_until_now() {
        let t = Timeline {
            attempts: vec![attempt(0, "L:0", 0.0, Some(steps(0, 9, 1.0, 10.0)))],
            events: vec![event("start", 0, 0.0), event("restart", 0, 12.0)],
        };
        let g = compute("r", &t, 20.0);
        adds_up(&g);
        assert!(g.running);
        assert_eq!((g.attempts[0].restart_s, g.wall_s), (8.0, 20.0));
        assert_eq!(g.interruptions[0].startup_s, 0.0);

        // The job stopped by a signal during the pause: no longer running.
        let mut t = t;
        t.events.push(event("preempted", 0, 15.0));
        let g = compute("r", &t, 20.0);
        adds_up(&g);
        assert!(!g.running);
        assert_eq!((g.attempts[0].restart_s, g.wall_s), (3.0, 15.0));
    }

    #[test]
    fn clocks_apart_and_ends_never_recorded_still_add_up() {
        // Attempt 1's start event (another node's clock) is before attempt
        // 0's last step; attempt 0 has no end event; a point logged after
        // the end event.
        let t = Timeline {
            attempts: vec![
                attempt(0, "process-x", 0.0, Some(steps(0, 9, 1.0, 10.0))),
                attempt(1, "process-y", 8.0, Some(steps(10, 19, 12.0, 31.0))),
            ],
            events: vec![event("start", 1, 8.0), event("finished", 1, 30.0)],
        };
        let g = compute("r", &t, 100.0);
        adds_up(&g);
        let (a0, a1) = (&g.attempts[0], &g.attempts[1]);
        assert_eq!(
            (a0.ended, a0.end, a0.launch_attempt),
            (AttemptEnd::Unknown, 10.0, None)
        );
        assert_eq!((a1.start, a1.end, a1.launch), (10.0, 31.0, 1));
        assert_eq!(g.wall_s, 31.0);
    }
}

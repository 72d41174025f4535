//! Stragglers: ranks that make progress, but persistently slower than
//! the others of their node.
//!
//! [`StepTimes`] reads each rank's beat record (`step` and when that step
//! was first given) once a second, and keeps each rank's step time over
//! the last [`WINDOW`]: the steps it advanced in that time, against the
//! time they took. A rank whose step time stays more than [`SLOWER`] over
//! the median of the node's ranks for [`PERSIST`] consecutive checks is a
//! straggler, said once per attempt.
//!
//! What beats can and cannot see: in lockstep data parallelism (DDP) every
//! rank waits for the slowest in each collective, so every rank steps at
//! the slow one's pace and none stands out here; the slow one is then
//! found by where the others wait (a hang report's stacks). Ranks that do
//! not synchronise every step (local steps, gradient accumulation, data
//! preparation, a rank far ahead in a pipeline) are told apart.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime};

use crate::hang::RankBeat;

/// How far back a rank's step time looks.
pub const WINDOW: Duration = Duration::from_secs(30);
/// Over the median by more than this share: slow.
pub const SLOWER: f64 = 0.2;
/// Consecutive checks a rank must be slow before it is reported.
pub const PERSIST: u32 = 10;
/// Steps a window must hold before its rate counts.
const MIN_STEPS: i64 = 3;

#[derive(Debug, Default)]
struct Rank {
    /// (step, when it was first given), oldest first, within the window.
    seen: VecDeque<(i64, SystemTime)>,
    slow_checks: u32,
    reported: bool,
}

/// One rank's step time, as the last check measured it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepTime {
    pub global_rank: usize,
    pub seconds: f64,
}

/// A straggler, as reported.
#[derive(Clone, Debug, PartialEq)]
pub struct Straggler {
    pub global_rank: usize,
    pub seconds: f64,
    /// The median step time of the node's ranks.
    pub median: f64,
    /// The ranks the median is of.
    pub of: Vec<usize>,
}

impl Straggler {
    pub fn text(&self) -> String {
        format!(
            "rank {} is a straggler: {:.3} s a step over the last {:.0?}, {:.0}% slower than the \
             median of ranks {} ({:.3} s)",
            self.global_rank,
            self.seconds,
            WINDOW,
            (self.seconds / self.median - 1.0) * 100.0,
            crate::stacks::ranks_text(&self.of),
            self.median
        )
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "rank": self.global_rank,
            "step_time_s": self.seconds,
            "median_s": self.median,
            "of_ranks": crate::stacks::ranks_text(&self.of),
            "window_s": WINDOW.as_secs_f64(),
        })
    }
}

/// Every rank's step time on this node, for one attempt.
#[derive(Debug, Default)]
pub struct StepTimes {
    ranks: BTreeMap<usize, Rank>,
}

impl StepTimes {
    /// Takes in what the beat records say at `now`; returns every rank's
    /// step time (those with enough steps in the window) and the ranks
    /// that just became stragglers.
    pub fn observe(
        &mut self,
        beats: &[RankBeat],
        now: SystemTime,
    ) -> (Vec<StepTime>, Vec<Straggler>) {
        let mut times = Vec::new();
        for beat in beats {
            let rank = self.ranks.entry(beat.global_rank).or_default();
            if let Some(state) = beat.state
                && let (Some(step), Some(at)) = (state.step, state.step_at)
                && rank.seen.back().is_none_or(|(s, _)| *s != step)
            {
                rank.seen.push_back((step, at));
            }
            while rank.seen.len() > 2
                && rank
                    .seen
                    .front()
                    .is_some_and(|(_, at)| now.duration_since(*at).unwrap_or_default() > WINDOW)
            {
                rank.seen.pop_front();
            }
            if let (Some((s0, t0)), Some((s1, t1))) = (rank.seen.front(), rank.seen.back()) {
                let steps = s1 - s0;
                let took = t1.duration_since(*t0).unwrap_or_default().as_secs_f64();
                if steps >= MIN_STEPS && took > 0.0 {
                    times.push(StepTime {
                        global_rank: beat.global_rank,
                        seconds: took / steps as f64,
                    });
                }
            }
        }
        let mut stragglers = Vec::new();
        if times.len() >= 2 {
            let mut sorted: Vec<f64> = times.iter().map(|t| t.seconds).collect();
            sorted.sort_by(f64::total_cmp);
            let median = if sorted.len() % 2 == 1 {
                sorted[sorted.len() / 2]
            } else {
                (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2]) / 2.0
            };
            let of: Vec<usize> = times.iter().map(|t| t.global_rank).collect();
            for t in &times {
                let Some(rank) = self.ranks.get_mut(&t.global_rank) else {
                    continue;
                };
                if t.seconds > median * (1.0 + SLOWER) {
                    rank.slow_checks += 1;
                } else {
                    rank.slow_checks = 0;
                }
                if rank.slow_checks >= PERSIST && !rank.reported {
                    rank.reported = true;
                    stragglers.push(Straggler {
                        global_rank: t.global_rank,
                        seconds: t.seconds,
                        median,
                        of: of.clone(),
                    });
                }
            }
        }
        (times, stragglers)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use nix::unistd::Pid;
    use relaunch_client::beat::BeatState;

    use super::*;

    fn beat(rank: usize, step: i64, at: SystemTime) -> RankBeat {
        RankBeat {
            local_rank: rank,
            global_rank: rank,
            pid: Pid::from_raw(1),
            dir: PathBuf::new(),
            state: Some(BeatState {
                beats: 1,
                last: Some(at),
                step: Some(step),
                step_at: Some(at),
                dump: None,
            }),
            tail: vec![],
        }
    }

    #[test]
    fn a_rank_slower_for_long_enough_is_reported_once() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut times = StepTimes::default();
        let mut reported = Vec::new();
        // Ranks 0-2 take 0.1 s a step, rank 3 takes 0.15 s (50% slower).
        for second in 0..40u64 {
            let now = start + Duration::from_secs(second);
            let beats: Vec<RankBeat> = (0..4)
                .map(|r| {
                    let per_step = if r == 3 { 0.15 } else { 0.1 };
                    let step = (second as f64 / per_step) as i64;
                    beat(
                        r,
                        step,
                        start + Duration::from_secs_f64(step as f64 * per_step),
                    )
                })
                .collect();
            let (step_times, stragglers) = times.observe(&beats, now);
            if second > 5 {
                assert_eq!(step_times.len(), 4, "second {second}");
                let rank3 = step_times.iter().find(|t| t.global_rank == 3).unwrap();
                assert!((rank3.seconds - 0.15).abs() < 0.01, "{rank3:?}");
            }
            reported.extend(stragglers.into_iter().map(|s| (second, s)));
        }
        assert_eq!(reported.len(), 1, "{reported:?}");
        let (second, straggler) = &reported[0];
        assert_eq!(straggler.global_rank, 3);
        assert!(*second >= u64::from(PERSIST), "reported after {second} s");
        assert!((straggler.median - 0.1).abs() < 0.01, "{straggler:?}");
        assert!(
            straggler.text().contains("rank 3 is a straggler"),
            "{}",
            straggler.text()
        );
    }

    #[test]
    fn ranks_that_step_together_are_never_stragglers() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut times = StepTimes::default();
        for second in 0..60u64 {
            let now = start + Duration::from_secs(second);
            // 10% apart: within the tolerance.
            let beats: Vec<RankBeat> = (0..3)
                .map(|r| {
                    let per_step = 0.1 * (1.0 + 0.05 * r as f64);
                    let step = (second as f64 / per_step) as i64;
                    beat(
                        r,
                        step,
                        start + Duration::from_secs_f64(step as f64 * per_step),
                    )
                })
                .collect();
            assert!(times.observe(&beats, now).1.is_empty(), "second {second}");
        }
    }
}

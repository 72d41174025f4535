//! What goodput is computed from, read the same way by every backend: the
//! run's attempts and lifecycle events, and per attempt when its first
//! step, its last step that no later attempt redid, and its last step were
//! logged. A backend answers a few queries ([`TimelineSource`]: chunk
//! summaries grouped in SQL, the chunks' ids) and [`gather`] puts them
//! together, reading points only where a later attempt resumed.
//!
//! A step is redone the way reads hide it (`downsample.rs`): attempt `a`'s
//! steps at or past the first step of any newer attempt (by start) belong
//! to an abandoned branch. So per attempt only the chunks that reach that
//! step are decoded; the rest count by their summaries: a series' points
//! are sorted by step and logged in time order, so a chunk's last point is
//! its latest and its first point its earliest. Metrics whose step is a
//! time (`system/...`, `gpu/...`) are not steps and are left out.

use std::collections::{BTreeSet, HashMap};

use relaunch_api::names::step_is_wall_millis;

use super::StorageError;
use super::chunk::Point;
use super::downsample::ChunkSource;

/// The events that start or end an attempt, as [`TimelineSource::lifecycle`]
/// reads them.
pub const LIFECYCLE: [&str; 5] = ["start", "restart", "finished", "failed", "preempted"];

/// A run's attempts (oldest first) and lifecycle events: goodput's input.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    /// In the order they started (then by number), as reads order them.
    pub attempts: Vec<AttemptTimeline>,
    /// Events of the [`LIFECYCLE`] kinds, in the order they were stored.
    pub events: Vec<Lifecycle>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AttemptTimeline {
    pub attempt: u32,
    /// The token that names it (`LAUNCH:ATTEMPT` under `relaunch run`).
    pub token: String,
    /// When its earliest process opened the run.
    pub started: f64,
    /// None when it logged no step.
    pub steps: Option<StepTimes>,
}

/// When an attempt's steps were logged, over every rank and key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepTimes {
    pub first_step: i64,
    pub last_step: i64,
    /// Its earliest point.
    pub first_wall: f64,
    /// Its latest point.
    pub last_wall: f64,
    /// The step a newer attempt resumed from, when that is at or before
    /// this attempt's last step: the steps from there on were redone.
    pub redone_from: Option<i64>,
    /// The latest point before `redone_from` (`last_wall` when nothing
    /// was redone; None when every step was).
    pub kept_wall: Option<f64>,
    /// How many distinct steps at or past `redone_from` it logged.
    pub steps_redone: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Lifecycle {
    pub kind: String,
    pub attempt: u32,
    pub wall: f64,
}

/// An attempt as the `attempts` table has it.
#[derive(Clone, Debug, PartialEq)]
pub struct AttemptRow {
    pub attempt: u32,
    pub token: String,
    pub started: f64,
}

/// One attempt's chunks of the step keys, summarized.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    pub attempt: u32,
    /// The lowest first step of its chunks.
    pub first_step: i64,
    /// The highest last step of its chunks.
    pub last_step: i64,
    /// The latest last wall of its chunks.
    pub last_wall: f64,
}

/// The queries [`gather`] needs of a backend, on one read snapshot of the
/// run. Chunks' points are read through [`ChunkSource`].
pub trait TimelineSource {
    /// The run's attempts, ordered by when they started, then number.
    fn attempts(&mut self) -> Result<Vec<AttemptRow>, StorageError>;

    /// The run's events of `kinds`, in id order.
    fn lifecycle(&mut self, kinds: &[&str]) -> Result<Vec<Lifecycle>, StorageError>;

    /// The run's metric keys: their ids and names.
    fn keys(&mut self) -> Result<Vec<(i64, String)>, StorageError>;

    /// Per attempt that logged any of `keys`, its chunks of them
    /// summarized (one SQL aggregate).
    fn spans(&mut self, keys: &[i64]) -> Result<Vec<Span>, StorageError>;

    /// The id of each series' (key of `keys`, rank, attempt) chunk of
    /// lowest first step, with its attempt.
    fn first_chunks(&mut self, keys: &[i64]) -> Result<Vec<(u32, i64)>, StorageError>;

    /// The latest last wall of `attempt`'s chunks of `keys` whose last step
    /// is below `before`.
    fn last_wall_before(
        &mut self,
        keys: &[i64],
        attempt: u32,
        before: i64,
    ) -> Result<Option<f64>, StorageError>;

    /// The ids of `attempt`'s chunks of `keys` whose last step is `from`
    /// or above.
    fn chunks_from(
        &mut self,
        keys: &[i64],
        attempt: u32,
        from: i64,
    ) -> Result<Vec<i64>, StorageError>;

    /// Reads chunks' points.
    fn chunks(&mut self) -> &mut dyn ChunkSource;
}

/// Chunks decoded at once when reading what a later attempt redid.
const DECODE_BATCH: usize = 64;

/// The run's timeline from `source`.
pub fn gather(source: &mut dyn TimelineSource) -> Result<Timeline, StorageError> {
    let rows = source.attempts()?;
    let events = source.lifecycle(&LIFECYCLE)?;
    let keys: Vec<i64> = source
        .keys()?
        .into_iter()
        .filter(|(_, name)| !step_is_wall_millis(name))
        .map(|(id, _)| id)
        .collect();
    let mut steps: HashMap<u32, StepTimes> = HashMap::new();
    if !keys.is_empty() {
        let spans = source.spans(&keys)?;
        let firsts = source.first_chunks(&keys)?;
        let wanted: Vec<(i64, usize)> = firsts.iter().map(|&(_, id)| (id, 0)).collect();
        let mut first_points = source.chunks().block_points_many(&wanted)?;
        let mut first_wall: HashMap<u32, f64> = HashMap::new();
        for (attempt, id) in firsts {
            let Some(p) = first_points
                .remove(&(id, 0))
                .and_then(|p| p.first().copied())
            else {
                continue;
            };
            let at = first_wall.entry(attempt).or_insert(p.wall);
            *at = at.min(p.wall);
        }
        let order: HashMap<u32, usize> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| (r.attempt, i))
            .collect();
        let place = |attempt: u32| order.get(&attempt).copied().unwrap_or(usize::MAX);
        for span in &spans {
            // The first step of every newer attempt that logged one.
            let redone_from = spans
                .iter()
                .filter(|other| place(other.attempt) > place(span.attempt))
                .map(|other| other.first_step)
                .min()
                .filter(|&from| from <= span.last_step);
            let first_wall = first_wall
                .get(&span.attempt)
                .copied()
                .unwrap_or(span.last_wall)
                .min(span.last_wall);
            let mut times = StepTimes {
                first_step: span.first_step,
                last_step: span.last_step,
                first_wall,
                last_wall: span.last_wall,
                redone_from,
                kept_wall: Some(span.last_wall),
                steps_redone: 0,
            };
            if let Some(from) = redone_from {
                let (kept, redone) = split_at(source, &keys, span.attempt, from)?;
                times.kept_wall = kept;
                times.steps_redone = redone;
            }
            steps.insert(span.attempt, times);
        }
    }
    let attempts = rows
        .into_iter()
        .map(|r| AttemptTimeline {
            steps: steps.get(&r.attempt).copied(),
            attempt: r.attempt,
            token: r.token,
            started: r.started,
        })
        .collect();
    Ok(Timeline { attempts, events })
}

/// `attempt`'s latest point before step `from`, and how many distinct
/// steps it logged from there on.
fn split_at(
    source: &mut dyn TimelineSource,
    keys: &[i64],
    attempt: u32,
    from: i64,
) -> Result<(Option<f64>, u64), StorageError> {
    let mut kept = source.last_wall_before(keys, attempt, from)?;
    let mut redone: BTreeSet<i64> = BTreeSet::new();
    let ids = source.chunks_from(keys, attempt, from)?;
    for batch in ids.chunks(DECODE_BATCH) {
        let points = source.chunks().points_many(batch)?;
        for p in points.values().flatten() {
            visit(p, from, &mut kept, &mut redone);
        }
    }
    Ok((kept, redone.len() as u64))
}

fn visit(p: &Point, from: i64, kept: &mut Option<f64>, redone: &mut BTreeSet<i64>) {
    if p.step < from {
        *kept = Some(kept.map_or(p.wall, |k| k.max(p.wall)));
    } else {
        redone.insert(p.step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::chunk::Summary;

    /// A run's chunks in memory: (key id, rank, attempt, points).
    struct Memory {
        attempts: Vec<AttemptRow>,
        keys: Vec<(i64, String)>,
        chunks: Vec<(i64, u32, u32, Vec<Point>)>,
    }

    impl Memory {
        fn of<'a>(&'a self, keys: &'a [i64]) -> impl Iterator<Item = (i64, u32, &'a [Point])> {
            self.chunks
                .iter()
                .enumerate()
                .filter(move |(_, (key, ..))| keys.contains(key))
                .map(|(id, (_, _, attempt, points))| (id as i64, *attempt, points.as_slice()))
        }
    }

    impl ChunkSource for Memory {
        fn blocks(&mut self, _: i64) -> Result<Vec<Summary>, StorageError> {
            unreachable!("goodput reads no block summaries")
        }

        fn points(&mut self, id: i64) -> Result<Vec<Point>, StorageError> {
            Ok(self.chunks[id as usize].3.clone())
        }
    }

    impl TimelineSource for Memory {
        fn attempts(&mut self) -> Result<Vec<AttemptRow>, StorageError> {
            Ok(self.attempts.clone())
        }

        fn lifecycle(&mut self, _: &[&str]) -> Result<Vec<Lifecycle>, StorageError> {
            Ok(Vec::new())
        }

        fn keys(&mut self) -> Result<Vec<(i64, String)>, StorageError> {
            Ok(self.keys.clone())
        }

        fn spans(&mut self, keys: &[i64]) -> Result<Vec<Span>, StorageError> {
            let mut spans: Vec<Span> = Vec::new();
            for (_, attempt, points) in self.of(keys) {
                let s = Summary::of(points).unwrap();
                match spans.iter_mut().find(|x| x.attempt == attempt) {
                    Some(x) => {
                        x.first_step = x.first_step.min(s.first_step);
                        x.last_step = x.last_step.max(s.last_step);
                        x.last_wall = x.last_wall.max(s.last_wall);
                    }
                    None => spans.push(Span {
                        attempt,
                        first_step: s.first_step,
                        last_step: s.last_step,
                        last_wall: s.last_wall,
                    }),
                }
            }
            Ok(spans)
        }

        fn first_chunks(&mut self, keys: &[i64]) -> Result<Vec<(u32, i64)>, StorageError> {
            let mut first: HashMap<(i64, u32, u32), (i64, i64)> = HashMap::new();
            for (id, (key, rank, attempt, points)) in self.chunks.iter().enumerate() {
                if !keys.contains(key) {
                    continue;
                }
                let step = points[0].step;
                let e = first
                    .entry((*key, *rank, *attempt))
                    .or_insert((step, id as i64));
                if step < e.0 {
                    *e = (step, id as i64);
                }
            }
            Ok(first
                .into_iter()
                .map(|((_, _, a), (_, id))| (a, id))
                .collect())
        }

        fn last_wall_before(
            &mut self,
            keys: &[i64],
            attempt: u32,
            before: i64,
        ) -> Result<Option<f64>, StorageError> {
            Ok(self
                .of(keys)
                .filter(|(_, a, p)| *a == attempt && p.last().unwrap().step < before)
                .map(|(_, _, p)| p.last().unwrap().wall)
                .reduce(f64::max))
        }

        fn chunks_from(
            &mut self,
            keys: &[i64],
            attempt: u32,
            from: i64,
        ) -> Result<Vec<i64>, StorageError> {
            Ok(self
                .of(keys)
                .filter(|(_, a, p)| *a == attempt && p.last().unwrap().step >= from)
                .map(|(id, ..)| id)
                .collect())
        }

        fn chunks(&mut self) -> &mut dyn ChunkSource {
            self
        }
    }

    fn row(attempt: u32, started: f64) -> AttemptRow {
        AttemptRow {
            attempt,
            token: format!("L:{attempt}"),
            started,
        }
    }

    /// Points of steps `steps` at wall `base + step`.
    fn points(steps: std::ops::Range<i64>, base: f64) -> Vec<Point> {
        steps
            .map(|step| Point {
                step,
                value: 0.0,
                wall: base + step as f64,
            })
            .collect()
    }

    #[test]
    fn the_earliest_rank_starts_an_attempt_and_a_resume_splits_it() {
        // Attempt 0: rank 1 logs step 0 a second before rank 0 does; both
        // reach step 9, in two chunks each. Attempt 1 resumes at step 6.
        let mut source = Memory {
            attempts: vec![row(0, 0.0), row(1, 50.0)],
            keys: vec![(1, "loss".into()), (2, "system/cpu_percent".into())],
            chunks: vec![
                (1, 0, 0, points(0..5, 10.0)),
                (1, 0, 0, points(5..10, 10.0)),
                (1, 1, 0, points(0..4, 9.0)),
                (1, 1, 0, points(4..10, 9.0)),
                (1, 0, 1, points(6..20, 60.0)),
                // A system metric's "step" is a time: never a step.
                (2, 0, 0, points(1_000..1_002, 0.0)),
            ],
        };
        let t = gather(&mut source).unwrap();
        let a0 = t.attempts[0].steps.unwrap();
        assert_eq!((a0.first_step, a0.last_step), (0, 9));
        assert_eq!(a0.first_wall, 9.0, "rank 1's step 0 came first");
        assert_eq!(a0.last_wall, 19.0);
        assert_eq!(a0.redone_from, Some(6));
        // Step 5, rank 0's (wall 15), is the latest kept.
        assert_eq!(a0.kept_wall, Some(15.0));
        assert_eq!(a0.steps_redone, 4, "steps 6 to 9");
        let a1 = t.attempts[1].steps.unwrap();
        assert_eq!(
            (a1.redone_from, a1.kept_wall, a1.steps_redone),
            (None, Some(79.0), 0)
        );
    }

    #[test]
    fn a_resume_past_every_step_redoes_nothing_and_one_before_every_step_redoes_all() {
        let mut source = Memory {
            attempts: vec![row(0, 0.0), row(1, 20.0), row(2, 40.0)],
            keys: vec![(1, "loss".into())],
            chunks: vec![
                (1, 0, 0, points(10..15, 0.0)),
                // Attempt 1 went back to step 3 (an older checkpoint).
                (1, 0, 1, points(3..8, 20.0)),
                // Attempt 2 starts after everything attempt 1 logged.
                (1, 0, 2, points(8..9, 40.0)),
            ],
        };
        let t = gather(&mut source).unwrap();
        let a0 = t.attempts[0].steps.unwrap();
        assert_eq!(
            (a0.redone_from, a0.kept_wall, a0.steps_redone),
            (Some(3), None, 5)
        );
        let a1 = t.attempts[1].steps.unwrap();
        assert_eq!(
            (a1.redone_from, a1.kept_wall, a1.steps_redone),
            (None, Some(27.0), 0)
        );
    }

    #[test]
    fn attempts_without_steps_and_runs_without_metrics() {
        let mut source = Memory {
            attempts: vec![row(0, 0.0), row(1, 5.0)],
            keys: vec![(7, "gpu/0/util".into())],
            chunks: vec![(7, 0, 0, points(0..3, 0.0))],
        };
        let t = gather(&mut source).unwrap();
        assert_eq!(t.attempts.len(), 2);
        assert!(t.attempts.iter().all(|a| a.steps.is_none()));
    }
}

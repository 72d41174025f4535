//! Assembling a series from chunks, for any backend: which attempt's values
//! a step shows, and reduction to at most N buckets that keep each bucket's
//! min, max and last value.
//!
//! Non-finite values: a bucket's value is its last point's, NaN included
//! (a chart shows a gap there); its min and max skip NaN (one NaN does not
//! poison a band) and are NaN only when every value in the bucket is; the
//! infinities are values like any other and count in min and max.
//!
//! A resumed attempt replaces what earlier attempts logged from the step it
//! resumed at: attempt `a`'s values at steps at or past the first step of
//! any newer attempt are hidden (they belong to an abandoned branch), unless
//! the query asks for attempt `a` alone. "Newer" is by when the attempt
//! started ([`ChunkMeta::order`]), not by its number: numbers are given in
//! the order attempts reach the server, and a dead attempt's spool may
//! reach it after the next attempt did.

use std::collections::{BTreeMap, HashMap};

use relaunch_api::{SeriesPoint, SeriesQuery};

use super::StorageError;
use super::chunk::{BLOCK, Point, Summary};

/// What a backend knows of a chunk without reading its points.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkMeta {
    pub id: i64,
    pub attempt: u32,
    /// The attempt's place when attempts are sorted by start: larger is newer.
    pub order: u32,
    pub summary: Summary,
}

/// Reads a chunk's block summaries and points on demand.
pub trait ChunkSource {
    fn blocks(&mut self, id: i64) -> Result<Vec<Summary>, StorageError>;
    fn points(&mut self, id: i64) -> Result<Vec<Point>, StorageError>;

    /// The points of block `index` of chunk `id` (a read that straddles a
    /// bucket boundary needs only those). A backend that can read part of
    /// a chunk overrides this; by default the whole chunk is read.
    fn block_points(&mut self, id: i64, index: usize) -> Result<Vec<Point>, StorageError> {
        let points = self.points(id)?;
        Ok(points
            .get(index * BLOCK..((index + 1) * BLOCK).min(points.len()))
            .unwrap_or_default()
            .to_vec())
    }

    /// [`points`](Self::points) of several chunks. A backend for which each
    /// read is a round trip (a database server) overrides these `_many`
    /// reads with one query each; by default they read one by one.
    fn points_many(&mut self, ids: &[i64]) -> Result<HashMap<i64, Vec<Point>>, StorageError> {
        ids.iter().map(|&id| Ok((id, self.points(id)?))).collect()
    }

    /// [`blocks`](Self::blocks) of several chunks.
    fn blocks_many(&mut self, ids: &[i64]) -> Result<HashMap<i64, Vec<Summary>>, StorageError> {
        ids.iter().map(|&id| Ok((id, self.blocks(id)?))).collect()
    }

    /// [`block_points`](Self::block_points) of several (chunk, block) pairs.
    fn block_points_many(
        &mut self,
        wanted: &[(i64, usize)],
    ) -> Result<HashMap<(i64, usize), Vec<Point>>, StorageError> {
        wanted
            .iter()
            .map(|&(id, index)| Ok(((id, index), self.block_points(id, index)?)))
            .collect()
    }
}

/// What a `_many` read left out: a chunk the caller knows is there.
fn fetched<K, V>(map: &mut HashMap<K, V>, key: K) -> Result<V, StorageError>
where
    K: std::fmt::Debug + std::hash::Hash + Eq,
{
    map.remove(&key)
        .ok_or_else(|| StorageError::Corrupt(format!("chunk {key:?} vanished while it was read")))
}

/// One point of a full (not downsampled) read.
fn as_series_point(p: Point, attempt: u32) -> SeriesPoint {
    SeriesPoint {
        step: p.step,
        wall: p.wall,
        value: p.value,
        min: p.value,
        max: p.value,
        count: 1,
        attempt,
    }
}

/// The series' points in the query's range: all of them when they fit in
/// `query.buckets`, else one per non-empty bucket. Returns the number of
/// points in the range before reduction, too.
pub fn assemble(
    chunks: &[ChunkMeta],
    query: &SeriesQuery,
    source: &mut dyn ChunkSource,
) -> Result<(u64, Vec<SeriesPoint>), StorageError> {
    let chunks: Vec<&ChunkMeta> = chunks
        .iter()
        .filter(|c| query.attempt.is_none_or(|a| a == c.attempt))
        .collect();
    let cuts = if query.attempt.is_some() {
        HashMap::new()
    } else {
        cuts(&chunks)
    };
    // Whether `step` of `attempt` comes before the first step of a newer
    // attempt (always, when there is none: every i64 is a step, i64::MAX
    // included, so no step value stands for "no limit").
    let before_cut = |attempt: u32, step: i64| {
        cuts.get(&attempt)
            .copied()
            .flatten()
            .is_none_or(|cut| step < cut)
    };
    // Inclusive bounds: the full i64 range when absent.
    let lo = query.min_step.unwrap_or(i64::MIN);
    let hi = query.max_step.unwrap_or(i64::MAX);
    let visible = |attempt: u32, step: i64| step >= lo && step <= hi && before_cut(attempt, step);

    // Whole chunks, and the visible points of partly visible ones.
    let mut whole: Vec<&ChunkMeta> = Vec::new();
    let mut cut: Vec<&ChunkMeta> = Vec::new();
    let mut total = 0u64;
    for c in &chunks {
        let s = c.summary;
        if s.last_step < lo || s.first_step > hi || !before_cut(c.attempt, s.first_step) {
            continue;
        }
        if s.first_step >= lo && s.last_step <= hi && before_cut(c.attempt, s.last_step) {
            total += s.count;
            whole.push(c);
        } else {
            cut.push(c);
        }
    }
    let mut cut_points = source.points_many(&cut.iter().map(|c| c.id).collect::<Vec<_>>())?;
    let mut partial: Vec<(u32, i64, Vec<Point>)> = Vec::with_capacity(cut.len());
    for c in cut {
        let points: Vec<Point> = fetched(&mut cut_points, c.id)?
            .into_iter()
            .filter(|p| visible(c.attempt, p.step))
            .collect();
        total += points.len() as u64;
        partial.push((c.attempt, c.id, points));
    }

    let buckets = u64::from(query.buckets.max(1));
    if total <= buckets {
        let mut points = source.points_many(&whole.iter().map(|c| c.id).collect::<Vec<_>>())?;
        let mut runs: Vec<(u32, i64, Vec<Point>)> = Vec::with_capacity(whole.len() + partial.len());
        for c in whole {
            runs.push((c.attempt, c.id, fetched(&mut points, c.id)?));
        }
        runs.extend(partial);
        runs.retain(|(_, _, points)| !points.is_empty());
        runs.sort_by_key(|(_, id, points)| (points[0].step, *id));
        // The usual series (one attempt, or attempts that do not overlap):
        // runs of increasing steps, each after the last. Its points are
        // the answer as they are, without a copy to sort (millions of
        // points: the copy is most of a full read's time).
        let ordered = runs
            .windows(2)
            .all(|w| w[0].2.last().map(|p| p.step) < w[1].2.first().map(|p| p.step))
            && runs
                .iter()
                .all(|(_, _, points)| points.windows(2).all(|w| w[0].step < w[1].step));
        if ordered {
            let mut out: Vec<SeriesPoint> = Vec::with_capacity(total as usize);
            for (attempt, _, points) in runs {
                out.extend(points.into_iter().map(|p| as_series_point(p, attempt)));
            }
            return Ok((out.len() as u64, out));
        }
        let mut all: Vec<(i64, i64, u32, Point)> = Vec::with_capacity(total as usize);
        for (attempt, id, points) in runs {
            all.extend(points.into_iter().map(|p| (p.step, id, attempt, p)));
        }
        // One value per step: of equal steps, the newest chunk's.
        all.sort_by_key(|(step, id, _, _)| (*step, *id));
        let mut out: Vec<SeriesPoint> = Vec::with_capacity(all.len());
        for (_, _, attempt, p) in all {
            let point = as_series_point(p, attempt);
            match out.last_mut() {
                Some(last) if last.step == p.step => *last = point,
                _ => out.push(point),
            }
        }
        let total = out.len() as u64;
        return Ok((total, out));
    }

    // The range actually covered, so buckets span data, not the whole i64.
    let covered_lo = whole
        .iter()
        .map(|c| c.summary.first_step)
        .chain(
            partial
                .iter()
                .filter_map(|(_, _, p)| p.first().map(|p| p.step)),
        )
        .min()
        .unwrap_or(0);
    let covered_hi = whole
        .iter()
        .map(|c| c.summary.last_step)
        .chain(
            partial
                .iter()
                .filter_map(|(_, _, p)| p.last().map(|p| p.step)),
        )
        .max()
        .unwrap_or(0);
    let span = (i128::from(covered_hi) - i128::from(covered_lo) + 1).max(1) as u128;
    let width = span.div_ceil(u128::from(buckets)).max(1);
    let bucket = |step: i64| ((i128::from(step) - i128::from(covered_lo)) as u128 / width) as u64;

    // Chunks within one bucket count by their summary; the others by their
    // blocks' summaries, and blocks that span buckets by their points. Each
    // of those two reads is one request for all the chunks that need it.
    let spans = |s: &Summary| bucket(s.first_step) != bucket(s.last_step);
    let spanning: Vec<i64> = whole
        .iter()
        .filter(|c| spans(&c.summary))
        .map(|c| c.id)
        .collect();
    let blocks_of = source.blocks_many(&spanning)?;
    let mut wanted: Vec<(i64, usize)> = Vec::new();
    for id in &spanning {
        for (i, b) in blocks_of.get(id).into_iter().flatten().enumerate() {
            if spans(b) {
                wanted.push((*id, i));
            }
        }
    }
    let mut block_points = source.block_points_many(&wanted)?;
    let mut acc: BTreeMap<u64, Bucket> = BTreeMap::new();
    for c in whole {
        let s = c.summary;
        if !spans(&s) {
            acc.entry(bucket(s.first_step))
                .or_default()
                .merge(&s, c.attempt);
            continue;
        }
        let blocks = blocks_of.get(&c.id).map_or(&[][..], Vec::as_slice);
        for (i, b) in blocks.iter().enumerate() {
            if !spans(b) {
                acc.entry(bucket(b.first_step))
                    .or_default()
                    .merge(b, c.attempt);
                continue;
            }
            let block = fetched(&mut block_points, (c.id, i))?;
            if block.is_empty() {
                return Err(StorageError::Corrupt(format!(
                    "chunk {} has fewer points than its blocks",
                    c.id
                )));
            }
            for p in &block {
                acc.entry(bucket(p.step)).or_default().add(p, c.attempt);
            }
        }
    }
    for (attempt, _, points) in &partial {
        for p in points {
            acc.entry(bucket(p.step)).or_default().add(p, *attempt);
        }
    }
    Ok((total, acc.into_values().filter_map(Bucket::point).collect()))
}

/// For each attempt, the first step of any newer attempt: where its values
/// stop counting (`None` for the newest: nowhere).
fn cuts(chunks: &[&ChunkMeta]) -> HashMap<u32, Option<i64>> {
    // (order, attempt) -> the attempt's first step.
    let mut starts: BTreeMap<(u32, u32), i64> = BTreeMap::new();
    for c in chunks {
        let start = starts.entry((c.order, c.attempt)).or_insert(i64::MAX);
        *start = (*start).min(c.summary.first_step);
    }
    let mut cuts = HashMap::new();
    let mut newer_min: Option<i64> = None;
    for (&(_, attempt), &start) in starts.iter().rev() {
        cuts.insert(attempt, newer_min);
        newer_min = Some(newer_min.map_or(start, |m| m.min(start)));
    }
    cuts
}

#[derive(Default)]
struct Bucket {
    count: u64,
    min: f64,
    max: f64,
    /// (step, value, wall, attempt) of the newest point.
    last: Option<(i64, f64, f64, u32)>,
}

impl Bucket {
    fn merge(&mut self, s: &Summary, attempt: u32) {
        self.absorb(
            s.count,
            s.min,
            s.max,
            (s.last_step, s.last_value, s.last_wall, attempt),
        );
    }

    fn add(&mut self, p: &Point, attempt: u32) {
        self.absorb(1, p.value, p.value, (p.step, p.value, p.wall, attempt));
    }

    fn absorb(&mut self, count: u64, min: f64, max: f64, last: (i64, f64, f64, u32)) {
        if self.count == 0 {
            self.min = min;
            self.max = max;
        } else {
            self.min = self.min.min(min);
            self.max = self.max.max(max);
        }
        self.count += count;
        if self.last.is_none_or(|(step, ..)| last.0 >= step) {
            self.last = Some(last);
        }
    }

    fn point(self) -> Option<SeriesPoint> {
        let (step, value, wall, attempt) = self.last?;
        Some(SeriesPoint {
            step,
            wall,
            value,
            min: self.min,
            max: self.max,
            count: self.count,
            attempt,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::chunk::{decode_blocks, encode_blocks};

    /// Chunks kept in memory.
    struct Memory(HashMap<i64, Vec<Point>>);

    impl ChunkSource for Memory {
        fn blocks(&mut self, id: i64) -> Result<Vec<Summary>, StorageError> {
            Ok(decode_blocks(&encode_blocks(&self.0[&id])).unwrap())
        }
        fn points(&mut self, id: i64) -> Result<Vec<Point>, StorageError> {
            Ok(self.0[&id].clone())
        }
    }

    fn series(parts: &[(u32, std::ops::Range<i64>)]) -> (Vec<ChunkMeta>, Memory) {
        let mut metas = Vec::new();
        let mut memory = HashMap::new();
        let mut id = 0;
        for (attempt, steps) in parts {
            let points: Vec<Point> = steps
                .clone()
                .map(|s| Point {
                    step: s,
                    value: s as f64 + f64::from(*attempt) * 0.5,
                    wall: 0.0,
                })
                .collect();
            for chunk in points.chunks(super::super::chunk::CHUNK_MAX) {
                id += 1;
                metas.push(ChunkMeta {
                    id,
                    attempt: *attempt,
                    order: *attempt,
                    summary: Summary::of(chunk).unwrap(),
                });
                memory.insert(id, chunk.to_vec());
            }
        }
        (metas, Memory(memory))
    }

    fn query(buckets: u32) -> SeriesQuery {
        SeriesQuery {
            key: "k".into(),
            rank: None,
            buckets,
            min_step: None,
            max_step: None,
            attempt: None,
        }
    }

    #[test]
    fn a_resumed_attempt_hides_the_old_branch() {
        // Attempt 0 ran to step 99; attempt 1 resumed at 60 and ran to 149.
        let (chunks, mut src) = series(&[(0, 0..100), (1, 60..150)]);
        let (total, points) = assemble(&chunks, &query(1000), &mut src).unwrap();
        assert_eq!(total, 150);
        assert_eq!(points.len(), 150);
        assert!(points[..60].iter().all(|p| p.attempt == 0));
        assert!(
            points[60..]
                .iter()
                .all(|p| p.attempt == 1 && p.value == p.step as f64 + 0.5)
        );
        // Asked for attempt 0 alone, its whole branch is there.
        let q = SeriesQuery {
            attempt: Some(0),
            ..query(1000)
        };
        let (total, points) = assemble(&chunks, &q, &mut src).unwrap();
        assert_eq!((total, points.last().unwrap().step), (100, 99));
    }

    #[test]
    fn the_attempt_that_started_later_wins_whatever_its_number() {
        // Attempt 1 reached the server first but started first too: it is
        // the dead process whose spool was shipped by attempt 0.
        let (mut chunks, mut src) = series(&[(1, 0..100), (0, 60..150)]);
        for c in &mut chunks {
            c.order = if c.attempt == 1 { 0 } else { 1 };
        }
        let (_, points) = assemble(&chunks, &query(1000), &mut src).unwrap();
        assert_eq!(points.len(), 150);
        assert!(points[..60].iter().all(|p| p.attempt == 1));
        assert!(points[60..].iter().all(|p| p.attempt == 0));
    }

    #[test]
    fn downsampling_keeps_extremes_and_counts() {
        let (chunks, mut src) = series(&[(0, 0..1_000_000)]);
        let (total, points) = assemble(&chunks, &query(1000), &mut src).unwrap();
        assert_eq!(total, 1_000_000);
        assert!(points.len() <= 1000, "{}", points.len());
        assert_eq!(points.iter().map(|p| p.count).sum::<u64>(), 1_000_000);
        assert_eq!(points[0].min, 0.0);
        assert_eq!(points.last().unwrap().max, 999_999.0);
        assert_eq!(points.last().unwrap().step, 999_999);
        // Every bucket's max is its last value here (a rising line).
        assert!(points.iter().all(|p| p.max == p.value));
    }

    #[test]
    fn ranges_cut_chunks() {
        let (chunks, mut src) = series(&[(0, 0..10_000)]);
        let q = SeriesQuery {
            min_step: Some(100),
            max_step: Some(199),
            ..query(1000)
        };
        let (total, points) = assemble(&chunks, &q, &mut src).unwrap();
        assert_eq!(
            (
                total,
                points.first().unwrap().step,
                points.last().unwrap().step
            ),
            (100, 100, 199)
        );
    }
}

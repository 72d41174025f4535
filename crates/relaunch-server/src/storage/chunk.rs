//! How metric points are packed: a chunk holds up to [`CHUNK_MAX`] points of
//! one series (run, key, rank, attempt), sorted by step, with a summary of
//! every [`BLOCK`] points, so that a downsampled read of millions of points
//! mostly merges summaries and decodes only the blocks that straddle a
//! bucket boundary.

/// Points summarized together inside a chunk.
pub const BLOCK: usize = 64;
/// Most points in one chunk.
pub const CHUNK_MAX: usize = 4096;

pub const POINT_BYTES: usize = 24;
const SUMMARY_BYTES: usize = 56;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub step: i64,
    pub value: f64,
    pub wall: f64,
}

/// The first and last step, count, extremes and last value of some points.
/// The extremes ignore NaN (NaN when every value is); the last value may be
/// NaN; the infinities count as values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub first_step: i64,
    pub last_step: i64,
    pub count: u64,
    pub min: f64,
    pub max: f64,
    pub last_value: f64,
    pub last_wall: f64,
}

impl Summary {
    pub fn of(points: &[Point]) -> Option<Self> {
        let first = points.first()?;
        let last = points.last()?;
        // `f64::min`/`max` skip NaN: the extremes of the values that are not
        // NaN, and NaN only when all of them are.
        let (min, max) = points.iter().fold((f64::NAN, f64::NAN), |(lo, hi), p| {
            (lo.min(p.value), hi.max(p.value))
        });
        Some(Self {
            first_step: first.step,
            last_step: last.step,
            count: points.len() as u64,
            min,
            max,
            last_value: last.value,
            last_wall: last.wall,
        })
    }
}

/// Sorts points by step; of points with the same step, the one that came
/// last (the newest log call) stays.
pub fn sort_dedup(points: &mut Vec<Point>) {
    // Stable sort keeps arrival order among equal steps.
    points.sort_by_key(|p| p.step);
    let mut out: Vec<Point> = Vec::with_capacity(points.len());
    for p in points.drain(..) {
        match out.last_mut() {
            Some(last) if last.step == p.step => *last = p,
            _ => out.push(p),
        }
    }
    *points = out;
}

pub fn encode_points(points: &[Point]) -> Vec<u8> {
    let mut out = Vec::with_capacity(points.len() * POINT_BYTES);
    for p in points {
        out.extend_from_slice(&p.step.to_le_bytes());
        out.extend_from_slice(&p.value.to_le_bytes());
        out.extend_from_slice(&p.wall.to_le_bytes());
    }
    out
}

pub fn decode_points(bytes: &[u8]) -> Result<Vec<Point>, String> {
    if !bytes.len().is_multiple_of(POINT_BYTES) {
        return Err(format!(
            "a chunk of {} bytes is not whole points",
            bytes.len()
        ));
    }
    Ok(bytes
        .chunks_exact(POINT_BYTES)
        .map(|c| Point {
            step: i64::from_le_bytes(word(&c[0..8])),
            value: f64::from_le_bytes(word(&c[8..16])),
            wall: f64::from_le_bytes(word(&c[16..24])),
        })
        .collect())
}

/// The summaries of each [`BLOCK`] of `points`.
pub fn encode_blocks(points: &[Point]) -> Vec<u8> {
    let mut out = Vec::with_capacity(points.len().div_ceil(BLOCK) * SUMMARY_BYTES);
    for block in points.chunks(BLOCK) {
        if let Some(s) = Summary::of(block) {
            out.extend_from_slice(&s.first_step.to_le_bytes());
            out.extend_from_slice(&s.last_step.to_le_bytes());
            out.extend_from_slice(&s.count.to_le_bytes());
            out.extend_from_slice(&s.min.to_le_bytes());
            out.extend_from_slice(&s.max.to_le_bytes());
            out.extend_from_slice(&s.last_value.to_le_bytes());
            out.extend_from_slice(&s.last_wall.to_le_bytes());
        }
    }
    out
}

pub fn decode_blocks(bytes: &[u8]) -> Result<Vec<Summary>, String> {
    if !bytes.len().is_multiple_of(SUMMARY_BYTES) {
        return Err(format!(
            "block summaries of {} bytes are not whole",
            bytes.len()
        ));
    }
    Ok(bytes
        .chunks_exact(SUMMARY_BYTES)
        .map(|c| Summary {
            first_step: i64::from_le_bytes(word(&c[0..8])),
            last_step: i64::from_le_bytes(word(&c[8..16])),
            count: u64::from_le_bytes(word(&c[16..24])),
            min: f64::from_le_bytes(word(&c[24..32])),
            max: f64::from_le_bytes(word(&c[32..40])),
            last_value: f64::from_le_bytes(word(&c[40..48])),
            last_wall: f64::from_le_bytes(word(&c[48..56])),
        })
        .collect())
}

fn word(bytes: &[u8]) -> [u8; 8] {
    let mut w = [0u8; 8];
    w.copy_from_slice(bytes);
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(step: i64, value: f64) -> Point {
        Point {
            step,
            value,
            wall: step as f64,
        }
    }

    #[test]
    fn points_and_blocks_roundtrip() {
        let points: Vec<Point> = (0..200).map(|i| p(i * 2, (i as f64).sin())).collect();
        assert_eq!(decode_points(&encode_points(&points)).unwrap(), points);
        let blocks = decode_blocks(&encode_blocks(&points)).unwrap();
        assert_eq!(blocks.len(), 4);
        assert_eq!(blocks[0], Summary::of(&points[..64]).unwrap());
        assert_eq!(blocks[3].count, 8);
        assert!(decode_points(&[0; 5]).is_err());
    }

    #[test]
    fn extremes_skip_nan_and_keep_the_infinities() {
        let s = Summary::of(&[p(0, f64::NAN), p(1, 2.0), p(2, f64::NAN)]).unwrap();
        assert_eq!((s.min, s.max, s.count), (2.0, 2.0, 3));
        assert!(s.last_value.is_nan());
        let s = Summary::of(&[p(0, f64::NAN), p(1, f64::NAN)]).unwrap();
        assert!(s.min.is_nan() && s.max.is_nan());
        let s = Summary::of(&[p(0, f64::NEG_INFINITY), p(1, 1.0), p(2, f64::INFINITY)]).unwrap();
        assert_eq!((s.min, s.max), (f64::NEG_INFINITY, f64::INFINITY));
    }

    #[test]
    fn the_newest_value_of_a_step_stays() {
        let mut points = vec![p(3, 1.0), p(1, 2.0), p(3, 9.0), p(2, 0.0)];
        sort_dedup(&mut points);
        assert_eq!(points, [p(1, 2.0), p(2, 0.0), p(3, 9.0)]);
    }
}

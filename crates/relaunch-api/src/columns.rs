//! The column format of `GET /api/v1/runs/{id}/history`
//! (`application/x-relaunch-columns`): every point of several series, each
//! series as four arrays a reader maps without parsing (numpy's
//! `frombuffer`), little-endian.
//!
//! ```text
//! "RLC1"  u32 series
//! series = key str16 (u16 length + UTF-8), rank u32, n u64, zero padding to a multiple of 8,
//!          step i64 × n, value f64 × n, wall f64 × n, attempt u32 × n, zero padding to 8
//! ```
//!
//! Offsets count from the start of the body, so every array of 8-byte
//! values starts on an 8-byte boundary. Values are stored as the client
//! logged them: NaN and the infinities included.

use crate::types::SeriesPoint;

pub const MAGIC: &[u8; 4] = b"RLC1";
pub const CONTENT_TYPE: &str = "application/x-relaunch-columns";

/// One series of a history, as decoded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Columns {
    pub key: String,
    pub rank: u32,
    pub step: Vec<i64>,
    pub value: Vec<f64>,
    pub wall: Vec<f64>,
    pub attempt: Vec<u32>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ColumnsError {
    #[error("not a column body (it does not start with RLC1)")]
    Magic,
    #[error("the body ends inside {0}")]
    Truncated(&'static str),
    #[error("a key is not UTF-8")]
    Utf8,
}

fn pad(out: &mut Vec<u8>) {
    out.resize(out.len().next_multiple_of(8), 0);
}

/// Appends the body's header; then [`push_series`] once per series.
pub fn start(out: &mut Vec<u8>, series: u32) {
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&series.to_le_bytes());
}

/// Appends one series. Keys are at most 65,535 bytes long (names are
/// checked far below that at ingest).
pub fn push_series(out: &mut Vec<u8>, key: &str, rank: u32, points: &[SeriesPoint]) {
    let key = &key.as_bytes()[..key.len().min(usize::from(u16::MAX))];
    out.reserve(40 + key.len() + points.len() * 28);
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&rank.to_le_bytes());
    out.extend_from_slice(&(points.len() as u64).to_le_bytes());
    pad(out);
    // The four arrays written in place: millions of points, no growth.
    let n = points.len();
    let start = out.len();
    out.resize(start + n * 28, 0);
    let (steps, rest) = out[start..].split_at_mut(n * 8);
    let (values, rest) = rest.split_at_mut(n * 8);
    let (walls, attempts) = rest.split_at_mut(n * 8);
    for (i, p) in points.iter().enumerate() {
        steps[i * 8..i * 8 + 8].copy_from_slice(&p.step.to_le_bytes());
        values[i * 8..i * 8 + 8].copy_from_slice(&p.value.to_le_bytes());
        walls[i * 8..i * 8 + 8].copy_from_slice(&p.wall.to_le_bytes());
        attempts[i * 4..i * 4 + 4].copy_from_slice(&p.attempt.to_le_bytes());
    }
    pad(out);
}

struct Reader<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ColumnsError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.body.len())
            .ok_or(ColumnsError::Truncated(what))?;
        let bytes = &self.body[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ColumnsError> {
        let bytes = self.take(N, what)?;
        let mut array = [0u8; N];
        array.copy_from_slice(bytes);
        Ok(array)
    }

    fn align(&mut self, what: &'static str) -> Result<(), ColumnsError> {
        let to = self.at.next_multiple_of(8);
        self.take(to - self.at, what).map(|_| ())
    }
}

/// Reads a whole body (the Rust client's and the tests' reader; Python
/// maps the arrays with numpy instead).
pub fn decode(body: &[u8]) -> Result<Vec<Columns>, ColumnsError> {
    let mut r = Reader { body, at: 0 };
    if r.take(4, "the magic").map_err(|_| ColumnsError::Magic)? != MAGIC {
        return Err(ColumnsError::Magic);
    }
    let count = u32::from_le_bytes(r.array("the series count")?);
    let mut all = Vec::new();
    for _ in 0..count {
        let len = u16::from_le_bytes(r.array("a key's length")?);
        let key = std::str::from_utf8(r.take(usize::from(len), "a key")?)
            .map_err(|_| ColumnsError::Utf8)?
            .to_owned();
        let rank = u32::from_le_bytes(r.array("a rank")?);
        let n = u64::from_le_bytes(r.array("a point count")?);
        let n = usize::try_from(n).map_err(|_| ColumnsError::Truncated("the steps"))?;
        r.align("the padding")?;
        // Checked against what is left before allocating anything.
        if n.checked_mul(28)
            .is_none_or(|need| need > body.len() - r.at)
        {
            return Err(ColumnsError::Truncated("the steps"));
        }
        let step = r.take(n * 8, "the steps")?;
        let value = r.take(n * 8, "the values")?;
        let wall = r.take(n * 8, "the wall times")?;
        let attempt = r.take(n * 4, "the attempts")?;
        r.align("the padding")?;
        let eights = |b: &[u8]| -> Vec<[u8; 8]> {
            b.chunks_exact(8)
                .map(|c| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(c);
                    a
                })
                .collect()
        };
        all.push(Columns {
            key,
            rank,
            step: eights(step).into_iter().map(i64::from_le_bytes).collect(),
            value: eights(value).into_iter().map(f64::from_le_bytes).collect(),
            wall: eights(wall).into_iter().map(f64::from_le_bytes).collect(),
            attempt: attempt
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        });
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(step: i64, value: f64, attempt: u32) -> SeriesPoint {
        SeriesPoint {
            step,
            wall: 1.5 + step as f64,
            value,
            min: value,
            max: value,
            count: 1,
            attempt,
        }
    }

    #[test]
    fn series_round_trip_exactly_with_every_array_aligned() {
        let mut body = Vec::new();
        start(&mut body, 2);
        let a = [
            point(i64::MIN, f64::NAN, 0),
            point(0, f64::INFINITY, 1),
            point(i64::MAX, -0.0, 7),
        ];
        push_series(&mut body, "loss/ü", 3, &a);
        push_series(&mut body, "lr", 0, &[]);
        assert_eq!(body.len() % 8, 0);
        let got = decode(&body).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].key.as_str(), got[0].rank), ("loss/ü", 3));
        assert_eq!(got[0].step, [i64::MIN, 0, i64::MAX]);
        assert!(got[0].value[0].is_nan() && got[0].value[1] == f64::INFINITY);
        assert!(got[0].value[2] == 0.0 && got[0].value[2].is_sign_negative());
        assert_eq!(got[0].wall[1], 1.5);
        assert_eq!(got[0].attempt, [0, 1, 7]);
        assert_eq!(got[1].key, "lr");
        assert!(got[1].step.is_empty());
        // The steps of the first series start on an 8-byte boundary.
        let steps_at = 4 + 4 + 2 + "loss/ü".len() + 4 + 8;
        let steps_at = steps_at.next_multiple_of(8);
        assert_eq!(
            &body[steps_at..steps_at + 8],
            &i64::MIN.to_le_bytes(),
            "steps at {steps_at}"
        );
    }

    #[test]
    fn a_damaged_body_is_an_error_not_a_guess() {
        let mut body = Vec::new();
        start(&mut body, 1);
        push_series(&mut body, "k", 0, &[point(1, 2.0, 0)]);
        assert_eq!(decode(b"RLB2"), Err(ColumnsError::Magic));
        for cut in [3, 9, 20, body.len() - 1] {
            assert!(decode(&body[..cut]).is_err(), "cut at {cut}");
        }
        // A count far larger than the body is refused before allocating.
        let mut huge = body.clone();
        let n_at = 4 + 4 + 2 + 1 + 4;
        huge[n_at..n_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge).is_err());
    }
}

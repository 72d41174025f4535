//! The batch format of `POST /api/v1/runs/{id}/batches`
//! (`application/x-relaunch-batch`): the records of one writer, each with
//! its sequence number, compact and little-endian.
//!
//! ```text
//! "RLB3"
//! writer          str16 (u16 length + UTF-8)   one spool: one process of one attempt
//! attempt_token   str16                        the attempt it belongs to
//! records         u32 n, n × record, seq consecutive (each the last + 1), 1 ..= 2^63-1
//! record = seq u64, body
//! body   = kind u8, then
//!   metrics (1): step i64, wall f64, rank u32, u16 n, n × (key str16, value f64)   one log() call
//!   log     (2): rank u32, stream u8 (0 stdout, 1 stderr), wall f64, text str32
//!   event   (3): kind str16, wall f64, text str32, data str32 (JSON)
//! crc32c          u32, CRC-32C (Castagnoli) of every byte before it
//! ```
//!
//! Every wall time is finite (seconds since the Unix epoch). A batch whose
//! checksum does not match was damaged on the way (a proxy, a bad NIC) and
//! is refused whole, so no bit flipped in transit is stored as another
//! value. "RLB2", the same without the checksum as clients before it sent,
//! is refused (since 0.1.0's checksum issue): a flipped bit in it would be
//! stored. Such a client's spool keeps its records; a current client ships
//! them again.
//!
//! A record's body is also what the client's spool stores, so shipping is
//! concatenation. A writer numbers its records 1, 2, 3, ... without gaps;
//! the server stores those above its watermark for the writer, once, and
//! refuses a batch that would leave a gap.

use crate::types::Stream;

pub const MAGIC: &[u8; 4] = b"RLB3";

/// The format before the checksum: refused, with what to do.
pub const MAGIC_UNCHECKED: &[u8; 4] = b"RLB2";
pub const CONTENT_TYPE: &str = "application/x-relaunch-batch";

/// The largest sequence number: storage keeps them as signed 64-bit
/// integers (SQLite's `INTEGER`).
pub const MAX_SEQ: u64 = i64::MAX as u64;

/// Longest writer id or attempt token.
pub const MAX_ID: usize = 256;

#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// One `log()` call: values of several keys at one step.
    Metrics {
        step: i64,
        wall: f64,
        rank: u32,
        values: Vec<(String, f64)>,
    },
    Log {
        rank: u32,
        stream: Stream,
        wall: f64,
        text: String,
    },
    Event {
        kind: String,
        wall: f64,
        text: String,
        data: String,
    },
}

/// A decoded batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    pub writer: String,
    pub attempt_token: String,
    /// `(seq, record)`, seq consecutive, in `1..=MAX_SEQ` (see
    /// [`Batch::check_sequence`]).
    pub records: Vec<(u64, Record)>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BatchError {
    #[error("not a relaunch batch (it should start with \"RLB3\")")]
    Magic,
    #[error(
        "an \"RLB2\" batch, without the checksum that \"RLB3\" adds, from a relaunch client \
         older than this server: refused, since a bit flipped on the way would be stored; \
         upgrade relaunch where the job runs (its spool keeps the records, and the new client \
         ships them)"
    )]
    Unchecked,
    #[error(
        "the batch's checksum is {found:08x} but its bytes give {computed:08x}: it was damaged \
         on the way; send it again"
    )]
    Checksum { found: u32, computed: u32 },
    #[error(
        "record {seq} has the wall time {wall}: a wall time is a finite number of seconds since \
         the Unix epoch"
    )]
    Wall { seq: u64, wall: f64 },
    #[error("the batch ends in the middle of {0}")]
    Truncated(&'static str),
    #[error("unknown record kind {0}")]
    Kind(u8),
    #[error(
        "sequence numbers must be consecutive: {then} follows {before}; a writer numbers its \
         records 1, 2, 3, ... and sends them without gaps"
    )]
    Gap { before: u64, then: u64 },
    #[error(
        "sequence number {0} is out of range: sequence numbers run from 1 to {MAX_SEQ} (2^63-1)"
    )]
    SeqRange(u64),
    #[error("{0} is not UTF-8")]
    Utf8(&'static str),
    #[error("{what} of {len} bytes; the most is {MAX_ID}")]
    TooLong { what: &'static str, len: usize },
    #[error("{0} bytes follow the last record")]
    Trailing(usize),
}

/// Most values one metrics record holds.
pub const MAX_VALUES: usize = u16::MAX as usize;

/// Appends the start of a metrics record body whose `count` values follow,
/// each as [`put_metric_value`]: the client encodes a `log()` call this way
/// without building a [`Record`].
pub fn put_metrics_header(out: &mut Vec<u8>, step: i64, wall: f64, rank: u32, count: u16) {
    out.push(1);
    out.extend_from_slice(&step.to_le_bytes());
    out.extend_from_slice(&wall.to_le_bytes());
    out.extend_from_slice(&rank.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
}

pub fn put_metric_value(out: &mut Vec<u8>, key: &str, value: f64) {
    put_str16(out, key);
    out.extend_from_slice(&value.to_le_bytes());
}

/// Appends the body of a console line record.
pub fn put_log(out: &mut Vec<u8>, rank: u32, stream: Stream, wall: f64, text: &str) {
    out.push(2);
    out.extend_from_slice(&rank.to_le_bytes());
    out.push(match stream {
        Stream::Stdout => 0,
        Stream::Stderr => 1,
    });
    out.extend_from_slice(&wall.to_le_bytes());
    put_str32(out, text);
}

/// Appends the header of a batch whose `count` records follow (each as
/// [`put_record_with_seq`]).
pub fn put_header(out: &mut Vec<u8>, writer: &str, attempt_token: &str, count: u32) {
    out.extend_from_slice(MAGIC);
    put_str16(out, writer);
    put_str16(out, attempt_token);
    out.extend_from_slice(&count.to_le_bytes());
}

/// Appends `seq` and an already encoded record body.
pub fn put_record_with_seq(out: &mut Vec<u8>, seq: u64, body: &[u8]) {
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(body);
}

/// Ends the batch that `out` holds from `start` (where its header was put):
/// appends the checksum of its bytes.
/// The CRC-32C (Castagnoli) an "RLB3" batch ends with, of every byte
/// before it.
pub fn checksum(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

pub fn put_checksum(out: &mut Vec<u8>, start: usize) {
    let crc = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

impl Batch {
    /// Appends the wire form to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put_header(
            out,
            &self.writer,
            &self.attempt_token,
            self.records.len() as u32,
        );
        for (seq, record) in &self.records {
            out.extend_from_slice(&seq.to_le_bytes());
            record.encode(out);
        }
        put_checksum(out, start);
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, BatchError> {
        let bytes = match bytes.get(..4) {
            Some(magic) if magic == MAGIC => {
                let Some(split) = bytes.len().checked_sub(4).filter(|&n| n >= 4) else {
                    return Err(BatchError::Truncated("the checksum"));
                };
                let (body, trailer) = bytes.split_at(split);
                let found = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
                let computed = crc32c::crc32c(body);
                if found != computed {
                    return Err(BatchError::Checksum { found, computed });
                }
                body
            }
            Some(magic) if magic == MAGIC_UNCHECKED => return Err(BatchError::Unchecked),
            Some(_) => return Err(BatchError::Magic),
            None => return Err(BatchError::Truncated("the header")),
        };
        let mut r = Reader { bytes, pos: 4 };
        let writer = r.str16("the writer id")?;
        let attempt_token = r.str16("the attempt token")?;
        for (what, s) in [("writer id", &writer), ("attempt token", &attempt_token)] {
            if s.len() > MAX_ID {
                return Err(BatchError::TooLong { what, len: s.len() });
            }
        }
        let count = r.u32("the record count")? as usize;
        // Every record takes at least 9 bytes: bound the allocation by what arrived.
        let mut records = Vec::with_capacity(count.min(bytes.len() / 9));
        for _ in 0..count {
            let seq = r.u64("a sequence number")?;
            records.push((seq, Record::decode_from(&mut r)?));
        }
        if r.pos != bytes.len() {
            return Err(BatchError::Trailing(bytes.len() - r.pos));
        }
        let batch = Self {
            writer,
            attempt_token,
            records,
        };
        batch.check_sequence()?;
        for (seq, record) in &batch.records {
            let wall = record.wall();
            if !wall.is_finite() {
                return Err(BatchError::Wall { seq: *seq, wall });
            }
        }
        Ok(batch)
    }

    /// The records' sequence numbers are consecutive and in
    /// `1..=`[`MAX_SEQ`]: a gap would be acknowledged by a watermark past
    /// records never stored, and a larger number cannot be stored exactly.
    pub fn check_sequence(&self) -> Result<(), BatchError> {
        let mut last: Option<u64> = None;
        for &(seq, _) in &self.records {
            if seq == 0 || seq > MAX_SEQ {
                return Err(BatchError::SeqRange(seq));
            }
            if let Some(before) = last
                && before.checked_add(1) != Some(seq)
            {
                return Err(BatchError::Gap { before, then: seq });
            }
            last = Some(seq);
        }
        Ok(())
    }
}

impl Record {
    /// When the record was made, in seconds since the Unix epoch.
    pub fn wall(&self) -> f64 {
        match self {
            Record::Metrics { wall, .. }
            | Record::Log { wall, .. }
            | Record::Event { wall, .. } => *wall,
        }
    }

    /// Appends the record's body (what the spool stores).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Record::Metrics {
                step,
                wall,
                rank,
                values,
            } => {
                let values = &values[..values.len().min(MAX_VALUES)];
                put_metrics_header(out, *step, *wall, *rank, values.len() as u16);
                for (key, value) in values {
                    put_metric_value(out, key, *value);
                }
            }
            Record::Log {
                rank,
                stream,
                wall,
                text,
            } => put_log(out, *rank, *stream, *wall, text),
            Record::Event {
                kind,
                wall,
                text,
                data,
            } => {
                out.push(3);
                put_str16(out, kind);
                out.extend_from_slice(&wall.to_le_bytes());
                put_str32(out, text);
                put_str32(out, data);
            }
        }
    }

    /// Decodes one body, which must be all of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, BatchError> {
        let mut r = Reader { bytes, pos: 0 };
        let record = Self::decode_from(&mut r)?;
        if r.pos != bytes.len() {
            return Err(BatchError::Trailing(bytes.len() - r.pos));
        }
        Ok(record)
    }

    fn decode_from(r: &mut Reader<'_>) -> Result<Self, BatchError> {
        Ok(match r.u8("a record kind")? {
            1 => {
                let step = r.i64("metrics")?;
                let wall = r.f64("metrics")?;
                let rank = r.u32("metrics")?;
                let n = r.u16("metrics")? as usize;
                let mut values = Vec::with_capacity(n.min(r.remaining() / 10));
                for _ in 0..n {
                    values.push((r.str16("a metric key")?, r.f64("a metric value")?));
                }
                Record::Metrics {
                    step,
                    wall,
                    rank,
                    values,
                }
            }
            2 => Record::Log {
                rank: r.u32("a log line")?,
                stream: match r.u8("a log line")? {
                    0 => Stream::Stdout,
                    _ => Stream::Stderr,
                },
                wall: r.f64("a log line")?,
                text: r.str32("a log line")?,
            },
            3 => Record::Event {
                kind: r.str16("an event")?,
                wall: r.f64("an event")?,
                text: r.str32("an event")?,
                data: r.str32("an event")?,
            },
            other => return Err(BatchError::Kind(other)),
        })
    }
}

fn put_str16(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

fn put_str32(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], BatchError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(BatchError::Truncated(what))?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], BatchError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, BatchError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, BatchError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, BatchError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, BatchError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn i64(&mut self, what: &'static str) -> Result<i64, BatchError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }
    fn f64(&mut self, what: &'static str) -> Result<f64, BatchError> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }
    fn str16(&mut self, what: &'static str) -> Result<String, BatchError> {
        let n = self.u16(what)? as usize;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| BatchError::Utf8(what))
    }
    fn str32(&mut self, what: &'static str) -> Result<String, BatchError> {
        let n = self.u32(what)? as usize;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| BatchError::Utf8(what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Batch {
        Batch {
            writer: "w-abc".into(),
            attempt_token: "launch-1:0".into(),
            records: vec![
                (
                    1,
                    Record::Metrics {
                        step: 7,
                        wall: 1.5,
                        rank: 3,
                        values: vec![("loss".into(), 0.5), ("acc".into(), f64::NAN)],
                    },
                ),
                (
                    2,
                    Record::Log {
                        rank: 0,
                        stream: Stream::Stderr,
                        wall: 2.0,
                        text: "épochs\ttab".into(),
                    },
                ),
                (
                    3,
                    Record::Event {
                        kind: "restart".into(),
                        wall: 3.0,
                        text: "rank 1 failed".into(),
                        data: "{\"code\":1}".into(),
                    },
                ),
            ],
        }
    }

    #[test]
    fn roundtrip() {
        let batch = sample();
        let mut bytes = Vec::new();
        batch.encode(&mut bytes);
        let back = Batch::decode(&bytes).unwrap();
        // NaN != NaN: compare the encodings.
        let mut again = Vec::new();
        back.encode(&mut again);
        assert_eq!(again, bytes);
        assert_eq!(back.writer, "w-abc");
    }

    #[test]
    fn a_batch_is_its_header_and_record_bodies() {
        let batch = sample();
        let mut by_parts = Vec::new();
        put_header(&mut by_parts, &batch.writer, &batch.attempt_token, 3);
        for (seq, record) in &batch.records {
            let mut body = Vec::new();
            record.encode(&mut body);
            assert_eq!(Record::decode(&body).unwrap().encode_to_vec(), body);
            put_record_with_seq(&mut by_parts, *seq, &body);
        }
        put_checksum(&mut by_parts, 0);
        let mut whole = Vec::new();
        batch.encode(&mut whole);
        assert_eq!(by_parts, whole);
    }

    #[test]
    fn every_truncation_is_an_error_never_a_panic() {
        let mut bytes = Vec::new();
        sample().encode(&mut bytes);
        for cut in 0..bytes.len() {
            assert!(Batch::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        bytes.push(0);
        assert!(matches!(
            Batch::decode(&bytes),
            Err(BatchError::Checksum { .. })
        ));
    }

    /// The batch as clients before the checksum sent it ("RLB2").
    fn without_checksum(batch: &Batch) -> Vec<u8> {
        let mut bytes = Vec::new();
        batch.encode(&mut bytes);
        bytes.truncate(bytes.len() - 4);
        bytes[..4].copy_from_slice(MAGIC_UNCHECKED);
        bytes
    }

    /// Issue 35: "RLB2" batches were stored unchecked (230 of 400 with a
    /// flipped bit were).
    #[test]
    fn a_batch_of_the_format_before_the_checksum_is_refused_with_what_to_do() {
        let err = Batch::decode(&without_checksum(&sample())).unwrap_err();
        assert_eq!(err, BatchError::Unchecked);
        assert!(err.to_string().contains("upgrade relaunch"), "{err}");
    }

    /// Regression: bits flipped on the way were stored as other values.
    #[test]
    fn every_flipped_bit_is_refused() {
        let mut bytes = Vec::new();
        sample().encode(&mut bytes);
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(Batch::decode(&damaged).is_err(), "bit {bit} flipped");
        }
    }

    /// Regression: a NaN or infinite wall time was stored, and read back
    /// as null.
    #[test]
    fn a_wall_time_that_is_not_finite_is_refused() {
        for wall in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut batch = sample();
            if let Record::Log { wall: w, .. } = &mut batch.records[1].1 {
                *w = wall;
            } else {
                panic!("the sample's second record is a log line");
            }
            let mut bytes = Vec::new();
            batch.encode(&mut bytes);
            let err = Batch::decode(&bytes).unwrap_err();
            assert!(matches!(err, BatchError::Wall { seq: 2, .. }), "{err:?}");
            assert!(err.to_string().contains("finite"), "{err}");
        }
    }

    #[test]
    fn bad_batches_say_what_is_wrong() {
        assert_eq!(Batch::decode(b"JSON{}"), Err(BatchError::Magic));
        let mut unordered = sample();
        unordered.records[2].0 = 1;
        let mut bytes = Vec::new();
        unordered.encode(&mut bytes);
        assert_eq!(
            Batch::decode(&bytes),
            Err(BatchError::Gap { before: 2, then: 1 })
        );
        // Regression: a gap was stored, and the missing record, sent later,
        // acknowledged and dropped.
        let mut gap = sample();
        gap.records.remove(1);
        let mut bytes = Vec::new();
        gap.encode(&mut bytes);
        assert_eq!(
            Batch::decode(&bytes),
            Err(BatchError::Gap { before: 1, then: 3 })
        );
        // Regression: numbers above 2^63-1 were clamped when stored.
        for seq in [0, MAX_SEQ + 1, u64::MAX] {
            let mut out = sample();
            out.records.truncate(1);
            out.records[0].0 = seq;
            let mut bytes = Vec::new();
            out.encode(&mut bytes);
            assert_eq!(Batch::decode(&bytes), Err(BatchError::SeqRange(seq)));
        }
        let mut top = sample();
        top.records.truncate(1);
        top.records[0].0 = MAX_SEQ;
        assert_eq!(top.check_sequence(), Ok(()));
        // A huge record count with no records does not allocate for it.
        let mut bytes = Vec::new();
        put_header(&mut bytes, "w", "t", u32::MAX);
        put_checksum(&mut bytes, 0);
        assert!(matches!(
            Batch::decode(&bytes),
            Err(BatchError::Truncated(_))
        ));
        assert_eq!(Record::decode(&[9]), Err(BatchError::Kind(9)));
    }

    impl Record {
        fn encode_to_vec(&self) -> Vec<u8> {
            let mut v = Vec::new();
            self.encode(&mut v);
            v
        }
    }
}

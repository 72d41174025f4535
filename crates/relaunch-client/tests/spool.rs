//! Integration tests for the crash-safe spool: round trips, torn tails, real
//! SIGKILLs at random points, the single-writer lock, and the append cost.

// clippy.toml allows unwrap inside `#[test]` functions only; the helpers here
// are test code too, and a panic is exactly how they should fail.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::Rng;
use relaunch_client::spool::{Spool, SpoolError, SpoolOptions};

/// Set in a re-executed test binary to make it the crashing writer.
const CHILD_ENV: &str = "RELAUNCH_SPOOL_CHILD";
const CHILD_TEST: &str = "crash_child_appends_until_killed";

/// A unique directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let name = format!(
            "relaunch-spool-{tag}-{}-{nanos}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        TempDir(std::env::temp_dir().join(name))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn small() -> SpoolOptions {
    SpoolOptions {
        segment_bytes: 4096,
    }
}

/// The payload every test writes for `seq`: its decimal digits repeated to a
/// length that varies with the seq (0 to 299 bytes), so a record read back
/// under the wrong seq or cut short is caught. Every 64th record is larger than
/// a small segment, which exercises oversized segments and widens the window
/// in which a kill lands mid-append.
fn payload_for(seq: u64) -> Vec<u8> {
    let len = if seq.is_multiple_of(64) {
        64 * 1024 + (seq % 7) as usize
    } else {
        (seq.wrapping_mul(2_654_435_761) % 300) as usize
    };
    seq.to_string().bytes().cycle().take(len).collect()
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("seg-") && name.ends_with(".spool")
        })
        .collect();
    files.sort();
    files
}

fn read_all(spool: &Spool) -> Vec<(u64, Vec<u8>)> {
    spool.read_after(0, usize::MAX).unwrap()
}

fn assert_contiguous_from(records: &[(u64, Vec<u8>)], first: u64) {
    for (i, (seq, payload)) in records.iter().enumerate() {
        assert_eq!(*seq, first + i as u64, "records are not contiguous");
        assert_eq!(payload, &payload_for(*seq), "payload of seq {seq} differs");
    }
}

#[test]
fn append_read_ack_reopen_round_trip() {
    let tmp = TempDir::new("roundtrip");
    let mut spool = Spool::open(tmp.path(), small()).unwrap();
    assert_eq!(
        (spool.last_seq(), spool.acked(), spool.pending()),
        (0, 0, 0)
    );
    assert!(read_all(&spool).is_empty());
    for expected in 1..=200 {
        assert_eq!(spool.append(&payload_for(expected)).unwrap(), expected);
    }
    spool.sync().unwrap();
    assert_eq!((spool.last_seq(), spool.pending()), (200, 200));
    let records = read_all(&spool);
    assert_eq!(records.len(), 200);
    assert_contiguous_from(&records, 1);
    let before = segment_files(tmp.path()).len();
    assert!(before > 3, "expected several 4 KiB segments, got {before}");

    spool.ack(150).unwrap();
    assert_eq!((spool.acked(), spool.pending()), (150, 50));
    let after = segment_files(tmp.path()).len();
    assert!(
        after < before,
        "ack removed no segment ({before} -> {after})"
    );
    let remaining = read_all(&spool);
    assert!(remaining[0].0 <= 151, "unacked records were deleted");
    assert_contiguous_from(&remaining, remaining[0].0);
    assert_eq!(remaining.last().unwrap().0, 200);
    // A stale ack changes nothing; an ack past the end is refused.
    spool.ack(10).unwrap();
    assert_eq!(spool.acked(), 150);
    assert!(matches!(
        spool.ack(201),
        Err(SpoolError::AckBeyondEnd {
            watermark: 201,
            last_seq: 200,
            ..
        })
    ));
    drop(spool);

    let mut spool = Spool::open(tmp.path(), small()).unwrap();
    assert_eq!(
        (spool.acked(), spool.last_seq(), spool.pending()),
        (150, 200, 50)
    );
    assert_eq!(spool.append(&payload_for(201)).unwrap(), 201);
    let unacked = spool.read_after(150, usize::MAX).unwrap();
    assert_eq!(unacked.len(), 51);
    assert_contiguous_from(&unacked, 151);

    // Acking everything keeps only the segment being written.
    spool.ack(201).unwrap();
    assert_eq!(segment_files(tmp.path()).len(), 1);
    drop(spool);
    let mut spool = Spool::open(tmp.path(), small()).unwrap();
    assert_eq!(
        (spool.acked(), spool.last_seq(), spool.pending()),
        (201, 201, 0)
    );
    assert!(spool.read_after(201, usize::MAX).unwrap().is_empty());
    assert_eq!(spool.append(&payload_for(202)).unwrap(), 202);
    spool.ack(202).unwrap();
    drop(spool);

    // Numbering survives even when every segment is gone.
    let mut spool = Spool::open(tmp.path(), small()).unwrap();
    assert!(segment_files(tmp.path()).is_empty());
    assert_eq!(spool.append(b"").unwrap(), 203);
    assert_eq!(spool.dir(), tmp.path());
}

#[test]
fn read_after_respects_max_bytes_but_returns_at_least_one() {
    let tmp = TempDir::new("maxbytes");
    let mut spool = Spool::open(tmp.path(), small()).unwrap();
    for _ in 0..10 {
        spool.append(&[7u8; 100]).unwrap();
    }
    let seqs = |records: Vec<(u64, Vec<u8>)>| records.into_iter().map(|r| r.0).collect::<Vec<_>>();
    assert_eq!(seqs(spool.read_after(0, 250).unwrap()), [1, 2]);
    assert_eq!(seqs(spool.read_after(0, 300).unwrap()), [1, 2, 3]);
    assert_eq!(seqs(spool.read_after(0, 0).unwrap()), [1]);
    assert_eq!(seqs(spool.read_after(4, 10).unwrap()), [5]);
    assert_eq!(
        seqs(spool.read_after(3, 10_000).unwrap()),
        (4..=10).collect::<Vec<_>>()
    );
    assert!(spool.read_after(10, 10_000).unwrap().is_empty());
    assert!(spool.read_after(u64::MAX, 10_000).unwrap().is_empty());
}

#[test]
fn reading_forward_in_small_batches_sees_every_record_once() {
    let tmp = TempDir::new("batches");
    let mut spool = Spool::open(tmp.path(), small()).unwrap();
    for seq in 1..=100 {
        spool.append(&payload_for(seq)).unwrap();
    }
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let batch = spool.read_after(after, 500).unwrap();
        let Some(last) = batch.last() else { break };
        after = last.0;
        seen.extend(batch);
        // Interleave appends and acks the way a writer and the shipper would.
        spool.ack(after.saturating_sub(10)).unwrap();
        while spool.last_seq() < 500 && spool.last_seq() < after + 20 {
            let seq = spool.last_seq() + 1;
            spool.append(&payload_for(seq)).unwrap();
        }
    }
    assert_eq!(seen.len(), 500);
    assert_contiguous_from(&seen, 1);
    // Reading again from an arbitrary point (not where the last read ended).
    assert_contiguous_from(&spool.read_after(477, usize::MAX).unwrap(), 478);
}

#[test]
fn empty_and_oversized_records_round_trip() {
    let tmp = TempDir::new("sizes");
    let mut spool = Spool::open(tmp.path(), small()).unwrap();
    let big = vec![0xAB; 10_000];
    assert_eq!(spool.append(b"").unwrap(), 1);
    assert_eq!(spool.append(&big).unwrap(), 2);
    assert_eq!(spool.append(b"x").unwrap(), 3);
    drop(spool);
    let spool = Spool::open(tmp.path(), small()).unwrap();
    let records = read_all(&spool);
    assert_eq!(records, vec![(1, Vec::new()), (2, big), (3, b"x".to_vec())]);
}

/// Byte offsets of every record in a segment file, parsed independently of the
/// implementation from the documented format.
fn record_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut at = 0;
    while at + 16 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        offsets.push(at);
        at += (16 + len - 1 + 7) & !7;
    }
    offsets
}

fn torn_tail_case(tag: &str, tear: impl Fn(&mut [u8], usize)) {
    let tmp = TempDir::new(tag);
    let mut spool = Spool::open(tmp.path(), small()).unwrap();
    for seq in 1..=10 {
        spool.append(&payload_for(seq)).unwrap();
    }
    drop(spool);
    let last_segment = segment_files(tmp.path()).pop().unwrap();
    let mut bytes = std::fs::read(&last_segment).unwrap();
    let last = *record_offsets(&bytes).last().unwrap();
    assert_eq!(
        u64::from_le_bytes(bytes[last + 8..last + 16].try_into().unwrap()),
        10
    );
    tear(&mut bytes, last);
    std::fs::write(&last_segment, &bytes).unwrap();

    let mut spool = Spool::open(tmp.path(), small()).unwrap();
    assert_eq!(spool.last_seq(), 9, "{tag}: the torn record survived");
    let records = read_all(&spool);
    assert_eq!(records.len(), 9);
    assert_contiguous_from(&records, 1);
    assert_eq!(spool.append(b"after the tear").unwrap(), 10);
    assert!(
        tmp.path().join(format!("seg-{:020}.spool", 10)).exists(),
        "{tag}: appends must go to a fresh segment after recovery"
    );
    drop(spool);

    let spool = Spool::open(tmp.path(), small()).unwrap();
    let records = read_all(&spool);
    assert_eq!(records.len(), 10);
    assert_contiguous_from(&records[..9], 1);
    assert_eq!(records[9], (10, b"after the tear".to_vec()));
}

#[test]
fn torn_tail_with_zero_length_is_dropped() {
    torn_tail_case("zerolen", |bytes, at| bytes[at..at + 4].fill(0));
}

#[test]
fn torn_tail_with_bad_checksum_is_dropped() {
    torn_tail_case("badcrc", |bytes, at| bytes[at + 4] ^= 0xFF);
}

#[test]
fn torn_tail_with_half_written_payload_is_dropped() {
    // `len` made it but the rest did not: the crc no longer matches.
    torn_tail_case("halfpayload", |bytes, at| {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        bytes[at + 16 + len / 2..at + 16 + len].fill(0);
        bytes[at + 16] ^= 1;
    });
}

#[test]
fn corrupt_acked_file_is_reported_with_its_path() {
    let tmp = TempDir::new("badack");
    std::fs::create_dir_all(tmp.path()).unwrap();
    std::fs::write(tmp.path().join("acked"), "twelve").unwrap();
    let err = Spool::open(tmp.path(), small()).unwrap_err();
    assert!(matches!(err, SpoolError::CorruptAck { .. }));
    assert!(
        err.to_string()
            .contains(&tmp.path().join("acked").display().to_string())
    );
}

#[test]
fn second_open_of_the_same_dir_is_busy() {
    let tmp = TempDir::new("busy");
    let first = Spool::open(tmp.path(), small()).unwrap();
    match Spool::open(tmp.path(), small()) {
        Err(err @ SpoolError::Busy { .. }) => {
            assert!(err.to_string().contains(&tmp.path().display().to_string()));
        }
        other => panic!("expected SpoolError::Busy, got {other:?}"),
    }
    drop(first);
    Spool::open(tmp.path(), small()).unwrap();
}

/// The crashing writer. A no-op in a normal test run; when re-executed with
/// `CHILD_ENV` set it appends forever, printing each seq once `append` returns.
#[test]
fn crash_child_appends_until_killed() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let mut spool = Spool::open(Path::new(&dir), small()).unwrap();
    let mut stdout = std::io::stdout().lock();
    // Bounded so an orphaned child cannot fill the disk; the parent kills it
    // long before this.
    let deadline = Instant::now() + Duration::from_secs(30);
    for expected in 1..=2_000_000u64 {
        assert_eq!(spool.append(&payload_for(expected)).unwrap(), expected);
        writeln!(stdout, "{expected}").unwrap();
        stdout.flush().unwrap();
        if expected.is_multiple_of(1024) && Instant::now() > deadline {
            break;
        }
    }
}

/// Kills the child if a round fails half way, so no writer outlives the test.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn records_survive_sigkill_at_random_points() {
    const ROUNDS: usize = 24;
    let started = Instant::now();
    let mut rng = rand::rng();
    for round in 0..ROUNDS {
        let tmp = TempDir::new("sigkill");
        let kill_after: u64 = rng.random_range(0..=3000);
        let mut child = KillOnDrop(
            Command::new(std::env::current_exe().unwrap())
                .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, tmp.path())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        // A reader thread keeps draining the pipe, so the child is never
        // parked in a blocked write and the kill lands at a random instant.
        let stdout = child.0.stdout.take().unwrap();
        let (lines_tx, lines_rx) = mpsc::channel::<u64>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // libtest's own banner lines are not numbers.
                if let Ok(seq) = line.trim().parse::<u64>()
                    && lines_tx.send(seq).is_err()
                {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut printed = 0;
        while printed < kill_after {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines_rx.recv_timeout(left) {
                Ok(seq) => printed = seq,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("round {round}: child stalled"),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        kill(Pid::from_raw(child.0.id() as i32), Signal::SIGKILL).unwrap();
        let status = child.0.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(Signal::SIGKILL as i32),
            "round {round}: the child exited on its own ({status})"
        );
        reader.join().unwrap();
        // Lines still in the pipe were also printed after their append returned.
        let printed = lines_rx.try_iter().fold(printed, u64::max);

        let mut spool = Spool::open(tmp.path(), small()).unwrap();
        let records = read_all(&spool);
        assert_contiguous_from(&records, 1);
        let recovered = records.len() as u64;
        assert!(
            recovered >= printed,
            "round {round}: child confirmed seq {printed} but only {recovered} records survived"
        );
        assert_eq!(spool.last_seq(), recovered);
        assert_eq!(spool.append(b"after the kill").unwrap(), recovered + 1);
        drop(spool);
        drop(tmp);
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "crash rounds are far slower than expected"
        );
    }
}

#[test]
fn append_cost_is_printed() {
    const APPENDS: u32 = 1_000_000;
    let tmp = TempDir::new("cost");
    let mut spool = Spool::open(tmp.path(), SpoolOptions::default()).unwrap();
    let payload = [0x5Au8; 64];
    let started = Instant::now();
    for _ in 0..APPENDS {
        spool.append(&payload).unwrap();
    }
    let elapsed = started.elapsed();
    eprintln!(
        "spool append: {:.1} ns per 64-byte record over {APPENDS} appends ({} build)",
        elapsed.as_nanos() as f64 / f64::from(APPENDS),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    );
    assert_eq!(spool.last_seq(), u64::from(APPENDS));
}

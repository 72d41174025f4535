//! The crash-safe local spool: every logged record lands here before the
//! network sees it, so a dead server or a killed process never loses data.
//!
//! Records are appended into memory-mapped segment files with a shared mapping,
//! so an append is a memcpy into the page cache: it survives the process being
//! SIGKILLed the moment [`Spool::append`] returns, and survives power loss once
//! [`Spool::sync`] returns. A background shipper reads with
//! [`Spool::read_after`] and trims with [`Spool::ack`].
//!
//! On disk, `dir/seg-{first_seq:020}.spool` holds 8-byte aligned records
//! `[u32 len][u32 crc32][u64 seq][payload]` (little-endian), where `len` is the
//! payload length plus one so that zero always means "nothing here", and the
//! crc covers the seq bytes and the payload. `len` is published last, so a
//! record cut short by a kill reads as the end of the segment. `dir/acked`
//! holds the acknowledged watermark as decimal text; `dir/lock` is flocked by
//! the single writer.

// memmap2 can only create mappings through `unsafe` calls (the type system
// cannot know whether another process changes the file underneath), and
// publishing a record's length needs an atomic store into the mapping. Both are
// sound here because this process creates the files and an exclusive flock on
// `dir/lock` keeps every other spool handle out; the unsafe blocks are few and
// each carries its own SAFETY argument.
#![allow(unsafe_code)]

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering, fence};

use memmap2::MmapMut;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use parking_lot::Mutex;

/// Bytes before the payload: `len`, `crc32`, `seq`.
const HEADER: usize = 16;
/// A zero `len` that must always fit after the last record, so recovery sees
/// where a segment ends without reading past the file.
const TERMINATOR: usize = 4;
/// The largest payload whose `len` (payload length + 1) still fits a u32.
const MAX_PAYLOAD: usize = u32::MAX as usize - 1;
const SEGMENT_PREFIX: &str = "seg-";
const SEGMENT_SUFFIX: &str = ".spool";
const ACKED_FILE: &str = "acked";
const ACKED_TEMP_FILE: &str = "acked.tmp";
const LOCK_FILE: &str = "lock";

/// Errors from the spool. Each names the path involved so the user can act.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// Another open spool (in this or another process) holds the lock.
    #[error(
        "spool {dir} is already open by another writer; close that run or give this one its own spool directory"
    )]
    Busy { dir: PathBuf },
    /// A filesystem operation failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `dir/acked` does not hold a decimal number.
    #[error(
        "acknowledged watermark {path} holds {contents:?}, not a decimal number; delete the file to resend everything still spooled"
    )]
    CorruptAck { path: PathBuf, contents: String },
    /// The server acknowledged a record this spool never wrote.
    #[error(
        "ack of seq {watermark} is beyond the last appended seq {last_seq} in spool {dir}; make sure no two runs share a spool directory or a run id"
    )]
    AckBeyondEnd {
        watermark: u64,
        last_seq: u64,
        dir: PathBuf,
    },
    /// The payload cannot be framed because its length does not fit the header.
    #[error(
        "payload of {len} bytes exceeds the spool record limit of {max} bytes; split it into smaller records"
    )]
    TooLarge { len: usize, max: usize },
    /// The spool was closed; nothing more can be appended.
    #[error("spool {dir} is closed")]
    Closed { dir: PathBuf },
    /// The directory, or its lock file, was removed by the process that held
    /// the lock before this one took it: there is nothing left to open.
    #[error(
        "spool {dir} was removed by another process while this one opened it; nothing of it is left to ship"
    )]
    Gone { dir: PathBuf },
}

impl SpoolError {
    fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> SpoolError + 'a {
        move |source| SpoolError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// How the spool lays out its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpoolOptions {
    /// Size each segment file is preallocated to; a larger record gets a
    /// segment of its own sized to fit.
    pub segment_bytes: usize,
}

impl Default for SpoolOptions {
    fn default() -> Self {
        SpoolOptions {
            segment_bytes: 8 * 1024 * 1024,
        }
    }
}

/// One segment file and its mapping.
#[derive(Debug)]
struct Segment {
    path: PathBuf,
    /// The seq in the file name; the first record carries it.
    first_seq: u64,
    /// One past the last valid record's seq (`first_seq` when empty).
    next_seq: u64,
    /// Byte offset one past the last valid record.
    end: usize,
    /// Bytes before this offset are known to be on stable storage.
    synced: usize,
    map: MmapMut,
}

impl Segment {
    fn has_room(&self, record_len: usize) -> bool {
        self.end + record_len + TERMINATOR <= self.map.len()
    }

    fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Writes one record at `end`. The caller has checked `has_room`.
    fn write(&mut self, seq: u64, payload: &[u8], record_len: usize) {
        let at = self.end;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&seq.to_le_bytes());
        crc.update(payload);
        let record = &mut self.map[at..at + record_len];
        record[4..8].copy_from_slice(&crc.finalize().to_le_bytes());
        record[8..16].copy_from_slice(&seq.to_le_bytes());
        record[HEADER..HEADER + payload.len()].copy_from_slice(payload);
        // The padding is already zero: segments are created fresh and never
        // written twice at the same offset.

        // Everything above must reach memory before `len` does: a kill between
        // the two then leaves `len == 0`, which recovery reads as the end.
        fence(Ordering::Release);
        let len_ptr = self.map[at..at + 4].as_mut_ptr().cast::<u32>();
        // The payload length is at most MAX_PAYLOAD, checked by `append`.
        let len = (payload.len() as u32 + 1).to_le();
        // SAFETY: `len_ptr` points into the live mapping, 4-byte aligned (the
        // mapping is page aligned and records are 8-byte aligned), and nothing
        // else accesses these bytes: this `&mut self` is the only handle and the
        // exclusive flock on `dir/lock` keeps other processes out.
        let len_word = unsafe { AtomicU32::from_ptr(len_ptr) };
        len_word.store(len, Ordering::Release);

        self.end = at + record_len;
        self.next_seq = seq + 1;
    }

    fn flush_unsynced(&mut self) -> Result<(), SpoolError> {
        if self.synced < self.end {
            self.map
                .flush_range(self.synced, self.end - self.synced)
                .map_err(SpoolError::io("msync segment", &self.path))?;
            self.synced = self.end;
        }
        Ok(())
    }
}

/// Where the previous `read_after` stopped, so a shipper reading forward does
/// not rescan a segment from its start on every call.
#[derive(Debug, Clone, Copy)]
struct ReadCursor {
    next_seq: u64,
    segment_first_seq: u64,
    offset: usize,
}

/// The exclusive flock on a spool directory's `lock` file, taken before the
/// spool is opened: [`Spool::lock`] then [`Spool::open_locked`] let a
/// writer hold it from before its directory gets the name others look for.
#[derive(Debug)]
pub struct SpoolLock(Flock<File>);

/// A single-writer, crash-safe, append-only record log in one directory.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    options: SpoolOptions,
    /// Held until [`Spool::close`] or drop; dropping it releases the flock.
    lock: Option<Flock<File>>,
    /// Segments no longer written, oldest first.
    sealed: Vec<Segment>,
    /// The segment appends go to; created lazily so that reopening never
    /// writes after a torn tail in an old segment.
    active: Option<Segment>,
    last_seq: u64,
    acked: u64,
    /// A segment file was created since the last sync, so the directory entry
    /// must be fsynced too.
    dir_dirty: bool,
    cursor: Mutex<Option<ReadCursor>>,
}

impl Spool {
    /// Opens (creating if needed) the spool in `dir` for one writer.
    ///
    /// Takes an exclusive flock on `dir/lock` ([`SpoolError::Busy`] if any
    /// other handle holds it, even in this process), then recovers: every
    /// segment is scanned, each record's CRC verified, and a segment stops at
    /// its first zero length or bad record (a torn tail). Numbering continues
    /// after the highest valid or acknowledged seq, in a fresh segment.
    pub fn open(dir: &Path, options: SpoolOptions) -> Result<Spool, SpoolError> {
        fs::create_dir_all(dir).map_err(SpoolError::io("create spool directory", dir))?;
        Self::open_locked(dir, Self::lock(dir)?, options)
    }

    /// Opens a spool that another process left, without ever creating its
    /// directory: [`SpoolError::Busy`] while a live process holds it,
    /// [`SpoolError::Gone`] once the directory was removed.
    pub fn open_existing(dir: &Path, options: SpoolOptions) -> Result<Spool, SpoolError> {
        Self::open_locked(dir, Self::lock(dir)?, options)
    }

    /// Takes the exclusive flock on `dir/lock` (created if missing) without
    /// waiting: [`SpoolError::Busy`] if any other handle holds it, even in
    /// this process. A lock taken on a file that is no longer `dir/lock`
    /// (its holder removed the directory meanwhile) guards nothing:
    /// [`SpoolError::Gone`].
    pub fn lock(dir: &Path) -> Result<SpoolLock, SpoolError> {
        lock_dir(dir).map(SpoolLock)
    }

    /// [`Spool::open`] with the lock already held (see [`Spool::lock`]);
    /// `dir` must be where the lock's directory is now.
    pub fn open_locked(
        dir: &Path,
        lock: SpoolLock,
        options: SpoolOptions,
    ) -> Result<Spool, SpoolError> {
        let lock = lock.0;
        let acked = read_acked(dir)?;
        let mut sealed = Vec::new();
        let mut last_seq = acked;
        for (first_seq, path) in list_segments(dir)? {
            let Some(segment) = recover_segment(&path, first_seq)? else {
                remove_file(&path)?;
                continue;
            };
            last_seq = last_seq.max(segment.last_seq());
            if segment.last_seq() <= acked {
                // A crash between persisting the ack and deleting the segment.
                remove_file(&path)?;
                continue;
            }
            sealed.push(segment);
        }
        tracing::debug!(
            dir = %dir.display(),
            segments = sealed.len(),
            acked,
            last_seq,
            "opened spool"
        );
        Ok(Spool {
            dir: dir.to_path_buf(),
            options,
            lock: Some(lock),
            sealed,
            active: None,
            last_seq,
            acked,
            dir_dirty: false,
            cursor: Mutex::new(None),
        })
    }

    /// Appends one record and returns its sequence number: 1 for the first
    /// record ever written to this directory, then one more each time, across
    /// reopenings. Once this returns, the record survives a process kill.
    pub fn append(&mut self, payload: &[u8]) -> Result<u64, SpoolError> {
        if self.lock.is_none() {
            return Err(SpoolError::Closed {
                dir: self.dir.clone(),
            });
        }
        if payload.len() > MAX_PAYLOAD {
            return Err(SpoolError::TooLarge {
                len: payload.len(),
                max: MAX_PAYLOAD,
            });
        }
        let record_len = record_len(payload.len());
        let seq = self.last_seq + 1;
        match self.active.as_mut() {
            Some(segment) if segment.has_room(record_len) => {
                segment.write(seq, payload, record_len);
            }
            _ => self
                .start_segment(seq, record_len)?
                .write(seq, payload, record_len),
        }
        self.last_seq = seq;
        Ok(seq)
    }

    /// Flushes every record appended since the last sync to stable storage
    /// (msync), plus the directory entries of new segment files, so they
    /// survive power loss.
    pub fn sync(&mut self) -> Result<(), SpoolError> {
        for segment in self.sealed.iter_mut().chain(self.active.iter_mut()) {
            segment.flush_unsynced()?;
        }
        if self.dir_dirty {
            fsync_dir(&self.dir)?;
            self.dir_dirty = false;
        }
        Ok(())
    }

    /// Records with seq greater than `after`, in order, as `(seq, payload)`.
    /// Stops before the total payload bytes would exceed `max_bytes`, but
    /// always returns at least one record if there is one.
    pub fn read_after(
        &self,
        after: u64,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, SpoolError> {
        let mut records = Vec::new();
        if after >= self.last_seq {
            return Ok(records);
        }
        let wanted = after + 1;
        let mut cursor = self.cursor.lock();
        // Segments are ordered and so are their seqs: the first one holding a
        // record >= `wanted` is where reading starts.
        let start = self.sealed.partition_point(|s| s.next_seq <= wanted);
        let segments = self.sealed[start..].iter().chain(self.active.iter());
        let mut total = 0usize;
        let mut stopped_at = None;
        'segments: for segment in segments {
            let mut at = match *cursor {
                Some(c) if c.next_seq == wanted && c.segment_first_seq == segment.first_seq => {
                    c.offset
                }
                _ => 0,
            };
            while let Some(record) = record_at(&segment.map, at, segment.end) {
                if record.seq > after {
                    if !records.is_empty() && total + record.payload.len() > max_bytes {
                        break 'segments;
                    }
                    total += record.payload.len();
                    records.push((record.seq, record.payload.to_vec()));
                    stopped_at = Some(ReadCursor {
                        next_seq: record.seq + 1,
                        segment_first_seq: segment.first_seq,
                        offset: record.next_offset,
                    });
                }
                at = record.next_offset;
            }
        }
        if stopped_at.is_some() {
            *cursor = stopped_at;
        }
        Ok(records)
    }

    /// Records that the server holds every record up to and including
    /// `watermark`: persists it to `dir/acked` (write, rename, fsync of the
    /// directory) and deletes the segment files it fully covers, except the
    /// one being written. A watermark at or below the current one is a stale
    /// ack and changes nothing.
    pub fn ack(&mut self, watermark: u64) -> Result<(), SpoolError> {
        if watermark <= self.acked {
            return Ok(());
        }
        if watermark > self.last_seq {
            return Err(SpoolError::AckBeyondEnd {
                watermark,
                last_seq: self.last_seq,
                dir: self.dir.clone(),
            });
        }
        write_acked(&self.dir, watermark)?;
        self.acked = watermark;
        // Persisting first means a crash mid-deletion leaves segments that the
        // next open recognises as acked and removes.
        let covered = self.sealed.partition_point(|s| s.last_seq() <= watermark);
        for (removed, segment) in self.sealed[..covered].iter().enumerate() {
            if let Err(err) = remove_file(&segment.path) {
                // Keep what is still on disk listed, so a later ack retries it.
                self.sealed.drain(..removed);
                return Err(err);
            }
        }
        self.sealed.drain(..covered);
        Ok(())
    }

    /// Syncs, unmaps every segment and releases the lock, so that another
    /// process (`relaunch sync`) may open the directory while this handle
    /// lives on. Appends fail afterwards and reads find nothing.
    pub fn close(&mut self) -> Result<(), SpoolError> {
        if self.lock.is_none() {
            return Ok(());
        }
        self.sync()?;
        self.sealed.clear();
        self.active = None;
        *self.cursor.lock() = None;
        self.last_seq = self.acked;
        self.lock = None;
        Ok(())
    }

    /// Highest acknowledged seq, 0 if none.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Highest appended seq, 0 if none.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Records appended but not yet acknowledged.
    pub fn pending(&self) -> u64 {
        self.last_seq.saturating_sub(self.acked)
    }

    /// The spool directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether this handle still holds the directory's lock (until
    /// [`Spool::close`]).
    pub fn is_locked(&self) -> bool {
        self.lock.is_some()
    }

    /// Seals the active segment and starts a new one whose first record is
    /// `first_seq`, large enough for a record of `record_len` bytes.
    fn start_segment(
        &mut self,
        first_seq: u64,
        record_len: usize,
    ) -> Result<&mut Segment, SpoolError> {
        if let Some(old) = self.active.take() {
            if old.last_seq() <= self.acked {
                // Acknowledged while it was active, so nothing in it is needed.
                // A failed removal must not fail the append; the next open
                // removes the file anyway.
                if let Err(err) = remove_file(&old.path) {
                    tracing::warn!(error = %err, "could not remove acknowledged spool segment");
                }
            } else {
                self.sealed.push(old);
            }
        }
        let path = segment_path(&self.dir, first_seq);
        let size = self.options.segment_bytes.max(record_len + TERMINATOR);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(SpoolError::io("create segment", &path))?;
        // A sparse preallocation: no disk blocks until records land, and the
        // zeros double as "no record here".
        file.set_len(size as u64)
            .map_err(SpoolError::io("preallocate segment", &path))?;
        // SAFETY: the file was just created by this process (create_new) and
        // the exclusive flock on `dir/lock` keeps every other spool handle from
        // touching it, so nothing resizes or rewrites it under the mapping.
        let map =
            unsafe { MmapMut::map_mut(&file) }.map_err(SpoolError::io("map segment", &path))?;
        self.dir_dirty = true;
        tracing::trace!(path = %path.display(), size, "started spool segment");
        Ok(self.active.insert(Segment {
            path,
            first_seq,
            next_seq: first_seq,
            end: 0,
            synced: 0,
            map,
        }))
    }
}

/// Size of a record with a payload of `payload_len` bytes, padded so the next
/// record's u64 seq stays 8-byte aligned.
fn record_len(payload_len: usize) -> usize {
    (HEADER + payload_len + 7) & !7
}

/// One record as stored in a segment.
struct RecordRef<'a> {
    seq: u64,
    payload: &'a [u8],
    next_offset: usize,
}

/// The record at `at`, if a record starts there before `end`. Only used on
/// ranges already validated by recovery or written by this process.
fn record_at(map: &[u8], at: usize, end: usize) -> Option<RecordRef<'_>> {
    if at >= end {
        return None;
    }
    let len = read_u32(map, at)? as usize;
    let payload_len = len.checked_sub(1)?;
    let seq = read_u64(map, at + 8)?;
    let payload = map.get(at + HEADER..at + HEADER + payload_len)?;
    Some(RecordRef {
        seq,
        payload,
        next_offset: at + record_len(payload_len),
    })
}

fn read_u32(map: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(map.get(at..at + 4)?.try_into().ok()?))
}

fn read_u64(map: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(map.get(at..at + 8)?.try_into().ok()?))
}

/// Why a recovery scan stopped before the segment's zero terminator.
#[derive(Debug, Clone, Copy)]
enum TornReason {
    PastEndOfFile,
    SeqOutOfOrder,
    ChecksumMismatch,
}

/// Scans `map` from the start, returning the end offset and next seq of the
/// valid prefix, and why it stopped early if it did.
fn scan(map: &[u8], first_seq: u64) -> (usize, u64, Option<TornReason>) {
    let mut at = 0;
    let mut expected = first_seq;
    loop {
        let len = match read_u32(map, at) {
            Some(len) if at + HEADER <= map.len() => len,
            // Too close to the end of the file for another header.
            _ => return (at, expected, None),
        };
        let Some(payload_len) = (len as usize).checked_sub(1) else {
            return (at, expected, None);
        };
        // The crc covers the seq bytes and the payload, which are contiguous.
        let (Some(stored_crc), Some(seq), Some(covered)) = (
            read_u32(map, at + 4),
            read_u64(map, at + 8),
            map.get(at + 8..at + HEADER + payload_len),
        ) else {
            return (at, expected, Some(TornReason::PastEndOfFile));
        };
        if seq != expected {
            return (at, expected, Some(TornReason::SeqOutOfOrder));
        }
        if crc32fast::hash(covered) != stored_crc {
            return (at, expected, Some(TornReason::ChecksumMismatch));
        }
        at = (at + record_len(payload_len)).min(map.len());
        expected += 1;
    }
}

/// Maps and scans one segment; `None` if it holds no valid record.
fn recover_segment(path: &Path, first_seq: u64) -> Result<Option<Segment>, SpoolError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(SpoolError::io("open segment", path))?;
    let size = file
        .metadata()
        .map_err(SpoolError::io("stat segment", path))?
        .len();
    if size < (HEADER + 1) as u64 {
        // Created but never written (a crash right after creation).
        return Ok(None);
    }
    // SAFETY: the exclusive flock on `dir/lock`, taken before recovery, keeps
    // every other spool handle from resizing or writing this file while mapped.
    let map = unsafe { MmapMut::map_mut(&file) }.map_err(SpoolError::io("map segment", path))?;
    let (end, next_seq, torn) = scan(&map, first_seq);
    if let Some(reason) = torn {
        tracing::warn!(
            path = %path.display(),
            offset = end,
            ?reason,
            "spool segment has a torn tail; records from here on are dropped"
        );
    }
    if next_seq == first_seq {
        return Ok(None);
    }
    Ok(Some(Segment {
        path: path.to_path_buf(),
        first_seq,
        next_seq,
        end,
        // Survived a kill in the page cache, but maybe not yet on disk.
        synced: 0,
        map,
    }))
}

fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("{SEGMENT_PREFIX}{first_seq:020}{SEGMENT_SUFFIX}"))
}

/// Segment files in `dir` as `(first_seq, path)`, ordered by seq.
fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, SpoolError> {
    let mut segments = Vec::new();
    let entries = fs::read_dir(dir).map_err(SpoolError::io("list spool directory", dir))?;
    for entry in entries {
        let entry = entry.map_err(SpoolError::io("list spool directory", dir))?;
        let name = entry.file_name();
        let first_seq = name
            .to_str()
            .and_then(|n| n.strip_prefix(SEGMENT_PREFIX))
            .and_then(|n| n.strip_suffix(SEGMENT_SUFFIX))
            .filter(|digits| digits.len() == 20)
            .and_then(|digits| digits.parse::<u64>().ok());
        if let Some(first_seq) = first_seq.filter(|&seq| seq > 0) {
            segments.push((first_seq, entry.path()));
        }
    }
    segments.sort_unstable();
    Ok(segments)
}

/// Takes the exclusive flock on a freshly opened `dir/lock`. A fresh open
/// file description per call means a second open in the same process is
/// refused too.
fn lock_dir(dir: &Path) -> Result<Flock<File>, SpoolError> {
    use std::os::unix::fs::MetadataExt as _;

    let gone = || SpoolError::Gone {
        dir: dir.to_path_buf(),
    };
    let path = dir.join(LOCK_FILE);
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(gone()),
        Err(e) => return Err(SpoolError::io("open lock file", &path)(e)),
    };
    let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((_, Errno::EWOULDBLOCK)) => {
            return Err(SpoolError::Busy {
                dir: dir.to_path_buf(),
            });
        }
        Err((_, errno)) => {
            return Err(SpoolError::Io {
                op: "lock",
                path,
                source: errno.into(),
            });
        }
    };
    // The previous holder may have removed the directory between our open and
    // our flock; then the file we locked is no longer `dir/lock`.
    let locked = lock.metadata().map_err(SpoolError::io("read", &path))?;
    match fs::symlink_metadata(&path) {
        Ok(now) if now.dev() == locked.dev() && now.ino() == locked.ino() => Ok(lock),
        Ok(_) => Err(gone()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(gone()),
        Err(e) => Err(SpoolError::io("read", &path)(e)),
    }
}

fn read_acked(dir: &Path) -> Result<u64, SpoolError> {
    let path = dir.join(ACKED_FILE);
    let contents = match fs::read_to_string(&path) {
        Ok(contents) => contents,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(err) => return Err(SpoolError::io("read acknowledged watermark", &path)(err)),
    };
    contents
        .trim()
        .parse()
        .map_err(|_| SpoolError::CorruptAck { path, contents })
}

/// Replaces `dir/acked` atomically: a crash leaves either the old or the new
/// watermark, never a half-written one.
fn write_acked(dir: &Path, watermark: u64) -> Result<(), SpoolError> {
    let temp = dir.join(ACKED_TEMP_FILE);
    let path = dir.join(ACKED_FILE);
    let mut file = File::create(&temp).map_err(SpoolError::io("create", &temp))?;
    file.write_all(watermark.to_string().as_bytes())
        .map_err(SpoolError::io("write", &temp))?;
    file.sync_all().map_err(SpoolError::io("fsync", &temp))?;
    fs::rename(&temp, &path).map_err(SpoolError::io("rename into place", &path))?;
    fsync_dir(dir)
}

fn fsync_dir(dir: &Path) -> Result<(), SpoolError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(SpoolError::io("fsync spool directory", dir))
}

/// Removes a file, treating "already gone" as done.
fn remove_file(path: &Path) -> Result<(), SpoolError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(SpoolError::io("remove segment", path)(err)),
    }
}

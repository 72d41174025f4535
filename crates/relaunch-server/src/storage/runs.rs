//! Run-level rules every backend applies the same way: new run ids, which
//! project a resumed run keeps, attempts' order, what stored JSON columns
//! decode to, the messages of what is not found, and how much a page of
//! console lines holds.

use std::collections::HashMap;

use relaunch_api::{ChunkRef, LogLine, Series, SeriesPoint, SeriesQuery};
use serde_json::Value;

use super::StorageError;

/// A wall time as stored: the caller's when finite, else 0.
pub fn now_or(t: f64) -> f64 {
    if t.is_finite() { t } else { 0.0 }
}

pub fn new_run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// What opening an existing run does to its project.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProjectRule {
    /// No project named, or the run's own.
    Keep,
    /// The run was opened without a project so far: the first one named
    /// becomes its project.
    Adopt,
    /// Another project: refused ([`project_conflict`]).
    Refuse,
}

/// `named`: the caller named a project; `same`: it is the run's;
/// `set`: the run's project was named by some caller before.
pub fn project_rule(named: bool, same: bool, set: bool) -> ProjectRule {
    match (named && !same, set) {
        (false, _) => ProjectRule::Keep,
        (true, false) => ProjectRule::Adopt,
        (true, true) => ProjectRule::Refuse,
    }
}

pub fn project_conflict(id: &str, theirs: &str, asked: &str) -> StorageError {
    StorageError::Conflict(format!(
        "run {id:?} belongs to project {theirs:?}, not {asked:?}; \
         use another run id or that project"
    ))
}

/// Each attempt's place when sorted by start (then number), from the
/// attempts in that order: larger is newer.
pub fn attempt_order(sorted: impl IntoIterator<Item = u32>) -> HashMap<u32, u32> {
    sorted
        .into_iter()
        .enumerate()
        .map(|(i, a)| (a, i as u32))
        .collect()
}

/// Tags as stored: a JSON array of strings.
pub fn tags_json(tags: &[String]) -> String {
    serde_json::to_string(tags).unwrap_or_else(|_| "[]".into())
}

pub fn tags_from(text: &str) -> Vec<String> {
    serde_json::from_str(text).unwrap_or_default()
}

/// Config and event data as stored: JSON text, kept exactly as sent.
pub fn json_from(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// A file's chunk list as stored: a JSON array of `{hash, size}`.
pub fn chunks_json(chunks: &[ChunkRef]) -> Result<String, StorageError> {
    serde_json::to_string(chunks).map_err(|e| StorageError::Invalid(e.to_string()))
}

pub fn chunks_from(text: &str, run: &str, name: &str) -> Result<Vec<ChunkRef>, StorageError> {
    serde_json::from_str(text).map_err(|e| {
        StorageError::Corrupt(format!(
            "the chunk list of file {name:?} of run {run:?}: {e}"
        ))
    })
}

/// A series read's answer.
pub fn series(query: &SeriesQuery, rank: u32, total: u64, points: Vec<SeriesPoint>) -> Series {
    Series {
        key: query.key.clone(),
        rank,
        total,
        downsampled: points.len() as u64 != total,
        points,
    }
}

pub fn no_run(id: &str) -> StorageError {
    StorageError::NotFound(format!("no run {id:?}"))
}

pub fn no_metric(run: &str, key: &str) -> StorageError {
    StorageError::NotFound(format!("run {run:?} has no metric {key:?}"))
}

pub fn no_file(run: &str, name: &str) -> StorageError {
    StorageError::NotFound(format!("run {run:?} has no file {name:?}"))
}

/// The folders above a file name (`a`, `a/b` for `a/b/c`): none of them
/// may be a file of the run too.
pub fn folders_of(name: &str) -> Vec<&str> {
    name.match_indices('/').map(|(at, _)| &name[..at]).collect()
}

/// A file name that would make `other` (a file of the run) a folder, or a
/// folder of `other`: `dir` and `dir/file` cannot both be files, or no
/// file system could hold the run's files as they are named.
pub fn file_or_folder(run: &str, name: &str, other: &str) -> StorageError {
    let (file, below) = if name.len() < other.len() {
        (name, other)
    } else {
        (other, name)
    };
    StorageError::Conflict(format!(
        "run {run:?} already has a file {other:?}, so {name:?} cannot be one: {file:?} would \
         be both a file and the folder of {below:?}. Delete {other:?} first, or choose another \
         name"
    ))
}

/// Listings and pages return at most this many rows.
pub const MAX_PAGE: u32 = 100_000;

/// Bytes of text a page of console lines holds at most: lines are taken
/// until their text reaches it (the first line always, however long), so
/// a page of huge lines is not read whole into memory. A client that gets
/// fewer lines than it asked for asks again after the last one.
pub const LOG_PAGE_BYTES: usize = 8 << 20;

/// The lines of `rows`, in order, taken until their text reaches
/// [`LOG_PAGE_BYTES`]; the rest are not read.
pub fn log_page<E>(rows: impl Iterator<Item = Result<LogLine, E>>) -> Result<Vec<LogLine>, E> {
    let mut page = Vec::new();
    let mut bytes = 0;
    for row in rows {
        let line = row?;
        bytes += line.text.len();
        page.push(line);
        if bytes >= LOG_PAGE_BYTES {
            break;
        }
    }
    Ok(page)
}

//! `relaunch server migrate`: every project, run and file of one storage
//! copied into another (a data directory into PostgreSQL + S3, or back),
//! through the backends' [`Transfer`] rows and [`BlobStore`] chunks.
//!
//! **Resuming.** Each run is written in one target transaction, after the
//! chunks of its files are in the target's chunk store (each sent only if
//! missing, and persisted before the run commits, so a committed file
//! never names a chunk the target lacks). A migration killed anywhere
//! leaves every run either whole in the target or absent; running it again
//! skips the runs already there and copies the rest.
//!
//! **Conflicts.** A run id already in the target is skipped only when it
//! is the same run: the same head (row, attempts, writers, files, latest
//! values) and the same row counts. Otherwise the migration stops before
//! it copies anything, naming the runs: nothing is merged. Runs of the
//! target that the source does not have are never touched.
//!
//! **Checking.** The end compares, table by table, what the source's runs
//! have with what the target has of those runs (and of the file chunks
//! they name, present in the target's store at their size).

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use crate::storage::StorageError;
use crate::storage::blobs::BlobStore;
use crate::storage::runs;
use crate::storage::transfer::{CHUNK_PAGE, ROW_PAGE, RunCounts, RunHead, Transfer};

/// Test-only: `N` makes a migration stop before committing the `N`th run
/// it copies and wait there forever, so a test can kill it mid-run.
pub const PAUSE_ENV: &str = "RELAUNCH_MIGRATE_TEST_PAUSE";

/// One side of a migration: its rows and its chunks.
pub struct Side {
    pub rows: Box<dyn Transfer>,
    pub blobs: Arc<dyn BlobStore>,
    /// Where the chunks are, for messages.
    pub blobs_place: String,
}

impl std::fmt::Debug for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side")
            .field("rows", &self.rows.place())
            .field("blobs", &self.blobs_place)
            .finish()
    }
}

/// What a migration tells as it goes.
#[derive(Debug)]
pub enum Progress<'a> {
    /// Runs in the source, and how many of them the target already has.
    Planned { runs: usize, present: usize },
    Copied {
        run: &'a str,
        /// 1-based, of `total` runs to copy.
        index: usize,
        total: usize,
        points: u64,
        lines: u64,
        chunks_sent: usize,
        chunks_present: usize,
    },
    /// The test hook ([`PAUSE_ENV`]) holds the migration here.
    Paused { run: &'a str },
}

#[derive(Clone, Debug, Default)]
pub struct Options {
    /// See [`PAUSE_ENV`].
    pub pause_before_commit: Option<usize>,
}

/// One line of the closing comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Count {
    pub table: &'static str,
    pub source: u64,
    pub target: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub copied: usize,
    pub skipped: usize,
    pub counts: Vec<Count>,
}

impl Report {
    /// Every table has as many rows in the target as in the source.
    pub fn matches(&self) -> bool {
        self.counts.iter().all(|c| c.source == c.target)
    }
}

/// Copies what `target` lacks of `source`, then counts both.
pub fn migrate(
    source: &mut Side,
    target: &mut Side,
    options: &Options,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Report, StorageError> {
    let projects = source.rows.projects()?;
    let ids = source.rows.run_ids()?;
    let (todo, present) = plan(source, target, &ids)?;
    progress(Progress::Planned {
        runs: ids.len(),
        present: present.len(),
    });
    target.rows.add_projects(&projects)?;
    for (i, id) in todo.iter().enumerate() {
        let pause = options.pause_before_commit == Some(i + 1);
        let copied = copy_run(source, target, id, pause, progress)?;
        progress(Progress::Copied {
            run: id,
            index: i + 1,
            total: todo.len(),
            points: copied.points,
            lines: copied.lines,
            chunks_sent: copied.chunks_sent,
            chunks_present: copied.chunks_present,
        });
    }
    let counts = compare(source, target, &projects, &ids)?;
    Ok(Report {
        copied: todo.len(),
        skipped: present.len(),
        counts,
    })
}

/// The runs to copy, and those the target has already (the same run).
/// Refuses when the target has a different run under a source run's id.
fn plan(
    source: &mut Side,
    target: &mut Side,
    ids: &[String],
) -> Result<(Vec<String>, Vec<String>), StorageError> {
    let (mut todo, mut present, mut conflicts) = (Vec::new(), Vec::new(), Vec::new());
    for id in ids {
        let Some(theirs) = target.rows.run_head(id)? else {
            todo.push(id.clone());
            continue;
        };
        let ours = head(source, id)?;
        let same = ours == theirs && source.rows.run_counts(id)? == target.rows.run_counts(id)?;
        if same {
            present.push(id.clone());
        } else {
            conflicts.push(id.clone());
        }
    }
    if conflicts.is_empty() {
        return Ok((todo, present));
    }
    let shown: Vec<&str> = conflicts.iter().take(5).map(String::as_str).collect();
    let more = match conflicts.len() {
        n if n > shown.len() => format!(" and {} more", n - shown.len()),
        _ => String::new(),
    };
    Err(StorageError::Conflict(format!(
        "{} run(s) are in both the source and the target ({}) with different content: {}{more}; \
         nothing was copied. Delete them from the target, or migrate into another --database \
         or --to",
        conflicts.len(),
        target.rows.place(),
        shown.join(", ")
    )))
}

fn head(side: &mut Side, id: &str) -> Result<RunHead, StorageError> {
    side.rows
        .run_head(id)?
        .ok_or_else(|| StorageError::Corrupt(format!("run {id} vanished from the source")))
}

struct Copied {
    points: u64,
    lines: u64,
    chunks_sent: usize,
    chunks_present: usize,
}

fn copy_run(
    source: &mut Side,
    target: &mut Side,
    id: &str,
    pause: bool,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Copied, StorageError> {
    let head = head(source, id)?;
    // Chunks first, durable before the run (and its manifests) commits.
    let hashes = file_chunks(&head)?;
    let missing = target.blobs.missing(&hashes)?;
    for hash in &missing {
        let data = source.blobs.get(hash).map_err(|e| {
            StorageError::Backend(format!(
                "cannot read chunk {hash} of run {id} from {}: {e}",
                source.blobs_place
            ))
        })?;
        target.blobs.put(hash, &data)?;
    }
    target.blobs.persist(&hashes)?;
    let (mut points, mut lines) = (0u64, 0u64);
    let mut writer = target.rows.begin_run(&head)?;
    let mut after = 0;
    loop {
        let page = source.rows.chunk_page(id, after, CHUNK_PAGE)?;
        let Some((last, _)) = page.last() else { break };
        after = *last;
        let rows: Vec<_> = page.into_iter().map(|(_, row)| row).collect();
        points += rows.iter().map(|r| r.count.unsigned_abs()).sum::<u64>();
        writer.chunks(&rows)?;
    }
    after = 0;
    loop {
        let page = source.rows.log_page(id, after, ROW_PAGE)?;
        let Some((last, _)) = page.last() else { break };
        after = *last;
        let rows: Vec<_> = page.into_iter().map(|(_, row)| row).collect();
        lines += rows.len() as u64;
        writer.logs(&rows)?;
    }
    after = 0;
    loop {
        let page = source.rows.event_page(id, after, ROW_PAGE)?;
        let Some((last, _)) = page.last() else { break };
        after = *last;
        let rows: Vec<_> = page.into_iter().map(|(_, row)| row).collect();
        writer.events(&rows)?;
    }
    if pause {
        progress(Progress::Paused { run: id });
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    writer.commit()?;
    Ok(Copied {
        points,
        lines,
        chunks_sent: missing.len(),
        chunks_present: hashes.len() - missing.len(),
    })
}

/// The distinct chunks the run's files name, in order of first use.
fn file_chunks(head: &RunHead) -> Result<Vec<String>, StorageError> {
    let mut seen = HashSet::new();
    let mut hashes = Vec::new();
    for file in &head.files {
        for chunk in runs::chunks_from(&file.chunks, &head.run.id, &file.name)? {
            if seen.insert(chunk.hash.clone()) {
                hashes.push(chunk.hash);
            }
        }
    }
    Ok(hashes)
}

/// Source against target, table by table, over the source's runs.
fn compare(
    source: &mut Side,
    target: &mut Side,
    projects: &[String],
    ids: &[String],
) -> Result<Vec<Count>, StorageError> {
    let theirs: BTreeSet<String> = target.rows.projects()?.into_iter().collect();
    let mut counts = vec![Count {
        table: "projects",
        source: projects.len() as u64,
        target: projects.iter().filter(|p| theirs.contains(*p)).count() as u64,
    }];
    let (mut runs_there, mut ours, mut theirs) = (0u64, RunCounts::default(), RunCounts::default());
    let (mut chunks_ours, mut chunks_theirs) = (0u64, 0u64);
    for id in ids {
        ours += source.rows.run_counts(id)?;
        let Some(their_head) = target.rows.run_head(id)? else {
            continue;
        };
        runs_there += 1;
        theirs += target.rows.run_counts(id)?;
        let wanted = sized_chunks(&head(source, id)?)?;
        chunks_ours += wanted.len() as u64;
        let named: BTreeSet<(String, u64)> = sized_chunks(&their_head)?.into_iter().collect();
        let hashes: Vec<String> = wanted.iter().map(|(h, _)| h.clone()).collect();
        let sizes = target.blobs.sizes(&hashes)?;
        chunks_theirs += wanted
            .iter()
            .zip(sizes)
            .filter(|((hash, size), stored)| {
                *stored == Some(*size) && named.contains(&(hash.clone(), *size))
            })
            .count() as u64;
    }
    counts.push(Count {
        table: "runs",
        source: ids.len() as u64,
        target: runs_there,
    });
    for ((table, source), (_, target)) in ours.tables().into_iter().zip(theirs.tables()) {
        counts.push(Count {
            table,
            source,
            target,
        });
    }
    counts.push(Count {
        table: "file chunks",
        source: chunks_ours,
        target: chunks_theirs,
    });
    Ok(counts)
}

/// The distinct (chunk, size) pairs a run's files name.
fn sized_chunks(head: &RunHead) -> Result<Vec<(String, u64)>, StorageError> {
    let mut set = BTreeSet::new();
    for file in &head.files {
        for chunk in runs::chunks_from(&file.chunks, &head.run.id, &file.name)? {
            set.insert((chunk.hash, chunk.size));
        }
    }
    Ok(set.into_iter().collect())
}

//! `relaunch files sync`: a local directory and a run's files (under a
//! prefix) made the same, one way, sending only what differs (rsync for
//! runs).
//!
//! - **What is compared**: size first; equal sizes are compared by BLAKE3,
//!   except where the sync cache says the local file is unchanged since a
//!   sync that saw it with that hash (same size and modification time, as
//!   rsync's quick check). The cache is one JSON file per (server, run,
//!   prefix, directory) under `$XDG_CACHE_HOME/relaunch/sync/` (else
//!   `~/.cache/...`); it only saves hashing, and a lost or damaged cache
//!   costs one hash of each file.
//! - **What travels**: an upload sends only the chunks the server lacks, so
//!   a log that only grew sends its new tail (and the chunk it ended in); a
//!   download resumes and verifies its BLAKE3.
//! - **Filters**: rsync's `--include`/`--exclude` rules, in the order given,
//!   the first that matches a path deciding (none: included): `*` and `?`
//!   stay inside one path part, `**` crosses them; a pattern with a `/` (or
//!   `**`) is matched against the whole relative path (at its end, unless it
//!   starts with `/`, which anchors it at the top), one without against the
//!   last part; a trailing `/` matches directories only, and an excluded
//!   directory is not entered.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::stream::{self, StreamExt};
use globset::{GlobBuilder, GlobMatcher};
use relaunch_api::files::check_file_name;
use serde::{Deserialize, Serialize};

use crate::error::ClientError;
use crate::files::{Progress, download, hash_file, partial_path, upload};
use crate::http::Client;

/// Files sent (or fetched) at once: small files cost a few round trips
/// each, which overlap; each upload also sends its chunks in parallel.
const FILES_AT_ONCE: usize = 8;

/// One `--include` / `--exclude` rule.
#[derive(Clone, Debug)]
struct Rule {
    include: bool,
    dir_only: bool,
    whole_path: bool,
    matcher: GlobMatcher,
}

/// rsync's include/exclude rules, first match wins.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    rules: Vec<Rule>,
}

impl Filter {
    /// `rules`: (include?, pattern) in the order given on the command line.
    pub fn new(rules: &[(bool, String)]) -> Result<Self, String> {
        let mut compiled = Vec::new();
        for (include, text) in rules {
            let flag = if *include { "--include" } else { "--exclude" };
            let mut pattern = text.as_str();
            let dir_only = pattern.len() > 1 && pattern.ends_with('/');
            if dir_only {
                pattern = &pattern[..pattern.len() - 1];
            }
            let anchored = pattern.starts_with('/');
            if anchored {
                pattern = &pattern[1..];
            }
            if pattern.is_empty() {
                return Err(format!("{flag} {text:?}: an empty pattern matches nothing"));
            }
            let whole_path = anchored || pattern.contains('/') || pattern.contains("**");
            let glob = if whole_path && !anchored {
                format!("**/{pattern}")
            } else {
                pattern.to_owned()
            };
            let matcher = GlobBuilder::new(&glob)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| format!("{flag} {text:?} is not a pattern: {e}"))?
                .compile_matcher();
            compiled.push(Rule {
                include: *include,
                dir_only,
                whole_path,
                matcher,
            });
        }
        Ok(Self { rules: compiled })
    }

    /// Whether the relative path `rel` (`/`-separated) is synced.
    pub fn includes(&self, rel: &str, is_dir: bool) -> bool {
        let last = rel.rsplit('/').next().unwrap_or(rel);
        for rule in &self.rules {
            if rule.dir_only && !is_dir {
                continue;
            }
            let target = if rule.whole_path { rel } else { last };
            if rule.matcher.is_match(target) {
                return rule.include;
            }
        }
        true
    }

    /// Whether `rel`, a file, is synced: each of its directories must be
    /// (an excluded directory is not entered), then the file itself.
    fn includes_file(&self, rel: &str) -> bool {
        let mut end = 0;
        while let Some(slash) = rel[end..].find('/') {
            end += slash;
            if !self.includes(&rel[..end], true) {
                return false;
            }
            end += 1;
        }
        self.includes(rel, false)
    }
}

/// A local file to sync.
#[derive(Clone, Debug)]
pub struct LocalFile {
    /// Relative, `/`-separated.
    pub rel: String,
    pub path: PathBuf,
    pub size: u64,
    pub mtime_ns: u128,
}

/// What a walk of the local directory found.
#[derive(Debug, Default)]
pub struct Walked {
    pub files: Vec<LocalFile>,
    /// Files and directories the rules left out.
    pub excluded: usize,
    /// Symbolic links and special files, which are not synced.
    pub skipped: Vec<String>,
}

fn mtime_ns(meta: &std::fs::Metadata) -> u128 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

/// Threads that read directories at once: a tree of small files costs
/// system calls (a `getdents` per directory, a `statx` per file), which
/// several cores share.
const WALKERS: usize = 4;

/// The directories a walk has yet to read, and how many are being read.
struct WalkQueue {
    todo: Vec<(PathBuf, String)>,
    busy: usize,
    failed: Option<ClientError>,
}

/// The files under `root` the filter keeps, in name order (links and
/// special files, which are not synced, in `skipped`, also in name order).
pub fn walk(root: &Path, filter: &Filter) -> Result<Walked, ClientError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(WALKERS));
    let queue = std::sync::Mutex::new(WalkQueue {
        todo: vec![(root.to_path_buf(), String::new())],
        busy: 0,
        failed: None,
    });
    let ready = std::sync::Condvar::new();
    let parts: Vec<Walked> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| scope.spawn(|| walk_worker(&queue, &ready, filter)))
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_default())
            .collect()
    });
    let queue = queue
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(e) = queue.failed {
        return Err(e);
    }
    let mut walked = Walked::default();
    for part in parts {
        walked.files.extend(part.files);
        walked.excluded += part.excluded;
        walked.skipped.extend(part.skipped);
    }
    walked.files.sort_unstable_by(|a, b| a.rel.cmp(&b.rel));
    walked.skipped.sort_unstable();
    Ok(walked)
}

/// One walking thread: takes a directory, reads it, queues its
/// subdirectories; ends when none is left and none is being read.
fn walk_worker(
    queue: &std::sync::Mutex<WalkQueue>,
    ready: &std::sync::Condvar,
    filter: &Filter,
) -> Walked {
    let lock = || {
        queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    let mut walked = Walked::default();
    loop {
        let (dir, prefix) = {
            let mut q = lock();
            loop {
                if q.failed.is_some() {
                    return walked;
                }
                if let Some(next) = q.todo.pop() {
                    q.busy += 1;
                    break next;
                }
                if q.busy == 0 {
                    return walked;
                }
                q = ready
                    .wait(q)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        };
        let mut found = Vec::new();
        let outcome = read_one_dir(&dir, &prefix, filter, &mut walked, &mut found);
        let mut q = lock();
        q.busy -= 1;
        match outcome {
            Ok(()) => q.todo.extend(found),
            Err(e) => {
                q.failed.get_or_insert(e);
            }
        }
        ready.notify_all();
    }
}

/// Reads one directory: its files into `walked`, its subdirectories the
/// filter keeps into `subdirs`. Only files are stat'ed (size, time): the
/// entry's type comes with the directory listing.
fn read_one_dir(
    dir: &Path,
    prefix: &str,
    filter: &Filter,
    walked: &mut Walked,
    subdirs: &mut Vec<(PathBuf, String)>,
) -> Result<(), ClientError> {
    for entry in std::fs::read_dir(dir).map_err(ClientError::io("read the directory", dir))? {
        let entry = entry.map_err(ClientError::io("read the directory", dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let mut rel = String::with_capacity(prefix.len() + 1 + name.len());
        if !prefix.is_empty() {
            rel.push_str(prefix);
            rel.push('/');
        }
        rel.push_str(&name);
        // Not following links: a link is neither a file nor a directory.
        let kind = entry
            .file_type()
            .map_err(|e| ClientError::io("stat", &entry.path())(e))?;
        if kind.is_dir() {
            if filter.includes(&rel, true) {
                subdirs.push((entry.path(), rel));
            } else {
                walked.excluded += 1;
            }
        } else if kind.is_file() {
            if filter.includes(&rel, false) {
                let path = entry.path();
                // From the directory's own handle (no path lookup).
                let meta = entry.metadata().map_err(ClientError::io("stat", &path))?;
                walked.files.push(LocalFile {
                    rel,
                    path,
                    size: meta.len(),
                    mtime_ns: mtime_ns(&meta),
                });
            } else {
                walked.excluded += 1;
            }
        } else if filter.includes(&rel, false) {
            walked.skipped.push(rel);
        }
    }
    Ok(())
}

/// What the cache remembers of a local file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Seen {
    size: u64,
    mtime_ns: u128,
    blake3: String,
}

/// The sync cache of one (server, run, prefix, directory).
#[derive(Debug)]
pub struct Cache {
    path: Option<PathBuf>,
    seen: HashMap<String, Seen>,
    changed: bool,
}

impl Cache {
    /// The cache for this pairing; empty when there is none or it is unreadable.
    pub fn open(server: &str, run: &str, prefix: &str, dir: &Path) -> Self {
        let root = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
        let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        let key =
            blake3::hash(format!("{server}\n{run}\n{prefix}\n{}", canonical.display()).as_bytes());
        let path = root.map(|r| {
            r.join("relaunch")
                .join("sync")
                .join(format!("{}.json", &key.to_hex()[..32]))
        });
        let seen = path
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        Self {
            path,
            seen,
            changed: false,
        }
    }

    /// The file's hash if the cache saw it with this size and time.
    fn hash_of(&self, file: &LocalFile) -> Option<&str> {
        self.seen
            .get(&file.rel)
            .filter(|s| s.size == file.size && s.mtime_ns == file.mtime_ns && s.mtime_ns != 0)
            .map(|s| s.blake3.as_str())
    }

    fn remember(&mut self, file: &LocalFile, blake3: &str) {
        let seen = Seen {
            size: file.size,
            mtime_ns: file.mtime_ns,
            blake3: blake3.to_owned(),
        };
        if self.seen.get(&file.rel) != Some(&seen) {
            self.seen.insert(file.rel.clone(), seen);
            self.changed = true;
        }
    }

    /// Writes the cache if it learnt something (temporary name, rename); a
    /// failure only costs hashing later.
    pub fn save(&self) {
        let Some(path) = &self.path else { return };
        if !self.changed {
            return;
        }
        let write = || -> std::io::Result<()> {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let temp = path.with_extension(format!("tmp-{}", std::process::id()));
            std::fs::write(&temp, serde_json::to_vec(&self.seen).unwrap_or_default())?;
            std::fs::rename(&temp, path)
        };
        if let Err(e) = write() {
            tracing::debug!(cache = %path.display(), error = %e, "cannot write the sync cache");
        }
    }
}

/// Whether the local file holds exactly `blake3`: from the cache, else hashed.
fn same_content(file: &LocalFile, blake3: &str, cache: &mut Cache) -> Result<bool, ClientError> {
    if cache.hash_of(file) == Some(blake3) {
        return Ok(true);
    }
    let hash = hash_file(&file.path)?;
    cache.remember(file, &hash);
    Ok(hash == blake3)
}

/// One file that needs sending (or fetching), and its size.
#[derive(Clone, Debug)]
pub struct Transfer {
    /// Local path.
    pub path: PathBuf,
    /// Name in the run.
    pub name: String,
    pub size: u64,
}

/// What a sync did (or, on a dry run, would do).
#[derive(Debug, Default)]
pub struct Report {
    /// Files to send or fetch.
    pub transfers: Vec<Transfer>,
    /// Files already the same on both sides.
    pub unchanged: usize,
    /// Paths the rules left out.
    pub excluded: usize,
    /// Local paths not synced: links, special files, names a run cannot hold.
    pub skipped: Vec<String>,
    /// Bytes that travelled (chunks the other side lacked).
    pub sent_bytes: u64,
    /// With `delete`: what the other side had and this side does not (names
    /// in the run on an upload, local paths on a download).
    pub deleted: Vec<String>,
}

/// How a sync runs: what it leaves out, whether it deletes, whether it acts.
#[derive(Debug, Default)]
pub struct Options {
    pub filter: Filter,
    /// Remove from the other side what this side does not have (rsync's
    /// `--delete`); paths the filter leaves out are never removed.
    pub delete: bool,
    /// Decide, and change nothing.
    pub dry_run: bool,
}

/// Progress over several files in flight at once: each file's callback
/// reports its own position, [`Overall::file`] turns that into the total.
struct Overall {
    done: AtomicU64,
    total: u64,
}

impl Overall {
    fn new(total: u64) -> Self {
        Self {
            done: AtomicU64::new(0),
            total,
        }
    }

    /// The callback for one file, passing the sum of every file's bytes on.
    fn file<'a>(&'a self, progress: &'a Progress<'_>) -> impl Fn(u64, u64) + Send + Sync + 'a {
        let seen = AtomicU64::new(0);
        move |position, _| {
            let grown = position.saturating_sub(seen.swap(position, Ordering::Relaxed));
            let now = self.done.fetch_add(grown, Ordering::Relaxed) + grown;
            progress(now, self.total);
        }
    }
}

/// `name` under `prefix`.
fn join_name(prefix: &str, rel: &str) -> String {
    if prefix.is_empty() {
        rel.to_owned()
    } else {
        format!("{prefix}/{rel}")
    }
}

/// What a sync needs of a file in the run's listing (the other fields
/// are skipped, not parsed).
#[derive(Debug, Deserialize)]
struct Listed {
    name: String,
    size: u64,
    blake3: String,
}

/// The run's files under `prefix`, by their path below it.
async fn remote_files(
    client: &Client,
    run: &str,
    prefix: &str,
) -> Result<HashMap<String, Listed>, ClientError> {
    let below = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    Ok(client
        .files_as::<Listed>(run)
        .await?
        .into_iter()
        .filter_map(|f| Some((f.name.strip_prefix(&below)?.to_owned(), f)))
        .collect())
}

/// Uploads what differs from `dir` to `run` under `prefix`; `dry_run`
/// decides without sending. `progress` sees bytes of the files being sent.
pub async fn push(
    client: &Client,
    dir: &Path,
    run: &str,
    prefix: &str,
    options: &Options,
    progress: &Progress<'_>,
) -> Result<Report, ClientError> {
    let (filter, dry_run) = (&options.filter, options.dry_run);
    // The walk (system calls) and the listing (the network) overlap.
    let walking = {
        let (dir, filter) = (dir.to_path_buf(), filter.clone());
        tokio::task::spawn_blocking(move || walk(&dir, &filter))
    };
    // The cache is read meanwhile too.
    let caching = {
        let (server, run, prefix, dir) = (
            client.url().to_owned(),
            run.to_owned(),
            prefix.to_owned(),
            dir.to_path_buf(),
        );
        tokio::task::spawn_blocking(move || Cache::open(&server, &run, &prefix, &dir))
    };
    let remote = remote_files(client, run, prefix).await?;
    let walked = walking
        .await
        .map_err(|e| ClientError::Config(format!("the directory walk failed: {e}")))??;
    let present: std::collections::HashSet<String> = walked
        .files
        .iter()
        .map(|f| f.rel.clone())
        .chain(walked.skipped.iter().cloned())
        .collect();
    let mut cache = caching
        .await
        .map_err(|e| ClientError::Config(format!("reading the sync cache failed: {e}")))?;
    let mut report = Report {
        excluded: walked.excluded,
        skipped: walked.skipped,
        ..Report::default()
    };
    let mut todo = Vec::new();
    for file in walked.files {
        let name = join_name(prefix, &file.rel);
        if let Err(why) = check_file_name(&name) {
            report.skipped.push(format!("{} ({why})", file.rel));
            continue;
        }
        match remote.get(&file.rel) {
            Some(r) if r.size == file.size && same_content(&file, &r.blake3, &mut cache)? => {
                report.unchanged += 1;
            }
            _ => todo.push((file, name)),
        }
    }
    report.transfers = todo
        .iter()
        .map(|(f, name)| Transfer {
            path: f.path.clone(),
            name: name.clone(),
            size: f.size,
        })
        .collect();
    if !dry_run {
        let done = Overall::new(todo.iter().map(|(f, _)| f.size).sum());
        let mut sends = stream::iter(todo.iter().map(|(file, name)| {
            let done = &done;
            async move {
                let each = done.file(progress);
                upload(client, run, &file.path, name, &each)
                    .await
                    .map(|uploaded| (file, uploaded))
            }
        }))
        .buffer_unordered(FILES_AT_ONCE);
        while let Some(sent) = sends.next().await {
            let (file, uploaded) = sent?;
            report.sent_bytes += uploaded.sent_bytes;
            cache.remember(file, &uploaded.file.blake3);
        }
    }
    if options.delete {
        let mut extra: Vec<_> = remote
            .iter()
            .filter(|(rel, _)| !present.contains(*rel) && filter.includes_file(rel))
            .map(|(_, info)| info.name.clone())
            .collect();
        extra.sort();
        for name in extra {
            if !dry_run {
                client.delete_file(run, &name).await?;
            }
            report.deleted.push(name);
        }
    }
    cache.save();
    Ok(report)
}

/// Downloads what differs from `run`'s files under `prefix` into `dir`.
pub async fn pull(
    client: &Client,
    run: &str,
    prefix: &str,
    dir: &Path,
    options: &Options,
    progress: &Progress<'_>,
) -> Result<Report, ClientError> {
    let (filter, dry_run) = (&options.filter, options.dry_run);
    let remote = remote_files(client, run, prefix).await?;
    if let Some((file, below)) = file_and_folder(remote.keys()) {
        // Committed before the server refused such pairs: no directory can
        // hold both, so nothing is fetched rather than half of them.
        return Err(ClientError::Config(format!(
            "run {run} has both a file {file:?} and a file {below:?} below it, which no \
             directory can hold; delete one of them on the server (DELETE \
             /api/v1/runs/{run}/files/NAME) and sync again"
        )));
    }
    let mut deleted = Vec::new();
    if options.delete && dir.is_dir() {
        let mut extra: Vec<_> = walk(dir, filter)?
            .files
            .into_iter()
            .filter(|f| !remote.contains_key(&f.rel))
            .collect();
        extra.sort_by(|a, b| a.rel.cmp(&b.rel));
        for file in extra {
            if !dry_run {
                std::fs::remove_file(&file.path).map_err(ClientError::io("delete", &file.path))?;
            }
            deleted.push(file.rel);
        }
    }
    let mut cache = Cache::open(client.url(), run, prefix, dir);
    let mut report = Report {
        deleted,
        ..Report::default()
    };
    let mut names: Vec<_> = remote.into_iter().collect();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    let mut todo = Vec::new();
    for (rel, info) in names {
        if !filter.includes_file(&rel) {
            report.excluded += 1;
            continue;
        }
        // Server names are checked relative paths; checked again before
        // they become local paths.
        if check_file_name(&rel).is_err() {
            report.skipped.push(rel);
            continue;
        }
        let path = dir.join(&rel);
        let local = std::fs::symlink_metadata(&path).ok();
        let same = match &local {
            Some(meta) if meta.is_file() && meta.len() == info.size => {
                let file = LocalFile {
                    rel: rel.clone(),
                    path: path.clone(),
                    size: meta.len(),
                    mtime_ns: mtime_ns(meta),
                };
                same_content(&file, &info.blake3, &mut cache)?
            }
            _ => false,
        };
        if same {
            report.unchanged += 1;
        } else {
            todo.push((rel, path, info));
        }
    }
    report.transfers = todo
        .iter()
        .map(|(_, path, info)| Transfer {
            path: path.clone(),
            name: info.name.clone(),
            size: info.size,
        })
        .collect();
    if !dry_run {
        let fetched = fetch_all(client, run, &todo, progress, &mut report, &mut cache).await;
        if let Err(e) = fetched {
            // Nothing partial stays behind: the downloads in flight were
            // dropped with the stream, and each file's partial copy goes.
            for (_, path, _) in &todo {
                let _ = std::fs::remove_file(partial_path(path));
            }
            cache.save();
            return Err(e);
        }
    }
    cache.save();
    Ok(report)
}

/// The first pair of names where one is a folder of the other (`dir`,
/// `dir/file`), if any.
fn file_and_folder<'a>(names: impl Iterator<Item = &'a String>) -> Option<(String, String)> {
    let mut sorted: Vec<&String> = names.collect();
    sorted.sort();
    // Every name that starts with `dir` sorts right after `dir` (`dir-x`,
    // `dir.y` before `dir/file`), so the search for `dir/...` stops at the
    // first name that does not.
    for (i, name) in sorted.iter().enumerate() {
        let folder = format!("{name}/");
        for later in &sorted[i + 1..] {
            if later.starts_with(&folder) {
                return Some(((*name).clone(), (*later).clone()));
            }
            if !later.starts_with(name.as_str()) {
                break;
            }
        }
    }
    None
}

/// Downloads every file of `todo`, a few at a time, into the report and
/// the cache; the first error ends it.
async fn fetch_all(
    client: &Client,
    run: &str,
    todo: &[(String, PathBuf, Listed)],
    progress: &Progress<'_>,
    report: &mut Report,
    cache: &mut Cache,
) -> Result<(), ClientError> {
    {
        let done = Overall::new(todo.iter().map(|(_, _, i)| i.size).sum());
        let mut fetches = stream::iter(todo.iter().map(|(rel, path, info)| {
            let done = &done;
            async move {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(ClientError::io("create", parent))?;
                }
                let each = done.file(progress);
                let got = download(client, run, &info.name, path, &each).await?;
                let meta = std::fs::metadata(path).map_err(ClientError::io("stat", path))?;
                let file = LocalFile {
                    rel: rel.clone(),
                    path: path.clone(),
                    size: meta.len(),
                    mtime_ns: mtime_ns(&meta),
                };
                Ok::<_, ClientError>((file, got))
            }
        }))
        .buffer_unordered(FILES_AT_ONCE);
        while let Some(fetched) = fetches.next().await {
            let (file, got) = fetched?;
            report.sent_bytes += got.size - got.resumed_from;
            cache.remember(&file, &got.blake3);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(rules: &[(bool, &str)]) -> Filter {
        let owned: Vec<(bool, String)> = rules.iter().map(|(i, p)| (*i, (*p).to_owned())).collect();
        Filter::new(&owned).unwrap()
    }

    #[test]
    fn a_name_that_is_also_a_folder_is_found() {
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        for (list, found) in [
            (
                &["dir", "dir-x", "dir.y", "dir/file"][..],
                Some(("dir", "dir/file")),
            ),
            (&["a/b/c", "a/b"][..], Some(("a/b", "a/b/c"))),
            (&["dir", "dirx/y", "di/r", "dir-x/y"][..], None),
            (&[][..], None),
        ] {
            let got = file_and_folder(names(list).iter());
            let want = found.map(|(a, b)| (a.to_owned(), b.to_owned()));
            assert_eq!(got, want, "{list:?}");
        }
    }

    #[test]
    fn the_first_matching_rule_decides_as_in_rsync() {
        let f = filter(&[(true, "keep.tmp"), (false, "*.tmp")]);
        assert!(f.includes("a/keep.tmp", false));
        assert!(!f.includes("a/b/x.tmp", false));
        assert!(f.includes("a/b/x.pt", false));
        let f = filter(&[(false, "*.tmp"), (true, "keep.tmp")]);
        assert!(!f.includes("keep.tmp", false));
    }

    #[test]
    fn slashes_anchors_double_stars_and_directory_patterns() {
        // No slash: the last part, at any depth.
        let f = filter(&[(false, "*.log")]);
        assert!(!f.includes("deep/er/run.log", false));
        // A slash: the end of the whole path, at a part boundary.
        let f = filter(&[(false, "ckpt/*.pt")]);
        assert!(!f.includes("ckpt/a.pt", false));
        assert!(!f.includes("x/ckpt/a.pt", false));
        assert!(f.includes("ckpt/sub/a.pt", false)); // * stays in one part
        assert!(f.includes("myckpt/a.pt", false));
        // A leading slash anchors at the top.
        let f = filter(&[(false, "/out.txt")]);
        assert!(!f.includes("out.txt", false));
        assert!(f.includes("sub/out.txt", false));
        // ** crosses parts.
        let f = filter(&[(false, "logs/**")]);
        assert!(!f.includes("logs/a/b/c.txt", false));
        // A trailing slash: directories only.
        let f = filter(&[(false, "cache/")]);
        assert!(!f.includes("cache", true));
        assert!(f.includes("cache", false));
        // A file inside an excluded directory is excluded.
        assert!(!f.includes_file("cache/x.bin"));
        assert!(f.includes_file("data/cache.bin"));
    }

    #[test]
    fn bad_patterns_say_which() {
        let err = Filter::new(&[(false, "a[".into())]).unwrap_err();
        assert!(
            err.starts_with("--exclude \"a[\" is not a pattern"),
            "{err}"
        );
        let err = Filter::new(&[(true, "/".into())]).unwrap_err();
        assert!(err.contains("--include \"/\": an empty pattern"), "{err}");
    }

    #[test]
    fn a_walk_skips_excluded_directories_and_links_in_name_order() {
        let root = std::env::temp_dir().join(format!("relaunch-walk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for p in [
            "b.txt",
            "a/x.pt",
            "a/y.tmp",
            "cache/big.bin",
            "z/deep/w.txt",
        ] {
            let path = root.join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, p).unwrap();
        }
        std::os::unix::fs::symlink(root.join("b.txt"), root.join("link")).unwrap();
        let f = filter(&[(false, "cache/"), (false, "*.tmp")]);
        let walked = walk(&root, &f).unwrap();
        let rels: Vec<_> = walked.files.iter().map(|f| f.rel.as_str()).collect();
        assert_eq!(rels, ["a/x.pt", "b.txt", "z/deep/w.txt"]);
        assert_eq!(walked.excluded, 2);
        assert_eq!(walked.skipped, ["link"]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}

//! Where worker output goes: per attempt and per rank log files, the
//! console, and a short tail kept in memory for failure reports.
//!
//! Layout, as torchrun's:
//!
//! ```text
//! LOG_DIR/RUN_ID_XXXXXX/attempt_N/LOCAL_RANK/stdout.log
//!                                            stderr.log
//!                                            error.json   (torch's @record)
//! ```
//!
//! Without `--log-dir` the same layout lives in a temporary directory,
//! which is removed when the job succeeds and kept (and named in the
//! failure report) when it does not. A success keeps it too when a hang or
//! failure report of an earlier attempt names files in it (said at exit),
//! and removes what this run's earlier preempted launches left (marked
//! [`PREEMPTED`] when they stopped).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use std::io::{BufWriter, Write as _};

use crate::console::{ConsoleLine, ConsoleSender, Stream};
use crate::error::LaunchError;
use crate::lines::{LineSplitter, Piece};
use crate::vterm::Screen;
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Lines of a worker's stderr kept for the failure report.
pub const TAIL_LINES: usize = 40;

/// The mark a preempted launch leaves in its temporary log directory: the
/// relaunch that finishes the run removes the directory.
pub const PREEMPTED: &str = "preempted";

/// The job's log directory.
#[derive(Clone, Debug)]
pub struct LogLayout {
    root: PathBuf,
    temporary: bool,
    run_id: String,
    /// A hang or failure report named files in it.
    reported: Arc<std::sync::atomic::AtomicBool>,
}

/// What [`LogLayout::finish`] did with a temporary directory.
#[derive(Debug, PartialEq, Eq)]
pub enum Kept {
    /// Removed (or never temporary).
    No,
    /// Kept: a report of an earlier attempt names files in it.
    Reported(PathBuf),
}

impl LogLayout {
    /// Creates `LOG_DIR/RUN_ID_XXXXXX`, or a temporary directory, new and
    /// private (mode 0700, as torchrun's `mkdtemp`): workers' logs may hold
    /// anything they print, and other users of a shared node must not read
    /// them. An existing directory of that name is never reused; another
    /// suffix is drawn.
    pub fn create(log_dir: Option<&Path>, run_id: &str) -> Result<Self, LaunchError> {
        use std::os::unix::fs::DirBuilderExt as _;
        let (parent, temporary) = match log_dir {
            Some(dir) => (dir.to_path_buf(), false),
            None => (std::env::temp_dir(), true),
        };
        std::fs::create_dir_all(&parent).map_err(|source| LaunchError::LogDir {
            path: parent.clone(),
            source,
        })?;
        let mut tries = 0;
        loop {
            let suffix: String = uuid::Uuid::new_v4().simple().to_string()[..6].to_owned();
            let name = if temporary {
                format!("relaunch_{run_id}_{suffix}")
            } else {
                format!("{run_id}_{suffix}")
            };
            let root = parent.join(name);
            match std::fs::DirBuilder::new().mode(0o700).create(&root) {
                Ok(()) => {
                    return Ok(Self {
                        root,
                        temporary,
                        run_id: run_id.to_owned(),
                        reported: Arc::default(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 100 => {
                    tries += 1;
                }
                Err(source) => return Err(LaunchError::LogDir { path: root, source }),
            }
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn is_temporary(&self) -> bool {
        self.temporary
    }

    /// `attempt_N`, created.
    pub fn attempt_dir(&self, attempt: u32) -> Result<PathBuf, LaunchError> {
        let dir = self.root.join(format!("attempt_{attempt}"));
        std::fs::create_dir_all(&dir).map_err(|source| LaunchError::LogDir {
            path: dir.clone(),
            source,
        })?;
        Ok(dir)
    }

    /// `attempt_N/LOCAL_RANK`, created.
    pub fn rank_dir(&self, attempt: u32, local_rank: usize) -> Result<PathBuf, LaunchError> {
        let dir = self
            .root
            .join(format!("attempt_{attempt}"))
            .join(local_rank.to_string());
        std::fs::create_dir_all(&dir).map_err(|source| LaunchError::LogDir {
            path: dir.clone(),
            source,
        })?;
        Ok(dir)
    }

    /// A hang or failure report named files in this directory: a
    /// successful end keeps it.
    pub fn mark_reported(&self) {
        self.reported
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a hang or failure report named files in this directory.
    pub fn reported(&self) -> bool {
        self.reported.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// After a successful job: a temporary directory is removed, unless a
    /// report names files in it, and so are the temporary directories this
    /// run's earlier launches left when they were preempted.
    pub fn finish(&self) -> Kept {
        if !self.temporary {
            return Kept::No;
        }
        self.remove_preempted_launches();
        if self.reported.load(std::sync::atomic::Ordering::Relaxed) {
            return Kept::Reported(self.root.clone());
        }
        remove(&self.root);
        Kept::No
    }

    /// After a clean preemption: marks a temporary directory for the
    /// relaunch that finishes the run, unless a report names files in it.
    pub fn mark_preempted(&self) {
        if self.temporary && !self.reported.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = std::fs::write(self.root.join(PREEMPTED), b"");
        }
    }

    /// `relaunch_RUN_*` beside this directory with the [`PREEMPTED`] mark:
    /// what this run's earlier, preempted launches left (a directory of a
    /// launch still running has no mark yet).
    fn remove_preempted_launches(&self) {
        let Some(parent) = self.root.parent() else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(parent) else {
            return;
        };
        let prefix = format!("relaunch_{}_", self.run_id);
        for entry in entries.flatten() {
            let path = entry.path();
            // The prefix and the six hex digits `create` draws, exactly: run
            // `a`'s must not take run `a_b`'s.
            let name = entry.file_name();
            let ours = name
                .to_string_lossy()
                .strip_prefix(&prefix)
                .is_some_and(|rest| rest.len() == 6 && rest.bytes().all(|b| b.is_ascii_hexdigit()));
            if ours && path != self.root && path.join(PREEMPTED).is_file() {
                remove(&path);
            }
        }
    }
}

fn remove(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::debug!(dir = %dir.display(), error = %e, "cannot remove a temporary log directory");
    }
}

/// The last lines of one stream, shared with the failure report.
pub type Tail = Arc<Mutex<VecDeque<String>>>;

/// torchrun's `--duplicate-*-filters`: the console's lines of one stream
/// (every rank of the attempt) that contain any of the filters, also
/// written to one file (`attempt_N/filtered_stdout.log`), prefixed as on
/// the console, each line flushed as it comes.
#[derive(Debug)]
pub struct Duplicate {
    filters: Vec<Vec<u8>>,
    path: PathBuf,
    file: Mutex<Option<std::fs::File>>,
}

impl Duplicate {
    /// Creates the file; `None` without filters (nothing is duplicated) or
    /// when the file cannot be created (a warning says so).
    pub fn create(path: PathBuf, filters: &[String]) -> Option<Arc<Self>> {
        if filters.is_empty() {
            return None;
        }
        match std::fs::File::create(&path) {
            Ok(file) => Some(Arc::new(Self {
                filters: filters.iter().map(|f| f.as_bytes().to_vec()).collect(),
                path,
                file: Mutex::new(Some(file)),
            })),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot create the filtered log; lines are not duplicated");
                None
            }
        }
    }

    fn offer(&self, prefix: &str, line: &[u8]) {
        let matches = self
            .filters
            .iter()
            .any(|f| line.windows(f.len()).any(|w| w == f.as_slice()));
        if !matches {
            return;
        }
        let mut record = Vec::with_capacity(prefix.len() + line.len() + 1);
        record.extend_from_slice(prefix.as_bytes());
        record.extend_from_slice(line);
        record.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = file.as_mut()
            && let Err(e) = f.write_all(&record)
        {
            tracing::warn!(file = %self.path.display(), error = %e, "cannot write the filtered log");
            *file = None;
        }
    }
}

/// Where one worker stream's pieces go.
#[derive(Debug)]
pub struct StreamSink {
    pub file: PathBuf,
    /// The worker's global rank: the console shows live lines in its order.
    pub rank: usize,
    pub stream: Stream,
    /// `None` when the stream is redirected to its file only.
    pub console: Option<(ConsoleSender, Arc<str>)>,
    pub tail: Tail,
    /// The tracking server's copy of the stream's lines, with `--server`.
    pub tap: Option<crate::tracking::LineTap>,
    /// `--duplicate-*-filters`, for a stream the console shows.
    pub duplicate: Option<Arc<Duplicate>>,
}

/// How a stream's bytes become [`Piece`]s: a pipe's lines and `\r`
/// frames, or what a program draws on a terminal.
#[derive(Debug)]
pub enum Decoder {
    Pipe(LineSplitter),
    Terminal(Box<Screen>),
}

impl Decoder {
    pub fn pipe() -> Self {
        Self::Pipe(LineSplitter::new())
    }

    pub fn terminal() -> Self {
        Self::Terminal(Box::default())
    }

    fn push(&mut self, data: &[u8], out: &mut Vec<Piece>) {
        match self {
            Self::Pipe(splitter) => splitter.push(data, out),
            Self::Terminal(screen) => screen.push(data, Instant::now(), out),
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        match self {
            Self::Pipe(splitter) => splitter.finish(out),
            Self::Terminal(screen) => screen.finish(out),
        }
    }

    /// When lines waiting to be finished are due, if any are.
    fn deadline(&self) -> Option<Instant> {
        match self {
            Self::Pipe(_) => None,
            Self::Terminal(screen) => screen.deadline(),
        }
    }

    fn tick(&mut self, out: &mut Vec<Piece>) {
        if let Self::Terminal(screen) = self {
            screen.tick(Instant::now(), out);
        }
    }
}

/// Reads `source` until it closes, writing whole lines to the sink's file,
/// lines and live frames to the console, and the last lines to the tail.
///
/// The file is written synchronously: a line into the page cache costs
/// microseconds, less than handing it to another thread.
pub async fn pump(mut source: impl AsyncRead + Unpin, sink: StreamSink, mut decoder: Decoder) {
    let file = match std::fs::File::create(&sink.file) {
        Ok(file) => Some(BufWriter::new(file)),
        Err(e) => {
            tracing::warn!(file = %sink.file.display(), error = %e, "cannot write a worker log file");
            None
        }
    };
    let mut file = file;
    let mut pieces = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut tap_warned = false;
    loop {
        let read = source.read(&mut buf);
        let read = match decoder.deadline() {
            Some(due) => tokio::time::timeout_at(due.into(), read).await.ok(),
            None => Some(read.await),
        };
        // A pseudo-terminal's reader gets EIO once the worker and its
        // children have all closed it: the end, as a pipe's 0.
        let n = match read {
            None => {
                decoder.tick(&mut pieces);
                None
            }
            Some(Ok(0) | Err(_)) => {
                decoder.finish(&mut pieces);
                Some(0)
            }
            Some(Ok(n)) => {
                decoder.push(&buf[..n], &mut pieces);
                Some(n)
            }
        };
        deliver(&sink, &mut file, &mut tap_warned, pieces.drain(..));
        if let Some(f) = file.as_mut()
            && let Err(e) = f.flush()
        {
            tracing::warn!(file = %sink.file.display(), error = %e, "cannot write a worker log file");
            file = None;
        }
        if n == Some(0) {
            return;
        }
    }
}

fn deliver(
    sink: &StreamSink,
    file: &mut Option<BufWriter<std::fs::File>>,
    tap_warned: &mut bool,
    pieces: impl Iterator<Item = Piece>,
) {
    let mut shown = Vec::new();
    for piece in pieces {
        if let Some(line) = piece.finished_text() {
            if let Some(tap) = &sink.tap {
                tap.line(sink.stream, line, tap_warned);
            }
            if let Some(f) = file.as_mut()
                && f.write_all(line).and_then(|()| f.write_all(b"\n")).is_err()
            {
                *file = None;
            }
            if sink.stream == Stream::Stderr {
                let mut tail = sink.tail.lock().unwrap_or_else(|p| p.into_inner());
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(String::from_utf8_lossy(line).into_owned());
            }
        }
        if let Some((_, prefix)) = &sink.console {
            if let (Some(duplicate), Some(line)) = (&sink.duplicate, piece.finished_text()) {
                duplicate.offer(prefix, line);
            }
            shown.push(ConsoleLine {
                prefix: prefix.clone(),
                rank: sink.rank,
                stream: sink.stream,
                piece,
            });
        }
    }
    if let Some((console, _)) = &sink.console {
        console.send(shown);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// Regression: the directory was created with the umask's mode (0755
    /// in /tmp), readable by every user of the node.
    /// Issue 34: a success removed the directory its reports named, and
    /// preempted launches' directories stayed in /tmp for good.
    #[test]
    fn a_success_keeps_what_reports_name_and_removes_preempted_launches() {
        let run = format!("keep-{}", uuid::Uuid::new_v4().simple());
        let preempted = LogLayout::create(None, &run).unwrap();
        preempted.mark_preempted();
        let running = LogLayout::create(None, &run).unwrap();
        let reported = LogLayout::create(None, &run).unwrap();
        reported.mark_reported();
        reported.mark_preempted(); // no mark: its reports name files in it
        assert!(!reported.root().join(PREEMPTED).exists());
        let other_run = LogLayout::create(None, &format!("{run}_b")).unwrap();
        other_run.mark_preempted();

        assert_eq!(
            reported.finish(),
            Kept::Reported(reported.root().to_path_buf())
        );
        assert!(reported.root().is_dir());
        assert!(!preempted.root().exists(), "an earlier preempted launch's");
        assert!(
            running.root().is_dir(),
            "a launch still running has no mark"
        );
        assert!(other_run.root().is_dir(), "another run's");
        assert_eq!(running.finish(), Kept::No);
        assert!(!running.root().exists());
        for dir in [reported.root(), other_run.root()] {
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    #[test]
    fn log_directories_are_new_and_private() {
        let parent = std::env::temp_dir().join(format!("relaunch-logs-{}", uuid::Uuid::new_v4()));
        let first = LogLayout::create(Some(&parent), "job").unwrap();
        let second = LogLayout::create(Some(&parent), "job").unwrap();
        assert_ne!(first.root(), second.root());
        for layout in [&first, &second] {
            let mode = std::fs::metadata(layout.root())
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700, "{}", layout.root().display());
            assert!(!layout.is_temporary());
        }
        let temporary = LogLayout::create(None, "job").unwrap();
        let mode = std::fs::metadata(temporary.root())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(temporary.finish(), Kept::No);
        assert!(!temporary.root().exists());
        std::fs::remove_dir_all(&parent).unwrap();
    }

    #[test]
    fn duplicated_lines_are_the_ones_with_a_filter_prefixed_as_on_the_console() {
        let dir = std::env::temp_dir().join(format!("relaunch-dup-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("filtered_stdout.log");
        assert!(Duplicate::create(path.clone(), &[]).is_none());
        let dup = Duplicate::create(path.clone(), &["loss".into(), "a,b".into()]).unwrap();
        dup.offer("[default0]:", b"step 1 loss 0.5");
        dup.offer("[default1]:", b"nothing here");
        dup.offer("[default1]:", b"x a,b y");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "[default0]:step 1 loss 0.5\n[default1]:x a,b y\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

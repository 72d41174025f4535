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
//! failure report) when it does not.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use std::io::{BufWriter, Write as _};

use crate::console::{ConsoleLine, ConsoleSender, Stream};
use crate::error::LaunchError;
use crate::lines::{LineSplitter, Piece};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Lines of a worker's stderr kept for the failure report.
pub const TAIL_LINES: usize = 40;

/// The job's log directory.
#[derive(Clone, Debug)]
pub struct LogLayout {
    root: PathBuf,
    temporary: bool,
}

impl LogLayout {
    /// Creates `LOG_DIR/RUN_ID_XXXXXX`, or a temporary directory.
    pub fn create(log_dir: Option<&Path>, run_id: &str) -> Result<Self, LaunchError> {
        let suffix: String = uuid::Uuid::new_v4().simple().to_string()[..6].to_owned();
        let (parent, temporary) = match log_dir {
            Some(dir) => (dir.to_path_buf(), false),
            None => (std::env::temp_dir(), true),
        };
        let name = if temporary {
            format!("relaunch_{run_id}_{suffix}")
        } else {
            format!("{run_id}_{suffix}")
        };
        let root = parent.join(name);
        std::fs::create_dir_all(&root).map_err(|source| LaunchError::LogDir {
            path: root.clone(),
            source,
        })?;
        Ok(Self { root, temporary })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn is_temporary(&self) -> bool {
        self.temporary
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

    /// Removes a temporary directory after a successful job.
    pub fn cleanup(&self) {
        if self.temporary
            && let Err(e) = std::fs::remove_dir_all(&self.root)
        {
            tracing::debug!(dir = %self.root.display(), error = %e, "cannot remove the temporary log directory");
        }
    }
}

/// The last lines of one stream, shared with the failure report.
pub type Tail = Arc<Mutex<VecDeque<String>>>;

/// Where one worker stream's pieces go.
#[derive(Debug)]
pub struct StreamSink {
    pub file: PathBuf,
    pub stream: Stream,
    /// `None` when the stream is redirected to its file only.
    pub console: Option<(ConsoleSender, Arc<str>)>,
    pub tail: Tail,
    /// The tracking server's copy of the stream's lines, with `--server`.
    pub tap: Option<crate::tracking::LineTap>,
}

/// Reads `source` until it closes, writing whole lines to the sink's file,
/// lines and progress frames to the console, and the last lines to the tail.
///
/// The file is written synchronously: a line into the page cache costs
/// microseconds, less than handing it to another thread.
pub async fn pump(mut source: impl AsyncRead + Unpin, sink: StreamSink) {
    let file = match std::fs::File::create(&sink.file) {
        Ok(file) => Some(BufWriter::new(file)),
        Err(e) => {
            tracing::warn!(file = %sink.file.display(), error = %e, "cannot write a worker log file");
            None
        }
    };
    let mut file = file;
    let mut splitter = LineSplitter::new();
    let mut pieces = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut tap_warned = false;
    loop {
        let n = match source.read(&mut buf).await {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        if n == 0 {
            splitter.finish(&mut pieces);
        } else {
            splitter.push(&buf[..n], &mut pieces);
        }
        deliver(&sink, &mut file, &mut tap_warned, pieces.drain(..));
        if let Some(f) = file.as_mut()
            && let Err(e) = f.flush()
        {
            tracing::warn!(file = %sink.file.display(), error = %e, "cannot write a worker log file");
            file = None;
        }
        if n == 0 {
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
    for piece in pieces {
        if let Piece::Line(line) = &piece {
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
        if let Some((console, prefix)) = &sink.console {
            console.send(ConsoleLine {
                prefix: prefix.clone(),
                stream: sink.stream,
                piece,
            });
        }
    }
}

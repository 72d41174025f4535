//! The launcher's terminal: every worker line, prefixed and whole, and one
//! live display of the workers' progress bars.
//!
//! One thread owns stdout and stderr, so lines from different workers never
//! tear or interleave mid-line, and a slow terminal never stalls the
//! launcher. Worker stdout goes to stdout and worker stderr to stderr. When
//! stderr is a terminal, what workers may still redraw (a pipe's `\r`
//! frames, see [`crate::lines`]; the live lines of a worker that has a
//! terminal, see [`crate::vterm`]) is drawn below the output, each
//! worker's lines in rank order, redrawn in place; when it is not (a file,
//! a pipe, CI), only finished lines appear.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::ops::Bound;
use std::sync::Arc;
use std::thread::JoinHandle;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::mpsc;

use crate::lines::Piece;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A piece of a worker's output on its way to the terminal.
#[derive(Debug)]
pub struct ConsoleLine {
    /// `[default0]:`, from `--log-line-prefix-template`.
    pub prefix: Arc<str>,
    /// Orders the live lines: the worker's global rank.
    pub rank: usize,
    pub stream: Stream,
    pub piece: Piece,
}

enum Message {
    /// What one read of a worker's stream made, applied at once: a
    /// finished line and the live lines it leaves never show apart.
    Worker(Vec<ConsoleLine>),
    /// A line of the launcher's own, on stderr.
    Notice(String),
    /// Everything before this is written; stop.
    Close,
}

/// Sends worker output to the console thread.
#[derive(Clone, Debug)]
pub struct ConsoleSender(mpsc::UnboundedSender<Message>);

impl ConsoleSender {
    pub fn send(&self, lines: Vec<ConsoleLine>) {
        if !lines.is_empty() {
            // Fails only once the console has stopped, at the very end.
            let _ = self.0.send(Message::Worker(lines));
        }
    }

    /// Prints a line of the launcher's own on stderr, in order with the
    /// workers' lines.
    pub fn notice(&self, text: impl Into<String>) {
        let _ = self.0.send(Message::Notice(text.into()));
    }
}

/// The console thread.
#[derive(Debug)]
pub struct Console {
    sender: ConsoleSender,
    thread: Option<JoinHandle<()>>,
}

impl Console {
    pub fn start() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let interactive = std::io::stderr().is_terminal();
        let thread = std::thread::Builder::new()
            .name("relaunch-console".into())
            .spawn(move || run(rx, interactive))
            .map_err(|e| tracing::warn!(error = %e, "cannot start the console thread; worker output is not shown"))
            .ok();
        Self {
            sender: ConsoleSender(tx),
            thread,
        }
    }

    pub fn sender(&self) -> ConsoleSender {
        self.sender.clone()
    }

    /// Prints everything sent so far and stops the thread. Lines sent
    /// afterwards (by clones of the sender) are dropped.
    pub fn close(mut self) {
        let _ = self.sender.0.send(Message::Close);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The live lines of one worker's stream.
type Key = (usize, Stream);

fn run(mut rx: mpsc::UnboundedReceiver<Message>, interactive: bool) {
    let live = interactive.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
    let style = ProgressStyle::with_template("{wide_msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let mut bars: BTreeMap<Key, Vec<ProgressBar>> = BTreeMap::new();
    let mut out = Vec::new();
    let mut err = Vec::new();
    let mut open = true;
    while open && let Some(first) = rx.blocking_recv() {
        // Take everything already queued, then write it in two calls.
        let mut next = Some(first);
        while let Some(message) = next.take().or_else(|| rx.try_recv().ok()) {
            match message {
                Message::Close => {
                    open = false;
                    break;
                }
                Message::Notice(text) => {
                    err.extend_from_slice(text.as_bytes());
                    err.push(b'\n');
                }
                Message::Worker(pieces) => {
                    for line in pieces {
                        show(line, live.as_ref(), &style, &mut bars, &mut out, &mut err);
                    }
                }
            }
        }
        let write = || {
            if !out.is_empty() {
                let mut stdout = std::io::stdout().lock();
                let _ = stdout.write_all(&out).and_then(|()| stdout.flush());
            }
            if !err.is_empty() {
                let mut stderr = std::io::stderr().lock();
                let _ = stderr.write_all(&err).and_then(|()| stderr.flush());
            }
        };
        match &live {
            // Clears the bars, writes above them, draws them again.
            Some(live) if !bars.is_empty() => live.suspend(write),
            _ => write(),
        }
        out.clear();
        err.clear();
    }
    for bar in bars.into_values().flatten() {
        bar.finish_and_clear();
    }
}

/// Puts a finished line of `line` into `out` or `err`, or makes its live
/// lines the ones drawn.
fn show(
    line: ConsoleLine,
    live: Option<&MultiProgress>,
    style: &ProgressStyle,
    bars: &mut BTreeMap<Key, Vec<ProgressBar>>,
    out: &mut Vec<u8>,
    err: &mut Vec<u8>,
) {
    let ConsoleLine {
        prefix,
        rank,
        stream,
        piece,
    } = line;
    let key = (rank, stream);
    let mut draw = |lines: &[Vec<u8>]| {
        if let Some(live) = live {
            show_live(live, style, bars, key, &prefix, lines);
        }
    };
    let finished = match piece {
        Piece::Line(line) => {
            // The frame on this line became the line.
            draw(&[]);
            line
        }
        Piece::Drawn { drawn, .. } => drawn,
        Piece::Progress(frame) => return draw(&[frame]),
        Piece::Live(lines) => return draw(&lines),
    };
    let buf = match stream {
        Stream::Stdout => out,
        Stream::Stderr => err,
    };
    buf.extend_from_slice(prefix.as_bytes());
    buf.extend_from_slice(&finished);
    buf.push(b'\n');
}

/// Makes `key`'s live lines `lines`, each prefixed, below those of the
/// streams before it and above those after it.
fn show_live(
    live: &MultiProgress,
    style: &ProgressStyle,
    bars: &mut BTreeMap<Key, Vec<ProgressBar>>,
    key: Key,
    prefix: &str,
    lines: &[Vec<u8>],
) {
    let mut mine = bars.remove(&key).unwrap_or_default();
    while mine.len() > lines.len() {
        if let Some(bar) = mine.pop() {
            bar.finish_and_clear();
            live.remove(&bar);
        }
    }
    while mine.len() < lines.len() {
        let bar = ProgressBar::new_spinner().with_style(style.clone());
        let after = bars
            .range((Bound::Excluded(key), Bound::Unbounded))
            .find_map(|(_, b)| b.first());
        let before = bars.range(..key).rev().find_map(|(_, b)| b.last());
        let bar = match (mine.last(), after, before) {
            (Some(last), _, _) => live.insert_after(last, bar),
            (None, Some(next), _) => live.insert_before(next, bar),
            (None, None, Some(previous)) => live.insert_after(previous, bar),
            (None, None, None) => live.add(bar),
        };
        mine.push(bar);
    }
    for (bar, line) in mine.iter().zip(lines) {
        bar.set_message(format!("{prefix}{}", String::from_utf8_lossy(line)));
    }
    if !mine.is_empty() {
        bars.insert(key, mine);
    }
}

//! The launcher's terminal: every worker line, prefixed and whole, and one
//! live display of the workers' progress bars.
//!
//! One thread owns stdout and stderr, so lines from different workers never
//! tear or interleave mid-line, and a slow terminal never stalls the
//! launcher. Worker stdout goes to stdout and worker stderr to stderr. When
//! stderr is a terminal, a worker's progress frames (see [`crate::lines`])
//! redraw one line per worker and stream below the output; when it is not
//! (a file, a pipe, CI), frames are dropped and only finished lines appear.

use std::collections::HashMap;
use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::thread::JoinHandle;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::mpsc;

use crate::lines::Piece;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A piece of a worker's output on its way to the terminal.
#[derive(Debug)]
pub struct ConsoleLine {
    /// `[default0]:`, from `--log-line-prefix-template`.
    pub prefix: Arc<str>,
    pub stream: Stream,
    pub piece: Piece,
}

enum Message {
    Worker(ConsoleLine),
    /// A line of the launcher's own, on stderr.
    Notice(String),
    /// Everything before this is written; stop.
    Close,
}

/// Sends worker output to the console thread.
#[derive(Clone, Debug)]
pub struct ConsoleSender(mpsc::UnboundedSender<Message>);

impl ConsoleSender {
    pub fn send(&self, line: ConsoleLine) {
        // Fails only once the console has stopped, at the very end.
        let _ = self.0.send(Message::Worker(line));
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

fn run(mut rx: mpsc::UnboundedReceiver<Message>, interactive: bool) {
    let live = interactive.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
    let style = ProgressStyle::with_template("{wide_msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let mut bars: HashMap<(Arc<str>, Stream), ProgressBar> = HashMap::new();
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
                Message::Worker(ConsoleLine {
                    prefix,
                    stream,
                    piece,
                }) => match piece {
                    Piece::Line(line) => {
                        if let Some(bar) = bars.remove(&(prefix.clone(), stream)) {
                            bar.finish_and_clear();
                        }
                        let buf = match stream {
                            Stream::Stdout => &mut out,
                            Stream::Stderr => &mut err,
                        };
                        buf.extend_from_slice(prefix.as_bytes());
                        buf.extend_from_slice(&line);
                        buf.push(b'\n');
                    }
                    Piece::Progress(frame) => {
                        if let Some(live) = &live {
                            let bar = bars.entry((prefix.clone(), stream)).or_insert_with(|| {
                                live.add(ProgressBar::new_spinner().with_style(style.clone()))
                            });
                            bar.set_message(format!("{prefix}{}", String::from_utf8_lossy(&frame)));
                        }
                    }
                },
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
    for bar in bars.into_values() {
        bar.finish_and_clear();
    }
}

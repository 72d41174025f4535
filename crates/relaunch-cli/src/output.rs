//! What the CLI prints for people and scripts; the one place that writes to
//! the terminal directly. Diagnostics go through `tracing` instead.

#![allow(clippy::print_stderr)]

/// A status line on stderr that scripts may wait for, such as
/// `listening on 127.0.0.1:29400`.
pub(crate) fn status(line: &str) {
    eprintln!("{line}");
}

/// The final error of a failed command, with its chain of causes.
pub(crate) fn error(e: &anyhow::Error) {
    eprintln!("error: {e:#}");
}

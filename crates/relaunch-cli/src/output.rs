//! What the CLI prints for people and scripts; the one place that writes to
//! the terminal directly. Diagnostics go through `tracing` instead.

#![allow(clippy::print_stderr, clippy::print_stdout)]

/// A status line on stderr that scripts may wait for, such as
/// `listening on 127.0.0.1:29400`.
pub(crate) fn status(line: &str) {
    eprintln!("{line}");
}

/// A report for people, on stdout.
pub(crate) fn text(report: &str) {
    print!("{report}");
    if !report.ends_with('\n') {
        println!();
    }
}

/// Data on stdout for scripts and pipes (tables, CSV, JSON, console
/// lines), flushed at once. `Ok(false)` when the reader has gone away
/// (`| head`): the end of the output, not a failure.
pub(crate) fn data(text: &str) -> anyhow::Result<bool> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(anyhow::Error::from(e).context("cannot write to stdout")),
    }
}

/// The final error of a failed command, with its chain of causes; a cause
/// whose text the message already holds is not repeated.
pub(crate) fn error(e: &anyhow::Error) {
    eprintln!("error: {}", chain(e));
}

fn chain(e: &anyhow::Error) -> String {
    let mut message = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::chain;

    #[test]
    fn causes_already_in_the_message_are_not_repeated() {
        let io = std::io::Error::other("disk full");
        let wrapped = anyhow::Error::from(io).context("cannot write x");
        assert_eq!(chain(&wrapped), "cannot write x: disk full");
        #[derive(Debug, thiserror::Error)]
        #[error("lost the store: {source}")]
        struct Lost {
            source: std::io::Error,
        }
        let lost = anyhow::Error::from(Lost {
            source: std::io::Error::other("reset"),
        });
        assert_eq!(chain(&lost), "lost the store: reset");
    }
}

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

/// A transfer's progress bar on stderr, drawn only when stderr is a
/// terminal (nothing in files, pipes and CI logs). `set_position` /
/// `set_length` as bytes go; `finish_and_clear` at the end.
pub(crate) fn transfer_bar(what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal as _;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(0);
    let style = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(what.to_owned());
    bar
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

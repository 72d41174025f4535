//! `relaunch logs RUN`: a run's console lines, page by page, and with
//! `--follow` the new ones as they arrive until the run ends.
//!
//! Each page asks for the lines after the last one printed, so no line is
//! printed twice, whatever the pages and waits in between.

use std::time::Duration;

use relaunch_api::{LogLine, RunStatus, Stream};
use relaunch_client::http::LogsQuery;
use relaunch_client::{Client, ClientError};

use crate::cli::LogsArgs;
use crate::{output, tracking};

/// Lines asked for per request (the server's default page).
const PAGE: u32 = 10_000;
/// Seconds a follow's request waits on the server for a new line.
const FOLLOW_WAIT: f64 = 25.0;
/// How often a follow checks whether the run has ended while it waits for
/// lines, so that it stops soon after the run does.
const STATUS_POLL: Duration = Duration::from_secs(1);

pub(crate) fn run(args: &LogsArgs) -> anyhow::Result<u8> {
    let client = tracking::connect(&args.connection)?;
    tracking::block_on(async {
        let stop = super::stop_signal(None)?;
        let printing = print_lines(&client, args);
        tokio::select! {
            result = printing => result,
            () = stop => Ok(0),
        }
    })?
}

/// Where the printing stands: the last line printed and whether the run has
/// ended (after which whatever remains is printed and the command ends).
struct Cursor {
    after: u64,
    ended: bool,
}

async fn print_lines(client: &Client, args: &LogsArgs) -> anyhow::Result<u8> {
    let run = args.run.as_str();
    let fail = |e: ClientError| tracking::explain(e, client, Some(run));
    let mut cursor = Cursor {
        after: args.after,
        // Without --follow, the run counts as ended: print what is there.
        ended: !args.follow || has_ended(client, run).await.map_err(fail)?,
    };
    if let Some(n) = args.tail {
        let query = LogsQuery {
            rank: args.rank,
            tail: Some(n),
            ..LogsQuery::default()
        };
        let last = client.logs(run, &query).await.map_err(fail)?;
        if !output::data(&render(&last))? {
            return Ok(0);
        }
        // With nothing yet, a follow starts from the first line.
        if let Some(line) = last.last() {
            cursor.after = line.id;
        }
        if cursor.ended {
            return Ok(0);
        }
    }
    loop {
        let query = LogsQuery {
            rank: args.rank,
            after: cursor.after,
            limit: Some(PAGE),
            wait: if cursor.ended { 0.0 } else { FOLLOW_WAIT },
            tail: None,
        };
        let page = if cursor.ended {
            client.logs(run, &query).await.map_err(fail)?
        } else {
            tokio::select! {
                page = client.logs(run, &query) => page.map_err(fail)?,
                ended = wait_until_ended(client, run) => {
                    ended.map_err(fail)?;
                    // Lines may have landed since the last page: drain them.
                    cursor.ended = true;
                    continue;
                }
            }
        };
        if let Some(last) = page.last() {
            cursor.after = last.id;
        }
        if !output::data(&render(&page))? {
            return Ok(0);
        }
        // A full page, or (the run having ended) any lines: there may be
        // more (a page also stops at the server's byte budget,
        // `LOG_PAGE_BYTES`). Caught up only at an empty page.
        if page.len() == PAGE as usize || (cursor.ended && !page.is_empty()) {
            continue;
        }
        if cursor.ended {
            return Ok(0);
        }
        cursor.ended = has_ended(client, run).await.map_err(fail)?;
    }
}

async fn has_ended(client: &Client, run: &str) -> Result<bool, ClientError> {
    let info = client.get_run(run).await?;
    Ok(matches!(
        info.status,
        RunStatus::Finished | RunStatus::Failed
    ))
}

async fn wait_until_ended(client: &Client, run: &str) -> Result<(), ClientError> {
    loop {
        tokio::time::sleep(STATUS_POLL).await;
        if has_ended(client, run).await? {
            return Ok(());
        }
    }
}

/// `[rank R] text`, and `[rank R:err] text` for stderr.
fn render(lines: &[LogLine]) -> String {
    let mut s = String::new();
    for line in lines {
        let stream = match line.stream {
            Stream::Stdout => "",
            Stream::Stderr => ":err",
        };
        s.push_str(&format!("[rank {}{stream}] {}\n", line.rank, line.text));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_lines_are_marked() {
        let line = |id, rank, stream, text: &str| LogLine {
            id,
            rank,
            stream,
            attempt: 0,
            wall: 0.0,
            text: text.into(),
        };
        assert_eq!(
            render(&[
                line(1, 0, Stream::Stdout, "step 1"),
                line(2, 3, Stream::Stderr, "warning: slow")
            ]),
            "[rank 0] step 1\n[rank 3:err] warning: slow\n"
        );
    }
}

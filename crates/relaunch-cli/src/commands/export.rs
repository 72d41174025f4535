//! `relaunch export RUN...`: every point of some runs' metrics, unsampled,
//! as CSV, read in the server's column format (`GET /runs/{id}/history`)
//! and written to stdout as it is converted.

use std::io::Write as _;

use anyhow::{Context as _, anyhow};
use relaunch_api::HistoryQuery;
use relaunch_api::columns::{self, Columns};
use relaunch_client::ErrorKind;

use crate::cli::{ExportArgs, ExportFormat};
use crate::render::number;
use crate::tracking;

pub(crate) fn run(args: &ExportArgs) -> anyhow::Result<u8> {
    super::metrics::check_step_range(args.min_step, args.max_step)?;
    let ExportFormat::Csv = args.format;
    let client = tracking::connect(&args.connection)?;
    let query = HistoryQuery {
        keys: args.keys.clone(),
        rank: args.rank,
        min_step: args.min_step,
        max_step: args.max_step,
        attempt: args.attempt,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    let mut write = |text: &[u8]| -> anyhow::Result<bool> {
        match out.write_all(text) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(anyhow::Error::from(e).context("cannot write to stdout")),
        }
    };
    if !write(b"run,rank,step,key,value,wall,attempt\n")? {
        return Ok(0);
    }
    for run in &args.runs {
        let body = tracking::block_on(async {
            match client.history(run, &query).await {
                Ok(body) => Ok(body),
                Err(e) if e.kind() == ErrorKind::NotFound => match client.get_run(run).await {
                    Ok(_) => Err(anyhow!("run {run:?}: {e}")),
                    Err(_) => Err(tracking::run_not_found(&client, run)),
                },
                Err(e) => Err(tracking::explain(e, &client, Some(run))),
            }
        })??;
        let series = columns::decode(&body)
            .with_context(|| format!("the history of run {run:?} came back damaged"))?;
        let mut rows = Vec::with_capacity(1 << 20);
        for s in &series {
            for i in 0..s.step.len() {
                row(&mut rows, run, s, i);
                if rows.len() >= 1 << 20 {
                    if !write(&rows)? {
                        return Ok(0);
                    }
                    rows.clear();
                }
            }
        }
        if !write(&rows)? {
            return Ok(0);
        }
    }
    match out.flush() {
        Ok(()) => Ok(0),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(anyhow::Error::from(e).context("cannot write to stdout")),
    }
}

/// One CSV row: names quoted when they hold a comma, a quote or a line
/// break; values as `relaunch metrics` writes them (`nan`, `inf`, `-inf`).
fn row(out: &mut Vec<u8>, run: &str, s: &Columns, i: usize) {
    let value = s.value[i];
    let value = if value.is_nan() {
        "nan".to_owned()
    } else {
        number(value)
    };
    let line = format!(
        "{},{},{},{},{value},{},{}\n",
        field(run),
        s.rank,
        s.step[i],
        field(&s.key),
        s.wall[i],
        s.attempt[i]
    );
    out.extend_from_slice(line.as_bytes());
}

fn field(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\"")).into()
    } else {
        text.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_exact_and_names_quoted_when_they_must_be() {
        let s = Columns {
            key: "loss,\"a\"".into(),
            rank: 1,
            step: vec![-3, i64::MAX],
            value: vec![f64::NAN, 0.1 + 0.2],
            wall: vec![1.5, 2.0],
            attempt: vec![0, 2],
        };
        let mut out = Vec::new();
        row(&mut out, "r1", &s, 0);
        row(&mut out, "r1", &s, 1);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "r1,1,-3,\"loss,\"\"a\"\"\",nan,1.5,0\n\
             r1,1,9223372036854775807,\"loss,\"\"a\"\"\",0.30000000000000004,2,2\n"
        );
    }
}

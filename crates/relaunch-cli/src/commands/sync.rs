//! `relaunch sync [DIR]`: ships the spools under a directory (runs logged
//! offline, or left by processes that died) and reports each one; without
//! DIR, the client's directory (`RELAUNCH_DIR`, else the default).

use relaunch_client::sync::{Outcome, Report, SyncOptions, sync};

use crate::cli::SyncArgs;
use crate::{output, tracking};

/// Exit code 1 when any spool was not shipped.
pub(crate) fn run(args: &SyncArgs) -> anyhow::Result<u8> {
    // Only the flags: without --server each spool goes to the server it
    // was logged for, and only then to RELAUNCH_SERVER (which `sync` reads).
    let options = SyncOptions {
        server: args
            .connection
            .server
            .clone()
            .filter(|s| !s.trim().is_empty()),
        token: tracking::token(&args.connection),
        timeout: args.timeout,
    };
    let dir = args.dir.clone().unwrap_or_else(|| {
        relaunch_client::env::var(relaunch_client::local::DIR_ENV)
            .map(Into::into)
            .unwrap_or_else(relaunch_client::local::default_dir)
    });
    // Blocking, with a runtime of its own: not called from inside one.
    let reports = sync(&dir, &options)?;
    let mut text: String = reports.iter().map(line).collect();
    text.push_str(&summary(&dir.display().to_string(), &reports));
    output::data(&text)?;
    let failed = reports
        .iter()
        .any(|r| matches!(r.outcome, Outcome::Failed(_)));
    Ok(u8::from(failed))
}

fn line(report: &Report) -> String {
    let mut s = report.path.display().to_string();
    if let Some(run) = &report.run {
        s.push_str(&format!("  run {run}"));
    }
    if let Some(writer) = &report.writer {
        s.push_str(&format!("  writer {writer}"));
    }
    let outcome = match &report.outcome {
        Outcome::Shipped { records } => format!("shipped {records} {}", plural(*records, "record")),
        Outcome::Uploaded { name, bytes } => format!("uploaded {name} ({bytes} bytes)"),
        Outcome::Empty => "nothing left to ship".to_owned(),
        Outcome::InUse => "in use by a live process, which ships it".to_owned(),
        Outcome::Failed(reason) => format!("failed: {reason}"),
    };
    format!("{s}  {outcome}\n")
}

fn summary(dir: &str, reports: &[Report]) -> String {
    if reports.is_empty() {
        return format!("no spools under {dir}: nothing to ship\n");
    }
    let (mut shipped, mut records, mut empty, mut in_use, mut failed) = (0, 0, 0, 0, 0);
    let mut files = 0u64;
    for report in reports {
        match report.outcome {
            Outcome::Shipped { records: n } => {
                shipped += 1;
                records += n;
            }
            Outcome::Uploaded { .. } => files += 1,
            Outcome::Empty => empty += 1,
            Outcome::InUse => in_use += 1,
            Outcome::Failed(_) => failed += 1,
        }
    }
    let total = reports.len() as u64 - files;
    let uploaded = if files > 0 {
        format!(", {files} saved {} uploaded", plural(files, "file"))
    } else {
        String::new()
    };
    format!(
        "{total} {} under {dir}: {shipped} shipped ({records} {}), {empty} with nothing left, \
         {in_use} in use, {failed} failed{uploaded}\n",
        plural(total, "spool"),
        plural(records, "record"),
    )
}

fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        word.to_owned()
    } else {
        format!("{word}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(path: &str, outcome: Outcome) -> Report {
        Report {
            path: path.into(),
            run: Some("r1".into()),
            writer: Some("rank0-abc".into()),
            outcome,
        }
    }

    #[test]
    fn each_outcome_has_a_line_and_the_summary_counts_them() {
        let reports = [
            report("d/r1/a", Outcome::Shipped { records: 12 }),
            report("d/r1/b", Outcome::Empty),
            report("d/r1/c", Outcome::InUse),
            report("d/r1/d", Outcome::Failed("no server".into())),
        ];
        let text: String = reports.iter().map(line).collect::<String>() + &summary("d", &reports);
        insta::assert_snapshot!(text, @r"
        d/r1/a  run r1  writer rank0-abc  shipped 12 records
        d/r1/b  run r1  writer rank0-abc  nothing left to ship
        d/r1/c  run r1  writer rank0-abc  in use by a live process, which ships it
        d/r1/d  run r1  writer rank0-abc  failed: no server
        4 spools under d: 1 shipped (12 records), 1 with nothing left, 1 in use, 1 failed
        ");
        assert_eq!(summary("d", &[]), "no spools under d: nothing to ship\n");
    }
}

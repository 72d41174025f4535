//! `relaunch server migrate`: opens the two sides from the flags (the
//! source read-only, first, so a wrong source fails before a target is
//! made), runs `relaunch_server::migrate`, and prints its progress and the
//! closing count table.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, anyhow, bail};
use relaunch_server::migrate::{self, Options, PAUSE_ENV, Progress, Report, Side};
use relaunch_server::storage::StorageError;
use relaunch_server::storage::blobs::{BlobStore, DirBlobs};
use relaunch_server::storage::postgres::PgTransfer;
use relaunch_server::storage::s3::S3Blobs;
use relaunch_server::storage::sqlite::{Durability, SqliteTransfer};
use relaunch_server::storage::transfer::Transfer;

use crate::cli::MigrateArgs;
use crate::output;

pub(crate) fn run(args: &MigrateArgs) -> anyhow::Result<u8> {
    check_distinct(args)?;
    let mut source = open_source(args)?;
    let mut target = open_target(args)?;
    output::status(&format!(
        "migrating from {} (files: {}) to {} (files: {})",
        source.rows.place(),
        source.blobs_place,
        target.rows.place(),
        target.blobs_place
    ));
    let options = Options {
        pause_before_commit: std::env::var(PAUSE_ENV).ok().and_then(|v| v.parse().ok()),
    };
    let report = migrate::migrate(&mut source, &mut target, &options, &mut show_progress)
        .map_err(message)?;
    output::text(&table(&report));
    if report.matches() {
        output::status(&format!(
            "done: {} run(s) copied, {} already in the target; every count matches",
            report.copied, report.skipped
        ));
        Ok(0)
    } else {
        bail!(
            "the target's counts differ from the source's (see the table); run the migration \
             again, and if they still differ, report it with the table"
        )
    }
}

fn show_progress(progress: Progress<'_>) {
    match progress {
        Progress::Planned { runs, present } => output::status(&format!(
            "{runs} run(s) in the source, {present} already in the target, {} to copy",
            runs - present
        )),
        Progress::Copied {
            run,
            index,
            total,
            points,
            lines,
            chunks_sent,
            chunks_present,
        } => output::status(&format!(
            "[{index}/{total}] copied run {run}: {points} metric points, {lines} console lines, \
             {chunks_sent} file chunks sent ({chunks_present} already there)"
        )),
        Progress::Paused { run } => {
            output::status(&format!("paused before committing run {run} ({PAUSE_ENV})"));
        }
    }
}

/// A storage error as one line (its messages name the flag and the fix).
fn message(e: StorageError) -> anyhow::Error {
    match e {
        StorageError::Invalid(m)
        | StorageError::Backend(m)
        | StorageError::Conflict(m)
        | StorageError::Unavailable(m) => anyhow!("{m}"),
        other => anyhow!("{other}"),
    }
}

/// Refuses a target that is the source.
fn check_distinct(args: &MigrateArgs) -> anyhow::Result<()> {
    if let (Some(from), Some(to)) = (&args.from, &args.to)
        && same_dir(from, to)
    {
        bail!("--from and --to are the same directory; give --to another one");
    }
    if args.from_database.is_some() && args.from_database == args.database {
        bail!("--from-database and --database are the same database; give --database another one");
    }
    if args.from_blobs.is_some()
        && args.from_blobs == args.blobs
        && args.from_s3_endpoint == args.s3_endpoint
    {
        bail!("--from-blobs and --blobs are the same location; give --blobs another one");
    }
    Ok(())
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

fn open_source(args: &MigrateArgs) -> anyhow::Result<Side> {
    let rows: Box<dyn Transfer> = match (&args.from_database, &args.from) {
        (Some(url), _) => Box::new(PgTransfer::open_source(url).map_err(message)?),
        (None, Some(dir)) => Box::new(SqliteTransfer::open_source(dir).map_err(message)?),
        (None, None) => bail!("give the source: --from DIR or --from-database URL"),
    };
    let (blobs, blobs_place): (Arc<dyn BlobStore>, String) = match (&args.from_blobs, &args.from) {
        (Some(url), _) => (
            Arc::new(
                S3Blobs::open(url, args.from_s3_endpoint.as_deref(), std::env::vars())
                    .map_err(for_source)?,
            ),
            url.clone(),
        ),
        (None, Some(dir)) => {
            if !dir.is_dir() {
                bail!(
                    "the data directory {} does not exist; give --from the --data-dir that \
                     relaunch server used",
                    dir.display()
                );
            }
            (
                Arc::new(DirBlobs::open_read_only(dir)),
                dir.display().to_string(),
            )
        }
        (None, None) => bail!(
            "--from-database holds no file chunks: give --from-blobs s3://BUCKET/PREFIX (the \
             source server's --blobs) or --from DIR (its --data-dir)"
        ),
    };
    Ok(Side {
        rows,
        blobs,
        blobs_place,
    })
}

fn open_target(args: &MigrateArgs) -> anyhow::Result<Side> {
    // Chunks first, as `relaunch server` does: a bad --blobs is said
    // before a directory or a schema is made.
    let (blobs, blobs_place): (Arc<dyn BlobStore>, String) = match (&args.blobs, &args.to) {
        (Some(url), _) => (
            Arc::new(
                S3Blobs::open(url, args.s3_endpoint.as_deref(), std::env::vars())
                    .map_err(message)?,
            ),
            url.clone(),
        ),
        (None, Some(dir)) => (
            Arc::new(
                DirBlobs::open(dir, Durability::Fsync)
                    .map_err(message)
                    .with_context(|| format!("cannot use --to {}", dir.display()))?,
            ),
            dir.display().to_string(),
        ),
        (None, None) => bail!(
            "--database holds no file chunks: give --blobs s3://BUCKET/PREFIX or --to DIR for them"
        ),
    };
    let rows: Box<dyn Transfer> = match (&args.database, &args.to) {
        (Some(url), _) => Box::new(PgTransfer::open_target(url).map_err(message)?),
        (None, Some(dir)) => Box::new(
            SqliteTransfer::open_target(dir, Durability::Fsync)
                .map_err(message)
                .with_context(|| format!("cannot use --to {}", dir.display()))?,
        ),
        (None, None) => bail!("give the target: --database URL or --to DIR"),
    };
    Ok(Side {
        rows,
        blobs,
        blobs_place,
    })
}

/// S3's messages name the server's flags; the source's are `--from-*`.
fn for_source(e: StorageError) -> anyhow::Error {
    let line = message(e)
        .to_string()
        .replace("--blobs", "--from-blobs")
        .replace("--s3-endpoint", "--from-s3-endpoint");
    anyhow!("{line}")
}

/// The count comparison, one table per line.
fn table(report: &Report) -> String {
    let width = report
        .counts
        .iter()
        .map(|c| c.table.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!("{:<width$}  {:>14}  {:>14}\n", "table", "source", "target");
    for c in &report.counts {
        let mark = if c.source == c.target {
            ""
        } else {
            "  DIFFERS"
        };
        out.push_str(&format!(
            "{:<width$}  {:>14}  {:>14}{mark}\n",
            c.table, c.source, c.target
        ));
    }
    out
}

//! `relaunch files ls|put|get`: a run's files on a tracking server.

use std::path::PathBuf;

use anyhow::Context as _;
use relaunch_client::checkpoints;
use relaunch_client::files::{download, upload};
use relaunch_client::mirror::{self, Filter, Options, Report};

use crate::cli::{
    CkptPullArgs, FilesGetArgs, FilesLsArgs, FilesPutArgs, FilesSyncArgs, ListFormat,
};
use crate::render::{age, now, table};
use crate::{output, tracking};

pub(crate) fn ls(args: &FilesLsArgs) -> anyhow::Result<u8> {
    let client = tracking::connect(&args.connection)?;
    let files = tracking::block_on(client.files(&args.run))?
        .map_err(|e| tracking::explain(e, &client, Some(&args.run)))?;
    let text = match args.format {
        ListFormat::Table => {
            if files.is_empty() {
                output::status(&format!("run {} has no files", args.run));
            }
            let now = now();
            let rows: Vec<Vec<String>> = files
                .iter()
                .map(|f| {
                    vec![
                        f.name.clone(),
                        f.size.to_string(),
                        f.chunks.to_string(),
                        age(f.created_at, now),
                        f.blake3.clone(),
                    ]
                })
                .collect();
            table(&["NAME", "BYTES", "CHUNKS", "SAVED", "BLAKE3"], &rows)
        }
        ListFormat::Json => {
            let mut text = serde_json::to_string_pretty(&files).context("cannot write JSON")?;
            text.push('\n');
            text
        }
    };
    output::data(&text)?;
    Ok(0)
}

pub(crate) fn put(args: &FilesPutArgs) -> anyhow::Result<u8> {
    let client = tracking::connect(&args.connection)?;
    let name = match &args.name {
        Some(name) => name.clone(),
        None => args
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .with_context(|| {
                format!(
                    "{} has no file name; give one with --name",
                    args.path.display()
                )
            })?,
    };
    if !args.path.is_file() {
        anyhow::bail!(
            "{} is not a file; `relaunch files put` uploads one file",
            args.path.display()
        );
    }
    let bar = output::transfer_bar(&format!("uploading {name}"));
    let progress = follow(&bar);
    let uploaded = tracking::block_on(upload(&client, &args.run, &args.path, &name, &progress))?
        .map_err(|e| tracking::explain(e, &client, Some(&args.run)))?;
    bar.finish_and_clear();
    output::text(&format!(
        "{name}: {} bytes in {} chunks, {} sent ({} bytes), the rest already on {}",
        uploaded.file.size,
        uploaded.chunks,
        uploaded.sent_chunks,
        uploaded.sent_bytes,
        client.url()
    ));
    Ok(0)
}

pub(crate) fn get(args: &FilesGetArgs) -> anyhow::Result<u8> {
    let client = tracking::connect(&args.connection)?;
    let dest = match &args.dest {
        Some(dest) if dest.is_dir() => dest.join(last_part(&args.name)),
        Some(dest) => dest.clone(),
        None => PathBuf::from(last_part(&args.name)),
    };
    let bar = output::transfer_bar(&format!("downloading {}", args.name));
    let progress = follow(&bar);
    let got = tracking::block_on(download(&client, &args.run, &args.name, &dest, &progress))?
        .map_err(|e| tracking::explain(e, &client, Some(&args.run)))?;
    bar.finish_and_clear();
    let resumed = if got.resumed_from > 0 {
        format!(" (resumed at byte {})", got.resumed_from)
    } else {
        String::new()
    };
    output::text(&format!(
        "{}: {} bytes to {}{resumed}, BLAKE3 {} verified",
        args.name,
        got.size,
        dest.display(),
        got.blake3
    ));
    Ok(0)
}

/// `relaunch ckpt pull`.
/// `RUN[:PREFIX]`: the run and the prefix without its slashes at either end.
fn run_and_prefix(spec: &str) -> (&str, &str) {
    match spec.split_once(':') {
        Some((run, prefix)) => (run, prefix.trim_matches('/')),
        None => (spec, ""),
    }
}

pub(crate) fn sync(args: &FilesSyncArgs) -> anyhow::Result<u8> {
    let options = Options {
        filter: Filter::new(&args.rules).map_err(|e| anyhow::anyhow!(e))?,
        delete: args.delete,
        dry_run: args.dry_run,
    };
    let upload = std::path::Path::new(&args.source).is_dir();
    let (spec, local) = if upload {
        (args.dest.as_str(), PathBuf::from(&args.source))
    } else {
        (args.source.as_str(), PathBuf::from(&args.dest))
    };
    let (run, prefix) = run_and_prefix(spec);
    if let Err(e) = relaunch_api::names::check_name("run id", run) {
        anyhow::bail!(
            "{e}; `relaunch files sync` takes a local directory and RUN[:PREFIX], in either \
             order{}",
            if upload {
                String::new()
            } else {
                format!(" ({} is not a local directory)", args.source)
            }
        );
    }
    if !prefix.is_empty() {
        relaunch_api::files::check_file_name(prefix)
            .map_err(|e| anyhow::anyhow!("the prefix in {spec:?}: {e}"))?;
    }
    if !upload && local.exists() && !local.is_dir() {
        anyhow::bail!("{} is not a directory", local.display());
    }
    let client = tracking::connect(&args.connection)?;
    if let Some(every) = args.watch {
        if !upload {
            anyhow::bail!(
                "--watch keeps a local directory uploaded: give the directory first, then \
                 RUN[:PREFIX] ({} is not a local directory)",
                args.source
            );
        }
        return watch(&client, &local, run, prefix, &options, every);
    }
    let what = if upload { "uploading" } else { "downloading" };
    let bar = output::transfer_bar(&format!("{what} {spec}"));
    let progress = follow(&bar);
    let report = tracking::block_on(async {
        if upload {
            mirror::push(&client, &local, run, prefix, &options, &progress).await
        } else {
            mirror::pull(&client, run, prefix, &local, &options, &progress).await
        }
    })?
    .map_err(|e| tracking::explain(e, &client, Some(run)))?;
    bar.finish_and_clear();
    output::text(&summary(&report, upload, args.dry_run));
    Ok(u8::from(!report.skipped.is_empty()))
}

/// `--watch`: a pass every `every` until SIGTERM or SIGINT, then a last
/// one whose failure is the command's. A pass that fails (the server away)
/// is reported and tried again at the next.
fn watch(
    client: &relaunch_client::http::Client,
    dir: &std::path::Path,
    run: &str,
    prefix: &str,
    options: &Options,
    every: std::time::Duration,
) -> anyhow::Result<u8> {
    use tokio::signal::unix::{SignalKind, signal};
    let quiet = |_: u64, _: u64| {};
    tracking::block_on(async {
        let mut term = signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot watch for SIGINT")?;
        loop {
            match mirror::push(client, dir, run, prefix, options, &quiet).await {
                Ok(report)
                    if report.transfers.is_empty()
                        && report.skipped.is_empty()
                        && report.deleted.is_empty() => {}
                Ok(report) => output::text(&summary(&report, true, false)),
                Err(e) => output::status(&format!(
                    "relaunch files sync: {}; trying again in {} s",
                    tracking::explain(e, client, Some(run)),
                    every.as_secs_f64()
                )),
            }
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        let report = mirror::push(client, dir, run, prefix, options, &quiet)
            .await
            .map_err(|e| tracking::explain(e, client, Some(run)))?;
        output::text(&format!("last pass: {}", summary(&report, true, false)));
        Ok(u8::from(!report.skipped.is_empty()))
    })?
}

/// What a sync did, one line per transfer on a dry run, then the totals.
pub(crate) fn summary(report: &Report, upload: bool, dry_run: bool) -> String {
    let mut text = String::new();
    let verb = match (upload, dry_run) {
        (true, true) => "would upload",
        (false, true) => "would download",
        (true, false) => "uploaded",
        (false, false) => "downloaded",
    };
    if dry_run {
        for t in &report.transfers {
            text.push_str(&format!("{verb} {} ({} bytes)\n", t.name, t.size));
        }
    }
    for skipped in &report.skipped {
        text.push_str(&format!("not synced: {skipped}\n"));
    }
    let deleting = if dry_run { "would delete" } else { "deleted" };
    for deleted in &report.deleted {
        text.push_str(&format!("{deleting} {deleted}\n"));
    }
    let bytes: u64 = report.transfers.iter().map(|t| t.size).sum();
    text.push_str(&format!(
        "{} file(s) {verb} ({bytes} bytes{}), {} unchanged, {} excluded, {} not synced{}",
        report.transfers.len(),
        if dry_run {
            String::new()
        } else {
            format!(", {} sent", report.sent_bytes)
        },
        report.unchanged,
        report.excluded,
        report.skipped.len(),
        if report.deleted.is_empty() {
            String::new()
        } else {
            format!(", {} {deleting}", report.deleted.len())
        },
    ));
    text
}

pub(crate) fn pull(args: &CkptPullArgs) -> anyhow::Result<u8> {
    let client = tracking::connect(&args.connection)?;
    let bar = output::transfer_bar(&format!("pulling a checkpoint of {}", args.run));
    let progress = follow(&bar);
    let pulled = tracking::block_on(checkpoints::pull(
        &client, &args.run, args.step, &args.dir, &progress,
    ))?
    .map_err(|e| tracking::explain(e, &client, Some(&args.run)))?;
    bar.finish_and_clear();
    output::text(&format!(
        "step {}: {} files, {} bytes in {}; relaunch.Checkpointer({:?}).latest() resumes from it",
        pulled.step,
        pulled.files,
        pulled.bytes,
        pulled.dir.display(),
        args.dir.display().to_string()
    ));
    Ok(0)
}

/// A transfer's progress callback that moves `bar`.
fn follow(bar: &indicatif::ProgressBar) -> impl Fn(u64, u64) + Send + Sync + '_ {
    move |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    }
}

fn last_part(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

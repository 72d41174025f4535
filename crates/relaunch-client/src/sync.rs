//! `relaunch sync DIR`: ships what spools under a directory hold (runs
//! logged offline, or left by processes that died before their shipper
//! finished) and removes each spool once the server has all of it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::env;
use crate::error::ClientError;
use crate::http::{Client, normalize_server};
use crate::local::{self, Found};
use crate::shipper::{Outbox, Shipper};
use crate::spool::{Spool, SpoolError, SpoolOptions};
use crate::uploads;

#[derive(Clone, Debug, Default)]
pub struct SyncOptions {
    /// Where to ship; else the server each spool was logged for, else
    /// `RELAUNCH_SERVER`.
    pub server: Option<String>,
    pub token: Option<String>,
    /// How long to wait for the server; `None` waits as long as it takes.
    pub timeout: Option<Duration>,
}

/// What became of one place under the directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Its records are on the server and the spool is removed.
    Shipped { records: u64 },
    /// A file saved with `run.save_file` is on the server, as `name`.
    Uploaded { name: String, bytes: u64 },
    /// Nothing was left to ship; the spool is removed.
    Empty,
    /// A live process holds it and ships it itself.
    InUse,
    /// Not shipped: why, and what to do.
    Failed(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub path: PathBuf,
    pub run: Option<String>,
    pub writer: Option<String>,
    pub outcome: Outcome,
}

/// Ships every spool at or below `root`; one report per spool found, also
/// for those that failed (the caller decides the exit status).
pub fn sync(root: &Path, options: &SyncOptions) -> Result<Vec<Report>, ClientError> {
    let mut reports = Vec::new();
    // Spools to ship, by server.
    let mut by_server: BTreeMap<String, Vec<(Outbox, usize, u64)>> = BTreeMap::new();
    for found in local::find_writers(root)? {
        let path = match found {
            Found::Symlink(path) => {
                reports.push(Report {
                    path,
                    run: None,
                    writer: None,
                    outcome: Outcome::Failed(
                        "a symbolic link: sync does not follow links; sync what it points to directly, or remove it".into(),
                    ),
                });
                continue;
            }
            Found::Writer(path) => path,
        };
        let mut report = Report {
            path: path.clone(),
            run: None,
            writer: None,
            outcome: Outcome::Empty,
        };
        let info = match local::read_writer(&path) {
            Ok(info) => info,
            Err(e) => {
                report.outcome = Outcome::Failed(e.to_string());
                reports.push(report);
                continue;
            }
        };
        report.run = Some(info.run_id().to_owned());
        report.writer = Some(info.writer.clone());
        let spool = match Spool::open(&path, SpoolOptions::default()) {
            Ok(spool) => spool,
            Err(SpoolError::Busy { .. }) => {
                report.outcome = Outcome::InUse;
                reports.push(report);
                continue;
            }
            Err(e) => {
                report.outcome = Outcome::Failed(e.to_string());
                reports.push(report);
                continue;
            }
        };
        let pending = spool.pending();
        if pending == 0 {
            // Removed while its lock is held: an adopter or a resumed writer
            // that locked it between an unlock and the removal would lose
            // what it then wrote.
            if let Err(e) = local::remove_writer(&spool) {
                report.outcome = Outcome::Failed(e.to_string());
            }
            drop(spool);
            reports.push(report);
            continue;
        }
        let server = options
            .server
            .clone()
            .or_else(|| info.server.clone())
            .or_else(|| env::var(env::SERVER));
        let server = match server.as_deref().map(normalize_server) {
            Some(Ok(server)) => server,
            Some(Err(e)) => {
                report.outcome = Outcome::Failed(e.to_string());
                reports.push(report);
                continue;
            }
            None => {
                report.outcome = Outcome::Failed(format!(
                    "logged offline and no server given: pass --server URL or set {}",
                    env::SERVER
                ));
                reports.push(report);
                continue;
            }
        };
        let index = reports.len();
        reports.push(report);
        by_server.entry(server).or_default().push((
            Outbox {
                dir: path,
                info,
                spool: Arc::new(Mutex::new(spool)),
                adopted: true,
            },
            index,
            pending,
        ));
    }
    let token = options
        .token
        .clone()
        .or_else(|| env::var(env::SERVER_TOKEN));
    for (server, outboxes) in by_server {
        ship_to(
            &server,
            token.as_deref(),
            options.timeout,
            outboxes,
            &mut reports,
        )?;
    }
    // Saved files, after the records (which open their runs on the server).
    for dir in pending_uploads(root) {
        reports.push(upload_one(&dir, options, token.as_deref()));
    }
    Ok(reports)
}

/// Pending uploads at or below `root`: `root` is the client directory or
/// one run's (a writer's holds none).
fn pending_uploads(root: &Path) -> Vec<PathBuf> {
    let mut runs = vec![root.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(root) {
        runs.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    let mut found = Vec::new();
    for run in runs {
        let (Some(parent), Some(name)) = (run.parent(), run.file_name()) else {
            continue;
        };
        found.extend(uploads::pending(parent, &name.to_string_lossy()));
    }
    found
}

fn upload_one(dir: &Path, options: &SyncOptions, token: Option<&str>) -> Report {
    let mut report = Report {
        path: dir.to_path_buf(),
        run: None,
        writer: None,
        outcome: Outcome::Empty,
    };
    let outcome = (|| {
        let intent = uploads::read_intent(dir)?;
        report.run = Some(intent.run.clone());
        let server = options
            .server
            .clone()
            .or_else(|| intent.server.clone())
            .or_else(|| env::var(env::SERVER))
            .ok_or_else(|| {
                ClientError::Config(format!(
                    "saved offline and no server given: pass --server URL or set {}",
                    env::SERVER
                ))
            })?;
        let client = Client::new(&server, token)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Config(format!("cannot start a runtime: {e}")))?;
        let shipped = runtime.block_on(async {
            match options.timeout {
                Some(t) => tokio::time::timeout(t, uploads::ship(&client, dir))
                    .await
                    .map_err(|_| {
                        ClientError::Timeout(format!(
                            "the upload took over {:.1} s",
                            t.as_secs_f64()
                        ))
                    })?,
                None => uploads::ship(&client, dir).await,
            }
        })?;
        Ok::<_, ClientError>(match shipped {
            uploads::Shipped::Done(up) => Outcome::Uploaded {
                name: up.file.name,
                bytes: up.file.size,
            },
            uploads::Shipped::Busy => Outcome::InUse,
        })
    })();
    report.outcome = outcome.unwrap_or_else(|e| Outcome::Failed(e.to_string()));
    report
}

fn ship_to(
    server: &str,
    token: Option<&str>,
    timeout: Option<Duration>,
    outboxes: Vec<(Outbox, usize, u64)>,
    reports: &mut [Report],
) -> Result<(), ClientError> {
    let client = Client::new(server, token)?;
    let watched: Vec<(Arc<Mutex<Spool>>, PathBuf, usize, u64)> = outboxes
        .iter()
        .map(|(o, index, pending)| (o.spool.clone(), o.dir.clone(), *index, *pending))
        .collect();
    let mut shipper = Shipper::start(
        client,
        outboxes.into_iter().map(|(o, _, _)| o).collect(),
        Duration::from_millis(50),
    )?;
    let flushed = shipper.flush(timeout);
    shipper.stop();
    for (spool, dir, index, pending) in watched {
        // The spool stays locked until its directory is gone (see above).
        let locked = spool.lock();
        let left = locked.pending();
        let removed = if left == 0 && dir.exists() {
            local::remove_writer(&locked)
        } else {
            Ok(())
        };
        drop(locked);
        drop(spool);
        reports[index].outcome = if left == 0 {
            match removed {
                Err(e) => Outcome::Failed(e.to_string()),
                Ok(()) => Outcome::Shipped { records: pending },
            }
        } else {
            let why = flushed
                .as_ref()
                .err()
                .map_or_else(|| "the shipper stopped".to_owned(), ToString::to_string);
            Outcome::Failed(format!("{left} of {pending} records not shipped: {why}"))
        };
    }
    Ok(())
}

//! Alerts waiting for delivery, on disk: one file per (alert, webhook) in
//! `DATA_DIR/alerts/`, written whole (a temporary file renamed) before the
//! batch that raised it is acknowledged, removed once the receiver took
//! it. A receiver that is down, or a server that restarts meanwhile, loses
//! nothing; the outbox holds at most [`MAX_PENDING`] files, and an alert
//! beyond that is dropped with a log line rather than filling the disk.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::storage::sqlite::Durability;

/// Deliveries waiting at most.
pub(super) const MAX_PENDING: usize = 10_000;

/// One alert for one webhook.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Delivery {
    /// The webhook's URL (the outbox outlives the flags: one no longer
    /// given at start is dropped, with a line saying so).
    pub(super) url: String,
    /// The JSON to post.
    pub(super) body: Value,
    /// The run and attempt the alert is about, where the delivery is
    /// recorded as an event.
    pub(super) run: String,
    pub(super) attempt_token: String,
    /// What the event says was sent.
    pub(super) title: String,
    /// When the alert was raised, seconds since the Unix epoch.
    pub(super) raised: f64,
}

/// A delivery on disk.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) path: PathBuf,
    pub(super) delivery: Delivery,
}

#[derive(Debug)]
pub(super) struct Outbox {
    dir: PathBuf,
    durability: Durability,
    /// Orders files raised in the same nanosecond.
    counter: AtomicU64,
}

impl Outbox {
    pub(super) fn open(data_dir: &Path, durability: Durability) -> std::io::Result<Self> {
        let dir = data_dir.join("alerts");
        fs::create_dir_all(&dir)?;
        Ok(Self {
            dir,
            durability,
            counter: AtomicU64::new(0),
        })
    }

    /// Writes `delivery` whole; false when the outbox is full (it is then
    /// dropped: the caller logs it).
    pub(super) fn put(&self, delivery: &Delivery) -> std::io::Result<bool> {
        if self.len()? >= MAX_PENDING {
            return Ok(false);
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let name = format!("{nanos:024}-{n:010}-{:08x}.json", std::process::id());
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let mut file = fs::File::create(&tmp)?;
        file.write_all(&serde_json::to_vec(delivery).map_err(std::io::Error::other)?)?;
        if self.durability == Durability::Fsync {
            file.sync_all()?;
        }
        drop(file);
        fs::rename(&tmp, self.dir.join(&name))?;
        if self.durability == Durability::Fsync {
            fs::File::open(&self.dir)?.sync_all()?;
        }
        Ok(true)
    }

    /// Deliveries waiting, oldest first. A file that does not read as one
    /// (damaged on disk) is set aside as `*.bad` with a log line.
    pub(super) fn pending(&self) -> std::io::Result<Vec<Pending>> {
        let mut names: Vec<String> = fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
            .collect();
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let path = self.dir.join(&name);
            let read = fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()));
            match read {
                Ok(delivery) => out.push(Pending { path, delivery }),
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "an alert waiting for delivery cannot be read; set aside as .bad");
                    let _ = fs::rename(&path, path.with_extension("bad"));
                }
            }
        }
        Ok(out)
    }

    /// Deliveries waiting now.
    pub(super) fn len(&self) -> std::io::Result<usize> {
        Ok(fs::read_dir(&self.dir)?
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.ends_with(".json") && !name.starts_with('.')
            })
            .count())
    }

    /// Removes a delivery that is done with (sent, or given up).
    pub(super) fn remove(&self, pending: &Pending) {
        if let Err(e) = fs::remove_file(&pending.path) {
            tracing::warn!(file = %pending.path.display(), error = %e, "cannot remove a delivered alert; it may be sent again");
        }
    }
}

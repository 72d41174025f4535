//! Alerts waiting for delivery, on disk: one file per (alert, webhook) in
//! `DATA_DIR/alerts/`, written whole (a temporary file renamed) before the
//! batch that raised it is acknowledged, removed once the receiver took
//! it. A receiver that is down, or a server that restarts meanwhile, loses
//! nothing; the outbox holds at most [`MAX_PENDING`] files, and an alert
//! beyond that is dropped with a log line rather than filling the disk.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

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
    /// Deliveries on disk: counted once at open, then kept up to date by
    /// `put`, `remove` and the set-asides of `pending` (this server is the
    /// directory's only writer), so that a put lists nothing.
    waiting: AtomicUsize,
    max: usize,
}

impl Outbox {
    pub(super) fn open(data_dir: &Path, durability: Durability) -> std::io::Result<Self> {
        Self::open_with_max(data_dir, durability, MAX_PENDING)
    }

    pub(super) fn open_with_max(
        data_dir: &Path,
        durability: Durability,
        max: usize,
    ) -> std::io::Result<Self> {
        let dir = data_dir.join("alerts");
        fs::create_dir_all(&dir)?;
        let waiting = AtomicUsize::new(count(&dir)?);
        Ok(Self {
            dir,
            durability,
            counter: AtomicU64::new(0),
            waiting,
            max,
        })
    }

    /// Writes `delivery` whole; false when the outbox is full (it is then
    /// dropped: the caller logs it).
    pub(super) fn put(&self, delivery: &Delivery) -> std::io::Result<bool> {
        if self.len() >= self.max {
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
        self.waiting.fetch_add(1, Ordering::Relaxed);
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
                    if fs::rename(&path, path.with_extension("bad")).is_ok() {
                        self.forget_one();
                    }
                }
            }
        }
        Ok(out)
    }

    /// Deliveries waiting now.
    pub(super) fn len(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    fn forget_one(&self) {
        let _ = self
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Removes a delivery that is done with (sent, or given up).
    pub(super) fn remove(&self, pending: &Pending) {
        match fs::remove_file(&pending.path) {
            Ok(()) => self.forget_one(),
            Err(e) => {
                tracing::warn!(file = %pending.path.display(), error = %e, "cannot remove a delivered alert; it may be sent again");
            }
        }
    }
}

/// The deliveries in `dir` (at open: the outbox an earlier process left).
fn count(dir: &Path) -> std::io::Result<usize> {
    Ok(fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.ends_with(".json") && !name.starts_with('.')
        })
        .count())
}

/// Drops said once per run of them: the first drop after a put that fit
/// is said (with the total so far), and the first put that fits again says
/// how many went in between.
#[derive(Debug, Default)]
pub(super) struct Drops {
    total: AtomicU64,
    since: AtomicU64,
    dropping: AtomicBool,
}

impl Drops {
    /// Counts a drop; `Some(total)` when it starts a run (to be said).
    pub(super) fn dropped(&self) -> Option<u64> {
        let total = self.total.fetch_add(1, Ordering::Relaxed) + 1;
        self.since.fetch_add(1, Ordering::Relaxed);
        (!self.dropping.swap(true, Ordering::Relaxed)).then_some(total)
    }

    /// A put fit; `Some(n)` when it ends a run of `n` drops (to be said).
    pub(super) fn fit(&self) -> Option<u64> {
        if !self.dropping.load(Ordering::Relaxed) || !self.dropping.swap(false, Ordering::Relaxed) {
            return None;
        }
        Some(self.since.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn delivery(n: usize) -> Delivery {
        Delivery {
            url: "http://127.0.0.1:1/hook".into(),
            body: serde_json::json!({ "n": n }),
            run: "r".into(),
            attempt_token: String::new(),
            title: format!("alert {n}"),
            raised: 0.0,
        }
    }

    #[test]
    fn the_outbox_counts_without_listing_and_refuses_past_its_bound() {
        // Issue 35: each put listed the directory (10,000 alerts took 28 s
        // to flush). The count comes from the files at open, then moves
        // with puts, removals and set-asides.
        let data = std::env::temp_dir().join(format!("relaunch-outbox-{}", std::process::id()));
        let _ = fs::remove_dir_all(&data);
        let outbox = Outbox::open_with_max(&data, Durability::Process, 3).unwrap();
        assert!(outbox.put(&delivery(0)).unwrap() && outbox.put(&delivery(1)).unwrap());
        fs::write(data.join("alerts").join("0-damaged.json"), b"{").unwrap();
        let reopened = Outbox::open_with_max(&data, Durability::Process, 3).unwrap();
        assert_eq!(reopened.len(), 3);
        assert!(!reopened.put(&delivery(2)).unwrap(), "full");
        let pending = reopened.pending().unwrap(); // sets the damaged one aside
        assert_eq!((pending.len(), reopened.len()), (2, 2));
        reopened.remove(&pending[0]);
        assert_eq!(reopened.len(), 1);
        assert!(reopened.put(&delivery(3)).unwrap());
        assert_eq!(reopened.len(), 2);
        assert_eq!(count(&data.join("alerts")).unwrap(), 2);
        let _ = fs::remove_dir_all(&data);
    }

    #[test]
    fn a_run_of_drops_is_said_once_and_its_end_once() {
        // Issue 35: past the bound every dropped alert had a WARN line.
        let drops = Drops::default();
        assert_eq!(drops.fit(), None);
        assert_eq!(drops.dropped(), Some(1));
        assert_eq!((drops.dropped(), drops.dropped()), (None, None));
        assert_eq!(drops.fit(), Some(3));
        assert_eq!(drops.fit(), None);
        assert_eq!(drops.dropped(), Some(4));
    }
}

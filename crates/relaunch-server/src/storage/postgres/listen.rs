//! Console lines stored by another replica wake this one's log follows:
//! every ingest that stores lines sends `NOTIFY relaunch_logs` inside its
//! transaction (delivered at commit, so a woken follow reads them), and a
//! thread per storage holds a connection that `LISTEN`s and calls back.
//! A lost connection is made again, with one call back after, since
//! notifications sent in between are not replayed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use postgres::NoTls;
use postgres::fallible_iterator::FallibleIterator as _;

use super::connect::Target;
use crate::storage::LogsChanged;

/// The channel every replica listens on.
pub(super) const CHANNEL: &str = "relaunch_logs";

/// How often the listening thread looks at its stop flag.
const STOP_CHECK: Duration = Duration::from_secs(1);
/// Pause before connecting again after the connection was lost.
const RECONNECT: Duration = Duration::from_secs(1);

/// The listening thread; stops (within [`STOP_CHECK`]) once dropped.
#[derive(Debug)]
pub(super) struct Listener {
    stop: Arc<AtomicBool>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Listener {
    pub(super) fn start(target: Target, changed: LogsChanged) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("relaunch-pg-listen".into())
            .spawn(move || listen(&target, &changed, &flag))?;
        Ok(Self { stop })
    }
}

fn listen(target: &Target, changed: &LogsChanged, stop: &AtomicBool) {
    let mut reconnected = false;
    while !stop.load(Ordering::Relaxed) {
        let mut client = match target.config.connect(NoTls) {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(database = %target.shown, error = %e, "cannot listen for other replicas' console lines; retrying");
                std::thread::sleep(RECONNECT);
                continue;
            }
        };
        if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")) {
            tracing::warn!(database = %target.shown, error = %e, "cannot listen for other replicas' console lines; retrying");
            std::thread::sleep(RECONNECT);
            continue;
        }
        if reconnected {
            // What was sent while no connection listened is not replayed.
            changed();
        }
        reconnected = true;
        loop {
            // A fresh iterator per wait: one whose wait timed out stays
            // timed out (its delay is reset only by a notification), and
            // would spin.
            match client.notifications().timeout_iter(STOP_CHECK).next() {
                Ok(Some(_)) => changed(),
                Ok(None) if stop.load(Ordering::Relaxed) => return,
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(database = %target.shown, error = %e, "lost the connection that listens for other replicas' console lines; connecting again");
                    std::thread::sleep(RECONNECT);
                    break;
                }
            }
        }
    }
}

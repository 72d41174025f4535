//! `relaunch run --sync-dir DIR`: the job's output folder mirrored to its
//! run while it trains, and once more after the last worker exits, whatever
//! the exit (the replacement for a bucket mounted with s3fs).
//!
//! A thread of its own with its own runtime, so a slow server never delays
//! the launcher: a pass every `--sync-every` seconds (`mirror::push`: what
//! differs, nothing deleted), a failed pass reported and tried again at the
//! next, and a last pass when the launch returns.

use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use relaunch_client::http::Client;
use relaunch_client::mirror::{self, Options};

use crate::commands::files::summary;
use crate::output;

/// What `--sync-dir` mirrors, and where to.
#[derive(Clone, Debug)]
pub(crate) struct SyncDir {
    pub(crate) dir: PathBuf,
    /// The run's files go under it.
    pub(crate) prefix: String,
    pub(crate) every: Duration,
}

/// The running mirror; [`Mirror::finish`] makes its last pass.
#[derive(Debug)]
pub(crate) struct Mirror {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Mirror {
    /// Starts mirroring `sync.dir` to `run` on `server`.
    pub(crate) fn start(
        sync: SyncDir,
        server: &str,
        token: Option<&str>,
        run: String,
    ) -> anyhow::Result<Self> {
        let client = Client::new(server, token)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("relaunch-sync-dir".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        output::status(&format!("relaunch: --sync-dir cannot start: {e}"));
                        return;
                    }
                };
                let pass = |last: bool| {
                    if !sync.dir.is_dir() {
                        if last {
                            output::status(&format!(
                                "relaunch: --sync-dir {}: no such directory, nothing synced",
                                sync.dir.display()
                            ));
                        }
                        return;
                    }
                    let quiet = |_: u64, _: u64| {};
                    let done = runtime.block_on(mirror::push(
                        &client,
                        &sync.dir,
                        &run,
                        &sync.prefix,
                        &Options::default(),
                        &quiet,
                    ));
                    let place = format!("{} to {run}:{}", sync.dir.display(), sync.prefix);
                    match done {
                        Ok(report) if last => output::status(&format!(
                            "relaunch: --sync-dir {place}: {}",
                            summary(&report, true, false)
                        )),
                        Ok(_) => {}
                        Err(e) => output::status(&format!(
                            "relaunch: --sync-dir {place}: {e}{}",
                            if last {
                                ""
                            } else {
                                "; trying again at the next pass"
                            }
                        )),
                    }
                };
                // Until the launch returns (the sender is dropped).
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(sync.every) {
                    pass(false);
                }
                pass(true);
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The last pass, then the thread's end.
    pub(crate) fn finish(mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

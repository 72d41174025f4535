//! Files a run saves (`run.save_file`), uploaded in the background and
//! never lost to a crash: each is first snapshotted into the client's
//! directory with what it is for, then uploaded, then forgotten.
//!
//! ```text
//! DIR/RUN/.uploads/ID/intent.json   the run, the name, the server, when
//!                     data          the file as it was when saved (a hard
//!                                   link when the file system allows, else a copy)
//!                     lock          flocked by the process uploading it
//! ```
//!
//! A process that dies before its uploads finish leaves them there: the
//! next `relaunch.init` of the same run, or `relaunch sync DIR`, uploads
//! them. The upload itself resumes (chunks the server has are not sent
//! again), and committing a file of the same name twice is harmless.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::error::ClientError;
use crate::files::{self, Uploaded};
use crate::http::Client;
use crate::local;

/// Under a run's directory; a dot, so it is never taken for a writer.
pub const UPLOADS: &str = ".uploads";
const INTENT: &str = "intent.json";
const DATA: &str = "data";
const LOCK: &str = "lock";

/// What a pending upload is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    pub run: String,
    /// The file's name in the run.
    pub name: String,
    /// Where it was meant to go; `None` when saved offline.
    pub server: Option<String>,
    /// The path it was saved from, for messages.
    pub source: String,
}

/// Snapshots `source` and records that it is to be uploaded to `run` as
/// `name`; returns the pending upload's directory. Once this returns, the
/// upload survives the process.
pub fn enqueue(
    client_dir: &Path,
    intent: &Intent,
    source: &Path,
    take: bool,
) -> Result<PathBuf, ClientError> {
    relaunch_api::files::check_file_name(&intent.name).map_err(ClientError::Config)?;
    let meta = fs::metadata(source).map_err(ClientError::io("read", source))?;
    if !meta.is_file() {
        return Err(ClientError::Config(format!(
            "{} is not a file; save_file saves one file",
            source.display()
        )));
    }
    let uploads = local::run_dir(client_dir, &intent.run)?.join(UPLOADS);
    let dir = uploads.join(uuid::Uuid::new_v4().simple().to_string());
    // `.uploads` goes when its last upload is done (see `ship`): one
    // removed between making it and making `dir` in it is made again.
    let mut made = fs::create_dir_all(&dir);
    for _ in 0..3 {
        match &made {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => made = fs::create_dir_all(&dir),
            _ => break,
        }
    }
    made.map_err(ClientError::io("create", &dir))?;
    let data = dir.join(DATA);
    let snapshot = if take {
        fs::rename(source, &data).or_else(|_| fs::copy(source, &data).map(drop))
    } else {
        // A link shares the bytes as they are now: a checkpoint written
        // again by rename leaves the snapshot alone. Across file systems,
        // or where links are refused, a copy.
        fs::hard_link(source, &data).or_else(|_| fs::copy(source, &data).map(drop))
    };
    let written = snapshot.and_then(|()| {
        File::open(&data)?.sync_all()?;
        let json = serde_json::to_vec_pretty(intent).map_err(std::io::Error::other)?;
        let temp = dir.join("intent.json.tmp");
        let mut file = File::create(&temp)?;
        file.write_all(&json)?;
        file.sync_all()?;
        fs::rename(&temp, dir.join(INTENT))?;
        File::open(&dir)?.sync_all()
    });
    if let Err(e) = written {
        let _ = fs::remove_dir_all(&dir);
        return Err(ClientError::io("snapshot", source)(e));
    }
    Ok(dir)
}

/// The pending uploads of `run` in `client_dir`, oldest first.
pub fn pending(client_dir: &Path, run: &str) -> Vec<PathBuf> {
    let Ok(run_dir) = local::run_dir(client_dir, run) else {
        return Vec::new();
    };
    let Ok(entries) = fs::read_dir(run_dir.join(UPLOADS)) else {
        return Vec::new();
    };
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| e.path().join(INTENT).is_file())
        .map(|e| {
            let when = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            (when, e.path())
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// Reads a pending upload's intent.
pub fn read_intent(dir: &Path) -> Result<Intent, ClientError> {
    let path = dir.join(INTENT);
    let text = fs::read(&path).map_err(ClientError::io("read", &path))?;
    serde_json::from_slice(&text).map_err(|e| {
        ClientError::Corrupt(format!(
            "{} is not a pending upload ({e}); remove its directory",
            path.display()
        ))
    })
}

/// What shipping a pending upload came to.
#[derive(Debug)]
pub enum Shipped {
    Done(Uploaded),
    /// Another live process is uploading it.
    Busy,
}

/// Uploads one pending upload and removes it. Another process uploading
/// the same one (it holds the lock) is not an error: [`Shipped::Busy`].
pub async fn ship(client: &Client, dir: &Path) -> Result<Shipped, ClientError> {
    let lock_path = dir.join(LOCK);
    let file = File::create(&lock_path).map_err(ClientError::io("create", &lock_path))?;
    let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(Shipped::Busy),
        Err((_, e)) => {
            return Err(ClientError::io("lock", &lock_path)(std::io::Error::from(e)));
        }
    };
    if !dir.join(INTENT).is_file() {
        // Shipped and removed by another process between listing and lock.
        return Ok(Shipped::Busy);
    }
    let intent = read_intent(dir)?;
    if local::link_inside(dir)?.is_some() {
        return Err(ClientError::Corrupt(format!(
            "{} holds a symbolic link; a pending upload never does: remove it",
            dir.display()
        )));
    }
    let uploaded = files::upload(
        client,
        &intent.run,
        &dir.join(DATA),
        &intent.name,
        &|_, _| {},
    )
    .await?;
    fs::remove_dir_all(dir).map_err(ClientError::io("remove", dir))?;
    drop(lock);
    // The last upload takes `.uploads` with it (only an empty directory is
    // removed: another pending upload keeps it).
    if let Some(uploads) = dir.parent() {
        let _ = fs::remove_dir(uploads);
    }
    Ok(Shipped::Done(uploaded))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_file_is_snapshotted_with_its_intent() {
        let root = std::env::temp_dir().join(format!("relaunch-uploads-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        let source = root.join("model.pt");
        fs::write(&source, b"v1").unwrap();
        let intent = Intent {
            run: "r".into(),
            name: "ckpt/model.pt".into(),
            server: None,
            source: source.display().to_string(),
        };
        let dir = enqueue(&root.join("spool"), &intent, &source, false).unwrap();
        // The file is written again by rename: the snapshot keeps v1.
        fs::write(root.join("new"), b"v2").unwrap();
        fs::rename(root.join("new"), &source).unwrap();
        assert_eq!(fs::read(dir.join(DATA)).unwrap(), b"v1");
        assert_eq!(read_intent(&dir).unwrap(), intent);
        assert_eq!(pending(&root.join("spool"), "r"), [dir]);
        let bad = Intent {
            name: "../x".into(),
            ..intent
        };
        assert!(enqueue(&root.join("spool"), &bad, &source, false).is_err());
        fs::remove_dir_all(&root).unwrap();
    }
}

/// The thread that ships a run's pending uploads, one at a time, retrying
/// what a retry can fix; [`Uploader::wait`] is what `flush` waits on.
#[derive(Debug)]
pub struct Uploader {
    shared: std::sync::Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    state: parking_lot::Mutex<State>,
    changed: parking_lot::Condvar,
}

#[derive(Debug, Default)]
struct State {
    queue: std::collections::VecDeque<PathBuf>,
    busy: bool,
    /// Why the upload at the front keeps failing, for `flush`.
    error: Option<String>,
    /// Uploads refused for good (left on disk), reported by the next `wait`.
    failed: Vec<ClientError>,
    stop: bool,
}

impl Uploader {
    /// Starts the thread with `queue` (pending uploads found on disk).
    pub fn start(client: Client, queue: Vec<PathBuf>) -> Result<Self, ClientError> {
        let shared = std::sync::Arc::new(Shared::default());
        shared.state.lock().queue.extend(queue);
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("relaunch-uploads".into())
            .spawn(move || work(&client, &worker))
            .map_err(|e| ClientError::Config(format!("cannot start the upload thread: {e}")))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    pub fn push(&self, dir: PathBuf) {
        self.shared.state.lock().queue.push_back(dir);
        self.shared.changed.notify_all();
    }

    /// Uploads not done yet.
    pub fn pending(&self) -> usize {
        let state = self.shared.state.lock();
        state.queue.len() + usize::from(state.busy)
    }

    /// Waits until every queued upload is done, up to `timeout`.
    pub fn wait(&self, timeout: Option<std::time::Duration>) -> Result<(), ClientError> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let mut state = self.shared.state.lock();
        while !state.queue.is_empty() || state.busy {
            match deadline {
                Some(deadline) => {
                    if self
                        .shared
                        .changed
                        .wait_until(&mut state, deadline)
                        .timed_out()
                    {
                        let why = state
                            .error
                            .as_deref()
                            .map_or(String::new(), |e| format!(" (last error: {e})"));
                        return Err(ClientError::Timeout(format!(
                            "{} saved file(s) not uploaded after {:.1} s{why}; they stay in the \
                             client directory for the next init of the run or `relaunch sync`",
                            state.queue.len() + usize::from(state.busy),
                            timeout.unwrap_or_default().as_secs_f64()
                        )));
                    }
                }
                None => self.shared.changed.wait(&mut state),
            }
        }
        match state.failed.pop() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stops the thread now; what is not uploaded stays on disk.
    pub fn stop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        self.stop();
    }
}

fn work(client: &Client, shared: &Shared) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        shared.state.lock().error = Some("cannot start the upload runtime".into());
        return;
    };
    let mut pause = std::time::Duration::from_millis(500);
    loop {
        let dir = {
            let mut state = shared.state.lock();
            while state.queue.is_empty() && !state.stop {
                shared.changed.wait(&mut state);
            }
            if state.stop {
                return;
            }
            state.busy = true;
            state.queue.pop_front()
        };
        let Some(dir) = dir else { continue };
        // The upload is abandoned (left on disk) when the handle stops.
        let result = runtime.block_on(async {
            tokio::select! {
                r = ship(client, &dir) => Some(r),
                () = stopped(shared) => None,
            }
        });
        let mut state = shared.state.lock();
        state.busy = false;
        match result {
            None => return,
            Some(Ok(_)) => {
                state.error = None;
                pause = std::time::Duration::from_millis(500);
            }
            Some(Err(e)) if retryable(&e) => {
                let wait = crate::http::retry_pause(pause, Some(&e));
                state.error = Some(e.to_string());
                state.queue.push_front(dir);
                shared.changed.notify_all();
                shared.changed.wait_while_for(&mut state, |s| !s.stop, wait);
                pause = (pause * 2).min(std::time::Duration::from_secs(30));
                continue;
            }
            Some(Err(e)) => {
                tracing::warn!(dir = %dir.display(), error = %e, "a saved file cannot be uploaded; it stays for `relaunch sync`");
                state.error = Some(e.to_string());
                state.failed.push(e);
            }
        }
        shared.changed.notify_all();
    }
}

async fn stopped(shared: &Shared) {
    loop {
        if shared.state.lock().stop {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn retryable(e: &ClientError) -> bool {
    use crate::error::ErrorKind;
    // NotFound: the run is opened by the record shipper, maybe not yet.
    matches!(
        e.kind(),
        ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::NotFound
    )
}

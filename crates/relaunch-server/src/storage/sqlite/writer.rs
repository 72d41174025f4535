//! The embedded backend's one writing connection, on a thread of its own:
//! it commits whatever is queued in one transaction (group commit, one
//! fsync for many writers), each request in a savepoint of its own so that
//! one failing request does not undo the others, and answers each request
//! only after the commit.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use rusqlite::Connection;

use super::{Durability, backend, schema};
use crate::storage::StorageError;

/// Requests committed together at most.
const GROUP_MAX: usize = 256;

/// A write request for the writer thread: its SQL runs in a savepoint; what
/// it returns is delivered once the transaction commits.
type Job = Box<dyn FnOnce(&Connection) -> Done + Send>;
type Deliver = Box<dyn FnOnce(Result<(), String>) + Send>;

struct Done {
    ok: bool,
    deliver: Deliver,
}

/// The writer thread, and the queue to it.
pub(super) struct Writer {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Writer {
    pub(super) fn start(conn: Connection) -> Result<Self, StorageError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("relaunch-db-writer".into())
            .spawn(move || write_loop(conn, rx))
            .map_err(|e| StorageError::Backend(format!("cannot start the database writer: {e}")))?;
        Ok(Self {
            jobs: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Finishes every queued write and stops the thread.
    pub(super) fn close(&self) {
        drop(self.jobs.lock().take());
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }

    pub(super) fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        let (tx, rx) = mpsc::sync_channel::<Result<T, StorageError>>(1);
        let job: Job = Box::new(move |conn| match f(conn) {
            Ok(value) => Done {
                ok: true,
                deliver: Box::new(move |committed| {
                    let _ = tx.send(committed.map(|()| value).map_err(StorageError::Backend));
                }),
            },
            Err(e) => Done {
                ok: false,
                deliver: Box::new(move |_| {
                    let _ = tx.send(Err(e));
                }),
            },
        });
        let sent = self.jobs.lock().as_ref().map(|jobs| jobs.send(job));
        match sent {
            Some(Ok(())) => rx.recv().unwrap_or_else(|_| {
                Err(StorageError::Backend("the database writer stopped".into()))
            }),
            _ => Err(StorageError::Backend("the database is closed".into())),
        }
    }
}

/// The writing connection to `dir/relaunch.db` (both made if missing), in
/// WAL mode with `durability`'s sync level, its schema in place; and the
/// database's path.
pub(crate) fn open_writer(
    dir: &Path,
    durability: Durability,
) -> Result<(PathBuf, Connection), StorageError> {
    std::fs::create_dir_all(dir).map_err(|e| {
        StorageError::Backend(format!(
            "cannot create the data directory {}: {e}",
            dir.display()
        ))
    })?;
    let path = dir.join("relaunch.db");
    let conn = Connection::open(&path)
        .map_err(|e| StorageError::Backend(format!("cannot open {}: {e}", path.display())))?;
    let synchronous = match durability {
        Durability::Fsync => "FULL",
        Durability::Process => "NORMAL",
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={synchronous}; PRAGMA busy_timeout=10000;"
    ))
    .map_err(backend)?;
    let applied = schema::migrate(&conn, &path)?;
    if !applied.is_empty() {
        tracing::info!(database = %path.display(), versions = ?applied, "applied schema migrations");
    }
    Ok((path, conn))
}

fn write_loop(conn: Connection, rx: mpsc::Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let mut delivers = Vec::with_capacity(jobs.len());
        let began = conn.execute_batch("BEGIN IMMEDIATE");
        for job in jobs {
            let _ = conn.execute_batch("SAVEPOINT job");
            let done = job(&conn);
            let end = if done.ok {
                "RELEASE job"
            } else {
                "ROLLBACK TO job; RELEASE job"
            };
            if let Err(e) = conn.execute_batch(end) {
                tracing::error!(error = %e, "cannot end a savepoint");
            }
            delivers.push(done.deliver);
        }
        let committed = began
            .and_then(|()| conn.execute_batch("COMMIT"))
            .map_err(|e| {
                let _ = conn.execute_batch("ROLLBACK");
                tracing::error!(error = %e, "commit failed; the requests of this group are refused");
                format!("commit failed: {e}")
            });
        for deliver in delivers {
            deliver(committed.clone());
        }
    }
}

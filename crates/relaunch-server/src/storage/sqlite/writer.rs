//! The embedded backend's one writing connection, on a thread of its own:
//! it commits the small requests queued in one transaction (group commit,
//! one fsync for many writers), each request in a savepoint of its own so
//! that one failing request does not undo the others, and answers each
//! request only after the commit. A big request (more than [`SMALL`] rows)
//! commits alone, and small ones waiting go first, taking turns with the
//! big ones: a small writer waits for at most one big request's commit,
//! never for a queue of them (big batches come here in parts, see
//! `SqliteStorage::ingest`).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use rusqlite::Connection;

use super::{Durability, backend, schema};
use crate::storage::StorageError;

/// Requests committed together at most.
const GROUP_MAX: usize = 256;

/// Rows (metric points, lines, events) a small request writes at most.
pub(super) const SMALL: usize = 4_096;

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
    jobs: Mutex<Option<mpsc::Sender<Queued>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Writer {
    pub(super) fn start(conn: Connection) -> Result<Self, StorageError> {
        let (tx, rx) = mpsc::channel::<Queued>();
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

    /// Runs `f`, a small request, in the writer's next transaction.
    pub(super) fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        self.write_rows(0, f)
    }

    /// Runs `f`, which writes about `rows` rows: alone in a transaction
    /// when more than [`SMALL`].
    pub(super) fn write_rows<T: Send + 'static>(
        &self,
        rows: usize,
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
        let queued = Queued {
            job,
            big: rows > SMALL,
        };
        let sent = self.jobs.lock().as_ref().map(|jobs| jobs.send(queued));
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

/// A request as queued, and whether it is big.
struct Queued {
    job: Job,
    big: bool,
}

fn write_loop(conn: Connection, rx: mpsc::Receiver<Queued>) {
    let mut small: VecDeque<Job> = VecDeque::new();
    let mut big: VecDeque<Job> = VecDeque::new();
    fn push(q: Queued, small: &mut VecDeque<Job>, big: &mut VecDeque<Job>) {
        if q.big {
            big.push_back(q.job);
        } else {
            small.push_back(q.job);
        }
    }
    let mut big_next = false;
    loop {
        if small.is_empty() && big.is_empty() {
            match rx.recv() {
                Ok(q) => push(q, &mut small, &mut big),
                // Every sender is gone and nothing is queued: closed.
                Err(_) => break,
            }
        }
        while let Ok(q) = rx.try_recv() {
            push(q, &mut small, &mut big);
        }
        // Small requests go first, but a big one waiting takes every other
        // turn, so that a stream of small writers cannot hold it back.
        let group: Vec<Job> = if !big.is_empty() && (small.is_empty() || big_next) {
            big_next = false;
            big.pop_front().into_iter().collect()
        } else {
            big_next = true;
            let n = small.len().min(GROUP_MAX);
            small.drain(..n).collect()
        };
        commit(&conn, group);
    }
}

/// Runs `jobs` in one transaction, each in a savepoint, and delivers each
/// its outcome once the transaction is committed (or refused).
fn commit(conn: &Connection, jobs: Vec<Job>) {
    let mut delivers = Vec::with_capacity(jobs.len());
    let began = conn.execute_batch("BEGIN IMMEDIATE");
    for job in jobs {
        let _ = conn.execute_batch("SAVEPOINT job");
        let done = job(conn);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A queued request that notes its name in `order` when it runs.
    fn noting(order: &Arc<Mutex<Vec<&'static str>>>, name: &'static str, big: bool) -> Queued {
        let order = order.clone();
        Queued {
            job: Box::new(move |_| {
                order.lock().push(name);
                Done {
                    ok: true,
                    deliver: Box::new(|_| {}),
                }
            }),
            big,
        }
    }

    #[test]
    fn small_requests_waiting_go_before_big_ones_and_big_ones_take_turns() {
        let writer = Writer::start(Connection::open_in_memory().unwrap()).unwrap();
        let jobs = writer.jobs.lock().as_ref().unwrap().clone();
        let order = Arc::new(Mutex::new(Vec::new()));
        // While the first big request runs, two big and three small ones
        // arrive, the big ones first: the small ones commit together next,
        // then the big ones, one at a time.
        let (o, j) = (order.clone(), jobs.clone());
        writer
            .write_rows(SMALL + 1, move |_| {
                o.lock().push("big-1");
                for q in [
                    noting(&o, "big-2", true),
                    noting(&o, "big-3", true),
                    noting(&o, "small-1", false),
                    noting(&o, "small-2", false),
                ] {
                    j.send(q).unwrap();
                }
                Ok(())
            })
            .unwrap();
        // Queued behind the two big ones: answered after them.
        writer.write_rows(SMALL + 1, |_| Ok(())).unwrap();
        assert_eq!(
            *order.lock(),
            ["big-1", "small-1", "small-2", "big-2", "big-3"]
        );

        // A small request that arrives while a big one runs goes before the
        // next big one.
        order.lock().clear();
        let (o, j) = (order.clone(), jobs);
        writer
            .write_rows(SMALL + 1, move |_| {
                o.lock().push("big-1");
                let (o2, j2) = (o.clone(), j.clone());
                j.send(Queued {
                    job: Box::new(move |_| {
                        o2.lock().push("big-2");
                        j2.send(noting(&o2, "small-1", false)).unwrap();
                        Done {
                            ok: true,
                            deliver: Box::new(|_| {}),
                        }
                    }),
                    big: true,
                })
                .unwrap();
                j.send(noting(&o, "big-3", true)).unwrap();
                Ok(())
            })
            .unwrap();
        writer.write_rows(SMALL + 1, |_| Ok(())).unwrap();
        assert_eq!(*order.lock(), ["big-1", "big-2", "small-1", "big-3"]);
        writer.close();
    }
}

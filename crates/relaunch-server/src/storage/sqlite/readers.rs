//! The embedded backend's reader connections: at most `max` open, each
//! reused; a read that finds them all busy waits for one, a bounded time.
//! Bounding them bounds what concurrent reads hold (each connection's page
//! cache and its mapped pages, each read's results) and leaves the cores
//! to the writer.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rusqlite::{Connection, OpenFlags};

use super::backend;
use crate::storage::StorageError;

/// How long a read waits for a reader while all are busy before it is
/// answered 503 (the client retries): far longer than any read takes.
const READER_WAIT: Duration = Duration::from_secs(30);

pub(super) struct Readers {
    path: PathBuf,
    pool: Mutex<Pool>,
    freed: Condvar,
    max: usize,
    wait: Duration,
}

struct Pool {
    idle: Vec<Connection>,
    open: usize,
}

impl Readers {
    pub(super) fn new(path: PathBuf, max: usize) -> Self {
        Self {
            path,
            pool: Mutex::new(Pool {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
            max: max.max(1),
            wait: READER_WAIT,
        }
    }

    pub(super) fn set_max(&mut self, max: usize) {
        self.max = max.max(1);
    }

    /// Reader connections open now.
    pub(super) fn open(&self) -> usize {
        self.pool.lock().open
    }

    /// Runs `f` on a reader connection, given back after: to the idle ones
    /// when `f` returned; closed, making room for a new one, when it
    /// panicked, so that panicking reads never shrink the pool.
    pub(super) fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let conn = self.take()?;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&conn)));
        let mut pool = self.pool.lock();
        match result {
            Ok(result) => {
                pool.idle.push(conn);
                drop(pool);
                self.freed.notify_one();
                result
            }
            Err(panic) => {
                pool.open -= 1;
                drop(pool);
                drop(conn);
                self.freed.notify_one();
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// A reader connection, idle or new; waits at most `wait` for one
    /// while `max` are busy, then answers 503 (the client retries).
    fn take(&self) -> Result<Connection, StorageError> {
        let deadline = Instant::now() + self.wait;
        let mut pool = self.pool.lock();
        loop {
            if let Some(conn) = pool.idle.pop() {
                return Ok(conn);
            }
            if pool.open < self.max {
                pool.open += 1;
                drop(pool);
                return self.connect().inspect_err(|_| {
                    self.pool.lock().open -= 1;
                    self.freed.notify_one();
                });
            }
            if self.freed.wait_until(&mut pool, deadline).timed_out()
                && pool.idle.is_empty()
                && pool.open >= self.max
            {
                return Err(StorageError::Unavailable(format!(
                    "every one of the {} database readers stayed busy for {:?}; retry, or \
                     restart the server with a larger --max-readers",
                    self.max, self.wait
                )));
            }
        }
    }

    fn connect(&self) -> Result<Connection, StorageError> {
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(backend)?;
        conn.execute_batch("PRAGMA busy_timeout=10000; PRAGMA mmap_size=1073741824;")
            .map_err(backend)?;
        Ok(conn)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Readers of a new database file, and its directory.
    fn readers(max: usize, wait: Duration) -> (Readers, PathBuf) {
        let dir = std::env::temp_dir().join(format!("relaunch-readers-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("relaunch.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t(x)")
            .unwrap();
        let mut readers = Readers::new(path, max);
        readers.wait = wait;
        (readers, dir)
    }

    #[test]
    fn reads_that_panic_never_use_up_the_readers() {
        let (readers, dir) = readers(2, READER_WAIT);
        for _ in 0..5 {
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                readers.read(|_| -> Result<(), StorageError> { panic!("a read's bug") })
            }));
            assert!(panicked.is_err());
        }
        assert_eq!(readers.open(), 0);
        let one: i64 = readers
            .read(|c| c.query_row("SELECT 1", [], |r| r.get(0)).map_err(backend))
            .unwrap();
        assert_eq!(one, 1);
        drop(readers);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_read_waits_for_a_busy_reader_a_bounded_time() {
        let (readers, dir) = readers(1, Duration::from_millis(200));
        let (hold, release) = std::sync::mpsc::channel::<()>();
        let (held, is_held) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            let readers = &readers;
            s.spawn(move || {
                readers
                    .read(|_| {
                        held.send(()).unwrap();
                        release.recv().unwrap();
                        Ok(())
                    })
                    .unwrap();
            });
            is_held.recv().unwrap();
            let err = readers.read(|_| Ok(())).unwrap_err();
            assert!(matches!(err, StorageError::Unavailable(_)), "{err}");
            assert!(err.to_string().contains("--max-readers"), "{err}");
            hold.send(()).unwrap();
        });
        // Free again: the next read gets the reader.
        readers.read(|_| Ok(())).unwrap();
        drop(readers);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

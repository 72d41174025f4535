//! The embedded database's schema versions: numbered SQL scripts embedded
//! in the binary, applied at open in order, the version kept in SQLite's
//! `user_version` header field (written in the same transaction as the
//! scripts, so a crash leaves the old version or the new one whole).
//!
//! A data directory written by a newer relaunch is refused before anything
//! reads or writes it, as the PostgreSQL backend refuses a newer database
//! (`postgres/schema.rs`). A database from before versions were numbered
//! reads as version 0 and has exactly version 1's tables, which the first
//! script creates only where missing.

use std::path::Path;

use rusqlite::Connection;

use crate::storage::StorageError;

/// (version, what it adds, SQL), in order. A new version appends; a
/// released script never changes.
const MIGRATIONS: &[(u32, &str, &str)] = &[
    (
        1,
        "runs, attempts, writers, metric chunks, latest values, console lines, events, files",
        include_str!("migrations/0001_init.sql"),
    ),
    (
        2,
        "pending chunks: those sent straight to the bucket, not yet confirmed by a commit",
        include_str!("migrations/0002_pending_chunks.sql"),
    ),
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: u32 = 2;

/// The schema version of an open database (0: before versions, or empty).
pub(crate) fn version(conn: &Connection) -> Result<u32, StorageError> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| StorageError::Backend(format!("cannot read the schema version: {e}")))
}

/// The error for a database a newer relaunch wrote.
pub(crate) fn too_new(path: &Path, found: u32) -> StorageError {
    StorageError::Backend(format!(
        "{} has schema version {found} but this relaunch knows up to {SCHEMA_VERSION}: a newer \
         relaunch wrote it; run that version (or newer), or give --data-dir another directory",
        path.display()
    ))
}

/// Brings the database at `path` to [`SCHEMA_VERSION`]; returns the
/// versions applied now (empty when it was current). Refuses a newer one.
pub(crate) fn migrate(conn: &Connection, path: &Path) -> Result<Vec<u32>, StorageError> {
    let failed = |e: rusqlite::Error| {
        StorageError::Backend(format!(
            "cannot bring {} to schema version {SCHEMA_VERSION}: {e}",
            path.display()
        ))
    };
    // IMMEDIATE: two servers opening one directory at once migrate it once.
    conn.execute_batch("BEGIN IMMEDIATE").map_err(failed)?;
    let result = (|| {
        let current = version(conn)?;
        if current > SCHEMA_VERSION {
            return Err(too_new(path, current));
        }
        let mut applied = Vec::new();
        for &(number, _, sql) in MIGRATIONS.iter().filter(|(v, ..)| *v > current) {
            conn.execute_batch(sql).map_err(failed)?;
            applied.push(number);
        }
        if !applied.is_empty() {
            conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
                .map_err(failed)?;
        }
        Ok(applied)
    })();
    match result {
        Ok(applied) => {
            conn.execute_batch("COMMIT").map_err(failed)?;
            Ok(applied)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use relaunch_api::RunInit;

    use super::*;
    use crate::storage::Storage as _;
    use crate::storage::sqlite::{Durability, SqliteStorage};

    #[test]
    fn the_last_script_is_the_version_written() {
        let numbers: Vec<u32> = MIGRATIONS.iter().map(|(n, ..)| *n).collect();
        let expected: Vec<u32> = (1..=SCHEMA_VERSION).collect();
        assert_eq!(numbers, expected);
    }

    #[test]
    fn a_database_is_migrated_once_and_a_newer_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("relaunch-schema-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("relaunch.db");
        let conn = Connection::open(&path).unwrap();
        assert_eq!(migrate(&conn, &path).unwrap(), vec![1, 2]);
        assert_eq!(version(&conn).unwrap(), SCHEMA_VERSION);
        assert!(migrate(&conn, &path).unwrap().is_empty());
        conn.execute_batch("PRAGMA user_version = 99").unwrap();
        let err = migrate(&conn, &path).unwrap_err().to_string();
        assert!(
            err.contains("schema version 99") && err.contains("newer relaunch"),
            "{err}"
        );
        // Refused as it was: nothing rolled back, nothing written.
        assert_eq!(version(&conn).unwrap(), 99);
        drop(conn);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_database_from_before_schema_versions_is_numbered_and_keeps_its_runs() {
        let dir = std::env::temp_dir().join(format!("relaunch-schema-{}", rand::random::<u64>()));
        let storage = SqliteStorage::open(&dir, Durability::Process).unwrap();
        let init = RunInit {
            project: Some("p".into()),
            id: Some("kept".into()),
            attempt_token: "t".into(),
            ..RunInit::default()
        };
        storage.open_run(&init, 1.0).unwrap();
        storage.close();
        drop(storage);
        let path = dir.join("relaunch.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("PRAGMA user_version = 0")
            .unwrap();
        let storage = SqliteStorage::open(&dir, Durability::Process).unwrap();
        assert_eq!(storage.get_run("kept").unwrap().id, "kept");
        storage.close();
        let version: u32 = Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

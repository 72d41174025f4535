//! The PostgreSQL schema's versions: numbered SQL scripts embedded in the
//! binary, applied at start in order, each recorded in `relaunch_schema`.
//!
//! Written here rather than with a migration crate because the two things
//! that matter are small and specific: servers starting together against
//! one database apply each script once (a transaction-scoped advisory
//! lock serializes them, and every script commits with its version row),
//! and a database migrated by a newer relaunch is refused with a message
//! saying so, before anything reads or writes it.

use postgres::Client;

use super::PgError;
use crate::storage::StorageError;

/// (version, what it adds, SQL), in order. A new version appends; a
/// released script never changes.
pub(crate) const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "runs, attempts, writers, metric chunks, console lines, events, files",
        include_str!("migrations/0001_init.sql"),
    ),
    (
        2,
        "pending chunks: those sent straight to the bucket, not yet confirmed by a commit",
        include_str!("migrations/0002_pending_chunks.sql"),
    ),
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: i32 = 2;

/// Any fixed number: the key of the advisory lock that serializes
/// migrations (`pg_advisory_xact_lock`), "relaunch" in ASCII.
const MIGRATION_LOCK: i64 = 0x7265_6c61_756e_6368;

/// Brings the database to [`SCHEMA_VERSION`]; returns the versions applied
/// now (empty when it was current). Refuses a newer database.
pub(crate) fn migrate(client: &mut Client, target: &str) -> Result<Vec<i32>, StorageError> {
    migrate_inner(client, target).map_err(PgError::into_storage)
}

fn migrate_inner(client: &mut Client, target: &str) -> Result<Vec<i32>, PgError> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS relaunch_schema (
             version     INTEGER PRIMARY KEY,
             description TEXT NOT NULL,
             applied_at  TIMESTAMPTZ NOT NULL DEFAULT now()
         )",
    )?;
    let current: i32 = tx
        .query_one("SELECT COALESCE(MAX(version), 0) FROM relaunch_schema", &[])?
        .get(0);
    if current > SCHEMA_VERSION {
        return Err(StorageError::Backend(format!(
            "the database {target} has schema version {current} but this relaunch knows up to \
             {SCHEMA_VERSION}: a newer relaunch migrated it; run that version (or newer) of \
             relaunch server, or give --database another database"
        ))
        .into());
    }
    let mut applied = Vec::new();
    for &(version, description, sql) in MIGRATIONS.iter().filter(|(v, ..)| *v > current) {
        tx.batch_execute(sql)?;
        tx.execute(
            "INSERT INTO relaunch_schema(version, description) VALUES ($1, $2)",
            &[&version, &description],
        )?;
        applied.push(version);
    }
    tx.commit()?;
    Ok(applied)
}

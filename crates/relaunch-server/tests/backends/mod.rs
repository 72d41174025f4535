//! The storage backends a suite runs on: SQLite always, PostgreSQL when
//! `RELAUNCH_TEST_POSTGRES` names a server (an admin URL,
//! `postgres://USER:PASSWORD@HOST:PORT/DB`; `scripts/test.sh` starts a
//! throwaway cluster and sets it). Each test gets a database of its own,
//! created here and dropped afterwards, so tests run in parallel.
//! Without the variable the PostgreSQL runs are skipped with a line that
//! says so, and `postgres_runs_under_ci` fails under `CI`.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use relaunch_server::storage::Storage;
use relaunch_server::storage::postgres::PgStorage;
use relaunch_server::storage::sqlite::{Durability, SqliteStorage};

pub const POSTGRES_ENV: &str = "RELAUNCH_TEST_POSTGRES";

/// Where one backend keeps a test's data: reopening the same place finds it.
#[derive(Debug)]
pub enum Place {
    Sqlite(PathBuf),
    Postgres(TestDb),
}

impl Place {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    pub fn open(&self, durability: Durability) -> Arc<dyn Storage> {
        match self {
            Self::Sqlite(dir) => Arc::new(SqliteStorage::open(dir, durability).unwrap()),
            Self::Postgres(db) => Arc::new(PgStorage::open(&db.url, durability, 4).unwrap()),
        }
    }
}

/// A fresh place in every backend available: SQLite in a new directory
/// under `dir`'s parent naming, PostgreSQL in a new database.
pub fn places(label: &str) -> Vec<Place> {
    let mut places = vec![Place::Sqlite(temp_dir(label))];
    match admin_url() {
        Some(admin) => places.push(Place::Postgres(TestDb::create(&admin))),
        None => skipped_once(),
    }
    places
}

pub fn temp_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "relaunch-{label}-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn admin_url() -> Option<String> {
    std::env::var(POSTGRES_ENV).ok().filter(|u| !u.is_empty())
}

fn skipped_once() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        say_skipped(&format!(
            "the PostgreSQL runs of these tests ({POSTGRES_ENV} is not set; \
             scripts/test.sh starts a throwaway cluster and sets it)"
        ));
    });
}

/// Says on the terminal that something was skipped and why. Written to
/// stderr directly: the test harness hides what `eprintln!` prints from a
/// test that passes.
pub fn say_skipped(what: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "skipped: {what}");
}

/// `url` with its database replaced by `db`.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_end..].find('/') {
        Some(slash) => &base[..authority_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{db}?{query}"),
        None => format!("{base}/{db}"),
    }
}

/// A database of one test, dropped with it.
#[derive(Debug)]
pub struct TestDb {
    admin: String,
    pub name: String,
    pub url: String,
}

impl TestDb {
    pub fn create(admin: &str) -> Self {
        let name = format!(
            "relaunch_test_{}_{:x}",
            std::process::id(),
            rand::random::<u64>()
        );
        admin_sql(admin, &format!("CREATE DATABASE {name}"));
        Self {
            admin: admin.to_owned(),
            url: with_database(admin, &name),
            name,
        }
    }

    /// Runs `sql` in this database.
    pub fn execute(&self, sql: &str) {
        admin_sql(&self.url, sql);
    }

    /// The first column of the first row of `sql`, as text.
    pub fn query_text(&self, sql: &str) -> String {
        let (url, sql) = (self.url.clone(), sql.to_owned());
        on_own_thread(move || {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let rows = client.simple_query(&sql).unwrap();
            rows.into_iter()
                .find_map(|m| match m {
                    postgres::SimpleQueryMessage::Row(row) => {
                        Some(row.get(0).unwrap_or_default().to_owned())
                    }
                    _ => None,
                })
                .unwrap_or_default()
        })
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        on_own_thread(move || {
            if let Ok(mut client) = postgres::Client::connect(&admin, postgres::NoTls) {
                let _ =
                    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        });
    }
}

fn admin_sql(url: &str, sql: &str) {
    let (url, sql) = (url.to_owned(), sql.to_owned());
    on_own_thread(move || {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap_or_else(|e| {
            panic!(
                "cannot connect to {POSTGRES_ENV}: {e}: {:?}",
                e.as_db_error()
            )
        });
        client.batch_execute(&sql).unwrap();
    });
}

/// A `postgres::Client` must not run on an async thread; the HTTP tests
/// are async.
fn on_own_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(f).join().unwrap()
}

pub fn remove(place: &Place) {
    if let Place::Sqlite(dir) = place {
        let _ = std::fs::remove_dir_all(dir);
    }
}

pub fn dir_of(place: &Place) -> Option<&Path> {
    match place {
        Place::Sqlite(dir) => Some(dir),
        Place::Postgres(_) => None,
    }
}

//! The storage backends a suite runs on: SQLite always, PostgreSQL when
//! `RELAUNCH_TEST_POSTGRES` names a server (an admin URL,
//! `postgres://USER:PASSWORD@HOST:PORT/DB`; `scripts/test.sh` starts a
//! throwaway cluster and sets it). Each test gets a database of its own,
//! created here and dropped afterwards, so tests run in parallel.
//! Without the variable the PostgreSQL runs are skipped with a line that
//! says so, and `postgres_runs_under_ci` fails under `CI`.
//!
//! Chunk stores the same way: a directory always, S3 when
//! `RELAUNCH_TEST_S3` names a location (`s3://BUCKET/PREFIX`, with the
//! endpoint and credentials in `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`; `scripts/test.sh` starts SeaweedFS and sets
//! them). Each test gets a prefix of its own below it.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use relaunch_server::storage::Storage;
use relaunch_server::storage::blobs::{BlobStore, DirBlobs};
use relaunch_server::storage::postgres::PgStorage;
use relaunch_server::storage::s3::S3Blobs;
use relaunch_server::storage::sqlite::{Durability, SqliteStorage};

pub const POSTGRES_ENV: &str = "RELAUNCH_TEST_POSTGRES";
pub const S3_ENV: &str = "RELAUNCH_TEST_S3";

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

// --- chunk stores ----------------------------------------------------------

/// Where one chunk store keeps a test's chunks.
#[derive(Debug)]
pub enum BlobPlace {
    Dir(PathBuf),
    /// `s3://BUCKET/PREFIX`, a prefix of this test's own.
    S3(String),
}

impl BlobPlace {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Dir(_) => "dir",
            Self::S3(_) => "s3",
        }
    }

    pub fn open(&self) -> Arc<dyn BlobStore> {
        match self {
            Self::Dir(dir) => Arc::new(DirBlobs::open(dir, Durability::Process).unwrap()),
            Self::S3(url) => Arc::new(self.open_s3(url)),
        }
    }

    fn open_s3(&self, url: &str) -> S3Blobs {
        S3Blobs::open(url, None, std::env::vars()).unwrap()
    }

    /// Replaces the stored bytes of chunk `hash` with `data`, behind the
    /// store's back (a disk's rot, or someone writing into the bucket).
    pub fn damage(&self, hash: &str, data: &[u8]) {
        match self {
            Self::Dir(dir) => {
                for path in [
                    dir.join("chunks").join(&hash[..2]).join(hash),
                    dir.join("chunks/staged").join(&hash[..2]).join(hash),
                ] {
                    if path.is_file() {
                        std::fs::write(&path, data).unwrap();
                    }
                }
            }
            Self::S3(url) => s3_put(&Self::object(url, hash), Some(data)),
        }
    }

    /// Deletes chunk `hash` behind the store's back.
    pub fn delete(&self, hash: &str) {
        match self {
            Self::Dir(dir) => {
                for path in [
                    dir.join("chunks").join(&hash[..2]).join(hash),
                    dir.join("chunks/staged").join(&hash[..2]).join(hash),
                ] {
                    let _ = std::fs::remove_file(path);
                }
            }
            Self::S3(url) => s3_put(&Self::object(url, hash), None),
        }
    }

    fn object(url: &str, hash: &str) -> String {
        format!("{url}/chunks/{}/{hash}", &hash[..2])
    }
}

/// A fresh place in every chunk store available.
pub fn blob_places(label: &str) -> Vec<BlobPlace> {
    let mut places = vec![BlobPlace::Dir(temp_dir(label))];
    match s3_url() {
        Some(base) => places.push(BlobPlace::S3(s3_prefix(&base, label))),
        None => s3_skipped_once(),
    }
    places
}

pub fn s3_url() -> Option<String> {
    std::env::var(S3_ENV)
        .ok()
        .filter(|u| !u.is_empty())
        .map(|u| u.trim_end_matches('/').to_owned())
}

/// A location of its own below `base`.
pub fn s3_prefix(base: &str, label: &str) -> String {
    format!(
        "{base}/{label}-{}-{:x}",
        std::process::id(),
        rand::random::<u64>()
    )
}

fn s3_skipped_once() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        say_skipped(&format!(
            "the S3 runs of these tests ({S3_ENV} is not set; scripts/test.sh starts \
             SeaweedFS and sets it)"
        ));
    });
}

/// Writes `data` at `s3://BUCKET/KEY` straight through the S3 API, with
/// the test's AWS_* variables; `None` deletes the object.
pub fn s3_put(url: &str, data: Option<&[u8]>) {
    use object_store::ObjectStoreExt as _;
    let rest = url.strip_prefix("s3://").unwrap();
    let (bucket, key) = rest.split_once('/').unwrap();
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap_or_default();
    let store = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_allow_http(endpoint.starts_with("http://"))
        .build()
        .unwrap();
    let (key, data) = (
        object_store::path::Path::from(key),
        data.map(<[u8]>::to_vec),
    );
    // On a runtime of its own: the HTTP tests call this from async code.
    on_own_thread(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        match data {
            Some(data) => drop(runtime.block_on(store.put(&key, data.into())).unwrap()),
            None => runtime.block_on(store.delete(&key)).unwrap(),
        }
    });
}

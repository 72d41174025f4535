//! `--database postgres://USER[:PASSWORD]@HOST:PORT/DB`: parsed, the
//! password taken from `PGPASSWORD` when the URL has none, and every
//! failure to reach the database said in one line that names what was
//! wrong and what to change, never the password.

use std::time::Duration;

use postgres::Config;
use postgres::config::Host;

use crate::storage::StorageError;

/// The variable a password comes from when the URL has none (libpq's).
pub const PASSWORD_ENV: &str = "PGPASSWORD";

/// How long a connection attempt may take before the server gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

const URL_FORM: &str = "postgres://USER[:PASSWORD]@HOST:PORT/DB";

/// A parsed `--database`, with a description safe to log.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) config: Config,
    /// `USER@HOST:PORT/DB`, without the password.
    pub(crate) shown: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// Parses `url`; `password` is `PGPASSWORD`'s value, used when the URL
/// names no password.
pub(crate) fn parse(url: &str, password: Option<String>) -> Result<Target, StorageError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(StorageError::Invalid(format!(
            "--database must be a PostgreSQL URL, {URL_FORM}; it starts with {:?}",
            url.split("://").next().unwrap_or_default()
        )));
    }
    // The parser's messages never quote the URL, so no password leaks.
    let mut config: Config = url.parse().map_err(|e| {
        StorageError::Invalid(format!(
            "--database is not a valid PostgreSQL URL ({e}); the form is {URL_FORM}"
        ))
    })?;
    if config.get_user().is_none() {
        return Err(StorageError::Invalid(format!(
            "--database names no user; the form is {URL_FORM}"
        )));
    }
    if config.get_dbname().is_none() {
        return Err(StorageError::Invalid(format!(
            "--database names no database; the form is {URL_FORM}"
        )));
    }
    if config.get_password().is_none()
        && let Some(password) = password.filter(|p| !p.is_empty())
    {
        config.password(password);
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    let shown = describe(&config);
    Ok(Target { config, shown })
}

fn describe(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let host = match host {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            };
            let port = config
                .get_ports()
                .get(i)
                .or_else(|| config.get_ports().first())
                .copied()
                .unwrap_or(5432);
            format!("{host}:{port}")
        })
        .collect();
    format!(
        "{}@{}/{}",
        config.get_user().unwrap_or_default(),
        hosts.join(","),
        config.get_dbname().unwrap_or_default()
    )
}

/// One line for a failed connection: what PostgreSQL or the network said,
/// and what to check.
pub(crate) fn connect_error(target: &Target, e: &postgres::Error) -> StorageError {
    let hint = match e.as_db_error().map(|db| db.code().code()) {
        // invalid_password, invalid_authorization_specification
        Some("28P01" | "28000") => {
            format!("check the user and the password (in the --database URL or {PASSWORD_ENV})")
        }
        // invalid_catalog_name
        Some("3D000") => "create the database (createdb) or name another in --database".into(),
        Some(_) => "check --database and the server's log".into(),
        None => "check that PostgreSQL is running and the host and port in --database".into(),
    };
    StorageError::Backend(format!(
        "cannot connect to PostgreSQL at {}: {}; {hint}",
        target.shown,
        describe_error(e)
    ))
}

/// `e` with its causes: the driver's own message is only its kind ("db
/// error", "error connecting to server"); PostgreSQL's words or the
/// socket's are in the causes.
/// Whether `e` says the database is away (the connection lost or refused,
/// the server shutting down or starting) rather than that a statement
/// failed: the request may succeed later.
pub(crate) fn is_unavailable(e: &postgres::Error) -> bool {
    match e.code() {
        // Class 08: connection exceptions; 57P01-57P03: shutting down,
        // crashed, not accepting connections yet.
        Some(code) => code.code().starts_with("08") || code.code().starts_with("57P"),
        // No SQLSTATE: the connection itself failed (closed, I/O), or a
        // value did not convert (not the database's absence).
        None => {
            let mut cause = std::error::Error::source(e);
            let mut io = false;
            while let Some(c) = cause {
                io |= c.is::<std::io::Error>();
                cause = c.source();
            }
            e.is_closed() || io
        }
    }
}

pub(crate) fn describe_error(e: &postgres::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_comes_from_the_url_else_pgpassword_and_is_never_shown() {
        let t = parse(
            "postgres://me:secret@db.example:6543/runs",
            Some("other".into()),
        )
        .unwrap();
        assert_eq!(t.config.get_password(), Some(&b"secret"[..]));
        assert_eq!(t.shown, "me@db.example:6543/runs");
        assert!(!format!("{t:?}").contains("secret"));
        let t = parse("postgres://me@db.example/runs", Some("fromenv".into())).unwrap();
        assert_eq!(t.config.get_password(), Some(&b"fromenv"[..]));
        assert_eq!(t.shown, "me@db.example:5432/runs");
    }

    #[test]
    fn urls_that_are_not_postgres_or_lack_a_part_are_refused_naming_the_form() {
        for (url, says) in [
            ("mysql://me@h/db", "must be a PostgreSQL URL"),
            ("relaunch.db", "must be a PostgreSQL URL"),
            ("postgres://h:5432/db", "names no user"),
            ("postgres://me@h:5432", "names no database"),
            (
                "postgres://me:pw@h:notaport/db",
                "not a valid PostgreSQL URL",
            ),
        ] {
            let err = parse(url, None).unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
            assert!(err.contains(URL_FORM), "{url}: {err}");
            assert!(!err.contains("pw"), "{url}: {err}");
        }
    }
}

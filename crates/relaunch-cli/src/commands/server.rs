//! `relaunch server`: the tracking server on the embedded storage (SQLite
//! and files in `--data-dir`), on PostgreSQL (`--database`), with file
//! chunks in an S3-compatible bucket (`--blobs`), or any mix.

use std::sync::Arc;

use anyhow::{Context as _, bail};
use relaunch_server::Storage;
use relaunch_server::storage::StorageError;
use relaunch_server::storage::postgres::PgStorage;
use relaunch_server::storage::sqlite::{Durability, SqliteStorage};
use relaunch_server::{AppState, ConnLimits, FileStore, TOKEN_ENV, check_exposure, check_token};

use crate::cli::{DurabilityArg, ServerArgs};
use crate::output;

pub(crate) fn run(args: &ServerArgs) -> anyhow::Result<u8> {
    // An empty --token is a mistake (a variable that expanded to nothing),
    // not a request for no token: leaving the flag out is. An empty
    // RELAUNCH_SERVER_TOKEN means unset, as it does for the client.
    if args.token.as_deref() == Some("") {
        bail!(
            "--token is empty, which would leave the server open to anyone; pass the secret \
             (did a variable expand to nothing?), or leave --token out to run without one"
        );
    }
    let token = args
        .token
        .clone()
        .or_else(|| std::env::var(TOKEN_ENV).ok())
        .filter(|t| !t.is_empty());
    if let Some(token) = &token
        && let Err(message) = check_token(token)
    {
        bail!("{message}");
    }
    let limits = conn_limits(args)?;
    // What the server writes (runs, files, the alert outbox with its
    // webhook URLs, which are credentials) is for its owner alone: a new
    // data directory is 0700, its files 0600.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("relaunch-server")
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let shutdown = super::stop_signal(Some("stopping: finishing the requests in flight"))?;
        // Refuse an exposed address without a token before listening on it.
        let wanted = tokio::net::lookup_host((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot resolve --host {}", args.host))?
            .next()
            .with_context(|| format!("--host {} resolves to no address", args.host))?;
        if let Err(message) = check_exposure(wanted, token.as_deref()) {
            bail!("{message}");
        }
        let listener = tokio::net::TcpListener::bind(wanted)
            .await
            .with_context(|| format!("cannot listen on {wanted}"))?;
        let addr = listener
            .local_addr()
            .context("cannot read the listening address")?;
        let durability = match args.durability {
            DurabilityArg::Fsync => Durability::Fsync,
            DurabilityArg::Process => Durability::Process,
        };
        // Chunks first: a bad --blobs is said before a data directory is made.
        let (files, files_place) = open_files(args, durability)?;
        let opened = open_storage(args, durability)?;
        let storage = opened.storage.clone();
        let mut state = AppState::new(storage, files, token, args.max_request_bytes)
            .with_host_check(addr, args.allowed_host.clone())
            .with_max_readers(args.max_readers)
            .with_max_body_memory(args.max_body_memory)
            .with_max_response_memory(args.max_response_memory);
        if let Some(alerts) = open_alerts(args, durability)? {
            state = state.with_alerts(alerts);
        }
        output::status(&format!(
            "relaunch server: http://{addr} ({}{files_place})",
            opened.place
        ));
        say_if_shared(&args.data_dir);
        // Returns at once unless chunks go straight to a bucket.
        tokio::spawn(relaunch_server::collect_unconfirmed(state.clone()));
        relaunch_server::serve_with(listener, state, limits, shutdown)
            .await
            .context("the server failed")?;
        // Every queued write commits before the process ends.
        if let Some(sqlite) = &opened.sqlite {
            sqlite.close();
        }
        tracing::info!("stopped");
        Ok(0)
    })
}

/// Says so when the data directory (made by an earlier relaunch, or by
/// hand) lets other users in; left as it is, since its owner chose it.
fn say_if_shared(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(dir) else {
        return;
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        output::status(&format!(
            "relaunch server: warning: the data directory {} has mode {mode:o}, so other users \
             of this machine can read what it holds (runs, files, webhook URLs in alerts/); \
             run `chmod 700 {}` unless they should",
            dir.display(),
            dir.display()
        ));
    }
}

/// The alerts of `--webhook` and `--alert`, with their outbox in the data
/// directory; none without a webhook.
fn open_alerts(
    args: &ServerArgs,
    durability: Durability,
) -> anyhow::Result<Option<std::sync::Arc<relaunch_server::alerts::Alerts>>> {
    use relaunch_server::alerts::{AlertConfig, Alerts};
    if args.webhook.is_empty() {
        if let Some(rule) = args.alert.first() {
            bail!("--alert {rule:?} has nowhere to post: add --webhook URL");
        }
        return Ok(None);
    }
    let config = AlertConfig {
        webhooks: args
            .webhook
            .iter()
            .map(|g| g.parse())
            .collect::<Result<_, String>>()
            .map_err(anyhow::Error::msg)?,
        rules: args
            .alert
            .iter()
            .map(|g| g.parse())
            .collect::<Result<_, String>>()
            .map_err(anyhow::Error::msg)?,
    };
    let alerts = Alerts::open(config, &args.data_dir, durability).with_context(|| {
        format!(
            "cannot open the alert outbox in {}",
            args.data_dir.join("alerts").display()
        )
    })?;
    Ok(Some(alerts))
}

/// The storage the server runs on, and where its data is, for the start line.
struct Opened {
    storage: Arc<dyn Storage>,
    /// The embedded backend, which queues writes that must commit before exit.
    sqlite: Option<Arc<SqliteStorage>>,
    place: String,
}

fn open_storage(args: &ServerArgs, durability: Durability) -> anyhow::Result<Opened> {
    if let Some(url) = &args.database {
        // The message names the database without its password, and the fix.
        let pg = PgStorage::open(url, durability, args.max_readers).map_err(|e| match e {
            StorageError::Invalid(m) | StorageError::Backend(m) => anyhow::anyhow!("{m}"),
            other => anyhow::anyhow!("--database: {other}"),
        })?;
        let place = format!("database postgres {}", pg.database());
        return Ok(Opened {
            storage: Arc::new(pg),
            sqlite: None,
            place,
        });
    }
    let sqlite = Arc::new(
        SqliteStorage::open(&args.data_dir, durability)
            .with_context(|| format!("cannot open the data directory {}", args.data_dir.display()))?
            .with_max_readers(args.max_readers),
    );
    Ok(Opened {
        storage: sqlite.clone(),
        sqlite: Some(sqlite),
        place: format!("data in {}", args.data_dir.display()),
    })
}

/// Where file chunks go, and where that is for the start line (`, files
/// in ...` unless they are beside the SQLite database): the bucket of
/// `--blobs`, else `--data-dir`.
fn open_files(args: &ServerArgs, durability: Durability) -> anyhow::Result<(FileStore, String)> {
    if let Some(url) = &args.blobs {
        // The message names the bucket, the endpoint and the fix, never a secret.
        let files =
            FileStore::open_s3(url, args.s3_endpoint.as_deref(), &args.data_dir).map_err(|e| {
                match e {
                    StorageError::Invalid(m) | StorageError::Backend(m) => anyhow::anyhow!("{m}"),
                    other => anyhow::anyhow!("--blobs: {other}"),
                }
            })?;
        let direct = (!args.no_direct_uploads).then_some(relaunch_server::Direct {
            expires: args.upload_url_expiry,
            grace: args.unconfirmed_grace,
        });
        let files = files
            .with_direct(direct)
            .map_err(|e| anyhow::anyhow!("--unconfirmed-grace: {e}"))?;
        let how = if direct.is_some() {
            "; clients send chunks straight to it"
        } else {
            ""
        };
        return Ok((files, format!(", files in {url}{how}")));
    }
    let files = FileStore::open_dir(&args.data_dir, durability)
        .with_context(|| format!("cannot open the file store in {}", args.data_dir.display()))?;
    let place = match args.database {
        Some(_) => format!(", files in {}", args.data_dir.display()),
        None => String::new(),
    };
    Ok((files, place))
}

/// Open files the server needs besides its connections: the database, its
/// readers and journal, files being served, the runtime's own.
const FILES_BESIDES_CONNECTIONS: u64 = 256;

/// The connection limits, checked, with the open-file limit raised (as far
/// as the hard limit allows) to hold `--max-connections`, or the cap lowered
/// to fit it.
fn conn_limits(args: &ServerArgs) -> anyhow::Result<ConnLimits> {
    for (flag, value) in [
        ("--header-timeout", args.header_timeout),
        ("--idle-timeout", args.idle_timeout),
    ] {
        if value.is_zero() {
            bail!("{flag} 0 would close every connection at once; give a number of seconds > 0");
        }
    }
    if args.max_readers == 0 {
        bail!("--max-readers 0 would let no read run; give a number > 0");
    }
    if args.max_connections == 0 {
        bail!("--max-connections 0 would refuse every client; give a number > 0");
    }
    let mut max_connections = args.max_connections;
    let wanted = max_connections as u64 + FILES_BESIDES_CONNECTIONS;
    match rlimit::increase_nofile_limit(wanted) {
        Ok(limit) if limit < wanted => {
            let fits = limit.saturating_sub(FILES_BESIDES_CONNECTIONS).max(1);
            max_connections = usize::try_from(fits).unwrap_or(max_connections);
            tracing::warn!(
                open_file_limit = limit,
                max_connections,
                "the open-file limit holds fewer than --max-connections {} connections; \
                 serving at most {max_connections} (raise it with `ulimit -n`)",
                args.max_connections
            );
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(
            error = %e,
            "cannot raise the open-file limit; connections beyond it are refused"
        ),
    }
    Ok(ConnLimits {
        header_timeout: args.header_timeout,
        idle_timeout: args.idle_timeout,
        max_connections,
    })
}

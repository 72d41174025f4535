//! What the commands that read a tracking server share: resolving
//! `--server`/`--token` against the environment, the runtime their calls
//! run on, and client errors turned into messages that say what to do.

use anyhow::{Context as _, anyhow};
use relaunch_client::http::{SERVER_ENV, TOKEN_ENV};
use relaunch_client::{Client, ClientError, ErrorKind};

use crate::cli::ServerConnection;

/// The client for `--server` (else `RELAUNCH_SERVER`) with `--token` (else
/// `RELAUNCH_SERVER_TOKEN`).
pub(crate) fn connect(connection: &ServerConnection) -> anyhow::Result<Client> {
    let server = non_empty(connection.server.clone())
        .or_else(|| non_empty(std::env::var(SERVER_ENV).ok()))
        .with_context(|| format!("no server: pass --server URL or set {SERVER_ENV}"))?;
    let token = token(connection);
    Client::new(&server, token.as_deref()).map_err(anyhow::Error::from)
}

/// `--token`, else `RELAUNCH_SERVER_TOKEN`.
pub(crate) fn token(connection: &ServerConnection) -> Option<String> {
    non_empty(connection.token.clone()).or_else(|| non_empty(std::env::var(TOKEN_ENV).ok()))
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.trim().is_empty())
}

/// Runs one command's calls on a runtime of its own, on this thread.
pub(crate) fn block_on<F: Future>(future: F) -> anyhow::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    Ok(runtime.block_on(future))
}

/// A client error as the CLI reports it: the client's message, and the fix
/// where the kind of error tells it. `run` names the run the call was
/// about, for a clearer message when the server does not have it.
pub(crate) fn explain(error: ClientError, client: &Client, run: Option<&str>) -> anyhow::Error {
    match (error.kind(), run) {
        (ErrorKind::NotFound, Some(run)) => run_not_found(client, run),
        (ErrorKind::Unavailable, _) if matches!(error, ClientError::Unreachable { .. }) => {
            anyhow!("{error}; is `relaunch server` running there? check --server or {SERVER_ENV}")
        }
        (ErrorKind::Unauthorized, _) => {
            anyhow!("{error}; pass the server's token with --token or {TOKEN_ENV}")
        }
        _ => error.into(),
    }
}

pub(crate) fn run_not_found(client: &Client, run: &str) -> anyhow::Error {
    anyhow!(
        "no run {run:?} on {}; `relaunch runs ls` lists the runs there",
        client.url()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_server_is_used_as_given() {
        let connection = ServerConnection {
            server: Some("127.0.0.1:9/".into()),
            token: None,
        };
        let client = connect(&connection).unwrap();
        assert_eq!(client.url(), "http://127.0.0.1:9");
    }

    #[test]
    fn a_bad_server_names_the_value_and_the_shape() {
        let connection = ServerConnection {
            server: Some("ftp://x".into()),
            token: None,
        };
        let err = connect(&connection).unwrap_err().to_string();
        assert!(
            err.contains("ftp://x") && err.contains("http://HOST:PORT"),
            "{err}"
        );
    }
}

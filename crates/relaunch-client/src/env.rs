//! The environment variables the client reads, declared once. The launcher
//! sets the first group for every worker, so that each rank joins the job's
//! run without arguments.

/// The run to join; set by `relaunch run` (its `--run-id`).
pub const RUN_ID: &str = "RELAUNCH_RUN_ID";
/// Names the attempt: every rank of one attempt shares it, the next
/// attempt (a restart, or a relaunch of the whole job) gets a new one.
pub const ATTEMPT_TOKEN: &str = "RELAUNCH_ATTEMPT_TOKEN";
/// The project for runs that do not name one.
pub const PROJECT: &str = "RELAUNCH_PROJECT";
/// The tracking server, `http(s)://HOST:PORT`.
pub const SERVER: &str = crate::http::SERVER_ENV;
/// The server's access token.
pub const SERVER_TOKEN: &str = crate::http::TOKEN_ENV;
/// The client's directory (spools of every run); `crate::local::default_dir()`
/// by default.
pub const DIR: &str = crate::local::DIR_ENV;
/// The process's global rank, as torch sets it.
pub const RANK: &str = "RANK";

/// A variable's value, when set and not empty.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

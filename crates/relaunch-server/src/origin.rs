//! Requests that another site's page makes through the user's browser:
//! refused, whether or not the server has a token.
//!
//! - **Host**: a server on a loopback address answers only requests whose
//!   `Host` names a loopback address (`127.0.0.1`, `localhost`, `[::1]`,
//!   `*.localhost`) or a name given with `--allowed-host`. Another site's
//!   page whose name was made to resolve to 127.0.0.1 (DNS rebinding) sends
//!   its own name, so it is refused. A server on another address (which
//!   needs a token) takes any `Host` unless `--allowed-host` names some.
//! - **Writes** (any method but `GET`, `HEAD`, `OPTIONS`) to the API: one
//!   whose `Origin` is not this server's own (the page that sent it is
//!   another site's) is refused, and so is a body of a type that a page of
//!   any site may send without asking the server first
//!   (`application/x-www-form-urlencoded`, `multipart/form-data`,
//!   `text/plain`): relaunch's clients send JSON, batches and octets.
//! - **Headers** on every answer: the dashboard's pages load only the
//!   server's own scripts, and no site may frame them
//!   (`Content-Security-Policy`, `X-Frame-Options: DENY`); no answer is
//!   sniffed as another type (`X-Content-Type-Options: nosniff`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::error::AppError;

/// The pages' policy: the server's own scripts, styles, images, media and
/// API; `data:`/`blob:` images and media (what the pages make of answers).
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self' data: blob:; media-src 'self' blob:; \
    connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
    frame-ancestors 'none'";

/// Which `Host` headers name this server.
#[derive(Clone, Debug)]
pub(crate) struct HostCheck {
    listen: SocketAddr,
    allowed: Arc<[String]>,
}

impl HostCheck {
    /// For a server listening on `listen`, with the `--allowed-host` names
    /// (host names or addresses, without a port; compared without case).
    pub(crate) fn new(listen: SocketAddr, allowed: Vec<String>) -> Self {
        let allowed = allowed
            .into_iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        Self { listen, allowed }
    }

    /// Whether a request whose `Host` is `host` may be answered.
    pub(crate) fn admits(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        if self.allowed.contains(&name) {
            return true;
        }
        let loopback_name = name == "localhost"
            || name.ends_with(".localhost")
            || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if self.listen.ip().is_loopback() {
            loopback_name
        } else {
            // Exposed (a token guards it): any name, unless some are given;
            // an address literal always reaches it as what it is.
            self.allowed.is_empty() || loopback_name || name.parse::<IpAddr>().is_ok()
        }
    }
}

/// The host of a `Host` value: without its port, an IPv6 address without
/// its brackets.
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The `host[:port]` of an `Origin` (`scheme://host[:port]`), or None when
/// it names none (`null`: a sandboxed page, a file).
fn origin_authority(origin: &str) -> Option<&str> {
    let (_, rest) = origin.trim().split_once("://")?;
    Some(rest.trim_end_matches('/'))
}

/// The default port of the `Origin`'s scheme, for comparing an `Origin`
/// without a port with a `Host` that has one.
fn same_authority(origin: &str, host: &str) -> bool {
    let Some(authority) = origin_authority(origin) else {
        return false;
    };
    if authority.eq_ignore_ascii_case(host) {
        return true;
    }
    let default = if origin.trim_start().starts_with("https://") {
        "443"
    } else {
        "80"
    };
    let with_port = |a: &str| {
        if a.ends_with(']') || !a.contains(':') {
            format!("{a}:{default}")
        } else {
            a.to_owned()
        }
    };
    with_port(authority).eq_ignore_ascii_case(&with_port(host))
}

/// Media types a page of another site may send without a preflight.
fn sendable_by_any_page(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(
        essence.as_str(),
        "application/x-www-form-urlencoded" | "multipart/form-data" | "text/plain"
    )
}

/// The middleware: refuses what the module says, and adds the headers.
pub(crate) async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_owned()));
    if let (Some(check), Some(host)) = (state.host_check(), host.as_deref())
        && !check.admits(host)
    {
        let name = host_name(host);
        return with_headers(
            AppError::Forbidden(format!(
                "Host {host:?} does not name this server (it listens on {}): a page of another \
                 site may be reaching it through a name it made point here; if {name:?} is a \
                 name of yours for this server, start it with --allowed-host {name}",
                check.listen
            ))
            .into_response(),
        );
    }
    let writes = !matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if writes && request.uri().path().starts_with(relaunch_api::API_PREFIX) {
        if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
            let own = host
                .as_deref()
                .is_some_and(|host| same_authority(origin, host));
            if !own {
                return with_headers(
                    AppError::Forbidden(format!(
                        "a write from a page of {origin:?} is refused: only this server's own \
                         pages and relaunch's clients (which send no Origin) may write"
                    ))
                    .into_response(),
                );
            }
        }
        if let Some(kind) = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            && sendable_by_any_page(kind)
        {
            return with_headers(
                AppError::UnsupportedMediaType(format!(
                    "a body of type {kind:?} is refused (a page of any site may send that type): \
                     send application/json, the batch's type ({}) or application/octet-stream",
                    relaunch_api::batch::CONTENT_TYPE
                ))
                .into_response(),
            );
        }
    }
    with_headers(next.run(request).await)
}

fn with_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_server_answers_loopback_names_and_the_allowed_ones() {
        let check = HostCheck::new(
            "127.0.0.1:8080".parse().unwrap_or_else(|_| unreachable!()),
            vec!["Box.Example".into()],
        );
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "a.localhost:1",
            "[::1]:8080",
            "127.0.0.2",
            "box.example:8080",
        ] {
            assert!(check.admits(host), "{host}");
        }
        for host in [
            "evil.example:8080",
            "evil.example",
            "10.0.0.1:8080",
            "localhost.evil.example",
            "[::2]:8080",
        ] {
            assert!(!check.admits(host), "{host}");
        }
    }

    #[test]
    fn an_exposed_server_answers_any_name_unless_some_are_given() {
        let any = HostCheck::new(
            "0.0.0.0:8080".parse().unwrap_or_else(|_| unreachable!()),
            vec![],
        );
        assert!(any.admits("relaunch.internal:8080") && any.admits("10.1.2.3:8080"));
        let some = HostCheck::new(
            "0.0.0.0:8080".parse().unwrap_or_else(|_| unreachable!()),
            vec!["relaunch.internal".into()],
        );
        assert!(some.admits("relaunch.internal:8080") && some.admits("10.1.2.3:8080"));
        assert!(!some.admits("evil.example"));
    }

    #[test]
    fn origins_compare_with_the_host_ports_included() {
        assert!(same_authority("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(same_authority("http://box.example", "box.example:80"));
        assert!(same_authority("https://box.example", "box.example:443"));
        assert!(same_authority("http://[::1]:8080", "[::1]:8080"));
        assert!(!same_authority("http://127.0.0.1:8888", "127.0.0.1:8080"));
        assert!(!same_authority("http://evil.example", "127.0.0.1:80"));
        assert!(!same_authority("null", "127.0.0.1:8080"));
    }

    #[test]
    fn the_types_any_page_may_send_are_known() {
        for kind in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "Multipart/Form-Data; boundary=x",
            "application/x-www-form-urlencoded",
        ] {
            assert!(sendable_by_any_page(kind), "{kind}");
        }
        for kind in [
            "application/json",
            "application/x-relaunch-batch",
            "application/octet-stream",
        ] {
            assert!(!sendable_by_any_page(kind), "{kind}");
        }
    }
}

//! The dashboard: static pages (plain ES modules, CSS and a vendored uPlot,
//! no build step) embedded in the binary and served outside the token
//! guard. The pages hold no data; they call `/api/v1` with the token the
//! person gives them.
//!
//! Assets live under `/assets/`; the page routes (`/`, `/runs/{id}`,
//! `/compare`) all serve `index.html`, whose script reads the URL, so a
//! link to any view works. Responses carry an ETag (the content's BLAKE3)
//! and `Cache-Control: no-cache`: browsers revalidate, and a new binary's
//! assets are never served stale.

use std::sync::LazyLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// One embedded file.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $type:expr) => {
        Asset {
            path: $path,
            content_type: $type,
            bytes: include_bytes!(concat!("../dashboard/", $path)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Every file of `dashboard/` that a page loads (a test checks none is
/// missing).
static ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("style.css", CSS),
    asset!("api.js", JS),
    asset!("app.js", JS),
    asset!("chart.js", JS),
    asset!("compare.js", JS),
    asset!("goodput.js", JS),
    asset!("logs.js", JS),
    asset!("media.js", JS),
    asset!("parallel.js", JS),
    asset!("run.js", JS),
    asset!("runs.js", JS),
    asset!("util.js", JS),
    asset!("vendor/uplot/uPlot.esm.js", JS),
    asset!("vendor/uplot/uPlot.min.css", CSS),
    asset!("vendor/uplot/LICENSE", "text/plain; charset=utf-8"),
];

/// Each asset's ETag, computed once.
static ETAGS: LazyLock<Vec<HeaderValue>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let hash = blake3::hash(a.bytes).to_hex();
            // A quoted hex string is always a valid header value.
            HeaderValue::from_str(&format!("\"{}\"", &hash[..32]))
                .unwrap_or_else(|_| HeaderValue::from_static("\"0\""))
        })
        .collect()
});

/// The page routes and `/assets/`, to merge beside `/api/v1`.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/runs/{*rest}", get(index))
        .route("/compare", get(index))
        .route("/assets/{*path}", get(asset))
}

async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&path, &headers)
}

fn serve(path: &str, headers: &HeaderMap) -> Response {
    let Some(i) = ASSETS.iter().position(|a| a.path == path) else {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("no dashboard asset {path:?}"),
        )
            .into_response();
    };
    let (asset, etag) = (&ASSETS[i], &ETAGS[i]);
    let cache = [
        (header::ETAG, etag.clone()),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    if matches {
        return (StatusCode::NOT_MODIFIED, cache).into_response();
    }
    (
        cache,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        )],
        asset.bytes,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Every page file in `dashboard/` is embedded: a module the pages
    /// import but the table lacks would fail only in a browser.
    #[test]
    fn every_dashboard_file_is_embedded() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboard");
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let rel = path.strip_prefix(&root).unwrap().to_str().unwrap();
                if rel.ends_with("README.md") {
                    continue;
                }
                assert!(
                    ASSETS.iter().any(|a| a.path == rel),
                    "dashboard/{rel} is not in ASSETS"
                );
            }
        }
    }

    #[test]
    fn content_types_follow_the_extension() {
        for a in ASSETS {
            let want = match a.path.rsplit('.').next() {
                Some("js") => JS,
                Some("css") => CSS,
                Some("html") => "text/html; charset=utf-8",
                _ => "text/plain; charset=utf-8",
            };
            assert_eq!(a.content_type, want, "{}", a.path);
        }
    }
}

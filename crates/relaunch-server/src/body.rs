//! Request bodies read into memory, and the cap on the memory that bodies
//! in flight hold together. A body is read as it arrives (a declared
//! Content-Length reserves nothing), and what it holds is counted against
//! the server's budget (`--max-body-memory`): past it, the request is
//! answered 503 with `Retry-After`, which the relaunch client retries,
//! rather than the process growing until the kernel or the allocator ends
//! it. The first [`SMALL_BODY`] bytes of every body are outside the budget,
//! so that small writers (a metrics batch, a run's patch) are never refused
//! for the memory big uploads hold.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use http_body_util::BodyExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::AppError;

/// Default `--max-body-memory`.
pub const DEFAULT_MAX_BODY_MEMORY: usize = 1 << 30;

/// Bytes of each body that the budget does not count: `--max-connections`
/// bodies of this size at most outside it (625 MiB at 10,000).
pub(crate) const SMALL_BODY: usize = 64 << 10;

/// The budget is counted in units of this many bytes (a semaphore counts
/// at most `u32::MAX` permits at a time).
const UNIT: usize = 1024;

/// The memory bodies in flight may hold together, beyond their first
/// [`SMALL_BODY`] bytes each.
#[derive(Clone, Debug)]
pub(crate) struct BodyBudget {
    units: Arc<Semaphore>,
    bytes: usize,
}

impl BodyBudget {
    pub(crate) fn new(bytes: usize) -> Self {
        let units = bytes.div_ceil(UNIT).min(Semaphore::MAX_PERMITS);
        Self {
            units: Arc::new(Semaphore::new(units)),
            bytes,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of the budget not held now.
    #[cfg(test)]
    fn available(&self) -> usize {
        self.units.available_permits() * UNIT
    }
}

/// A body read whole, and its share of the budget, given back when this is
/// dropped: keep it for as long as the handler works on the bytes.
#[derive(Debug)]
pub(crate) struct Held {
    bytes: Bytes,
    _share: Option<OwnedSemaphorePermit>,
}

impl std::ops::Deref for Held {
    type Target = Bytes;

    fn deref(&self) -> &Bytes {
        &self.bytes
    }
}

/// Reads a body of at most `limit` bytes; a larger one gets a 413 naming
/// the limit, then `what_to_do`; one that would take the budget past its
/// cap, a 503. Reading takes as long as the client takes: a slow upload
/// that keeps sending is never cut off (the connection's watchdog closes
/// one that stops).
pub(crate) async fn read_limited(
    budget: &BodyBudget,
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
    what_to_do: &str,
) -> Result<Held, AppError> {
    let too_large = |size: String| {
        AppError::TooLarge(format!(
            "request body of {size} exceeds the server's limit of {limit} bytes; {what_to_do}"
        ))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(length) = declared
        && length > limit
    {
        return Err(too_large(format!("{length} bytes")));
    }
    // What a small body needs, and no more: a declared length is the
    // client's word, and a client that declares 64 MiB and sends nothing
    // must not make the server hold 64 MiB.
    let mut buf: Vec<u8> = Vec::with_capacity(declared.unwrap_or(0).min(SMALL_BODY));
    let mut share: Option<OwnedSemaphorePermit> = None;
    let mut counted = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| AppError::BadRequest(format!("cannot read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let needed = buf.len() + data.len();
        if needed > limit {
            return Err(too_large(format!("more than {limit} bytes")));
        }
        if needed > buf.capacity() {
            // Double (amortized), but never past the limit or the declared
            // length; counted before it is allocated.
            let mut grown = (buf.capacity() * 2).clamp(needed, limit);
            if let Some(length) = declared {
                grown = grown.min(length).max(needed);
            }
            take_share(budget, &mut share, &mut counted, grown)?;
            buf.reserve_exact(grown - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok(Held {
        bytes: Bytes::from(buf),
        _share: share,
    })
}

/// Counts a buffer of `capacity` bytes against the budget (beyond its
/// first [`SMALL_BODY`] bytes), taking what more it needs; a 503 when the
/// budget has not that much left.
fn take_share(
    budget: &BodyBudget,
    share: &mut Option<OwnedSemaphorePermit>,
    counted: &mut usize,
    capacity: usize,
) -> Result<(), AppError> {
    let needed = capacity.saturating_sub(SMALL_BODY).div_ceil(UNIT);
    if needed <= *counted {
        return Ok(());
    }
    let more = u32::try_from(needed - *counted).unwrap_or(u32::MAX);
    let taken = budget
        .units
        .clone()
        .try_acquire_many_owned(more)
        .map_err(|_| {
            AppError::Busy(format!(
                "the server holds {} bytes of request bodies in flight, its limit \
                 (--max-body-memory); retry shortly, or send smaller requests",
                budget.bytes()
            ))
        })?;
    *counted += more as usize;
    match share {
        Some(held) => held.merge(taken),
        None => *share = Some(taken),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn declaring(length: usize) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, length.into());
        headers
    }

    #[tokio::test]
    async fn a_body_holds_its_share_of_the_budget_until_dropped() {
        let budget = BodyBudget::new(1 << 20);
        let body = Body::from(vec![7u8; 300 << 10]);
        let held = read_limited(&budget, &declaring(300 << 10), body, 1 << 20, "")
            .await
            .unwrap();
        assert_eq!(held.len(), 300 << 10);
        assert!(held.iter().all(|&b| b == 7));
        let taken = (1 << 20) - budget.available();
        assert!(
            ((300 << 10) - SMALL_BODY..=2 * (300 << 10)).contains(&taken),
            "{taken}"
        );
        drop(held);
        assert_eq!(budget.available(), 1 << 20);
    }

    #[tokio::test]
    async fn past_the_budget_a_body_is_refused_busy_and_gives_back_its_share() {
        let budget = BodyBudget::new(256 << 10);
        let first = read_limited(
            &budget,
            &HeaderMap::new(),
            Body::from(vec![1u8; 200 << 10]),
            1 << 20,
            "",
        )
        .await
        .unwrap();
        let err = read_limited(
            &budget,
            &HeaderMap::new(),
            Body::from(vec![2u8; 300 << 10]),
            1 << 20,
            "",
        )
        .await
        .unwrap_err();
        assert!(matches!(err, AppError::Busy(_)), "{err:?}");
        assert!(err.to_string().contains("--max-body-memory"), "{err}");
        // A small body is never refused for what big ones hold.
        let small = read_limited(
            &budget,
            &HeaderMap::new(),
            Body::from(vec![3u8; 60 << 10]),
            1 << 20,
            "",
        )
        .await
        .unwrap();
        assert_eq!(small.len(), 60 << 10);
        drop((first, small));
        assert_eq!(budget.available(), 256 << 10);
    }
}

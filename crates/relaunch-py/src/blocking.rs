//! Running the async client's futures from Python threads: on the caller's
//! thread, interruptible by Ctrl-C, and without the GIL hand-off that makes
//! a blocking client collapse next to a busy Python thread.
//!
//! A call that releases the GIL for its network round trip must take the GIL
//! back afterwards. If another thread of the process is running Python (a
//! training loop, a spinning poller), CPython hands it the GIL and makes the
//! caller wait a whole switch interval (5 ms by default) to get it back: one
//! call every 5 ms, whatever the network does. PyTorch's TCPStore client
//! releases the GIL on every call and drops from ~40,000 to ~200 calls per
//! second this way. [`GilPolicy`] notices such waits and then keeps the GIL
//! through short calls, releasing it only for calls that take longer than
//! [`GIL_HOLD`] (a WAIT, a slow network). While nobody else wants the GIL,
//! it releases it on every call so that threads make calls in parallel.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use relaunch_store::StoreError;
use tokio::runtime::Runtime;

use crate::errors::store_error;

/// How often a call that waits with the GIL released looks for Ctrl-C.
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// Longest a call keeps the GIL before it releases it.
const GIL_HOLD: Duration = Duration::from_millis(1);

/// A wait for the GIL longer than this share of the interpreter's switch
/// interval means another thread held it until it was forced to let go,
/// which is what a busy thread does; shorter waits are threads taking turns
/// or the OS scheduling the caller late.
const CONTENDED_SHARE: f64 = 0.8;

/// While holding, one call in this many releases the GIL again to see
/// whether the competition is still there.
const PROBE_EVERY: u32 = 256;

/// Whether calls keep the GIL through short round trips; learnt per client.
#[derive(Debug)]
pub(crate) struct GilPolicy {
    hold: AtomicBool,
    calls: AtomicU32,
    contended: Duration,
}

impl GilPolicy {
    /// A policy for an interpreter whose switch interval is `switch_interval`
    /// (`sys.getswitchinterval()`).
    pub(crate) fn new(switch_interval: Duration) -> Self {
        Self {
            hold: AtomicBool::new(false),
            calls: AtomicU32::new(0),
            contended: switch_interval.mul_f64(CONTENDED_SHARE),
        }
    }

    fn should_hold(&self) -> bool {
        self.hold.load(Ordering::Relaxed)
            && self.calls.fetch_add(1, Ordering::Relaxed) % PROBE_EVERY != PROBE_EVERY - 1
    }

    fn observe_reacquire(&self, waited: Duration) {
        self.hold.store(waited > self.contended, Ordering::Relaxed);
    }
}

/// Runs `op` to completion on `runtime`, which must have no threads of its
/// own, so the future runs on the calling thread.
pub(crate) fn block_on<T, F>(
    py: Python<'_>,
    runtime: &Runtime,
    policy: Option<&GilPolicy>,
    op: F,
) -> PyResult<T>
where
    T: Send,
    F: Future<Output = Result<T, StoreError>> + Send,
{
    let mut op = std::pin::pin!(op);
    // Timers must be created inside the runtime, hence the async blocks.
    if policy.is_some_and(GilPolicy::should_hold)
        && let Ok(result) =
            runtime.block_on(async { tokio::time::timeout(GIL_HOLD, op.as_mut()).await })
    {
        return result.map_err(store_error);
    }
    loop {
        let (step, finished) = py.detach(|| {
            let step = runtime
                .block_on(async { tokio::time::timeout(SIGNAL_CHECK_INTERVAL, op.as_mut()).await });
            (step, Instant::now())
        });
        if let Some(policy) = policy {
            policy.observe_reacquire(finished.elapsed());
        }
        match step {
            Ok(result) => return result.map_err(store_error),
            // An interrupted call drops `op`; the client then replaces its
            // connection on the next call.
            Err(_) => py.check_signals()?,
        }
    }
}

//! The store's data and its waiters, with PyTorch's semantics; no I/O.
//!
//! Keys and values are byte strings. Queues live in their own namespace but
//! share the waiter table, as in PyTorch: a waiter on `k` is released by
//! anything that makes `k` exist (SET, MULTI_SET, ADD, APPEND, a creating
//! COMPARE_SET) and, one waiter per item, by QUEUE_PUSH to `k`. DELETE_KEY
//! releases no one. A connection has at most one pending WAIT or BARRIER.
//!
//! Deliberate differences from PyTorch's libuv server, each a fix of a case
//! where PyTorch releases a waiter for a key that still does not exist or
//! keeps a released waiter registered:
//! - a COMPARE_SET that fails on a missing key releases no one (PyTorch's
//!   libuv server releases the key's waiters although the key stays missing;
//!   its older server releases no one on any COMPARE_SET);
//! - QUEUE_PUSH unregisters the waiter it releases (PyTorch leaves it
//!   registered, so a later push can release that connection's next wait);
//! - WAIT registers only on keys that are not ready (PyTorch also registers on
//!   non-empty queues, which then never release it).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};

/// Identifies one client connection.
pub type ConnId = u64;

/// How the state tells a connection that its pending wait is over. Called
/// with the state locked, so it must be quick and must not block.
pub trait Wake {
    fn wake(&self);
}

/// Whether a WAIT or BARRIER is answered now or later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// Reply STOP_WAITING now.
    Ready,
    /// The reply comes when the connection's waker fires.
    Pending,
}

/// ADD or BARRIER on a key whose value is not a decimal integer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAnInteger {
    pub value: Vec<u8>,
}

/// WAIT or BARRIER on a connection that already has one pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlreadyWaiting;

#[derive(Debug)]
struct Pending<W> {
    remaining: usize,
    keys: Vec<Box<[u8]>>,
    waker: W,
}

/// All keys, values, queues and waiters of one store.
#[derive(Debug)]
pub struct KvState<W> {
    values: HashMap<Box<[u8]>, Vec<u8>>,
    queues: HashMap<Box<[u8]>, VecDeque<Vec<u8>>>,
    /// Per key, the connections waiting for it, oldest first; a connection
    /// appears once per time it named the key.
    watchers: HashMap<Box<[u8]>, Vec<ConnId>>,
    pending: HashMap<ConnId, Pending<W>>,
}

impl<W> Default for KvState<W> {
    fn default() -> Self {
        Self {
            values: HashMap::new(),
            queues: HashMap::new(),
            watchers: HashMap::new(),
            pending: HashMap::new(),
        }
    }
}

impl<W: Wake> KvState<W> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&mut self, key: &[u8], value: &[u8]) {
        match self.values.get_mut(key) {
            Some(existing) => {
                existing.clear();
                existing.extend_from_slice(value);
            }
            None => {
                self.values.insert(key.into(), value.to_vec());
            }
        }
        self.release_all(key);
    }

    /// PyTorch's compare-and-set: on a missing key, an empty `expected`
    /// creates it and returns `desired`, anything else returns `expected`
    /// unchanged; on an existing key, the value is replaced when it equals
    /// `expected`, and the (possibly new) current value is returned.
    pub fn compare_set<'a>(
        &'a mut self,
        key: &[u8],
        expected: &'a [u8],
        desired: &[u8],
    ) -> &'a [u8] {
        if !self.values.contains_key(key) {
            if !expected.is_empty() {
                return expected;
            }
            self.values.insert(key.into(), desired.to_vec());
            self.release_all(key);
        } else if let Some(current) = self.values.get_mut(key)
            && current.as_slice() == expected
        {
            current.clear();
            current.extend_from_slice(desired);
        }
        self.values.get(key).map_or(&[], Vec::as_slice)
    }

    /// The value of `key`, or an empty value when it is missing (as PyTorch;
    /// its client always waits for the key before it gets it).
    pub fn get(&self, key: &[u8]) -> &[u8] {
        self.values.get(key).map_or(&[], Vec::as_slice)
    }

    /// Adds `delta` to the integer stored at `key` (missing counts as 0),
    /// stores the sum in decimal and returns it. Overflow wraps, as in
    /// PyTorch.
    pub fn add(&mut self, key: &[u8], delta: i64) -> Result<i64, NotAnInteger> {
        let sum = match self.values.get(key) {
            Some(value) => parse_integer(value)
                .ok_or_else(|| NotAnInteger {
                    value: value.clone(),
                })?
                .wrapping_add(delta),
            None => delta,
        };
        self.store_integer(key, sum);
        self.release_all(key);
        Ok(sum)
    }

    /// Whether every key exists, as a value or as a non-empty queue.
    pub fn check(&self, keys: &[&[u8]]) -> bool {
        keys.iter().all(|key| self.is_ready(key))
    }

    fn is_ready(&self, key: &[u8]) -> bool {
        self.values.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }

    /// Waits for every key to exist; `waker` fires once, when they all have.
    pub fn wait(
        &mut self,
        conn: ConnId,
        keys: &[&[u8]],
        waker: W,
    ) -> Result<WaitOutcome, AlreadyWaiting> {
        if self.pending.contains_key(&conn) {
            return Err(AlreadyWaiting);
        }
        if self.check(keys) {
            return Ok(WaitOutcome::Ready);
        }
        let registered: Vec<Box<[u8]>> = keys
            .iter()
            .filter(|key| !self.is_ready(key))
            .map(|key| Box::from(*key))
            .collect();
        for key in &registered {
            self.watchers.entry(key.clone()).or_default().push(conn);
        }
        self.pending.insert(
            conn,
            Pending {
                remaining: registered.len(),
                keys: registered,
                waker,
            },
        );
        Ok(WaitOutcome::Pending)
    }

    /// PyTorch's BARRIER: counts arrivals in `key` (as ADD does) and releases
    /// everyone waiting on `key` once the count reaches `world_size`.
    pub fn barrier(
        &mut self,
        conn: ConnId,
        key: &[u8],
        world_size: i64,
        waker: W,
    ) -> Result<Result<WaitOutcome, AlreadyWaiting>, NotAnInteger> {
        if self.pending.contains_key(&conn) {
            return Ok(Err(AlreadyWaiting));
        }
        let arrived = match self.values.get(key) {
            Some(value) => parse_integer(value)
                .ok_or_else(|| NotAnInteger {
                    value: value.clone(),
                })?
                .wrapping_add(1),
            None => 1,
        };
        self.store_integer(key, arrived);
        if arrived >= world_size {
            self.release_all(key);
            return Ok(Ok(WaitOutcome::Ready));
        }
        self.watchers.entry(key.into()).or_default().push(conn);
        self.pending.insert(
            conn,
            Pending {
                remaining: 1,
                keys: vec![key.into()],
                waker,
            },
        );
        Ok(Ok(WaitOutcome::Pending))
    }

    /// Drops `conn`'s pending wait, if any, without waking it. Returns
    /// whether there was one. Used for CANCEL_WAIT and on disconnect.
    pub fn cancel_wait(&mut self, conn: ConnId) -> bool {
        let Some(pending) = self.pending.remove(&conn) else {
            return false;
        };
        for key in &pending.keys {
            if let Entry::Occupied(mut entry) = self.watchers.entry(key.clone()) {
                entry.get_mut().retain(|&c| c != conn);
                if entry.get().is_empty() {
                    entry.remove();
                }
            }
        }
        true
    }

    /// Number of keys with values (queues are not counted, as in PyTorch).
    pub fn num_keys(&self) -> usize {
        self.values.len()
    }

    /// Deletes `key`'s value; returns whether it existed. Releases no one.
    pub fn delete_key(&mut self, key: &[u8]) -> bool {
        self.values.remove(key).is_some()
    }

    pub fn append(&mut self, key: &[u8], value: &[u8]) {
        match self.values.get_mut(key) {
            Some(existing) => existing.extend_from_slice(value),
            None => {
                self.values.insert(key.into(), value.to_vec());
            }
        }
        self.release_all(key);
    }

    pub fn queue_push(&mut self, key: &[u8], value: &[u8]) {
        match self.queues.get_mut(key) {
            Some(queue) => queue.push_back(value.to_vec()),
            None => {
                self.queues
                    .insert(key.into(), VecDeque::from([value.to_vec()]));
            }
        }
        self.release_one(key);
    }

    /// Pops the oldest item; returns the queue's length before the pop and
    /// the item, if there was one.
    pub fn queue_pop(&mut self, key: &[u8]) -> (usize, Option<Vec<u8>>) {
        let Some(queue) = self.queues.get_mut(key) else {
            return (0, None);
        };
        let len = queue.len();
        let item = queue.pop_front();
        if queue.is_empty() {
            self.queues.remove(key);
        }
        (len, item)
    }

    pub fn queue_len(&self, key: &[u8]) -> usize {
        self.queues.get(key).map_or(0, VecDeque::len)
    }

    /// Deletes every value and queue whose key fails `keep`; returns how
    /// many went. Releases no one, like DELETE_KEY.
    pub fn retain_keys(&mut self, mut keep: impl FnMut(&[u8]) -> bool) -> usize {
        let before = self.values.len() + self.queues.len();
        self.values.retain(|k, _| keep(k));
        self.queues.retain(|k, _| keep(k));
        before - self.values.len() - self.queues.len()
    }

    /// Keys with values, in no particular order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.values.keys().map(|k| &**k)
    }

    /// Number of connections with a pending wait.
    pub fn pending_waits(&self) -> usize {
        self.pending.len()
    }

    /// Number of keys somebody waits for.
    pub fn watched_keys(&self) -> usize {
        self.watchers.len()
    }

    fn store_integer(&mut self, key: &[u8], n: i64) {
        let text = n.to_string().into_bytes();
        match self.values.get_mut(key) {
            Some(existing) => *existing = text,
            None => {
                self.values.insert(key.into(), text);
            }
        }
    }

    /// Counts `key` as arrived for everyone waiting on it.
    fn release_all(&mut self, key: &[u8]) {
        let Some(conns) = self.watchers.remove(key) else {
            return;
        };
        for conn in conns {
            self.arrive(conn);
        }
    }

    /// Counts `key` as arrived for its oldest waiter only.
    fn release_one(&mut self, key: &[u8]) {
        let Some(conns) = self.watchers.get_mut(key) else {
            return;
        };
        let conn = conns.remove(0);
        if conns.is_empty() {
            self.watchers.remove(key);
        }
        self.arrive(conn);
    }

    fn arrive(&mut self, conn: ConnId) {
        let Entry::Occupied(mut entry) = self.pending.entry(conn) else {
            return;
        };
        let pending = entry.get_mut();
        pending.remaining = pending.remaining.saturating_sub(1);
        if pending.remaining == 0 {
            entry.remove().waker.wake();
        }
    }
}

/// Parses an integer the way C++'s `std::stoll` does, which PyTorch uses:
/// leading whitespace, an optional sign, then decimal digits; anything after
/// the digits is ignored. `None` when there are no digits or on overflow.
pub fn parse_integer(bytes: &[u8]) -> Option<i64> {
    let mut i = bytes
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r'))?;
    let negative = match bytes[i] {
        b'-' => {
            i += 1;
            true
        }
        b'+' => {
            i += 1;
            false
        }
        _ => false,
    };
    let digits = bytes[i..].iter().take_while(|b| b.is_ascii_digit());
    let mut n: i64 = 0;
    let mut any = false;
    for d in digits {
        any = true;
        let d = i64::from(d - b'0');
        // Accumulate negatively so that i64::MIN parses.
        n = n.checked_mul(10)?.checked_sub(d)?;
    }
    if !any {
        return None;
    }
    if negative { Some(n) } else { n.checked_neg() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[derive(Clone, Default)]
    struct Count(Rc<Cell<u32>>);
    impl Wake for Count {
        fn wake(&self) {
            self.0.set(self.0.get() + 1);
        }
    }
    impl Count {
        fn get(&self) -> u32 {
            self.0.get()
        }
    }

    #[test]
    fn stoll_semantics() {
        assert_eq!(parse_integer(b"42"), Some(42));
        assert_eq!(parse_integer(b"  -7xyz"), Some(-7));
        assert_eq!(parse_integer(b"+3"), Some(3));
        assert_eq!(parse_integer(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_integer(b"9223372036854775808"), None);
        assert_eq!(parse_integer(b""), None);
        assert_eq!(parse_integer(b"abc"), None);
        assert_eq!(parse_integer(b"-"), None);
    }

    #[test]
    fn compare_set_edge_cases_match_pytorch() {
        let mut s = KvState::<Count>::new();
        // Missing key, non-empty expected: returns expected, creates nothing.
        assert_eq!(s.compare_set(b"k", b"x", b"y"), b"x");
        assert_eq!(s.num_keys(), 0);
        // Missing key, empty expected: creates with desired.
        assert_eq!(s.compare_set(b"k", b"", b"y"), b"y");
        // Existing key, mismatch: returns current, unchanged.
        assert_eq!(s.compare_set(b"k", b"nope", b"z"), b"y");
        // Existing key, match: swaps.
        assert_eq!(s.compare_set(b"k", b"y", b"z"), b"z");
        assert_eq!(s.get(b"k"), b"z");
    }

    #[test]
    fn wait_releases_once_every_key_exists() {
        let mut s = KvState::new();
        let w = Count::default();
        assert_eq!(
            s.wait(1, &[b"a", b"b"], w.clone()),
            Ok(WaitOutcome::Pending)
        );
        s.set(b"a", b"1");
        assert_eq!(w.get(), 0);
        s.add(b"b", 1).unwrap();
        assert_eq!(w.get(), 1);
        assert_eq!(s.pending_waits(), 0);
        assert_eq!(s.watched_keys(), 0);
        // Ready at once when the keys exist.
        assert_eq!(s.wait(1, &[b"a", b"b"], w.clone()), Ok(WaitOutcome::Ready));
    }

    #[test]
    fn failed_compare_set_and_delete_release_no_one() {
        let mut s = KvState::new();
        let w = Count::default();
        s.wait(1, &[b"k"], w.clone()).unwrap();
        s.compare_set(b"k", b"x", b"y");
        s.delete_key(b"k");
        assert_eq!(w.get(), 0);
        s.compare_set(b"k", b"", b"y");
        assert_eq!(w.get(), 1);
    }

    #[test]
    fn one_pending_wait_per_connection() {
        let mut s = KvState::new();
        s.wait(1, &[b"k"], Count::default()).unwrap();
        assert_eq!(s.wait(1, &[b"j"], Count::default()), Err(AlreadyWaiting));
        assert_eq!(
            s.barrier(1, b"b", 2, Count::default()),
            Ok(Err(AlreadyWaiting))
        );
    }

    #[test]
    fn cancel_forgets_every_registration() {
        let mut s = KvState::new();
        let w = Count::default();
        s.wait(1, &[b"a", b"b", b"a"], w.clone()).unwrap();
        s.wait(2, &[b"a"], Count::default()).unwrap();
        assert!(s.cancel_wait(1));
        assert!(!s.cancel_wait(1));
        assert_eq!(s.watched_keys(), 1);
        s.set(b"a", b"");
        s.set(b"b", b"");
        assert_eq!(w.get(), 0);
        assert_eq!(s.pending_waits(), 0);
    }

    #[test]
    fn queue_push_releases_one_waiter_per_item() {
        let mut s = KvState::new();
        let (w1, w2) = (Count::default(), Count::default());
        s.wait(1, &[b"q"], w1.clone()).unwrap();
        s.wait(2, &[b"q"], w2.clone()).unwrap();
        s.queue_push(b"q", b"x");
        assert_eq!((w1.get(), w2.get()), (1, 0));
        assert!(s.check(&[b"q"]));
        assert_eq!(s.queue_pop(b"q"), (1, Some(b"x".to_vec())));
        assert!(!s.check(&[b"q"]));
        // The released waiter is gone: a second push releases the next one.
        s.queue_push(b"q", b"y");
        assert_eq!((w1.get(), w2.get()), (1, 1));
        assert_eq!(s.queue_len(b"q"), 1);
        assert_eq!(s.num_keys(), 0, "queues are not keys");
    }

    #[test]
    fn barrier_counts_arrivals() {
        let mut s = KvState::new();
        let (w1, w2) = (Count::default(), Count::default());
        assert_eq!(
            s.barrier(1, b"b", 3, w1.clone()),
            Ok(Ok(WaitOutcome::Pending))
        );
        assert_eq!(
            s.barrier(2, b"b", 3, w2.clone()),
            Ok(Ok(WaitOutcome::Pending))
        );
        assert_eq!(
            s.barrier(3, b"b", 3, Count::default()),
            Ok(Ok(WaitOutcome::Ready))
        );
        assert_eq!((w1.get(), w2.get()), (1, 1));
        assert_eq!(s.get(b"b"), b"3");
        s.set(b"x", b"not a number");
        assert!(s.barrier(4, b"x", 2, Count::default()).is_err());
    }

    #[test]
    fn retain_keys_keeps_what_matches() {
        let mut s = KvState::<Count>::new();
        s.set(b"relaunch/a", b"");
        s.set(b"/worker/x", b"");
        s.queue_push(b"/q", b"1");
        assert_eq!(s.retain_keys(|k| k.starts_with(b"relaunch/")), 2);
        assert_eq!(s.keys().collect::<Vec<_>>(), [b"relaunch/a".as_slice()]);
        assert_eq!(s.queue_len(b"/q"), 0);
    }

    #[test]
    fn add_refuses_non_integers_and_wraps_on_overflow() {
        let mut s = KvState::<Count>::new();
        s.set(b"k", b"v");
        assert_eq!(
            s.add(b"k", 1),
            Err(NotAnInteger {
                value: b"v".to_vec()
            })
        );
        s.set(b"n", i64::MAX.to_string().as_bytes());
        assert_eq!(s.add(b"n", 1), Ok(i64::MIN));
    }
}

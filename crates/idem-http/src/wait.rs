//! Waiting for the original: a request whose key is held by another
//! attempt may wait, bounded, for that attempt's outcome instead of being
//! told 409 at once (docs/http.md, "Waiting for the original").
//!
//! A waiter does not read the other attempt's result from anywhere but the
//! store: it asks the claim again, the same atomic decision a client's
//! retry gets, so every answer it can give is one a retry could have got
//! (a replay of the completed record, an acquisition after a release, a
//! mismatch, an unknown outcome). Waiting only chooses *when* to ask:
//! at once after registering (an attempt that ended while the waiter was
//! being registered is not missed), when this process settles an attempt
//! on the key or the store reports a change to it ([`Waiters::wake`]), and
//! otherwise at most every [`WAIT_POLL_MS`] per key, by one waiter for all
//! (a change made by another gateway the store did not report).
//!
//! Waiters have a budget of their own: at most [`WaitLimits::per_key`]
//! waiters on one key, [`WaitLimits::per_principal`] of one principal and
//! [`WaitLimits::total`] in all; a request beyond any is answered at once
//! as if it had not asked to wait. A waiter holds no in-flight slot while
//! it waits ([`crate::InFlightSlot`]), so these bound what waiting costs,
//! and one key's storm leaves the capacity that serves work to others.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderMap;
use idem_core::{RecordId, Scope};
use tokio::sync::Notify;

use crate::Metrics;

/// How often, at most, one waiter per key asks the store again when
/// nothing woke it, in milliseconds: the fallback for a change the store
/// could not report (another gateway's completion).
pub use idem_core::lease::WAIT_POLL_MS;

/// The most a route may let a request wait, in milliseconds (`wait_ms_max`).
pub const WAIT_MS_LIMIT: u64 = 300_000;

/// Default of [`WaitLimits::per_key`].
pub const WAITERS_PER_KEY_MAX_DEFAULT: usize = 256;

/// Default of [`WaitLimits::per_principal`]: a quarter of
/// [`WAITERS_MAX_DEFAULT`], so that one caller's storms over many keys
/// leave room for at least three others to wait.
pub const WAITERS_PER_PRINCIPAL_MAX_DEFAULT: usize = 1_024;

/// Default of [`WaitLimits::total`].
pub const WAITERS_MAX_DEFAULT: usize = 4_096;

/// How many requests may wait at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitLimits {
    /// Waiters on one key (`waiters_per_key_max`).
    pub per_key: usize,
    /// Waiters of one principal, over all its keys and operations
    /// (`waiters_per_principal_max`).
    pub per_principal: usize,
    /// Waiters in all (`waiters_max`).
    pub total: usize,
}

impl Default for WaitLimits {
    fn default() -> WaitLimits {
        WaitLimits {
            per_key: WAITERS_PER_KEY_MAX_DEFAULT,
            per_principal: WAITERS_PER_PRINCIPAL_MAX_DEFAULT,
            total: WAITERS_MAX_DEFAULT,
        }
    }
}

/// The waiters of one process, by key.
#[derive(Debug)]
pub(crate) struct Waiters {
    limits: WaitLimits,
    state: Mutex<Registry>,
    /// `Registry::total`, readable without the lock: every settled attempt
    /// calls [`Waiters::wake`], and almost always nobody waits.
    waiting: AtomicUsize,
}

#[derive(Debug, Default)]
struct Registry {
    keys: HashMap<RecordId, Arc<KeyWaiters>>,
    /// Waiters by the principal part of their key's scope.
    principals: HashMap<Arc<str>, usize>,
    total: usize,
}

/// The waiters on one key.
#[derive(Debug)]
pub(crate) struct KeyWaiters {
    notify: Notify,
    /// Under the registry's lock.
    count: Mutex<usize>,
    /// When a waiter last asked the store on a poll tick.
    polled: Mutex<Instant>,
}

/// One registered waiter; dropping it (answered, timed out, or its client
/// gone) unregisters it.
pub(crate) struct Waiting {
    waiters: Arc<Waiters>,
    /// Where the `idem_waiters` gauge is kept.
    metrics: Arc<Metrics>,
    id: RecordId,
    key: Arc<KeyWaiters>,
    principal: Arc<str>,
}

/// Why a waiter should ask the store again, or stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Something changed, or it is this waiter's turn to poll.
    Ask,
    /// The wait is over.
    Done,
}

impl Waiters {
    pub(crate) fn new(limits: WaitLimits) -> Waiters {
        Waiters {
            limits,
            state: Mutex::new(Registry::default()),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Registers a waiter on `id`, counted in `metrics`' waiter gauge
    /// while it waits, or `None` when any limit is reached.
    pub(crate) fn register(
        self: &Arc<Self>,
        id: &RecordId,
        metrics: &Arc<Metrics>,
    ) -> Option<Waiting> {
        // Zero allows no waiter; checked first, so no empty entry is left.
        if self.limits.per_key == 0 || self.limits.per_principal == 0 {
            return None;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.total >= self.limits.total {
            return None;
        }
        // Before the key's entry is made, so that a refusal leaves none.
        let principal = principal_of(&id.scope);
        if state.principals.get(principal).copied().unwrap_or(0) >= self.limits.per_principal {
            return None;
        }
        let key = state
            .keys
            .entry(id.clone())
            .or_insert_with(|| {
                Arc::new(KeyWaiters {
                    notify: Notify::new(),
                    count: Mutex::new(0),
                    polled: Mutex::new(Instant::now()),
                })
            })
            .clone();
        let mut count = key.count.lock().unwrap_or_else(|e| e.into_inner());
        if *count >= self.limits.per_key {
            return None;
        }
        *count += 1;
        drop(count);
        let principal: Arc<str> = Arc::from(principal);
        *state.principals.entry(principal.clone()).or_insert(0) += 1;
        state.total += 1;
        self.waiting.store(state.total, Ordering::Release);
        metrics.gauges().waiter_in();
        Some(Waiting {
            waiters: self.clone(),
            metrics: metrics.clone(),
            id: id.clone(),
            key,
            principal,
        })
    }

    /// Wakes every waiter on `id` to ask the store again.
    pub(crate) fn wake(&self, id: &RecordId) {
        // A waiter registers (under the lock) before it asks the claim, so
        // one that registers after this read asks after the settle anyway.
        if self.waiting.load(Ordering::Acquire) == 0 {
            return;
        }
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(key) = state.keys.get(id) {
            key.notify.notify_waiters();
        }
    }

    /// The limits this registry keeps.
    pub(crate) fn limits(&self) -> WaitLimits {
        self.limits
    }

    /// How many requests wait now.
    pub(crate) fn waiting(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

impl Waiting {
    /// Waits until this waiter should ask the store again, or `deadline`.
    /// Call [`Waiting::armed`] first and ask the store between the two, so
    /// that a wake during the ask is not lost.
    pub(crate) async fn next(
        &self,
        armed: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
        deadline: Instant,
    ) -> Wake {
        let poll = Duration::from_millis(WAIT_POLL_MS);
        let mut armed = armed;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Wake::Done;
            }
            let tick = (now + poll).min(deadline);
            if tokio::time::timeout_at(tick.into(), armed.as_mut())
                .await
                .is_ok()
            {
                return Wake::Ask;
            }
            if Instant::now() >= deadline {
                return Wake::Done;
            }
            // One waiter per key polls each tick; the others wait for its
            // wake, which it sends when the store's answer changed.
            let mut polled = self.key.polled.lock().unwrap_or_else(|e| e.into_inner());
            if polled.elapsed() >= poll {
                *polled = Instant::now();
                return Wake::Ask;
            }
        }
    }

    /// A notification armed before the store is asked.
    pub(crate) fn armed(&self) -> tokio::sync::futures::Notified<'_> {
        self.key.notify.notified()
    }

    /// Tells the other waiters on the key that the store's answer changed.
    pub(crate) fn changed(&self) {
        self.key.notify.notify_waiters();
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.metrics.gauges().waiter_out();
        let mut state = self.waiters.state.lock().unwrap_or_else(|e| e.into_inner());
        state.total = state.total.saturating_sub(1);
        self.waiters.waiting.store(state.total, Ordering::Release);
        if let Some(n) = state.principals.get_mut(&self.principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.principals.remove(&self.principal);
            }
        }
        let mut count = self.key.count.lock().unwrap_or_else(|e| e.into_inner());
        *count = count.saturating_sub(1);
        if *count == 0 {
            drop(count);
            state.keys.remove(&self.id);
        }
    }
}

/// The principal part of a scope (`operation|principal[|region]`, as
/// `Scope::from_parts` joins it; no part holds a `|`): one caller's
/// waiters over all its operations. A scope in no such form counts alone.
fn principal_of(scope: &Scope) -> &str {
    let raw = scope.as_str();
    raw.split('|').nth(1).unwrap_or(raw)
}

/// The wait a request asks for with `Prefer: wait=N` (RFC 7240: seconds,
/// the first `wait` preference counts), in milliseconds; `None` when it
/// asks for none or spells it so that it cannot be read (a negative,
/// fractional or non-numeric value is ignored, as RFC 7240 asks of a
/// preference not understood). A huge value saturates; the route caps it.
pub fn preferred_wait_ms(headers: &HeaderMap) -> Option<u64> {
    let preferences = headers
        .get_all(http::header::HeaderName::from_static("prefer"))
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for preference in preferences {
        let token = preference.split(';').next().unwrap_or("").trim();
        let (name, value) = match token.split_once('=') {
            Some((name, value)) => (name.trim(), Some(value.trim())),
            None => (token, None),
        };
        if !name.eq_ignore_ascii_case("wait") {
            continue;
        }
        let value = value?;
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(seconds.saturating_mul(1000));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefer(values: &[&str]) -> Option<u64> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append("prefer", v.parse().unwrap());
        }
        preferred_wait_ms(&headers)
    }

    #[test]
    fn reads_the_first_wait_preference() {
        assert_eq!(prefer(&["wait=10"]), Some(10_000));
        assert_eq!(prefer(&["respond-async, WAIT=3"]), Some(3_000));
        assert_eq!(
            prefer(&["return=minimal; foo=bar, wait = 2 ; x"]),
            Some(2_000)
        );
        assert_eq!(prefer(&["wait=\"4\""]), Some(4_000));
        assert_eq!(prefer(&["wait=1", "wait=9"]), Some(1_000));
        assert_eq!(prefer(&["wait=0"]), Some(0));
    }

    #[test]
    fn ignores_a_wait_it_cannot_read() {
        for bad in [
            "wait=-1", "wait=1.5", "wait=ten", "wait=", "wait", "wait=1e3", "wait=+1",
        ] {
            assert_eq!(prefer(&[bad]), None, "{bad}");
        }
        assert_eq!(prefer(&[]), None);
        assert_eq!(prefer(&["return=minimal"]), None);
        assert_eq!(prefer(&["waiting=5"]), None);
    }

    #[test]
    fn a_huge_wait_saturates() {
        assert_eq!(prefer(&["wait=99999999999999999999999"]), Some(u64::MAX));
        assert_eq!(prefer(&["wait=18446744073709551615"]), Some(u64::MAX));
    }

    #[test]
    fn registration_is_bounded_per_key_and_in_all() {
        let waiters = Arc::new(Waiters::new(WaitLimits {
            per_key: 2,
            per_principal: 3,
            total: 3,
        }));
        let m = Arc::new(Metrics::new());
        let id = |k: &str| RecordId {
            scope: Scope::from_parts("payouts", "tenant", None).unwrap(),
            key: idem_core::IdempotencyKey::parse(k).unwrap(),
        };
        let a1 = waiters.register(&id("a"), &m).unwrap();
        let a2 = waiters.register(&id("a"), &m).unwrap();
        assert!(waiters.register(&id("a"), &m).is_none(), "per key");
        let b1 = waiters.register(&id("b"), &m).unwrap();
        assert!(waiters.register(&id("c"), &m).is_none(), "in all");
        assert_eq!(waiters.waiting(), 3);
        assert_eq!(m.gauges().waiting(), 3, "refusals are not counted");
        drop(a1);
        drop(a2);
        drop(b1);
        assert_eq!(waiters.waiting(), 0);
        assert_eq!(m.gauges().waiting(), 0);
        assert!(
            waiters.state.lock().unwrap().keys.is_empty(),
            "entries freed"
        );
        assert!(waiters.register(&id("a"), &m).is_some());
        let none = Arc::new(Waiters::new(WaitLimits {
            per_key: 0,
            per_principal: 3,
            total: 3,
        }));
        assert!(none.register(&id("a"), &m).is_none(), "no waiter allowed");
        assert!(
            none.state.lock().unwrap().keys.is_empty(),
            "and no entry left"
        );
    }

    #[test]
    fn registration_is_bounded_per_principal_and_leaves_other_principals_room() {
        let waiters = Arc::new(Waiters::new(WaitLimits {
            per_key: 2,
            per_principal: 3,
            total: 5,
        }));
        let m = Arc::new(Metrics::new());
        let id = |principal: &str, operation: &str, k: &str| RecordId {
            scope: Scope::from_parts(operation, principal, None).unwrap(),
            key: idem_core::IdempotencyKey::parse(k).unwrap(),
        };
        let a1 = waiters.register(&id("acme", "payouts", "a"), &m).unwrap();
        let _a2 = waiters.register(&id("acme", "payouts", "a"), &m).unwrap();
        let _b = waiters.register(&id("acme", "refunds", "b"), &m).unwrap();
        assert!(
            waiters.register(&id("acme", "payouts", "c"), &m).is_none(),
            "per principal, over its operations"
        );
        let _other = waiters.register(&id("globex", "payouts", "a"), &m).unwrap();
        assert_eq!(waiters.state.lock().unwrap().keys.len(), 3, "no entry left");
        drop(a1);
        assert!(waiters.register(&id("acme", "payouts", "c"), &m).is_some());
    }
}

//! Time as the contract sees it: milliseconds since the Unix epoch, read
//! through a [`Clock`] so that stores, tests and the simulator decide expiry
//! against a clock they control rather than against physical TTL deletion.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A point in time: milliseconds since the Unix epoch.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The latest representable time: `i64::MAX` milliseconds, so that every
    /// timestamp fits the signed 64-bit integers SQL databases store.
    pub const MAX: Timestamp = Timestamp(i64::MAX as u64);

    /// A timestamp from milliseconds since the Unix epoch (capped at [`Timestamp::MAX`]).
    pub const fn from_millis(ms: u64) -> Timestamp {
        if ms > Timestamp::MAX.0 {
            Timestamp::MAX
        } else {
            Timestamp(ms)
        }
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// This instant plus `ms` milliseconds, saturating at [`Timestamp::MAX`].
    pub const fn plus_millis(self, ms: u64) -> Timestamp {
        Timestamp::from_millis(self.0.saturating_add(ms))
    }

    /// Milliseconds from `self` until `later`, or 0 if `later` is not later.
    pub const fn millis_until(self, later: Timestamp) -> u64 {
        later.0.saturating_sub(self.0)
    }
}

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp::from_millis(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that only moves when told to; clones share the same time.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A manual clock standing at `start`.
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock(Arc::new(AtomicU64::new(start.0)))
    }

    /// Moves the clock forward by `ms` milliseconds (capped at [`Timestamp::MAX`]).
    pub fn advance_millis(&self, ms: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(Timestamp::from_millis(now.saturating_add(ms)).0)
            });
    }

    /// Sets the clock to `to` (it may move backwards: clocks do).
    pub fn set(&self, to: Timestamp) {
        self.0.store(to.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.0.load(Ordering::SeqCst))
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

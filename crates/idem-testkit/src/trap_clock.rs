//! A clock that panics once armed: read by the SQLite store's writer
//! thread, it kills that thread, and the store answers every request with
//! an error from then on, as a store whose worker died does. The tests of
//! every adapter use it for "the store stopped answering".

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use idem_core::{Clock, ManualClock, Timestamp};

/// A [`ManualClock`] until [`TrapClock::arm`]; then reading it panics.
#[derive(Clone)]
pub struct TrapClock {
    armed: Arc<AtomicBool>,
    /// The time it tells until armed.
    pub time: ManualClock,
}

impl TrapClock {
    /// A trap standing at `start`, not armed.
    pub fn new(start: Timestamp) -> TrapClock {
        TrapClock {
            armed: Arc::default(),
            time: ManualClock::new(start),
        }
    }

    /// From now on, reading the clock panics.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }
}

impl Clock for TrapClock {
    fn now(&self) -> Timestamp {
        assert!(!self.armed.load(Ordering::SeqCst), "the clock trap fired");
        self.time.now()
    }
}

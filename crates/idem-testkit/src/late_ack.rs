//! A store whose claim answers arrive late: the inner store decides and
//! commits at once, then the answer is held for a set delay before the
//! claimant sees it, as behind a network that stalls the way back or a
//! disk that stalls after the commit. The time between a store's commit and
//! the claimant's receipt is what a forward's deadline must account for.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::{Claim, ClaimRequest, Store, StoreFuture, StoreWrapper};

/// Wraps a store; every claim's answer is delayed by [`LateAck::set_delay`]
/// after the inner store answered. Every other operation passes through.
pub struct LateAck {
    inner: Arc<dyn Store>,
    delay: Mutex<Duration>,
    sent: Mutex<Vec<Instant>>,
}

impl LateAck {
    /// `inner`, with claims answered without delay until told otherwise.
    pub fn new(inner: Arc<dyn Store>) -> LateAck {
        LateAck {
            inner,
            delay: Mutex::new(Duration::ZERO),
            sent: Mutex::new(Vec::new()),
        }
    }

    /// Holds every later claim's answer for `delay` after the commit.
    pub fn set_delay(&self, delay: Duration) {
        *self.delay.lock().unwrap_or_else(|p| p.into_inner()) = delay;
    }

    /// The instants at which claims were passed to the inner store, oldest
    /// first: each lease began after its instant.
    pub fn claims_sent(&self) -> Vec<Instant> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl StoreWrapper for LateAck {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, Claim> {
        Box::pin(async move {
            let delay = *self.delay.lock().unwrap_or_else(|p| p.into_inner());
            self.sent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Instant::now());
            let answer = self.inner.claim(req).await;
            tokio::time::sleep(delay).await;
            answer
        })
    }
}

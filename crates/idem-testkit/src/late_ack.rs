//! A store whose claim answers arrive late: the inner store decides and
//! commits at once, then the answer is held for a set delay before the
//! claimant sees it, as behind a network that stalls the way back or a
//! disk that stalls after the commit. The time between a store's commit and
//! the claimant's receipt is what a forward's deadline must account for.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::{
    Claim, ClaimRequest, JournalEntry, ListQuery, Listing, LookupTries, PurgeReport, Record,
    RecordId, Resolution, Store, StoreFuture, StoredResult, Timestamp, Token,
};

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

impl Store for LateAck {
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
    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        result: StoredResult,
    ) -> StoreFuture<'a, Record> {
        self.inner.complete(id, token, result)
    }
    fn release<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, ()> {
        self.inner.release(id, token)
    }
    fn mark_ambiguous<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, Record> {
        self.inner.mark_ambiguous(id, token)
    }
    fn resolve<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        resolution: Resolution,
    ) -> StoreFuture<'a, Option<Record>> {
        self.inner.resolve(id, token, resolution)
    }
    fn note_failed_lookup<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        next_at: Timestamp,
    ) -> StoreFuture<'a, LookupTries> {
        self.inner.note_failed_lookup(id, token, next_at)
    }
    fn lookup_tries<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
    ) -> StoreFuture<'a, Option<LookupTries>> {
        self.inner.lookup_tries(id, token)
    }
    fn resolutions<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Vec<JournalEntry>> {
        self.inner.resolutions(id)
    }
    fn get<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Option<Record>> {
        self.inner.get(id)
    }
    fn list<'a>(&'a self, query: &'a ListQuery) -> StoreFuture<'a, Listing> {
        self.inner.list(query)
    }
    fn purge(&self, limit: usize) -> StoreFuture<'_, PurgeReport> {
        self.inner.purge(limit)
    }
}

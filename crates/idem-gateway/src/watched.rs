//! The store as the gateway's parts use it: every answer passes through
//! unchanged, and the first `StoreError::Stopped` is reported, so that the
//! gateway stops (and exits, for a supervisor to restart it) instead of
//! answering 503 for as long as it runs.

use std::sync::Arc;

use idem_core::{
    Claim, ClaimRequest, JournalEntry, ListQuery, Listing, LookupTries, PurgeReport, Record,
    RecordId, Resolution, Store, StoreError, StoreFuture, StoredResult, Timestamp, Token,
};
use tokio::sync::watch;

/// A store whose `Stopped` errors are reported on a channel.
pub(crate) struct Watched {
    inner: Arc<dyn Store>,
    stopped: watch::Sender<Option<StoreError>>,
}

impl Watched {
    /// `inner`, watched; the receiver sees the first `Stopped` error.
    pub(crate) fn new(inner: Arc<dyn Store>) -> (Watched, watch::Receiver<Option<StoreError>>) {
        let (stopped, seen) = watch::channel(None);
        (Watched { inner, stopped }, seen)
    }

    fn watch<'a, T: 'a>(&'a self, op: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let out = op.await;
            if let Err(e @ StoreError::Stopped { .. }) = &out {
                self.stopped.send_if_modified(|first| {
                    let news = first.is_none();
                    if news {
                        *first = Some(e.clone());
                    }
                    news
                });
            }
            out
        })
    }
}

/// Resolves with the first `Stopped` error seen through a [`Watched`]
/// store; never while the store works.
pub(crate) async fn stopped(mut seen: watch::Receiver<Option<StoreError>>) -> StoreError {
    if let Ok(first) = seen.wait_for(Option::is_some).await
        && let Some(e) = first.clone()
    {
        return e;
    }
    // The store is gone, and with it every part that could use it.
    std::future::pending().await
}

impl Store for Watched {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, Claim> {
        self.watch(self.inner.claim(req))
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        result: StoredResult,
    ) -> StoreFuture<'a, Record> {
        self.watch(self.inner.complete(id, token, result))
    }

    fn release<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, ()> {
        self.watch(self.inner.release(id, token))
    }

    fn mark_ambiguous<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, Record> {
        self.watch(self.inner.mark_ambiguous(id, token))
    }

    fn resolve<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        resolution: Resolution,
    ) -> StoreFuture<'a, Option<Record>> {
        self.watch(self.inner.resolve(id, token, resolution))
    }

    fn note_failed_lookup<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        next_at: Timestamp,
    ) -> StoreFuture<'a, LookupTries> {
        self.watch(self.inner.note_failed_lookup(id, token, next_at))
    }

    fn lookup_tries<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
    ) -> StoreFuture<'a, Option<LookupTries>> {
        self.watch(self.inner.lookup_tries(id, token))
    }

    fn resolutions<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Vec<JournalEntry>> {
        self.watch(self.inner.resolutions(id))
    }

    fn get<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Option<Record>> {
        self.watch(self.inner.get(id))
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> StoreFuture<'a, Listing> {
        self.watch(self.inner.list(query))
    }

    fn purge(&self, limit: usize) -> StoreFuture<'_, PurgeReport> {
        self.watch(self.inner.purge(limit))
    }

    fn note_waiting<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, ()> {
        self.watch(self.inner.note_waiting(id))
    }

    fn on_completed(&self, wake: idem_core::WakeFn) {
        self.inner.on_completed(wake);
    }

    fn suspect_window(&self) -> StoreFuture<'_, Option<idem_core::SuspectWindow>> {
        self.watch(self.inner.suspect_window())
    }

    fn open_suspect_window<'a>(
        &'a self,
        opening: &'a idem_core::WindowOpening,
    ) -> StoreFuture<'a, idem_core::SuspectWindow> {
        self.watch(self.inner.open_suspect_window(opening))
    }

    fn on_window_opened(&self, opened: idem_core::WindowFn) {
        self.inner.on_window_opened(opened);
    }
}

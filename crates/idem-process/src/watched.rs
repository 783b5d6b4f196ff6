//! The store as the gateway's parts use it: every answer passes through
//! unchanged, and the first `StoreError::Stopped` is reported, so that the
//! gateway stops (and exits, for a supervisor to restart it) instead of
//! answering 503 for as long as it runs.

use std::sync::Arc;

use idem_core::{Store, StoreError, StoreFuture, StoreWrapper};
use tokio::sync::watch;

/// A store whose `Stopped` errors are reported on a channel.
pub struct Watched {
    inner: Arc<dyn Store>,
    stopped: watch::Sender<Option<StoreError>>,
}

impl Watched {
    /// `inner`, watched; the receiver sees the first `Stopped` error.
    pub fn new(inner: Arc<dyn Store>) -> (Watched, watch::Receiver<Option<StoreError>>) {
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
pub async fn stopped(mut seen: watch::Receiver<Option<StoreError>>) -> StoreError {
    if let Ok(first) = seen.wait_for(Option::is_some).await
        && let Some(e) = first.clone()
    {
        return e;
    }
    // The store is gone, and with it every part that could use it.
    std::future::pending().await
}

impl StoreWrapper for Watched {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn around<'a, T: 'a>(&'a self, op: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
        self.watch(op)
    }
}

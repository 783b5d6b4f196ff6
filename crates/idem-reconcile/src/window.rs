//! Keeping a process's view of the store's suspect window current
//! (`idem_core::window`), for the gateway and the queue consumer alike: read
//! at start, every second after, and at once when the store opens one
//! itself (a PostgreSQL store on a promoted server).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Clock, Store, SuspectWindow, SystemClock, WindowWatch};

/// How often the store's window is read, so that one opened by another
/// process (`idem store mark-restored`) is seen.
pub const WINDOW_REFRESH: Duration = Duration::from_secs(1);

/// A watch of `store`'s window: read now, told by the store of a window it
/// opens itself; [`keep_current`] refreshes it after that.
pub async fn watch(store: &dyn Store) -> Arc<WindowWatch> {
    let window = Arc::new(WindowWatch::new());
    refresh(store, &window).await;
    let opened = window.clone();
    store.on_window_opened(Arc::new(move |w: &SuspectWindow| {
        warn_opened(w);
        opened.set(Some(w.clone()));
    }));
    window
}

/// Reads `store`'s window into `window` every [`WINDOW_REFRESH`] until
/// `stop` resolves.
pub async fn keep_current(store: Arc<dyn Store>, window: Arc<WindowWatch>, stop: impl Future) {
    let refreshing = async {
        loop {
            tokio::time::sleep(WINDOW_REFRESH).await;
            refresh(&*store, &window).await;
        }
    };
    tokio::select! {
        _ = stop => {}
        () = refreshing => {}
    }
}

async fn refresh(store: &dyn Store, window: &WindowWatch) {
    match store.suspect_window().await {
        Ok(read) => {
            if let Some(opened) = window.observe(read, SystemClock.now()) {
                warn_opened(&opened);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the store's suspect window"),
    }
}

fn warn_opened(w: &SuspectWindow) {
    tracing::warn!(cause = %w.cause, until_ms = w.until.as_millis(),
        since_ms = w.since.map(|t| t.as_millis()),
        "suspect window open: the store may have lost records; fresh claims with a lookup are \
         verified with the provider before they run");
}

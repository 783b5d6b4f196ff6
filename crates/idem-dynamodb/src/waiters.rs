//! Waking waiters of other processes. DynamoDB has no notification, so a
//! process with requests waiting on attempts held elsewhere reads each
//! waited-on record once per [`POLL_MS`], whatever the number of requests
//! waiting on it, and wakes them when it is no longer in progress.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use idem_core::{RecordId, State, Timestamp, WakeFn};

use crate::item;
use crate::table::Table;

/// How often a waited-on record is read, in milliseconds.
pub const POLL_MS: u64 = 250;
/// How long a record stays watched after the last request noted waiting
/// on it: a waiter gives up long before (its route's wait bound).
const WATCH_FOR: Duration = Duration::from_secs(600);

pub(crate) struct Waiters {
    inner: Arc<Inner>,
}

struct Inner {
    table: Table,
    watched: Mutex<HashMap<RecordId, Instant>>,
    wakes: Mutex<Vec<WakeFn>>,
    polling: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each use is one collection operation: a panic cannot leave it half done.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Waiters {
    pub(crate) fn new(table: Table) -> Waiters {
        Waiters {
            inner: Arc::new(Inner {
                table,
                watched: Mutex::new(HashMap::new()),
                wakes: Mutex::new(Vec::new()),
                polling: AtomicBool::new(false),
            }),
        }
    }

    /// Watches `id` until it is no longer in progress.
    pub(crate) fn note(&self, id: &RecordId, _now: Timestamp) {
        lock(&self.inner.watched).insert(id.clone(), Instant::now());
        self.start();
    }

    /// Calls `wake` with each watched record that stops being in progress.
    pub(crate) fn listen(&self, wake: WakeFn) {
        lock(&self.inner.wakes).push(wake);
        self.start();
    }

    /// Starts the poll on the current tokio runtime, once, when someone
    /// listens; it ends with the store.
    fn start(&self) {
        if lock(&self.inner.wakes).is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.inner.polling.swap(true, Ordering::AcqRel) {
            return;
        }
        runtime.spawn(poll(Arc::downgrade(&self.inner)));
    }
}

async fn poll(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let watched: Vec<RecordId> = {
            let mut watched = lock(&inner.watched);
            watched.retain(|_, since| since.elapsed() < WATCH_FOR);
            watched.keys().cloned().collect()
        };
        for id in watched {
            let in_progress = match inner.table.get(&item::pk_of(&id)).await {
                Ok(Some(attrs)) => {
                    item::get_s(&attrs, "st").ok() == Some(State::InProgress.as_str())
                }
                Ok(None) => false,
                // A read that failed says nothing: read again next time.
                Err(_) => continue,
            };
            if in_progress {
                continue;
            }
            lock(&inner.watched).remove(&id);
            let wakes = lock(&inner.wakes).clone();
            for wake in wakes {
                wake(&id);
            }
        }
    }
}

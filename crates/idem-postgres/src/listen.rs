//! Completions of waited-on keys, heard from other processes: one
//! connection of its own `LISTEN`s on the schema's channel, which the
//! completion statement notifies for every key a request noted waiting on
//! (`Store::note_waiting`), and calls the registered wake with each
//! record. A connection that ends is opened again after a second; waiters
//! poll meanwhile, so a lost notification only delays them.
//!
//! An engine without `LISTEN` (CockroachDB, YugabyteDB: the statement is
//! refused as not supported) ends the listener for good, said once in the
//! log and in [`Notices::watching`]. Nothing else is needed for waiters to
//! go on: every waiter already asks the claim again at least every
//! [`idem_core::WAIT_POLL_MS`] (one per key, `idem-http`'s `wait.rs`), so
//! a completion elsewhere reaches it within that instead of at once. And
//! no wait is noted while nothing listens ([`Notices::heard`]), so no
//! completion asks such an engine to notify.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idem_core::{IdempotencyKey, RecordId, Scope, WAIT_POLL_MS, WakeFn, Watching};
use tokio_postgres::{AsyncMessage, NoTls};

use crate::error;

/// The pause before a listener connection that ended is opened again.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// Whether this store hears completions made elsewhere.
#[derive(Clone, Default)]
pub(crate) struct Notices(Arc<NoticesState>);

#[derive(Default)]
struct NoticesState {
    /// A listener was started (`Store::on_completed`).
    started: AtomicBool,
    /// `LISTEN` was acknowledged once; reconnects keep it so.
    listening: AtomicBool,
    /// Why the server refused `LISTEN`; set once, and the listener ends.
    refused: OnceLock<String>,
    /// The switch the tests force the fallback with: the listener's
    /// statement is refused as an engine without `LISTEN` refuses it.
    #[cfg(test)]
    refuse: AtomicBool,
}

impl Notices {
    /// Whether completions are heard; `None` when nothing asked to hear
    /// them.
    pub(crate) fn watching(&self) -> Option<Watching> {
        if !self.0.started.load(Ordering::SeqCst) {
            return None;
        }
        Some(match self.0.refused.get() {
            Some(reason) => Watching::Off {
                reason: reason.clone(),
            },
            None => Watching::Active,
        })
    }

    /// Whether a wait is worth noting: a mark only serves a process that
    /// hears the notification it causes.
    pub(crate) fn heard(&self) -> bool {
        self.0.listening.load(Ordering::SeqCst) && self.0.refused.get().is_none()
    }

    #[cfg(test)]
    pub(crate) fn refuse_listen(&self) {
        self.0.refuse.store(true, Ordering::SeqCst);
    }

    fn refuse(&self, store: &str, e: &tokio_postgres::Error) {
        let reason = format!(
            "the server refused LISTEN: {}; completions in other processes are not heard, so \
             a request waiting on a key another process holds learns of its completion at its \
             next poll (every {WAIT_POLL_MS} ms) instead of at once",
            error::chain(e)
        );
        if self.0.refused.set(reason.clone()).is_ok() {
            tracing::warn!(store, %reason, "completion notices are off");
        }
    }

    /// The statement the listener runs.
    fn statement(&self, channel: &str) -> String {
        #[cfg(test)]
        if self.0.refuse.load(Ordering::SeqCst) {
            return "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'feature_not_supported', \
                    MESSAGE = 'LISTEN is not supported (refused by a test build)'; END $$"
                .to_owned();
        }
        format!("LISTEN {channel}")
    }
}

/// Listens on `channel` through a connection made from `pg` for as long
/// as the runtime lives, calling `wake` for each completed record, unless
/// the server refuses `LISTEN` ([`error::not_offered`]).
pub(crate) fn spawn(
    pg: tokio_postgres::Config,
    (channel, store): (String, String),
    wake: WakeFn,
    notices: Notices,
) {
    notices.0.started.store(true, Ordering::SeqCst);
    tokio::spawn(async move {
        loop {
            // Any other error only means this connection ended; the next
            // try says nothing new until the server answers again.
            if let Err(e) = listen_once(&pg, &channel, &wake, &notices).await
                && error::not_offered(&e)
            {
                notices.refuse(&store, &e);
                return;
            }
            tokio::time::sleep(RECONNECT_AFTER).await;
        }
    });
}

async fn listen_once(
    pg: &tokio_postgres::Config,
    channel: &str,
    wake: &WakeFn,
    notices: &Notices,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = pg.connect(NoTls).await?;
    let heard = wake.clone();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if let Some(id) = record_of(n.payload()) {
                        heard(&id);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
    });
    client.batch_execute(&notices.statement(channel)).await?;
    notices.0.listening.store(true, Ordering::SeqCst);
    // The client must live as long as the connection listens.
    let _ = driver.await;
    drop(client);
    Ok(())
}

/// The record a notification names: `scope`, a newline, `key`.
fn record_of(payload: &str) -> Option<RecordId> {
    let (scope, key) = payload.split_once('\n')?;
    Some(RecordId {
        scope: Scope::new(scope).ok()?,
        key: IdempotencyKey::new(key).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Instant;

    use idem_core::{Claim, Store, StoredResult};

    use super::*;
    use crate::PgStore;
    use crate::test_support::{SchemaGuard, admin, request};

    /// How long a listener may take to connect, or to be refused.
    const SETTLED_WITHIN: Duration = Duration::from_secs(5);

    /// Two stores on one schema each hear completions, or not, as their
    /// server lets them: `deaf`'s refuses `LISTEN` as CockroachDB does, so
    /// its listener ends, says so, and its waits are not noted (no
    /// completion is asked to notify for them); `hearing`'s, the control,
    /// notes its wait and is woken by the completion.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_refusing_listen_leaves_waiters_to_their_poll() {
        let guard = SchemaGuard::new();
        let (deaf, hearing) = (guard.store(None).await, guard.store(None).await);
        assert_eq!(deaf.completion_notices(), None, "nothing asked to hear");
        deaf.notices.refuse_listen();
        let (deaf_woken, hearing_woken) = (woken(&deaf), woken(&hearing));
        settled(|| deaf.notices.0.refused.get().is_some()).await;
        settled(|| hearing.notices.heard()).await;
        let Some(Watching::Off { reason }) = deaf.completion_notices() else {
            panic!("off: {:?}", deaf.completion_notices());
        };
        assert!(reason.contains("not supported"), "{reason}");
        assert!(reason.contains(&format!("{WAIT_POLL_MS} ms")), "{reason}");
        assert_eq!(hearing.completion_notices(), Some(Watching::Active));

        for (store, key, noted) in [(&deaf, "deaf-1", false), (&hearing, "hearing-1", true)] {
            let req = request(key, 1, 30_000);
            let Claim::Acquired { token, .. } = store.claim(&req).await.unwrap() else {
                panic!("{key}: a new key is acquired");
            };
            store.note_waiting(&req.id).await.unwrap();
            assert_eq!(waited(&guard, key).await, noted, "{key}: noted");
            let result = StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
            store.complete(&req.id, token, result).await.unwrap();
        }
        settled(|| hearing_woken.lock().unwrap().len() == 1).await;
        assert_eq!(hearing_woken.lock().unwrap()[0].key.as_str(), "hearing-1");
        assert!(deaf_woken.lock().unwrap().is_empty());
    }

    /// Registers a wake on `store` that keeps what it was woken for.
    fn woken(store: &PgStore) -> Arc<Mutex<Vec<RecordId>>> {
        let woken = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&woken);
        store.on_completed(Arc::new(move |id| kept.lock().unwrap().push(id.clone())));
        woken
    }

    /// Waits until `done`, failing past [`SETTLED_WITHIN`].
    async fn settled(done: impl Fn() -> bool) {
        let started = Instant::now();
        while !done() {
            assert!(started.elapsed() < SETTLED_WITHIN, "not settled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Whether the record of `key` is marked waited on.
    async fn waited(guard: &SchemaGuard, key: &str) -> bool {
        let sql = format!(
            "SELECT waited IS TRUE FROM {}.records WHERE key = $1",
            guard.name()
        );
        admin().await.query_one(&sql, &[&key]).await.unwrap().get(0)
    }
}

//! A writer thread that panics stops the store for good, loudly: the
//! caller whose batch it was serving and every later caller get
//! `StoreError::Stopped` naming the panic (never a transient
//! `Unavailable`, which a gateway would answer with 503 forever), and
//! nothing of the interrupted batch is in the file when it is reopened.
//! The panic is real: it comes from the clock the writer reads, injected
//! as any clock is.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use idem_core::{
    Claim, Clock, State, Store, StoreError, StoredResult, SystemClock, Timestamp, Token,
};
use idem_sqlite::{SqliteOptions, SqliteStore};
use support::{id, request};

mod support;

/// The system's time until armed; then reading it panics.
#[derive(Default)]
struct TrapClock {
    armed: AtomicBool,
    time: SystemClock,
}

impl Clock for TrapClock {
    fn now(&self) -> Timestamp {
        assert!(!self.armed.load(Ordering::SeqCst), "the clock trap fired");
        self.time.now()
    }
}

/// The operation that meets the trap, run on a store holding `held`
/// (acquired with `token`).
type Trigger = fn(
    &SqliteStore,
    Token,
) -> std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>>;

fn triggers() -> [(&'static str, Trigger); 4] {
    [
        ("claim", |s, _| {
            Box::pin(async move { s.claim(&request("trapped")).await.map(drop) })
        }),
        ("complete", |s, token| {
            Box::pin(async move {
                let result = StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
                s.complete(&id("held"), token, result).await.map(drop)
            })
        }),
        ("mark_ambiguous", |s, token| {
            Box::pin(async move { s.mark_ambiguous(&id("held"), token).await.map(drop) })
        }),
        ("purge", |s, _| {
            Box::pin(async move { s.purge(10).await.map(drop) })
        }),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicked_writer_stops_the_store_for_good() {
    for (name, trigger) in triggers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idem.db");
        let clock = Arc::new(TrapClock::default());
        let store =
            SqliteStore::open_with_clock(&path, SqliteOptions::default(), clock.clone()).unwrap();
        let Claim::Acquired { token, .. } = store.claim(&request("held")).await.unwrap() else {
            panic!("{name}: a fresh key is acquired");
        };

        clock.armed.store(true, Ordering::SeqCst);
        let failed = trigger(&store, token).await;
        clock.armed.store(false, Ordering::SeqCst);
        let later = store.claim(&request("later")).await;
        for (when, out) in [
            ("the trapped call", failed),
            ("a later claim", later.map(drop)),
        ] {
            match out {
                Err(e @ StoreError::Stopped { .. }) => {
                    assert!(!e.is_transient(), "{name}, {when}: {e}");
                    assert!(
                        e.to_string().contains("the clock trap fired"),
                        "{name}, {when}: {e}"
                    );
                }
                other => panic!("{name}, {when}: want Stopped, got {other:?}"),
            }
        }
        drop(store);

        // The file is intact: what committed before is there, the
        // interrupted batch is not.
        let reopened = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
        let held = reopened.get(&id("held")).await.unwrap().unwrap();
        assert_eq!(
            (held.token, held.state),
            (token, State::InProgress),
            "{name}"
        );
        assert_eq!(reopened.get(&id("trapped")).await.unwrap(), None, "{name}");
        let again = reopened.claim(&request("trapped")).await.unwrap();
        assert!(matches!(again, Claim::Acquired { .. }), "{name}: {again:?}");
    }
}

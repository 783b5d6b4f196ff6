//! Replays answered from memory on the real server: only while the record
//! is surely completed by the clock the store decides by, never at or past
//! its expiry. To tell a cached answer from the server's, the record's row
//! is deleted behind the store's back: a claim answered `Replay` after that
//! came from memory; one answered `Acquired` came from the server.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::time::Duration;

use idem_core::{
    Claim, ClaimRequest, LeaseExpiry, ManualClock, Policy, Store, StoredResult, Timestamp,
};
use idem_postgres::{PgOptions, PgStore};
use support::{SchemaGuard, admin, request};

async fn completed(store: &PgStore, req: &ClaimRequest) -> Timestamp {
    let Claim::Acquired { token, .. } = store.claim(req).await.unwrap() else {
        panic!("a new key acquires");
    };
    let result = StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
    let record = store.complete(&req.id, token, result).await.unwrap();
    // The first replay reads the record from the server and keeps it.
    assert!(matches!(
        store.claim(req).await.unwrap(),
        Claim::Replay { .. }
    ));
    record.expires_at.unwrap()
}

async fn delete_row(guard: &SchemaGuard, req: &ClaimRequest) {
    admin()
        .await
        .execute(
            &format!(
                "DELETE FROM {}.records WHERE scope = $1 AND key = $2",
                guard.name()
            ),
            &[&req.id.scope.as_str(), &req.id.key.as_str()],
        )
        .await
        .unwrap();
}

/// With the injected clock: answered from memory up to a millisecond
/// before expiry, by the server at expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_record_answers_until_its_expiry_and_not_at_it() {
    let guard = SchemaGuard::new();
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let store = guard.store(Some(clock.clone())).await;
    let req = request("kept", 1, 60_000);
    let expires_at = completed(&store, &req).await;
    delete_row(&guard, &req).await;
    assert!(
        matches!(store.claim(&req).await.unwrap(), Claim::Replay { .. }),
        "answered from memory"
    );
    clock.set(Timestamp::from_millis(expires_at.as_millis() - 1));
    assert!(
        matches!(store.claim(&req).await.unwrap(), Claim::Replay { .. }),
        "a millisecond before expiry, still from memory"
    );
    clock.set(expires_at);
    assert!(
        matches!(store.claim(&req).await.unwrap(), Claim::Acquired { .. }),
        "at expiry the server decides (here: no row, so a new attempt)"
    );
}

/// With the database's clock: answered from memory right after the
/// server's read, by the server once its clock passed the expiry; and with
/// the cache off, never from memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_clock_bounds_what_memory_answers() {
    let guard = SchemaGuard::new();
    let store = guard.store(None).await;
    let mut req = request("db-clock", 1, 60_000);
    req.policy = Policy::new(1_000, 1, 3_600, LeaseExpiry::Reconcile).unwrap();
    completed(&store, &req).await;
    delete_row(&guard, &req).await;
    assert!(
        matches!(store.claim(&req).await.unwrap(), Claim::Replay { .. }),
        "answered from memory within the bound"
    );
    // Retention is one second by the server's clock. A claim of a key in
    // flight reads the server's clock afresh, so that what stops the
    // memory's answer is the expiry, not a stale reading.
    let busy = request("in-flight", 1, 60_000);
    assert!(matches!(
        store.claim(&busy).await.unwrap(),
        Claim::Acquired { .. }
    ));
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(matches!(
        store.claim(&busy).await.unwrap(),
        Claim::InFlight { .. }
    ));
    assert!(
        matches!(store.claim(&req).await.unwrap(), Claim::Acquired { .. }),
        "past the expiry the server decides"
    );

    let off = PgStore::connect(
        &support::url(),
        PgOptions {
            replay_cache_bytes: 0,
            ..guard.options(None)
        },
    )
    .await
    .unwrap();
    let req = request("uncached", 1, 60_000);
    completed(&off, &req).await;
    delete_row(&guard, &req).await;
    assert!(
        matches!(off.claim(&req).await.unwrap(), Claim::Acquired { .. }),
        "no cache: the server answers"
    );
}

/// A store answering every replay from memory runs no statement of its
/// own that reads the clock: it renews its reading before the bound
/// lapses, so that a steady stream of replays never falls to the server
/// once a second (each such fall sent every in-flight replay to the
/// server at once, behind whatever it was flushing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_replays_keeps_the_clock_reading_fresh() {
    let guard = SchemaGuard::new();
    let store = guard.store(None).await;
    let req = request("stream", 1, 60_000);
    completed(&store, &req).await;
    delete_row(&guard, &req).await;
    // Three times the longest a reading bounds the clock, a replay every
    // 50 ms: each answered from memory (the server has no row left).
    let start = std::time::Instant::now();
    let mut replays = 0;
    while start.elapsed() < Duration::from_millis(3_000) {
        let answer = store.claim(&req).await.unwrap();
        assert!(
            matches!(answer, Claim::Replay { .. }),
            "replay {replays} after {:?} answered {answer:?}, not from memory",
            start.elapsed()
        );
        replays += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(replays >= 30, "only {replays} replays in 3 s");
}

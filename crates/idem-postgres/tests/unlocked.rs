//! A claim that writes nothing never waits on the record's row lock: while
//! another transaction holds it (the store's own locked read-decide-write,
//! an operator's `SELECT … FOR UPDATE`), a replay, a 409 and a 422 are
//! answered from a read without a lock; a claim that must write still waits
//! for the lock and decides on the record as it is after it.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::time::Duration;

use idem_core::{Claim, Fingerprint, Store, StoredResult};
use support::{SchemaGuard, admin, request};

/// Far longer than any answer takes: a claim still waiting after this is
/// waiting for the lock the test holds until the claim returns.
const PATIENCE: Duration = Duration::from_secs(20);
/// The lease of the attempt whose expiry makes a retry write.
const LEASE_MS: u64 = 100;

/// Holds the row lock of `(scope, key)` in schema `schema` (`SELECT … FOR
/// UPDATE`, as the store's own locked read-decide-write and an operator's
/// script take it) on a connection of its own, in an open transaction,
/// until the returned client is dropped.
async fn hold_row_lock(schema: &str, scope: &str, key: &str) -> tokio_postgres::Client {
    let holder = admin().await;
    holder.batch_execute("BEGIN").await.unwrap();
    let sql =
        format!("SELECT token FROM {schema}.records WHERE scope = $1 AND key = $2 FOR UPDATE");
    let held = holder.query(&sql, &[&scope, &key]).await.unwrap();
    assert_eq!(held.len(), 1, "the record exists and is locked");
    holder
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_write_nothing_do_not_wait_on_the_row_lock() {
    let schema = SchemaGuard::new();
    let store = schema.store(None).await;

    // A completed record: its retry is a replay, a different body a 422.
    let done = request("unlocked-done", 1, 30_000);
    let Claim::Acquired { token, .. } = store.claim(&done).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    let result = StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
    store.complete(&done.id, token, result).await.unwrap();
    // An attempt in flight: its retry is a 409.
    let flight = request("unlocked-flight", 1, 30_000);
    assert!(matches!(
        store.claim(&flight).await.unwrap(),
        Claim::Acquired { .. }
    ));

    let scope = done.id.scope.as_str().to_owned();
    let held_done = hold_row_lock(schema.name(), &scope, done.id.key.as_str()).await;
    let held_flight = hold_row_lock(schema.name(), &scope, flight.id.key.as_str()).await;
    answers_while_locked(&store, &done, &flight).await;
    drop((held_done, held_flight));
}

/// The replay, 422 and 409 of `done` and `flight`, each within
/// [`PATIENCE`] while their rows are locked.
async fn answers_while_locked(
    store: &idem_postgres::PgStore,
    done: &idem_core::ClaimRequest,
    flight: &idem_core::ClaimRequest,
) {
    let replay = tokio::time::timeout(PATIENCE, store.claim(done)).await;
    match replay {
        Ok(Ok(Claim::Replay { record })) => {
            assert_eq!(record.result.unwrap().body(), b"paid");
        }
        other => panic!("a replay is answered while the row is locked, got {other:?}"),
    }
    let mut changed = done.clone();
    changed.fingerprint = Fingerprint::from_bytes([9; 32]);
    let mismatch = tokio::time::timeout(PATIENCE, store.claim(&changed)).await;
    assert!(
        matches!(mismatch, Ok(Ok(Claim::Mismatch { .. }))),
        "a 422 is answered while the row is locked, got {mismatch:?}"
    );
    let in_flight = tokio::time::timeout(PATIENCE, store.claim(flight)).await;
    assert!(
        matches!(in_flight, Ok(Ok(Claim::InFlight { .. }))),
        "a 409 is answered while the row is locked, got {in_flight:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_writes_waits_for_the_lock_and_decides_on_what_it_finds() {
    let schema = SchemaGuard::new();
    let store = std::sync::Arc::new(schema.store(None).await);
    // A short lease on a route that reconciles expired leases: once it is
    // over, a retry must write (it marks the record ambiguous), so it takes
    // the lock.
    let req = request("unlocked-expired", 1, LEASE_MS);
    let Claim::Acquired { token: first, .. } = store.claim(&req).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    tokio::time::sleep(Duration::from_millis(2 * LEASE_MS)).await;

    let scope = req.id.scope.as_str().to_owned();
    let holder = hold_row_lock(schema.name(), &scope, req.id.key.as_str()).await;
    let retry = {
        let store = std::sync::Arc::clone(&store);
        let req = req.clone();
        tokio::spawn(async move { store.claim(&req).await })
    };
    // The holder completes the first attempt behind the store's back, as a
    // gateway's completion would, then commits: the waiting retry must see
    // the completed record and replay it, not take over the old lease.
    holder
        .execute(
            &format!(
                "UPDATE {}.records SET state = 'completed', completed_at_ms = created_at_ms, \
                 expires_at_ms = 9000000000000, tombstone_until_ms = 9000000000000, \
                 result_status = 201, result_headers = '[]', result_body = 'late' \
                 WHERE scope = $1 AND key = $2",
                schema.name()
            ),
            &[&scope, &req.id.key.as_str()],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !retry.is_finished(),
        "a claim that would take over waits for the row lock"
    );
    holder.batch_execute("COMMIT").await.unwrap();
    let answer = tokio::time::timeout(PATIENCE, retry)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match answer {
        Claim::Replay { record } => {
            assert_eq!(record.token, first);
            assert_eq!(record.result.unwrap().body(), b"late");
        }
        other => panic!("the retry decides on the record after the lock: {other:?}"),
    }
}

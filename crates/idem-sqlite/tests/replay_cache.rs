//! The SQLite store's replays from memory answer as the writer would: a
//! record is answered from memory from its second replay on, and once a
//! new attempt has acquired the key, the old record is never answered
//! again, even when the clock is set back before its horizon (a system
//! clock stepped back): the cache drops a record the first time its
//! decision would write, which the claim that acquires again is.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::Arc;

use idem_core::{Claim, ManualClock, Store, StoredResult, Timestamp};
use idem_sqlite::{SqliteOptions, SqliteStore};
use support::request;

mod support;

const START_MS: u64 = 1_700_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_acquired_again_is_never_answered_from_the_old_record() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_millis(START_MS));
    let store = SqliteStore::open_with_clock(
        dir.path().join("idem.db"),
        SqliteOptions::default(),
        Arc::new(clock.clone()),
    )
    .unwrap();
    let req = request("again");
    let Claim::Acquired { token, .. } = store.claim(&req).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    let result = StoredResult::new(201, vec![], b"first".to_vec()).unwrap();
    let done = store.complete(&req.id, token, result).await.unwrap();
    for _ in 0..3 {
        match store.claim(&req).await.unwrap() {
            Claim::Replay { record } => assert_eq!(record.result.unwrap().body(), b"first"),
            other => panic!("a retry replays: {other:?}"),
        }
    }

    // Past the tombstone horizon the purge deletes the record and a new
    // attempt acquires the key.
    let horizon = done.tombstone_until.unwrap();
    clock.set(horizon.plus_millis(1));
    assert_eq!(store.purge(100).await.unwrap().deleted, 1);
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Acquired { .. }
    ));

    // The clock steps back before the old record's horizon: the store holds
    // the new attempt, so the answer is that it is in flight.
    clock.set(Timestamp::from_millis(horizon.as_millis() - 1_000));
    let answer = store.claim(&req).await.unwrap();
    assert!(
        matches!(answer, Claim::InFlight { .. }),
        "the new attempt is in flight, never the old record's replay: {answer:?}"
    );
}

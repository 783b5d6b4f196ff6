//! One operation that fails inside a group-commit batch fails alone: its
//! own writes are undone and every other operation of the batch commits.
//! Claims and completions run without a savepoint of their own (each
//! writes one statement, which SQLite undoes by itself when it fails), so
//! the failures here are raised after the row was written, by triggers a
//! second connection installs.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, ManualClock, Policy, RecordId, Scope, State,
    Store, StoredResult, Timestamp, Token,
};
use idem_sqlite::{SqliteOptions, SqliteStore};

fn open(path: &Path) -> SqliteStore {
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    SqliteStore::open_with_clock(path, SqliteOptions::default(), Arc::new(clock)).unwrap()
}

fn request(key: &str) -> ClaimRequest {
    ClaimRequest {
        id: RecordId {
            scope: Scope::new("POST /payouts|tenant-a").unwrap(),
            key: IdempotencyKey::parse(key).unwrap(),
        },
        fingerprint: Fingerprint::from_bytes([7; 32]),
        legacy_fingerprint: None,
        owner: "node-1".to_owned(),
        region: None,
        policy: Policy::default(),
    }
}

async fn acquire(store: &SqliteStore, key: &str) -> Token {
    match store.claim(&request(key)).await.unwrap() {
        Claim::Acquired { token, .. } => token,
        other => panic!("{key}: expected Acquired, got {other:?}"),
    }
}

async fn state(store: &SqliteStore, key: &str) -> Option<State> {
    let record = store.get(&request(key).id).await.unwrap();
    record.map(|r| r.state)
}

/// The triggers: a claim of `claim-refused` and the completion of
/// `complete-refused` fail after their row is written (`AFTER INSERT`;
/// the completion's `INSERT OR REPLACE` has already deleted the row it
/// replaces by then).
const REFUSALS: &str = "\
    CREATE TRIGGER refuse_claim AFTER INSERT ON records \
    WHEN NEW.key = 'claim-refused' \
    BEGIN SELECT RAISE(ABORT, 'claim refused'); END; \
    CREATE TRIGGER refuse_completion AFTER INSERT ON records \
    WHEN NEW.key = 'complete-refused' AND NEW.state = 'completed' \
    BEGIN SELECT RAISE(ABORT, 'completion refused'); END;";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_inside_a_batch_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = Arc::new(open(&path));
    let refused_token = acquire(&store, "complete-refused").await;
    let ok_token = acquire(&store, "complete-ok").await;
    let side = rusqlite::Connection::open(&path).unwrap();
    side.execute_batch(REFUSALS).unwrap();

    // Hold the write lock so that every operation below queues up behind
    // the writer's BEGIN and joins one batch when the lock is let go.
    let before = store.stats();
    side.execute_batch("BEGIN IMMEDIATE").unwrap();
    let result = || StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
    let mut claims = Vec::new();
    for key in ["good-1", "claim-refused", "good-2", "good-3"] {
        let store = store.clone();
        claims.push((
            key,
            tokio::spawn(async move { store.claim(&request(key)).await }),
        ));
    }
    let completions = [
        ("complete-refused", refused_token),
        ("complete-ok", ok_token),
    ]
    .map(|(key, token)| {
        let store = store.clone();
        let result = result();
        (
            key,
            tokio::spawn(async move { store.complete(&request(key).id, token, result).await }),
        )
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    side.execute_batch("COMMIT").unwrap();

    for (key, claim) in claims {
        let claim = claim.await.unwrap();
        match key {
            "claim-refused" => assert!(claim.is_err(), "{key}: refused, got {claim:?}"),
            _ => assert!(
                matches!(claim, Ok(Claim::Acquired { .. })),
                "{key}: a neighbour's failure must not fail it, got {claim:?}"
            ),
        }
    }
    for (key, completion) in completions {
        let completion = completion.await.unwrap();
        match key {
            "complete-refused" => assert!(completion.is_err(), "{key}: refused"),
            _ => assert!(completion.is_ok(), "{key}: {completion:?}"),
        }
    }
    let run = store.stats().since(&before);
    assert!(
        run.batches < run.ops,
        "the six operations were meant to share a batch: {run:?}"
    );

    // What the refused writes had done before their trigger fired is undone.
    assert_eq!(state(&store, "claim-refused").await, None);
    assert_eq!(
        state(&store, "complete-refused").await,
        Some(State::InProgress),
        "the replaced row is back, as it was"
    );
    assert_eq!(state(&store, "complete-ok").await, Some(State::Completed));
    for key in ["good-1", "good-2", "good-3"] {
        assert_eq!(state(&store, key).await, Some(State::InProgress), "{key}");
    }

    // Nothing was left half-done: without the triggers both go through.
    side.execute_batch("DROP TRIGGER refuse_claim; DROP TRIGGER refuse_completion")
        .unwrap();
    acquire(&store, "claim-refused").await;
    store
        .complete(&request("complete-refused").id, refused_token, result())
        .await
        .unwrap();
    assert_eq!(
        state(&store, "complete-refused").await,
        Some(State::Completed)
    );
}

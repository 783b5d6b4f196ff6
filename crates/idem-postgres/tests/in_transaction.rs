//! The claim in the caller's own transaction: a service claims, writes its
//! ledger row and completes in one transaction. COMMIT makes the record and
//! the row visible together, ROLLBACK neither (and the key is free again);
//! a concurrent claimer waits and then replays, never acquiring twice; the
//! decision is the store's own, the claimer's region included.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Claim, ClaimRequest, LeaseExpiry, LimitError, ManualClock, Policy, Store, StoreError,
    StoredResult, Timestamp, Token,
};
use idem_postgres::PgStore;
use support::{SchemaGuard, admin, request};

/// How long a claimer is watched to see that it waits for an open
/// transaction (it cannot finish before that transaction does).
const WATCH_MS: u64 = 300;

/// A store and a ledger table in a fresh schema.
async fn setup() -> (Arc<PgStore>, SchemaGuard, tokio_postgres::Client) {
    let schema = SchemaGuard::new();
    let store = Arc::new(schema.store(None).await);
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {}.ledger (key TEXT PRIMARY KEY, amount BIGINT NOT NULL)",
            schema.name()
        ))
        .await
        .unwrap();
    (store, schema, admin)
}

fn paid() -> StoredResult {
    StoredResult::new(201, vec![("x-ledger".into(), "1".into())], b"paid".to_vec()).unwrap()
}

/// Claims, writes the ledger row and completes in `tx`; returns the token.
async fn pay(store: &PgStore, tx: &tokio_postgres::Transaction<'_>, req: &ClaimRequest) -> Token {
    let claim = store.claim_in(tx, req).await.unwrap();
    let Claim::Acquired { token, .. } = claim else {
        panic!(
            "{} should be acquired in the transaction, got {claim:?}",
            req.id
        );
    };
    let sql = format!(
        "INSERT INTO {}.ledger (key, amount) VALUES ($1, 847)",
        store.schema()
    );
    tx.execute(&sql, &[&req.id.key.as_str()]).await.unwrap();
    let done = store.complete_in(tx, &req.id, token, paid()).await.unwrap();
    assert_eq!(done.result, Some(paid()));
    token
}

async fn ledger_rows(admin: &tokio_postgres::Client, schema: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {schema}.ledger");
    admin.query_one(&sql, &[]).await.unwrap().get(0)
}

/// COMMIT makes the record and the ledger row visible together (a retry
/// replays); ROLLBACK leaves neither (the key is free for a new token).
/// Before either, nobody else sees anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_and_the_effect_commit_or_roll_back_together() {
    let (store, schema, admin) = setup().await;
    for (n, commit) in [true, false].into_iter().enumerate() {
        let req = request(&format!("end-{commit}"), 1, 30_000);
        let mut client = store.client().await.unwrap();
        let tx = client.transaction().await.unwrap();
        let token = pay(&store, &tx, &req).await;
        assert_eq!(store.get(&req.id).await.unwrap(), None, "{commit}: not yet");
        assert_eq!(
            ledger_rows(&admin, schema.name()).await,
            n as i64,
            "{commit}"
        );
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }

        let rows = ledger_rows(&admin, schema.name()).await;
        assert_eq!(rows, 1, "{commit}: the one committed row");
        let record = store.get(&req.id).await.unwrap();
        let claim = store.claim(&req).await.unwrap();
        if commit {
            let record = record.unwrap();
            assert_eq!((record.token, record.result), (token, Some(paid())));
            assert!(matches!(claim, Claim::Replay { .. }), "{claim:?}");
        } else {
            assert_eq!(record, None, "rolled back");
            let Claim::Acquired { token: again, .. } = claim else {
                panic!("the key is free again, got {claim:?}");
            };
            assert!(again > token, "a new token: {again} after {token}");
        }
    }
}

/// A second claimer, through the store or through its own transaction,
/// waits while the first transaction is open and replays after its
/// commit: exactly one acquisition, one ledger row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_concurrent_claimer_waits_then_replays() {
    let (store, schema, admin) = setup().await;
    for via_transaction in [false, true] {
        let req = request(&format!("contended-{via_transaction}"), 1, 30_000);
        let mut client = store.client().await.unwrap();
        let tx = client.transaction().await.unwrap();
        pay(&store, &tx, &req).await;

        let (other, other_req) = (Arc::clone(&store), req.clone());
        let waiter = tokio::spawn(async move {
            if !via_transaction {
                return other.claim(&other_req).await;
            }
            let mut client = other.client().await.unwrap();
            let tx = client.transaction().await.unwrap();
            let claim = other.claim_in(&tx, &other_req).await;
            tx.commit().await.unwrap();
            claim
        });
        // Nothing can be observed of a waiting claimer but that it waits.
        tokio::time::sleep(Duration::from_millis(WATCH_MS)).await;
        let early = waiter.is_finished();
        tx.commit().await.unwrap();
        let claim = waiter.await.unwrap().unwrap();
        match (early, &claim) {
            (false, Claim::Replay { record }) => assert_eq!(record.result, Some(paid())),
            (true, Claim::InFlight { .. }) => {}
            other => panic!("via transaction {via_transaction}: got {other:?}"),
        }
    }
    assert_eq!(
        ledger_rows(&admin, schema.name()).await,
        2,
        "one effect per key"
    );
}

/// A claimer that waited on a transaction that then rolled back acquires
/// with a lease counted from after the wait, not from before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claimer_that_waited_on_a_rollback_gets_a_full_lease() {
    let (store, _schema, _admin) = setup().await;
    let lease_ms = 200;
    let req = request("waited", 1, lease_ms);
    let mut client = store.client().await.unwrap();
    let tx = client.transaction().await.unwrap();
    assert!(matches!(
        store.claim_in(&tx, &req).await.unwrap(),
        Claim::Acquired { .. }
    ));
    let (other, other_req) = (Arc::clone(&store), req.clone());
    let waiter = tokio::spawn(async move { other.claim(&other_req).await });
    // Wait longer than the lease, so a lease counted from before the wait
    // would be over when the waiter acquires.
    tokio::time::sleep(Duration::from_millis(2 * lease_ms)).await;
    tx.rollback().await.unwrap();
    let claim = waiter.await.unwrap().unwrap();
    assert!(matches!(claim, Claim::Acquired { .. }), "{claim:?}");
    let next = store.claim(&req).await.unwrap();
    assert!(
        matches!(next, Claim::InFlight { .. }),
        "the waiter's lease is still running: {next:?}"
    );
}

/// The caller's transaction gets the store's decisions on existing
/// records and its fencing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_in_a_transaction_decide_like_the_store() {
    let (store, _schema, _admin) = setup().await;
    let req = request("existing", 1, 30_000);
    let Claim::Acquired { token, .. } = store.claim(&req).await.unwrap() else {
        panic!("fresh key");
    };
    let mut client = store.client().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let in_flight = store.claim_in(&tx, &req).await.unwrap();
    assert!(matches!(in_flight, Claim::InFlight { .. }), "{in_flight:?}");
    let stale = store
        .complete_in(&tx, &req.id, Token(token.0 + 1), paid())
        .await;
    assert!(matches!(stale, Err(StoreError::Fenced { .. })), "{stale:?}");
    tx.commit().await.unwrap();

    store.complete(&req.id, token, paid()).await.unwrap();
    let tx = client.transaction().await.unwrap();
    let replay = store.claim_in(&tx, &req).await.unwrap();
    assert!(matches!(replay, Claim::Replay { .. }), "{replay:?}");
    let other = store.claim_in(&tx, &request("existing", 2, 30_000)).await;
    assert!(matches!(other, Ok(Claim::Mismatch { .. })), "{other:?}");
    tx.commit().await.unwrap();
}

/// The locked path reads the time after the row lock is granted: a claim
/// that waited for a transaction holding the record, past the record's
/// lease, finds the lease expired. (A claim that finds a committed record
/// with its lease running answers 409 from its read and waits for nothing,
/// so the record here is one the holding transaction inserted and has not
/// committed: the claim's insert waits on it, then the claim locks.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_locked_path_reads_the_time_after_the_lock() {
    let (store, _schema, _admin) = setup().await;
    let lease_ms = 200;
    let req = request("held", 1, lease_ms);
    let mut client = store.client().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let held = store.claim_in(&tx, &req).await.unwrap();
    assert!(matches!(held, Claim::Acquired { .. }), "{held:?}");
    let (other, other_req) = (Arc::clone(&store), req.clone());
    let waiter = tokio::spawn(async move { other.claim(&other_req).await });
    // Hold the row past the lease.
    tokio::time::sleep(Duration::from_millis(2 * lease_ms)).await;
    assert!(!waiter.is_finished(), "the claim waits for the holder");
    tx.commit().await.unwrap();
    assert_eq!(
        waiter.await.unwrap().unwrap(),
        Claim::OutcomeUnknown { newly_marked: true }
    );
}

/// A claim in the caller's transaction keeps the claimer's region on the
/// fast path (a fresh key) and the locked path (a takeover records the
/// taker's), and refuses a bad region before it touches the transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_in_a_transaction_keep_the_region() {
    let schema = SchemaGuard::new();
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let store = schema.store(Some(clock.clone())).await;
    let takeover = Policy::new(1_000, 60, 3_600, LeaseExpiry::Takeover).unwrap();
    let from = |region: &str| ClaimRequest {
        region: Some(region.to_owned()),
        policy: takeover,
        ..request("regional", 1, 1_000)
    };
    let mut client = store.client().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let first = store.claim_in(&tx, &from("eu-west")).await.unwrap();
    assert!(
        matches!(
            first,
            Claim::Acquired {
                took_over: None,
                ..
            }
        ),
        "{first:?}"
    );
    tx.commit().await.unwrap();
    let record = store.get(&from("eu-west").id).await.unwrap().unwrap();
    assert_eq!(record.region.as_deref(), Some("eu-west"), "fast path");

    clock.advance_millis(1_000);
    let tx = client.transaction().await.unwrap();
    let bad = store.claim_in(&tx, &from("eu west")).await;
    assert!(
        matches!(bad, Err(StoreError::Limit(LimitError::BadRegion { .. }))),
        "{bad:?}"
    );
    let taken = store.claim_in(&tx, &from("us-east")).await.unwrap();
    assert!(
        matches!(
            taken,
            Claim::Acquired {
                took_over: Some(_),
                ..
            }
        ),
        "{taken:?}"
    );
    tx.commit().await.unwrap();
    let record = store.get(&from("us-east").id).await.unwrap().unwrap();
    assert_eq!(record.region.as_deref(), Some("us-east"), "locked path");
}

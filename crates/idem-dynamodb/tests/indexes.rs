//! The reconciler's list of ambiguous records and the purge read the
//! table's sparse indexes, never scan it: counted with the store's own
//! request counters, on both emulators.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod common;

use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, ListQuery, ManualClock, Policy, RecordId,
    Scope, State, Store, StoredResult, Timestamp,
};

fn id(key: &str) -> RecordId {
    RecordId {
        scope: Scope::new("POST /payouts|t").unwrap(),
        key: IdempotencyKey::new(key.to_owned()).unwrap(),
    }
}

fn request(key: &str) -> ClaimRequest {
    ClaimRequest {
        id: id(key),
        fingerprint: Fingerprint::from_bytes([1; 32]),
        legacy_fingerprint: None,
        owner: "test".into(),
        region: None,
        policy: Policy::new(1_000, 60, 120, idem_core::LeaseExpiry::Reconcile).unwrap(),
    }
}

async fn acquire(store: &impl Store, key: &str) -> idem_core::Token {
    match store.claim(&request(key)).await.unwrap() {
        Claim::Acquired { token, .. } => token,
        other => panic!("{key}: {other:?}"),
    }
}

async fn ambiguous_and_purge_use_no_scan(emulator: common::Emulator) {
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let (store, _guard) = common::fresh_store(emulator, clock.clone()).await;
    for n in 0..5 {
        let key = format!("done-{n}");
        let token = acquire(&*store, &key).await;
        let result = StoredResult::new(201, Vec::new(), b"{}".to_vec()).unwrap();
        store.complete(&id(&key), token, result).await.unwrap();
    }
    let token = acquire(&*store, "unsure").await;
    store.mark_ambiguous(&id("unsure"), token).await.unwrap();

    let before = store.usage();
    let query = ListQuery {
        state: Some(State::Ambiguous),
        ..ListQuery::default()
    };
    let listed = store.list(&query).await.unwrap();
    let used = store.usage().since(&before);
    let keys: Vec<&str> = listed.records.iter().map(|r| r.id.key.as_str()).collect();
    assert_eq!(keys, ["unsure"], "{emulator:?}");
    assert_eq!((used.scans, used.queries), (0, 1), "{emulator:?}: {used:?}");

    clock.advance_millis(61_000);
    let before = store.usage();
    let purged = store.purge(100).await.unwrap();
    let used = store.usage().since(&before);
    assert_eq!(purged.tombstoned, 5, "{emulator:?}: {purged:?}");
    assert_eq!(used.scans, 0, "{emulator:?}: {used:?}");
    assert_eq!(
        used.queries,
        u64::from(idem_dynamodb::item::DUE_SHARDS),
        "{emulator:?}: one query per index partition: {used:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn on_dynalite() {
    ambiguous_and_purge_use_no_scan(common::Emulator::Dynalite).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_moto() {
    ambiguous_and_purge_use_no_scan(common::Emulator::Moto).await;
}

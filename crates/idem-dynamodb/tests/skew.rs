//! With a tolerated clock skew, only a lease is judged late: an attempt's
//! key is taken from it `clock_skew_ms` after its lease, while retention
//! and the tombstone horizon end when the stored instants say, for a claim
//! exactly as for a listing and the purge. On both emulators.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod common;

use std::sync::Arc;

use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, LeaseExpiry, ListQuery, ManualClock, Policy,
    RecordId, Scope, State, Store, StoredResult, Timestamp,
};
use idem_dynamodb::DynamoStore;

const SKEW_MS: u64 = 1_000;
const LEASE_MS: u64 = 2_000;

fn request(key: &str) -> ClaimRequest {
    ClaimRequest {
        id: RecordId {
            scope: Scope::new("POST /payouts|t").unwrap(),
            key: IdempotencyKey::new(key.to_owned()).unwrap(),
        },
        fingerprint: Fingerprint::from_bytes([3; 32]),
        legacy_fingerprint: None,
        owner: "test".into(),
        region: None,
        policy: Policy::new(LEASE_MS, 1, 60, LeaseExpiry::Reconcile).unwrap(),
    }
}

async fn only_leases_are_judged_late(emulator: common::Emulator) {
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let (url, client) = common::fresh_url_with_skew(emulator, "skew", SKEW_MS).await;
    let store = DynamoStore::with_client(client, &url, Arc::new(clock.clone()))
        .await
        .unwrap();

    // A lease: still in flight at its end and until the skew has passed.
    let running = request("running");
    let Claim::Acquired { lease_until, .. } = store.claim(&running).await.unwrap() else {
        panic!("fresh")
    };
    clock.set(lease_until);
    let claim = store.claim(&running).await.unwrap();
    let Claim::InFlight { retry_after_ms, .. } = claim else {
        panic!("{emulator:?}: at the lease's end: {claim:?}")
    };
    assert_eq!(retry_after_ms, 0, "told when the lease ends, not the skew");
    clock.set(lease_until.plus_millis(SKEW_MS - 1));
    let claim = store.claim(&running).await.unwrap();
    assert!(
        matches!(claim, Claim::InFlight { .. }),
        "{emulator:?}: {claim:?}"
    );
    clock.set(lease_until.plus_millis(SKEW_MS));
    let claim = store.claim(&running).await.unwrap();
    assert_eq!(
        claim,
        Claim::OutcomeUnknown { newly_marked: true },
        "{emulator:?}: the skew past the lease"
    );

    // Retention: over at the stored instant, for the claim as for the list.
    let done = request("done");
    let Claim::Acquired { token, .. } = store.claim(&done).await.unwrap() else {
        panic!("fresh")
    };
    let result = StoredResult::new(201, Vec::new(), b"{}".to_vec()).unwrap();
    let record = store.complete(&done.id, token, result).await.unwrap();
    let expires_at = record.expires_at.unwrap();
    clock.set(expires_at);
    let tombstones = ListQuery {
        state: Some(State::Tombstone),
        ..ListQuery::default()
    };
    let listed = store.list(&tombstones).await.unwrap();
    assert_eq!(
        listed.records.len(),
        1,
        "{emulator:?}: listed as a tombstone"
    );
    let claim = store.claim(&done).await.unwrap();
    assert!(
        matches!(claim, Claim::Expired { .. }),
        "{emulator:?}: a claim at the end of retention: {claim:?}"
    );
    let purged = store.purge(10).await.unwrap();
    assert_eq!(purged.tombstoned, 1, "{emulator:?}: {purged:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn on_dynalite() {
    only_leases_are_judged_late(common::Emulator::Dynalite).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_moto() {
    only_leases_are_judged_late(common::Emulator::Moto).await;
}

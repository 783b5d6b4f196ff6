//! The claim table of docs/contract.md, row by row, with its time boundaries: a
//! store that applies the shared decision atomically passes every case here.

use std::sync::Arc;

use idem_core::{Claim, Clock, LeaseExpiry, ManualClock, Record, State, Store};

use super::support::{
    LEASE_MS, OWNER, RETENTION_MS, TOMBSTONE_MS, acquire, after, ambiguous, completed, fp,
    fresh_record, in_progress, key, largest_result, request, request_with, result, stored,
};

/// No record → `Acquired`: a token, `lease_until = now + lease_ms`, no
/// takeover, and a new `in_progress` record holding exactly the request.
pub async fn claim_acquires_when_no_record<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let id = key("payout-847");
    let now = clock.now();
    let token = acquire(&*store, &clock, &request(&id, fp(1))).await;
    let expect = fresh_record(&id, fp(1), token, now);
    assert_eq!(store.get(&id).await.unwrap(), Some(expect));
}

/// Completing stores the result and sets the horizons from the completion
/// time: `expires_at = now + retention`, `tombstone_until = now + tombstone`.
pub async fn complete_stores_result_and_horizons<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("payout-847");
    let before = in_progress(&*store, &clock, &id, fp(1)).await;
    clock.advance_millis(250);
    let now = clock.now();
    let done = store.complete(&id, before.token, result(1)).await.unwrap();
    let expect = Record {
        state: State::Completed,
        completed_at: Some(now),
        expires_at: Some(after(now, RETENTION_MS)),
        tombstone_until: Some(after(now, TOMBSTONE_MS)),
        result: Some(result(1)),
        ..before
    };
    assert_eq!(done, expect, "complete returns the record it stored");
    assert_eq!(stored(&*store, &id).await, expect, "get returns it too");
}

/// Any live record with a different fingerprint → `Mismatch` with the stored
/// fingerprint, and nothing written: not even an expired lease is marked.
pub async fn claim_with_other_fingerprint_is_mismatch<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    // (row, setup, ms to wait after the setup before claiming)
    let rows: [(&str, State, u64); 6] = [
        ("in_progress, lease valid", State::InProgress, 0),
        ("in_progress, 1 ms left", State::InProgress, LEASE_MS - 1),
        ("in_progress, lease expired", State::InProgress, LEASE_MS),
        ("completed", State::Completed, 0),
        ("completed, 1 ms left", State::Completed, RETENTION_MS - 1),
        ("ambiguous", State::Ambiguous, 0),
    ];
    for (row, setup, wait_ms) in rows {
        let id = key(&format!("mismatch-{}", row.replace([' ', ','], "-")));
        let before = match setup {
            State::InProgress => in_progress(&*store, &clock, &id, fp(1)).await,
            State::Completed => completed(&*store, &clock, &id, fp(1), 1).await,
            _ => ambiguous(&*store, &clock, &id, fp(1)).await,
        };
        clock.advance_millis(wait_ms);
        for on_lease_expiry in [LeaseExpiry::Reconcile, LeaseExpiry::Takeover] {
            let claim = store
                .claim(&request_with(&id, fp(2), on_lease_expiry, OWNER))
                .await;
            assert_eq!(
                claim,
                Ok(Claim::Mismatch { stored: fp(1) }),
                "row {row:?}, {on_lease_expiry:?}"
            );
        }
        assert_eq!(stored(&*store, &id).await, before, "row {row:?} unchanged");
    }
}

/// `completed` → `Replay` of the stored record, result byte-identical (status,
/// header order and duplicates, binary body, the largest allowed body), up to
/// one millisecond before `expires_at`.
pub async fn claim_on_completed_replays_result<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let small = key("replay-small");
    let large = key("replay-large");
    completed(&*store, &clock, &small, fp(1), 7).await;
    let token = acquire(&*store, &clock, &request(&large, fp(1))).await;
    store
        .complete(&large, token, largest_result())
        .await
        .unwrap();
    let completed_at = clock.now();
    for (row, wait_ms) in [
        ("at completion", 0),
        ("1 ms before expiry", RETENTION_MS - 1),
    ] {
        clock.set(after(completed_at, wait_ms));
        for (id, expect) in [(&small, result(7)), (&large, largest_result())] {
            let claim = store.claim(&request(id, fp(1))).await.unwrap();
            let Claim::Replay { record } = &claim else {
                panic!("{row}: {id} should replay, got {claim:?}");
            };
            let got = record.result.as_ref().unwrap();
            assert_eq!(got.status(), expect.status(), "{row}: {id} status");
            assert_eq!(got.headers(), expect.headers(), "{row}: {id} headers");
            assert!(got.body() == expect.body(), "{row}: {id} body differs");
            assert_eq!(**record, stored(&*store, id).await, "{row}: {id} record");
        }
    }
}

/// `in_progress` with a valid lease → `InFlight` with that `lease_until` and
/// `retry_after_ms` counting down to it; the lease is valid strictly before
/// `lease_until`, under either policy.
pub async fn claim_in_flight_reports_lease<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let id = key("in-flight");
    let before = in_progress(&*store, &clock, &id, fp(1)).await;
    let acquired_at = before.created_at;
    for wait_ms in [0, 1, LEASE_MS / 2, LEASE_MS - 1] {
        clock.set(after(acquired_at, wait_ms));
        for on_lease_expiry in [LeaseExpiry::Reconcile, LeaseExpiry::Takeover] {
            let claim = store
                .claim(&request_with(&id, fp(1), on_lease_expiry, "node-2"))
                .await;
            let expect = Claim::InFlight {
                lease_until: before.lease_until,
                retry_after_ms: LEASE_MS - wait_ms,
            };
            assert_eq!(claim, Ok(expect), "{wait_ms} ms in, {on_lease_expiry:?}");
        }
    }
    assert_eq!(
        stored(&*store, &id).await,
        before,
        "in-flight claims write nothing"
    );
}

/// `in_progress`, lease expired (at `lease_until` exactly), policy
/// `reconcile` → `OutcomeUnknown { newly_marked: true }` and the record
/// becomes `ambiguous`, token kept; later claims say `newly_marked: false`.
pub async fn claim_on_expired_lease_reconciles<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("expired-lease");
    let before = in_progress(&*store, &clock, &id, fp(1)).await;
    clock.set(before.lease_until);
    let req = request_with(&id, fp(1), LeaseExpiry::Reconcile, "node-2");
    let first = store.claim(&req).await;
    assert_eq!(first, Ok(Claim::OutcomeUnknown { newly_marked: true }));
    let marked = Record {
        state: State::Ambiguous,
        ..before.clone()
    };
    assert_eq!(stored(&*store, &id).await, marked, "only the state changes");
    for wait_ms in [0, LEASE_MS, TOMBSTONE_MS] {
        clock.set(after(before.lease_until, wait_ms));
        let again = store.claim(&req).await;
        let expect = Ok(Claim::OutcomeUnknown {
            newly_marked: false,
        });
        assert_eq!(again, expect, "{wait_ms} ms after expiry");
    }
    assert_eq!(stored(&*store, &id).await, marked);
}

/// `in_progress`, lease expired, policy `takeover` → `Acquired` with a greater
/// token and `took_over` = the old one; the old token is fenced afterwards.
/// One millisecond earlier the lease still holds.
pub async fn claim_on_expired_lease_takes_over<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("take-over");
    let first = request_with(&id, fp(1), LeaseExpiry::Takeover, OWNER);
    let old = acquire(&*store, &clock, &first).await;
    let before = stored(&*store, &id).await;
    let second = request_with(&id, fp(1), LeaseExpiry::Takeover, "node-2");
    clock.set(after(before.created_at, LEASE_MS - 1));
    let early = store.claim(&second).await;
    let expect_early = Claim::InFlight {
        lease_until: before.lease_until,
        retry_after_ms: 1,
    };
    assert_eq!(early, Ok(expect_early), "1 ms before lease_until");
    clock.set(before.lease_until);
    let now = clock.now();
    let claim = store.claim(&second).await.unwrap();
    let Claim::Acquired { token: new, .. } = claim else {
        panic!("takeover should acquire, got {claim:?}");
    };
    assert!(
        new > old,
        "token {new} must exceed the token taken over, {old}"
    );
    let expect = Claim::Acquired {
        token: new,
        lease_until: after(now, LEASE_MS),
        lease_ms: LEASE_MS,
        took_over: Some(old),
    };
    assert_eq!(claim, expect);
    let taken = Record {
        token: new,
        owner: "node-2".to_owned(),
        lease_until: after(now, LEASE_MS),
        created_at: now,
        ..before
    };
    assert_eq!(stored(&*store, &id).await, taken);
    let fenced = idem_core::StoreError::Fenced {
        id: id.clone(),
        presented: old,
        current: Some((new, State::InProgress)),
    };
    let complete = store.complete(&id, old, result(1)).await;
    assert_eq!(complete, Err(fenced.clone()), "old token completes");
    assert_eq!(store.release(&id, old).await, Err(fenced.clone()));
    assert_eq!(store.mark_ambiguous(&id, old).await, Err(fenced));
    assert_eq!(
        stored(&*store, &id).await,
        taken,
        "fenced writes change nothing"
    );
    let done = store.complete(&id, new, result(2)).await.unwrap();
    assert_eq!(done.result, Some(result(2)), "the new token completes");
}

/// `ambiguous` → `OutcomeUnknown { newly_marked: false }` under either
/// policy, however long it waits: ambiguity never expires by itself.
pub async fn claim_on_ambiguous_is_outcome_unknown<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("ambiguous");
    let before = ambiguous(&*store, &clock, &id, fp(1)).await;
    for wait_ms in [0, LEASE_MS, RETENTION_MS, TOMBSTONE_MS, 10 * TOMBSTONE_MS] {
        clock.set(after(before.created_at, wait_ms));
        for on_lease_expiry in [LeaseExpiry::Reconcile, LeaseExpiry::Takeover] {
            let claim = store
                .claim(&request_with(&id, fp(1), on_lease_expiry, OWNER))
                .await;
            let expect = Claim::OutcomeUnknown {
                newly_marked: false,
            };
            assert_eq!(claim, Ok(expect), "{wait_ms} ms later, {on_lease_expiry:?}");
        }
    }
    assert_eq!(stored(&*store, &id).await, before);
}

/// `completed` past `expires_at` but before `tombstone_until` → `Expired`
/// with the completion time, whatever the fingerprint, with no purge ever
/// run: expiry is logical, decided against the store's clock.
pub async fn claim_past_retention_is_expired_before_any_purge<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("late-replay");
    let done = completed(&*store, &clock, &id, fp(1), 1).await;
    let completed_at = done.completed_at.unwrap();
    let expect = Claim::Expired {
        completed_at: Some(completed_at),
        tombstone_until: Some(after(completed_at, TOMBSTONE_MS)),
    };
    for wait_ms in [RETENTION_MS, RETENTION_MS + 1, TOMBSTONE_MS - 1] {
        clock.set(after(completed_at, wait_ms));
        for fingerprint in [fp(1), fp(2)] {
            let claim = store.claim(&request(&id, fingerprint)).await;
            assert_eq!(
                claim,
                Ok(expect.clone()),
                "{wait_ms} ms after completion, fingerprint {fingerprint}"
            );
        }
    }
}

/// At and after `tombstone_until` the key is free again: `Acquired` anew
/// with a greater token and the new fingerprint, whether the purge never
/// ran, tombstoned the record, or already deleted it.
pub async fn claim_after_tombstone_horizon_acquires<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    // (row, purge at ms after completion, ms after tombstone_until to claim)
    let rows: [(&str, Option<u64>, u64); 4] = [
        ("never purged", None, 0),
        ("never purged, later", None, 1),
        ("tombstoned by purge", Some(RETENTION_MS), 0),
        ("deleted by purge", Some(TOMBSTONE_MS), 0),
    ];
    for (row, purge_at_ms, late_ms) in rows {
        let id = key(&format!("reuse-{}", row.replace([' ', ','], "-")));
        let done = completed(&*store, &clock, &id, fp(1), 1).await;
        let completed_at = done.completed_at.unwrap();
        if let Some(purge_ms) = purge_at_ms {
            clock.set(after(completed_at, purge_ms));
            store.purge(100).await.unwrap();
        }
        clock.set(after(completed_at, TOMBSTONE_MS + late_ms));
        let now = clock.now();
        let claim = store.claim(&request(&id, fp(2))).await.unwrap();
        let Claim::Acquired { token, .. } = claim else {
            panic!("row {row:?}: should acquire, got {claim:?}");
        };
        assert!(
            token > done.token,
            "row {row:?}: token {token} after {}",
            done.token
        );
        let expect = Claim::Acquired {
            token,
            lease_until: after(now, LEASE_MS),
            lease_ms: LEASE_MS,
            took_over: None,
        };
        assert_eq!(claim, expect, "row {row:?}");
        let fresh = fresh_record(&id, fp(2), token, now);
        assert_eq!(stored(&*store, &id).await, fresh, "row {row:?}");
    }
}

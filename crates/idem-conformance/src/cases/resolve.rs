//! Resolution of `ambiguous` records: completed (store the result, record who
//! resolved it and when) or not executed (release), and nothing else.

use std::sync::Arc;

use idem_core::{
    Claim, Clock, ManualClock, Outcome, Record, RecordId, Resolution, State, Store, StoreError,
};

use super::support::{
    RETENTION_MS, TOMBSTONE_MS, acquire, after, ambiguous, completed, fp, in_progress, key,
    request, result, stored,
};

/// Resolving an ambiguous record as completed → a `completed` record with the
/// result, horizons counted from now, and the resolution with `at = now` and
/// its `by` and `reason`; later claims replay it.
pub async fn resolve_completed_stores_result<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("resolved-completed");
    let before = ambiguous(&*store, &clock, &id, fp(1)).await;
    clock.advance_millis(5_000);
    let now = clock.now();
    let outcome = Outcome::Completed { result: result(3) };
    let resolution = Resolution::new(
        outcome.clone(),
        "operator:alice",
        "provider shows it settled",
    )
    .unwrap();
    let resolved = store.resolve(&id, resolution).await.unwrap();
    let expect = Record {
        state: State::Completed,
        completed_at: Some(now),
        expires_at: Some(after(now, RETENTION_MS)),
        tombstone_until: Some(after(now, TOMBSTONE_MS)),
        result: Some(result(3)),
        resolution: Some(Resolution {
            outcome,
            by: "operator:alice".to_owned(),
            reason: "provider shows it settled".to_owned(),
            at: Some(now),
        }),
        ..before
    };
    assert_eq!(resolved, Some(expect.clone()), "resolve returns the record");
    assert_eq!(stored(&*store, &id).await, expect, "and stores it");
    clock.advance_millis(1);
    let replay = store.claim(&request(&id, fp(1))).await;
    let expect_replay = Claim::Replay {
        record: Box::new(expect),
    };
    assert_eq!(replay, Ok(expect_replay));
    let other = store.claim(&request(&id, fp(2))).await;
    assert_eq!(other, Ok(Claim::Mismatch { stored: fp(1) }));
}

/// Resolving an ambiguous record as not executed removes it; the next claim
/// acquires with a greater token.
pub async fn resolve_not_executed_releases<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let id = key("resolved-not-executed");
    let before = ambiguous(&*store, &clock, &id, fp(1)).await;
    let resolution = Resolution::new(Outcome::NotExecuted, "reconciler", "no payout").unwrap();
    assert_eq!(store.resolve(&id, resolution).await, Ok(None));
    assert_eq!(store.get(&id).await.unwrap(), None);
    let token = acquire(&*store, &clock, &request(&id, fp(1))).await;
    assert!(token > before.token, "token {token} after {}", before.token);
}

/// Resolve applies to `ambiguous` records only: any other state →
/// `WrongState` with the state at the store's clock (a completed record past
/// retention is a tombstone) and nothing changed; no record → `NotFound`.
pub async fn resolve_refuses_other_states<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let (missing, running, done) = (key("missing"), key("in-progress"), key("completed"));
    let (expired, purged) = (key("past-retention"), key("tombstoned"));
    completed(&*store, &clock, &purged, fp(1), 1).await;
    clock.advance_millis(RETENTION_MS);
    assert_eq!(store.purge(100).await.unwrap().tombstoned, 1);
    completed(&*store, &clock, &expired, fp(1), 1).await;
    clock.advance_millis(RETENTION_MS);
    in_progress(&*store, &clock, &running, fp(1)).await;
    completed(&*store, &clock, &done, fp(1), 1).await;
    let wrong = |id: &RecordId, state| StoreError::WrongState {
        id: id.clone(),
        state,
        operation: "resolve",
    };
    let rows = [
        (
            &missing,
            StoreError::NotFound {
                id: missing.clone(),
            },
        ),
        (&running, wrong(&running, State::InProgress)),
        (&done, wrong(&done, State::Completed)),
        (&expired, wrong(&expired, State::Tombstone)),
        (&purged, wrong(&purged, State::Tombstone)),
    ];
    let outcomes = [
        Outcome::Completed { result: result(9) },
        Outcome::NotExecuted,
    ];
    for (id, expect) in rows {
        for outcome in outcomes.clone() {
            let before = store.get(id).await.unwrap();
            let resolution = Resolution::new(outcome.clone(), "operator", "test").unwrap();
            let got = store.resolve(id, resolution).await;
            assert_eq!(got, Err(expect.clone()), "{id} with {outcome:?}");
            assert_eq!(store.get(id).await.unwrap(), before, "{id} changed");
        }
    }
}

//! Resolution of `ambiguous` records: completed (store the result, record who
//! resolved it and when) or not executed (release), and nothing else.

use std::sync::Arc;

use idem_core::{
    Claim, Clock, ManualClock, Outcome, Record, RecordId, Resolution, State, Store, StoreError,
    Token,
};

use super::support::{
    LEASE_MS, RETENTION_MS, TOMBSTONE_MS, acquire, after, ambiguous, completed, fp, in_progress,
    key, release_reclaim_and_mark, request, result, stored,
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
    let resolved = store.resolve(&id, before.token, resolution).await.unwrap();
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
    clock.set(before.lease_until);
    let resolution = Resolution::new(Outcome::NotExecuted, "reconciler", "no payout").unwrap();
    assert_eq!(store.resolve(&id, before.token, resolution).await, Ok(None));
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
    clock.advance_millis(LEASE_MS);
    for (id, expect) in rows {
        for outcome in outcomes.clone() {
            let before = store.get(id).await.unwrap();
            let token = before.as_ref().map_or(Token(1), |r| r.token);
            let resolution = Resolution::new(outcome.clone(), "operator", "test").unwrap();
            let got = store.resolve(id, token, resolution).await;
            assert_eq!(got, Err(expect.clone()), "{id} with {outcome:?}");
            assert_eq!(store.get(id).await.unwrap(), before, "{id} changed");
        }
    }
}

/// A verdict is about one attempt: presented with another attempt's token
/// it is `Fenced`, changes nothing and journals nothing, whichever way it
/// goes. The classic race: the reconciler asks the provider about attempt
/// 1; meanwhile an operator releases it, a retry claims the key (attempt 2)
/// and its outcome is unknown too; the late verdict about attempt 1 must
/// not settle attempt 2.
pub async fn resolve_is_fenced_by_token<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let id = key("resolve-fenced");
    let first = ambiguous(&*store, &clock, &id, fp(1)).await;
    let second = release_reclaim_and_mark(&*store, &clock, &first).await;
    assert!(second.token > first.token);
    let journal_before = store.resolutions(&id).await.unwrap();
    let verdicts = [
        Outcome::Completed { result: result(4) },
        Outcome::NotExecuted,
    ];
    clock.set(second.lease_until);
    for outcome in verdicts {
        for stale in [first.token, Token(second.token.0 + 1)] {
            let resolution = Resolution::new(outcome.clone(), "reconciler", "late").unwrap();
            let got = store.resolve(&id, stale, resolution).await;
            let expect = StoreError::Fenced {
                id: id.clone(),
                presented: stale,
                current: Some((second.token, State::Ambiguous)),
            };
            assert_eq!(got, Err(expect), "{outcome:?} with token {stale}");
            assert_eq!(stored(&*store, &id).await, second, "the record changed");
        }
    }
    assert_eq!(store.resolutions(&id).await.unwrap(), journal_before);
}

/// "Not executed" is trusted only once the attempt can no longer commit:
/// before its lease ends it is `MayStillCommit` and changes nothing; from
/// `lease_until` on (not a millisecond before) it releases. "Completed"
/// (the provider found the effect) is accepted at once.
pub async fn resolve_not_executed_waits_for_lease<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let (id, found) = (key("not-yet"), key("found-early"));
    let record = ambiguous(&*store, &clock, &id, fp(1)).await;
    clock.set(idem_core::Timestamp::from_millis(
        record.lease_until.as_millis() - 1,
    ));
    let resolution = Resolution::new(Outcome::NotExecuted, "reconciler", "404").unwrap();
    let early = store.resolve(&id, record.token, resolution.clone()).await;
    let expect = StoreError::MayStillCommit {
        id: id.clone(),
        token: record.token,
        until: record.lease_until,
    };
    assert_eq!(early, Err(expect), "a millisecond before the lease ends");
    assert_eq!(stored(&*store, &id).await, record, "the record changed");
    assert_eq!(store.resolutions(&id).await.unwrap(), []);
    clock.set(record.lease_until);
    assert_eq!(store.resolve(&id, record.token, resolution).await, Ok(None));
    let other = ambiguous(&*store, &clock, &found, fp(1)).await;
    let outcome = Outcome::Completed { result: result(5) };
    let resolution = Resolution::new(outcome, "reconciler", "found").unwrap();
    let done = store
        .resolve(&found, other.token, resolution)
        .await
        .unwrap();
    assert_eq!(done.map(|r| r.state), Some(State::Completed));
}

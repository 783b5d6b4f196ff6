//! Failed provider lookups, counted by the store per ambiguous attempt, so
//! that every reconciler (restarted, on another node, run from cron) gives
//! up after the same number of tries.

use std::sync::Arc;

use idem_core::{
    Clock, LookupTries, ManualClock, Outcome, Resolution, State, Store, StoreError, Timestamp,
    Token,
};

use super::support::{
    LEASE_MS, ambiguous, completed, fp, id, in_progress, key, release_reclaim_and_mark, result,
    stored,
};

/// Each failed lookup of an ambiguous attempt adds one to its count and
/// keeps the time given for the next lookup, exactly, whether that is
/// earlier or later than the last one; the count is read back as written,
/// and another record's count (same key in another scope) is untouched.
pub async fn failed_lookups_are_counted_per_attempt<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let (mine, theirs) = (
        key("tries-counted"),
        id("POST /payouts|tenant-b", "tries-counted"),
    );
    let record = ambiguous(&*store, &clock, &mine, fp(1)).await;
    let other = ambiguous(&*store, &clock, &theirs, fp(1)).await;
    assert_eq!(store.lookup_tries(&mine, record.token).await, Ok(None));
    let at = |ms: u64| clock.now().plus_millis(ms);
    for (failures, next_at) in [(1, at(1_000)), (2, at(60_000)), (3, at(10)), (4, at(0))] {
        let got = store.note_failed_lookup(&mine, record.token, next_at).await;
        let expect = LookupTries {
            token: record.token,
            failures,
            next_at,
        };
        assert_eq!(got, Ok(expect), "failure {failures}");
        let read = store.lookup_tries(&mine, record.token).await;
        assert_eq!(read, Ok(Some(expect)), "read after failure {failures}");
        clock.advance_millis(1);
    }
    assert_eq!(store.lookup_tries(&theirs, other.token).await, Ok(None));
    assert_eq!(
        stored(&*store, &mine).await,
        record,
        "the record is unchanged"
    );
}

/// A failure is about one attempt: presented with another attempt's token,
/// or for a record that is missing or not ambiguous, it is refused as a
/// verdict would be, and no count is kept or changed.
pub async fn failed_lookups_are_fenced_by_token<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("tries-fenced");
    let first = ambiguous(&*store, &clock, &id, fp(1)).await;
    let next_at = clock.now().plus_millis(5);
    store
        .note_failed_lookup(&id, first.token, next_at)
        .await
        .unwrap();
    let second = release_reclaim_and_mark(&*store, &clock, &first).await;
    let kept = Some(LookupTries {
        token: second.token,
        failures: 1,
        next_at,
    });
    let noted = store.note_failed_lookup(&id, second.token, next_at).await;
    assert_eq!(
        noted.map(Some),
        Ok(kept),
        "the second attempt counts afresh"
    );
    for stale in [first.token, Token(second.token.0 + 1)] {
        let got = store.note_failed_lookup(&id, stale, next_at).await;
        let expect = StoreError::Fenced {
            id: id.clone(),
            presented: stale,
            current: Some((second.token, State::Ambiguous)),
        };
        assert_eq!(got, Err(expect), "a failure about attempt {stale}");
        assert_eq!(store.lookup_tries(&id, stale).await, Ok(None), "{stale}");
        assert_eq!(store.lookup_tries(&id, second.token).await, Ok(kept));
    }
    let (missing, running, done) = (
        key("tries-missing"),
        key("tries-running"),
        key("tries-done"),
    );
    let running_token = in_progress(&*store, &clock, &running, fp(1)).await.token;
    let done_token = completed(&*store, &clock, &done, fp(1), 1).await.token;
    let wrong = |id: &idem_core::RecordId, state| StoreError::WrongState {
        id: id.clone(),
        state,
        operation: "count a failed lookup of",
    };
    let rows = [
        (
            &missing,
            Token(1),
            StoreError::NotFound {
                id: missing.clone(),
            },
        ),
        (&running, running_token, wrong(&running, State::InProgress)),
        (&done, done_token, wrong(&done, State::Completed)),
    ];
    for (id, token, expect) in rows {
        let before = store.get(id).await.unwrap();
        let got = store.note_failed_lookup(id, token, next_at).await;
        assert_eq!(got, Err(expect), "{id}");
        assert_eq!(store.get(id).await.unwrap(), before, "{id} changed");
        assert_eq!(
            store.lookup_tries(id, token).await,
            Ok(None),
            "{id} counted"
        );
    }
}

/// A count lives as long as the ambiguity: resolving the attempt, either
/// way, drops it; a new ambiguous attempt of the same key starts from
/// nothing, and its first failure counts 1.
pub async fn a_resolution_or_new_attempt_starts_tries_afresh<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let (released, found) = (key("tries-released"), key("tries-found"));
    let first = ambiguous(&*store, &clock, &released, fp(1)).await;
    let other = ambiguous(&*store, &clock, &found, fp(1)).await;
    let next_at = Timestamp::from_millis(clock.now().as_millis() + LEASE_MS);
    for (id, token) in [(&released, first.token), (&found, other.token)] {
        for _ in 0..3 {
            store.note_failed_lookup(id, token, next_at).await.unwrap();
        }
    }
    let outcome = Outcome::Completed { result: result(1) };
    let by_hand = Resolution::new(outcome, "operator", "found it").unwrap();
    store.resolve(&found, other.token, by_hand).await.unwrap();
    assert_eq!(store.lookup_tries(&found, other.token).await, Ok(None));

    let second = release_reclaim_and_mark(&*store, &clock, &first).await;
    assert_eq!(store.lookup_tries(&released, first.token).await, Ok(None));
    assert_eq!(store.lookup_tries(&released, second.token).await, Ok(None));
    let got = store
        .note_failed_lookup(&released, second.token, next_at)
        .await;
    let expect = LookupTries {
        token: second.token,
        failures: 1,
        next_at,
    };
    assert_eq!(got, Ok(expect), "the new attempt's first failure");
}

//! The operator's verbs (`decision::apply_verb`): `expire` turns a
//! completed record into a tombstone now, `evict` removes a record once no
//! attempt may still commit; both are fenced by the token, journaled in the
//! same atomic step, and a refused verb changes and journals nothing.

use std::sync::Arc;

use idem_core::{
    Claim, Clock, JournalEntry, LimitError, ManualClock, RESOLUTION_TEXT_BYTES_MAX, Record,
    Resolved, State, Store, StoreError, Token, Verb, VerbRequest,
};

use super::support::{
    RETENTION_MS, TOMBSTONE_MS, acquire, ambiguous, completed, fp, in_progress, key,
    release_reclaim_and_mark, request, stored,
};

/// A verb by `alice` with a reason that names it.
fn verb(verb: Verb) -> VerbRequest {
    VerbRequest::new(verb, "alice", &format!("{} on request", verb.as_str())).unwrap()
}

/// The entry a verb on `record` must journal, at the store's now.
fn entry(
    record: &Record,
    request: &VerbRequest,
    outcome: Resolved,
    clock: &ManualClock,
) -> JournalEntry {
    JournalEntry {
        id: record.id.clone(),
        token: record.token,
        outcome,
        status: match outcome {
            Resolved::Completed => record.result.as_ref().map(|r| r.status()),
            Resolved::NotExecuted => None,
        },
        by: request.by.clone(),
        reason: request.reason.clone(),
        at: clock.now(),
        verb: Some(request.verb),
    }
}

/// Expiring a completed record → a tombstone now, its result dropped and
/// its horizons kept; a retry with the same request is a late replay, and
/// the journal holds exactly one entry naming the verb.
pub async fn expire_turns_a_completed_record_into_a_tombstone<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("expire-completed");
    let done = completed(&*store, &clock, &id, fp(1), 2).await;
    clock.advance_millis(2_000);
    let expire = verb(Verb::Expire);
    let expected = entry(&done, &expire, Resolved::Completed, &clock);
    let tombstone = Record {
        state: State::Tombstone,
        result: None,
        expires_at: Some(clock.now()),
        ..done.clone()
    };
    let got = store.apply_verb(&id, done.token, expire).await;
    assert_eq!(
        got,
        Ok(Some(tombstone.clone())),
        "expire returns the tombstone"
    );
    assert_eq!(stored(&*store, &id).await, tombstone, "and stores it");
    assert_eq!(
        store.resolutions(&id).await.unwrap(),
        [expected],
        "one entry"
    );
    let retry = store.claim(&request(&id, fp(1))).await;
    let late = Claim::Expired {
        completed_at: done.completed_at,
        tombstone_until: done.tombstone_until,
    };
    assert_eq!(retry, Ok(late), "a late retry is caught, not executed");
    assert_eq!(
        stored(&*store, &id).await,
        tombstone,
        "the retry wrote nothing"
    );
    clock.advance_millis(RETENTION_MS);
    assert_eq!(store.purge(100).await.unwrap().tombstoned, 0, "already one");
}

/// `expire` applies to a record completed at the store's now only: in
/// progress, ambiguous, past retention (purged or not) → `WrongState` with
/// that state; no record → `NotFound`. Nothing is written or journaled.
pub async fn expire_refuses_other_states<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let (missing, running, unsure) = (key("missing"), key("running"), key("unsure"));
    let (expired, purged) = (key("past-retention"), key("purged"));
    completed(&*store, &clock, &purged, fp(1), 1).await;
    clock.advance_millis(RETENTION_MS);
    assert_eq!(store.purge(100).await.unwrap().tombstoned, 1);
    completed(&*store, &clock, &expired, fp(1), 1).await;
    clock.advance_millis(RETENTION_MS);
    in_progress(&*store, &clock, &running, fp(1)).await;
    ambiguous(&*store, &clock, &unsure, fp(1)).await;
    let cases = [
        (&running, Some(State::InProgress)),
        (&unsure, Some(State::Ambiguous)),
        (&expired, Some(State::Tombstone)),
        (&purged, Some(State::Tombstone)),
        (&missing, None),
    ];
    for (id, state) in cases {
        let before = store.get(id).await.unwrap();
        let token = before.as_ref().map_or(Token(1), |r| r.token);
        let got = store.apply_verb(id, token, verb(Verb::Expire)).await;
        let expect = match state {
            Some(state) => StoreError::WrongState {
                id: id.clone(),
                state,
                operation: "expire",
            },
            None => StoreError::NotFound { id: id.clone() },
        };
        assert_eq!(got, Err(expect), "{id}");
        assert_eq!(store.get(id).await.unwrap(), before, "{id} changed");
        assert_eq!(store.resolutions(id).await.unwrap(), [], "{id} journaled");
    }
}

/// `evict` is refused (`MayStillCommit`, nothing written) while the lease
/// of an in-progress or ambiguous attempt runs; at its end it removes the
/// record and its kept lookup tries, journals "not executed", and the next
/// claim acquires with a greater token.
pub async fn evict_waits_for_the_lease<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let (running, unsure) = (key("evict-running"), key("evict-unsure"));
    let held = in_progress(&*store, &clock, &running, fp(1)).await;
    let marked = ambiguous(&*store, &clock, &unsure, fp(1)).await;
    store
        .note_failed_lookup(&unsure, marked.token, clock.now())
        .await
        .unwrap();
    for record in [&held, &marked] {
        let got = store
            .apply_verb(&record.id, record.token, verb(Verb::Evict))
            .await;
        let refused = StoreError::MayStillCommit {
            id: record.id.clone(),
            token: record.token,
            until: record.lease_until,
        };
        assert_eq!(got, Err(refused), "{}", record.id);
        assert_eq!(
            &stored(&*store, &record.id).await,
            record,
            "{} changed",
            record.id
        );
        assert_eq!(
            store.resolutions(&record.id).await.unwrap(),
            [],
            "{}",
            record.id
        );
    }
    clock.set(held.lease_until.max(marked.lease_until));
    for record in [&held, &marked] {
        let request = verb(Verb::Evict);
        let expected = entry(record, &request, Resolved::NotExecuted, &clock);
        let got = store.apply_verb(&record.id, record.token, request).await;
        assert_eq!(got, Ok(None), "{}", record.id);
        assert_eq!(
            store.get(&record.id).await.unwrap(),
            None,
            "{} kept",
            record.id
        );
        assert_eq!(store.resolutions(&record.id).await.unwrap(), [expected]);
    }
    assert_eq!(store.lookup_tries(&unsure, marked.token).await, Ok(None));
    let token = acquire(&*store, &clock, &request(&unsure, fp(2))).await;
    assert!(token > marked.token, "token {token} after {}", marked.token);
}

/// Evicting a completed record, or the tombstone an `expire` left, removes
/// it: the intent runs again (the next claim acquires), the journal keeps
/// both verbs oldest first, and neither a new completion nor the purge
/// touches them.
pub async fn evict_lets_the_intent_run_again<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("evict-completed");
    let done = completed(&*store, &clock, &id, fp(1), 3).await;
    let evict = verb(Verb::Evict);
    let first = entry(&done, &evict, Resolved::Completed, &clock);
    assert_eq!(store.apply_verb(&id, done.token, evict).await, Ok(None));
    assert_eq!(store.get(&id).await.unwrap(), None, "evicted");
    let token = acquire(&*store, &clock, &request(&id, fp(2))).await;
    let again = store
        .complete(&id, token, super::support::result(4))
        .await
        .unwrap();
    clock.advance_millis(10);
    let expire = verb(Verb::Expire);
    let second = entry(&again, &expire, Resolved::Completed, &clock);
    let tombstone = store.apply_verb(&id, token, expire).await.unwrap().unwrap();
    clock.advance_millis(10);
    let evict = verb(Verb::Evict);
    let third = entry(&tombstone, &evict, Resolved::Completed, &clock);
    assert_eq!(third.status, None, "the tombstone's result was dropped");
    assert_eq!(store.apply_verb(&id, token, evict).await, Ok(None));
    let expect = [first, second, third];
    assert_eq!(
        store.resolutions(&id).await.unwrap(),
        expect,
        "oldest first"
    );
    let token = acquire(&*store, &clock, &request(&id, fp(1))).await;
    store
        .complete(&id, token, super::support::result(5))
        .await
        .unwrap();
    clock.advance_millis(TOMBSTONE_MS);
    store.purge(100).await.unwrap();
    store.purge(100).await.unwrap();
    assert_eq!(store.get(&id).await.unwrap(), None, "purged");
    assert_eq!(
        store.resolutions(&id).await.unwrap(),
        expect,
        "the purge keeps them"
    );
}

/// A verb about another attempt than the record's is `Fenced` and changes
/// nothing: a token never issued, and the token of an attempt that was
/// released before the key was claimed again.
pub async fn verbs_are_fenced_by_token<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let done_id = key("fenced-completed");
    let done = completed(&*store, &clock, &done_id, fp(1), 1).await;
    for kind in [Verb::Expire, Verb::Evict] {
        let other = Token(done.token.0 + 1_000);
        let got = store.apply_verb(&done_id, other, verb(kind)).await;
        let fenced = StoreError::Fenced {
            id: done_id.clone(),
            presented: other,
            current: Some((done.token, State::Completed)),
        };
        assert_eq!(got, Err(fenced), "{kind:?}");
    }
    assert_eq!(stored(&*store, &done_id).await, done, "unchanged");
    let id = key("fenced-reclaimed");
    let first = ambiguous(&*store, &clock, &id, fp(1)).await;
    let old = first.token;
    let current = release_reclaim_and_mark(&*store, &clock, &first).await;
    clock.set(clock.now().max(current.lease_until));
    let got = store.apply_verb(&id, old, verb(Verb::Evict)).await;
    assert!(
        matches!(got, Err(StoreError::Fenced { presented, .. }) if presented == old),
        "an earlier attempt's token evicted the current one: {got:?}"
    );
    assert_eq!(stored(&*store, &id).await, current, "unchanged");
    assert_eq!(store.resolutions(&done_id).await.unwrap(), [], "journaled");
    let kept = store.resolutions(&id).await.unwrap();
    let verbs: Vec<_> = kept.iter().filter_map(|e| e.verb).collect();
    assert_eq!(
        (kept.len(), verbs),
        (1, vec![]),
        "only the release: {kept:?}"
    );
}

/// A verb without a reason, or with a text over its limit, is refused
/// (`Limit`) before anything is written.
pub async fn verbs_without_a_reason_are_refused<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("no-reason");
    let done = completed(&*store, &clock, &id, fp(1), 1).await;
    let mut blank = verb(Verb::Evict);
    blank.reason = " ".to_owned();
    let got = store.apply_verb(&id, done.token, blank).await;
    let empty = StoreError::Limit(LimitError::Empty { field: "reason" });
    assert_eq!(got, Err(empty));
    let mut long = verb(Verb::Expire);
    long.by = "x".repeat(RESOLUTION_TEXT_BYTES_MAX + 1);
    let got = store.apply_verb(&id, done.token, long).await;
    assert!(matches!(got, Err(StoreError::Limit(_))), "{got:?}");
    assert_eq!(stored(&*store, &id).await, done, "unchanged");
    assert_eq!(store.resolutions(&id).await.unwrap(), [], "journaled");
}

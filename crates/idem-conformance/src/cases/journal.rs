//! The resolution journal: every successful resolve appends exactly one
//! entry, in the same atomic step, that outlives the record (a release, a
//! purge, a new acquisition of the key); a refused resolve appends nothing.

use std::sync::Arc;

use idem_core::{
    Clock, JOURNAL_PER_RECORD_MAX, JournalEntry, ManualClock, Outcome, RESOLUTION_TEXT_BYTES_MAX,
    Record, RecordId, Resolution, Resolved, Store, Token,
};

use super::support::{
    RETENTION_MS, TOMBSTONE_MS, acquire, ambiguous, completed, fp, id, in_progress, key, request,
    result,
};

/// Resolves the ambiguous `record` and returns the entry the journal must
/// now end with: its token, the outcome, the status of a completed result,
/// `by`, `reason` and the store's now.
async fn resolve<S: Store>(
    store: &S,
    clock: &ManualClock,
    record: &Record,
    outcome: Outcome,
    by: &str,
    reason: &str,
) -> JournalEntry {
    let (resolved, status) = match &outcome {
        Outcome::Completed { result } => (Resolved::Completed, Some(result.status())),
        Outcome::NotExecuted => (Resolved::NotExecuted, None),
    };
    if resolved == Resolved::NotExecuted {
        // "Not executed" is accepted only once the attempt's lease is over.
        clock.set(clock.now().max(record.lease_until));
    }
    let resolution = Resolution::new(outcome, by, reason).unwrap();
    store
        .resolve(&record.id, record.token, resolution)
        .await
        .unwrap();
    JournalEntry {
        id: record.id.clone(),
        token: record.token,
        outcome: resolved,
        status,
        by: by.to_owned(),
        reason: reason.to_owned(),
        at: clock.now(),
        verb: None,
    }
}

/// The journal of `id`, which must be readable.
async fn journal<S: Store>(store: &S, id: &RecordId) -> Vec<JournalEntry> {
    store.resolutions(id).await.unwrap()
}

/// Resolving as not executed removes the record, but the journal keeps who
/// resolved it, why (byte for byte, NUL included), when (the store's now)
/// and which attempt's token.
pub async fn resolve_not_executed_is_journaled<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("journal-not-executed");
    let before = ambiguous(&*store, &clock, &id, fp(1)).await;
    assert_eq!(journal(&*store, &id).await, [], "no resolution yet");
    clock.advance_millis(7_000);
    let reason = "lookup: 404 \u{0} not found";
    let outcome = Outcome::NotExecuted;
    let entry = resolve(&*store, &clock, &before, outcome, "reconciler", reason).await;
    assert_eq!(
        store.get(&id).await.unwrap(),
        None,
        "the record is released"
    );
    assert_eq!(journal(&*store, &id).await, [entry], "the journal keeps it");
}

/// Resolving as completed journals the result's status alongside the
/// record's own resolution.
pub async fn resolve_completed_is_journaled<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let id = key("journal-completed");
    let before = ambiguous(&*store, &clock, &id, fp(1)).await;
    clock.advance_millis(3_000);
    let outcome = Outcome::Completed { result: result(4) };
    let entry = resolve(&*store, &clock, &before, outcome, "operator:bob", "settled").await;
    assert_eq!(entry.status, Some(204));
    assert_eq!(journal(&*store, &id).await, [entry]);
}

/// Two ambiguity episodes of one key, resolved one after the other: two
/// entries, oldest first, each with its own attempt's token; neither the
/// purge of the completed record nor its deletion past the tombstone
/// horizon touches them.
pub async fn journal_keeps_every_episode_oldest_first<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("journal-episodes");
    let first = ambiguous(&*store, &clock, &id, fp(1)).await;
    clock.advance_millis(1_000);
    let released = resolve(&*store, &clock, &first, Outcome::NotExecuted, "rec", "404").await;
    let second = ambiguous(&*store, &clock, &id, fp(1)).await;
    assert!(second.token > first.token, "a new attempt, a new token");
    clock.advance_millis(1_000);
    let outcome = Outcome::Completed { result: result(1) };
    let done = resolve(&*store, &clock, &second, outcome, "op", "found").await;
    let expect = [released, done];
    assert_eq!(journal(&*store, &id).await, expect, "oldest first");
    clock.advance_millis(RETENTION_MS);
    assert_eq!(store.purge(100).await.unwrap().tombstoned, 1);
    clock.advance_millis(TOMBSTONE_MS);
    assert_eq!(store.purge(100).await.unwrap().deleted, 1);
    assert_eq!(store.get(&id).await.unwrap(), None);
    assert_eq!(journal(&*store, &id).await, expect, "the purge keeps them");
}

/// The journal keeps the newest `JOURNAL_PER_RECORD_MAX` entries of a
/// record, dropping the oldest.
pub async fn journal_is_bounded_per_record<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let id = key("journal-bounded");
    let mut expect = Vec::new();
    for n in 0..JOURNAL_PER_RECORD_MAX + 2 {
        let record = ambiguous(&*store, &clock, &id, fp(1)).await;
        let reason = format!("episode {n}");
        let entry = resolve(&*store, &clock, &record, Outcome::NotExecuted, "r", &reason).await;
        expect.push(entry);
        clock.advance_millis(1);
    }
    let kept = journal(&*store, &id).await;
    assert_eq!(kept, expect[2..], "the newest {JOURNAL_PER_RECORD_MAX}");
}

/// A refused resolve (no record, not ambiguous, a text over its limit)
/// appends nothing.
pub async fn refused_resolve_journals_nothing<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let (missing, running, done) = (key("missing"), key("running"), key("done"));
    let too_long = key("too-long");
    in_progress(&*store, &clock, &running, fp(1)).await;
    completed(&*store, &clock, &done, fp(1), 1).await;
    ambiguous(&*store, &clock, &too_long, fp(1)).await;
    let token = |id: &RecordId| {
        let store = Arc::clone(&store);
        let id = id.clone();
        async move { store.get(&id).await.unwrap().map_or(Token(1), |r| r.token) }
    };
    for id in [&missing, &running, &done] {
        let resolution = Resolution::new(Outcome::NotExecuted, "op", "no").unwrap();
        assert!(
            store
                .resolve(id, token(id).await, resolution)
                .await
                .is_err(),
            "{id} resolved"
        );
    }
    let mut long = Resolution::new(Outcome::NotExecuted, "op", "").unwrap();
    long.reason = "x".repeat(RESOLUTION_TEXT_BYTES_MAX + 1);
    let too_long_token = token(&too_long).await;
    assert!(
        store
            .resolve(&too_long, too_long_token, long)
            .await
            .is_err()
    );
    for id in [&missing, &running, &done, &too_long] {
        assert_eq!(journal(&*store, id).await, [], "{id} journaled a refusal");
    }
}

/// The same key in two scopes keeps two journals.
pub async fn journal_scopes_isolate<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let a = id("POST /payouts|tenant-a", "payout-9");
    let b = id("POST /payouts|tenant-b", "payout-9");
    let in_a = ambiguous(&*store, &clock, &a, fp(1)).await;
    let in_b = ambiguous(&*store, &clock, &b, fp(2)).await;
    let entry_a = resolve(&*store, &clock, &in_a, Outcome::NotExecuted, "x", "a").await;
    assert_eq!(journal(&*store, &b).await, [], "b sees a's resolution");
    let outcome = Outcome::Completed { result: result(2) };
    let entry_b = resolve(&*store, &clock, &in_b, outcome, "y", "b").await;
    assert_eq!(journal(&*store, &a).await, [entry_a]);
    assert_eq!(journal(&*store, &b).await, [entry_b]);
    acquire(&*store, &clock, &request(&a, fp(3))).await;
    assert_eq!(journal(&*store, &b).await.len(), 1, "a new claim in a");
}

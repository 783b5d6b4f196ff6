//! Purge: storage hygiene that must never change an answer. Results are
//! dropped only past retention, tombstones deleted only past their horizon,
//! unresolved records kept forever, and every call bounded by its limit.

use std::sync::Arc;

use idem_core::{Claim, Clock, ListQuery, ManualClock, PurgeReport, Record, State, Store};

use super::support::{
    LEASE_MS, RETENTION_MS, TOMBSTONE_MS, after, ambiguous, completed, fp, in_progress, key,
    request, stored,
};

/// Before `expires_at` a purge changes nothing, however often it runs.
pub async fn purge_before_retention_does_nothing<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("fresh");
    let done = completed(&*store, &clock, &id, fp(1), 1).await;
    let completed_at = done.completed_at.unwrap();
    for wait_ms in [0, 1, RETENTION_MS - 1] {
        clock.set(after(completed_at, wait_ms));
        assert_eq!(store.purge(100).await, Ok(report(0, 0)), "{wait_ms} ms in");
        assert_eq!(stored(&*store, &id).await, done, "{wait_ms} ms in");
    }
}

/// At `expires_at` a purge tombstones the record: result dropped, state
/// `tombstone`, everything else (fingerprint, completion time, horizons)
/// kept; claims still say `Expired` and a second purge does nothing.
pub async fn purge_tombstones_after_retention<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("retained");
    let done = completed(&*store, &clock, &id, fp(1), 1).await;
    let completed_at = done.completed_at.unwrap();
    clock.set(after(completed_at, RETENTION_MS));
    assert_eq!(store.purge(100).await, Ok(report(1, 0)));
    let tombstone = Record {
        state: State::Tombstone,
        result: None,
        ..done
    };
    assert_eq!(stored(&*store, &id).await, tombstone);
    let expired = Claim::Expired {
        completed_at: Some(completed_at),
        tombstone_until: Some(after(completed_at, TOMBSTONE_MS)),
    };
    for fingerprint in [fp(1), fp(2)] {
        let claim = store.claim(&request(&id, fingerprint)).await;
        assert_eq!(claim, Ok(expired.clone()), "fingerprint {fingerprint}");
    }
    assert_eq!(store.purge(100).await, Ok(report(0, 0)), "purged twice");
    let listed = store.list(&ListQuery::default()).await.unwrap().records;
    assert_eq!(listed, [tombstone]);
}

/// At `tombstone_until` (not a millisecond before) a purge deletes the
/// record, whether an earlier purge tombstoned it or none ran.
pub async fn purge_deletes_after_tombstone_horizon<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let never = key("never-tombstoned");
    let done = completed(&*store, &clock, &never, fp(1), 1).await;
    let completed_at = done.completed_at.unwrap();
    clock.set(after(completed_at, TOMBSTONE_MS));
    assert_eq!(
        store.purge(100).await,
        Ok(report(0, 1)),
        "straight to deletion"
    );
    assert_eq!(store.get(&never).await.unwrap(), None);

    let id = key("tombstoned");
    let done = completed(&*store, &clock, &id, fp(1), 1).await;
    let completed_at = done.completed_at.unwrap();
    clock.set(after(completed_at, RETENTION_MS));
    assert_eq!(store.purge(100).await, Ok(report(1, 0)));
    clock.set(after(completed_at, TOMBSTONE_MS - 1));
    assert_eq!(store.purge(100).await, Ok(report(0, 0)), "1 ms early");
    assert_eq!(stored(&*store, &id).await.state, State::Tombstone);
    clock.set(after(completed_at, TOMBSTONE_MS));
    assert_eq!(store.purge(100).await, Ok(report(0, 1)), "at the horizon");
    assert_eq!(store.get(&id).await.unwrap(), None);
}

/// `in_progress` and `ambiguous` records are never purged, however old: an
/// unknown outcome must end resolved, not forgotten.
pub async fn purge_spares_unresolved_records<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let running = in_progress(&*store, &clock, &key("in-progress"), fp(1)).await;
    let marked = ambiguous(&*store, &clock, &key("ambiguous"), fp(1)).await;
    let stale_id = key("expired-lease");
    let stale = in_progress(&*store, &clock, &stale_id, fp(1)).await;
    completed(&*store, &clock, &key("completed"), fp(1), 1).await;
    clock.advance_millis(LEASE_MS);
    let claim = store.claim(&request(&stale_id, fp(1))).await;
    assert_eq!(claim, Ok(Claim::OutcomeUnknown { newly_marked: true }));
    let stale = Record {
        state: State::Ambiguous,
        ..stale
    };
    // Far past every horizon: only the completed record goes.
    clock.advance_millis(100 * TOMBSTONE_MS);
    assert_eq!(store.purge(100).await, Ok(report(0, 1)));
    for kept in [running, marked, stale] {
        assert_eq!(stored(&*store, &kept.id).await, kept, "{} kept", kept.id);
    }
    assert_eq!(store.purge(100).await, Ok(report(0, 0)));
}

/// A purge handles at most `limit` records per call; repeated calls finish
/// the work.
pub async fn purge_honours_limit<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let start = clock.now();
    for k in 0..5 {
        completed(&*store, &clock, &key(&format!("bulk-{k}")), fp(1), 1).await;
    }
    clock.set(after(start, RETENTION_MS));
    let tombstoning = [report(2, 0), report(2, 0), report(1, 0), report(0, 0)];
    for (call, expect) in tombstoning.into_iter().enumerate() {
        assert_eq!(store.purge(2).await, Ok(expect), "tombstoning call {call}");
    }
    let tombstones = ListQuery {
        state: Some(State::Tombstone),
        ..ListQuery::default()
    };
    assert_eq!(store.list(&tombstones).await.unwrap().records.len(), 5);
    clock.set(after(start, TOMBSTONE_MS));
    let deleting = [report(0, 3), report(0, 2), report(0, 0)];
    for (call, expect) in deleting.into_iter().enumerate() {
        assert_eq!(store.purge(3).await, Ok(expect), "deleting call {call}");
    }
    assert_eq!(
        store.list(&ListQuery::default()).await.unwrap().records,
        Vec::new()
    );
}

fn report(tombstoned: u64, deleted: u64) -> PurgeReport {
    PurgeReport {
        tombstoned,
        deleted,
        damaged: 0,
    }
}

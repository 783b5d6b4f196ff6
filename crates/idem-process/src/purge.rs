//! The retention purge: every `purge_interval_s`, turn completed records
//! past retention into tombstones and delete tombstones past their horizon.
//! Correctness never depends on it (expiry is decided at claim time); it
//! keeps the store from growing without bound.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{PurgeReport, Store};
use idem_http::Metrics;
use tokio::sync::watch;

/// Records changed by one purge call. Small, so that claims queued behind
/// it wait little: `idem-bench purge` measured claim p99 during the purge
/// of a million records at 1.77x its p99 without it with 100, 2.4x with
/// 250 and 5.2x with 1000 (the embedded store's writer runs one call at a
/// time between claims).
pub const PURGE_BATCH: usize = 100;
/// Purge calls in one run at most (100,000 records): a store far behind
/// catches up over several runs instead of holding the writer for one
/// long stretch.
pub const PURGE_BATCHES_MAX: usize = 1000;

/// Purges every `interval` until `stop` turns true (or its sender is gone).
pub async fn run(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        purge_once(store.as_ref(), &metrics, &stop).await;
    }
}

/// One run: purge calls of [`PURGE_BATCH`] until one changes fewer, at most
/// [`PURGE_BATCHES_MAX`] of them, stopping early on shutdown or an error.
pub(crate) async fn purge_once(
    store: &dyn Store,
    metrics: &Metrics,
    stop: &watch::Receiver<bool>,
) -> PurgeReport {
    let mut total = PurgeReport::default();
    for _ in 0..PURGE_BATCHES_MAX {
        match store.purge(PURGE_BATCH).await {
            Ok(report) => {
                metrics.purged(&report);
                total.tombstoned += report.tombstoned;
                total.deleted += report.deleted;
                total.damaged += report.damaged;
                if report.tombstoned + report.deleted < PURGE_BATCH as u64 {
                    break;
                }
            }
            Err(e) => {
                metrics.store_error();
                tracing::warn!(error = %e, "retention purge failed; the next run tries again");
                break;
            }
        }
        if *stop.borrow() {
            break;
        }
    }
    if total.damaged > 0 {
        tracing::error!(
            damaged = total.damaged,
            "retention purge: stored records that cannot be read were left alone; \
             `idem records list` names them"
        );
    }
    if total.tombstoned + total.deleted > 0 {
        tracing::info!(
            tombstoned = total.tombstoned,
            deleted = total.deleted,
            "retention purge: dropped results past retention and tombstones past their horizon"
        );
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{
        Claim, ClaimRequest, Fingerprint, IdempotencyKey, LeaseExpiry, ManualClock, MemoryStore,
        Policy, RecordId, Scope, State, StoredResult, Timestamp,
    };

    #[tokio::test]
    async fn purges_in_batches_until_caught_up_and_counts() {
        let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
        let store = MemoryStore::new(Arc::new(clock.clone()));
        let policy = Policy::new(30_000, 1, 10, LeaseExpiry::Reconcile).unwrap();
        let completed = PURGE_BATCH + 5;
        for i in 0..completed {
            let req = ClaimRequest {
                id: RecordId {
                    scope: Scope::new("POST /payouts|anonymous").unwrap(),
                    key: IdempotencyKey::parse(&format!("k-{i:05}")).unwrap(),
                },
                fingerprint: Fingerprint::from_bytes([1; 32]),
                legacy_fingerprint: None,
                owner: "test".into(),
                region: None,
                policy,
            };
            let Claim::Acquired { token, .. } = store.claim(&req).await.unwrap() else {
                panic!("a fresh key is acquired");
            };
            let result = StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
            store.complete(&req.id, token, result).await.unwrap();
        }
        let metrics = Metrics::new();
        let (_tx, stop) = watch::channel(false);
        let nothing = purge_once(&store, &metrics, &stop).await;
        assert_eq!(nothing, PurgeReport::default(), "within retention");

        clock.advance_millis(1_000);
        let report = purge_once(&store, &metrics, &stop).await;
        assert_eq!(
            report.tombstoned, completed as u64,
            "two batches in one run"
        );
        let listed = store
            .list(&idem_core::ListQuery {
                state: Some(State::Tombstone),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(listed.records.iter().all(|r| r.result.is_none()));

        clock.advance_millis(10_000);
        let report = purge_once(&store, &metrics, &stop).await;
        assert_eq!(report.deleted, completed as u64);
        let text = metrics.render();
        assert!(text.contains(&format!(
            "idem_purged_total{{what=\"tombstoned\"}} {completed}\n"
        )));
        assert!(text.contains(&format!(
            "idem_purged_total{{what=\"deleted\"}} {completed}\n"
        )));
    }
}

//! `RunOnce::run_within`: a caller that will be stopped sooner than the
//! policy's lease (a function invocation near its deadline) leaves a
//! record whose lease is no longer than it could have run.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::Arc;

use idem_core::{
    Clock, CompletionTable, Dedup, Fingerprint, IdempotencyKey, LEASE_MS_MIN, LeaseExpiry,
    ManualClock, Policy, RecordId, Scope, State, Store, Timestamp,
};
use idem_message::{Intent, Outcome, Reply, RetryReason, RunOnce};
use idem_sqlite::{SqliteOptions, SqliteStore};

const POLICY_LEASE_MS: u64 = 30_000;

/// The stored lease (from the claim's instant) for each cap: the cap when
/// shorter than the policy's, the policy's when longer, and never less
/// than the shortest lease a policy accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_the_shorter_of_the_policy_and_the_cap() {
    let cases = [
        (2_000, 2_000),
        (60_000, POLICY_LEASE_MS),
        (POLICY_LEASE_MS, POLICY_LEASE_MS),
        (10, LEASE_MS_MIN),
        (0, LEASE_MS_MIN),
    ];
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let store = Arc::new(
        SqliteStore::open_with_clock(
            dir.path().join("idem.db"),
            SqliteOptions::default(),
            Arc::new(clock.clone()),
        )
        .unwrap(),
    );
    let policy = Policy::new(POLICY_LEASE_MS, 3_600, 7_200, LeaseExpiry::Reconcile).unwrap();
    let runner = RunOnce::new(
        store.clone(),
        policy,
        CompletionTable::new([], Dedup::Idem).unwrap(),
    );
    let scope = Scope::from_parts("payouts", "ledger", None).unwrap();
    for (cap_ms, lease_ms) in cases {
        let id = RecordId {
            scope: scope.clone(),
            key: IdempotencyKey::new(format!("cap-{cap_ms}")).unwrap(),
        };
        let intent = Intent::new(
            id.scope.clone(),
            id.key.clone(),
            Fingerprint::from_bytes([7; 32]),
        );
        let claimed_at = clock.now();
        // The effect reads the record while it holds it: the lease the
        // store wrote, as a stopped invocation would leave it.
        let (outcome, seen) = {
            let store = store.clone();
            let id = id.clone();
            let mut seen = None;
            let outcome = runner
                .run_within(&intent, cap_ms, |attempt| {
                    let seen = &mut seen;
                    async move {
                        let record = store.get(&id).await.unwrap().unwrap();
                        assert_eq!(record.state, State::InProgress);
                        assert_eq!(record.lease_until, attempt.lease_until);
                        *seen = Some(record.lease_until);
                        Ok(Reply::status(201))
                    }
                })
                .await;
            (outcome, seen)
        };
        // A claim answered too slowly for the shortest lease (a loaded
        // machine's fsync) is released unrun, and says what it was leased.
        if let Outcome::Retry {
            reason: RetryReason::LeaseSpent {
                lease_ms: granted, ..
            },
            ..
        } = outcome
        {
            assert_eq!(granted, lease_ms, "cap {cap_ms} ms");
            continue;
        }
        assert!(
            matches!(outcome, Outcome::Ack { .. }),
            "cap {cap_ms}: {outcome}"
        );
        let lease_until = seen.unwrap();
        assert_eq!(
            lease_until.as_millis() - claimed_at.as_millis(),
            lease_ms,
            "cap {cap_ms} ms"
        );
        // The policy itself is untouched: retention counts as configured.
        let done = store.get(&id).await.unwrap().unwrap();
        assert_eq!(done.retention_s, 3_600, "cap {cap_ms} ms");
    }
}

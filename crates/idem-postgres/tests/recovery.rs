//! A store outlives its connections: when the server ends every session
//! (as a restart or failover does), the store answers `Unavailable` (the
//! gateway fails closed) or succeeds, and succeeds again within seconds,
//! without being recreated. Killing only this test's sessions (found by
//! their `application_name`) keeps other tests' connections alive.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{Claim, Store, StoreError};
use idem_postgres::PgStore;
use support::{SchemaGuard, admin, request, unique, url};

/// How long the store may take to answer again after its sessions died.
const RECOVERY_MS_MAX: u128 = 5_000;

/// Ends every session named `application_name`; returns how many.
async fn kill_sessions(admin: &tokio_postgres::Client, application_name: &str) -> i64 {
    let row = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = $1 \
               AND pid <> pg_backend_pid()",
            &[&application_name],
        )
        .await
        .unwrap();
    row.get(0)
}

/// `n` claims at once on fresh keys, so the pool opens several connections.
async fn claim_many(store: &Arc<PgStore>, round: &str, n: usize) -> Vec<Result<Claim, StoreError>> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = Arc::clone(store);
            let req = request(&format!("{round}-{i}"), 1, 30_000);
            tokio::spawn(async move { store.claim(&req).await })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pool_recovers_after_the_server_ends_its_sessions() {
    let schema = SchemaGuard::new();
    let application_name = unique("idem_recovery");
    let separator = if url().contains('?') { '&' } else { '?' };
    let store_url = format!("{}{separator}application_name={application_name}", url());
    let store = Arc::new(
        PgStore::connect(&store_url, schema.options(None))
            .await
            .unwrap(),
    );
    let admin = admin().await;

    for claim in claim_many(&store, "before", 8).await {
        assert!(matches!(claim, Ok(Claim::Acquired { .. })), "{claim:?}");
    }
    let killed = kill_sessions(&admin, &application_name).await;
    assert!(
        killed >= 2,
        "the pool held several sessions, {killed} killed"
    );

    let started = Instant::now();
    let mut failures = Vec::new();
    for attempt in 0.. {
        let claims = claim_many(&store, &format!("after-{attempt}"), 8).await;
        let (ok, failed): (Vec<_>, Vec<_>) = claims.into_iter().partition(Result::is_ok);
        for e in failed.into_iter().filter_map(Result::err) {
            assert!(
                matches!(e, StoreError::Unavailable { .. }),
                "a lost connection is Unavailable, got {e:?}"
            );
            failures.push(e.to_string());
        }
        if ok.len() == 8 {
            break;
        }
        assert!(
            started.elapsed().as_millis() < RECOVERY_MS_MAX,
            "still failing after {:?}: {failures:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let req = request("before-0", 1, 30_000);
    assert!(
        matches!(store.claim(&req).await, Ok(Claim::InFlight { .. })),
        "records written before the sessions died are still there"
    );
    assert!(
        kill_sessions(&admin, &application_name).await >= 1,
        "the store reconnected with its own sessions"
    );
}

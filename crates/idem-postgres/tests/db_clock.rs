//! What the database's clock and the shared sequence promise across nodes:
//! two stores with no injected clock judge one lease alike and by the
//! database's time; tokens increase whichever node hands them out; and the
//! one-statement fast path stores exactly the record the shared decision
//! builds, with an injected clock and with the database's.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::time::Duration;

use idem_core::decision::{self, Write};
use idem_core::{
    Claim, ClaimRequest, Clock, LeaseExpiry, ManualClock, Policy, Store, Timestamp, Token,
};
use idem_postgres::PgStore;
use support::{SchemaGuard, admin, request};

/// The database's clock, as the store reads it, in milliseconds.
async fn db_now(admin: &tokio_postgres::Client) -> Timestamp {
    let row = admin
        .query_one(
            "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await
        .unwrap();
    Timestamp::from_millis(u64::try_from(row.get::<_, i64>(0)).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_the_database_clock_agree() {
    let schema = SchemaGuard::new();
    let (a, b) = (schema.store(None).await, schema.store(None).await);
    let admin = admin().await;
    let req = request("agree", 1, 30_000);

    let before = db_now(&admin).await;
    let Claim::Acquired {
        lease_until,
        took_over: None,
        ..
    } = a.claim(&req).await.unwrap()
    else {
        panic!("node a acquires a fresh key");
    };
    let after = db_now(&admin).await;
    let created_at = a.get(&req.id).await.unwrap().unwrap().created_at;
    assert!(
        before <= created_at && created_at <= after,
        "created at the database's now: {before:?} <= {created_at:?} <= {after:?}"
    );
    assert_eq!(lease_until, created_at.plus_millis(30_000));

    let Claim::InFlight {
        lease_until: seen,
        retry_after_ms,
    } = b.claim(&req).await.unwrap()
    else {
        panic!("node b sees node a's attempt in flight");
    };
    let now = db_now(&admin).await;
    assert_eq!(seen, lease_until, "both nodes see one lease");
    assert!(
        retry_after_ms <= 30_000 && retry_after_ms >= now.millis_until(lease_until),
        "retry after {retry_after_ms} ms, judged by the database's clock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_judged_by_the_database_clock() {
    let schema = SchemaGuard::new();
    let (a, b) = (schema.store(None).await, schema.store(None).await);
    let req = request("short-lease", 1, 100);
    assert!(matches!(
        a.claim(&req).await.unwrap(),
        Claim::Acquired { .. }
    ));
    // The database's clock cannot be injected: let 100 ms of it pass.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        b.claim(&req).await.unwrap(),
        Claim::OutcomeUnknown { newly_marked: true },
        "node b finds the lease expired and reconciles"
    );
    assert_eq!(
        a.claim(&req).await.unwrap(),
        Claim::OutcomeUnknown {
            newly_marked: false
        },
        "node a agrees"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_nodes_releases_and_takeovers() {
    let schema = SchemaGuard::new();
    let (a, b) = (schema.store(None).await, schema.store(None).await);
    let takeover = ClaimRequest {
        policy: Policy::new(100, 60, 3_600, LeaseExpiry::Takeover).unwrap(),
        ..request("taken-over", 1, 100)
    };
    let mut tokens = Vec::new();
    for round in 0..4 {
        let node: &PgStore = if round % 2 == 0 { &a } else { &b };
        let req = request(&format!("k{round}"), 1, 30_000);
        let Claim::Acquired { token, .. } = node.claim(&req).await.unwrap() else {
            panic!("round {round} acquires");
        };
        tokens.push(token);
        node.release(&req.id, token).await.unwrap();
        let Claim::Acquired { token, .. } = node.claim(&req).await.unwrap() else {
            panic!("round {round} acquires again after the release");
        };
        tokens.push(token);
    }
    let Claim::Acquired { token: first, .. } = a.claim(&takeover).await.unwrap() else {
        panic!("takeover key acquires");
    };
    // The database's clock cannot be injected: let the 100 ms lease pass.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let Claim::Acquired {
        token, took_over, ..
    } = b.claim(&takeover).await.unwrap()
    else {
        panic!("node b takes over the expired lease");
    };
    assert_eq!(took_over, Some(first));
    tokens.extend([first, token]);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens increase: {tokens:?}"
    );
}

/// The fast path writes its record in SQL; this checks it against the
/// record `decision::claim(None, …)` builds for the same request, token
/// and time, field by field, for a few policies, with an injected clock
/// and with the database's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_path_stores_exactly_the_decisions_record() {
    let schema = SchemaGuard::new();
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_123));
    let injected = schema.store(Some(clock.clone())).await;
    let database = schema.store(None).await;
    let policies = [
        Policy::DEFAULT,
        Policy::new(100, 1, 2, LeaseExpiry::Takeover).unwrap(),
        Policy::new(
            86_400_000,
            3_650 * 86_400,
            3_660 * 86_400,
            LeaseExpiry::Reconcile,
        )
        .unwrap(),
    ];
    let stores: [(&str, &PgStore, bool); 2] = [
        ("injected", &injected, true),
        ("database", &database, false),
    ];
    for (n, policy) in policies.into_iter().enumerate() {
        for (clock_name, store, is_injected) in stores {
            let req = ClaimRequest {
                policy,
                owner: format!("owner-é-{n}"),
                region: None,
                ..request(&format!("fast-{clock_name}-{n}"), 3, 100)
            };
            let claim = store.claim(&req).await.unwrap();
            let stored = store.get(&req.id).await.unwrap().unwrap();
            let now = if is_injected {
                clock.now()
            } else {
                stored.created_at
            };
            let (expect_claim, expect_write) = decision::claim(None, &req, now, || stored.token);
            let case = format!("{clock_name} clock, policy {n}");
            assert_eq!(claim, expect_claim, "{case}: the answer");
            assert_eq!(
                expect_write,
                Write::Put(stored.clone()),
                "{case}: the record"
            );
            assert!(stored.token > Token(0), "{case}: a token from the sequence");
        }
    }
    // At the end of time the lease saturates, in SQL as in the decision.
    clock.set(Timestamp::from_millis(Timestamp::MAX.as_millis() - 50));
    let req = request("fast-end-of-time", 3, 100);
    let claim = injected.claim(&req).await.unwrap();
    let stored = injected.get(&req.id).await.unwrap().unwrap();
    assert_eq!(stored.lease_until, Timestamp::MAX);
    let expect = decision::claim(None, &req, clock.now(), || stored.token);
    assert_eq!((claim, Write::Put(stored)), expect, "end of time");
}

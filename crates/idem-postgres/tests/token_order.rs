//! What PostgreSQL's fencing tokens promise, shown on the real server:
//! every token is handed out once (one sequence), so fencing by equality
//! holds; but per key, a later acquisition can hold a smaller token than
//! an earlier one, because the fast path takes its token from the sequence
//! before it knows whether the key is free. docs/stores.md says so.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::time::Duration;

use idem_core::{Claim, State, Store, StoreError, StoredResult, Token};
use support::{SchemaGuard, admin, request};

/// How long the test waits for the second connection to block, at most.
const BLOCKED_WAIT_MS_MAX: u64 = 10_000;

/// Connection A claims key k in its own transaction (token a), so that B's
/// fast-path claim of k, on another connection, takes its token b from
/// the sequence and then waits for A. Meanwhile A removes its record,
/// claims k again (token c > b, from the sequence after B) and removes
/// that record too, then commits: attempts a and c were acquired and are
/// gone. B then acquires k with b < c: later, yet smaller. Every token is
/// distinct, and c, presented to the record B holds, is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_acquisition_may_hold_a_smaller_token_but_never_an_equal_one() {
    let schema = SchemaGuard::new();
    let store = std::sync::Arc::new(schema.store(None).await);
    let req = request("k-order", 1, 30_000);
    let (s, admin) = (schema.name().to_owned(), admin().await);
    let remove = format!("DELETE FROM {s}.records WHERE scope = $1 AND key = $2");
    let (scope, key) = (req.id.scope.as_str(), req.id.key.as_str());

    let mut a_conn = store.client().await.unwrap();
    let a_pid: i32 = a_conn
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let a_tx = a_conn.transaction().await.unwrap();
    let a = acquired(store.claim_in(&a_tx, &req).await);

    let (claimer, b_req) = (std::sync::Arc::clone(&store), req.clone());
    let b_task = tokio::spawn(async move { claimer.claim(&b_req).await });
    blocked_by(&admin, a_pid).await;

    a_tx.execute(&remove, &[&scope, &key]).await.unwrap();
    let c = acquired(store.claim_in(&a_tx, &req).await);
    a_tx.execute(&remove, &[&scope, &key]).await.unwrap();
    a_tx.commit().await.unwrap();

    let b = acquired(b_task.await.unwrap());
    assert!(
        a < c,
        "A's tokens, on one connection, increase: {a} then {c}"
    );
    assert!(
        b < c,
        "B acquired last with a smaller token: b = {b}, c = {c}"
    );
    assert!(
        a != b && b != c,
        "tokens are never handed out twice: {a} {b} {c}"
    );
    let record = store.get(&req.id).await.unwrap().unwrap();
    assert_eq!((record.state, record.token), (State::InProgress, b));

    let result = StoredResult::new(200, vec![], b"late".to_vec()).unwrap();
    for stale in [a, c] {
        let got = store.complete(&req.id, stale, result.clone()).await;
        let expect = StoreError::Fenced {
            id: req.id.clone(),
            presented: stale,
            current: Some((b, State::InProgress)),
        };
        assert_eq!(
            got,
            Err(expect),
            "attempt {stale} cannot complete b's record"
        );
    }
    let done = store.complete(&req.id, b, result).await.unwrap();
    assert_eq!(done.state, State::Completed);
}

fn acquired(claim: Result<Claim, StoreError>) -> Token {
    match claim {
        Ok(Claim::Acquired { token, .. }) => token,
        other => panic!("the claim should acquire, got {other:?}"),
    }
}

/// Returns once some backend waits for a lock that backend `pid` holds.
async fn blocked_by(admin: &tokio_postgres::Client, pid: i32) {
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))";
    let deadline = tokio::time::Instant::now() + Duration::from_millis(BLOCKED_WAIT_MS_MAX);
    while tokio::time::Instant::now() < deadline {
        let waiting: i64 = admin.query_one(sql, &[&pid]).await.unwrap().get(0);
        if waiting > 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("no connection waited for backend {pid} within {BLOCKED_WAIT_MS_MAX} ms");
}

/// Two connections claiming and releasing one key as fast as they can:
/// whatever the interleaving, no two acquisitions ever hold the same token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_acquisitions_of_one_key_never_share_a_token() {
    const ROUNDS: usize = 200;
    let schema = SchemaGuard::new();
    let store = std::sync::Arc::new(schema.store(None).await);
    let req = request("k-race", 1, 30_000);
    let racers: Vec<_> = (0..2)
        .map(|_| {
            let (store, req) = (std::sync::Arc::clone(&store), req.clone());
            tokio::spawn(async move {
                let mut tokens = Vec::new();
                for _ in 0..ROUNDS {
                    if let Ok(Claim::Acquired { token, .. }) = store.claim(&req).await {
                        tokens.push(token);
                        store.release(&req.id, token).await.unwrap();
                    }
                }
                tokens
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for racer in racers {
        tokens.extend(racer.await.unwrap());
    }
    let distinct: std::collections::HashSet<Token> = tokens.iter().copied().collect();
    assert!(tokens.len() >= ROUNDS / 2, "{} acquisitions", tokens.len());
    assert_eq!(distinct.len(), tokens.len(), "a token was handed out twice");
}

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

/// A claim of a key that has a committed record draws no token: a drawn
/// token is a write (every 32nd is logged, and its commit then waits for
/// the disk), which a replay, a conflict or a retry must not cost. Shown
/// with the replay cache off, so that every claim reaches the server, one
/// at a time and many at once, with batches (the batch statement) and
/// without (the single-row fast path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_a_key_that_has_a_record_draws_no_token() {
    for batch_lanes in [idem_postgres::BATCH_LANES_DEFAULT, 0] {
        claims_of_existing_keys_draw_no_token(batch_lanes).await;
    }
}

async fn claims_of_existing_keys_draw_no_token(batch_lanes: usize) {
    let schema = SchemaGuard::new();
    let options = idem_postgres::PgOptions {
        replay_cache_bytes: 0,
        batch_lanes,
        ..schema.options(None)
    };
    let store = std::sync::Arc::new(
        idem_postgres::PgStore::connect(&support::url(), options)
            .await
            .unwrap(),
    );
    let (done, busy) = (request("k-done", 1, 30_000), request("k-busy", 1, 30_000));
    let Claim::Acquired { token, .. } = store.claim(&done).await.unwrap() else {
        panic!("a new key acquires");
    };
    let result = StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
    store.complete(&done.id, token, result).await.unwrap();
    assert!(matches!(
        store.claim(&busy).await.unwrap(),
        Claim::Acquired { .. }
    ));
    let admin = admin().await;
    let drawn = format!("SELECT last_value FROM {}.tokens", schema.name());
    let before: i64 = admin.query_one(&drawn, &[]).await.unwrap().get(0);

    for _ in 0..40 {
        assert!(matches!(
            store.claim(&done).await.unwrap(),
            Claim::Replay { .. }
        ));
        assert!(matches!(
            store.claim(&busy).await.unwrap(),
            Claim::InFlight { .. }
        ));
    }
    let many: Vec<_> = (0..64)
        .map(|i| {
            let store = std::sync::Arc::clone(&store);
            let req = if i % 2 == 0 {
                done.clone()
            } else {
                busy.clone()
            };
            tokio::spawn(async move { store.claim(&req).await.unwrap() })
        })
        .collect();
    for answer in many {
        assert!(matches!(
            answer.await.unwrap(),
            Claim::Replay { .. } | Claim::InFlight { .. }
        ));
    }
    let after: i64 = admin.query_one(&drawn, &[]).await.unwrap().get(0);
    assert_eq!(
        before, after,
        "tokens drawn by claims of existing keys ({batch_lanes} batch lanes)"
    );
}

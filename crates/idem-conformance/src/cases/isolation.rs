//! What keeps records apart: scopes never share a key, limits refuse what is
//! too large before anything is written, and concurrent claims on one key
//! acquire it exactly once.

use std::collections::HashSet;
use std::sync::Arc;

use idem_core::{
    Claim, ClaimRequest, Clock, LeaseExpiry, LimitError, ManualClock, OWNER_BYTES_MAX, State,
    Store, StoreError,
};
use tokio::sync::Barrier;

use super::support::{
    LEASE_MS, acquire, after, fp, id, key, owner_of, request, request_with, result, stored,
};

/// How many claims race in the concurrency cases.
const RACERS: usize = 64;

/// The same key in two scopes: two independent acquisitions, no cross
/// replay, no cross mismatch, no cross fencing.
pub async fn scopes_isolate_keys<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let a = id("POST /payouts|tenant-a", "payout-847");
    let b = id("POST /payouts|tenant-b", "payout-847");
    let c = id("POST /payouts|tenant-c", "payout-847");
    let ta = acquire(&*store, &clock, &request(&a, fp(1))).await;
    let tb = acquire(&*store, &clock, &request(&b, fp(1))).await;
    assert_ne!(ta, tb, "two scopes, two acquisitions");
    let cross = store.complete(&b, ta, result(1)).await;
    let fenced = StoreError::Fenced {
        id: b.clone(),
        presented: ta,
        current: Some((tb, State::InProgress)),
    };
    assert_eq!(cross, Err(fenced), "a's token completes b");
    store.complete(&a, ta, result(1)).await.unwrap();
    let lease_until = stored(&*store, &b).await.lease_until;
    let in_flight = Claim::InFlight {
        lease_until,
        retry_after_ms: clock.now().millis_until(lease_until),
    };
    assert_eq!(
        store.claim(&request(&b, fp(1))).await,
        Ok(in_flight),
        "b replays a"
    );
    acquire(&*store, &clock, &request(&c, fp(2))).await;
    store.complete(&b, tb, result(2)).await.unwrap();
    for (id, n) in [(&a, 1), (&b, 2)] {
        let claim = store.claim(&request(id, fp(1))).await.unwrap();
        let Claim::Replay { record } = claim else {
            panic!("{id} should replay, got {claim:?}");
        };
        assert_eq!(
            record.result,
            Some(result(n)),
            "{id} replays its own result"
        );
    }
}

/// An owner label over `OWNER_BYTES_MAX` bytes (counted in bytes, not
/// characters) is refused with `Limit` and nothing is written; exactly
/// `OWNER_BYTES_MAX` is accepted and kept.
pub async fn owner_over_limit_is_refused<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let refused = [
        owner_of(OWNER_BYTES_MAX + 1),
        "é".repeat(OWNER_BYTES_MAX.div_ceil(2)),
    ];
    for owner in refused {
        let id = key(&format!("owner-{}", owner.chars().count()));
        let req = request_with(&id, fp(1), LeaseExpiry::Reconcile, &owner);
        let expect = StoreError::Limit(LimitError::TextTooLong {
            field: "owner",
            bytes: owner.len(),
            max: OWNER_BYTES_MAX,
        });
        assert_eq!(
            store.claim(&req).await,
            Err(expect),
            "{} bytes",
            owner.len()
        );
        assert_eq!(store.get(&id).await.unwrap(), None, "nothing written");
    }
    let id = key("owner-max");
    let owner = owner_of(OWNER_BYTES_MAX);
    let req = request_with(&id, fp(1), LeaseExpiry::Reconcile, &owner);
    acquire(&*store, &clock, &req).await;
    assert_eq!(stored(&*store, &id).await.owner, owner);
}

/// 64 claims on one fresh key, released together: exactly one `Acquired`,
/// 63 `InFlight` on its lease, and the record holds the winner's token.
/// Repeated on a few keys so that a racy store is caught reliably.
pub async fn concurrent_claims_on_one_key_acquire_once<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    for round in 0..4 {
        let id = key(&format!("contended-{round}"));
        let req = request(&id, fp(1));
        let claims = race(&store, vec![req; RACERS]).await;
        let winners: Vec<&Claim> = claims
            .iter()
            .filter(|c| matches!(c, Claim::Acquired { .. }))
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: one winner in {claims:?}");
        let lease_until = after(clock.now(), LEASE_MS);
        let Claim::Acquired { token, .. } = winners[0] else {
            unreachable!("filtered above");
        };
        let winner = Claim::Acquired {
            token: *token,
            lease_until,
            lease_ms: LEASE_MS,
            took_over: None,
        };
        assert_eq!(*winners[0], winner, "round {round}");
        let loser = Claim::InFlight {
            lease_until,
            retry_after_ms: LEASE_MS,
        };
        let losers = claims.iter().filter(|c| **c == loser).count();
        assert_eq!(losers, RACERS - 1, "round {round}: {claims:?}");
        assert_eq!(stored(&*store, &id).await.token, *token, "round {round}");
    }
}

/// 64 claims on 64 fresh keys, released together: 64 `Acquired` with 64
/// distinct tokens, each stored on its own record.
pub async fn concurrent_claims_on_distinct_keys_all_acquire<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let reqs: Vec<ClaimRequest> = (0..RACERS)
        .map(|i| request(&key(&format!("parallel-{i:02}")), fp(1)))
        .collect();
    let claims = race(&store, reqs.clone()).await;
    let lease_until = after(clock.now(), LEASE_MS);
    let mut tokens = HashSet::new();
    for (req, claim) in reqs.iter().zip(claims) {
        let Claim::Acquired { token, .. } = claim else {
            panic!("{} should acquire, got {claim:?}", req.id);
        };
        let expect = Claim::Acquired {
            token,
            lease_until,
            lease_ms: LEASE_MS,
            took_over: None,
        };
        assert_eq!(claim, expect, "{}", req.id);
        assert_eq!(stored(&*store, &req.id).await.token, token, "{}", req.id);
        tokens.insert(token);
    }
    assert_eq!(tokens.len(), RACERS, "distinct tokens: {tokens:?}");
}

/// Runs one claim per request, each on its own task, all released at once
/// by a barrier; returns the claims in request order.
async fn race<S: Store + 'static>(store: &Arc<S>, reqs: Vec<ClaimRequest>) -> Vec<Claim> {
    let barrier = Arc::new(Barrier::new(reqs.len()));
    let tasks: Vec<_> = reqs
        .into_iter()
        .map(|req| {
            let (store, barrier) = (Arc::clone(store), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                store.claim(&req).await
            })
        })
        .collect();
    let mut claims = Vec::with_capacity(tasks.len());
    for task in tasks {
        claims.push(task.await.unwrap().unwrap());
    }
    claims
}

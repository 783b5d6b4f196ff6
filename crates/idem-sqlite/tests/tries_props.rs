//! Failed-lookup counts in SQLite answer like the memory store's, for any
//! sequence of claims, ambiguities, failed lookups about any attempt,
//! resolutions and clock moves over a few keys: the counting rule is one
//! pure function, and this checks that the SQLite rows apply it exactly
//! (including times up to the largest one a store can hold).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::Arc;

use idem_core::{
    ClaimRequest, Clock, Fingerprint, IdempotencyKey, LeaseExpiry, ManualClock, MemoryStore,
    Outcome, Policy, RecordId, Resolution, Scope, Store, StoredResult, Timestamp, Token,
};
use idem_sqlite::{SqliteOptions, SqliteStore};
use proptest::prelude::*;

/// Which attempt a failed lookup or a read is about, relative to the
/// record's current token.
#[derive(Clone, Copy, Debug)]
enum Attempt {
    Current,
    Earlier,
    Later,
}

#[derive(Clone, Debug)]
enum Op {
    Claim(usize),
    MarkAmbiguous(usize),
    Fail(usize, Attempt, u64),
    Resolve(usize, bool),
    Read(usize, Attempt),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    let attempt = prop_oneof![
        4 => Just(Attempt::Current),
        1 => Just(Attempt::Earlier),
        1 => Just(Attempt::Later),
    ];
    let offset_ms = prop_oneof![0..5_000u64, any::<u64>()];
    prop_oneof![
        1 => key.clone().prop_map(Op::Claim),
        1 => key.clone().prop_map(Op::MarkAmbiguous),
        3 => (key.clone(), attempt.clone(), offset_ms).prop_map(|(k, a, ms)| Op::Fail(k, a, ms)),
        1 => (key.clone(), any::<bool>()).prop_map(|(k, found)| Op::Resolve(k, found)),
        1 => (key, attempt).prop_map(|(k, a)| Op::Read(k, a)),
        1 => (0..3_000u64).prop_map(Op::Advance),
    ]
}

/// Keys in two scopes, so that one key's count never leaks to another's.
const KEYS: [(&str, &str); 3] = [
    ("POST /payouts|t1", "k1"),
    ("POST /payouts|t2", "k1"),
    ("POST /payouts|t1", "K1"),
];

fn id(k: usize) -> RecordId {
    RecordId {
        scope: Scope::new(KEYS[k].0).unwrap(),
        key: IdempotencyKey::parse(KEYS[k].1).unwrap(),
    }
}

fn request(k: usize) -> ClaimRequest {
    ClaimRequest {
        id: id(k),
        fingerprint: Fingerprint::from_bytes([1; 32]),
        legacy_fingerprint: None,
        owner: "node-1".to_owned(),
        region: None,
        policy: Policy::new(1_000, 60, 3_600, LeaseExpiry::Reconcile).unwrap(),
    }
}

/// The token `attempt` names for key `k`, from the memory store's record.
async fn token(store: &MemoryStore, k: usize, attempt: Attempt) -> Token {
    let current = store.get(&id(k)).await.unwrap().map_or(1, |r| r.token.0);
    match attempt {
        Attempt::Current => Token(current),
        Attempt::Earlier => Token(current.saturating_sub(1)),
        Attempt::Later => Token(current + 1),
    }
}

/// Applies `op` to `store`; the answer, as text, to compare.
async fn apply(store: &dyn Store, clock: &ManualClock, op: &Op, token: Token) -> String {
    match *op {
        Op::Claim(k) => format!("{:?}", store.claim(&request(k)).await),
        Op::MarkAmbiguous(k) => format!("{:?}", store.mark_ambiguous(&id(k), token).await),
        Op::Fail(k, _, offset_ms) => {
            let next_at = clock.now().plus_millis(offset_ms);
            format!(
                "{:?}",
                store.note_failed_lookup(&id(k), token, next_at).await
            )
        }
        Op::Resolve(k, found) => {
            let outcome = if found {
                let result = StoredResult::new(200, vec![], b"found".to_vec()).unwrap();
                Outcome::Completed { result }
            } else {
                Outcome::NotExecuted
            };
            let resolution = Resolution::new(outcome, "reconciler", "lookup").unwrap();
            format!("{:?}", store.resolve(&id(k), token, resolution).await)
        }
        Op::Read(k, _) => format!("{:?}", store.lookup_tries(&id(k), token).await),
        Op::Advance(ms) => {
            clock.advance_millis(ms);
            String::new()
        }
    }
}

fn attempt_of(op: &Op) -> Attempt {
    match op {
        Op::Fail(_, a, _) | Op::Read(_, a) => *a,
        _ => Attempt::Current,
    }
}

fn key_of(op: &Op) -> usize {
    match op {
        Op::Claim(k)
        | Op::MarkAmbiguous(k)
        | Op::Fail(k, _, _)
        | Op::Resolve(k, _)
        | Op::Read(k, _) => *k,
        Op::Advance(_) => 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn sqlite_counts_failed_lookups_like_memory(ops in proptest::collection::vec(op(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
            let dir = tempfile::tempdir().unwrap();
            let sqlite = SqliteStore::open_with_clock(
                dir.path().join("tries.db"),
                SqliteOptions::default(),
                Arc::new(clock.clone()),
            )
            .unwrap();
            let memory = MemoryStore::new(Arc::new(clock.clone()));
            for (n, op) in ops.iter().enumerate() {
                let token = token(&memory, key_of(op), attempt_of(op)).await;
                let expect = apply(&memory, &clock, op, token).await;
                if let Op::Advance(ms) = op {
                    // One clock for both: move it back, and forward once.
                    clock.set(Timestamp::from_millis(clock.now().as_millis() - ms));
                }
                let got = apply(&sqlite, &clock, op, token).await;
                assert_eq!(got, expect, "step {n}: {op:?} with token {token}");
                for k in 0..KEYS.len() {
                    let current = token_for(&memory, k).await;
                    let kept = memory.lookup_tries(&id(k), current).await;
                    assert_eq!(sqlite.lookup_tries(&id(k), current).await, kept, "step {n}, key {k}");
                }
            }
        });
    }
}

async fn token_for(store: &MemoryStore, k: usize) -> Token {
    token(store, k, Attempt::Current).await
}

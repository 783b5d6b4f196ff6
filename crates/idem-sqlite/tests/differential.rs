//! The SQLite store against the memory store: one seeded sequence of random
//! operations over a few keys, applied to both with the same manual clock;
//! every answer and the final contents must be equal. This is what "behaves
//! identically" means, checked beyond the cases anyone thought to write.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::Arc;

use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, LeaseExpiry, ListQuery, ManualClock,
    MemoryStore, Outcome, Policy, RecordId, Resolution, Scope, State, Store, StoredResult,
    Timestamp, Token,
};
use idem_sqlite::{SqliteOptions, SqliteStore};

/// A small deterministic generator, so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn ids() -> Vec<RecordId> {
    let mut ids = Vec::new();
    for scope in ["POST /a|t1", "POST /a|t2", "POST /b|t1"] {
        for key in ["k1", "k2", "K1", "k-3"] {
            ids.push(RecordId {
                scope: Scope::new(scope).unwrap(),
                key: IdempotencyKey::parse(key).unwrap(),
            });
        }
    }
    ids
}

fn result(n: u64) -> StoredResult {
    let headers = vec![
        ("content-type".to_owned(), "application/json".into()),
        ("x-n".to_owned(), n.to_string().into()),
    ];
    StoredResult::new(200 + (n % 3) as u16, headers, vec![n as u8, 0, 255]).unwrap()
}

async fn run(seed: u64, options: SqliteOptions) {
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let dir = tempfile::tempdir().unwrap();
    let sqlite =
        SqliteStore::open_with_clock(dir.path().join("d.db"), options, Arc::new(clock.clone()))
            .unwrap();
    let memory = MemoryStore::new(Arc::new(clock.clone()));
    let ids = ids();
    let policies = [
        Policy::new(1_000, 60, 3_600, LeaseExpiry::Reconcile).unwrap(),
        Policy::new(1_000, 60, 3_600, LeaseExpiry::Takeover).unwrap(),
    ];
    let mut rng = Rng(seed);
    let mut tokens: Vec<Token> = vec![Token(0)];
    for step in 0..1_500 {
        let id = &ids[rng.below(ids.len() as u64) as usize];
        let token = tokens[rng.below(tokens.len() as u64) as usize];
        let what = rng.below(12);
        let context = format!("seed {seed} step {step} op {what} on {id}");
        match what {
            0..=2 => {
                let req = ClaimRequest {
                    id: id.clone(),
                    fingerprint: Fingerprint::from_bytes([rng.below(2) as u8; 32]),
                    legacy_fingerprint: None,
                    owner: format!("node-{}", rng.below(3)),
                    region: None,
                    policy: policies[rng.below(2) as usize],
                };
                let (a, b) = (sqlite.claim(&req).await, memory.claim(&req).await);
                if let Ok(Claim::Acquired { token, .. }) = &b {
                    tokens.push(*token);
                }
                assert_eq!(a, b, "{context}");
            }
            3 | 4 => {
                let r = result(rng.next());
                let (a, b) = (
                    sqlite.complete(id, token, r.clone()).await,
                    memory.complete(id, token, r).await,
                );
                assert_eq!(a, b, "{context}");
            }
            5 => assert_eq!(
                sqlite.release(id, token).await,
                memory.release(id, token).await,
                "{context}"
            ),
            6 => assert_eq!(
                sqlite.mark_ambiguous(id, token).await,
                memory.mark_ambiguous(id, token).await,
                "{context}"
            ),
            7 => {
                let outcome = if rng.below(2) == 0 {
                    Outcome::NotExecuted
                } else {
                    Outcome::Completed {
                        result: result(rng.next()),
                    }
                };
                let res = Resolution::new(outcome, "operator", "checked the ledger").unwrap();
                assert_eq!(
                    sqlite.resolve(id, token, res.clone()).await,
                    memory.resolve(id, token, res).await,
                    "{context}"
                );
            }
            8 => {
                let limit = rng.below(4) as usize;
                assert_eq!(
                    sqlite.purge(limit).await,
                    memory.purge(limit).await,
                    "{context}"
                );
            }
            9 => {
                // From 1 ms (lease boundaries) to past the tombstone horizon.
                let ms = [1, 999, 1_000, 30_000, 60_000, 3_600_000][rng.below(6) as usize];
                clock.advance_millis(ms);
            }
            10 => assert_eq!(sqlite.get(id).await, memory.get(id).await, "{context}"),
            _ => {
                let states = [
                    None,
                    Some(State::InProgress),
                    Some(State::Completed),
                    Some(State::Ambiguous),
                    Some(State::Tombstone),
                ];
                let query = ListQuery {
                    state: states[rng.below(5) as usize],
                    after: (rng.below(2) == 0).then(|| id.into()),
                    limit: rng.below(4) as usize,
                };
                assert_eq!(
                    sqlite.list(&query).await,
                    memory.list(&query).await,
                    "{context} {query:?}"
                );
            }
        }
    }
    let all = ListQuery::default();
    assert_eq!(
        sqlite.list(&all).await,
        memory.list(&all).await,
        "seed {seed}: final contents"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_answers_like_memory_for_random_operations() {
    for seed in [1, 2, 3, 0x1de4] {
        run(seed, SqliteOptions::default()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_answers_like_memory_with_one_op_per_transaction() {
    for seed in [4, 5] {
        run(
            seed,
            SqliteOptions {
                batch_max: 1,
                ..SqliteOptions::default()
            },
        )
        .await;
    }
}

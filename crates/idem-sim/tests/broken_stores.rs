//! The checker has teeth: three deliberately broken stores, each wrapping the
//! real memory store, must be caught on the corrected contract.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use idem_core::{
    Claim, ClaimRequest, Clock, Fingerprint, JournalEntry, ListQuery, Listing, MemoryStore,
    PurgeReport, Record, RecordId, Resolution, State, Store, StoreFuture, StoreWrapper,
    StoredResult, Token,
};
use idem_sim::{Design, Summary, run_seeds, run_seeds_with_store};

const SEEDS: u64 = 100;

fn corrected() -> Design {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/payouts.toml");
    Design::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn check(summary: &Summary, invariant: &str) {
    assert!(
        summary.by_invariant.get(invariant).is_some_and(|n| *n > 0),
        "{invariant} not caught:\n{}",
        summary.render_table()
    );
    let v = summary.violations.iter().find(|v| v.invariant == invariant);
    let replay = v.map(|v| v.replay.clone()).unwrap_or_default();
    assert!(
        replay.starts_with("idem sim ") && replay.contains(" --seed "),
        "{replay}"
    );
}

#[test]
fn the_real_store_passes_the_same_seeds() {
    assert!(run_seeds(&corrected(), 0, SEEDS).passed());
}

#[test]
fn a_claim_that_is_not_atomic_is_caught() {
    let make = |clock: Arc<dyn Clock>| -> Arc<dyn Store> {
        Arc::new(NotAtomic {
            clock: clock.clone(),
            inner: MemoryStore::new(clock),
        })
    };
    check(&run_seeds_with_store(&corrected(), 0, SEEDS, &make), "I1");
}

#[test]
fn a_store_that_ignores_the_fingerprint_is_caught() {
    let make = |clock: Arc<dyn Clock>| -> Arc<dyn Store> {
        Arc::new(IgnoresFingerprint(MemoryStore::new(clock)))
    };
    check(&run_seeds_with_store(&corrected(), 0, SEEDS, &make), "I4");
}

#[test]
fn a_purge_before_retention_is_caught() {
    let make = |clock: Arc<dyn Clock>| -> Arc<dyn Store> {
        Arc::new(PurgesEarly {
            clock,
            inner: Mutex::new((Vec::new(), BTreeMap::new())),
        })
    };
    check(&run_seeds_with_store(&corrected(), 0, SEEDS, &make), "I1");
}

/// Reads, then acquires: a claim racing an in-flight attempt whose write it
/// did not see (modelled by clearing that attempt's record first).
struct NotAtomic {
    clock: Arc<dyn Clock>,
    inner: MemoryStore,
}

/// Binds every key to the same fingerprint, so a changed payload is replayed.
struct IgnoresFingerprint(MemoryStore);

/// Deletes completed records at every purge, however young. Each deletion
/// moves the key to a fresh memory store (the memory store has no raw delete).
struct PurgesEarly {
    clock: Arc<dyn Clock>,
    inner: Mutex<Generations>,
}

/// Every memory store made so far, and which one holds each key now.
type Generations = (Vec<Arc<MemoryStore>>, BTreeMap<RecordId, usize>);

impl PurgesEarly {
    fn store_for(&self, id: &RecordId) -> Arc<MemoryStore> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.is_empty() {
            g.0.push(Arc::new(MemoryStore::new(self.clock.clone())));
        }
        let at = g.1.get(id).copied().unwrap_or(0);
        g.0[at].clone()
    }
}

/// The operations `PurgesEarly` passes to the store that holds the key now.
macro_rules! delegate_rest {
    ($inner:expr) => {
        fn complete<'a>(
            &'a self,
            id: &'a RecordId,
            token: Token,
            result: StoredResult,
        ) -> StoreFuture<'a, Record> {
            Box::pin(async move { $inner(self, id).complete(id, token, result).await })
        }
        fn release<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, ()> {
            Box::pin(async move { $inner(self, id).release(id, token).await })
        }
        fn mark_ambiguous<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, Record> {
            Box::pin(async move { $inner(self, id).mark_ambiguous(id, token).await })
        }
        fn resolve<'a>(
            &'a self,
            id: &'a RecordId,
            token: Token,
            resolution: Resolution,
        ) -> StoreFuture<'a, Option<Record>> {
            Box::pin(async move { $inner(self, id).resolve(id, token, resolution).await })
        }
        fn apply_verb<'a>(
            &'a self,
            id: &'a RecordId,
            token: Token,
            request: idem_core::VerbRequest,
        ) -> StoreFuture<'a, Option<Record>> {
            Box::pin(async move { $inner(self, id).apply_verb(id, token, request).await })
        }
        fn note_failed_lookup<'a>(
            &'a self,
            id: &'a RecordId,
            token: Token,
            next_at: idem_core::Timestamp,
        ) -> StoreFuture<'a, idem_core::LookupTries> {
            Box::pin(async move {
                $inner(self, id)
                    .note_failed_lookup(id, token, next_at)
                    .await
            })
        }
        fn lookup_tries<'a>(
            &'a self,
            id: &'a RecordId,
            token: Token,
        ) -> StoreFuture<'a, Option<idem_core::LookupTries>> {
            Box::pin(async move { $inner(self, id).lookup_tries(id, token).await })
        }
        fn resolutions<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Vec<JournalEntry>> {
            Box::pin(async move { $inner(self, id).resolutions(id).await })
        }
        fn get<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Option<Record>> {
            Box::pin(async move { $inner(self, id).get(id).await })
        }
    };
}

impl StoreWrapper for NotAtomic {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, Claim> {
        Box::pin(async move {
            if let Some(r) = self.inner.get(&req.id).await?
                && r.state == State::InProgress
                && self.clock.now() < r.lease_until
            {
                self.inner.release(&req.id, r.token).await?;
            }
            self.inner.claim(req).await
        })
    }
}

impl StoreWrapper for IgnoresFingerprint {
    fn inner(&self) -> &dyn Store {
        &self.0
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, Claim> {
        Box::pin(async move {
            let mut blind = req.clone();
            blind.fingerprint = Fingerprint::from_bytes([0; 32]);
            self.0.claim(&blind).await
        })
    }
}

fn purges_inner(s: &PurgesEarly, id: &RecordId) -> Arc<MemoryStore> {
    s.store_for(id)
}

impl Store for PurgesEarly {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, Claim> {
        Box::pin(async move { self.store_for(&req.id).claim(req).await })
    }
    delegate_rest!(purges_inner);
    fn list<'a>(&'a self, query: &'a ListQuery) -> StoreFuture<'a, Listing> {
        Box::pin(async move {
            let (stores, current) = {
                let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                (g.0.clone(), g.1.clone())
            };
            let mut out = Vec::new();
            for (at, store) in stores.iter().enumerate() {
                for r in store.list(query).await?.records {
                    if current.get(&r.id).copied().unwrap_or(0) == at {
                        out.push(r);
                    }
                }
            }
            out.sort_by(|a, b| a.id.cmp(&b.id));
            Ok(Listing {
                records: out,
                ..Listing::default()
            })
        })
    }
    fn purge(&self, _limit: usize) -> StoreFuture<'_, PurgeReport> {
        Box::pin(async move {
            let completed = ListQuery {
                state: Some(State::Completed),
                ..ListQuery::default()
            };
            let ids: Vec<RecordId> = self
                .list(&completed)
                .await?
                .records
                .into_iter()
                .map(|r| r.id)
                .collect();
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            for id in &ids {
                g.0.push(Arc::new(MemoryStore::new(self.clock.clone())));
                let fresh = g.0.len() - 1;
                g.1.insert(id.clone(), fresh);
            }
            Ok(PurgeReport {
                tombstoned: 0,
                deleted: ids.len() as u64,
                damaged: 0,
            })
        })
    }
}

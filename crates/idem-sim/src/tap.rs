//! What the simulated world needs from the real reconciler besides its
//! effect on the store: which records it marked and resolved, so the world
//! can ship those writes to the other region and count them, and a provider
//! that answers from the bank's ledger.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use idem_core::{Accepted, RecordId, Resolution, Store, StoreWrapper, StoredResult, Token};
use idem_reconcile::{Finding, Provider, ProviderFuture};

use crate::rng::Rng;

/// A write the reconciler made that the store accepted.
pub(crate) enum Write {
    /// The lease sweep marked an expired attempt ambiguous.
    Marked(RecordId, Token),
    /// A lookup resolved the attempt.
    Resolved(RecordId, Token, Resolution),
    /// A lookup of the attempt failed and was counted.
    LookupFailed(RecordId, Token),
}

/// The reconciler's store: the region's store, with every accepted
/// `mark_ambiguous`, `resolve` and `note_failed_lookup` noted for the world
/// to pick up.
pub(crate) struct Tapped {
    inner: Arc<dyn Store>,
    writes: Mutex<Vec<Write>>,
}

impl Tapped {
    pub(crate) fn new(inner: Arc<dyn Store>) -> Tapped {
        Tapped {
            inner,
            writes: Mutex::new(Vec::new()),
        }
    }

    /// The writes noted since the last call, in the order they were made.
    pub(crate) fn take(&self) -> Vec<Write> {
        std::mem::take(&mut *lock(&self.writes))
    }
}

impl StoreWrapper for Tapped {
    const WATCHES_WRITES: bool = true;

    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn accepted(&self, write: Accepted<'_>) {
        let noted = match write {
            Accepted::MarkAmbiguous(id, token) => Write::Marked(id.clone(), token),
            Accepted::Resolve(id, token, resolution) => {
                Write::Resolved(id.clone(), token, resolution.clone())
            }
            Accepted::NoteFailedLookup(id, token) => Write::LookupFailed(id.clone(), token),
            Accepted::Claim(..)
            | Accepted::Complete(..)
            | Accepted::Release(..)
            | Accepted::Verb(..)
            | Accepted::NoteAmbiguity(..) => return,
        };
        lock(&self.writes).push(noted);
    }
}

/// The bank's lookup API: what it paid, by the key the gateway forwarded
/// (the record's key), failing now and then.
pub(crate) struct Bank {
    state: Mutex<Ledger>,
}

struct Ledger {
    /// The result of the latest effect of each key.
    paid: BTreeMap<RecordId, StoredResult>,
    failures: Rng,
    failure: f64,
}

impl Bank {
    /// A bank whose lookups fail with probability `failure`, drawn from
    /// its own stream of `seed`.
    pub(crate) fn new(seed: u64, failure: f64) -> Bank {
        Bank {
            state: Mutex::new(Ledger {
                paid: BTreeMap::new(),
                failures: Rng::new(seed, 3),
                failure,
            }),
        }
    }

    /// The bank paid `id`; a lookup now finds `result`.
    pub(crate) fn paid(&self, id: RecordId, result: StoredResult) {
        lock(&self.state).paid.insert(id, result);
    }
}

impl Provider for Bank {
    fn ask<'a>(&'a self, id: &'a RecordId) -> ProviderFuture<'a> {
        let mut ledger = lock(&self.state);
        let failure = ledger.failure;
        let finding = if ledger.failures.chance(failure) {
            Finding::Failed {
                reason: "bank lookup failed".into(),
            }
        } else {
            match ledger.paid.get(id) {
                Some(result) => Finding::Found {
                    result: result.clone(),
                    reason: "bank lookup found the payout".into(),
                },
                None => Finding::NotFound {
                    reason: "bank lookup found no payout".into(),
                },
            }
        };
        Box::pin(std::future::ready(finding))
    }
}

/// The world runs on one thread; a poisoned lock only means an earlier
/// panic, whose state is still the last one written.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

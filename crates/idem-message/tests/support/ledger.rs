//! A provider for the reconciler: the ledger of what each intent's effect
//! answered, looked up by key, as a payment provider would answer.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use idem_core::{RecordId, Store, StoredResult, SystemClock};
use idem_reconcile::{Finding, Provider, ProviderFuture, ReconcileSettings, Reconciler};

/// What each intent's effect answered, by key.
#[derive(Default)]
pub struct Ledger(pub Mutex<BTreeMap<RecordId, Vec<StoredResult>>>);

impl Ledger {
    /// How many effects the ledger holds, over every key.
    pub fn effects(&self) -> usize {
        self.0.lock().unwrap().values().map(Vec::len).sum()
    }

    /// Records one effect of `id` that answered `result`.
    pub fn pay(&self, id: RecordId, result: StoredResult) {
        self.0.lock().unwrap().entry(id).or_default().push(result);
    }
}

/// The real reconciler over `store`, asking `ledger` about the tests'
/// operation (`payouts`).
pub fn reconciler(store: Arc<dyn Store>, ledger: &Arc<Ledger>) -> Reconciler {
    let provider: Arc<dyn Provider> = ledger.clone();
    Reconciler::with_providers(
        store,
        vec![("payouts".into(), provider)],
        ReconcileSettings::default(),
        Arc::new(SystemClock),
    )
    .unwrap()
}

impl Provider for Ledger {
    fn ask<'a>(&'a self, id: &'a RecordId) -> ProviderFuture<'a> {
        let first = self
            .0
            .lock()
            .unwrap()
            .get(id)
            .and_then(|r| r.first().cloned());
        Box::pin(std::future::ready(match first {
            Some(result) => Finding::Found {
                result,
                reason: "the ledger has it".into(),
            },
            None => Finding::NotFound {
                reason: "the ledger has no such key".into(),
            },
        }))
    }
}

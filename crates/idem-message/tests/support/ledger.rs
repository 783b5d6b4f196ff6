//! A provider for the reconciler: the ledger of what each intent's effect
//! answered, looked up by key, as a payment provider would answer.

use std::collections::BTreeMap;
use std::sync::Mutex;

use idem_core::{RecordId, StoredResult};
use idem_reconcile::{Finding, Provider, ProviderFuture};

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

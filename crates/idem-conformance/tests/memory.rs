//! The conformance suite against the reference store, `MemoryStore`: if this
//! fails, the suite or the shared decision is wrong, not a backend.

use std::sync::Arc;

use idem_core::{ManualClock, MemoryStore};

/// A fresh memory store on the test's clock; nothing to keep alive.
async fn make_store(clock: ManualClock) -> (Arc<MemoryStore>, ()) {
    (Arc::new(MemoryStore::new(Arc::new(clock))), ())
}

idem_conformance::conformance_suite!(make_store);

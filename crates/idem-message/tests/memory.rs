//! The run-once scenarios against the memory store, the reference.

mod support;

use std::sync::Arc;

use idem_core::MemoryStore;
use support::{Harness, manual_clock};

async fn make() -> (Harness, ()) {
    let clock = manual_clock();
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    (Harness { store, clock }, ())
}

run_once_suite!(make);

//! The one store conformance suite against `PgStore` on the real server,
//! with an injected clock: each case in a schema of its own, dropped after.

mod support;

use std::sync::Arc;

use idem_core::ManualClock;
use idem_postgres::PgStore;
use support::SchemaGuard;

/// A fresh store in a new schema, which the returned guard drops.
async fn make_store(clock: ManualClock) -> (Arc<PgStore>, SchemaGuard) {
    let guard = SchemaGuard::new();
    let store = guard.store(Some(clock)).await;
    (Arc::new(store), guard)
}

idem_conformance::conformance_suite!(make_store);

//! The one store conformance suite against `PgStore` on the real server,
//! with an injected clock: each case in a schema of its own, dropped after;
//! once with writes batched as configured by default, once with one lane
//! (so that writes arriving together queue into shared statements even in
//! small rounds) and once with every write alone.

mod support;

use std::sync::Arc;

use idem_core::ManualClock;
use idem_postgres::{PgOptions, PgStore};
use support::SchemaGuard;

/// A fresh store in a new schema, which the returned guard drops.
async fn make_store(clock: ManualClock, batch_lanes: usize) -> (Arc<PgStore>, SchemaGuard) {
    let guard = SchemaGuard::new();
    let options = PgOptions {
        batch_lanes,
        ..guard.options(Some(clock))
    };
    match PgStore::connect(&support::url(), options).await {
        Ok(store) => (Arc::new(store), guard),
        Err(e) => panic!("cannot connect to {}: {e}", support::url()),
    }
}

mod batched {
    use super::*;

    async fn make_store(clock: ManualClock) -> (Arc<PgStore>, SchemaGuard) {
        super::make_store(clock, idem_postgres::BATCH_LANES_DEFAULT).await
    }

    idem_conformance::conformance_suite!(make_store);
}

mod one_lane {
    use super::*;

    async fn make_store(clock: ManualClock) -> (Arc<PgStore>, SchemaGuard) {
        super::make_store(clock, 1).await
    }

    idem_conformance::conformance_suite!(make_store);
}

mod unbatched {
    use super::*;

    async fn make_store(clock: ManualClock) -> (Arc<PgStore>, SchemaGuard) {
        super::make_store(clock, 0).await
    }

    idem_conformance::conformance_suite!(make_store);
}

//! The run-once scenarios, the contract's model and concurrent deliveries,
//! through the real PostgreSQL store (127.0.0.1:5432, or
//! `IDEM_TEST_POSTGRES_URL`), each test in a schema of its own that is
//! dropped when it ends, pass or fail.

mod support;

use idem_testkit::stores::{Backend, TestStore};
use support::Harness;

/// A fresh store in a new schema, judging time by a manual clock.
async fn make() -> (Harness, TestStore) {
    support::real_store(Backend::Postgres).await
}

run_once_suite!(make);
store_properties!(make, 8);

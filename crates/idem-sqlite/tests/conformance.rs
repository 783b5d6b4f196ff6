//! The one store conformance suite against `SqliteStore`, twice: with group
//! commit (several operations per transaction) and with one transaction per
//! operation, so batching can never change an answer.

use std::sync::Arc;

use idem_core::ManualClock;
use idem_sqlite::{SqliteOptions, SqliteStore};
use tempfile::TempDir;

/// A fresh store in a new temp dir, which the returned guard deletes.
async fn open(clock: ManualClock, options: SqliteOptions) -> (Arc<SqliteStore>, TempDir) {
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("cannot create a temp dir: {e}"),
    };
    match SqliteStore::open_with_clock(dir.path().join("idem.db"), options, Arc::new(clock)) {
        Ok(store) => (Arc::new(store), dir),
        Err(e) => panic!("cannot open the store: {e}"),
    }
}

mod group_commit {
    use super::*;

    async fn make_store(clock: ManualClock) -> (Arc<SqliteStore>, TempDir) {
        open(clock, SqliteOptions::default()).await
    }

    idem_conformance::conformance_suite!(make_store);
}

mod one_transaction_per_op {
    use super::*;

    async fn make_store(clock: ManualClock) -> (Arc<SqliteStore>, TempDir) {
        let options = SqliteOptions {
            batch_max: 1,
            ..SqliteOptions::default()
        };
        open(clock, options).await
    }

    idem_conformance::conformance_suite!(make_store);
}

//! The run-once scenarios, the contract's model and concurrent deliveries,
//! through the real PostgreSQL store (127.0.0.1:5432, or
//! `IDEM_TEST_POSTGRES_URL`), each test in a schema of its own that is
//! dropped when it ends, pass or fail.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_postgres::{PgOptions, PgStore};
use proptest::prelude::*;
use support::{ANSWERS, Answer, Class, Harness, Seen, Step, manual_clock};

const URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test";

fn url() -> String {
    std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| URL_DEFAULT.to_owned())
}

/// A schema no other test (in this process or another) uses; dropped
/// with everything in it when the guard drops.
struct SchemaGuard(String);

impl SchemaGuard {
    fn new() -> SchemaGuard {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        SchemaGuard(format!("idem_consume_{}_{n}", std::process::id()))
    }
}

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0);
        // A runtime of its own on a thread of its own, so that the guard
        // can clean up from inside or outside a runtime.
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(connection);
                client.batch_execute(&sql).await.map_err(|e| e.to_string())
            })
        });
        if let Ok(Err(e)) | Err(e) = cleanup.join().map_err(|_| "panicked".to_owned()) {
            eprintln!("cannot drop test schema {}: {e}", self.0);
        }
    }
}

/// A fresh store in a new schema, judging time by a manual clock.
async fn make() -> (Harness, SchemaGuard) {
    let guard = SchemaGuard::new();
    let clock = manual_clock();
    let options = PgOptions {
        pool_size: 8,
        schema: guard.0.clone(),
        clock: Some(Arc::new(clock.clone())),
        ..PgOptions::default()
    };
    let store = match PgStore::connect(&url(), options).await {
        Ok(store) => store,
        Err(e) => panic!("cannot connect to {}: {e}", url()),
    };
    let harness = Harness {
        store: Arc::new(store),
        clock,
    };
    (harness, guard)
}

run_once_suite!(make);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

fn step() -> impl Strategy<Value = Step> {
    (0u8..3, 0u8..2, 0..ANSWERS.len()).prop_map(|(key, amount, answer)| Step {
        key,
        amount,
        answer: ANSWERS[answer].0,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Sequences of deliveries follow the contract's table on PostgreSQL.
    #[test]
    fn deliveries_follow_the_contract(steps in proptest::collection::vec(step(), 1..24)) {
        runtime().block_on(async {
            let (harness, _guard) = make().await;
            support::check_model(&harness, "model", &steps).await;
        });
    }

    /// Concurrent deliveries of one intent through a pool of connections:
    /// never two effects at once, one in all unless released.
    #[test]
    fn concurrent_deliveries_run_once(
        deliveries in 2usize..16,
        answer in 0..ANSWERS.len(),
        hold_ms in 0u64..20,
    ) {
        runtime().block_on(async {
            let (harness, _guard) = make().await;
            let (answer, class) = ANSWERS[answer];
            let hold = Duration::from_millis(hold_ms);
            let seen = support::concurrently(&harness, "c", deliveries, answer, hold).await;
            check(&seen, answer, class);
        });
    }
}

fn check(seen: &(Vec<Seen>, usize, usize), answer: Answer, class: Class) {
    support::check_concurrent_class(seen, answer, class);
}

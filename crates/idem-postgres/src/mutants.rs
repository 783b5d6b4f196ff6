//! The mutants of group commit and of replays from memory that the
//! conformance suite must catch, through the real server: a batch that
//! answers its callers before its commit, the commit then never landing
//! (each batch's statement rolled back after its answers were taken), and
//! a replay cache that judges expiry by a clock reading a second behind the
//! store's. They live inside the crate so that their switches are in test
//! builds only.

use crate::test_support as support;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use idem_core::ManualClock;
use idem_postgres::{PgOptions, PgStore};
use support::SchemaGuard;

/// A store of one lane (so that writes arriving together share
/// statements), in a schema of its own.
async fn store(clock: ManualClock) -> (PgStore, SchemaGuard) {
    let guard = SchemaGuard::new();
    let options = PgOptions {
        batch_lanes: 1,
        ..guard.options(Some(clock))
    };
    match PgStore::connect(&support::url(), options).await {
        Ok(store) => (store, guard),
        Err(e) => panic!("cannot connect to {}: {e}", support::url()),
    }
}

/// Batches that answer before a commit that never lands.
async fn answering_before_commit(clock: ManualClock) -> (Arc<PgStore>, SchemaGuard) {
    let (store, guard) = store(clock).await;
    store
        .shared
        .answers_before_commit
        .store(true, Ordering::Relaxed);
    (Arc::new(store), guard)
}

/// A replay cache whose clock reads a second behind the store's.
async fn cache_clock_behind(clock: ManualClock) -> (Arc<PgStore>, SchemaGuard) {
    let (store, guard) = store(clock).await;
    store
        .shared
        .ctx
        .cache_clock_behind_ms
        .store(1_000, Ordering::Relaxed);
    (Arc::new(store), guard)
}

/// The conformance cases that fail against `$make_store`, named, with the
/// failing cases' panics kept quiet.
macro_rules! failures {
    ($make_store:path) => {{
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let failed = idem_conformance::conformance_failures!($make_store);
        std::panic::set_hook(hook);
        failed
            .into_iter()
            .map(|(name, _)| name)
            .collect::<Vec<&str>>()
    }};
}

/// The cases that must catch the batch: a claim's record, and a
/// completion's result, read back as the store keeps them, and every
/// answer beside the reference store's.
const BATCH_MUST_CATCH: [&str; 3] = [
    "claim_acquires_when_no_record",
    "complete_stores_result_and_horizons",
    "every_answer_is_the_reference_stores",
];

#[test]
fn a_batch_that_answers_before_its_commit_fails_the_suite() {
    idem_conformance::__runtime().block_on(async {
        let names = failures!(answering_before_commit);
        eprintln!(
            "{} cases caught the batch that answers before its commit: {}",
            names.len(),
            names.join(", ")
        );
        for name in BATCH_MUST_CATCH {
            assert!(
                names.contains(&name),
                "{name} did not catch the batch that answers before its commit; caught by: \
                 {names:?}"
            );
        }
    });
}

#[test]
fn a_replay_cache_that_serves_past_expiry_fails_the_suite() {
    idem_conformance::__runtime().block_on(async {
        let names = failures!(cache_clock_behind);
        eprintln!(
            "{} cases caught the replay cache whose clock is behind: {}",
            names.len(),
            names.join(", ")
        );
        assert!(
            names.contains(&"every_answer_is_the_reference_stores"),
            "the differential case did not catch a replay cache whose clock is a second \
             behind; caught by: {names:?}"
        );
    });
}

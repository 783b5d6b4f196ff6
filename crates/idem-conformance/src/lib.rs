//! One store conformance suite, written once and run against every idem
//! store, so that memory, SQLite and PostgreSQL provably answer alike.
//!
//! A store crate runs the whole suite with one line in a test file:
//!
//! ```
//! use std::sync::Arc;
//! use idem_core::{ManualClock, MemoryStore};
//!
//! /// A fresh, empty store reading `clock`, and a guard kept alive for the
//! /// test (a temp dir, a database handle; here nothing).
//! async fn make_store(clock: ManualClock) -> (Arc<MemoryStore>, ()) {
//!     (Arc::new(MemoryStore::new(Arc::new(clock))), ())
//! }
//!
//! idem_conformance::conformance_suite!(make_store);
//! # fn main() {}
//! ```
//!
//! This expands to one `#[test]` per function in [`cases`], named after it so
//! that a failure names the broken row, each on a multi-threaded tokio
//! runtime. Store crates need no tokio dependency of their own for it.

pub mod cases;
pub mod checks;

use idem_core::Timestamp;

#[doc(hidden)]
pub use idem_core as __idem_core;

/// Where the clock of every suite test starts (2023-11-14T22:13:20Z).
pub const START: Timestamp = Timestamp::from_millis(1_700_000_000_000);

/// Expands to one `#[test]` per conformance case.
///
/// `$make_store` names an `async fn(ManualClock) -> (Arc<S>, G)` where
/// `S: Store + 'static` is a fresh, empty store reading that clock and `G`
/// is a guard (a temp dir, a connection) held until the test ends. Each test
/// builds a [`ManualClock`](idem_core::ManualClock) at [`START`], calls
/// `$make_store`, and runs the case of the same name from [`cases`] on a
/// four-worker multi-threaded tokio runtime. Callers need no tokio
/// dependency of their own.
///
/// The list below is the one list of cases: adding a case is one line here
/// plus its function in [`cases`].
#[macro_export]
macro_rules! conformance_suite {
    ($make_store:path $(,)?) => {
        $crate::conformance_suite!(@tests $make_store;
            claim_acquires_when_no_record,
            complete_stores_result_and_horizons,
            claim_with_other_fingerprint_is_mismatch,
            claim_on_completed_replays_result,
            claim_in_flight_reports_lease,
            claim_on_expired_lease_reconciles,
            claim_on_expired_lease_takes_over,
            claim_on_ambiguous_is_outcome_unknown,
            claim_past_retention_is_expired_before_any_purge,
            claim_after_tombstone_horizon_acquires,
            stale_tokens_are_fenced,
            tokens_increase_across_release,
            release_removes_record,
            mark_ambiguous_sets_state,
            resolve_completed_stores_result,
            resolve_not_executed_releases,
            resolve_refuses_other_states,
            resolve_is_fenced_by_token,
            resolve_not_executed_waits_for_lease,
            resolve_not_executed_is_journaled,
            resolve_completed_is_journaled,
            journal_keeps_every_episode_oldest_first,
            journal_is_bounded_per_record,
            refused_resolve_journals_nothing,
            failed_lookups_are_counted_per_attempt,
            failed_lookups_are_fenced_by_token,
            a_resolution_or_new_attempt_starts_tries_afresh,
            journal_scopes_isolate,
            list_orders_by_scope_then_key,
            list_filters_by_state_at_store_clock,
            list_pages_with_after_cursor,
            purge_before_retention_does_nothing,
            purge_tombstones_after_retention,
            purge_deletes_after_tombstone_horizon,
            purge_spares_unresolved_records,
            purge_honours_limit,
            scopes_isolate_keys,
            owner_over_limit_is_refused,
            region_is_kept_through_every_transition,
            takeover_records_the_new_region,
            bad_region_is_refused,
            legal_values_round_trip_byte_for_byte,
            header_values_round_trip_byte_for_byte,
            concurrent_claims_on_one_key_acquire_once,
            concurrent_claims_on_distinct_keys_all_acquire,
            every_answer_is_the_reference_stores,
            suspect_window_is_kept_and_only_extended,
            concurrent_window_openings_are_serialised,
        );
    };
    (@tests $make_store:path; $($case:ident),+ $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::__runtime().block_on(async {
                    let clock = $crate::__idem_core::ManualClock::new($crate::START);
                    let (store, _guard) = $make_store(clock.clone()).await;
                    $crate::cases::$case(store, clock).await;
                });
            }
        )+
    };
}

/// The runtime every suite test runs on: multi-threaded, four workers, so
/// that the concurrency cases really race. Used by [`conformance_suite!`];
/// `#[tokio::test(crate = ...)]` cannot name `$crate`, this can.
#[doc(hidden)]
pub fn __runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => panic!("cannot start the conformance test runtime: {e}"),
    }
}

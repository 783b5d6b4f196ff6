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
#[doc(hidden)]
pub use tokio as __tokio;

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
/// `__every_case!` holds the one list of cases, for this macro and
/// [`conformance_failures!`]: adding a case is one line there plus its
/// function in [`cases`].
#[macro_export]
macro_rules! conformance_suite {
    ($make_store:path $(,)?) => {
        $crate::__every_case!(@tests $make_store);
    };
}

/// Runs every conformance case against stores from `$make_store` (as
/// [`conformance_suite!`] takes it) and evaluates to the cases that failed,
/// each with its panic message, in the suite's order: the proof that a
/// store broken on purpose fails the suite. Use it in a future given to
/// `block_on` of a multi-threaded tokio runtime; each case runs on a task
/// of its own so that its panic is caught, and each store's guard drops in
/// the calling future, after its case.
#[macro_export]
macro_rules! conformance_failures {
    ($make_store:path $(,)?) => {
        $crate::__every_case!(@failures $make_store)
    };
}

/// The one list of cases, expanded by [`conformance_suite!`] and
/// [`conformance_failures!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __every_case {
    (@$mode:ident $make_store:path) => {
        $crate::__every_case!(@$mode $make_store;
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
            ambiguity_note_is_kept_for_its_attempt_only,
            ambiguity_note_of_a_gone_attempt_is_dropped,
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
            expire_turns_a_completed_record_into_a_tombstone,
            expire_refuses_other_states,
            evict_waits_for_the_lease,
            evict_lets_the_intent_run_again,
            verbs_are_fenced_by_token,
            verbs_without_a_reason_are_refused,
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
    (@failures $make_store:path; $($case:ident),+ $(,)?) => {{
        let mut failed: ::std::vec::Vec<(&'static str, ::std::string::String)> =
            ::std::vec::Vec::new();
        $(
            let clock = $crate::__idem_core::ManualClock::new($crate::START);
            let (store, guard) = $make_store(clock.clone()).await;
            let ran = $crate::__tokio::spawn($crate::cases::$case(store, clock)).await;
            // The guard's cleanup runs here, not on the case's task: a
            // cleanup that blocks its thread must not block the tasks the
            // failed case left behind (a batch mid-transaction) on the
            // same worker.
            drop(guard);
            if let Err(e) = ran {
                failed.push((stringify!($case), $crate::__panic_message(e)));
            }
        )+
        failed
    }};
}

/// What a case's failed task said: its panic message, or why it stopped.
#[doc(hidden)]
pub fn __panic_message(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return format!("the case was cancelled: {e}");
    }
    let payload = e.into_panic();
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic without a message".to_owned())
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

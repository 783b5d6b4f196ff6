//! The idem contract: "this business effect happens once", stated as types and
//! one pure decision function, with no I/O and no async runtime.
//!
//! - [`IdempotencyKey`], [`Scope`], [`Fingerprint`]: validated inputs.
//! - [`Record`], [`State`], [`Token`]: what a store keeps per (scope, key).
//! - [`decision`]: the claim table and every other transition, as pure functions.
//! - [`attempt`]: one attempt's steps (claim, verify, effect, write) as data
//!   every adapter renders.
//! - [`completion`]: what an attempt's answer means for its record.
//! - [`verdict`]: what a provider lookup means for an ambiguous attempt.
//! - [`lease`]: how much of a granted lease is left for the effect.
//! - [`Store`]: applies a transition atomically; [`MemoryStore`] is the reference.
//! - [`Clock`]: time comes in from outside, so tests and the simulator own it.
//!
//! ```
//! use std::sync::Arc;
//! use idem_core::*;
//!
//! # fn block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     // The memory store answers at once, so one poll completes every call.
//! #     let mut f = std::pin::pin!(f);
//! #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
//! #     match f.as_mut().poll(&mut cx) { std::task::Poll::Ready(v) => v, _ => unreachable!() }
//! # }
//! # block_on(async {
//! let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
//! let store = MemoryStore::new(Arc::new(clock.clone()));
//! let request = ClaimRequest {
//!     id: RecordId {
//!         scope: Scope::from_parts("POST /payouts", "tenant-42", None)?,
//!         key: IdempotencyKey::parse("payout-847-2026-W36")?,
//!     },
//!     fingerprint: Fingerprint::from_bytes([7; 32]), // Fingerprint::of_request in real use
//!     legacy_fingerprint: None,
//!     owner: "worker-1".into(),
//!     region: None,
//!     policy: Policy::DEFAULT,
//! };
//! let mut effects = 0;
//! for _attempt in 0..3 {
//!     match store.claim(&request).await? {
//!         Claim::Acquired { token, .. } => {
//!             effects += 1; // the effect happens here, and only here
//!             let result = StoredResult::new(201, vec![], b"{\"paid\":true}".to_vec())?;
//!             store.complete(&request.id, token, result).await?;
//!         }
//!         Claim::Replay { record } => {
//!             assert_eq!(record.result.map(|r| r.status()), Some(201));
//!         }
//!         other => panic!("unexpected {other:?}"),
//!     }
//! }
//! assert_eq!(effects, 1);
//!
//! // A day later the result is gone, but the key is not forgotten:
//! clock.advance_millis(Policy::DEFAULT.retention_s() * 1000);
//! assert!(matches!(store.claim(&request).await?, Claim::Expired { .. }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod ambiguity;
pub mod attempt;
mod chain;
pub mod completion;
pub mod decision;
mod field_error;
pub mod fingerprint;
mod header_bytes;
pub mod jcs;
mod key;
pub mod lease;
mod memory;
mod policy;
mod record;
mod redact;
mod replay_cache;
mod scope;
mod store;
mod store_error;
mod time;
pub mod verdict;
pub mod window;
mod wrap;

pub use ambiguity::{
    AMBIGUITY_ERROR_BYTES_MAX, AMBIGUITY_EXCERPT_BYTES_MAX, AMBIGUITY_NODE_BYTES_MAX,
    AMBIGUITY_SUMMARY_FIELDS_MAX, AMBIGUITY_SUMMARY_VALUE_BYTES_MAX, AmbiguityNote,
};
pub use attempt::{
    AfterClaim, AfterVerification, EffectEnd, Freshness, Refusal, Unverified, Unwritten,
};
pub use chain::{error_causes, error_chain};
pub use completion::{AttemptOutcome, Completion, CompletionError, CompletionTable, Dedup};
pub use decision::{Claim, ClaimRequest, Decision, Plan};
pub use field_error::FieldError;
pub use fingerprint::{Fingerprint, FingerprintError, RequestParts, to_hex};
pub use header_bytes::HeaderBytes;
pub use jcs::{JcsError, JsonPointer};
pub use key::{IdempotencyKey, KEY_BYTES_MAX, KeyError};
pub use lease::{FORWARD_MS_MIN, LEASE_MARGIN_MS_MAX, LeaseLeft, WAIT_POLL_MS, lease_left};
pub use memory::MemoryStore;
pub use policy::{HORIZON_S_MAX, LEASE_MS_MAX, LEASE_MS_MIN, LeaseExpiry, Policy, PolicyError};
pub use record::{
    JOURNAL_PER_RECORD_MAX, JournalEntry, LimitError, LookupTries, OWNER_BYTES_MAX, Outcome,
    REGION_BYTES_MAX, RESOLUTION_TEXT_BYTES_MAX, RESULT_BODY_BYTES_MAX, RESULT_NOT_STORED_STATUS,
    RESULT_NOT_STORED_TITLE, RESULT_NOT_STORED_TYPE, Record, RecordId, Resolution, Resolved, State,
    StoredResult, Token, Verb, VerbRequest, check_owner, check_region,
};
pub use redact::redact_url;
pub use replay_cache::{Generation, ReplayCache, VERBS_READING_AGE_MS_MAX, VERBS_REFRESH_AGE_MS};
pub use scope::{SCOPE_BYTES_MAX, Scope, ScopeError};
pub use store::{
    DamagedRow, LIST_LIMIT_MAX, ListCursor, ListQuery, Listing, PurgeReport, Store, StoreFuture,
    WakeFn, Watch, Watching, WindowFn,
};
pub use store_error::StoreError;
pub use time::{Clock, ManualClock, SystemClock, Timestamp};
pub use verdict::SettleOnRetry;
pub use window::{SuspectWindow, Verification, VerifyFresh, WindowOpening, WindowWatch};
pub use wrap::{Accepted, StoreWrapper};

#[cfg(test)]
mod test_support {
    /// The memory store answers at once: one poll completes every call.
    pub(crate) fn now<T>(f: impl std::future::Future<Output = T>) -> T {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("the memory store answers at once"),
        }
    }
}

//! The idem contract: "this business effect happens once", stated as types and
//! one pure decision function, with no I/O and no async runtime.
//!
//! - [`IdempotencyKey`], [`Scope`], [`Fingerprint`]: validated inputs.
//! - [`Record`], [`State`], [`Token`]: what a store keeps per (scope, key).
//! - [`decision`]: the claim table and every other transition, as pure functions.
//! - [`Store`]: applies a transition atomically; [`MemoryStore`] is the reference.
//! - [`Clock`]: time comes in from outside, so tests and the simulator own it.

pub mod decision;
pub mod fingerprint;
pub mod jcs;
mod key;
mod memory;
mod policy;
mod record;
mod scope;
mod store;
mod time;

pub use decision::{Claim, ClaimRequest, Decision};
pub use fingerprint::{Body, Fingerprint, FingerprintError, RequestParts};
pub use jcs::{JcsError, JsonPointer};
pub use key::{IdempotencyKey, KEY_BYTES_MAX, KeyError};
pub use memory::MemoryStore;
pub use policy::{HORIZON_S_MAX, LEASE_MS_MAX, LEASE_MS_MIN, LeaseExpiry, Policy, PolicyError};
pub use record::{
    LimitError, OWNER_BYTES_MAX, Outcome, RESULT_BODY_BYTES_MAX, Record, RecordId, Resolution,
    State, StoredResult, Token, check_owner,
};
pub use scope::{SCOPE_BYTES_MAX, Scope, ScopeError};
pub use store::{LIST_LIMIT_MAX, ListQuery, PurgeReport, Store, StoreError, StoreFuture};
pub use time::{Clock, ManualClock, SystemClock, Timestamp};

//! The conformance cases: each one a row (or a family of rows) of the
//! contract, written once against the `Store` trait and run against every
//! store by [`crate::conformance_suite!`].
//!
//! Every case takes a fresh, empty store and the [`ManualClock`] it reads,
//! standing at [`crate::START`]; it moves time only through that clock and
//! panics, naming the row, on the first difference from the contract.
//!
//! [`ManualClock`]: idem_core::ManualClock

// The cases are assertions: an `unwrap` that fails is a store answering
// with an error where the contract says it must not, and the panic is the
// test failure that names it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ambiguity;
mod claim;
mod differential;
mod fencing;
mod isolation;
mod journal;
mod list;
mod purge;
mod region;
mod resolve;
mod roundtrip;
mod support;
mod tries;
mod verbs;
mod window;

pub use ambiguity::*;
pub use claim::*;
pub use differential::*;
pub use fencing::*;
pub use isolation::*;
pub use journal::*;
pub use list::*;
pub use purge::*;
pub use region::*;
pub use resolve::*;
pub use roundtrip::*;
pub use tries::*;
pub use verbs::*;
pub use window::*;

//! One attempt's lifecycle, written once below every adapter that runs an
//! effect at most once: the HTTP layer (`idem-http`, whose effect is the
//! upstream's call) and the queue consumer (`idem-message`, whose effect is
//! a message's delivery). [`Driver::run`] claims the key (again with a
//! legacy fingerprint, waiting for another attempt's outcome where the
//! adapter asks, settling an unknown outcome on the retry with
//! [`idem_core::SettleOnRetry`]), verifies a fresh claim inside the store's
//! suspect window ([`idem_core::VerifyFresh`]), bounds the effect by the
//! lease the store granted ([`idem_core::lease`]), runs it catching a
//! panic, judges its end by the completion table, and completes, releases
//! or marks the record ambiguous with the attempt's token. It returns an
//! [`AttemptEnd`], which each adapter renders in its own terms: a response,
//! or ack / retry / reject.
//!
//! Every decision is the core's ([`idem_core::attempt`]); what differs
//! between adapters is a hook ([`Claimant`], [`Observe`], [`Answer`]), never
//! a second copy of a step. Nothing here speaks HTTP or a broker's
//! protocol, and delays stay [`std::time::Duration`]s until a renderer
//! rounds them to its own unit.
//!
//! Three things the HTTP layer and the consumer once did each their own
//! way are decided here once: a delay is a `Duration` (the layer rounds it
//! up to whole seconds, `Retry-After`'s unit; a broker takes milliseconds);
//! a record released unsent (a fresh claim the provider could not clear, a
//! lease spent, no capacity after a wait) goes through the one settle
//! step, observed and logged like every other write, never a bare
//! `Store::release`; and an ambiguous record a claim meets is settled
//! first whenever the adapter gives a settler.

mod driver;
mod end;
mod hooks;

pub use driver::{Driver, Summary, Unknowns};
pub use end::{AttemptEnd, Granted, Ran};
pub use hooks::{
    Answer, Ask, Asked, BoxFuture, Claimant, Observe, Plain, Polling, StoreAnswer, StoreOp,
    Unobserved, WaitEnd, WindowEnd,
};

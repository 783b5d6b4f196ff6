//! Run-once for queue consumers: the idem contract on the receive side of
//! an at-least-once queue, where redeliveries, crashes between effect and
//! ack, racing consumers, republishes and dead-letter redrives are the
//! everyday duplicates.
//!
//! - [`KeyTemplate`]: the key names the intent, from the payload's business
//!   fields (`payout:{/seller_id}:{/settlement_id}`) or a header the
//!   producer sets; the message id only when a template asks for it.
//! - [`PayloadFingerprint`]: the payload's fingerprint in the HTTP layer's
//!   canonical form, with the same exclusions.
//! - [`IntentSpec`]: scope + template + fingerprint → the [`Intent`] of a
//!   [`Message`], or the reason it has none ([`RejectReason`]).
//! - [`RunOnce::run`]: claims the intent, runs the effect only when
//!   acquired, records its answer through the core's completion table,
//!   and returns the [`Outcome`]: [`Outcome::Ack`], [`Outcome::Retry`]
//!   (never ack) or [`Outcome::Reject`] (to the [`Sink`] it names);
//!   [`RunOnce::run_within`] does the same with a lease no longer than the
//!   caller has left (a function invocation before its deadline).
//!
//! Nothing here talks to a broker: a consumer (or the `idem consume`
//! bridge) settles the message from the outcome.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use idem_core::{CompletionTable, Dedup, MemoryStore, Policy, Scope, SystemClock};
//! use idem_message::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let spec = IntentSpec::new(
//!     Scope::from_parts("payouts", "settlement-service", None)?,
//!     KeyTemplate::parse("payout:{/seller_id}:{/settlement_id}")?,
//!     PayloadFingerprint::json(vec!["/sent_at".parse()?]),
//! );
//! let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
//! let runner = RunOnce::new(store, Policy::DEFAULT, CompletionTable::new([], Dedup::Idem)?);
//! let effects = AtomicUsize::new(0);
//!
//! // The same intent, published twice with new message ids and send times.
//! let first = br#"{"seller_id": 847, "settlement_id": "2026-W36", "amount": "120.00", "sent_at": 1}"#;
//! let again = br#"{"settlement_id": "2026-W36", "seller_id": 847, "amount": "120.00", "sent_at": 2}"#;
//! let mut outcomes = Vec::new();
//! for (payload, id) in [(&first[..], "m-1"), (&again[..], "m-2")] {
//!     let message = Message { payload, message_id: Some(id), ..Message::default() };
//!     let intent = match spec.intent(&message) {
//!         Ok(intent) => intent,
//!         Err(reason) => panic!("would go to the {} sink: {reason}", reason.sink()),
//!     };
//!     let outcome = runner
//!         .run(&intent, |attempt| {
//!             let effects = &effects;
//!             async move {
//!                 // POST the payout here, forwarding `attempt.id.key` so that
//!                 // the service can dedup, and be reconciled, by it too.
//!                 assert_eq!(attempt.id.key.as_str(), "payout:847:2026-W36");
//!                 effects.fetch_add(1, Ordering::SeqCst);
//!                 Ok(Reply { body: b"paid".to_vec(), ..Reply::status(201) })
//!             }
//!         })
//!         .await;
//!     outcomes.push(outcome);
//! }
//! assert_eq!(effects.load(Ordering::SeqCst), 1);
//! assert!(outcomes.iter().all(Outcome::is_ack));
//! let Outcome::Ack { done: Done::Replayed { result: Some(answer) } } = &outcomes[1] else {
//!     panic!("the second delivery replays: {}", outcomes[1]);
//! };
//! assert_eq!(answer.body(), b"paid");
//!
//! // Another payload under the same key is another intent: never run.
//! let other = br#"{"seller_id": 847, "settlement_id": "2026-W36", "amount": "999.00"}"#;
//! let intent = spec.intent(&Message { payload: other, ..Message::default() })?;
//! let outcome = runner.run(&intent, |_| async { Ok(Reply::status(201)) }).await;
//! let Outcome::Reject { reason } = outcome else { panic!("{outcome}") };
//! assert_eq!(reason.sink(), Sink::DeadLetter);
//! assert_eq!(effects.load(Ordering::SeqCst), 1);
//! # Ok(())
//! # }
//! ```

mod intent;
mod message;
mod run;
mod template;

pub use intent::{IntentSpec, PayloadFingerprint, PayloadFormat};
pub use message::Message;
pub use run::{
    Attempt, Done, IN_FLIGHT_RETRY_MS_MIN, Intent, Outcome, RELEASED_RETRY_MS, RejectReason, Reply,
    RetryReason, RunOnce, STORE_RETRY_MS, Sink,
};
pub use template::{
    KeyRefusal, KeyTemplate, Source, TEMPLATE_BYTES_MAX, TemplateError, TemplateFault,
};

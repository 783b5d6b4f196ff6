//! What an adapter plugs into the driver, each with a default that does
//! nothing or the plain thing: how it observes the attempt ([`Observe`]:
//! the HTTP layer's spans and metrics), how it claims ([`Claimant`]: a
//! second fingerprint, a wait for another attempt's outcome, capacity
//! after that wait), and what its effect answers ([`Answer`]).

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use idem_core::{Claim, Completion, EffectEnd, Fingerprint, RecordId, StoreError, StoredResult};
use tracing::Span;

/// A claim's answer and the instant just before its claim was sent: the
/// store decided after it, so a lease it granted ends no earlier than that
/// instant plus the lease.
pub type Asked = (Result<Claim, StoreError>, Instant);

/// A boxed future borrowing for `'a`, as the object-safe hooks return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Asks the claim again, timed and observed as every claim of the driver:
/// what a [`Claimant::wait_for`] calls between its waits.
#[derive(Clone, Copy)]
pub struct Ask<'a> {
    again: &'a (dyn AskAgain + 'a),
    id: &'a RecordId,
}

/// What an [`Ask`] asks through (the driver, with the claim's request).
pub(crate) trait AskAgain: Sync {
    fn ask_again(&self) -> BoxFuture<'_, Asked>;
}

impl<'a> Ask<'a> {
    pub(crate) fn new(again: &'a (dyn AskAgain + 'a), id: &'a RecordId) -> Ask<'a> {
        Ask { again, id }
    }

    /// Asks the claim again.
    pub async fn ask(&self) -> Asked {
        self.again.ask_again().await
    }

    /// The record asked for.
    pub fn id(&self) -> &'a RecordId {
        self.id
    }
}

/// Asks again every [`idem_core::WAIT_POLL_MS`], at most, until the claim
/// answers other than in flight or `wait` is over: the same decision each
/// time, so a later answer is what a retry then would have got.
async fn poll(ask: Ask<'_>, wait: Duration) -> Asked {
    let deadline = Instant::now() + wait;
    let poll = Duration::from_millis(idem_core::WAIT_POLL_MS);
    loop {
        let next = (Instant::now() + poll).min(deadline);
        tokio::time::sleep_until(next.into()).await;
        let asked = ask.ask().await;
        if !matches!(asked.0, Ok(Claim::InFlight { .. })) || Instant::now() >= deadline {
            return asked;
        }
    }
}

/// A store operation the driver makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreOp {
    /// `Store::claim`.
    Claim,
    /// `Store::complete`.
    Complete,
    /// `Store::release`.
    Release,
    /// `Store::mark_ambiguous`.
    MarkAmbiguous,
}

/// What a store operation came to.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum StoreAnswer<'a> {
    /// The claim's decision.
    Claimed(&'a Claim),
    /// The write was applied.
    Written,
    /// The store refused or failed.
    Failed(&'a StoreError),
}

/// How a wait for another attempt's outcome ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitEnd {
    /// The claim answered other than "in flight".
    Answered,
    /// The wait was over with the key still in flight.
    TimedOut,
    /// The store failed while waiting.
    StoreFailed,
    /// No wait was allowed (over the adapter's limits).
    Refused,
}

/// What became of a fresh claim inside a suspect window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WindowEnd {
    /// The provider had the effect: its answer completed the record.
    Executed,
    /// The provider had no effect: run.
    NotExecuted,
    /// "Not found" while a forgotten attempt might still run: released.
    NotYet,
    /// The lookup gave no answer: released.
    LookupFailed,
    /// Nothing verifies this key: run unverified.
    Unverified,
}

/// Watches an attempt go by: every hook is called at the moment the HTTP
/// layer counted or traced it before the driver existed. All do nothing
/// by default ([`Unobserved`]).
pub trait Observe: Send + Sync {
    /// The span a store operation on `id` runs in.
    fn store_span(&self, _op: StoreOp, _id: &RecordId) -> Span {
        Span::none()
    }

    /// A store operation ended after `elapsed`, in `span`.
    fn store_answered(
        &self,
        _op: StoreOp,
        _span: &Span,
        _elapsed: Duration,
        _answer: StoreAnswer<'_>,
    ) {
    }

    /// A claim's decision that decides (or, before a wait or a settlement,
    /// decided) what this attempt did.
    fn claim(&self, _claim: &Claim) {}

    /// A wait ended.
    fn waited(&self, _end: WaitEnd) {}

    /// A fresh claim inside a suspect window was judged.
    fn window(&self, _end: WindowEnd) {}

    /// An attempt's end was written: completed, released or marked
    /// ambiguous.
    fn written(&self, _completion: Completion) {}

    /// The effect ended after `elapsed`, before anything was written.
    fn effect_ended(&self, _end: EffectEnd, _elapsed: Duration) {}
}

/// Observes nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unobserved;

impl Observe for Unobserved {}

/// The adapter's part of claiming. The defaults: one fingerprint, no
/// wait, always capacity.
pub trait Claimant: Send + Sync {
    /// A second fingerprint to claim with when the key is bound to
    /// `stored` (the HTTP layer's version 1 fingerprint of a record
    /// written before version 2), or `None`.
    fn legacy_fingerprint(&self, _stored: &Fingerprint) -> Option<Fingerprint> {
        None
    }

    /// How long to wait for the attempt that holds the key (zero: not at all).
    fn wait(&self) -> Duration {
        Duration::ZERO
    }

    /// Waits up to `wait` for the attempt holding the key, asking the claim
    /// again with `ask`: the last answer, or `None` when no wait was
    /// allowed. The default asks every [`idem_core::WAIT_POLL_MS`].
    fn wait_for<'a>(&'a self, ask: Ask<'a>, wait: Duration) -> BoxFuture<'a, Option<Asked>> {
        Box::pin(async move { Some(poll(ask, wait).await) })
    }

    /// Whether an attempt that waited may go on to work (its effect, or a
    /// lookup of an unknown outcome): the HTTP layer takes an in-flight
    /// slot again. `false` sheds it; an acquisition is released unsent.
    fn back_to_work(&self) -> bool {
        true
    }
}

/// Claims with one fingerprint, no wait.
#[derive(Clone, Copy, Debug, Default)]
pub struct Plain;

impl Claimant for Plain {}

/// Waits up to the duration it holds by asking every
/// [`idem_core::WAIT_POLL_MS`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Polling(pub Duration);

impl Claimant for Polling {
    fn wait(&self) -> Duration {
        self.0
    }
}

/// What an effect answers, as the driver needs it: how it ended, and for a
/// final answer what to store and what the adapter passes on.
pub trait Answer: Sized + Send {
    /// What a final answer passes on beside its stored result (the HTTP
    /// layer: the response as the upstream sent it).
    type Kept: Send;

    /// How the effect ended, for the completion table.
    fn end(&self) -> EffectEnd;

    /// What happened, for the log, when the answer is not final.
    fn cause(&self) -> String;

    /// The result to store for a final answer and what passes on; `None`
    /// when it cannot be stored at all (the record is then marked
    /// ambiguous: the side that never repeats an effect). The driver cuts
    /// it at the lease's deadline: the answer is part of the effect.
    fn keep(self) -> impl Future<Output = Option<(StoredResult, Self::Kept)>> + Send;

    /// The start of a non-final answer's body, for the note of why its
    /// record is ambiguous ([`idem_core::AmbiguityNote`]), read without
    /// losing what the adapter passes on. The driver cuts it at the
    /// lease's deadline. The default reads nothing.
    fn excerpt(&mut self) -> impl Future<Output = Option<Vec<u8>>> + Send {
        std::future::ready(None)
    }

    /// What stands for an effect that panicked: an answer judged like any
    /// other (the HTTP layer's 500), or `None` (the default): the record is
    /// marked ambiguous and the adapter gets the panic to resume.
    fn after_panic() -> Option<Self> {
        None
    }
}

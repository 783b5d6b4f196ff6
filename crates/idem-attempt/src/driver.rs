//! The driver: one attempt against a [`Store`], from the claim to the
//! write of its end, each step decided by the core ([`idem_core::attempt`],
//! [`idem_core::lease`], the completion table) and performed here once for
//! every adapter.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use idem_core::attempt::{after_claim, after_effect, after_verification};
use idem_core::{
    AfterClaim, AfterVerification, AmbiguityNote, Claim, ClaimRequest, Clock, Completion,
    CompletionTable, EffectEnd, Freshness, LeaseLeft, RecordId, Refusal, SettleOnRetry, Store,
    StoreError, StoredResult, SystemClock, Timestamp, Token, Unverified, Verification, VerifyFresh,
    WindowWatch, lease,
};
use tracing::Instrument;

use crate::end::{AttemptEnd, Granted, Ran};
use crate::hooks::{
    Answer, Ask, AskAgain, Asked, BoxFuture, Claimant, Observe, Plain, StoreAnswer, StoreOp,
    Unobserved, WaitEnd, WindowEnd,
};

/// Runs attempts against one store with one completion table; the rest is
/// optional and borrowed, so an adapter builds one per attempt for nothing.
#[derive(Clone, Copy)]
pub struct Driver<'a> {
    store: &'a dyn Store,
    completion: &'a CompletionTable,
    window: Option<&'a WindowWatch>,
    verifier: Option<&'a dyn VerifyFresh>,
    settler: Option<&'a dyn SettleOnRetry>,
    observer: &'a dyn Observe,
    claimant: &'a dyn Claimant,
    unknowns: Unknowns,
    summary: Option<&'a Summary<'a>>,
}

/// What a route names of the request for the note of why its record is
/// ambiguous: (JSON pointer, the value's JSON text) pairs, computed only
/// when an attempt is marked ambiguous.
pub type Summary<'a> = dyn Fn() -> Vec<(String, String)> + Send + Sync + 'a;

/// Who settles an unknown outcome this driver leaves, as its log says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unknowns {
    /// A reconciler runs against the same store (or an operator).
    Reconciler,
    /// Only an operator: nothing in this process reconciles.
    Operator,
}

/// An acquisition: what the claim granted and when it was sent.
struct Held<'r> {
    id: &'r RecordId,
    owner: &'r str,
    token: Token,
    lease_until: Timestamp,
    lease_ms: u64,
    sent_at: Instant,
}

/// What claiming came to before anything ran.
enum Decided {
    Claimed(Asked),
    Shed(Option<Result<(), StoreError>>),
}

impl<'a> Driver<'a> {
    /// A driver over `store` judging answers by `completion`; nothing
    /// observed, no wait, no window, nothing settles on a retry.
    pub fn new(store: &'a dyn Store, completion: &'a CompletionTable) -> Driver<'a> {
        Driver {
            store,
            completion,
            window: None,
            verifier: None,
            settler: None,
            observer: &Unobserved,
            claimant: &Plain,
            unknowns: Unknowns::Operator,
            summary: None,
        }
    }

    /// Verifies a fresh claim while `window` is open, with `verifier` when
    /// it covers the key (otherwise the effect runs unverified, counted).
    pub fn with_window(
        self,
        window: &'a WindowWatch,
        verifier: Option<&'a dyn VerifyFresh>,
    ) -> Driver<'a> {
        Driver {
            window: Some(window),
            verifier,
            ..self
        }
    }

    /// Asks `settler` to settle an ambiguous record a claim meets, then
    /// claims again; implies [`Unknowns::Reconciler`].
    pub fn with_settler(self, settler: Option<&'a dyn SettleOnRetry>) -> Driver<'a> {
        let unknowns = match settler {
            Some(_) => Unknowns::Reconciler,
            None => self.unknowns,
        };
        Driver {
            settler,
            unknowns,
            ..self
        }
    }

    /// Declares who settles an unknown outcome (for the log).
    pub fn with_unknowns(self, unknowns: Unknowns) -> Driver<'a> {
        Driver { unknowns, ..self }
    }

    /// Reports every step to `observer`.
    pub fn with_observer(self, observer: &'a dyn Observe) -> Driver<'a> {
        Driver { observer, ..self }
    }

    /// Puts `summary`'s fields of the request in the note of why a record
    /// this driver marks ambiguous is (none without it).
    pub fn with_summary(self, summary: &'a Summary<'a>) -> Driver<'a> {
        Driver {
            summary: Some(summary),
            ..self
        }
    }

    /// Claims with `claimant`'s hooks (a second fingerprint, a wait).
    pub fn with_claimant(self, claimant: &'a dyn Claimant) -> Driver<'a> {
        Driver { claimant, ..self }
    }

    /// Runs one attempt of `request`: claims (waiting, settling an unknown
    /// outcome, as configured), verifies a fresh claim inside a suspect
    /// window, and when the lease leaves enough runs `effect` until its
    /// deadline, catching a panic; then writes what its end means. The
    /// request's legacy fingerprint is set when the claim used it.
    pub async fn run<A, E, F>(&self, request: &mut ClaimRequest, effect: E) -> AttemptEnd<A>
    where
        A: Answer,
        E: FnOnce(Granted) -> F,
        F: Future<Output = A>,
    {
        let (claimed, sent_at) = match self.decide(request).await {
            Decided::Claimed(asked) => asked,
            Decided::Shed(released) => return AttemptEnd::Shed { released },
        };
        let claim = match claimed {
            Ok(claim) => claim,
            Err(e) => return AttemptEnd::StoreUnavailable(e),
        };
        self.observer.claim(&claim);
        let id = &request.id;
        let (token, lease_until, lease_ms, fresh) = match after_claim(claim) {
            AfterClaim::Run {
                token,
                lease_until,
                lease_ms,
                fresh,
            } => (token, lease_until, lease_ms, fresh),
            AfterClaim::Replay { record } => return AttemptEnd::Replay(record),
            AfterClaim::InFlight { retry_after } => return AttemptEnd::InFlight { retry_after },
            AfterClaim::Refused(refusal) => return refused(id, refusal),
            _ => return AttemptEnd::Refused(Refusal::UnknownClaim),
        };
        let held = Held {
            id,
            owner: &request.owner,
            token,
            lease_until,
            lease_ms,
            sent_at,
        };
        if fresh == Freshness::Fresh
            && let Some(end) = self.verify_fresh(&held, request.policy.lease_ms()).await
        {
            return end;
        }
        self.run_effect(held, effect).await
    }

    /// Claims and follows the claim as far as an attempt goes without its
    /// effect: again with the legacy fingerprint, a wait for the attempt
    /// holding the key, an unknown outcome settled and claimed again.
    async fn decide(&self, request: &mut ClaimRequest) -> Decided {
        let mut asked = self.ask(request).await;
        if let Ok(Claim::Mismatch { stored }) = &asked.0
            && let Some(legacy) = self.claimant.legacy_fingerprint(stored)
        {
            request.legacy_fingerprint = Some(legacy);
            asked = self.ask(request).await;
        }
        let wait = self.claimant.wait();
        if let Ok(in_flight @ Claim::InFlight { .. }) = &asked.0
            && !wait.is_zero()
        {
            // Counted here; the answer the wait ends with is counted after.
            self.observer.claim(in_flight);
            let again = Again {
                driver: self,
                request,
            };
            match self
                .claimant
                .wait_for(Ask::new(&again, &request.id), wait)
                .await
            {
                Some(answer) => {
                    self.observer.waited(wait_end(&answer.0));
                    asked = answer;
                    if let Some(released) = self.back_to_work(&request.id, &asked.0).await {
                        return Decided::Shed(released);
                    }
                }
                None => self.observer.waited(WaitEnd::Refused),
            }
        }
        if let (Ok(Claim::OutcomeUnknown { .. }), Some(settler)) = (&asked.0, self.settler)
            && settler.settle(&request.id).await
        {
            if let Ok(unknown) = &asked.0 {
                self.observer.claim(unknown);
            }
            asked = self.ask(request).await;
        }
        Decided::Claimed(asked)
    }

    /// After a wait that ended in work, asks the claimant for capacity;
    /// `Some` sheds the attempt (releasing what the wait acquired).
    async fn back_to_work(
        &self,
        id: &RecordId,
        claimed: &Result<Claim, StoreError>,
    ) -> Option<Option<Result<(), StoreError>>> {
        let works = match claimed {
            Ok(Claim::Acquired { .. }) => true,
            Ok(Claim::OutcomeUnknown { .. }) => self.settler.is_some(),
            _ => false,
        };
        if !works || self.claimant.back_to_work() {
            return None;
        }
        let Ok(claim) = claimed else { return None };
        self.observer.claim(claim);
        let Claim::Acquired { token, .. } = claim else {
            return Some(None);
        };
        let cause = "no capacity was free when the wait ended; not run";
        Some(Some(
            self.settle(id, *token, Completion::Release, cause).await,
        ))
    }

    /// Asks the store's claim, timed; returns its answer and the instant
    /// just before it was sent.
    async fn ask(&self, request: &ClaimRequest) -> Asked {
        let sent_at = Instant::now();
        let claimed = self
            .timed(
                (StoreOp::Claim, &request.id),
                self.store.claim(request),
                |claim| StoreAnswer::Claimed(claim),
            )
            .await;
        (claimed, sent_at)
    }

    /// Verifies a fresh claim inside an open suspect window: `None` to run
    /// the effect, or how the attempt ended instead.
    async fn verify_fresh<A: Answer>(
        &self,
        held: &Held<'_>,
        lease_ms: u64,
    ) -> Option<AttemptEnd<A>> {
        let window = self.window?.open_at(SystemClock.now())?;
        let id = held.id;
        let Some(verifier) = self.verifier.filter(|v| v.covers(id)) else {
            self.observer.window(WindowEnd::Unverified);
            tracing::warn!(scope = %id.scope, key = %id.key, cause = %window.cause,
                "a fresh claim inside the suspect window without a lookup: forwarded unverified \
                 to the effect; the store may have lost a record of this key");
            return None;
        };
        let verification = verifier.verify(id, &window, lease_ms).await;
        self.observer.window(window_end(&verification));
        match after_verification(verification, SystemClock.now()) {
            AfterVerification::Run => None,
            AfterVerification::Complete(result) => {
                tracing::info!(scope = %id.scope, key = %id.key,
                    "the provider has this key's effect, which the store had lost: its answer is \
                     stored and replayed, nothing run");
                let complete = self.store.complete(id, held.token, result);
                let written = self
                    .timed((StoreOp::Complete, id), complete, |_| StoreAnswer::Written)
                    .await;
                Some(AttemptEnd::Verified(written))
            }
            AfterVerification::Release { retry_after, why } => {
                if let Unverified::LookupFailed { reason } = &why {
                    // The reason names the provider's lookup URL and the
                    // cause the backup's path: the log's, not the caller's.
                    tracing::warn!(scope = %id.scope, key = %id.key, cause = %window.cause, %reason,
                        "a fresh claim inside the suspect window could not be verified; not run");
                }
                let cause = "not verified inside the suspect window; not run";
                let released = self
                    .settle(id, held.token, Completion::Release, cause)
                    .await;
                Some(AttemptEnd::Unverified {
                    why,
                    retry_after,
                    released,
                })
            }
            _ => None,
        }
    }

    /// Runs the effect within what is left of the lease, or releases the
    /// record unsent when too little is left, and writes what its end means.
    async fn run_effect<A, E, F>(&self, held: Held<'_>, effect: E) -> AttemptEnd<A>
    where
        A: Answer,
        E: FnOnce(Granted) -> F,
        F: Future<Output = A>,
    {
        let elapsed_ms = lease::elapsed_ms(held.sent_at.elapsed());
        let forward_ms = match lease::lease_left(held.lease_ms, elapsed_ms) {
            LeaseLeft::Forward { forward_ms } => forward_ms,
            LeaseLeft::TooLittle { left_ms } => return self.lease_spent(&held, left_ms).await,
        };
        let deadline = Instant::now() + Duration::from_millis(forward_ms);
        let granted = Granted {
            id: held.id.clone(),
            token: held.token,
            lease_until: held.lease_until,
            lease_ms: held.lease_ms,
            forward_ms,
            deadline,
        };
        let started = Instant::now();
        // The call is inside the caught future too: a closure that panics
        // before it returns its future is an effect that panicked.
        let caught = AssertUnwindSafe(async move { effect(granted).await }).catch_unwind();
        let ran = match tokio::time::timeout_at(deadline.into(), caught).await {
            Ok(Ok(answer)) => Ran::Answered(answer),
            Ok(Err(panic)) => match A::after_panic() {
                Some(answer) => Ran::Answered(answer),
                None => Ran::Panicked(panic),
            },
            Err(_) => Ran::LeaseEnded { forward_ms },
        };
        let end = match &ran {
            Ran::Answered(answer) => answer.end(),
            Ran::LeaseEnded { .. } => EffectEnd::LeaseEnded,
            _ => EffectEnd::Panicked,
        };
        self.observer.effect_ended(end, started.elapsed());
        match (after_effect(self.completion, end), ran) {
            (Completion::Final, Ran::Answered(answer)) => {
                self.complete(&held, deadline, answer).await
            }
            (completion, mut ran) => {
                let written = self
                    .settle(held.id, held.token, completion, &ran.cause())
                    .await;
                if completion == Completion::Unknown && written.is_ok() {
                    self.note_why(&held, deadline, &mut ran).await;
                }
                if let Ran::Panicked(_) = &ran {
                    tracing::error!(scope = %held.id.scope, key = %held.id.key, "the effect panicked");
                }
                AttemptEnd::Settled {
                    completion,
                    ran,
                    written,
                }
            }
        }
    }

    /// The store's answer left too little of its lease: nothing was run,
    /// so the record is released with the token for a later attempt, which
    /// gets a whole lease.
    async fn lease_spent<A: Answer>(&self, held: &Held<'_>, left_ms: u64) -> AttemptEnd<A> {
        let (id, lease_ms) = (held.id, held.lease_ms);
        tracing::warn!(scope = %id.scope, key = %id.key, lease_ms, left_ms,
            "the store's answer left too little of its lease; nothing was run");
        let cause = format!("the store's answer left {left_ms} ms of its {lease_ms} ms lease");
        let released = self
            .settle(id, held.token, Completion::Release, &cause)
            .await;
        AttemptEnd::LeaseSpent {
            lease_ms,
            left_ms,
            released,
        }
    }

    /// Stores a final answer. Reading it is part of the effect: read past
    /// the lease, a retry or the reconciler could judge the attempt while
    /// its answer is still arriving, so it is cut at the deadline and
    /// stored as an answer that could not be kept.
    async fn complete<A: Answer>(
        &self,
        held: &Held<'_>,
        deadline: Instant,
        answer: A,
    ) -> AttemptEnd<A> {
        let id = held.id;
        let (result, kept) = match tokio::time::timeout_at(deadline.into(), answer.keep()).await {
            Ok(Some((result, kept))) => (result, Some(kept)),
            Ok(None) => {
                let mut ran = Ran::Unstorable;
                let written = self
                    .settle(id, held.token, Completion::Unknown, &ran.cause())
                    .await;
                if written.is_ok() {
                    self.note_why(held, deadline, &mut ran).await;
                }
                return AttemptEnd::Settled {
                    completion: Completion::Unknown,
                    ran,
                    written,
                };
            }
            Err(_) => (
                StoredResult::not_stored("the body did not end before the lease's deadline"),
                None,
            ),
        };
        let complete = self.store.complete(id, held.token, result.clone());
        let written = self
            .timed((StoreOp::Complete, id), complete, |_| StoreAnswer::Written)
            .await;
        match &written {
            Ok(_) => {
                self.observer.written(Completion::Final);
                tracing::info!(scope = %id.scope, key = %id.key, status = result.status(), "completed")
            }
            Err(e @ StoreError::Fenced { .. }) => {
                tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "the result was not recorded: a newer attempt owns the record (fenced)")
            }
            Err(e) => {
                tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "could not record the result; the record will become ambiguous when its lease ends")
            }
        }
        AttemptEnd::Completed {
            result,
            kept,
            written,
        }
    }

    /// Releases or marks ambiguous (a final completion writes nothing
    /// here); a failure leaves the record in progress, which its lease
    /// turns into `ambiguous`: never into a blind re-execution. `cause`
    /// (what the effect did) goes into the log for the operator.
    async fn settle(
        &self,
        id: &RecordId,
        token: Token,
        completion: Completion,
        cause: &str,
    ) -> Result<(), StoreError> {
        let written = match completion {
            Completion::Release => {
                let release = self.store.release(id, token);
                self.timed((StoreOp::Release, id), release, |_| StoreAnswer::Written)
                    .await
            }
            Completion::Unknown => {
                let mark = self.store.mark_ambiguous(id, token);
                self.timed((StoreOp::MarkAmbiguous, id), mark, |_| StoreAnswer::Written)
                    .await
                    .map(|_| ())
            }
            Completion::Final => return Ok(()),
        };
        match &written {
            Ok(()) => {
                self.observer.written(completion);
                self.log_settled(id, completion, cause);
            }
            Err(e @ StoreError::Fenced { .. }) => {
                tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "the record was not settled: a newer attempt owns it (fenced)")
            }
            Err(e) => {
                tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "could not settle the record")
            }
        }
        written
    }

    /// Writes why the attempt's record, just marked ambiguous, is: what
    /// `ran` says, the start of its answer's body (read until `deadline`),
    /// this node and the route's summary of the request. The note only
    /// informs an operator, so a failure to write it is logged and
    /// changes nothing else.
    async fn note_why<A: Answer>(&self, held: &Held<'_>, deadline: Instant, ran: &mut Ran<A>) {
        let id = held.id;
        let cause = ran.cause();
        let (status, excerpt) = match ran {
            Ran::Answered(answer) => {
                let status = match answer.end() {
                    EffectEnd::Answered { status } => Some(status),
                    _ => None,
                };
                let excerpt = tokio::time::timeout_at(deadline.into(), answer.excerpt()).await;
                (status, excerpt.ok().flatten())
            }
            _ => (None, None),
        };
        let summary = self.summary.map(|summary| summary()).unwrap_or_default();
        let note = AmbiguityNote::new(
            status,
            &cause,
            excerpt.as_deref(),
            held.owner,
            SystemClock.now(),
            summary,
        );
        if let Err(e) = self.store.note_ambiguity(id, held.token, note).await {
            tracing::warn!(scope = %id.scope, key = %id.key, error = %e,
                "could not note why the record is ambiguous; the record is marked all the same");
        }
    }

    fn log_settled(&self, id: &RecordId, completion: Completion, cause: &str) {
        if completion != Completion::Unknown {
            tracing::debug!(scope = %id.scope, key = %id.key, cause, "released");
            return;
        }
        let awaits = match self.unknowns {
            Unknowns::Reconciler => "the reconciler (or an operator)",
            Unknowns::Operator => "an operator: nothing here reconciles it",
        };
        tracing::warn!(scope = %id.scope, key = %id.key, cause, awaits, "outcome unknown; the record awaits resolution");
    }

    /// Runs one store operation on `id` in the observer's span, timing it.
    async fn timed<T>(
        &self,
        (op, id): (StoreOp, &RecordId),
        operation: impl Future<Output = Result<T, StoreError>>,
        answer: for<'x> fn(&'x T) -> StoreAnswer<'x>,
    ) -> Result<T, StoreError> {
        let span = self.observer.store_span(op, id);
        let started = Instant::now();
        let outcome = operation.instrument(span.clone()).await;
        let said = match &outcome {
            Ok(value) => answer(value),
            Err(e) => StoreAnswer::Failed(e),
        };
        self.observer
            .store_answered(op, &span, started.elapsed(), said);
        outcome
    }
}

/// The driver asking the claim of one request again.
struct Again<'d> {
    driver: &'d Driver<'d>,
    request: &'d ClaimRequest,
}

impl AskAgain for Again<'_> {
    fn ask_again(&self) -> BoxFuture<'_, Asked> {
        Box::pin(self.driver.ask(self.request))
    }
}

/// A refusal, with the late replay named in the log.
fn refused<A: Answer>(id: &RecordId, refusal: Refusal) -> AttemptEnd<A> {
    if let Refusal::Expired { completed_at, .. } = &refusal {
        tracing::warn!(scope = %id.scope, key = %id.key,
            completed_at_ms = completed_at.map(|t| t.as_millis()),
            "late replay after retention refused; nothing was run");
    }
    AttemptEnd::Refused(refusal)
}

/// How a wait ended, from its last answer.
fn wait_end(answer: &Result<Claim, StoreError>) -> WaitEnd {
    match answer {
        Ok(Claim::InFlight { .. }) => WaitEnd::TimedOut,
        Ok(_) => WaitEnd::Answered,
        Err(_) => WaitEnd::StoreFailed,
    }
}

/// What the provider's verification counts as.
fn window_end(verification: &Verification) -> WindowEnd {
    match verification {
        Verification::Executed(_) => WindowEnd::Executed,
        Verification::NotExecuted => WindowEnd::NotExecuted,
        Verification::NotYet { .. } => WindowEnd::NotYet,
        _ => WindowEnd::LookupFailed,
    }
}

//! The layer's hooks into the attempt driver, one per protected request:
//! as [`Observe`] it counts every step into the layer's [`crate::Metrics`]
//! and traces it (`idem.claim`, `idem.complete`, `idem.release`,
//! `idem.mark_ambiguous`, `idem.forward`); as [`Claimant`] it claims again
//! with the version 1 fingerprint of a record written before version 2,
//! waits for the original on the layer's waiters (`Prefer: wait`), and
//! takes an in-flight slot again before going back to work.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use http::request::Parts;
use idem_attempt::{
    Ask, Asked, BoxFuture, Claimant, Observe, StoreAnswer, StoreOp as Op, WaitEnd, WindowEnd,
};
use idem_core::{Claim, Completion, EffectEnd, Fingerprint, RecordId, StoreError};
use tracing::Span;

use super::Shared;
use crate::metrics::{ClaimDecision, StoreOp, WaitOutcome, WindowOutcome};
use crate::request;
use crate::route::Route;
use crate::slot::InFlightSlot;
use crate::trace;
use crate::wait::{Wake, preferred_wait_ms};

/// One protected request's hooks.
pub(super) struct Hooks<'a> {
    shared: &'a Shared,
    route: &'a Route,
    /// The request until it is forwarded (read before, to claim with a
    /// legacy fingerprint).
    request: Mutex<Option<(Parts, Bytes)>>,
    /// The wait the request asked for (`Prefer: wait`), in milliseconds.
    preferred: Option<u64>,
    /// The wait the route applies, in milliseconds.
    wait_ms: u64,
    slot: Option<InFlightSlot>,
    /// The wait applied, for `Preference-Applied`, once waited.
    waited: Mutex<Option<u64>>,
    /// The forward's span while the inner service runs: recorded here when
    /// the call is cut (its lease ended) or panicked.
    forward_span: Mutex<Option<Span>>,
    /// Told once the claim acquires, for `Prefer: respond-async`: when
    /// to ask the status URL.
    acquired: Mutex<Option<tokio::sync::oneshot::Sender<Duration>>>,
}

impl<'a> Hooks<'a> {
    pub(super) fn new(
        shared: &'a Shared,
        route: &'a Route,
        request: (Parts, Bytes),
        acquired: Option<tokio::sync::oneshot::Sender<Duration>>,
    ) -> Hooks<'a> {
        let preferred = preferred_wait_ms(&request.0.headers);
        Hooks {
            shared,
            route,
            wait_ms: route.wait().applied_ms(preferred),
            preferred,
            slot: request.0.extensions.get::<InFlightSlot>().cloned(),
            request: Mutex::new(Some(request)),
            waited: Mutex::new(None),
            forward_span: Mutex::new(None),
            acquired: Mutex::new(acquired),
        }
    }

    /// The request, to forward it.
    pub(super) fn take_request(&self) -> Option<(Parts, Bytes)> {
        locked(&self.request).take()
    }

    /// The wait applied, when the request asked for one and waited.
    pub(super) fn waited(&self) -> Option<u64> {
        *locked(&self.waited)
    }

    /// The forward's span, held until the call answers.
    pub(super) fn forwarding(&self, span: Span) {
        *locked(&self.forward_span) = Some(span);
    }

    /// The call answered: its outcome goes on its span.
    pub(super) fn forwarded<B, E>(&self, outcome: &Result<Response<B>, E>) {
        if let Some(span) = locked(&self.forward_span).take() {
            trace::record_forward(&span, outcome);
        }
    }
}

impl Observe for Hooks<'_> {
    fn store_span(&self, op: Op, id: &RecordId) -> Span {
        trace::store_span(store_op(op), id)
    }

    fn store_answered(&self, op: Op, span: &Span, elapsed: Duration, answer: StoreAnswer<'_>) {
        let (op, metrics) = (store_op(op), &self.shared.metrics);
        metrics.observe_store(op, elapsed);
        match answer {
            StoreAnswer::Claimed(claim) => {
                trace::record_store(span, op, &Ok::<_, StoreError>(claim), |c| decision(c))
            }
            StoreAnswer::Failed(e) => {
                match e {
                    StoreError::Fenced { .. } => metrics.fenced_write(),
                    _ => metrics.store_error(),
                }
                trace::record_store(span, op, &Err::<(), _>(e.clone()), |_| "");
            }
            _ => trace::record_store(span, op, &Ok::<_, StoreError>(()), |_| written(op)),
        }
    }

    fn claim(&self, claim: &Claim) {
        self.shared.metrics.claim(claim);
        if let Claim::Acquired { lease_ms, .. } = claim
            && let Some(acquired) = locked(&self.acquired).take()
        {
            // When to ask the status URL: the time a forward typically
            // takes, within the lease the store granted. The request may
            // have stopped listening; the attempt goes on.
            let lease = Duration::from_millis(*lease_ms);
            let typical = self.route.latency.typical();
            let _ = acquired.send(crate::pace::retry_after(Duration::ZERO, typical, lease));
        }
    }

    fn waited(&self, end: WaitEnd) {
        self.shared.metrics.wait(match end {
            WaitEnd::Answered => WaitOutcome::Answered,
            WaitEnd::TimedOut => WaitOutcome::TimedOut,
            WaitEnd::StoreFailed => WaitOutcome::StoreFailed,
            _ => WaitOutcome::Refused,
        });
    }

    fn window(&self, end: WindowEnd) {
        self.shared.metrics.window_claim(match end {
            WindowEnd::Executed => WindowOutcome::Executed,
            WindowEnd::NotExecuted => WindowOutcome::NotExecuted,
            WindowEnd::NotYet => WindowOutcome::NotYet,
            WindowEnd::LookupFailed => WindowOutcome::LookupFailed,
            _ => WindowOutcome::Unverified,
        });
    }

    fn written(&self, completion: Completion) {
        self.shared.metrics.completion(completion);
    }

    fn effect_ended(&self, end: EffectEnd, elapsed: Duration) {
        self.shared.metrics.observe_upstream(elapsed);
        if let EffectEnd::Answered { .. } = end {
            self.route.latency.observe(elapsed);
        }
        // Still held: the call never answered (cut at the lease's end, or
        // it panicked and the driver answered for it).
        let Some(span) = locked(&self.forward_span).take() else {
            return;
        };
        let mut answer = Response::new(());
        match end {
            EffectEnd::Answered { status } => {
                *answer.status_mut() = http::StatusCode::from_u16(status).unwrap_or_default();
            }
            EffectEnd::Failed(failure) => {
                answer.extensions_mut().insert(failure);
            }
            _ => {
                answer
                    .extensions_mut()
                    .insert(idem_core::AttemptOutcome::Lost);
            }
        }
        trace::record_forward(&span, &Ok::<_, StoreError>(answer));
    }
}

impl Claimant for Hooks<'_> {
    fn legacy_fingerprint(&self, stored: &Fingerprint) -> Option<Fingerprint> {
        let request = locked(&self.request);
        let (parts, body) = request.as_ref()?;
        request::legacy_fingerprint(parts, self.route, body).filter(|legacy| legacy == stored)
    }

    fn wait(&self) -> Duration {
        Duration::from_millis(self.wait_ms)
    }

    fn wait_for<'b>(&'b self, ask: Ask<'b>, _wait: Duration) -> BoxFuture<'b, Option<Asked>> {
        Box::pin(async move {
            let answer = self.wait_for_original(ask).await?;
            *locked(&self.waited) = self.preferred.map(|_| self.wait_ms);
            Some(answer)
        })
    }

    /// Takes an in-flight slot again after a wait, before the request goes
    /// on to work: to forward the attempt the wait acquired, or to look up
    /// an unknown outcome. With none free it is answered as a fresh request
    /// would be, 503 `overloaded` (the key the wait acquired released
    /// unsent); a request with no slot needs none.
    fn back_to_work(&self) -> bool {
        self.slot.as_ref().is_none_or(InFlightSlot::take_again)
    }
}

impl Hooks<'_> {
    /// Waits, up to the route's wait, for the attempt that holds the key:
    /// asks the claim again whenever the waiters are woken or it is this
    /// waiter's turn to poll, until the answer is other than in flight or
    /// the time is up. `None`: over the waiter limits, not registered. A
    /// registered waiter gives its in-flight slot back: it waits on the
    /// waiters' budget, and [`Claimant::back_to_work`] takes one again.
    async fn wait_for_original(&self, ask: Ask<'_>) -> Option<Asked> {
        let id = ask.id();
        let waiting = self.shared.waiters.register(id, &self.shared.metrics)?;
        if let Some(slot) = &self.slot {
            slot.give_back();
        }
        let deadline = Instant::now() + Duration::from_millis(self.wait_ms);
        // A store shared with other gateways then tells this one when the
        // record completes there; failing that, the poll still finds it.
        let _ = self.shared.store.note_waiting(id).await;
        loop {
            let armed = waiting.armed();
            tokio::pin!(armed);
            armed.as_mut().enable();
            let asked = ask.ask().await;
            match &asked.0 {
                Ok(Claim::InFlight { .. }) => {}
                Ok(_) => {
                    waiting.changed();
                    return Some(asked);
                }
                Err(_) => return Some(asked),
            }
            if waiting.next(armed.as_mut(), deadline).await == Wake::Done {
                return Some(asked);
            }
        }
    }
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks left its value whole.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn store_op(op: Op) -> StoreOp {
    match op {
        Op::Claim => StoreOp::Claim,
        Op::Complete => StoreOp::Complete,
        Op::Release => StoreOp::Release,
        _ => StoreOp::MarkAmbiguous,
    }
}

/// What a write that was applied is called on its span.
fn written(op: StoreOp) -> &'static str {
    match op {
        StoreOp::Complete => "completed",
        StoreOp::Release => "released",
        _ => "ambiguous",
    }
}

/// A claim's decision as the metrics name it.
fn decision(claim: &Claim) -> &'static str {
    ClaimDecision::of(claim).map_or("unknown", ClaimDecision::as_str)
}

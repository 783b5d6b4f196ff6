//! The in-flight limit: a request takes one of `requests_in_flight_max`
//! slots at once or is shed with 503 `overloaded`, nothing claimed or
//! forwarded. It carries its slot ([`InFlightSlot`]) in its extensions so
//! that the idempotency layer gives it back while the request only waits
//! for another attempt's outcome: a waiter is bounded by the waiters' own
//! budget, and one key's retry storm leaves the slots to other tenants'
//! work (docs/http.md, "Waiting for the original").

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use http::Request;
use idem_http::{InFlightSlot, Metrics, Problem, ProblemKind};
use tokio::sync::Semaphore;
use tower::{Service, ServiceExt};

/// Serves `inner` with at most `slots` requests in flight at once.
#[derive(Clone)]
pub(crate) struct InFlight<S> {
    inner: S,
    slots: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

impl<S> InFlight<S> {
    pub(crate) fn new(inner: S, slots: usize, metrics: Arc<Metrics>) -> InFlight<S> {
        InFlight {
            inner,
            slots: Arc::new(Semaphore::new(slots)),
            metrics,
        }
    }
}

impl<S> Service<Request<Body>> for InFlight<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    // Always ready: a slot is taken in `call`, at once or not at all, so
    // that a request over the limit is answered instead of queued.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        let Some(slot) = InFlightSlot::try_take(&self.slots) else {
            let shed = shed(&self.metrics);
            return Box::pin(async move { Ok(shed) });
        };
        req.extensions_mut().insert(slot.clone());
        // The slot is given back when the request is answered, or when its
        // future is dropped unanswered.
        let held = Held(slot);
        let answer = self.inner.clone().oneshot(req);
        Box::pin(async move {
            let answer = answer.await;
            drop(held);
            answer
        })
    }
}

/// Gives its slot back when dropped.
struct Held(InFlightSlot);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.give_back();
    }
}

/// The answer to a request that found no slot free.
fn shed(metrics: &Metrics) -> Response {
    let kind = ProblemKind::Overloaded;
    metrics.problem(kind);
    Problem::new(
        kind,
        "service overloaded: too many requests in flight (requests_in_flight_max); nothing \
         was forwarded",
    )
    .retry_after(1)
    .into_response()
}

//! The proxy's edge before its in-flight limit, so that a slow client holds
//! only its own connection: a request takes one of the
//! `requests_in_flight_max` slots only once it has something to work on. A
//! request whose body the gateway buffers anyway (a protected route's, when
//! it carries a key) is read here first, in full, within
//! `body_read_timeout_ms`, and so is any other body declared small enough
//! to buffer; only then does the request ask for a slot. Every byte so
//! buffered, from its arrival to the request's answer, counts against
//! `body_buffer_bytes_max`, so that slow bodies and bodies in flight
//! together never hold more memory than that, and a slow client holds only
//! the bytes it sent. Once admitted, a request runs on a task of its own:
//! a client that hangs up frees nothing it holds before its attempt ends.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::response::Response;
use bytes::Bytes;
use http::{Request, header};
use hyper::body::{Frame, SizeHint};
use idem_http::{Metrics, Problem, ProblemKind, Route, normalize_path};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{BoxError, Service, ServiceExt};

/// The body of a request no route protects is buffered before the
/// in-flight slot when its declared length is at most this, in bytes;
/// a longer or chunked one streams to the upstream, within
/// `response_timeout_ms`.
pub const UNPROTECTED_BUFFER_BYTES_MAX: usize = idem_http::BODY_BYTES_MAX_DEFAULT;

/// Reads what a request needs before it may ask `inner` (the in-flight
/// limit and everything behind it) for a slot.
#[derive(Clone)]
pub(crate) struct Admission<S> {
    inner: S,
    routes: Arc<[Route]>,
    body_read_timeout: Duration,
    metrics: Arc<Metrics>,
    /// One permit per byte of `body_buffer_bytes_max`.
    budget: Arc<Semaphore>,
}

/// What one request's buffered body holds of the budget, until its answer.
#[derive(Default)]
struct Reservation {
    permits: Mutex<Option<OwnedSemaphorePermit>>,
    /// Whether a frame found the budget spent (the read failed for it).
    spent: AtomicBool,
}

/// A request body that takes its bytes from the budget as they arrive.
struct Budgeted {
    body: Body,
    budget: Arc<Semaphore>,
    reservation: Arc<Reservation>,
}

/// The budget had no room for a frame.
#[derive(Debug)]
struct BudgetSpent;

/// What the edge does with a request's body before the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyPlan {
    /// Nothing to wait for (no body), or a body that streams.
    Pass,
    /// Read it in full, within the deadline, up to this many bytes.
    Buffer(usize),
}

impl<S> Admission<S> {
    /// The edge in front of `inner` for `routes`; buffered bodies share
    /// `body_buffer_bytes_max` bytes.
    pub(crate) fn new(
        inner: S,
        routes: &[Route],
        (body_read_timeout, body_buffer_bytes_max): (Duration, usize),
        metrics: Arc<Metrics>,
    ) -> Admission<S> {
        Admission {
            inner,
            routes: routes.into(),
            body_read_timeout,
            metrics,
            budget: Arc::new(Semaphore::new(
                body_buffer_bytes_max.min(Semaphore::MAX_PERMITS),
            )),
        }
    }
}

impl<S> Service<Request<Body>> for Admission<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    // Always ready: `inner` is asked for readiness (its slot) only in
    // `call`, once the body is in.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let plan = plan(&req, &self.routes);
        let (timeout, metrics) = (self.body_read_timeout, self.metrics.clone());
        let budget = self.budget.clone();
        Box::pin(async move {
            let (req, reservation) = match plan {
                BodyPlan::Pass => (req, None),
                BodyPlan::Buffer(limit) => match buffer(req, limit, timeout, budget).await {
                    Ok(buffered) => buffered,
                    Err(problem) => {
                        metrics.problem(problem.kind);
                        return Ok(problem.into_response());
                    }
                },
            };
            // On a task of its own, so that a client that hangs up cancels
            // nothing: the request keeps its in-flight slot and its body's
            // bytes until its attempt has ended and recorded its outcome.
            let answered = tokio::spawn(async move {
                let answer = inner.oneshot(req).await;
                // The body's bytes count until the request is answered.
                drop(reservation);
                answer
            });
            match answered.await {
                Ok(answer) => answer,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => Ok(Problem::new(
                    ProblemKind::UpstreamFailed,
                    "the request was stopped before it answered: the gateway is shutting down",
                )
                .into_response()),
            }
        })
    }
}

impl HttpBody for Budgeted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let bytes = frame.data_ref().map_or(0, Bytes::len);
                match this.reserve(bytes) {
                    Ok(()) => Poll::Ready(Some(Ok(frame))),
                    Err(e) => Poll::Ready(Some(Err(e.into()))),
                }
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Budgeted {
    /// Takes `bytes` from the budget, without waiting: a body that finds
    /// no room fails at once rather than queue behind the others.
    fn reserve(&mut self, bytes: usize) -> Result<(), BudgetSpent> {
        if bytes == 0 {
            return Ok(());
        }
        let permits = u32::try_from(bytes).map_err(|_| BudgetSpent);
        let taken = permits.and_then(|n| {
            self.budget
                .clone()
                .try_acquire_many_owned(n)
                .map_err(|_| BudgetSpent)
        });
        let Ok(taken) = taken else {
            self.reservation.spent.store(true, Ordering::Relaxed);
            return Err(BudgetSpent);
        };
        let mut held = self
            .reservation
            .permits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match held.as_mut() {
            Some(permit) => permit.merge(taken),
            None => *held = Some(taken),
        }
        Ok(())
    }
}

impl std::fmt::Display for BudgetSpent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request bodies buffered at once are at body_buffer_bytes_max")
    }
}

impl std::error::Error for BudgetSpent {}

/// Whether `req`'s body is read before the slot, and up to how much: a
/// protected route's body when the request carries its key (the layer
/// reads it in full anyway, under the route's limit), any other body
/// declared within [`UNPROTECTED_BUFFER_BYTES_MAX`].
fn plan(req: &Request<Body>, routes: &[Route]) -> BodyPlan {
    if req.body().is_end_stream() {
        return BodyPlan::Pass;
    }
    // A path the layer refuses is refused without its body: nothing to
    // read for it here either.
    let Ok(path) = normalize_path(req.uri().path()) else {
        return BodyPlan::Pass;
    };
    let route = routes.iter().find(|r| r.matches(req.method(), &path));
    if let Some(route) = route
        && req.headers().contains_key(route.key_header())
    {
        return BodyPlan::Buffer(route.body_bytes_max());
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n <= UNPROTECTED_BUFFER_BYTES_MAX as u64 => {
            BodyPlan::Buffer(UNPROTECTED_BUFFER_BYTES_MAX)
        }
        _ => BodyPlan::Pass,
    }
}

/// `req` with its body read in full within `timeout`, its bytes taken from
/// `budget`, and what it holds of it: 408 `body-timeout` past the
/// deadline, 503 `overloaded` when the budget has no room, the layer's own
/// 413 or 400 when the body is too large or broken.
async fn buffer(
    req: Request<Body>,
    limit: usize,
    timeout: Duration,
    budget: Arc<Semaphore>,
) -> Result<(Request<Body>, Option<Arc<Reservation>>), Problem> {
    let (parts, body) = req.into_parts();
    let reservation = Arc::new(Reservation::default());
    let body = Budgeted {
        body,
        budget,
        reservation: reservation.clone(),
    };
    let read = idem_http::read_body(&parts.headers, body, limit);
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(bytes)) => Ok((
            Request::from_parts(parts, Body::from(bytes)),
            Some(reservation),
        )),
        Ok(Err(_)) if reservation.spent.load(Ordering::Relaxed) => Err(Problem::new(
            ProblemKind::Overloaded,
            "the request bodies the gateway buffers at once are at body_buffer_bytes_max; \
             nothing was claimed or forwarded",
        )
        .retry_after(1)),
        Ok(Err(problem)) => Err(problem),
        Err(_) => Err(Problem::new(
            ProblemKind::BodyTimeout,
            format!(
                "the body did not arrive in full within {} ms (body_read_timeout_ms); \
                 nothing was claimed or forwarded",
                timeout.as_millis()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failure here is a failed test

    use super::*;
    use idem_http::RouteSpec;

    #[test]
    fn a_body_is_read_before_the_slot_when_the_gateway_buffers_it_anyway() {
        let route = Route::new(&RouteSpec {
            path: Some("/payouts/**".into()),
            body_bytes_max: Some(2048),
            ..RouteSpec::default()
        })
        .unwrap();
        let big = (UNPROTECTED_BUFFER_BYTES_MAX + 1).to_string();
        let small = UNPROTECTED_BUFFER_BYTES_MAX.to_string();
        // (method, path, key sent, content-length, body, plan)
        let cases = [
            (
                "POST",
                "/payouts/1",
                true,
                Some("5"),
                "hello",
                BodyPlan::Buffer(2048),
            ),
            // The layer reads a protected body whatever its declared size.
            (
                "POST",
                "/payouts/1",
                true,
                Some(big.as_str()),
                "x",
                BodyPlan::Buffer(2048),
            ),
            // Matched leniently, as the layer matches.
            (
                "POST",
                "/PAYOUTS/./1",
                true,
                None,
                "x",
                BodyPlan::Buffer(2048),
            ),
            (
                "POST",
                "/payouts/1",
                false,
                Some("5"),
                "hello",
                BodyPlan::Buffer(UNPROTECTED_BUFFER_BYTES_MAX),
            ),
            (
                "PUT",
                "/other",
                true,
                Some(small.as_str()),
                "x",
                BodyPlan::Buffer(UNPROTECTED_BUFFER_BYTES_MAX),
            ),
            (
                "PUT",
                "/other",
                false,
                Some(big.as_str()),
                "x",
                BodyPlan::Pass,
            ),
            // Chunked, no route: it streams.
            ("PUT", "/other", false, None, "x", BodyPlan::Pass),
            ("GET", "/payouts/1", true, None, "", BodyPlan::Pass),
            // A path the layer refuses is refused unread.
            (
                "POST",
                "/payouts/%2e%2e/x",
                true,
                Some("5"),
                "hello",
                BodyPlan::Pass,
            ),
        ];
        for (method, path, keyed, length, body, expect) in cases {
            let mut req = Request::builder().method(method).uri(path);
            if keyed {
                req = req.header("idempotency-key", "k-1");
            }
            if let Some(length) = length {
                req = req.header(header::CONTENT_LENGTH, length);
            }
            let body = if body.is_empty() {
                Body::empty()
            } else {
                Body::from(body.to_owned())
            };
            let req = req.body(body).unwrap();
            let routes = std::slice::from_ref(&route);
            assert_eq!(
                plan(&req, routes),
                expect,
                "{method} {path} key={keyed} {length:?}"
            );
        }
    }
}

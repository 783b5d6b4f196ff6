//! HTTP functions (API Gateway REST and HTTP APIs, function URLs, ALB):
//! idem-http's [`idem_http::IdempotencyLayer`] itself, applied to
//! lambda_http's requests. Not a second implementation: the layer runs
//! unchanged over a body type it can buffer and rebuild ([`Buffered`]), and
//! this module only converts lambda_http's [`Body`] to it on the way in and
//! back on the way out.
//!
//! ```
//! use std::sync::Arc;
//! use idem_core::{MemoryStore, SystemClock};
//! use idem_http::Route;
//! use lambda_http::{Body, Request, Response, service_fn, tower::Layer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
//! let layer = idem_lambda::IdempotencyLayer::from(Route::builder().name("payouts").layer(store)?);
//! let _service = layer.layer(service_fn(|_: Request| async {
//!     Ok::<_, lambda_http::Error>(Response::new(Body::from("paid")))
//! }));
//! // lambda_http::run(_service).await
//! # Ok(())
//! # }
//! ```

use std::convert::Infallible;
use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use idem_http::LeaseCap;
use lambda_http::{Body, RequestExt};
use tower::{Layer, Service};

use crate::sqs::{DEADLINE_MARGIN_MS_DEFAULT, lease_ms_max};

/// Wraps lambda_http services in [`Idempotency`]; built from the layer
/// idem-http builds (`Route::builder()…layer(store)`, or
/// `IdempotencyLayer::new` with routes).
#[derive(Clone)]
pub struct IdempotencyLayer {
    inner: idem_http::IdempotencyLayer,
}

/// The middleware over a lambda_http service: idem-http's
/// [`idem_http::Idempotency`] with lambda_http's body converted at each
/// side. Protected requests are claimed, forwarded once and replayed
/// (`idempotent-replayed: true`) as the layer does anywhere else.
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: idem_http::Idempotency<Lambda<S>>,
}

/// A body held whole in memory: what the layer reads the request into
/// before it claims, and what a replay is rebuilt from. API Gateway and
/// function URLs hand a function the whole body at once, so nothing is
/// lost by holding it.
#[derive(Clone, Debug, Default)]
pub struct Buffered(Option<Bytes>);

/// The lambda_http service, seen with [`Buffered`] bodies.
#[derive(Clone)]
struct Lambda<S>(S);

type Answer<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

impl From<idem_http::IdempotencyLayer> for IdempotencyLayer {
    /// `Prefer: respond-async` is ignored here: Lambda freezes the
    /// execution environment once the answer is sent, so an attempt going
    /// on after a 202 would be frozen mid-effect.
    fn from(inner: idem_http::IdempotencyLayer) -> IdempotencyLayer {
        IdempotencyLayer {
            inner: inner.without_respond_async(),
        }
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency {
            inner: self.inner.layer(Lambda(inner)),
        }
    }
}

impl<S> Service<Request<Body>> for Idempotency<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Display + Send,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Answer<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        // The invocation's remaining time bounds the lease, as it does an
        // SQS record's: a timed-out invocation's record blocks no retry
        // longer than the invocation could have run.
        if let Some(context) = req.lambda_context_ref() {
            let left_ms = lease_ms_max(
                context.deadline(),
                SystemTime::now(),
                DEADLINE_MARGIN_MS_DEFAULT,
            );
            req.extensions_mut()
                .insert(LeaseCap(Duration::from_millis(left_ms)));
        }
        let answer = self.inner.call(req.map(Buffered::from_lambda));
        Box::pin(async move { answer.await.map(|res| res.map(Buffered::into_lambda)) })
    }
}

impl<S> Service<Request<Buffered>> for Lambda<S>
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<Buffered>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Buffered>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Buffered>) -> Self::Future {
        let answer = self.0.call(req.map(Buffered::into_lambda));
        Box::pin(async move { answer.await.map(|res| res.map(Buffered::from_lambda)) })
    }
}

impl Buffered {
    /// lambda_http's body, whole.
    pub fn from_lambda(body: Body) -> Buffered {
        let bytes = match body {
            Body::Text(text) => Bytes::from(text),
            Body::Binary(bytes) => Bytes::from(bytes),
            _ => Bytes::new(),
        };
        Buffered(Some(bytes))
    }

    /// Back to lambda_http's body: text when the bytes are UTF-8 (API
    /// Gateway passes it as it is), binary otherwise (base64-encoded on
    /// the wire), empty when there are none.
    pub fn into_lambda(self) -> Body {
        let bytes = self.0.unwrap_or_default();
        if bytes.is_empty() {
            return Body::Empty;
        }
        match String::from_utf8(Vec::from(bytes)) {
            Ok(text) => Body::Text(text),
            Err(e) => Body::Binary(e.into_bytes()),
        }
    }
}

impl From<Bytes> for Buffered {
    fn from(bytes: Bytes) -> Buffered {
        Buffered(Some(bytes))
    }
}

impl HttpBody for Buffered {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let chunk = self.get_mut().0.take().filter(|b| !b.is_empty());
        Poll::Ready(chunk.map(|bytes| Ok(Frame::data(bytes))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(Bytes::is_empty)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |b| b.len() as u64))
    }
}

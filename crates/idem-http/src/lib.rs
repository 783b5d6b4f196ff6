//! The Idempotency-Key contract over HTTP, as a tower middleware: the same
//! semantics in-process (axum/hyper services) and in the `idem serve` gateway.
//!
//! [`IdempotencyLayer`] wraps a service; for each request that a [`Route`]
//! protects it parses the key, reads the body (413 over the limit, before
//! any claim), derives the scope and fingerprint, claims the record, and
//! then either calls the inner service exactly once and records its answer,
//! or answers itself: a replay of the stored result, or an RFC 9457 problem.
//! The inner service's failures become responses, never new error types.
//! Every decision is counted in [`Metrics`] (share one `Arc<Metrics>` with
//! [`IdempotencyLayer::with_metrics`] and serve [`Metrics::render`]).
//!
//! Every listed route also answers `GET <path>/.idem/{key}` (the status
//! URL: what became of the caller's own key, in its own scope, never a
//! claim) and `GET <path>/.idem` (its policy as JSON); a protected request
//! with `Prefer: respond-async` is answered 202 with that URL once claimed.
//!
//! A route is built in the service's types ([`Route::builder`]: `Method`,
//! `Duration`, byte sizes, closures for the principal) or read from a
//! config file's [`RouteSpec`] into the same builder. Built without a path,
//! it protects whatever it wraps: axum's `route_layer`.
//!
//! Features, all off by default: `jwt` (principals from verified bearer
//! JWTs), `otel` (spans joined to the caller's OpenTelemetry trace), `axum`
//! (operations named by axum's matched route).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::{Method, Request, Response};
//! use http_body_util::Full;
//! use idem_core::{MemoryStore, SystemClock};
//! use idem_http::Route;
//! use tower::{Layer, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem_http::RouteError> {
//! let effects = Arc::new(std::sync::atomic::AtomicUsize::new(0));
//! let counter = effects.clone();
//! let payouts = service_fn(move |_req: Request<Full<Bytes>>| {
//!     let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
//!     async move { Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(format!("payout {n}"))))) }
//! });
//! let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
//! let layer = Route::builder()
//!     .name("payouts")
//!     .methods([Method::POST])
//!     .lease(Duration::from_secs(10))
//!     .layer(store)?;
//! let service = layer.layer(payouts);
//!
//! for _ in 0..2 {
//!     let req = Request::post("/payouts").header("Idempotency-Key", "\"p-847\"")
//!         .body(Full::new(Bytes::from_static(b"{\"amount\":100}"))).unwrap();
//!     let res = service.clone().oneshot(req).await.unwrap();
//!     assert_eq!(res.status(), 200);
//! }
//! assert_eq!(effects.load(std::sync::atomic::Ordering::SeqCst), 1);
//! # Ok(())
//! # }
//! ```

mod builder;
mod completion;
mod cors;
mod gate;
mod gauges;
mod metrics;
mod pace;
mod path;
mod principal;
mod problem;
mod request;
mod route;
mod service;
mod setting;
mod slot;
mod status;
mod trace;
mod wait;

pub use builder::{MissingKey, RouteBuilder};
pub use completion::CompletionSpec;
pub use cors::{CorsExpose, EXPOSED_HEADERS};
pub use gate::{BeforeClaim, ClaimGate, Gate, GateAnswer};
pub use gauges::{AmbiguousGroup, GaugeSample, Gauges};
pub use idem_core::{AttemptOutcome, Completion, CompletionTable, Dedup};
pub use idem_core::{SettleOnRetry, VerifyFresh};
pub use metrics::{
    ClaimDecision, LATENCY_BUCKETS_S, METRICS_CONTENT_TYPE, Metrics, Resolver, StoreOp,
    WaitOutcome, WindowOutcome,
};
pub use pace::{LATENCY_EWMA_WEIGHT, RETRY_AFTER_S_MIN, retry_after};
pub use path::{PathRefusal, normalize_path};
pub use principal::{
    ANONYMOUS, ClientCertificate, DEFAULT_CREDENTIAL_HEADERS, JwtSpec, KEYS_FILE_BYTES_MAX,
    PRINCIPAL_BYTES_MAX, PRINCIPAL_DIGEST_BYTES, PrincipalKind, PrincipalSpec, TOKEN_BYTES_MAX,
    TOKEN_LEEWAY_S, TenantSearchError,
};
pub use problem::{ErrorDialect, PROBLEM_TYPE_PREFIX, Problem, ProblemKind, ProblemType};
pub use route::{
    BODY_BYTES_MAX_DEFAULT, BODY_BYTES_MAX_LIMIT, FORWARD_TEXT_BYTES_MAX, ForwardKeySpec,
    ForwardedScope, HomeSpec, OPERATION_NAME_BYTES_MAX, PathPattern, RegionsSpec, Route, RouteSpec,
    RouteWait,
};
pub use service::{
    Attempts, EXPIRES_HEADER, Idempotency, IdempotencyLayer, LeaseCap, LeaseDeadline,
    OWNED_HEADERS, REPLAYED_HEADER, RESPONSE_BYTES_MAX, UnknownOutcomes, read_body,
};
pub use setting::RouteError;
pub use slot::InFlightSlot;
pub use status::{STATUS_SUFFIX_BYTES_MAX, STATUS_URL_DEFAULT, STATUS_URL_OFF, StatusUrl};
pub use trace::TRACESTATE_BYTES_MAX;
pub use wait::{
    WAIT_MS_LIMIT, WAIT_POLL_MS, WAITERS_MAX_DEFAULT, WAITERS_PER_KEY_MAX_DEFAULT,
    WAITERS_PER_PRINCIPAL_MAX_DEFAULT, WaitLimits, preferred_wait_ms,
};

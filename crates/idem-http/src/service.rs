//! The middleware in tower's shape: [`IdempotencyLayer`] builds
//! [`Idempotency<S>`], whose future runs one request through the contract
//! and records every decision it makes in [`Metrics`] and, as spans, in
//! the request's trace (see `trace`). A protected request is `protect`'s:
//! the attempt itself is the driver every adapter shares
//! ([`idem_attempt::Driver`]); `hooks` plugs the layer's metrics, spans,
//! waits and slots into it, `forward` is its effect, and `replay` and
//! `refusal` render how it ended.

mod forward;
mod hooks;
mod protect;
mod refusal;
mod replay;
mod status;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use http_body::Body as HttpBody;
use idem_core::{
    AttemptOutcome, Completion, LimitError, RecordId, SettleOnRetry, Store, VerifyFresh,
    WindowWatch,
};
use tower::{Layer, Service};
use tracing::Instrument;

pub use forward::LeaseDeadline;
pub use protect::{LeaseCap, read_body};
pub use replay::{EXPIRES_HEADER, OWNED_HEADERS};

use crate::gate::ClaimGate;
use crate::metrics::Metrics;
use crate::path::normalize_path;
use crate::problem::{Problem, ProblemKind, ProblemStyle};
use crate::route::Route;
use crate::status::Asked;
use crate::trace;
use crate::wait::{WaitLimits, Waiters};
use protect::detached;
use refusal::problem;
use replay::without_owned_headers;

/// The header added to every replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// The largest upstream response passed through, in bytes; a stored result
/// is further limited to [`idem_core::RESULT_BODY_BYTES_MAX`].
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Wraps services in [`Idempotency`].
#[derive(Clone)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

/// The attempts of one [`IdempotencyLayer`] (and of every service it
/// wraps) that run on tasks of their own: every protected request's.
#[derive(Clone, Debug)]
pub struct Attempts(tokio_util::task::TaskTracker);

impl Attempts {
    /// How many attempts are running now.
    pub fn running(&self) -> usize {
        self.0.len()
    }

    /// Resolves once no attempt is running: every one started so far has
    /// ended, as has any started meanwhile. Each ends by its lease's
    /// deadline plus the store's writes, so this is bounded by the longest
    /// lease of the layer's routes; bound it tighter with a timeout if the
    /// process must stop sooner (an attempt cut then is left for the
    /// reconciler, as after a crash).
    pub async fn finished(&self) {
        self.0.close();
        self.0.wait().await;
    }
}

/// The middleware: enforces the Idempotency-Key contract on protected routes
/// and passes everything else to `S` untouched.
///
/// A protected request is passed to `S` only with enough of its lease left,
/// and cut when the lease ends ([`LeaseDeadline`], docs/http.md "The
/// forward's deadline"), on tokio's timer: the runtime the layer runs on
/// must have time enabled (`#[tokio::main]` and axum's do).
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    shared: Arc<Shared>,
}

#[derive(Clone)]
struct Shared {
    store: Arc<dyn Store>,
    routes: Vec<Route>,
    owner: String,
    region: Option<String>,
    metrics: Arc<Metrics>,
    gate: Option<Arc<dyn ClaimGate>>,
    waiters: Arc<Waiters>,
    settler: Option<Arc<dyn SettleOnRetry>>,
    window: Arc<WindowWatch>,
    verifier: Option<Arc<dyn VerifyFresh>>,
    unknown: UnknownOutcomes,
    /// The base of the problems' `type` URIs; `None`: `urn:idem:problem:`.
    problem_type_base: Option<Arc<str>>,
    /// The routes nothing settles are named once per layer, however many
    /// services it wraps (axum wraps each route's).
    unsettled_named: Arc<std::sync::Once>,
    /// Every attempt's task ([`IdempotencyLayer::attempts`]).
    attempts: tokio_util::task::TaskTracker,
    /// Whether `Prefer: respond-async` is honoured
    /// ([`IdempotencyLayer::without_respond_async`]).
    respond_async: bool,
}

/// Who settles an attempt whose outcome is unknown (an `ambiguous`
/// record: a 5xx the route does not declare final or released, a panic, an
/// answer cut at the lease's end). Declared on the layer, so that a setup
/// in which nothing ever settles a key is named at start and its 409 says
/// so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnknownOutcomes {
    /// Nothing in this process: only an operator (`idem records resolve`,
    /// the admin API). The default; the layer warns at build for each
    /// route that can leave one.
    Operator,
    /// A reconciler runs against the same store and asks the provider by
    /// the route's lookup: beside the layer (`idem_reconcile::Reconciler`,
    /// `run`), in `idem reconcile`, or in the gateway. Implied by
    /// [`IdempotencyLayer::with_settle_on_retry`].
    Reconciler,
}

impl IdempotencyLayer {
    /// A layer over `store` protecting `routes` (first match wins). It counts
    /// into metrics of its own until [`IdempotencyLayer::with_metrics`].
    /// Each route that declares no principal is named in a warning.
    pub fn new(store: Arc<dyn Store>, routes: Vec<Route>) -> IdempotencyLayer {
        warn_undeclared(&routes);
        IdempotencyLayer {
            shared: Arc::new(Shared {
                store,
                routes,
                owner: format!("idem-{}", std::process::id()),
                region: None,
                metrics: Arc::default(),
                gate: None,
                waiters: Arc::new(Waiters::new(WaitLimits::default())),
                settler: None,
                window: Arc::default(),
                verifier: None,
                unknown: UnknownOutcomes::Operator,
                problem_type_base: None,
                unsettled_named: Arc::new(std::sync::Once::new()),
                attempts: tokio_util::task::TaskTracker::new(),
                respond_async: true,
            }),
        }
    }

    /// Declares who settles this layer's unknown outcomes (see
    /// [`UnknownOutcomes`]); without it, only an operator does.
    pub fn with_unknown_outcomes(self, settled_by: UnknownOutcomes) -> IdempotencyLayer {
        self.edit(|shared| shared.unknown = settled_by)
    }

    /// Sets the owner label written on records this layer acquires (a node
    /// name helps an operator tell which gateway held a record).
    pub fn with_owner(self, owner: impl Into<String>) -> IdempotencyLayer {
        let owner = owner.into();
        self.edit(|shared| shared.owner = owner)
    }

    /// Sets the region written on records this layer acquires (none by
    /// default), so an operator sees where an attempt came from. Refused
    /// when it is not a region name ([`idem_core::check_region`]): every
    /// claim would fail with it.
    pub fn with_region(self, region: impl Into<String>) -> Result<IdempotencyLayer, LimitError> {
        let region = region.into();
        idem_core::check_region(&region)?;
        Ok(self.edit(|shared| shared.region = Some(region)))
    }

    /// Counts every decision into `metrics`, shared with whatever renders
    /// them (the gateway's admin API, your own `/metrics` handler).
    pub fn with_metrics(self, metrics: Arc<Metrics>) -> IdempotencyLayer {
        self.edit(|shared| shared.metrics = metrics)
    }

    /// Asks `gate` before every claim whether to claim here at all (a
    /// gateway's home-region routing); without one, every request with a
    /// key is claimed here.
    pub fn with_gate(self, gate: Arc<dyn ClaimGate>) -> IdempotencyLayer {
        self.edit(|shared| shared.gate = Some(gate))
    }

    /// Bounds how many requests may wait for an original attempt at once
    /// (docs/http.md, "Waiting for the original"); beyond either limit a
    /// request is answered at once, as if it had not asked to wait.
    pub fn with_wait_limits(self, limits: WaitLimits) -> IdempotencyLayer {
        self.edit(|shared| shared.waiters = Arc::new(Waiters::new(limits)))
    }

    /// Asks `settler` to settle an ambiguous record when a retry meets it
    /// (the gateway's reconciler, for routes with a lookup), then asks the
    /// claim again; without one, the retry gets 409 `outcome-unknown`.
    pub fn with_settle_on_retry(self, settler: Arc<dyn SettleOnRetry>) -> IdempotencyLayer {
        self.edit(|shared| {
            shared.settler = Some(settler);
            shared.unknown = UnknownOutcomes::Reconciler;
        })
    }

    /// Verifies every fresh claim while `window` says the store may have
    /// lost records (a suspect window after a failover or a restore):
    /// asks `verifier` (the gateway's reconciler, for routes with a lookup)
    /// before anything is forwarded. A route `verifier` does not cover, or
    /// every route when there is none, is forwarded unverified and counted
    /// (`idem_window_claims_total{outcome="unverified"}`).
    pub fn with_suspect_window(
        self,
        window: Arc<WindowWatch>,
        verifier: Option<Arc<dyn VerifyFresh>>,
    ) -> IdempotencyLayer {
        self.edit(|shared| {
            shared.window = window;
            shared.verifier = verifier;
        })
    }

    /// Writes the `type` of every problem this layer answers as `base`
    /// followed by its slug (`https://docs.example.com/idem/problems#`
    /// makes `…/problems#key-reused`, an anchor of docs/problems.md)
    /// instead of `urn:idem:problem:` and the slug. Stored answers (a
    /// replayed `result-not-stored`) keep the type they were stored with.
    pub fn with_problem_type_base(self, base: impl Into<String>) -> IdempotencyLayer {
        let base: Arc<str> = Arc::from(base.into());
        self.edit(|shared| shared.problem_type_base = Some(base))
    }

    /// Ignores `Prefer: respond-async`: every protected request is answered
    /// when its attempt ends. For a host that stops running tasks once the
    /// answer is sent (AWS Lambda freezes the execution environment), where
    /// an attempt going on after a 202 would be frozen mid-effect and its
    /// key turn into an unknown outcome; `idem_lambda` sets it.
    pub fn without_respond_async(self) -> IdempotencyLayer {
        self.edit(|shared| shared.respond_async = false)
    }

    /// Wakes the requests waiting on `id` to ask the store again: for a
    /// store that reports another process's change to a record (PostgreSQL
    /// notifications). This layer wakes them itself when it settles an
    /// attempt on the key.
    pub fn wake(&self, id: &RecordId) {
        self.shared.waiters.wake(id);
    }

    /// How many requests wait for an original attempt now.
    pub fn waiting(&self) -> usize {
        self.shared.waiters.waiting()
    }

    /// The metrics this layer counts into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// The attempts this layer runs on tasks of their own. An attempt goes
    /// on after its client stops waiting (`Prefer: respond-async`, or a
    /// client that hung up), so a server's graceful shutdown, which waits
    /// only for its connections, would cut it mid-forward and leave its
    /// key with an unknown outcome. Await [`Attempts::finished`] after the
    /// server has drained and before the runtime stops.
    pub fn attempts(&self) -> Attempts {
        Attempts(self.shared.attempts.clone())
    }

    fn edit(self, change: impl FnOnce(&mut Shared)) -> IdempotencyLayer {
        let mut shared = Shared::clone(&self.shared);
        change(&mut shared);
        IdempotencyLayer {
            shared: Arc::new(shared),
        }
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;
    fn layer(&self, inner: S) -> Idempotency<S> {
        let waiters_max = self.shared.waiters.limits().total;
        self.shared.metrics.gauges().set_waiters_max(waiters_max);
        if self.shared.unknown == UnknownOutcomes::Operator {
            let routes = &self.shared.routes;
            self.shared
                .unsettled_named
                .call_once(|| warn_unsettled(routes));
        }
        Idempotency {
            inner,
            shared: self.shared.clone(),
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotency<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Display + Send,
    ReqBody: HttpBody + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: HttpBody + From<Bytes> + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResBody>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        // The ready service goes into the future; a clone stays for the next call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        // Every request, so that no malformed trace context is passed on.
        let incoming = trace::take_incoming(req.headers_mut());
        let span = trace::request_span(req.method(), incoming);
        trace::propagate(&span, req.headers_mut());
        let (routed, answered) = (span.clone(), span.clone());
        let answer = async move {
            // Before the path is normalised: the key's segment is decoded
            // on its own, so that keys holding `/` or `\` can be asked about.
            if let Some(located) = locate(&shared.routes, req.method(), req.uri()) {
                let cors = shared.routes[located.index].cors;
                let response = match located.asked {
                    Asked::Key(Ok(key)) => {
                        let (parts, _) = req.into_parts();
                        let asked = (located.base, key, located.method);
                        status::answer(&shared, located.index, asked, &parts).await
                    }
                    Asked::Key(Err(refusal)) => problem(refusal),
                    Asked::Policy => status::policy(&shared, located.index, &located.base),
                };
                let response = crate::cors::expose(cors, response);
                let Some(kind) = response.extensions().get::<ProblemKind>().copied() else {
                    return Ok(response);
                };
                shared.metrics.problem(kind);
                // In the route's dialect and under the layer's base, as
                // every other refusal of the route.
                let style = ProblemStyle {
                    type_base: shared.problem_type_base.as_deref(),
                    dialect: shared.routes[located.index].error_dialect,
                };
                return Ok(restyled(response, kind, &style).await);
            }
            // Every request, protected or not, so that no spelling of a
            // protected path reaches the inner service unprotected.
            if let Err(refusal) = normalize_uri(req.uri_mut()) {
                shared.metrics.problem(ProblemKind::InvalidPath);
                return Ok(problem(refusal));
            }
            let route = shared
                .routes
                .iter()
                .position(|r| r.matches(req.method(), req.uri().path()));
            match route {
                Some(index) => {
                    routed.record("http.route", shared.routes[index].pattern.as_str());
                    let response = detached(shared.clone(), index, inner, req).await;
                    let response = crate::cors::expose(shared.routes[index].cors, response);
                    // Problems made here and by the proxy carry their kind.
                    let Some(kind) = response.extensions().get::<ProblemKind>().copied() else {
                        return Ok(response);
                    };
                    shared.metrics.problem(kind);
                    let style = ProblemStyle {
                        type_base: shared.problem_type_base.as_deref(),
                        dialect: shared.routes[index].error_dialect,
                    };
                    Ok(restyled(response, kind, &style).await)
                }
                None => {
                    let mut inner = inner;
                    inner.call(req).await.map(without_owned_headers)
                }
            }
        };
        Box::pin(
            async move {
                let answer = answer.await;
                if let Ok(response) = &answer {
                    trace::record_response(&answered, response);
                }
                answer
            }
            .instrument(span),
        )
    }
}

/// `response`, a problem of `kind` this layer or the proxy wrote, in the
/// route's `style`; untouched when the style is the default.
async fn restyled<B>(
    response: Response<B>,
    kind: ProblemKind,
    style: &ProblemStyle<'_>,
) -> Response<B>
where
    B: HttpBody + From<Bytes>,
{
    use http_body_util::BodyExt;
    if !style.changes_anything() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // The document is this crate's own (a few hundred bytes); one that
    // cannot be read is answered again from its kind.
    let doc = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Problem::new(kind, "").body(),
    };
    let Some((status, content_type, body)) = style.restyle(kind, &doc) else {
        return Response::from_parts(parts, B::from(doc));
    };
    parts.status = status;
    parts.headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    parts.headers.remove(http::header::CONTENT_LENGTH);
    Response::from_parts(parts, B::from(body))
}

/// Rewrites `uri` to its normal path (see [`normalize_path`]), the query
/// untouched; scheme and authority (absolute form, HTTP/2) are kept.
fn normalize_uri(uri: &mut Uri) -> Result<(), Problem> {
    let refused = |detail: String| {
        Problem::new(
            ProblemKind::InvalidPath,
            format!("{detail}; nothing was claimed or forwarded"),
        )
    };
    let normal = normalize_path(uri.path()).map_err(|e| refused(e.to_string()))?;
    if normal == uri.path() {
        return Ok(());
    }
    let path_and_query = match uri.query() {
        Some(query) => format!("{normal}?{query}"),
        None => normal,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(
        PathAndQuery::try_from(path_and_query)
            .map_err(|e| refused(format!("the normal form of the path is not a URI: {e}")))?,
    );
    *uri = Uri::from_parts(parts)
        .map_err(|e| refused(format!("the normal form of the path is not a URI: {e}")))?;
    Ok(())
}

/// One warning per route that declares no principal, saying what the
/// layer assumed: who shares a key space, and what runs again.
fn warn_undeclared(routes: &[Route]) {
    let undeclared = routes
        .iter()
        .filter(|r| r.principal_kind() == crate::PrincipalKind::DefaultCredentialDigest);
    for route in undeclared {
        tracing::warn!(
            route = route.operation_name().unwrap_or(route.pattern().as_str()),
            "no principal declared: callers are told apart only by the credentials they send \
             ({}, or a TLS client certificate), digested; callers who send none of them share \
             one key space and are answered each other's stored responses, and a refreshed \
             credential is a new scope where the intent runs again; declare principal = \
             {{ header = ... }} or {{ jwt = ... }}",
            crate::DEFAULT_CREDENTIAL_HEADERS.join(", ")
        );
    }
}

/// One warning per route that can leave an unknown outcome when nothing
/// in this process settles one: its keys would answer 409 until an
/// operator resolves them.
fn warn_unsettled(routes: &[Route]) {
    let can_leave_unknown = |table: &idem_core::CompletionTable| {
        (500..=599).any(|status| table.classify(status) == Completion::Unknown)
            || table.classify_failure(AttemptOutcome::Lost) == Completion::Unknown
    };
    for route in routes.iter().filter(|r| can_leave_unknown(&r.completion)) {
        tracing::warn!(
            route = route.operation_name().unwrap_or(route.pattern.as_str()),
            "a 5xx, a panic or an answer cut at the lease's end leaves this route's key with \
             an unknown outcome, and nothing in this process settles it: only an operator can \
             (idem records resolve). Give the route a [[lookup]] (idem serve), or run the \
             reconciler beside the layer and declare it with \
             with_unknown_outcomes(UnknownOutcomes::Reconciler), or declare what a 5xx means \
             on this route (completion final or release)"
        );
    }
}

/// The route whose status URL `method` and `uri` ask, with the protected
/// path, the method asked about (`?method=`) and the key; or the refusal
/// of a malformed key or method. A status URL that names a method belongs
/// to the first route whose pattern matches and that protects it.
fn locate(
    routes: &[Route],
    method: &http::Method,
    uri: &http::Uri,
) -> Option<crate::status::Located> {
    if method != http::Method::GET {
        return None;
    }
    let raw_path = uri.path();
    let asked_method = crate::status::asked_method(uri.query());
    routes.iter().enumerate().find_map(|(index, route)| {
        if route.methods().is_empty() {
            return None;
        }
        let (base, asked) = match route.status.split(raw_path) {
            Some((base, key)) => (base, crate::status::Asked::Key(key)),
            None => (
                route.status.policy_base(raw_path)?,
                crate::status::Asked::Policy,
            ),
        };
        if !route.pattern().matches(&base) {
            return None;
        }
        let (method, asked) = match (&asked_method, asked) {
            (Err(refusal), crate::status::Asked::Key(_)) => {
                (None, crate::status::Asked::Key(Err(refusal.clone())))
            }
            (Ok(Some(m)), asked) => {
                if !route.methods().iter().any(|p| p == m) {
                    return None;
                }
                (Some(m.clone()), asked)
            }
            (_, asked) => (None, asked),
        };
        Some(crate::status::Located {
            index,
            method,
            base,
            asked,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::ClaimDecision;
    use http::HeaderValue;
    use http_body_util::Full;
    use idem_core::{
        MemoryStore, Record, StoreError, StoreFuture, StoreWrapper, StoredResult, SystemClock,
        Token,
    };
    use tower::{ServiceExt, service_fn};

    /// A memory store whose completions are always fenced: as if a newer
    /// attempt had taken the record over while this one ran.
    struct FencedStore(MemoryStore);

    impl StoreWrapper for FencedStore {
        fn inner(&self) -> &dyn Store {
            &self.0
        }

        fn complete<'a>(
            &'a self,
            id: &'a RecordId,
            token: Token,
            _result: StoredResult,
        ) -> StoreFuture<'a, Record> {
            Box::pin(std::future::ready(Err(StoreError::Fenced {
                id: id.clone(),
                presented: token,
                current: None,
            })))
        }
    }

    /// Sends `(path, key, body)` through a layer over an upstream that
    /// answers 500 on `/fail` and 201 elsewhere; returns the statuses.
    async fn drive(
        store: Arc<dyn Store>,
        requests: &[(&str, Option<&str>, &str)],
    ) -> (Vec<u16>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let layer = IdempotencyLayer::new(store, vec![Route::default_catch_all()])
            .with_metrics(metrics.clone());
        assert!(Arc::ptr_eq(layer.metrics(), &metrics));
        let upstream = service_fn(|req: Request<Full<Bytes>>| async move {
            let status = if req.uri().path() == "/fail" {
                500
            } else {
                201
            };
            let mut res = Response::new(Full::new(Bytes::from_static(b"{\"paid\":true}")));
            *res.status_mut() = http::StatusCode::from_u16(status).unwrap_or_default();
            Ok::<_, std::convert::Infallible>(res)
        });
        let service = layer.layer(upstream);
        let mut statuses = Vec::new();
        for (path, key, body) in requests {
            let mut req = Request::post(*path).header("content-type", "application/json");
            if let Some(key) = key {
                req = req.header("idempotency-key", *key);
            }
            let req = req
                .body(Full::new(Bytes::from(body.to_string())))
                .unwrap_or_default();
            let res = service.clone().oneshot(req).await;
            statuses.push(res.map(|r| r.status().as_u16()).unwrap_or(0));
        }
        (statuses, metrics)
    }

    fn series(metrics: &Metrics, series: &str) -> Option<u64> {
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[tokio::test]
    async fn every_decision_is_counted() {
        let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
        let (statuses, m) = drive(
            store,
            &[
                ("/payouts", Some("k1"), "{\"a\":1}"),
                ("/payouts", Some("k1"), "{\"a\":1}"),
                ("/payouts", Some("k1"), "{\"a\":2}"),
                ("/payouts", None, "{}"),
                ("/fail", Some("k2"), "{}"),
                ("/fail", Some("k2"), "{}"),
            ],
        )
        .await;
        assert_eq!(statuses, [201, 201, 422, 400, 500, 409]);
        let expect = [
            ("idem_claims_total{decision=\"acquired\"}", 2),
            ("idem_claims_total{decision=\"replay\"}", 1),
            ("idem_claims_total{decision=\"mismatch\"}", 1),
            ("idem_claims_total{decision=\"outcome_unknown\"}", 1),
            ("idem_problems_total{type=\"key-reused\"}", 1),
            ("idem_problems_total{type=\"missing-key\"}", 1),
            ("idem_problems_total{type=\"outcome-unknown\"}", 1),
            ("idem_completions_total{outcome=\"final\"}", 1),
            ("idem_completions_total{outcome=\"ambiguous\"}", 1),
            ("idem_marked_ambiguous_total", 1),
            ("idem_fenced_writes_total", 0),
            ("idem_store_seconds_count{op=\"claim\"}", 5),
            ("idem_store_seconds_count{op=\"complete\"}", 1),
            ("idem_store_seconds_count{op=\"mark_ambiguous\"}", 1),
            ("idem_upstream_seconds_count", 2),
        ];
        for (name, want) in expect {
            assert_eq!(series(&m, name), Some(want), "{name}");
        }
        assert_eq!(m.claims(ClaimDecision::InFlight), 0);
    }

    #[tokio::test]
    async fn a_fenced_completion_is_counted_and_not_a_completion() {
        let store = Arc::new(FencedStore(MemoryStore::new(Arc::new(SystemClock))));
        let (statuses, m) = drive(store, &[("/payouts", Some("k1"), "{}")]).await;
        assert_eq!(
            statuses,
            [201],
            "the caller still gets the upstream's answer"
        );
        assert_eq!(m.fenced_writes(), 1);
        assert_eq!(
            series(&m, "idem_completions_total{outcome=\"final\"}"),
            Some(0)
        );
        assert_eq!(series(&m, "idem_store_errors_total"), Some(0));
    }

    /// Without an OpenTelemetry layer the inner service receives the
    /// caller's valid trace context as it came, a malformed one not at
    /// all, on protected and unprotected paths alike.
    #[tokio::test]
    async fn the_inner_service_gets_only_a_valid_trace_context() {
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let upper = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
        let cases: [(&str, &[&str], Option<&str>); 5] = [
            ("valid", &[valid], Some(valid)),
            ("none", &[], None),
            ("uppercase", &[upper], None),
            ("two", &[valid, valid], None),
            (
                "all-zero parent",
                &["00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"],
                None,
            ),
        ];
        let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
        let layer = IdempotencyLayer::new(store, vec![Route::default_catch_all()]);
        let upstream = service_fn(|req: Request<Full<Bytes>>| async move {
            let seen: Vec<_> = req
                .headers()
                .get_all("traceparent")
                .iter()
                .cloned()
                .collect();
            let mut res = Response::new(Full::new(Bytes::new()));
            res.extensions_mut().insert(seen);
            Ok::<_, std::convert::Infallible>(res)
        });
        let service = layer.layer(upstream);
        for (i, (name, sent, expect)) in cases.iter().enumerate() {
            for method in ["POST", "GET"] {
                let mut req = Request::builder()
                    .method(method)
                    .uri("/payouts")
                    .header("idempotency-key", format!("k{i}"));
                for value in *sent {
                    req = req.header("traceparent", *value);
                }
                let req = req.body(Full::new(Bytes::new())).unwrap();
                let res = service.clone().oneshot(req).await.unwrap();
                let seen = res.extensions().get::<Vec<HeaderValue>>().cloned();
                let seen: Vec<_> = seen.unwrap_or_default();
                let seen: Vec<&str> = seen.iter().map(|v| v.to_str().unwrap()).collect();
                assert_eq!(
                    seen,
                    expect.iter().copied().collect::<Vec<_>>(),
                    "{name} {method}"
                );
            }
        }
    }
}

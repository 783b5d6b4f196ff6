//! The middleware in tower's shape: [`IdempotencyLayer`] builds
//! [`Idempotency<S>`], whose future runs one request through the contract
//! and records every decision it makes in [`Metrics`] and, as spans, in
//! the request's trace (see `trace`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::FutureExt;
use http::uri::PathAndQuery;
use http::{HeaderName, HeaderValue, Request, Response, Uri, header};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Limited};
use idem_core::{
    AttemptOutcome, Claim, ClaimRequest, Clock, Completion, LeaseLeft, LimitError, Record,
    RecordId, SettleOnRetry, Store, StoreError, StoredResult, SuspectWindow, SystemClock, Token,
    Verification, VerifyFresh, WindowWatch, lease,
};
use tower::{Layer, Service};
use tracing::Instrument;

use crate::gate::{BeforeClaim, ClaimGate, Gate};
use crate::metrics::{ClaimDecision, Metrics, StoreOp, WaitOutcome, WindowOutcome};
use crate::path::normalize_path;
use crate::problem::{Problem, ProblemKind};
use crate::request;
use crate::route::Route;
use crate::slot::InFlightSlot;
use crate::trace;
use crate::wait::{WaitLimits, Waiters, Wake, preferred_wait_ms};

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
    /// The routes nothing settles are named once per layer, however many
    /// services it wraps (axum wraps each route's).
    unsettled_named: Arc<std::sync::Once>,
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
                unsettled_named: Arc::new(std::sync::Once::new()),
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
                    // Problems made here and by the proxy carry their kind.
                    if let Some(kind) = response.extensions().get::<ProblemKind>() {
                        shared.metrics.problem(*kind);
                    }
                    Ok(response)
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

/// [`protect`] on a task of its own, so that a client that hangs up (its
/// connection dropped, and with it the future that awaits this) cancels
/// nothing: an attempt that holds a claim runs to its end and records its
/// outcome, and the client's retry is answered with it. What the attempt
/// holds is bounded as before, by its lease's deadline.
async fn detached<S, ReqBody, ResBody>(
    shared: Arc<Shared>,
    index: usize,
    inner: S,
    req: Request<ReqBody>,
) -> Response<ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Display + Send,
    ReqBody: HttpBody + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: HttpBody + From<Bytes> + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    let attempt = async move {
        let route = &shared.routes[index];
        protect(&shared, (index, route), inner, req).await
    };
    match tokio::spawn(attempt.in_current_span()).await {
        Ok(response) => response,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => problem(Problem::new(
            ProblemKind::UpstreamFailed,
            "the attempt was stopped before it answered: the runtime is shutting down",
        )),
    }
}

/// One protected request, start to end. Always answers: problems and
/// upstream failures are responses.
async fn protect<S, ReqBody, ResBody>(
    shared: &Shared,
    (index, route): (usize, &Route),
    mut inner: S,
    req: Request<ReqBody>,
) -> Response<ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: std::fmt::Display,
    ReqBody: HttpBody + From<Bytes>,
    ReqBody::Error: Into<BoxError>,
    ResBody: HttpBody + From<Bytes>,
    ResBody::Error: Into<BoxError>,
{
    let key = match request::key(req.headers(), route) {
        Ok(Some(key)) => key,
        Ok(None) if !route.key_required => {
            return match inner.call(req).await {
                Ok(response) => without_owned_headers(response),
                Err(e) => problem(Problem::new(ProblemKind::UpstreamFailed, e.to_string())),
            };
        }
        Ok(None) => {
            let detail = format!("this route requires the {} header", route.key_header);
            return problem(Problem::new(ProblemKind::MissingKey, detail));
        }
        Err(p) => return problem(p),
    };
    let (parts, body) = req.into_parts();
    let body = match read_body(&parts.headers, body, route.body_bytes_max).await {
        Ok(bytes) => bytes,
        Err(p) => return problem(p),
    };
    let prepared = request::scope(&parts, route)
        .and_then(|scope| Ok((scope, request::fingerprint(&parts, route, &body)?)));
    let ((scope, principal), fingerprint) = match prepared {
        Ok(found) => found,
        Err(p) => return problem(p),
    };
    if let Some(gate) = &shared.gate {
        let before = BeforeClaim {
            route: index,
            parts: &parts,
            key: &key,
            principal: principal.as_deref(),
            body: &body,
        };
        if let Gate::Answer(answer) = gate.before_claim(&before) {
            return answer.await.map(ResBody::from);
        }
    }
    let mut claim_request = ClaimRequest {
        id: RecordId { scope, key },
        fingerprint,
        legacy_fingerprint: None,
        owner: shared.owner.clone(),
        region: shared.region.clone(),
        policy: *route.policy(),
    };
    let decided = decide(shared, route, (&parts, &body), &mut claim_request).await;
    let Decided {
        claimed,
        sent_at,
        waited,
    } = match decided {
        Ok(decided) => decided,
        Err(answered) => return answered,
    };
    let id = &claim_request.id;
    let claim = match claimed {
        Ok(claim) => claim,
        Err(e) => return with_preference(problem(store_unavailable(id, &e)), waited),
    };
    shared.metrics.claim(&claim);
    match claim {
        Claim::Acquired {
            token,
            lease_ms,
            took_over,
            ..
        } => {
            let acquired = Acquired {
                token,
                lease_ms,
                sent_at,
            };
            // A key the store holds no record of may still have executed
            // while a suspect window is open: ask the provider first.
            if took_over.is_none()
                && let Some(window) = shared.window.open_at(SystemClock.now())
                && let Some(answer) = verify_fresh(shared, route, id, &window, token).await
            {
                shared.waiters.wake(id);
                return with_preference(answer, waited);
            }
            let req = (parts, body);
            let response = forward(shared, route, id, acquired, inner, req).await;
            // The attempt is settled (or could not be): whoever waits on
            // the key asks the store again.
            shared.waiters.wake(id);
            with_preference(response, waited)
        }
        Claim::Replay { record } => with_preference(replay(&record), waited),
        other => with_preference(problem(refusal(route, id, other, shared.unknown)), waited),
    }
}

/// What a request's claim came to once asked, waited on and settled.
struct Decided {
    claimed: Result<Claim, StoreError>,
    /// Just before the claim that decided was sent: where its lease counts from.
    sent_at: Instant,
    /// The wait applied, when the request asked for one.
    waited: Option<u64>,
}

/// Claims the key and follows the claim as far as the contract lets a
/// request go without its effect: the claim asked again with the version 1
/// fingerprint of a record written before version 2, a wait for the
/// attempt holding the key, an unknown outcome settled by a lookup. `Err`
/// is an answer made on the way (no slot free after a wait).
async fn decide<B: From<Bytes>>(
    shared: &Shared,
    route: &Route,
    (parts, body): (&http::request::Parts, &Bytes),
    claim_request: &mut ClaimRequest,
) -> Result<Decided, Response<B>> {
    let (mut claimed, mut sent_at) = claim(shared, claim_request).await;
    // A record written before fingerprint version 2 holds this request's
    // version 1 fingerprint: only then is it computed, and the claim asked
    // again with it (a second atomic decision over the record as it is now).
    if let Ok(Claim::Mismatch { stored }) = &claimed {
        let legacy = request::legacy_fingerprint(parts, route, body);
        if legacy.as_ref() == Some(stored) {
            claim_request.legacy_fingerprint = legacy;
            (claimed, sent_at) = claim(shared, claim_request).await;
        }
    }
    // Held by another attempt: wait for its outcome, if asked and allowed.
    // `Preference-Applied` answers a request that sent the preference.
    let mut waited = None;
    if let Ok(in_flight @ Claim::InFlight { .. }) = &claimed {
        let preferred = preferred_wait_ms(&parts.headers);
        let wait_ms = route.wait().applied_ms(preferred);
        if wait_ms > 0 {
            // Counted here; the answer the wait ends with is counted below.
            shared.metrics.claim(in_flight);
            let slot = parts.extensions.get::<InFlightSlot>().cloned();
            match wait_for_original(shared, claim_request, wait_ms, slot.as_ref()).await {
                Some((answer, at)) => {
                    shared.metrics.wait(wait_outcome(&answer));
                    (claimed, sent_at) = (answer, at);
                    waited = preferred.map(|_| wait_ms);
                    let id = &claim_request.id;
                    if let Some(shed) = back_to_work(shared, slot.as_ref(), id, &claimed).await {
                        return Err(with_preference(shed, waited));
                    }
                }
                None => shared.metrics.wait(WaitOutcome::Refused),
            }
        }
    }
    // The outcome is unknown: settle it now if a lookup can, and ask again.
    if let (Ok(Claim::OutcomeUnknown { .. }), Some(settler)) = (&claimed, &shared.settler)
        && settler.settle(&claim_request.id).await
    {
        if let Ok(unknown) = &claimed {
            shared.metrics.claim(unknown);
        }
        (claimed, sent_at) = claim(shared, claim_request).await;
    }
    Ok(Decided {
        claimed,
        sent_at,
        waited,
    })
}

/// Verifies a fresh claim of `id` inside `window` (see
/// [`IdempotencyLayer::with_suspect_window`]): `None` to forward it, or the
/// answer instead: the provider's result stored and replayed, or, when the
/// provider cannot yet say, 503 with the attempt released unsent.
async fn verify_fresh<B: From<Bytes>>(
    shared: &Shared,
    route: &Route,
    id: &RecordId,
    window: &SuspectWindow,
    token: Token,
) -> Option<Response<B>> {
    let Some(verifier) = shared.verifier.as_ref().filter(|v| v.covers(id)) else {
        shared.metrics.window_claim(WindowOutcome::Unverified);
        tracing::warn!(scope = %id.scope, key = %id.key, cause = %window.cause,
            "a fresh claim inside the suspect window on a route without a lookup: forwarded \
             unverified; the store may have lost a record of this key");
        return None;
    };
    let lease_ms = route.policy().lease_ms();
    let (retry_after_s, detail) = match verifier.verify(id, window, lease_ms).await {
        Verification::NotExecuted => {
            shared.metrics.window_claim(WindowOutcome::NotExecuted);
            return None;
        }
        Verification::Executed(result) => {
            shared.metrics.window_claim(WindowOutcome::Executed);
            tracing::info!(scope = %id.scope, key = %id.key,
                "the provider has this key's effect, which the store had lost: its answer is \
                 stored and replayed, nothing forwarded");
            let completed = timed(
                &shared.metrics,
                (StoreOp::Complete, id),
                shared.store.complete(id, token, result),
                |_| "completed",
            )
            .await;
            return Some(match completed {
                Ok(record) => replay(&record),
                Err(e) => problem(store_unavailable(id, &e)),
            });
        }
        Verification::NotYet { at } => {
            shared.metrics.window_claim(WindowOutcome::NotYet);
            let wait_ms = SystemClock.now().millis_until(at);
            (
                wait_ms.div_ceil(1000).max(1),
                format!(
                    "the idempotency store may have lost records (a failover or a restore), \
                     and an attempt it forgot may still be running at the provider for \
                     {wait_ms} ms; nothing was forwarded, retry after that"
                ),
            )
        }
        Verification::Failed { reason } => {
            shared.metrics.window_claim(WindowOutcome::LookupFailed);
            // The reason names the provider's lookup URL and the cause the
            // backup's path: the log's, not the client's.
            tracing::warn!(scope = %id.scope, key = %id.key, cause = %window.cause, %reason,
                "a fresh claim inside the suspect window could not be verified; not forwarded");
            (
                1,
                "the idempotency store may have lost records (a failover or a restore), and \
                 the provider could not say whether this key executed; nothing was forwarded"
                    .to_owned(),
            )
        }
    };
    let cause = "not verified inside the suspect window; not forwarded";
    settle(shared, id, token, Completion::Release, cause).await;
    Some(problem(
        Problem::new(ProblemKind::Unverified, detail).retry_after(retry_after_s),
    ))
}

/// How a wait ended, as counted in `idem_waits_total{outcome}`.
fn wait_outcome(answer: &Result<Claim, StoreError>) -> WaitOutcome {
    match answer {
        Ok(Claim::InFlight { .. }) => WaitOutcome::TimedOut,
        Ok(_) => WaitOutcome::Answered,
        Err(_) => WaitOutcome::StoreFailed,
    }
}

/// Adds `Preference-Applied: wait=N` (seconds, rounded up) to the answer of
/// a request that asked to wait and waited up to `waited` milliseconds.
fn with_preference<B>(mut response: Response<B>, waited: Option<u64>) -> Response<B> {
    if let Some(ms) = waited
        && let Ok(value) = HeaderValue::from_str(&format!("wait={}", ms.div_ceil(1000)))
    {
        response
            .headers_mut()
            .insert(HeaderName::from_static("preference-applied"), value);
    }
    response
}

/// Waits, up to `wait_ms`, for the attempt that holds the key: asks the
/// claim again whenever the waiters are woken or it is this waiter's turn
/// to poll, until the answer is other than in flight or the time is up.
/// Returns the last answer and when its claim was sent, and whether the
/// request waited at all (`None`: over the waiter limits, not registered).
/// A registered waiter gives its in-flight `slot` back: it waits on the
/// waiters' budget, and [`back_to_work`] takes a slot again after.
async fn wait_for_original(
    shared: &Shared,
    claim_request: &ClaimRequest,
    wait_ms: u64,
    slot: Option<&InFlightSlot>,
) -> Option<(Result<Claim, StoreError>, Instant)> {
    let waiting = shared.waiters.register(&claim_request.id)?;
    if let Some(slot) = slot {
        slot.give_back();
    }
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    // A store shared with other gateways then tells this one when the
    // record completes there; failing that, the poll still finds it.
    let _ = shared.store.note_waiting(&claim_request.id).await;
    loop {
        let armed = waiting.armed();
        tokio::pin!(armed);
        armed.as_mut().enable();
        let (claimed, sent_at) = claim(shared, claim_request).await;
        match &claimed {
            Ok(Claim::InFlight { .. }) => {}
            Ok(_) => {
                waiting.changed();
                return Some((claimed, sent_at));
            }
            Err(_) => return Some((claimed, sent_at)),
        }
        if waiting.next(armed.as_mut(), deadline).await == Wake::Done {
            return Some((claimed, sent_at));
        }
    }
}

/// Takes an in-flight slot again after a wait, before the request goes on
/// to work: to forward the attempt the wait acquired, or to look up an
/// unknown outcome. With none free it is answered as a fresh request would
/// be, 503 `overloaded`, and a key the wait acquired is released unsent for
/// the next retry. An answer the wait already holds (a replay, a refusal)
/// costs no more work and needs no slot; nor does a request with none.
async fn back_to_work<B: From<Bytes>>(
    shared: &Shared,
    slot: Option<&InFlightSlot>,
    id: &RecordId,
    claimed: &Result<Claim, StoreError>,
) -> Option<Response<B>> {
    let works = match claimed {
        Ok(Claim::Acquired { .. }) => true,
        Ok(Claim::OutcomeUnknown { .. }) => shared.settler.is_some(),
        _ => false,
    };
    if !works || slot.is_none_or(InFlightSlot::take_again) {
        return None;
    }
    if let Ok(claim) = claimed {
        shared.metrics.claim(claim);
    }
    if let Ok(Claim::Acquired { token, .. }) = claimed {
        let cause = "no in-flight slot was free when the wait ended; not forwarded";
        settle(shared, id, *token, Completion::Release, cause).await;
        shared.waiters.wake(id);
    }
    Some(problem(
        Problem::new(
            ProblemKind::Overloaded,
            "the wait ended, but the gateway is serving as many requests as it may \
             (requests_in_flight_max); nothing was forwarded",
        )
        .retry_after(1),
    ))
}

/// Asks the store's claim, timed; returns its answer and the instant just
/// before it was sent: the store decided after it, so a lease it granted
/// ends no earlier than that instant plus the lease.
async fn claim(shared: &Shared, req: &ClaimRequest) -> (Result<Claim, StoreError>, Instant) {
    let sent_at = Instant::now();
    let claimed = timed(
        &shared.metrics,
        (StoreOp::Claim, &req.id),
        shared.store.claim(req),
        decision,
    )
    .await;
    (claimed, sent_at)
}

/// What an acquiring claim gave this attempt: its token, the lease the
/// store granted, and when the claim was sent (just before).
struct Acquired {
    token: Token,
    lease_ms: u64,
    sent_at: Instant,
}

/// Forwards the request of an acquired attempt within what is left of its
/// lease ([`idem_core::lease::lease_left`]), or releases it unsent when too
/// little is left, and records what the answer means.
async fn forward<S, ReqBody, ResBody>(
    shared: &Shared,
    route: &Route,
    id: &RecordId,
    acquired: Acquired,
    mut inner: S,
    (mut parts, body): (http::request::Parts, Bytes),
) -> Response<ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: std::fmt::Display,
    ReqBody: HttpBody + From<Bytes>,
    ResBody: HttpBody + From<Bytes>,
    ResBody::Error: Into<BoxError>,
{
    let Acquired {
        token,
        lease_ms,
        sent_at,
    } = acquired;
    let forward_ms = match lease::lease_left(lease_ms, lease::elapsed_ms(sent_at.elapsed())) {
        LeaseLeft::Forward { forward_ms } => forward_ms,
        LeaseLeft::TooLittle { left_ms } => {
            return lease_spent(shared, id, token, (lease_ms, left_ms)).await;
        }
    };
    let deadline = LeaseDeadline(Instant::now() + Duration::from_millis(forward_ms));
    parts.extensions.insert(deadline);
    forward_key(&mut parts.headers, route, id);
    let span = trace::forward_span(id);
    trace::propagate(&span, &mut parts.headers);
    let req = Request::from_parts(parts, ReqBody::from(body));
    let started = Instant::now();
    let call = span.in_scope(|| inner.call(req)).instrument(span.clone());
    // A panic is an attempt that ended: the route's rule for a 500 says
    // what it means, and the key never waits out its lease unanswered.
    let call = std::panic::AssertUnwindSafe(call).catch_unwind();
    let outcome = match tokio::time::timeout_at(deadline.0.into(), call).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => Ok(handler_panicked()),
        Err(_) => Ok(lease_ended(forward_ms)),
    };
    shared.metrics.observe_upstream(started.elapsed());
    trace::record_forward(&span, &outcome);
    finish(shared, route, id, token, (outcome, deadline)).await
}

/// When a forward's lease ends, less its margin, in the gateway's own
/// monotonic time ([`idem_core::lease`]): the layer cuts the forward there
/// and puts this in the forwarded request's extensions, so that an inner
/// service with deadlines of its own can keep within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseDeadline(pub Instant);

/// The store's answer came with too little of its lease left: the request
/// was not sent, so the record is released with the token, and the caller
/// told to try again, when a fresh claim gets a whole lease.
async fn lease_spent<B: From<Bytes>>(
    shared: &Shared,
    id: &RecordId,
    token: Token,
    (lease_ms, left_ms): (u64, u64),
) -> Response<B> {
    let cause =
        format!("the store's answer left {left_ms} ms of its {lease_ms} ms lease; not forwarded");
    settle(shared, id, token, Completion::Release, &cause).await;
    problem(
        Problem::new(
            ProblemKind::LeaseSpent,
            format!(
                "the idempotency store granted a {lease_ms} ms lease, but its answer came \
                 with {left_ms} ms of it left, under the {} ms needed to forward; nothing \
                 was forwarded",
                idem_core::FORWARD_MS_MIN
            ),
        )
        .retry_after(1),
    )
}

/// What a forward cut at its lease's end answers: the request was sent, so
/// its outcome is unknown ([`AttemptOutcome::Lost`]), as after the proxy's
/// own response timeout.
fn lease_ended<B: From<Bytes>>(forward_ms: u64) -> Response<B> {
    tracing::warn!(
        forward_ms,
        "the forward reached its lease's end; outcome unknown"
    );
    let mut response = problem(Problem::new(
        ProblemKind::UpstreamTimeout,
        format!(
            "no complete answer within the {forward_ms} ms left of the lease; the request \
             may have been processed"
        ),
    ));
    response.extensions_mut().insert(AttemptOutcome::Lost);
    response
}

/// What a panicking inner service answers: a 500, judged by the route's
/// completion rule for a 500 like any other.
fn handler_panicked<B: From<Bytes>>() -> Response<B> {
    tracing::error!("the inner service panicked while handling a protected request");
    let mut response = Response::new(B::from(Bytes::from_static(
        b"the request handler failed; its effect may have happened",
    )));
    *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
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

/// The response for a problem this layer answers, tagged with its kind so
/// that it is counted once, where every protected response passes.
fn problem<B: From<Bytes>>(problem: Problem) -> Response<B> {
    let kind = problem.kind;
    let mut response: Response<B> = problem.into_response();
    response.extensions_mut().insert(kind);
    response
}

/// Runs one store operation on `id` in its span, timing it and counting
/// its failure: a fenced write apart from every other store error.
/// `label` names a success in the span.
async fn timed<T>(
    metrics: &Metrics,
    (op, id): (StoreOp, &RecordId),
    operation: impl Future<Output = Result<T, StoreError>>,
    label: fn(&T) -> &'static str,
) -> Result<T, StoreError> {
    let span = trace::store_span(op, id);
    let started = Instant::now();
    let outcome = operation.instrument(span.clone()).await;
    metrics.observe_store(op, started.elapsed());
    match &outcome {
        Err(StoreError::Fenced { .. }) => metrics.fenced_write(),
        Err(_) => metrics.store_error(),
        Ok(_) => {}
    }
    trace::record_store(&span, op, &outcome, label);
    outcome
}

/// A claim's decision as the metrics name it.
fn decision(claim: &Claim) -> &'static str {
    ClaimDecision::of(claim).map_or("unknown", ClaimDecision::as_str)
}

/// Reads the body up to `limit`: 413 on a declared or actual excess. It
/// sets no deadline of its own: the server does (the gateway reads a
/// protected body first, under `body_read_timeout_ms`, and hands this a
/// buffered one).
pub async fn read_body<B>(
    headers: &http::HeaderMap,
    body: B,
    limit: usize,
) -> Result<Bytes, Problem>
where
    B: HttpBody,
    B::Error: Into<BoxError>,
{
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        Problem::new(
            ProblemKind::BodyTooLarge,
            format!("the body is over this route's limit of {limit} bytes; nothing was claimed"),
        )
    };
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(Problem::new(
            ProblemKind::InvalidBody,
            format!("the request body could not be read: {e}"),
        )),
    }
}

fn forward_key(headers: &mut http::HeaderMap, route: &Route, id: &RecordId) {
    let value = route.forwarded_key(id);
    // The key is visible ASCII and so is the digest; a template's own text
    // was checked at load time, so this only fails on a template bug.
    let Ok(value) = HeaderValue::from_str(&value) else {
        tracing::error!(template_value = %value, "forwarded key is not a valid header value");
        return;
    };
    if route.forward_header != route.key_header {
        headers.remove(&route.key_header);
    }
    headers.insert(route.forward_header.clone(), value);
}

/// Records what the upstream's answer means and passes it on.
async fn finish<ResBody, E>(
    shared: &Shared,
    route: &Route,
    id: &RecordId,
    token: Token,
    (outcome, deadline): (Result<Response<ResBody>, E>, LeaseDeadline),
) -> Response<ResBody>
where
    ResBody: HttpBody + From<Bytes>,
    ResBody::Error: Into<BoxError>,
    E: std::fmt::Display,
{
    let response = match outcome {
        Ok(response) => without_owned_headers(response),
        Err(e) => {
            let completion = route.completion.classify_failure(AttemptOutcome::Lost);
            let cause = format!("the inner service failed: {e}");
            settle(shared, id, token, completion, &cause).await;
            return problem(Problem::new(ProblemKind::UpstreamFailed, e.to_string()));
        }
    };
    let completion = match response.extensions().get::<AttemptOutcome>() {
        Some(failure) => route.completion.classify_failure(*failure),
        None => route.completion.classify(response.status().as_u16()),
    };
    if completion != Completion::Final {
        let cause = match response.extensions().get::<ProblemKind>() {
            Some(kind) => kind.slug().to_owned(),
            None => format!("upstream answered {}", response.status().as_u16()),
        };
        settle(shared, id, token, completion, &cause).await;
        return response;
    }
    let (parts, body) = response.into_parts();
    // The body is part of the forward: read past the lease, a retry or the
    // reconciler could judge the attempt while its answer is still arriving.
    let read = Limited::new(body, RESPONSE_BYTES_MAX).collect();
    let bytes = match tokio::time::timeout_at(deadline.0.into(), read).await {
        Ok(read) => read
            .map(|c| c.to_bytes())
            .map_err(|e| format!("the body could not be read: {e}")),
        Err(_) => Err("the body did not end before the lease's deadline".to_owned()),
    };
    let stored_headers = replay_headers(&parts.headers, route);
    let (result, passthrough) = match bytes {
        Ok(bytes) => {
            match StoredResult::new(parts.status.as_u16(), stored_headers, bytes.to_vec()) {
                Ok(result) => (result, Some(bytes)),
                Err(e) => (StoredResult::not_stored(&e.to_string()), Some(bytes)),
            }
        }
        Err(why) => (StoredResult::not_stored(&why), None),
    };
    let completed = timed(
        &shared.metrics,
        (StoreOp::Complete, id),
        shared.store.complete(id, token, result.clone()),
        |_| "completed",
    )
    .await;
    let mut expires_at = None;
    match completed {
        Ok(record) => {
            expires_at = record.expires_at;
            shared.metrics.completion(Completion::Final);
            tracing::info!(scope = %id.scope, key = %id.key, status = result.status(), "completed")
        }
        Err(e @ StoreError::Fenced { .. }) => {
            tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "the result was not recorded: a newer attempt owns the record (fenced)")
        }
        Err(e) => {
            tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "could not record the result; the record will become ambiguous when its lease ends")
        }
    }
    let response = match passthrough {
        Some(bytes) => Response::from_parts(parts, ResBody::from(bytes)),
        None => stored_response(&result, false),
    };
    with_expiry(response, expires_at)
}

/// Releases or marks ambiguous; failures leave the record in progress,
/// which the lease turns into `ambiguous`: never into a blind re-execution.
/// `cause` (what the upstream did) goes into the log for the operator.
async fn settle(shared: &Shared, id: &RecordId, token: Token, completion: Completion, cause: &str) {
    let metrics = &shared.metrics;
    let outcome = match completion {
        Completion::Release => {
            let released = shared.store.release(id, token);
            timed(metrics, (StoreOp::Release, id), released, |_| "released").await
        }
        Completion::Unknown => {
            let marked = shared.store.mark_ambiguous(id, token);
            timed(
                metrics,
                (StoreOp::MarkAmbiguous, id),
                marked,
                |_| "ambiguous",
            )
            .await
            .map(|_| ())
        }
        Completion::Final => return,
    };
    match outcome {
        Ok(()) => {
            metrics.completion(completion);
            if completion == Completion::Unknown {
                let awaits = match shared.unknown {
                    UnknownOutcomes::Reconciler => "the reconciler (or an operator)",
                    UnknownOutcomes::Operator => "an operator: nothing here reconciles it",
                };
                tracing::warn!(scope = %id.scope, key = %id.key, cause, awaits, "outcome unknown; the record awaits resolution");
            } else {
                tracing::debug!(scope = %id.scope, key = %id.key, cause, "released");
            }
        }
        Err(e @ StoreError::Fenced { .. }) => {
            tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "the record was not settled: a newer attempt owns it (fenced)")
        }
        Err(e) => {
            tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "could not settle the record")
        }
    }
}

/// The headers only this layer may set: what an upstream sends under
/// these names never reaches the client. An upstream's own
/// `Idempotency-Expires` on an answer that was not recorded (a 500 after
/// the effect) could make a client believe its key expired and mint a new
/// one; its `Idempotent-Replayed: true` on a first execution would hide
/// that the effect just ran.
pub const OWNED_HEADERS: [&str; 2] = [REPLAYED_HEADER, EXPIRES_HEADER];

fn without_owned_headers<B>(mut response: Response<B>) -> Response<B> {
    for name in OWNED_HEADERS {
        response.headers_mut().remove(name);
    }
    response
}

/// The response headers worth replaying: the allow-list plus the route's own.
fn replay_headers(
    headers: &http::HeaderMap,
    route: &Route,
) -> Vec<(String, idem_core::HeaderBytes)> {
    let allowed = [
        header::CONTENT_TYPE,
        header::LOCATION,
        header::CONTENT_LOCATION,
    ];
    allowed
        .iter()
        .chain(&route.replay_headers)
        .filter(|name| !OWNED_HEADERS.contains(&name.as_str()))
        .flat_map(|name| {
            headers
                .get_all(name)
                .iter()
                .map(move |v| (name.as_str().to_owned(), v.as_bytes().into()))
        })
        .collect()
}

/// The header that says until when a stored result is replayed: an HTTP
/// date, from the record's `expires_at` (the store's clock).
pub const EXPIRES_HEADER: &str = "idempotency-expires";

/// Adds [`EXPIRES_HEADER`] for a record that expires at `expires_at`.
fn with_expiry<B>(
    mut response: Response<B>,
    expires_at: Option<idem_core::Timestamp>,
) -> Response<B> {
    let Some(at) = expires_at else {
        return response;
    };
    let Some(when) = UNIX_EPOCH.checked_add(Duration::from_millis(at.as_millis())) else {
        return response;
    };
    if let Ok(value) = HeaderValue::from_str(&httpdate::fmt_http_date(when)) {
        response
            .headers_mut()
            .insert(HeaderName::from_static(EXPIRES_HEADER), value);
    }
    response
}

fn replay<B: From<Bytes>>(record: &Record) -> Response<B> {
    match &record.result {
        Some(result) => with_expiry(stored_response(result, true), record.expires_at),
        // A completed record always carries its result; a missing one means
        // the store lost it, which must not be answered as a fresh success.
        None => problem(Problem::new(
            ProblemKind::ResultNotStored,
            "the stored result is missing",
        )),
    }
}

fn stored_response<B: From<Bytes>>(result: &StoredResult, replayed: bool) -> Response<B> {
    let mut response = Response::new(B::from(Bytes::copy_from_slice(result.body())));
    *response.status_mut() =
        http::StatusCode::from_u16(result.status()).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let headers = response.headers_mut();
    for (name, value) in result.headers() {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            headers.append(name, value);
        }
    }
    if replayed {
        headers.insert(
            HeaderName::from_static(REPLAYED_HEADER),
            HeaderValue::from_static("true"),
        );
    }
    response
}

fn refusal(route: &Route, id: &RecordId, claim: Claim, unknown: UnknownOutcomes) -> Problem {
    let lease_s = route.policy().lease_ms().div_ceil(1000);
    match claim {
        Claim::Mismatch { .. } => Problem::new(
            ProblemKind::KeyReused,
            format!("key {:?} was used for a different request; nothing was executed", id.key.as_str()),
        ),
        Claim::InFlight { retry_after_ms, .. } => Problem::new(
            ProblemKind::RequestInProgress,
            "an earlier request with this key is still being processed; nothing was executed",
        )
        .retry_after(retry_after_ms.div_ceil(1000)),
        Claim::OutcomeUnknown { .. } => Problem::new(
            ProblemKind::OutcomeUnknown,
            match unknown {
                UnknownOutcomes::Reconciler => "the outcome of an earlier request with this key is unknown and awaits reconciliation (the provider's lookup where the route has one, else an operator); nothing was executed",
                UnknownOutcomes::Operator => "the outcome of an earlier request with this key is unknown and nothing here reconciles it: an operator must resolve it; nothing was executed",
            },
        )
        .retry_after(lease_s),
        Claim::Expired { completed_at, .. } => {
            tracing::warn!(
                scope = %id.scope,
                key = %id.key,
                completed_at_ms = completed_at.map(|t| t.as_millis()),
                "late replay after retention refused; nothing was executed"
            );
            Problem::new(
                ProblemKind::KeyExpired,
                "this key is past its retention; the request was not executed. Use a new key only if this is a new intent",
            )
        }
        Claim::Acquired { .. } | Claim::Replay { .. } => Problem::new(
            ProblemKind::StoreUnavailable,
            "internal: an acquisition was answered as a refusal",
        ),
        _ => Problem::new(ProblemKind::StoreUnavailable, "the store answered with an unknown claim"),
    }
}

fn store_unavailable(id: &RecordId, e: &StoreError) -> Problem {
    tracing::error!(scope = %id.scope, key = %id.key, error = %e, "store unavailable; failing closed");
    Problem::new(
        ProblemKind::StoreUnavailable,
        format!("the idempotency store did not answer ({e}); nothing was forwarded"),
    )
    .retry_after(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::ClaimDecision;
    use http_body_util::Full;
    use idem_core::{MemoryStore, StoreFuture, StoreWrapper, SystemClock};
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

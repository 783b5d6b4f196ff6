//! The middleware in tower's shape: [`IdempotencyLayer`] builds
//! [`Idempotency<S>`], whose future runs one request through the contract.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, header};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Limited};
use idem_core::{Claim, ClaimRequest, Record, RecordId, Store, StoreError, StoredResult, Token};
use tower::{Layer, Service};

use crate::completion::{AttemptOutcome, Completion};
use crate::problem::{Problem, ProblemKind};
use crate::request;
use crate::route::Route;

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
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    shared: Arc<Shared>,
}

struct Shared {
    store: Arc<dyn Store>,
    routes: Vec<Route>,
    owner: String,
}

impl IdempotencyLayer {
    /// A layer over `store` protecting `routes` (first match wins).
    pub fn new(store: Arc<dyn Store>, routes: Vec<Route>) -> IdempotencyLayer {
        IdempotencyLayer {
            shared: Arc::new(Shared {
                store,
                routes,
                owner: format!("idem-{}", std::process::id()),
            }),
        }
    }

    /// Sets the owner label written on records this layer acquires (a node
    /// name helps an operator tell which gateway held a record).
    pub fn with_owner(self, owner: impl Into<String>) -> IdempotencyLayer {
        let shared = Shared {
            store: self.shared.store.clone(),
            routes: self.shared.routes.clone(),
            owner: owner.into(),
        };
        IdempotencyLayer {
            shared: Arc::new(shared),
        }
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;
    fn layer(&self, inner: S) -> Idempotency<S> {
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

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The ready service goes into the future; a clone stays for the next call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let route = shared
                .routes
                .iter()
                .find(|r| r.matches(req.method(), req.uri().path()));
            match route {
                Some(route) => Ok(protect(&shared, route, inner, req).await),
                None => {
                    let mut inner = inner;
                    inner.call(req).await
                }
            }
        })
    }
}

/// One protected request, start to end. Always answers: problems and
/// upstream failures are responses.
async fn protect<S, ReqBody, ResBody>(
    shared: &Shared,
    route: &Route,
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
                Ok(response) => response,
                Err(e) => Problem::new(ProblemKind::UpstreamFailed, e.to_string()).into_response(),
            };
        }
        Ok(None) => {
            let detail = format!("this route requires the {} header", route.key_header);
            return Problem::new(ProblemKind::MissingKey, detail).into_response();
        }
        Err(problem) => return problem.into_response(),
    };
    let (mut parts, body) = req.into_parts();
    let body = match read_body(&parts.headers, body, route.body_bytes_max).await {
        Ok(bytes) => bytes,
        Err(problem) => return problem.into_response(),
    };
    let prepared = request::scope(&parts, route)
        .and_then(|scope| Ok((scope, request::fingerprint(&parts, route, &body)?)));
    let (scope, fingerprint) = match prepared {
        Ok(found) => found,
        Err(problem) => return problem.into_response(),
    };
    let claim_request = ClaimRequest {
        id: RecordId { scope, key },
        fingerprint,
        owner: shared.owner.clone(),
        policy: *route.policy(),
    };
    let claim = match shared.store.claim(&claim_request).await {
        Ok(claim) => claim,
        Err(e) => return store_unavailable(&claim_request.id, &e).into_response(),
    };
    let id = &claim_request.id;
    match claim {
        Claim::Acquired { token, .. } => {
            forward_key(&mut parts.headers, route, id);
            let req = Request::from_parts(parts, ReqBody::from(body));
            let outcome = inner.call(req).await;
            finish(shared, route, id, token, outcome).await
        }
        Claim::Replay { record } => replay(&record),
        other => refusal(route, id, other).into_response(),
    }
}

/// Reads the body up to `limit`: 413 on a declared or actual excess.
async fn read_body<B>(headers: &http::HeaderMap, body: B, limit: usize) -> Result<Bytes, Problem>
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
    let value = route
        .forward_template
        .render(id.key.as_str(), &request::scope_digest(&id.scope));
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
    outcome: Result<Response<ResBody>, E>,
) -> Response<ResBody>
where
    ResBody: HttpBody + From<Bytes>,
    ResBody::Error: Into<BoxError>,
    E: std::fmt::Display,
{
    let response = match outcome {
        Ok(response) => response,
        Err(e) => {
            let completion = route.completion.classify_failure(AttemptOutcome::Lost);
            settle(shared, id, token, completion).await;
            return Problem::new(ProblemKind::UpstreamFailed, e.to_string()).into_response();
        }
    };
    let completion = match response.extensions().get::<AttemptOutcome>() {
        Some(failure) => route.completion.classify_failure(*failure),
        None => route.completion.classify(response.status()),
    };
    if completion != Completion::Final {
        settle(shared, id, token, completion).await;
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = Limited::new(body, RESPONSE_BYTES_MAX)
        .collect()
        .await
        .map(|c| c.to_bytes());
    let stored_headers = replay_headers(&parts.headers, route);
    let (result, passthrough) = match bytes {
        Ok(bytes) => {
            match StoredResult::new(parts.status.as_u16(), stored_headers, bytes.to_vec()) {
                Ok(result) => (result, Some(bytes)),
                Err(e) => (result_not_stored(&e.to_string()), Some(bytes)),
            }
        }
        Err(e) => (
            result_not_stored(&format!("the body could not be read: {e}")),
            None,
        ),
    };
    match shared.store.complete(id, token, result.clone()).await {
        Ok(_) => {
            tracing::info!(scope = %id.scope, key = %id.key, status = result.status(), "completed")
        }
        Err(e) => {
            tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "could not record the result; the record will become ambiguous when its lease ends")
        }
    }
    match passthrough {
        Some(bytes) => Response::from_parts(parts, ResBody::from(bytes)),
        None => stored_response(&result, false),
    }
}

/// Releases or marks ambiguous; failures leave the record in progress,
/// which the lease turns into `ambiguous`: never into a blind re-execution.
async fn settle(shared: &Shared, id: &RecordId, token: Token, completion: Completion) {
    let outcome = match completion {
        Completion::Release => shared.store.release(id, token).await.map(|_| "released"),
        Completion::Unknown => shared
            .store
            .mark_ambiguous(id, token)
            .await
            .map(|_| "ambiguous"),
        Completion::Final => return,
    };
    match outcome {
        Ok("ambiguous") => {
            tracing::warn!(scope = %id.scope, key = %id.key, "outcome unknown; the record awaits reconciliation")
        }
        Ok(what) => tracing::debug!(scope = %id.scope, key = %id.key, "{what}"),
        Err(e) => {
            tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "could not settle the record")
        }
    }
}

fn result_not_stored(why: &str) -> StoredResult {
    let problem = Problem::new(
        ProblemKind::ResultNotStored,
        format!(
            "the effect happened once and will not be repeated, but its response could not be stored: {why}"
        ),
    );
    let headers = vec![(
        "content-type".to_owned(),
        "application/problem+json".to_owned(),
    )];
    // The problem body is small and the status valid; the fallback is the
    // same result without a body.
    StoredResult::new(502, headers.clone(), problem.body().to_vec())
        .or_else(|_| StoredResult::new(502, headers, Vec::new()))
        .unwrap_or_else(|e| unreachable!("a 502 with no body is a valid result: {e}"))
}

/// The response headers worth replaying: the allow-list plus the route's own.
fn replay_headers(headers: &http::HeaderMap, route: &Route) -> Vec<(String, String)> {
    let allowed = [
        header::CONTENT_TYPE,
        header::LOCATION,
        header::CONTENT_LOCATION,
    ];
    allowed
        .iter()
        .chain(&route.replay_headers)
        .flat_map(|name| {
            headers.get_all(name).iter().filter_map(move |v| {
                v.to_str()
                    .ok()
                    .map(|v| (name.as_str().to_owned(), v.to_owned()))
            })
        })
        .collect()
}

fn replay<B: From<Bytes>>(record: &Record) -> Response<B> {
    match &record.result {
        Some(result) => stored_response(result, true),
        // A completed record always carries its result; a missing one means
        // the store lost it, which must not be answered as a fresh success.
        None => Problem::new(ProblemKind::ResultNotStored, "the stored result is missing")
            .into_response(),
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
            HeaderValue::from_str(value),
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

fn refusal(route: &Route, id: &RecordId, claim: Claim) -> Problem {
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
            "the outcome of an earlier request with this key is unknown and is being reconciled; nothing was executed",
        )
        .retry_after(lease_s),
        Claim::Expired { .. } => {
            tracing::warn!(scope = %id.scope, key = %id.key, "late replay after retention refused");
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

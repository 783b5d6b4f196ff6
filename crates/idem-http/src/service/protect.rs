//! One protected request, start to end: read what the contract needs (the
//! key, the body within its limit, the scope and fingerprint), let the gate
//! answer instead, run the attempt with the driver every adapter shares
//! ([`idem_attempt::Driver::run`], whose effect is `forward`), and render
//! how it ended as a response. Always answers: problems and upstream
//! failures are responses.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Request, Response, header};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Limited};
use idem_attempt::{AttemptEnd, Driver, Ran, Unknowns};
use idem_core::{ClaimRequest, RecordId};
use tower::Service;
use tracing::Instrument;

use super::forward::{self, Forwarded};
use super::hooks::Hooks;
use super::refusal::{self, problem};
use super::replay::{replay, stored_response, with_expiry, without_owned_headers};
use super::{BoxError, Shared, UnknownOutcomes};
use crate::gate::{BeforeClaim, Gate};
use crate::problem::{Problem, ProblemKind};
use crate::request;
use crate::route::Route;

/// A bound on a request's lease that whoever runs the layer inserts in the
/// request's extensions before it: the attempt leases at most this (never
/// less than [`idem_core::LEASE_MS_MIN`]), so a caller that will be stopped
/// at a deadline of its own (a serverless invocation) leaves no record
/// leased past it. Without it, the route's lease holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseCap(pub std::time::Duration);

/// [`protect`] on a task of its own, so that a client that hangs up (its
/// connection dropped, and with it the future that awaits this) cancels
/// nothing: an attempt that holds a claim runs to its end and records its
/// outcome, and the client's retry is answered with it. What the attempt
/// holds is bounded as before, by its lease's deadline. The task is
/// tracked (`IdempotencyLayer::attempts`), so that a server shutting down
/// waits for it rather than cutting it mid-forward.
pub(super) async fn detached<S, ReqBody, ResBody>(
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
    let location = shared
        .respond_async
        .then(|| respond_async_location(&shared.routes[index], &req))
        .flatten();
    let (acquired, claimed) = match location {
        Some(_) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    let tracker = shared.attempts.clone();
    let attempt = async move {
        let route = &shared.routes[index];
        protect(&shared, (index, route), inner, req, acquired).await
    };
    let mut running = tracker.spawn(attempt.in_current_span());
    if let (Some(mut claimed), Some(location)) = (claimed, location) {
        // The task goes on when this answers first: the attempt completes
        // its record as it would have, bounded by its lease.
        let mut listening = true;
        let first = std::future::poll_fn(|cx| {
            if let Poll::Ready(joined) = Pin::new(&mut running).poll(cx) {
                return Poll::Ready(First::Ended(joined));
            }
            if listening {
                match Pin::new(&mut claimed).poll(cx) {
                    Poll::Ready(Ok(retry_after)) => {
                        return Poll::Ready(First::Acquired(retry_after));
                    }
                    // Never acquired: the attempt's own answer comes.
                    Poll::Ready(Err(_)) => listening = false,
                    Poll::Pending => {}
                }
            }
            Poll::Pending
        })
        .await;
        return match first {
            First::Ended(joined) => joined_response(joined),
            First::Acquired(retry_after) => crate::status::accepted(&location, retry_after),
        };
    }
    joined_response(running.await)
}

/// What a `Prefer: respond-async` request learns first: the attempt ended
/// (never acquired, or quicker than the news), or its claim acquired, with
/// when to ask the status URL.
enum First<T> {
    Ended(T),
    Acquired(Duration),
}

/// The status URL to answer `Prefer: respond-async` with: `None` when the
/// request does not ask, has no valid key, or its route has no status URL.
fn respond_async_location<B>(route: &Route, req: &Request<B>) -> Option<String> {
    // A route that lists no methods answers no status URL (`locate`):
    // a Location there could never be polled.
    if !crate::status::prefers_async(req.headers()) || route.methods().is_empty() {
        return None;
    }
    // A caller in the anonymous scope has no status URL to poll
    // (`service::status::ids`): its request is answered when it ends.
    let principal = route.principal.of(req.headers()).ok()?;
    if principal == crate::principal::ANONYMOUS {
        return None;
    }
    let key = request::key(req.headers(), route).ok()??;
    // Named in the URL: the same path and key under another method is
    // another intent, possibly of another route.
    route
        .status
        .location(req.uri().path(), &key, Some(req.method()))
}

/// The attempt task's answer as a response.
fn joined_response<B: From<Bytes>>(
    joined: Result<Response<B>, tokio::task::JoinError>,
) -> Response<B> {
    match joined {
        Ok(response) => response,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => problem(Problem::new(
            ProblemKind::UpstreamFailed,
            "the attempt was stopped before it answered: the runtime is shutting down",
        )),
    }
}

/// One protected request, start to end.
async fn protect<S, ReqBody, ResBody>(
    shared: &Shared,
    (index, route): (usize, &Route),
    mut inner: S,
    req: Request<ReqBody>,
    acquired: Option<tokio::sync::oneshot::Sender<Duration>>,
) -> Response<ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send,
    S::Future: Send,
    S::Error: std::fmt::Display + Send,
    ReqBody: HttpBody + From<Bytes> + Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: HttpBody + From<Bytes> + Send,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    let (mut claim_request, request) = match prepare(shared, (index, route), &mut inner, req).await
    {
        Ok(prepared) => prepared,
        Err(answered) => return answered,
    };
    // Bytes share the body: the summary reads it only if the attempt is
    // marked ambiguous, after the request was forwarded.
    let body = request.1.clone();
    let summary = move || idem_core::jcs::extract(&body, &route.summary_fields);
    let hooks = Hooks::new(shared, route, request, acquired);
    let unknowns = match shared.unknown {
        UnknownOutcomes::Reconciler => Unknowns::Reconciler,
        UnknownOutcomes::Operator => Unknowns::Operator,
    };
    let driver = Driver::new(&*shared.store, &route.completion)
        .with_window(&shared.window, shared.verifier.as_deref())
        .with_settler(shared.settler.as_deref())
        .with_unknowns(unknowns)
        .with_observer(&hooks)
        .with_claimant(&hooks);
    let driver = match route.summary_fields.is_empty() {
        true => driver,
        false => driver.with_summary(&summary),
    };
    let effect = |granted| forward::forward(inner, route, &hooks, granted);
    let end = driver.run(&mut claim_request, effect).await;
    let id = &claim_request.id;
    // The attempt let go of the record (or could not): whoever waits on
    // the key asks the store again.
    if end.held() {
        shared.waiters.wake(id);
    }
    with_preference(render((shared, route), id, end), hooks.waited())
}

/// Reads what the contract needs before a claim (the key, the body within
/// its limit, the scope and fingerprint) and asks the gate: the claim's
/// request and the request as read, or the answer made on the way (a
/// problem, the gate's answer, or an unkeyed request passed through).
async fn prepare<S, ReqBody, ResBody>(
    shared: &Shared,
    (index, route): (usize, &Route),
    inner: &mut S,
    req: Request<ReqBody>,
) -> Result<(ClaimRequest, (Parts, Bytes)), Response<ResBody>>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: std::fmt::Display,
    ReqBody: HttpBody,
    ReqBody::Error: Into<BoxError>,
    ResBody: From<Bytes>,
{
    let key = match request::key(req.headers(), route) {
        Ok(Some(key)) => key,
        Ok(None) if !route.key_required => {
            return Err(match inner.call(req).await {
                Ok(response) => without_owned_headers(response),
                Err(e) => problem(Problem::new(ProblemKind::UpstreamFailed, e.to_string())),
            });
        }
        Ok(None) => {
            let detail = format!("this route requires the {} header", route.key_header);
            return Err(problem(Problem::new(ProblemKind::MissingKey, detail)));
        }
        Err(p) => return Err(problem(p)),
    };
    let (parts, body) = req.into_parts();
    let body = read_body(&parts.headers, body, route.body_bytes_max)
        .await
        .map_err(problem)?;
    let ((scope, principal), fingerprint) = request::scope(&parts, route)
        .and_then(|scope| Ok((scope, request::fingerprint(&parts, route, &body)?)))
        .map_err(problem)?;
    if let Some(gate) = &shared.gate {
        let before = BeforeClaim {
            route: index,
            parts: &parts,
            key: &key,
            principal: principal.as_deref(),
            body: &body,
        };
        if let Gate::Answer(answer) = gate.before_claim(&before) {
            return Err(answer.await.map(ResBody::from));
        }
    }
    let claim_request = ClaimRequest {
        id: RecordId { scope, key },
        fingerprint,
        legacy_fingerprint: None,
        owner: shared.owner.clone(),
        region: shared.region.clone(),
        policy: match parts.extensions.get::<LeaseCap>() {
            Some(LeaseCap(cap)) => route
                .policy()
                .with_lease_at_most(u64::try_from(cap.as_millis()).unwrap_or(u64::MAX)),
            None => *route.policy(),
        },
    };
    Ok((claim_request, (parts, body)))
}

/// The response for how the attempt ended.
fn render<B>(
    (shared, route): (&Shared, &Route),
    id: &RecordId,
    end: AttemptEnd<Forwarded<'_, B>>,
) -> Response<B>
where
    B: HttpBody + From<Bytes> + Send,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let refused = match end {
        AttemptEnd::Replay(record) => return replay(&record),
        AttemptEnd::Verified(Ok(record)) => return replay(&record),
        AttemptEnd::Completed {
            result,
            kept,
            written,
        } => {
            let expires_at = written.ok().and_then(|record| record.expires_at);
            let response = match kept.flatten() {
                Some(response) => response,
                None => stored_response(&result, false),
            };
            return with_expiry(response, expires_at);
        }
        AttemptEnd::Settled { ran, .. } => return ran_response(ran),
        AttemptEnd::InFlight { retry_after } => refusal::in_flight(route, retry_after),
        AttemptEnd::Refused(why) => refusal::refused(route, id, why, shared.unknown),
        AttemptEnd::StoreUnavailable(e) => refusal::store_unavailable(id, &e),
        AttemptEnd::Verified(Err(e)) => refusal::store_unavailable(id, &e),
        AttemptEnd::Shed { .. } => refusal::overloaded(),
        AttemptEnd::Unverified {
            why, retry_after, ..
        } => refusal::unverified(&why, retry_after),
        AttemptEnd::LeaseSpent {
            lease_ms, left_ms, ..
        } => refusal::lease_spent(lease_ms, left_ms),
        _ => Problem::new(
            ProblemKind::StoreUnavailable,
            "the attempt ended in a way this version does not know",
        ),
    };
    problem(refused)
}

/// What an effect that was not final answers: the upstream's own answer
/// passed on, or a problem for a call that failed or was cut.
fn ran_response<B: From<Bytes>>(ran: Ran<Forwarded<'_, B>>) -> Response<B> {
    match ran {
        Ran::Answered(forwarded) => match forwarded.into_response() {
            Ok(response) => response,
            Err(e) => problem(Problem::new(ProblemKind::UpstreamFailed, e)),
        },
        Ran::LeaseEnded { forward_ms } => refusal::lease_ended(forward_ms),
        Ran::Panicked(panic) => std::panic::resume_unwind(panic),
        _ => problem(Problem::new(
            ProblemKind::UpstreamFailed,
            "the upstream's answer could not be recorded; its outcome is unknown",
        )),
    }
}

/// Adds `Preference-Applied: wait=N` (seconds, rounded up) to the answer of
/// a request that asked to wait and waited up to `waited` milliseconds.
pub(super) fn with_preference<B>(mut response: Response<B>, waited: Option<u64>) -> Response<B> {
    if let Some(ms) = waited
        && let Ok(value) = HeaderValue::from_str(&format!("wait={}", ms.div_ceil(1000)))
    {
        response
            .headers_mut()
            .insert(HeaderName::from_static("preference-applied"), value);
    }
    response
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

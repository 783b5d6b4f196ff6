//! The status URL's answers (see `crate::status` for where it is and how
//! a key is spelled in it): a key's record read in the scope a claim of
//! the same request would use, and rendered as a retry of it would be,
//! without a claim, a forward or a write; only an unknown outcome is
//! settled by the route's lookup, as a retry's is.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Response, StatusCode};
use idem_core::decision::decide;
use idem_core::{
    ClaimRequest, Clock, Completion, Decision, IdempotencyKey, Policy, Record, RecordId, Refusal,
    StoreError, SystemClock, Timestamp,
};

use super::protect::with_preference;
use super::refusal::{problem, refused, store_unavailable};
use super::replay::replay;
use super::{Shared, UnknownOutcomes};
use crate::pace;
use crate::problem::{Problem, ProblemKind};
use crate::route::Route;
use crate::wait::{Waiting, Wake, preferred_wait_ms};

/// What a record says to its caller now.
enum View {
    Completed,
    InFlight { age: Duration, left: Duration },
    Unknown { settle: bool },
    Expired,
    Gone,
}

/// The record as a retry of the very request that wrote it would find it:
/// the core's one claim decision ([`decide`]), asked with the record's own
/// fingerprint (the status URL has no request to compare) and never
/// applied.
fn view(record: &Record, policy: &Policy, now: Timestamp) -> View {
    let asked = ClaimRequest {
        id: record.id.clone(),
        fingerprint: record.fingerprint,
        legacy_fingerprint: None,
        owner: String::new(),
        region: None,
        policy: *policy,
    };
    match decide(Some(record), &asked, now) {
        Decision::Replay => View::Completed,
        Decision::InFlight => {
            let left = Duration::from_millis(now.millis_until(record.lease_until));
            let age = Duration::from_millis(policy.lease_ms()).saturating_sub(left);
            View::InFlight { age, left }
        }
        // A claim would mark it ambiguous, or take it over and run again:
        // either way nobody knows yet whether it ran, and this does not
        // write; a retry or the reconciler's scan marks it.
        Decision::MarkAmbiguous | Decision::TakeOver => View::Unknown { settle: false },
        Decision::OutcomeUnknown => View::Unknown { settle: true },
        Decision::LateReplay => View::Expired,
        // A tombstone past its horizon: the next claim starts afresh.
        Decision::Acquire | Decision::Mismatch => View::Gone,
    }
}

/// Answers a status URL: the stored answer, 202 while in flight (after
/// waiting as `Prefer: wait` asks), 409 `outcome-unknown` (after the
/// route's lookup, if any, could not settle it), 422 `key-expired`, or
/// 404 `key-unknown` for a key this caller's scope never held.
pub(super) async fn answer<B: From<Bytes>>(
    shared: &Shared,
    index: usize,
    (base, key, method): (String, IdempotencyKey, Option<http::Method>),
    parts: &Parts,
) -> Response<B> {
    let route = &shared.routes[index];
    let ids = match ids(route, parts, (&base, method.as_ref()), &key) {
        Ok(ids) => ids,
        Err(refusal) => return problem(refusal),
    };
    let mut seen = look(shared, route, &ids).await;
    let mut applied = None;
    if let Seen::InFlight { id, .. } = &seen {
        let preferred = preferred_wait_ms(&parts.headers);
        let wait_ms = route.wait().applied_ms(preferred);
        if wait_ms > 0
            && let Some(waiting) = shared.waiters.register(id, &shared.metrics)
        {
            let _ = shared.store.note_waiting(id).await;
            let deadline = Instant::now() + Duration::from_millis(wait_ms);
            seen = wait_for_outcome(shared, route, &ids, waiting, deadline).await;
            applied = preferred.map(|_| wait_ms);
        }
    }
    let response = match seen {
        Seen::Answer(response) => response,
        Seen::InFlight { age, left, .. } => {
            in_flight(pace::retry_after(age, route.latency.typical(), left))
        }
    };
    with_preference(response, applied)
}

/// What the store says of the key now: an answer, or an attempt in flight
/// (its age and what is left of its lease).
enum Seen<B> {
    Answer(Response<B>),
    InFlight {
        id: RecordId,
        age: Duration,
        left: Duration,
    },
}

/// Reads the key's record and renders it, settling an `ambiguous` one
/// once by the route's lookup (then reading it again).
async fn look<B: From<Bytes>>(shared: &Shared, route: &Route, ids: &[RecordId]) -> Seen<B> {
    let mut settled = false;
    loop {
        let found = match find(shared, ids).await {
            Ok(found) => found,
            Err((id, e)) => return Seen::Answer(problem(store_unavailable(id, &e))),
        };
        let Some((id, record)) = found else {
            return Seen::Answer(problem(unknown()));
        };
        let refused = |refusal| Seen::Answer(problem(refused(route, &id, refusal, shared.unknown)));
        return match view(&record, route.policy(), SystemClock.now()) {
            View::Completed => Seen::Answer(replay(&record)),
            View::Gone => Seen::Answer(problem(unknown())),
            View::Expired => refused(Refusal::Expired {
                completed_at: record.completed_at,
                tombstone_until: record.tombstone_until,
            }),
            View::Unknown { settle } => {
                if settle
                    && !settled
                    && let Some(settler) = &shared.settler
                {
                    settled = true;
                    if settler.settle(&id).await {
                        continue;
                    }
                }
                refused(Refusal::OutcomeUnknown)
            }
            View::InFlight { age, left } => Seen::InFlight { id, age, left },
        };
    }
}

/// Reads the key again whenever the waiters on it are woken or it is
/// this waiter's turn to poll, until it is no longer in flight or the
/// deadline passes. The notification is armed before each read, so that a
/// wake during the read is not lost (as a retry's wait, `hooks.rs`).
async fn wait_for_outcome<B: From<Bytes>>(
    shared: &Shared,
    route: &Route,
    ids: &[RecordId],
    waiting: Waiting,
    deadline: Instant,
) -> Seen<B> {
    loop {
        let armed = waiting.armed();
        tokio::pin!(armed);
        armed.as_mut().enable();
        let seen = look(shared, route, ids).await;
        if let Seen::Answer(_) = &seen {
            waiting.changed();
            return seen;
        }
        if waiting.next(armed.as_mut(), deadline).await == Wake::Done {
            return seen;
        }
    }
}

/// The ids a claim of this route by this caller could have used: one per
/// method the route protects (or only `method`, when the URL names it)
/// when its operation names the method and path, deduplicated (one for a
/// named route).
fn ids(
    route: &Route,
    parts: &Parts,
    (base, method): (&str, Option<&http::Method>),
    key: &IdempotencyKey,
) -> Result<Vec<RecordId>, Problem> {
    let uri: http::Uri = base.parse().map_err(|e| {
        Problem::new(
            ProblemKind::InvalidPath,
            format!("the status URL's path is not a URI: {e}"),
        )
    })?;
    // A caller without credentials on a route scoped by them shares the
    // anonymous scope with every other such caller: asking by key alone,
    // without sending the request again, would hand one of them
    // another's answer. Such a key is unknown here; a retry of the same
    // request is still answered as ever.
    if route.principal.identify(parts)?.0 == crate::principal::ANONYMOUS {
        return Ok(Vec::new());
    }
    let mut ids: Vec<RecordId> = Vec::new();
    let methods = route
        .methods()
        .iter()
        .filter(|m| method.is_none_or(|asked| asked == *m));
    for method in methods {
        let mut claimed = parts.clone();
        claimed.method = method.clone();
        claimed.uri = uri.clone();
        let (scope, _) = crate::request::scope(&claimed, route)?;
        let id = RecordId {
            scope,
            key: key.clone(),
        };
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// The first record of `ids` the store holds.
async fn find<'a>(
    shared: &Shared,
    ids: &'a [RecordId],
) -> Result<Option<(RecordId, Record)>, (&'a RecordId, StoreError)> {
    for id in ids {
        match shared.store.get(id).await {
            Ok(Some(record)) => return Ok(Some((id.clone(), record))),
            Ok(None) => {}
            Err(e) => return Err((id, e)),
        }
    }
    Ok(None)
}

/// 404 `key-unknown`: the same document whoever asks, so that it says
/// nothing of another principal's keys.
fn unknown() -> Problem {
    Problem::new(
        ProblemKind::KeyUnknown,
        "no request with this key is known to this route for this caller; nothing was executed",
    )
}

/// 202 while the attempt runs, with when to ask again.
fn in_flight<B: From<Bytes>>(retry_after: Duration) -> Response<B> {
    let body = serde_json::json!({
        "status": "in-progress",
        "detail": "the request with this key is still being processed; ask again later",
    });
    let mut response = Response::new(B::from(Bytes::from(body.to_string())));
    *response.status_mut() = StatusCode::ACCEPTED;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let value = crate::status::retry_after_value(retry_after);
    headers.insert(http::header::RETRY_AFTER, value);
    response
}

/// The route's idempotency policy as a JSON document (docs/http.md, "The
/// policy document"): what a client needs to retry safely, for the
/// resource at `base`.
pub(super) fn policy<B: From<Bytes>>(shared: &Shared, index: usize, base: &str) -> Response<B> {
    let route = &shared.routes[index];
    let policy = route.policy();
    let wait = route.wait();
    let (server_error, exceptions) = server_errors(&route.completion);
    let unknown_settled_by = match (shared.settler.is_some(), shared.unknown) {
        (true, _) => "lookup",
        (false, UnknownOutcomes::Reconciler) => "reconciler",
        (false, _) => "operator",
    };
    let doc = serde_json::json!({
        "key_header": route.key_header().as_str(),
        "key_required": route.key_required,
        "key_bytes_max": idem_core::KEY_BYTES_MAX,
        "methods": route.methods().iter().map(|m| m.as_str()).collect::<Vec<_>>(),
        "body_bytes_max": route.body_bytes_max(),
        "lease_ms": policy.lease_ms(),
        "retention_s": policy.retention_s(),
        "tombstone_s": policy.tombstone_s(),
        "on_lease_expiry": match policy.on_lease_expiry() {
            idem_core::LeaseExpiry::Reconcile => "reconcile",
            _ => "takeover",
        },
        "server_error": server_error.as_str(),
        "server_error_exceptions": exceptions,
        "unknown_settled_by": unknown_settled_by,
        "wait_ms": { "default": wait.default_ms, "max": wait.max_ms },
        "status_url": route.status.location_template(base),
        "respond_async": shared.respond_async,
    });
    let mut response = Response::new(B::from(Bytes::from(doc.to_string())));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// What most 5xx answers mean on the route, and the statuses that mean
/// something else, by status.
fn server_errors(
    table: &idem_core::CompletionTable,
) -> (Completion, serde_json::Map<String, serde_json::Value>) {
    let usual = table.classify(500);
    let exceptions = (500..=599)
        .filter(|status| table.classify(*status) != usual)
        .map(|status| {
            let meaning = table.classify(status).as_str();
            (status.to_string(), serde_json::Value::from(meaning))
        })
        .collect();
    (usual, exceptions)
}

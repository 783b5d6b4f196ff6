//! The problems this layer answers instead of the upstream, one per way an
//! attempt ends without an answer of its own (RFC 9457 documents, see
//! `problem`). The driver's delays are `Duration`s; `Retry-After` has
//! whole seconds, so every delay is rounded up here, never down: a client
//! that retries on time never comes back too early.

use std::time::Duration;

use bytes::Bytes;
use http::Response;
use idem_core::{AttemptOutcome, RecordId, Refusal, StoreError, Unverified};

use super::UnknownOutcomes;
use crate::problem::{Problem, ProblemKind};
use crate::route::Route;

/// The response for a problem this layer answers, tagged with its kind so
/// that it is counted once, where every protected response passes.
pub(super) fn problem<B: From<Bytes>>(problem: Problem) -> Response<B> {
    let kind = problem.kind;
    let mut response: Response<B> = problem.into_response();
    response.extensions_mut().insert(kind);
    response
}

/// `Retry-After` for `delay`: whole seconds, rounded up.
fn seconds(delay: Duration) -> u64 {
    u64::try_from(delay.as_millis().div_ceil(1000)).unwrap_or(u64::MAX)
}

/// Another attempt holds the key for `lease_left` more: `Retry-After`
/// from its age (the route's lease less what is left of it) and the
/// route's observed latency ([`crate::retry_after`]).
pub(super) fn in_flight(route: &Route, lease_left: Duration) -> Problem {
    let lease = Duration::from_millis(route.policy().lease_ms());
    let age = lease.saturating_sub(lease_left);
    let advised = crate::pace::retry_after(age, route.latency.typical(), lease_left);
    Problem::new(
        ProblemKind::RequestInProgress,
        "an earlier request with this key is still being processed; nothing was executed",
    )
    .retry_after(seconds(advised))
}

/// A claim that refused: the key bound to another request, an unknown
/// outcome, a late replay.
pub(super) fn refused(
    route: &Route,
    id: &RecordId,
    refusal: Refusal,
    unknown: UnknownOutcomes,
) -> Problem {
    match refusal {
        Refusal::KeyReused => Problem::new(
            ProblemKind::KeyReused,
            format!("key {:?} was used for a different request; nothing was executed", id.key.as_str()),
        ),
        Refusal::OutcomeUnknown => Problem::new(
            ProblemKind::OutcomeUnknown,
            match unknown {
                UnknownOutcomes::Reconciler => "the outcome of an earlier request with this key is unknown and awaits reconciliation (the provider's lookup where the route has one, else an operator); nothing was executed",
                UnknownOutcomes::Operator => "the outcome of an earlier request with this key is unknown and nothing here reconciles it: an operator must resolve it; nothing was executed",
            },
        )
        .retry_after(seconds(idem_core::attempt::outcome_unknown_retry(route.policy()))),
        Refusal::Expired { .. } => Problem::new(
            ProblemKind::KeyExpired,
            "this key is past its retention; the request was not executed. Use a new key only if this is a new intent",
        ),
        _ => Problem::new(ProblemKind::StoreUnavailable, "the store answered with an unknown claim"),
    }
}

/// The store did not answer: fail closed.
pub(super) fn store_unavailable(id: &RecordId, e: &StoreError) -> Problem {
    tracing::error!(scope = %id.scope, key = %id.key, error = %e, "store unavailable; failing closed");
    Problem::new(
        ProblemKind::StoreUnavailable,
        format!("the idempotency store did not answer ({e}); nothing was forwarded"),
    )
    .retry_after(seconds(idem_core::attempt::STORE_RETRY))
}

/// A wait ended in work with no in-flight slot free.
pub(super) fn overloaded() -> Problem {
    Problem::new(
        ProblemKind::Overloaded,
        "the wait ended, but the gateway is serving as many requests as it may \
         (requests_in_flight_max); nothing was forwarded",
    )
    .retry_after(seconds(idem_core::attempt::RELEASED_RETRY))
}

/// A fresh claim inside the suspect window the provider could not clear.
pub(super) fn unverified(why: &Unverified, retry_after: Duration) -> Problem {
    let detail = match why {
        Unverified::NotYet { running } => format!(
            "the idempotency store may have lost records (a failover or a restore), and an \
             attempt it forgot may still be running at the provider for {} ms; nothing was \
             forwarded, retry after that",
            running.as_millis()
        ),
        _ => "the idempotency store may have lost records (a failover or a restore), and the \
              provider could not say whether this key executed; nothing was forwarded"
            .to_owned(),
    };
    Problem::new(ProblemKind::Unverified, detail).retry_after(seconds(retry_after).max(1))
}

/// The store's answer left too little of its lease to forward.
pub(super) fn lease_spent(lease_ms: u64, left_ms: u64) -> Problem {
    Problem::new(
        ProblemKind::LeaseSpent,
        format!(
            "the idempotency store granted a {lease_ms} ms lease, but its answer came with \
             {left_ms} ms of it left, under the {} ms needed to forward; nothing was forwarded",
            idem_core::FORWARD_MS_MIN
        ),
    )
    .retry_after(seconds(idem_core::attempt::RELEASED_RETRY))
}

/// What a forward cut at its lease's end answers: the request was sent, so
/// its outcome is unknown ([`AttemptOutcome::Lost`]), as after the proxy's
/// own response timeout.
pub(super) fn lease_ended<B: From<Bytes>>(forward_ms: u64) -> Response<B> {
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

//! The claim decision and every other state transition, as pure functions of
//! (existing record, request, now). Every store applies these and nothing
//! else; a store's only job is to apply one atomically to one record.

use crate::record::{Outcome, Record, RecordId, Resolution, State, StoredResult, Token};
use crate::{Fingerprint, LeaseExpiry, Policy, StoreError, Timestamp};

/// A request to claim (scope, key) for one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// Scope and key.
    pub id: RecordId,
    /// Fingerprint of the request this attempt would execute.
    pub fingerprint: Fingerprint,
    /// Label of the claimer (node, worker), kept on the record.
    pub owner: String,
    /// The route's policy.
    pub policy: Policy,
}

/// A row of DESIGN.md's claim table: what to do given the existing record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No record, or a tombstone past its horizon: a new acquisition.
    Acquire,
    /// A live record was acquired with another fingerprint.
    Mismatch,
    /// Completed within retention: replay the stored result.
    Replay,
    /// In progress with a valid lease: another attempt is running.
    InFlight,
    /// In progress, lease expired, policy `reconcile`: the record becomes ambiguous.
    MarkAmbiguous,
    /// In progress, lease expired, policy `takeover`: acquire with a new token.
    TakeOver,
    /// Ambiguous: the outcome is unknown until resolved.
    OutcomeUnknown,
    /// A tombstone within its horizon: a late replay, rejected.
    LateReplay,
}

/// What a claim tells the caller. Never a bool: each case asks for a
/// different response.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// This attempt owns the record; execute the effect, then complete or
    /// release with `token`.
    Acquired {
        /// Fencing token to present on completion or release.
        token: Token,
        /// When the lease ends.
        lease_until: Timestamp,
        /// The token of the attempt taken over, if this was a takeover.
        took_over: Option<Token>,
    },
    /// The effect already happened: replay this completed record's result.
    Replay {
        /// The completed record.
        record: Box<Record>,
    },
    /// The key was used with a different request: reject, no effect.
    Mismatch {
        /// The fingerprint the key is bound to.
        stored: Fingerprint,
    },
    /// Another attempt holds a valid lease: conflict, retry later.
    InFlight {
        /// When that lease ends.
        lease_until: Timestamp,
        /// Milliseconds until then.
        retry_after_ms: u64,
    },
    /// The outcome of an earlier attempt is unknown and awaits reconciliation.
    OutcomeUnknown {
        /// True when this claim found the expired lease and marked the record.
        newly_marked: bool,
    },
    /// The key is past retention: a late replay, rejected and never executed.
    Expired {
        /// When the original effect completed.
        completed_at: Option<Timestamp>,
        /// Until when the tombstone is kept.
        tombstone_until: Option<Timestamp>,
    },
}

/// The write a transition asks the store to apply to the one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Leave the record as it is.
    None,
    /// Insert or replace the record.
    Put(Record),
    /// Remove the record.
    Delete,
}

/// DESIGN.md's claim table as one function.
pub fn decide(
    existing: Option<&Record>,
    fingerprint: &Fingerprint,
    policy: &Policy,
    now: Timestamp,
) -> Decision {
    let Some(record) = existing else {
        return Decision::Acquire;
    };
    if record.state_at(now) == State::Tombstone {
        return match record.tombstone_until {
            Some(until) if now >= until => Decision::Acquire,
            _ => Decision::LateReplay,
        };
    }
    if record.fingerprint != *fingerprint {
        return Decision::Mismatch;
    }
    match record.state {
        State::Completed => Decision::Replay,
        State::InProgress if now < record.lease_until => Decision::InFlight,
        State::InProgress => match policy.on_lease_expiry() {
            LeaseExpiry::Reconcile => Decision::MarkAmbiguous,
            LeaseExpiry::Takeover => Decision::TakeOver,
        },
        State::Ambiguous => Decision::OutcomeUnknown,
        State::Tombstone => Decision::LateReplay,
    }
}

/// Applies [`decide`]: what to answer and what to write. `next_token` is
/// called only when the claim acquires, and must return a token greater than
/// any the store has handed out before.
pub fn claim(
    existing: Option<&Record>,
    req: &ClaimRequest,
    now: Timestamp,
    next_token: impl FnOnce() -> Token,
) -> (Claim, Write) {
    match decide(existing, &req.fingerprint, &req.policy, now) {
        Decision::Acquire => acquire(req, now, next_token(), None),
        Decision::TakeOver => acquire(req, now, next_token(), existing.map(|r| r.token)),
        Decision::Mismatch => match existing {
            Some(r) => (
                Claim::Mismatch {
                    stored: r.fingerprint,
                },
                Write::None,
            ),
            None => unreachable_none(),
        },
        Decision::Replay => match existing {
            Some(r) => (
                Claim::Replay {
                    record: Box::new(r.clone()),
                },
                Write::None,
            ),
            None => unreachable_none(),
        },
        Decision::InFlight => {
            let lease_until = existing.map_or(now, |r| r.lease_until);
            let retry_after_ms = now.millis_until(lease_until);
            (
                Claim::InFlight {
                    lease_until,
                    retry_after_ms,
                },
                Write::None,
            )
        }
        Decision::MarkAmbiguous => match existing {
            Some(r) => {
                let mut marked = r.clone();
                marked.state = State::Ambiguous;
                (
                    Claim::OutcomeUnknown { newly_marked: true },
                    Write::Put(marked),
                )
            }
            None => unreachable_none(),
        },
        Decision::OutcomeUnknown => (
            Claim::OutcomeUnknown {
                newly_marked: false,
            },
            Write::None,
        ),
        Decision::LateReplay => (
            Claim::Expired {
                completed_at: existing.and_then(|r| r.completed_at),
                tombstone_until: existing.and_then(|r| r.tombstone_until),
            },
            Write::None,
        ),
    }
}

/// `decide` only returns the rows that need a record when there is one; this
/// keeps the match total without a panic on a path no input reaches.
fn unreachable_none() -> (Claim, Write) {
    (
        Claim::OutcomeUnknown {
            newly_marked: false,
        },
        Write::None,
    )
}

fn acquire(
    req: &ClaimRequest,
    now: Timestamp,
    token: Token,
    took_over: Option<Token>,
) -> (Claim, Write) {
    let lease_until = now.plus_millis(req.policy.lease_ms());
    let record = Record {
        id: req.id.clone(),
        fingerprint: req.fingerprint,
        state: State::InProgress,
        token,
        owner: req.owner.clone(),
        lease_until,
        created_at: now,
        completed_at: None,
        expires_at: None,
        tombstone_until: None,
        retention_s: req.policy.retention_s(),
        tombstone_s: req.policy.tombstone_s(),
        result: None,
        resolution: None,
    };
    let claim = Claim::Acquired {
        token,
        lease_until,
        took_over,
    };
    (claim, Write::Put(record))
}

/// Completing an attempt: only the current token of an `in_progress` record
/// may store a result.
pub fn complete(
    existing: Option<&Record>,
    id: &RecordId,
    token: Token,
    result: StoredResult,
    now: Timestamp,
) -> Result<Record, StoreError> {
    let record = owned_in_progress(existing, id, token)?;
    let mut done = record.clone();
    mark_completed(&mut done, result, now);
    Ok(done)
}

/// Releasing an attempt (the request was not processed): only the current
/// token of an `in_progress` record may remove it. The write is a delete.
pub fn release(existing: Option<&Record>, id: &RecordId, token: Token) -> Result<(), StoreError> {
    owned_in_progress(existing, id, token).map(|_| ())
}

/// The attempt learned that its outcome is unknown (e.g. an upstream 502):
/// only the current token of an `in_progress` record may mark it.
pub fn mark_ambiguous(
    existing: Option<&Record>,
    id: &RecordId,
    token: Token,
) -> Result<Record, StoreError> {
    let record = owned_in_progress(existing, id, token)?;
    let mut marked = record.clone();
    marked.state = State::Ambiguous;
    Ok(marked)
}

/// Resolving an `ambiguous` record: completed (store the result) or not
/// executed (remove it so a retry may run). Returns the write to apply.
pub fn resolve(
    existing: Option<&Record>,
    id: &RecordId,
    mut resolution: Resolution,
    now: Timestamp,
) -> Result<Write, StoreError> {
    let Some(record) = existing else {
        return Err(StoreError::NotFound { id: id.clone() });
    };
    if record.state != State::Ambiguous {
        return Err(StoreError::WrongState {
            id: id.clone(),
            state: record.state_at(now),
            operation: "resolve",
        });
    }
    resolution.at = Some(now);
    match &resolution.outcome {
        Outcome::NotExecuted => Ok(Write::Delete),
        Outcome::Completed { result } => {
            let mut done = record.clone();
            mark_completed(&mut done, result.clone(), now);
            done.resolution = Some(resolution);
            Ok(Write::Put(done))
        }
    }
}

/// What the purge does with one record at `now`.
pub fn purge(record: &Record, now: Timestamp) -> Write {
    if record.state_at(now) != State::Tombstone {
        return Write::None;
    }
    match record.tombstone_until {
        Some(until) if now >= until => Write::Delete,
        _ if record.state == State::Tombstone => Write::None,
        _ => {
            let mut tombstone = record.clone();
            tombstone.state = State::Tombstone;
            tombstone.result = None;
            Write::Put(tombstone)
        }
    }
}

fn mark_completed(record: &mut Record, result: StoredResult, now: Timestamp) {
    record.state = State::Completed;
    record.completed_at = Some(now);
    record.expires_at = Some(now.plus_millis(record.retention_s.saturating_mul(1000)));
    record.tombstone_until = Some(now.plus_millis(record.tombstone_s.saturating_mul(1000)));
    record.result = Some(result);
}

fn owned_in_progress<'r>(
    existing: Option<&'r Record>,
    id: &RecordId,
    token: Token,
) -> Result<&'r Record, StoreError> {
    match existing {
        Some(r) if r.state == State::InProgress && r.token == token => Ok(r),
        other => Err(StoreError::Fenced {
            id: id.clone(),
            presented: token,
            current: other.map(|r| (r.token, r.state)),
        }),
    }
}

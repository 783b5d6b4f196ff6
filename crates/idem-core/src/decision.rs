//! The claim decision and every other state transition, as pure functions of
//! (existing record, request, now). Every store applies these and nothing
//! else; a store's only job is to apply one atomically to one record.

use crate::record::{
    JournalEntry, LimitError, LookupTries, Outcome, Record, RecordId, Resolution, Resolved, State,
    StoredResult, Token, Verb, VerbRequest, check_owner, check_region,
};
use crate::{AmbiguityNote, Fingerprint, LeaseExpiry, Policy, StoreError, Timestamp};

/// A request to claim (scope, key) for one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// Scope and key.
    pub id: RecordId,
    /// Fingerprint of the request this attempt would execute; an acquired
    /// record keeps it.
    pub fingerprint: Fingerprint,
    /// The same request's fingerprint in the previous canonical form
    /// ([`Fingerprint::of_request_v1`]), where that form reads it exactly. A
    /// record written before the current form matches this request if it
    /// holds either fingerprint, so retries in flight across an upgrade
    /// replay instead of being refused as a reused key. It matters only until
    /// the records written before the upgrade have expired; `None` for
    /// requests that were never fingerprinted in that form.
    pub legacy_fingerprint: Option<Fingerprint>,
    /// Label of the claimer (node, worker), kept on the record.
    pub owner: String,
    /// The claimer's region, kept on the record it acquires (checked by
    /// [`check_region`](crate::check_region)); `None` when it has none.
    pub region: Option<String>,
    /// The route's policy.
    pub policy: Policy,
}

impl ClaimRequest {
    /// Whether a record holding `stored` was acquired by this same request:
    /// its fingerprint, or its legacy fingerprint where it has one.
    pub fn matches(&self, stored: &Fingerprint) -> bool {
        *stored == self.fingerprint || Some(*stored) == self.legacy_fingerprint
    }

    /// Checks the labels an acquired record keeps, the owner and the
    /// region: every store refuses a claim that fails this before deciding.
    pub fn check_labels(&self) -> Result<(), LimitError> {
        check_owner(&self.owner)?;
        match &self.region {
            Some(region) => check_region(region),
            None => Ok(()),
        }
    }
}

/// A row of the claim table (docs/contract.md): what to do given the
/// existing record.
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
        /// When the lease ends (store clock).
        lease_until: Timestamp,
        /// How long the store leased, in milliseconds: `lease_until` less
        /// the store's clock at the decision. The claimant cannot compare
        /// the store's instants with its own, only durations: the effect's
        /// deadline comes from this through [`crate::lease::lease_left`].
        lease_ms: u64,
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
// `Write` lives for one store operation and is consumed at once; boxing the
// record would add an allocation to every claim for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Leave the record as it is.
    None,
    /// Insert or replace the record.
    Put(Record),
    /// Remove the record.
    Delete,
}

/// The claim table (docs/contract.md) as one function.
pub fn decide(existing: Option<&Record>, req: &ClaimRequest, now: Timestamp) -> Decision {
    let Some(record) = existing else {
        return Decision::Acquire;
    };
    if record.state_at(now) == State::Tombstone {
        return match record.tombstone_until {
            Some(until) if now >= until => Decision::Acquire,
            _ => Decision::LateReplay,
        };
    }
    if !req.matches(&record.fingerprint) {
        return Decision::Mismatch;
    }
    match record.state {
        State::Completed => Decision::Replay,
        State::InProgress if now < record.lease_until => Decision::InFlight,
        State::InProgress => match req.policy.on_lease_expiry() {
            LeaseExpiry::Reconcile => Decision::MarkAmbiguous,
            LeaseExpiry::Takeover => Decision::TakeOver,
        },
        State::Ambiguous => Decision::OutcomeUnknown,
        State::Tombstone => Decision::LateReplay,
    }
}

/// What [`plan`] found a claim must do: answer (and write) at once, or
/// acquire, which needs a fresh token first.
// Like `Write`, a plan lives for one store operation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The claim's answer and its write; no token is needed.
    Answer(Claim, Write),
    /// The claim acquires: take a fresh token and call [`acquire`] with it.
    Acquire {
        /// The token of the attempt taken over, if this is a takeover.
        took_over: Option<Token>,
    },
}

/// The claim decision, applied as far as it can be without a token: calls
/// [`decide`] once. A store that must fetch a token on its own terms (from
/// a database sequence, asynchronously) takes one only for
/// [`Plan::Acquire`] and finishes with [`acquire`]; the decision is never
/// made a second time.
pub fn plan(existing: Option<&Record>, req: &ClaimRequest, now: Timestamp) -> Plan {
    // With no record the table has one row: acquire.
    let Some(record) = existing else {
        return Plan::Acquire { took_over: None };
    };
    let answer = match decide(Some(record), req, now) {
        Decision::Acquire => return Plan::Acquire { took_over: None },
        Decision::TakeOver => {
            return Plan::Acquire {
                took_over: Some(record.token),
            };
        }
        Decision::MarkAmbiguous => {
            let mut marked = record.clone();
            marked.state = State::Ambiguous;
            let claim = Claim::OutcomeUnknown { newly_marked: true };
            return Plan::Answer(claim, Write::Put(marked));
        }
        Decision::Mismatch => Claim::Mismatch {
            stored: record.fingerprint,
        },
        Decision::Replay => Claim::Replay {
            record: Box::new(record.clone()),
        },
        Decision::InFlight => Claim::InFlight {
            lease_until: record.lease_until,
            retry_after_ms: now.millis_until(record.lease_until),
        },
        Decision::OutcomeUnknown => Claim::OutcomeUnknown {
            newly_marked: false,
        },
        Decision::LateReplay => Claim::Expired {
            completed_at: record.completed_at,
            tombstone_until: record.tombstone_until,
        },
    };
    Plan::Answer(answer, Write::None)
}

/// The claim's answer when it writes nothing (a replay, a 409, a 422, a
/// late replay, an outcome still unknown), `None` when it would write (a
/// new key, a takeover, an expired lease marked ambiguous). A store may
/// answer this from a read that takes no lock: the record it read held at
/// an instant of the read, and the claim, which changes nothing, takes
/// effect at that instant. Every other claim must take the store's lock.
pub fn answer_without_write(
    existing: Option<&Record>,
    req: &ClaimRequest,
    now: Timestamp,
) -> Option<Claim> {
    match plan(existing, req, now) {
        Plan::Answer(claim, Write::None) => Some(claim),
        Plan::Answer(..) | Plan::Acquire { .. } => None,
    }
}

/// [`plan`] finished with a token from `next_token`, called only when the
/// claim acquires; it must return a token no attempt has held before.
pub fn claim(
    existing: Option<&Record>,
    req: &ClaimRequest,
    now: Timestamp,
    next_token: impl FnOnce() -> Token,
) -> (Claim, Write) {
    match plan(existing, req, now) {
        Plan::Answer(claim, write) => (claim, write),
        Plan::Acquire { took_over } => acquire(req, now, next_token(), took_over),
    }
}

/// The acquisition [`Plan::Acquire`] asks for, with the fresh `token`: a new
/// `in_progress` record leased from `now`. For a key with no record this is
/// the whole decision, which is what lets a store try a plain insert first.
pub fn acquire(
    req: &ClaimRequest,
    now: Timestamp,
    token: Token,
    took_over: Option<Token>,
) -> (Claim, Write) {
    let lease_ms = req.policy.lease_ms();
    let lease_until = now.plus_millis(lease_ms);
    let record = Record {
        id: req.id.clone(),
        fingerprint: req.fingerprint,
        state: State::InProgress,
        token,
        owner: req.owner.clone(),
        region: req.region.clone(),
        lease_until,
        created_at: now,
        completed_at: None,
        expires_at: None,
        tombstone_until: None,
        retention_s: req.policy.retention_s(),
        tombstone_s: req.policy.tombstone_s(),
        result: None,
        resolution: None,
        ambiguity: None,
    };
    let claim = Claim::Acquired {
        token,
        lease_until,
        lease_ms,
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
    let record = owned_in_progress(existing, id, token, now)?;
    let mut done = record.clone();
    mark_completed(&mut done, result, now);
    Ok(done)
}

/// Releasing an attempt (the request was not processed): only the current
/// token of an `in_progress` record may remove it. The write is a delete.
pub fn release(
    existing: Option<&Record>,
    id: &RecordId,
    token: Token,
    now: Timestamp,
) -> Result<(), StoreError> {
    owned_in_progress(existing, id, token, now).map(|_| ())
}

/// The attempt learned that its outcome is unknown (e.g. an upstream 502):
/// only the current token of an `in_progress` record may mark it.
pub fn mark_ambiguous(
    existing: Option<&Record>,
    id: &RecordId,
    token: Token,
    now: Timestamp,
) -> Result<Record, StoreError> {
    let record = owned_in_progress(existing, id, token, now)?;
    let mut marked = record.clone();
    marked.state = State::Ambiguous;
    Ok(marked)
}

/// The attempt holding `token` says why its record is ambiguous: only
/// while the record is still its own and ambiguous (a note about an
/// attempt that moved on is refused, `Fenced` or `WrongState`, and
/// dropped). A later note replaces an earlier one.
pub fn note_ambiguity(
    existing: Option<&Record>,
    id: &RecordId,
    token: Token,
    note: AmbiguityNote,
    now: Timestamp,
) -> Result<Record, StoreError> {
    let record = ambiguous_attempt(existing, id, token, now, "note_ambiguity")?;
    let mut noted = record.clone();
    noted.ambiguity = Some(note);
    Ok(noted)
}

/// Resolving an `ambiguous` record: completed (store the result) or not
/// executed (remove it so a retry may run). Returns the write to apply and
/// the journal entry to append with it, in the same atomic step.
///
/// A verdict is about one attempt, named by its `token`: a verdict reached
/// about an earlier attempt (the key was released and claimed again while
/// the provider was being asked, or another resolver got there first) is
/// [`StoreError::Fenced`] and changes nothing. "Not executed" is accepted
/// only once that attempt can no longer commit, that is after its lease
/// (routes keep the lease longer than the upstream may take); before, it is
/// [`StoreError::MayStillCommit`].
pub fn resolve(
    existing: Option<&Record>,
    id: &RecordId,
    token: Token,
    mut resolution: Resolution,
    now: Timestamp,
) -> Result<(Write, JournalEntry), StoreError> {
    resolution.check_limits()?;
    let record = ambiguous_attempt(existing, id, token, now, "resolve")?;
    if resolution.outcome == Outcome::NotExecuted && record.may_still_commit(now) {
        return Err(StoreError::MayStillCommit {
            id: id.clone(),
            token,
            until: record.lease_until,
        });
    }
    let (outcome, status) = match &resolution.outcome {
        Outcome::NotExecuted => (Resolved::NotExecuted, None),
        Outcome::Completed { result } => (Resolved::Completed, Some(result.status())),
    };
    let entry = JournalEntry {
        id: id.clone(),
        token: record.token,
        outcome,
        status,
        by: resolution.by.clone(),
        reason: resolution.reason.clone(),
        at: now,
        verb: None,
    };
    resolution.at = Some(now);
    let write = match &resolution.outcome {
        Outcome::NotExecuted => Write::Delete,
        Outcome::Completed { result } => {
            let mut done = record.clone();
            mark_completed(&mut done, result.clone(), now);
            done.resolution = Some(resolution);
            Write::Put(done)
        }
    };
    Ok((write, entry))
}

/// An operator's verb on the record of the attempt holding `token`: the
/// write to apply and the journal entry to append with it, in the same
/// atomic step, or why it is refused (nothing written).
///
/// Both verbs are fenced like a verdict: the record must exist
/// ([`StoreError::NotFound`]) and hold `token` ([`StoreError::Fenced`]).
/// - [`Verb::Expire`]: only a record completed at `now`
///   ([`StoreError::WrongState`] otherwise, a tombstone included). It
///   becomes a tombstone now, its result dropped, its tombstone horizon
///   kept, so a late retry is a late replay. The entry's outcome is
///   `completed`, with the dropped result's status.
/// - [`Verb::Evict`]: any record, except one whose attempt may still
///   commit: `in_progress` or `ambiguous` before its lease ends is
///   [`StoreError::MayStillCommit`], the rule of a "not executed" verdict.
///   The record is deleted, so the next claim acquires. The entry's
///   outcome says what the key was: `completed` (with the status, when
///   the result was still kept) for a completed record or a tombstone,
///   `not_executed` for an attempt evicted without an outcome, which is
///   what evicting it asserts.
pub fn apply_verb(
    existing: Option<&Record>,
    id: &RecordId,
    token: Token,
    request: &VerbRequest,
    now: Timestamp,
) -> Result<(Write, JournalEntry), StoreError> {
    request.check_limits()?;
    let Some(record) = existing else {
        return Err(StoreError::NotFound { id: id.clone() });
    };
    let state = record.state_at(now);
    if record.token != token {
        return Err(StoreError::Fenced {
            id: id.clone(),
            presented: token,
            current: Some((record.token, state)),
        });
    }
    let status = record.result.as_ref().map(StoredResult::status);
    let (write, outcome) = match (request.verb, state) {
        (Verb::Expire, State::Completed) => {
            let mut tombstone = record.clone();
            tombstone.state = State::Tombstone;
            tombstone.result = None;
            tombstone.expires_at = Some(now);
            (Write::Put(tombstone), Resolved::Completed)
        }
        (Verb::Expire, state) => {
            return Err(StoreError::WrongState {
                id: id.clone(),
                state,
                operation: "expire",
            });
        }
        (Verb::Evict, _) if record.may_still_commit(now) => {
            return Err(StoreError::MayStillCommit {
                id: id.clone(),
                token,
                until: record.lease_until,
            });
        }
        (Verb::Evict, State::InProgress | State::Ambiguous) => {
            (Write::Delete, Resolved::NotExecuted)
        }
        (Verb::Evict, State::Completed | State::Tombstone) => (Write::Delete, Resolved::Completed),
    };
    let entry = JournalEntry {
        id: id.clone(),
        token: record.token,
        outcome,
        status: if outcome == Resolved::Completed {
            status
        } else {
            None
        },
        by: request.by.clone(),
        reason: request.reason.clone(),
        at: now,
        verb: Some(request.verb),
    };
    Ok((write, entry))
}

/// A failed provider lookup of the ambiguous attempt holding `token`: the
/// tries the store keeps afterwards, `next_at` being when the next lookup
/// may start. The count goes up by one from the tries kept about this same
/// attempt (saturating), and starts at 1 when none are kept or they are
/// about another attempt of the key.
///
/// Like a verdict, a failure is about one attempt: refused, nothing
/// written, when the record is gone ([`StoreError::NotFound`]), belongs to
/// another attempt ([`StoreError::Fenced`]) or is not ambiguous
/// ([`StoreError::WrongState`]): it was resolved meanwhile, and its count
/// must not outlive the ambiguity.
pub fn note_failed_lookup(
    existing: Option<&Record>,
    tries: Option<&LookupTries>,
    id: &RecordId,
    token: Token,
    next_at: Timestamp,
    now: Timestamp,
) -> Result<LookupTries, StoreError> {
    ambiguous_attempt(existing, id, token, now, "count a failed lookup of")?;
    let before = tries_of_attempt(tries, token).map_or(0, |t| t.failures);
    Ok(LookupTries {
        token,
        failures: before.saturating_add(1),
        next_at,
    })
}

/// The tries that count for the attempt holding `token`, given the tries a
/// store keeps for its record: none when they are about another attempt.
/// Every store reads tries through this, so a count never carries over
/// from one attempt of a key to the next.
pub fn tries_of_attempt(tries: Option<&LookupTries>, token: Token) -> Option<LookupTries> {
    tries.filter(|t| t.token == token).copied()
}

/// Since when `record` has been due for the purge, by its stored state: a
/// completed record from the end of its retention, a tombstone from the
/// end of its horizon (`None`: never). The purge takes the records it would
/// change in this order, ties in (scope, key) order.
pub fn purge_due(record: &Record) -> Option<Timestamp> {
    match record.state {
        State::Completed => record.expires_at,
        State::Tombstone => record.tombstone_until,
        State::InProgress | State::Ambiguous => None,
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
    record.ambiguity = None;
}

/// The check of every statement about an ambiguous attempt (a verdict, a
/// failed lookup): the record exists (`NotFound`), holds `token`
/// (`Fenced`) and is ambiguous (`WrongState`, naming `operation`).
fn ambiguous_attempt<'r>(
    existing: Option<&'r Record>,
    id: &RecordId,
    token: Token,
    now: Timestamp,
    operation: &'static str,
) -> Result<&'r Record, StoreError> {
    let Some(record) = existing else {
        return Err(StoreError::NotFound { id: id.clone() });
    };
    if record.token != token {
        return Err(StoreError::Fenced {
            id: id.clone(),
            presented: token,
            current: Some((record.token, record.state_at(now))),
        });
    }
    if record.state != State::Ambiguous {
        return Err(StoreError::WrongState {
            id: id.clone(),
            state: record.state_at(now),
            operation,
        });
    }
    Ok(record)
}

/// The fencing check. The state reported is the state at `now`, so the
/// answer does not depend on whether the purge has run.
fn owned_in_progress<'r>(
    existing: Option<&'r Record>,
    id: &RecordId,
    token: Token,
    now: Timestamp,
) -> Result<&'r Record, StoreError> {
    match existing {
        Some(r) if r.state == State::InProgress && r.token == token => Ok(r),
        other => Err(StoreError::Fenced {
            id: id.clone(),
            presented: token,
            current: other.map(|r| (r.token, r.state_at(now))),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IdempotencyKey, Scope};

    const NOW: Timestamp = Timestamp::from_millis(1_000_000);

    fn fp(b: u8) -> Fingerprint {
        Fingerprint::from_bytes([b; 32])
    }

    fn record(state: State) -> Record {
        Record {
            id: RecordId {
                scope: Scope::new("POST /payouts|t1").unwrap(),
                key: IdempotencyKey::parse("k1").unwrap(),
            },
            fingerprint: fp(1),
            state,
            token: Token(7),
            owner: "node-a".into(),
            region: Some("eu-west".into()),
            lease_until: NOW.plus_millis(10),
            created_at: Timestamp::from_millis(0),
            completed_at: Some(Timestamp::from_millis(500)),
            expires_at: Some(NOW.plus_millis(100)),
            tombstone_until: Some(NOW.plus_millis(1_000)),
            retention_s: 1,
            tombstone_s: 2,
            result: None,
            resolution: None,
            ambiguity: None,
        }
    }

    fn with(state: State, edit: impl FnOnce(&mut Record)) -> Option<Record> {
        let mut r = record(state);
        edit(&mut r);
        Some(r)
    }

    type TableRow = (&'static str, Option<Record>, u8, Policy, Decision);

    /// Every row of the claim table (docs/contract.md): (name, existing record, the
    /// claim's fingerprint byte, policy, decision).
    fn claim_table() -> Vec<TableRow> {
        use Decision::*;
        use State::*;
        let reconcile = Policy::DEFAULT;
        let takeover = Policy::new(30_000, 86_400, 86_400, LeaseExpiry::Takeover).unwrap();
        vec![
            ("no record", None, 1, reconcile, Acquire),
            (
                "tombstone past horizon",
                with(Tombstone, |r| r.tombstone_until = Some(NOW)),
                1,
                reconcile,
                Acquire,
            ),
            (
                "completed past tombstone horizon",
                with(Completed, |r| {
                    r.expires_at = Some(NOW);
                    r.tombstone_until = Some(NOW);
                }),
                2,
                reconcile,
                Acquire,
            ),
            (
                "in progress, other fingerprint",
                with(InProgress, |_| {}),
                2,
                reconcile,
                Mismatch,
            ),
            (
                "completed, other fingerprint",
                with(Completed, |_| {}),
                2,
                reconcile,
                Mismatch,
            ),
            (
                "ambiguous, other fingerprint",
                with(Ambiguous, |_| {}),
                2,
                reconcile,
                Mismatch,
            ),
            ("completed", with(Completed, |_| {}), 1, reconcile, Replay),
            (
                "in progress, lease valid",
                with(InProgress, |_| {}),
                1,
                reconcile,
                InFlight,
            ),
            (
                "in progress, lease ends now",
                with(InProgress, |r| r.lease_until = NOW),
                1,
                reconcile,
                MarkAmbiguous,
            ),
            (
                "in progress, lease expired, takeover",
                with(InProgress, |r| r.lease_until = NOW),
                1,
                takeover,
                TakeOver,
            ),
            (
                "ambiguous",
                with(Ambiguous, |_| {}),
                1,
                reconcile,
                OutcomeUnknown,
            ),
            (
                "ambiguous never expires",
                with(Ambiguous, |r| r.expires_at = Some(NOW)),
                1,
                reconcile,
                OutcomeUnknown,
            ),
            (
                "completed at expiry",
                with(Completed, |r| r.expires_at = Some(NOW)),
                1,
                reconcile,
                LateReplay,
            ),
            (
                "expired, other fingerprint",
                with(Completed, |r| r.expires_at = Some(NOW)),
                2,
                reconcile,
                LateReplay,
            ),
            (
                "purged tombstone",
                with(Tombstone, |_| {}),
                1,
                reconcile,
                LateReplay,
            ),
        ]
    }

    fn claimer(fingerprint: u8, policy: Policy) -> ClaimRequest {
        ClaimRequest {
            id: record(State::InProgress).id,
            fingerprint: fp(fingerprint),
            legacy_fingerprint: None,
            owner: "node-b".into(),
            region: Some("us-east".into()),
            policy,
        }
    }

    #[test]
    fn every_row_of_the_claim_table() {
        for (name, existing, fingerprint, policy, expect) in claim_table() {
            let req = claimer(fingerprint, policy);
            let got = decide(existing.as_ref(), &req, NOW);
            assert_eq!(got, expect, "{name}");
        }
    }

    /// The split a store with an asynchronous token source relies on: the
    /// plan asks for a token exactly on the rows that acquire, names the
    /// attempt a takeover replaces, and finished with [`acquire`] gives what
    /// [`claim`] gives in one step.
    #[test]
    fn plan_asks_for_a_token_only_to_acquire() {
        for (name, existing, fingerprint, policy, decision) in claim_table() {
            let req = claimer(fingerprint, policy);
            let planned = plan(existing.as_ref(), &req, NOW);
            let one_step = claim(existing.as_ref(), &req, NOW, || Token(99));
            match (decision, planned) {
                (Decision::Acquire, Plan::Acquire { took_over: None }) => {}
                (Decision::TakeOver, Plan::Acquire { took_over }) => {
                    assert_eq!(took_over, existing.as_ref().map(|r| r.token), "{name}");
                }
                (Decision::Acquire | Decision::TakeOver, other) => {
                    panic!("{name}: {decision:?} planned as {other:?}")
                }
                (_, Plan::Acquire { .. }) => panic!("{name}: {decision:?} asked for a token"),
                (_, Plan::Answer(answer, write)) => {
                    assert_eq!((answer, write), one_step, "{name}");
                    continue;
                }
            }
            let took_over = match decision {
                Decision::TakeOver => existing.as_ref().map(|r| r.token),
                _ => None,
            };
            assert_eq!(acquire(&req, NOW, Token(99), took_over), one_step, "{name}");
        }
    }

    #[test]
    fn claim_builds_the_write_for_each_decision() {
        let req = ClaimRequest {
            id: record(State::InProgress).id,
            fingerprint: fp(1),
            legacy_fingerprint: None,
            owner: "node-b".into(),
            region: Some("us-east".into()),
            policy: Policy::DEFAULT,
        };
        let (claim_new, write) = claim(None, &req, NOW, || Token(42));
        assert_eq!(
            claim_new,
            Claim::Acquired {
                token: Token(42),
                lease_until: NOW.plus_millis(30_000),
                lease_ms: 30_000,
                took_over: None
            }
        );
        let Write::Put(acquired) = write else {
            panic!("acquire must write, got {write:?}")
        };
        assert_eq!(
            (acquired.state, acquired.token, acquired.owner.as_str()),
            (State::InProgress, Token(42), "node-b")
        );
        assert_eq!(acquired.region.as_deref(), Some("us-east"));
        assert_eq!(
            (acquired.retention_s, acquired.tombstone_s),
            (86_400, 30 * 86_400)
        );

        let in_flight = record(State::InProgress);
        let got = claim(Some(&in_flight), &req, NOW, || {
            panic!("no token for in-flight")
        });
        assert_eq!(
            got,
            (
                Claim::InFlight {
                    lease_until: NOW.plus_millis(10),
                    retry_after_ms: 10
                },
                Write::None
            )
        );

        let expired = with(State::InProgress, |r| r.lease_until = NOW).unwrap();
        let (got, write) = claim(Some(&expired), &req, NOW, || {
            panic!("reconcile takes no token")
        });
        assert_eq!(got, Claim::OutcomeUnknown { newly_marked: true });
        assert!(
            matches!(write, Write::Put(ref r) if r.state == State::Ambiguous && r.token == Token(7))
        );

        let takeover = ClaimRequest {
            policy: Policy::new(100, 1, 1, LeaseExpiry::Takeover).unwrap(),
            ..req.clone()
        };
        let (got, _) = claim(Some(&expired), &takeover, NOW, || Token(8));
        assert_eq!(
            got,
            Claim::Acquired {
                token: Token(8),
                lease_until: NOW.plus_millis(100),
                lease_ms: 100,
                took_over: Some(Token(7))
            }
        );

        let expired_done = with(State::Completed, |r| r.expires_at = Some(NOW)).unwrap();
        let got = claim(Some(&expired_done), &req, NOW, || {
            panic!("late replay takes no token")
        });
        assert_eq!(
            got,
            (
                Claim::Expired {
                    completed_at: Some(Timestamp::from_millis(500)),
                    tombstone_until: Some(NOW.plus_millis(1_000))
                },
                Write::None
            )
        );
    }

    #[test]
    fn only_the_current_token_of_an_in_progress_record_may_write() {
        let live = record(State::InProgress);
        let id = live.id.clone();
        let result = StoredResult::new(201, vec![], b"ok".to_vec()).unwrap();
        let done = complete(Some(&live), &id, Token(7), result.clone(), NOW).unwrap();
        assert_eq!(done.state, State::Completed);
        assert_eq!(done.completed_at, Some(NOW));
        assert_eq!(done.expires_at, Some(NOW.plus_millis(1_000)));
        assert_eq!(done.tombstone_until, Some(NOW.plus_millis(2_000)));
        assert_eq!(done.result, Some(result.clone()));

        let stale = complete(Some(&live), &id, Token(6), result.clone(), NOW);
        assert_eq!(
            stale,
            Err(StoreError::Fenced {
                id: id.clone(),
                presented: Token(6),
                current: Some((Token(7), State::InProgress))
            })
        );
        let ambiguous = record(State::Ambiguous);
        assert!(matches!(
            complete(Some(&ambiguous), &id, Token(7), result.clone(), NOW),
            Err(StoreError::Fenced { .. })
        ));
        assert_eq!(
            release(None, &id, Token(7), NOW),
            Err(StoreError::Fenced {
                id: id.clone(),
                presented: Token(7),
                current: None
            })
        );
        assert_eq!(release(Some(&live), &id, Token(7), NOW), Ok(()));
        assert_eq!(
            mark_ambiguous(Some(&live), &id, Token(7), NOW).map(|r| r.state),
            Ok(State::Ambiguous)
        );
        assert!(mark_ambiguous(Some(&done), &id, Token(7), NOW).is_err());
    }

    #[test]
    fn only_the_marking_attempt_notes_why_and_completion_drops_the_note() {
        let note = AmbiguityNote::new(Some(503), "upstream answered 503", None, "n", NOW, vec![]);
        let marked = record(State::Ambiguous);
        let id = marked.id.clone();
        let noted = note_ambiguity(Some(&marked), &id, Token(7), note.clone(), NOW).unwrap();
        assert_eq!(noted.ambiguity, Some(note.clone()));
        assert!(matches!(
            note_ambiguity(Some(&marked), &id, Token(8), note.clone(), NOW),
            Err(StoreError::Fenced { .. })
        ));
        // In progress past its lease is ambiguous, but not marked by its attempt.
        let lapsed = record(State::InProgress);
        assert!(matches!(
            note_ambiguity(Some(&lapsed), &id, Token(7), note.clone(), NOW),
            Err(StoreError::WrongState { .. })
        ));
        assert!(matches!(
            note_ambiguity(None, &id, Token(7), note, NOW),
            Err(StoreError::NotFound { .. })
        ));
        let result = StoredResult::new(200, vec![], vec![]).unwrap();
        let resolution = Resolution {
            outcome: Outcome::Completed { result },
            by: "op".into(),
            reason: "seen".into(),
            at: None,
        };
        let (write, _) = resolve(Some(&noted), &id, Token(7), resolution, NOW).unwrap();
        let Write::Put(done) = write else {
            panic!("a completed verdict writes the record")
        };
        assert_eq!(done.ambiguity, None);
    }

    #[test]
    fn fencing_reports_the_state_at_now_not_the_stored_state() {
        let done = with(State::Completed, |r| r.expires_at = Some(NOW)).unwrap();
        let id = done.id.clone();
        let result = StoredResult::new(200, vec![], vec![]).unwrap();
        let expect = Err(StoreError::Fenced {
            id: id.clone(),
            presented: Token(7),
            current: Some((Token(7), State::Tombstone)),
        });
        assert_eq!(complete(Some(&done), &id, Token(7), result, NOW), expect);
        assert_eq!(
            release(Some(&done), &id, Token(7), NOW),
            expect.map(|_: Record| ())
        );
    }

    #[test]
    fn resolve_checks_text_limits_and_results_deserialize_checked() {
        let ambiguous = record(State::Ambiguous);
        let mut long = Resolution::new(Outcome::NotExecuted, "op", "why").unwrap();
        long.reason = "x".repeat(crate::record::RESOLUTION_TEXT_BYTES_MAX + 1);
        assert!(matches!(
            resolve(Some(&ambiguous), &ambiguous.id, Token(7), long, NOW),
            Err(StoreError::Limit(_))
        ));
        let read = |status: u16| {
            let doc = format!(r#"{{"status":{status},"headers":[],"body":[]}}"#);
            serde_json::from_str::<StoredResult>(&doc).map(|r| r.status())
        };
        assert_eq!(read(200).ok(), Some(200));
        let bad = read(42);
        assert!(bad.is_err(), "a result read from outside is validated");
    }

    #[test]
    fn resolve_and_purge() {
        let ambiguous = record(State::Ambiguous);
        let id = ambiguous.id.clone();
        let result = StoredResult::new(200, vec![], vec![]).unwrap();
        let found = Resolution::new(
            Outcome::Completed {
                result: result.clone(),
            },
            "operator",
            "bank says paid",
        )
        .unwrap();
        let other_attempt = resolve(Some(&ambiguous), &id, Token(6), found.clone(), NOW);
        assert_eq!(
            other_attempt,
            Err(StoreError::Fenced {
                id: id.clone(),
                presented: Token(6),
                current: Some((Token(7), State::Ambiguous)),
            }),
            "a verdict about another attempt"
        );
        let Ok((Write::Put(resolved), entry)) =
            resolve(Some(&ambiguous), &id, Token(7), found, NOW)
        else {
            panic!("resolve must put")
        };
        assert_eq!(resolved.state, State::Completed);
        assert_eq!(
            entry,
            JournalEntry {
                id: id.clone(),
                token: ambiguous.token,
                outcome: Resolved::Completed,
                status: Some(200),
                by: "operator".into(),
                reason: "bank says paid".into(),
                at: NOW,
                verb: None,
            }
        );
        assert_eq!(resolved.resolution.as_ref().and_then(|r| r.at), Some(NOW));
        let not_executed =
            Resolution::new(Outcome::NotExecuted, "reconciler", "lookup: 404").unwrap();
        let lease_end = ambiguous.lease_until;
        let before_lease = Timestamp::from_millis(lease_end.as_millis() - 1);
        assert_eq!(
            resolve(
                Some(&ambiguous),
                &id,
                Token(7),
                not_executed.clone(),
                before_lease
            ),
            Err(StoreError::MayStillCommit {
                id: id.clone(),
                token: Token(7),
                until: lease_end,
            }),
            "not executed while the attempt may still commit"
        );
        assert_eq!(
            resolve(
                Some(&ambiguous),
                &id,
                Token(7),
                not_executed.clone(),
                lease_end
            ),
            Ok((
                Write::Delete,
                JournalEntry {
                    id: id.clone(),
                    token: ambiguous.token,
                    outcome: Resolved::NotExecuted,
                    status: None,
                    by: "reconciler".into(),
                    reason: "lookup: 404".into(),
                    at: lease_end,
                    verb: None,
                }
            ))
        );
        assert_eq!(
            resolve(Some(&resolved), &id, Token(7), not_executed.clone(), NOW),
            Err(StoreError::WrongState {
                id: id.clone(),
                state: State::Completed,
                operation: "resolve"
            })
        );
        assert_eq!(
            resolve(None, &id, Token(7), not_executed, NOW),
            Err(StoreError::NotFound { id: id.clone() })
        );

        let mut done = record(State::Completed);
        done.result = Some(result);
        assert_eq!(purge(&done, Timestamp::from_millis(0)), Write::None);
        let Write::Put(tomb) = purge(&done, NOW.plus_millis(100)) else {
            panic!("past retention must tombstone")
        };
        assert_eq!(
            (tomb.state, tomb.result.is_none(), tomb.completed_at),
            (State::Tombstone, true, done.completed_at)
        );
        assert_eq!(purge(&tomb, NOW.plus_millis(100)), Write::None);
        assert_eq!(purge(&tomb, NOW.plus_millis(1_000)), Write::Delete);
        assert_eq!(
            purge(&record(State::Ambiguous), NOW.plus_millis(1_000_000)),
            Write::None
        );
        assert_eq!(
            purge(&record(State::InProgress), NOW.plus_millis(1_000_000)),
            Write::None
        );
    }

    /// Every row of the failed-lookup rule: what the count becomes, and when
    /// it is refused.
    #[test]
    fn failed_lookups_count_per_attempt() {
        /// (name, record, kept tries, token presented, expected answer)
        type Row<'r> = (
            &'static str,
            Option<&'r Record>,
            Option<LookupTries>,
            u64,
            Result<LookupTries, StoreError>,
        );
        let ambiguous = record(State::Ambiguous);
        let id = ambiguous.id.clone();
        let next_at = NOW.plus_millis(500);
        let kept = |token: u64, failures: u32| LookupTries {
            token: Token(token),
            failures,
            next_at: NOW,
        };
        let counted = |failures: u32| {
            Ok(LookupTries {
                token: Token(7),
                failures,
                next_at,
            })
        };
        let fenced = |presented: u64, state: State| {
            Err(StoreError::Fenced {
                id: id.clone(),
                presented: Token(presented),
                current: Some((Token(7), state)),
            })
        };
        let wrong = |state: State| {
            Err(StoreError::WrongState {
                id: id.clone(),
                state,
                operation: "count a failed lookup of",
            })
        };
        let in_progress = record(State::InProgress);
        let completed = with(State::Completed, |r| r.expires_at = Some(NOW)).unwrap();
        let cases: Vec<Row<'_>> = vec![
            ("first failure", Some(&ambiguous), None, 7, counted(1)),
            (
                "third failure",
                Some(&ambiguous),
                Some(kept(7, 2)),
                7,
                counted(3),
            ),
            (
                "saturates",
                Some(&ambiguous),
                Some(kept(7, u32::MAX)),
                7,
                counted(u32::MAX),
            ),
            (
                "kept about an earlier attempt",
                Some(&ambiguous),
                Some(kept(6, 9)),
                7,
                counted(1),
            ),
            (
                "kept about a later attempt",
                Some(&ambiguous),
                Some(kept(8, 9)),
                7,
                counted(1),
            ),
            (
                "about an earlier attempt",
                Some(&ambiguous),
                Some(kept(6, 2)),
                6,
                fenced(6, State::Ambiguous),
            ),
            (
                "about a later attempt",
                Some(&ambiguous),
                None,
                8,
                fenced(8, State::Ambiguous),
            ),
            (
                "in progress",
                Some(&in_progress),
                None,
                7,
                wrong(State::InProgress),
            ),
            (
                "resolved, past retention",
                Some(&completed),
                Some(kept(7, 1)),
                7,
                wrong(State::Tombstone),
            ),
            (
                "no record",
                None,
                Some(kept(7, 1)),
                7,
                Err(StoreError::NotFound { id: id.clone() }),
            ),
        ];
        for (name, existing, tries, token, expect) in cases {
            let got = note_failed_lookup(existing, tries.as_ref(), &id, Token(token), next_at, NOW);
            assert_eq!(got, expect, "{name}");
        }
        assert_eq!(
            tries_of_attempt(Some(&kept(7, 2)), Token(7)),
            Some(kept(7, 2))
        );
        assert_eq!(tries_of_attempt(Some(&kept(7, 2)), Token(8)), None);
        assert_eq!(tries_of_attempt(None, Token(7)), None);
    }

    /// A record written before the current fingerprint form holds the legacy
    /// fingerprint: the same request, which carries it, matches every row of
    /// the table as if its fingerprint were the stored one; another request
    /// does not.
    #[test]
    fn a_legacy_fingerprint_matches_like_the_stored_one() {
        use Decision::*;
        use State::*;
        let (legacy, current) = (fp(1), fp(2));
        let reconcile = Policy::DEFAULT;
        for (state, same) in [
            (Completed, Replay),
            (InProgress, InFlight),
            (Ambiguous, OutcomeUnknown),
        ] {
            let stored = record(state);
            assert_eq!(stored.fingerprint, legacy);
            for (legacy_fingerprint, expect) in [
                (Some(legacy), same),
                (None, Mismatch),
                (Some(fp(3)), Mismatch),
                (Some(current), Mismatch),
            ] {
                let req = ClaimRequest {
                    id: stored.id.clone(),
                    fingerprint: current,
                    legacy_fingerprint,
                    owner: "node-b".into(),
                    region: Some("us-east".into()),
                    policy: reconcile,
                };
                let got = decide(Some(&stored), &req, NOW);
                assert_eq!(got, expect, "{state:?} with {legacy_fingerprint:?}");
            }
        }
        // Taking over a legacy record moves it to the current fingerprint.
        let mut expired = record(InProgress);
        expired.lease_until = NOW;
        let req = ClaimRequest {
            id: expired.id.clone(),
            fingerprint: current,
            legacy_fingerprint: Some(legacy),
            owner: "node-b".into(),
            region: Some("us-east".into()),
            policy: Policy::new(1_000, 60, 60, LeaseExpiry::Takeover).unwrap(),
        };
        let (answer, write) = claim(Some(&expired), &req, NOW, || Token(8));
        assert!(
            matches!(
                answer,
                Claim::Acquired {
                    took_over: Some(Token(7)),
                    ..
                }
            ),
            "{answer:?}"
        );
        let Write::Put(taken) = write else {
            panic!("a takeover writes, got {write:?}")
        };
        assert_eq!(taken.fingerprint, current);
        assert_eq!(
            (taken.owner.as_str(), taken.region.as_deref()),
            ("node-b", Some("us-east")),
            "a takeover records the taker's owner and region, not the previous holder's"
        );
    }

    /// Every row of the verbs' rule: what each does to a record in each
    /// state, and when it is refused.
    #[test]
    fn verbs_are_fenced_and_evict_waits_for_the_lease() {
        let result = StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
        let done = with(State::Completed, |r| {
            r.result = Some(result.clone());
            r.expires_at = Some(NOW.plus_millis(100));
        })
        .unwrap();
        let id = done.id.clone();
        let expire = VerbRequest::new(Verb::Expire, "alice", "customer asked").unwrap();
        let evict = VerbRequest::new(Verb::Evict, "bob", "rerun settlement").unwrap();
        let past = with(State::Completed, |r| r.expires_at = Some(NOW)).unwrap();
        let running = record(State::InProgress);
        let unsure = record(State::Ambiguous);
        let after_lease = running.lease_until;
        let entry = |verb: &VerbRequest, outcome, status, at| JournalEntry {
            id: id.clone(),
            token: Token(7),
            outcome,
            status,
            by: verb.by.clone(),
            reason: verb.reason.clone(),
            at,
            verb: Some(verb.verb),
        };
        let Ok((Write::Put(tomb), got)) = apply_verb(Some(&done), &id, Token(7), &expire, NOW)
        else {
            panic!("expire of a completed record must put a tombstone")
        };
        assert_eq!(
            (tomb.state, tomb.result.as_ref(), tomb.expires_at),
            (State::Tombstone, None, Some(NOW))
        );
        assert_eq!(tomb.tombstone_until, done.tombstone_until);
        assert_eq!(got, entry(&expire, Resolved::Completed, Some(201), NOW));
        assert_eq!(
            decide(Some(&tomb), &request_for(&tomb), NOW),
            Decision::LateReplay
        );

        type Row<'r> = (
            &'static str,
            &'r Record,
            &'r VerbRequest,
            u64,
            Timestamp,
            Result<(Write, JournalEntry), StoreError>,
        );
        let wrong = |state| {
            Err(StoreError::WrongState {
                id: id.clone(),
                state,
                operation: "expire",
            })
        };
        let rows: Vec<Row<'_>> = vec![
            (
                "expire in progress",
                &running,
                &expire,
                7,
                NOW,
                wrong(State::InProgress),
            ),
            (
                "expire ambiguous",
                &unsure,
                &expire,
                7,
                NOW,
                wrong(State::Ambiguous),
            ),
            (
                "expire a tombstone",
                &past,
                &expire,
                7,
                NOW,
                wrong(State::Tombstone),
            ),
            (
                "expire with another token",
                &done,
                &expire,
                6,
                NOW,
                Err(StoreError::Fenced {
                    id: id.clone(),
                    presented: Token(6),
                    current: Some((Token(7), State::Completed)),
                }),
            ),
            (
                "evict while the lease runs",
                &running,
                &evict,
                7,
                NOW,
                Err(StoreError::MayStillCommit {
                    id: id.clone(),
                    token: Token(7),
                    until: after_lease,
                }),
            ),
            (
                "evict ambiguous while the lease runs",
                &unsure,
                &evict,
                7,
                NOW,
                Err(StoreError::MayStillCommit {
                    id: id.clone(),
                    token: Token(7),
                    until: after_lease,
                }),
            ),
            (
                "evict in progress after the lease",
                &running,
                &evict,
                7,
                after_lease,
                Ok((
                    Write::Delete,
                    entry(&evict, Resolved::NotExecuted, None, after_lease),
                )),
            ),
            (
                "evict ambiguous after the lease",
                &unsure,
                &evict,
                7,
                after_lease,
                Ok((
                    Write::Delete,
                    entry(&evict, Resolved::NotExecuted, None, after_lease),
                )),
            ),
            (
                "evict completed",
                &done,
                &evict,
                7,
                NOW,
                Ok((
                    Write::Delete,
                    entry(&evict, Resolved::Completed, Some(201), NOW),
                )),
            ),
            (
                "evict a tombstone",
                &tomb,
                &evict,
                7,
                NOW,
                Ok((Write::Delete, entry(&evict, Resolved::Completed, None, NOW))),
            ),
            (
                "evict with another token",
                &tomb,
                &evict,
                8,
                NOW,
                Err(StoreError::Fenced {
                    id: id.clone(),
                    presented: Token(8),
                    current: Some((Token(7), State::Tombstone)),
                }),
            ),
        ];
        for (name, existing, verb, token, at, expect) in rows {
            assert_eq!(
                apply_verb(Some(existing), &id, Token(token), verb, at),
                expect,
                "{name}"
            );
        }
        assert_eq!(
            apply_verb(None, &id, Token(7), &evict, NOW),
            Err(StoreError::NotFound { id: id.clone() })
        );
        assert_eq!(
            VerbRequest::new(Verb::Evict, "bob", "  "),
            Err(LimitError::Empty { field: "reason" })
        );
        let mut blank = evict.clone();
        blank.reason.clear();
        assert_eq!(
            apply_verb(Some(&done), &id, Token(7), &blank, NOW),
            Err(StoreError::Limit(LimitError::Empty { field: "reason" }))
        );
    }

    fn request_for(record: &Record) -> ClaimRequest {
        ClaimRequest {
            id: record.id.clone(),
            fingerprint: record.fingerprint,
            legacy_fingerprint: None,
            owner: "node-b".into(),
            region: None,
            policy: Policy::DEFAULT,
        }
    }
}

//! The reconciler's verdict logic as pure functions: whether an ambiguous
//! attempt is due for a lookup, what the provider's answer asks for, and
//! what the store's reply to that means (done, someone else's, wait for the
//! lease, ask again, leave for an operator). The reconciler and the
//! simulator both call these; the store's `resolve` and
//! `note_failed_lookup` (in [`crate::decision`]) stay the judges of tokens
//! and leases.

use crate::record::{LookupTries, Outcome, StoredResult};
use crate::{StoreError, Timestamp};

/// What the provider said about one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LookupAnswer {
    /// The effect happened; this is what the provider answered.
    Found(StoredResult),
    /// The effect definitely did not happen.
    NotFound,
    /// No finding (another status, a connect error, a timeout).
    Failed,
}

/// What a lookup's answer asks the reconciler to do with the attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Resolve the attempt with this outcome (`decision::resolve` refuses
    /// "not executed" while the attempt may still commit).
    Resolve(Outcome),
    /// Count the failed lookup in the store and ask again after a backoff.
    CountFailure,
    /// "Not found", but asked while the attempt could still commit: ask
    /// again at `at` (the attempt's lease end); nothing is written.
    AskAgain {
        /// When the question may be asked again.
        at: Timestamp,
    },
}

/// What the answer asks for: a finding resolves, no finding is counted.
///
/// "Not found" proves the attempt did not execute only when the provider
/// was asked (`asked_at`) once the attempt could no longer commit, at or
/// after its `lease_until`. Asked earlier, the request may still have
/// reached the provider after the answer was given, so the verdict is to
/// ask again then. (The store's own check, that "not executed" arrives
/// after the lease, cannot see when the provider was asked: a slow lookup
/// sent during the lease and answered after it would pass it.)
pub fn verdict(answer: LookupAnswer, asked_at: Timestamp, lease_until: Timestamp) -> Verdict {
    match answer {
        LookupAnswer::Found(result) => Verdict::Resolve(Outcome::Completed { result }),
        LookupAnswer::NotFound if asked_at < lease_until => Verdict::AskAgain { at: lease_until },
        LookupAnswer::NotFound => Verdict::Resolve(Outcome::NotExecuted),
        LookupAnswer::Failed => Verdict::CountFailure,
    }
}

/// Whether an ambiguous attempt should be looked up now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Triage {
    /// Ask the provider; `failures` lookups of this attempt failed so far.
    Ask {
        /// Failed lookups so far, for the next backoff.
        failures: u32,
    },
    /// The backoff of the last failed lookup runs until then.
    Wait {
        /// When the next lookup may start.
        until: Timestamp,
    },
    /// `tries_max` lookups failed: the attempt is left for an operator.
    Operator {
        /// Failed lookups of the attempt.
        failures: u32,
    },
}

/// Triage of one ambiguous attempt at `now` from the tries the store keeps
/// about it (`Store::lookup_tries`, already of this attempt).
pub fn triage(tries: Option<&LookupTries>, tries_max: u32, now: Timestamp) -> Triage {
    let failures = tries.map_or(0, |t| t.failures);
    if failures >= tries_max {
        return Triage::Operator { failures };
    }
    match tries {
        Some(t) if t.next_at > now => Triage::Wait { until: t.next_at },
        _ => Triage::Ask { failures },
    }
}

/// Where an attempt stands once the store answered a resolution of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterResolve {
    /// The verdict landed.
    Resolved,
    /// Resolved, released or claimed again by someone else meanwhile:
    /// nothing left to do about this attempt.
    Elsewhere,
    /// "Not executed" while the attempt may still commit: look again once
    /// its lease is over, at `until`.
    NotYet {
        /// When the attempt's lease ends.
        until: Timestamp,
    },
    /// The store failed; nothing was recorded, look again later.
    StoreFailed(StoreError),
}

/// Where an attempt stands once the store answered the count of a failed
/// lookup of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Counted; ask again once `tries.next_at` has passed.
    Retry {
        /// The tries now kept.
        tries: LookupTries,
    },
    /// Counted, and it was the last allowed: the attempt is left for an
    /// operator.
    Operator {
        /// The tries now kept.
        tries: LookupTries,
    },
    /// Resolved, released or claimed again by someone else meanwhile.
    Elsewhere,
    /// The store failed; nothing was counted, look again later.
    StoreFailed(StoreError),
}

/// What the store's answer to `resolve` means for the attempt.
pub fn after_resolve<T>(answer: Result<T, StoreError>) -> AfterResolve {
    match answer {
        Ok(_) => AfterResolve::Resolved,
        Err(StoreError::MayStillCommit { until, .. }) => AfterResolve::NotYet { until },
        Err(e) if moved_on(&e) => AfterResolve::Elsewhere,
        Err(e) => AfterResolve::StoreFailed(e),
    }
}

/// What the store's answer to `note_failed_lookup` means for the attempt,
/// given the route's `tries_max`.
pub fn after_failed_lookup(
    answer: Result<LookupTries, StoreError>,
    tries_max: u32,
) -> AfterFailure {
    match answer {
        Ok(tries) if tries.failures >= tries_max => AfterFailure::Operator { tries },
        Ok(tries) => AfterFailure::Retry { tries },
        Err(e) if moved_on(&e) => AfterFailure::Elsewhere,
        Err(e) => AfterFailure::StoreFailed(e),
    }
}

/// A refusal because the attempt moved on (gone, another attempt's, no
/// longer ambiguous) is not an error: someone else settled it.
fn moved_on(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::WrongState { .. } | StoreError::NotFound { .. } | StoreError::Fenced { .. }
    )
}

/// Settles an ambiguous record now, when a retry meets it (docs/http.md,
/// "Settling an unknown outcome on the retry"): the reconciler with the
/// operation's provider, which the HTTP layer and any other adapter ask
/// before answering "outcome unknown". Beside [`crate::VerifyFresh`], its
/// twin for a fresh claim inside the suspect window.
pub trait SettleOnRetry: Send + Sync {
    /// Tries to settle `id` (asking the provider, deciding by the one
    /// verdict, counting a failed lookup as a scan would); resolves to true
    /// when the record was resolved or is no longer the ambiguous attempt
    /// it was (settled meanwhile by another retry, a scan or an operator),
    /// so that the claim is worth asking again. Bounded in time by the
    /// lookup's own timeout.
    fn settle<'a>(
        &'a self,
        id: &'a crate::RecordId,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IdempotencyKey, RecordId, Scope, State, Token};

    const NOW: Timestamp = Timestamp::from_millis(1_000_000);

    fn tries(failures: u32, next_at: Timestamp) -> LookupTries {
        LookupTries {
            token: Token(7),
            failures,
            next_at,
        }
    }

    fn id() -> RecordId {
        RecordId {
            scope: Scope::new("POST /payouts|t1").unwrap(),
            key: IdempotencyKey::parse("k1").unwrap(),
        }
    }

    #[test]
    fn answers_become_verdicts() {
        let result = StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
        let (lease_until, before) = (NOW, Timestamp::from_millis(NOW.as_millis() - 1));
        let cases = [
            (
                LookupAnswer::Found(result.clone()),
                before,
                Verdict::Resolve(Outcome::Completed {
                    result: result.clone(),
                }),
            ),
            (
                LookupAnswer::Found(result.clone()),
                NOW,
                Verdict::Resolve(Outcome::Completed { result }),
            ),
            // Asked a millisecond before the lease ended: proves nothing.
            (
                LookupAnswer::NotFound,
                before,
                Verdict::AskAgain { at: lease_until },
            ),
            (
                LookupAnswer::NotFound,
                NOW,
                Verdict::Resolve(Outcome::NotExecuted),
            ),
            (LookupAnswer::Failed, before, Verdict::CountFailure),
            (LookupAnswer::Failed, NOW, Verdict::CountFailure),
        ];
        for (answer, asked_at, expect) in cases {
            let got = verdict(answer.clone(), asked_at, lease_until);
            assert_eq!(got, expect, "{answer:?} asked at {asked_at:?}");
        }
    }

    #[test]
    fn triage_table() {
        let later = NOW.plus_millis(1);
        let cases = [
            ("never failed", None, 5, Triage::Ask { failures: 0 }),
            (
                "backoff over",
                Some(tries(2, NOW)),
                5,
                Triage::Ask { failures: 2 },
            ),
            (
                "backoff running",
                Some(tries(2, later)),
                5,
                Triage::Wait { until: later },
            ),
            (
                "max tries, backoff running",
                Some(tries(5, later)),
                5,
                Triage::Operator { failures: 5 },
            ),
            (
                "past max tries",
                Some(tries(u32::MAX, NOW)),
                5,
                Triage::Operator { failures: u32::MAX },
            ),
            (
                "max tries 0 never asks",
                None,
                0,
                Triage::Operator { failures: 0 },
            ),
        ];
        for (name, kept, tries_max, expect) in cases {
            assert_eq!(triage(kept.as_ref(), tries_max, NOW), expect, "{name}");
        }
    }

    #[test]
    fn store_answers_become_steps() {
        let until = NOW.plus_millis(30_000);
        let gone = [
            StoreError::NotFound { id: id() },
            StoreError::Fenced {
                id: id(),
                presented: Token(7),
                current: Some((Token(8), State::InProgress)),
            },
            StoreError::WrongState {
                id: id(),
                state: State::Completed,
                operation: "resolve",
            },
        ];
        let failed = StoreError::Unavailable {
            store: "test".into(),
            reason: "down".into(),
        };
        assert_eq!(after_resolve(Ok(())), AfterResolve::Resolved);
        assert_eq!(
            after_resolve::<()>(Err(StoreError::MayStillCommit {
                id: id(),
                token: Token(7),
                until
            })),
            AfterResolve::NotYet { until }
        );
        for e in &gone {
            assert_eq!(
                after_resolve::<()>(Err(e.clone())),
                AfterResolve::Elsewhere,
                "{e}"
            );
            assert_eq!(
                after_failed_lookup(Err(e.clone()), 5),
                AfterFailure::Elsewhere,
                "{e}"
            );
        }
        assert_eq!(
            after_resolve::<()>(Err(failed.clone())),
            AfterResolve::StoreFailed(failed.clone())
        );
        assert_eq!(
            after_failed_lookup(Err(failed.clone()), 5),
            AfterFailure::StoreFailed(failed)
        );
        let counted = [
            (1, 5, false),
            (4, 5, false),
            (5, 5, true),
            (u32::MAX, 5, true),
            (1, 1, true),
        ];
        for (failures, tries_max, operator) in counted {
            let kept = tries(failures, until);
            let expect = if operator {
                AfterFailure::Operator { tries: kept }
            } else {
                AfterFailure::Retry { tries: kept }
            };
            assert_eq!(
                after_failed_lookup(Ok(kept), tries_max),
                expect,
                "{failures}/{tries_max}"
            );
        }
    }
}

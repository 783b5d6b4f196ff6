//! One attempt's steps as plain data, decided once for every adapter: what
//! a claim's answer asks for, what a fresh claim's verification inside a
//! suspect window asks for, what an effect's end means for its record, and
//! what a write that failed leaves behind. The async driver (`idem-attempt`)
//! performs the steps against a [`crate::Store`]; the HTTP layer renders
//! their end as a response, the queue consumer as ack, retry or reject.
//!
//! Delays are [`Duration`]s, never rounded here: a renderer with a coarser
//! unit rounds up (HTTP's `Retry-After` has whole seconds), one that takes
//! milliseconds (a broker's redelivery delay) uses them as they are.

use std::time::Duration;

use crate::completion::{AttemptOutcome, Completion, CompletionTable};
use crate::decision::Claim;
use crate::policy::Policy;
use crate::record::{Record, StoredResult, Token};
use crate::store_error::StoreError;
use crate::time::Timestamp;
use crate::window::Verification;

/// How long a caller waits before trying again when the store did not
/// answer, or a provider's lookup gave no answer.
pub const STORE_RETRY: Duration = Duration::from_secs(1);

/// How long a caller waits before trying again when its attempt was
/// released unsent (too little of the lease left, no capacity after a
/// wait) or released as not processed.
pub const RELEASED_RETRY: Duration = Duration::from_secs(1);

/// What a claim's answer asks of the attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AfterClaim {
    /// This attempt holds the record: run the effect within the lease
    /// (after verifying a fresh claim inside a suspect window).
    Run {
        /// The fencing token every write of this attempt presents.
        token: Token,
        /// When the lease ends (store clock).
        lease_until: Timestamp,
        /// How long the store leased, in milliseconds.
        lease_ms: u64,
        /// Whether the store held no live record of the key before.
        fresh: Freshness,
    },
    /// The effect happened before: answer with this completed record.
    Replay {
        /// The completed record.
        record: Box<Record>,
    },
    /// Another attempt holds the record: try again after `retry_after`,
    /// when its lease ends.
    InFlight {
        /// Until the other attempt's lease ends.
        retry_after: Duration,
    },
    /// Not run now, nor by trying again at once.
    Refused(Refusal),
}

/// Whether an acquired claim found the key free or took over an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freshness {
    /// The store held no live record: inside a suspect window the key may
    /// still have executed before the store lost its record.
    Fresh,
    /// An expired attempt was taken over (policy `takeover`): the store
    /// knows the key, there is nothing to verify.
    TookOver,
}

/// Why a claim that did not acquire refuses the attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The key is bound to another request: never run.
    KeyReused,
    /// An earlier attempt's outcome is unknown: it awaits reconciliation
    /// (try again after [`outcome_unknown_retry`]).
    OutcomeUnknown,
    /// The key is past retention and its tombstone caught a late replay.
    Expired {
        /// When the effect completed.
        completed_at: Option<Timestamp>,
        /// Until when the tombstone is kept.
        tombstone_until: Option<Timestamp>,
    },
    /// The store answered with a claim this version does not know.
    UnknownClaim,
}

/// What the provider's answer to a fresh claim inside a suspect window
/// asks of the attempt ([`crate::VerifyFresh`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AfterVerification {
    /// The key did not execute: run the effect.
    Run,
    /// The key executed before the store lost its record: complete the
    /// record with the provider's answer; nothing runs.
    Complete(StoredResult),
    /// Not provable now: release the record unsent and try again after
    /// `retry_after`.
    Release {
        /// When to try again.
        retry_after: Duration,
        /// Why nothing ran.
        why: Unverified,
    },
}

/// Why a fresh claim inside a suspect window was not run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unverified {
    /// "Not found", but an attempt the store forgot may still be running
    /// at the provider for `running` more.
    NotYet {
        /// Until a "not found" proves the key did not execute.
        running: Duration,
    },
    /// The provider gave no answer.
    LookupFailed {
        /// What went wrong (the log's: it may name the lookup's URL).
        reason: String,
    },
}

/// How an effect ended, as the completion table judges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EffectEnd {
    /// It answered with this status (HTTP terms).
    Answered {
        /// The status.
        status: u16,
    },
    /// It failed before or after sending.
    Failed(AttemptOutcome),
    /// It panicked, perhaps after its side effect.
    Panicked,
    /// It was cut at its lease's deadline: sent, its answer unknown.
    LeaseEnded,
}

/// What a write of an attempt's end that failed leaves behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unwritten {
    /// A newer attempt owns the record (the write was fenced): its outcome
    /// decides, nothing of this attempt is kept.
    Fenced,
    /// The store failed: the record stays in progress until its lease
    /// ends, then becomes ambiguous and is reconciled, never run again
    /// blindly. Try again after [`outcome_unknown_retry`].
    InProgress,
}

/// What a claim's answer asks of the attempt.
pub fn after_claim(claim: Claim) -> AfterClaim {
    match claim {
        Claim::Acquired {
            token,
            lease_until,
            lease_ms,
            took_over,
        } => AfterClaim::Run {
            token,
            lease_until,
            lease_ms,
            fresh: match took_over {
                None => Freshness::Fresh,
                Some(_) => Freshness::TookOver,
            },
        },
        Claim::Replay { record } => AfterClaim::Replay { record },
        Claim::InFlight { retry_after_ms, .. } => AfterClaim::InFlight {
            retry_after: Duration::from_millis(retry_after_ms),
        },
        Claim::Mismatch { .. } => AfterClaim::Refused(Refusal::KeyReused),
        Claim::OutcomeUnknown { .. } => AfterClaim::Refused(Refusal::OutcomeUnknown),
        Claim::Expired {
            completed_at,
            tombstone_until,
        } => AfterClaim::Refused(Refusal::Expired {
            completed_at,
            tombstone_until,
        }),
    }
}

/// When to try again after an unknown outcome (met by the claim, left by
/// this attempt, or a write that failed): one lease, the time within which
/// the reconciler or a retry's settlement can have judged it.
pub fn outcome_unknown_retry(policy: &Policy) -> Duration {
    Duration::from_millis(policy.lease_ms())
}

/// What the provider's `verification`, read at `now` (store clock), asks
/// of a fresh claim inside a suspect window.
pub fn after_verification(verification: Verification, now: Timestamp) -> AfterVerification {
    match verification {
        Verification::NotExecuted => AfterVerification::Run,
        Verification::Executed(result) => AfterVerification::Complete(result),
        Verification::NotYet { at } => {
            let running = Duration::from_millis(now.millis_until(at));
            AfterVerification::Release {
                retry_after: running.max(Duration::from_millis(1)),
                why: Unverified::NotYet { running },
            }
        }
        Verification::Failed { reason } => AfterVerification::Release {
            retry_after: STORE_RETRY,
            why: Unverified::LookupFailed { reason },
        },
    }
}

/// What an effect's `end` means for its record, by `table`. A panic may
/// come after the side effect, so its outcome is unknown whatever the
/// table says; an effect cut at its lease's end was sent and lost.
pub fn after_effect(table: &CompletionTable, end: EffectEnd) -> Completion {
    match end {
        EffectEnd::Answered { status } => table.classify(status),
        EffectEnd::Failed(failure) => table.classify_failure(failure),
        EffectEnd::Panicked => Completion::Unknown,
        EffectEnd::LeaseEnded => table.classify_failure(AttemptOutcome::Lost),
    }
}

/// What a write of an attempt's end that failed with `error` leaves.
pub fn after_failed_write(error: &StoreError) -> Unwritten {
    match error {
        StoreError::Fenced { .. } => Unwritten::Fenced,
        _ => Unwritten::InProgress,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::completion::Dedup;
    use crate::record::RecordId;
    use crate::{Fingerprint, IdempotencyKey, Scope};

    const AT: Timestamp = Timestamp::from_millis(1_000_000);

    #[test]
    fn claims() {
        let cases: Vec<(Claim, AfterClaim)> = vec![
            (
                Claim::Acquired {
                    token: Token(3),
                    lease_until: AT,
                    lease_ms: 30_000,
                    took_over: None,
                },
                AfterClaim::Run {
                    token: Token(3),
                    lease_until: AT,
                    lease_ms: 30_000,
                    fresh: Freshness::Fresh,
                },
            ),
            (
                Claim::Acquired {
                    token: Token(4),
                    lease_until: AT,
                    lease_ms: 5_000,
                    took_over: Some(Token(3)),
                },
                AfterClaim::Run {
                    token: Token(4),
                    lease_until: AT,
                    lease_ms: 5_000,
                    fresh: Freshness::TookOver,
                },
            ),
            (
                Claim::InFlight {
                    lease_until: AT,
                    retry_after_ms: 1_234,
                },
                AfterClaim::InFlight {
                    retry_after: Duration::from_millis(1_234),
                },
            ),
            (
                Claim::Mismatch {
                    stored: Fingerprint::from_bytes([1; 32]),
                },
                AfterClaim::Refused(Refusal::KeyReused),
            ),
            (
                Claim::OutcomeUnknown { newly_marked: true },
                AfterClaim::Refused(Refusal::OutcomeUnknown),
            ),
            (
                Claim::Expired {
                    completed_at: Some(AT),
                    tombstone_until: None,
                },
                AfterClaim::Refused(Refusal::Expired {
                    completed_at: Some(AT),
                    tombstone_until: None,
                }),
            ),
        ];
        for (claim, expect) in cases {
            let shown = format!("{claim:?}");
            assert_eq!(after_claim(claim), expect, "{shown}");
        }
    }

    #[test]
    fn verifications() {
        let found = StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
        let ms = Duration::from_millis;
        let cases = [
            (Verification::NotExecuted, AfterVerification::Run),
            (
                Verification::Executed(found.clone()),
                AfterVerification::Complete(found),
            ),
            (
                Verification::NotYet {
                    at: AT.plus_millis(2_500),
                },
                AfterVerification::Release {
                    retry_after: ms(2_500),
                    why: Unverified::NotYet { running: ms(2_500) },
                },
            ),
            // A window that closes now still asks for a retry, never at once.
            (
                Verification::NotYet { at: AT },
                AfterVerification::Release {
                    retry_after: ms(1),
                    why: Unverified::NotYet { running: ms(0) },
                },
            ),
            (
                Verification::Failed {
                    reason: "timed out".into(),
                },
                AfterVerification::Release {
                    retry_after: STORE_RETRY,
                    why: Unverified::LookupFailed {
                        reason: "timed out".into(),
                    },
                },
            ),
        ];
        for (verification, expect) in cases {
            let shown = format!("{verification:?}");
            assert_eq!(after_verification(verification, AT), expect, "{shown}");
        }
    }

    #[test]
    fn effect_ends() {
        let idem = CompletionTable::new([(500, Completion::Final)], Dedup::Idem).unwrap();
        let upstream = CompletionTable::new([], Dedup::Upstream).unwrap();
        let cases = [
            (
                &idem,
                EffectEnd::Answered { status: 201 },
                Completion::Final,
            ),
            (
                &idem,
                EffectEnd::Answered { status: 500 },
                Completion::Final,
            ),
            (
                &idem,
                EffectEnd::Answered { status: 503 },
                Completion::Unknown,
            ),
            (
                &upstream,
                EffectEnd::Answered { status: 503 },
                Completion::Release,
            ),
            (
                &idem,
                EffectEnd::Failed(AttemptOutcome::NotSent),
                Completion::Release,
            ),
            (
                &idem,
                EffectEnd::Failed(AttemptOutcome::Lost),
                Completion::Unknown,
            ),
            (
                &upstream,
                EffectEnd::Failed(AttemptOutcome::Lost),
                Completion::Release,
            ),
            (&idem, EffectEnd::LeaseEnded, Completion::Unknown),
            (&upstream, EffectEnd::LeaseEnded, Completion::Release),
            // Even where the upstream dedups and a 500 is final: a panic
            // may have come after the effect and before any answer.
            (&idem, EffectEnd::Panicked, Completion::Unknown),
            (&upstream, EffectEnd::Panicked, Completion::Unknown),
        ];
        for (table, end, expect) in cases {
            assert_eq!(after_effect(table, end), expect, "{end:?} by {table:?}");
        }
    }

    #[test]
    fn failed_writes() {
        let id = RecordId {
            scope: Scope::new("POST /payouts|t1").unwrap(),
            key: IdempotencyKey::parse("k1").unwrap(),
        };
        let cases = [
            (
                StoreError::Fenced {
                    id: id.clone(),
                    presented: Token(1),
                    current: None,
                },
                Unwritten::Fenced,
            ),
            (
                StoreError::Unavailable {
                    store: "payouts.db".into(),
                    reason: "down".into(),
                },
                Unwritten::InProgress,
            ),
            (StoreError::NotFound { id }, Unwritten::InProgress),
        ];
        for (error, expect) in cases {
            assert_eq!(after_failed_write(&error), expect, "{error}");
        }
    }

    #[test]
    fn an_unknown_outcome_is_retried_after_a_lease() {
        let policy = Policy::DEFAULT;
        assert_eq!(
            outcome_unknown_retry(&policy),
            Duration::from_millis(policy.lease_ms())
        );
    }
}

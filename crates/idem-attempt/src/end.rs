//! How an attempt ended, as the driver hands it to the adapter that
//! renders it: every case names what was written and what was not, so a
//! renderer decides only its own words (a status, ack/retry/reject).

use std::any::Any;
use std::time::{Duration, Instant};

use idem_core::{
    Completion, Record, RecordId, Refusal, StoreError, StoredResult, Timestamp, Token, Unverified,
};

use crate::hooks::Answer;

/// What the effect is given: the record it runs for, the attempt's token,
/// and its deadline. Forward the key so that the provider can dedup and be
/// reconciled by it; finish before `deadline`, where the effect is dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    /// Scope and key.
    pub id: RecordId,
    /// This attempt's fencing token.
    pub token: Token,
    /// When this attempt's lease ends (store clock).
    pub lease_until: Timestamp,
    /// The lease the store granted, in milliseconds.
    pub lease_ms: u64,
    /// How long the effect may run from when it was started, in
    /// milliseconds ([`idem_core::lease_left`]).
    pub forward_ms: u64,
    /// When the effect must be over, in this process's monotonic time: the
    /// granted lease counted from just before the claim was sent, less its
    /// margin ([`idem_core::lease`]).
    pub deadline: Instant,
}

/// How one attempt ended.
#[non_exhaustive]
pub enum AttemptEnd<A: Answer> {
    /// The effect ran before: the completed record, replayed.
    Replay(Box<Record>),
    /// Another attempt holds the record; nothing ran. Try again after
    /// `retry_after`.
    InFlight {
        /// Until the other attempt's lease ends.
        retry_after: Duration,
    },
    /// The claim refused; nothing ran.
    Refused(Refusal),
    /// The store did not answer the claim; nothing ran.
    StoreUnavailable(StoreError),
    /// A wait ended in work, but the adapter had no capacity to go on
    /// ([`crate::Claimant::back_to_work`]); nothing ran. `released` is the
    /// release of an acquisition, when the wait acquired.
    Shed {
        /// The release of what the wait acquired, if it acquired.
        released: Option<Result<(), StoreError>>,
    },
    /// A fresh claim inside a suspect window whose key the provider had
    /// executed: its answer completed the record (or the write failed);
    /// nothing ran.
    Verified(Result<Record, StoreError>),
    /// A fresh claim inside a suspect window the provider could not clear:
    /// released unsent; nothing ran.
    Unverified {
        /// Why.
        why: Unverified,
        /// When to try again.
        retry_after: Duration,
        /// The release.
        released: Result<(), StoreError>,
    },
    /// The store's answer left too little of its lease: released unsent;
    /// nothing ran.
    LeaseSpent {
        /// The lease the store granted, in milliseconds.
        lease_ms: u64,
        /// What was left of it when the answer came, in milliseconds.
        left_ms: u64,
        /// The release.
        released: Result<(), StoreError>,
    },
    /// The effect ran and its answer was final: stored (or the write
    /// failed: the record stays in progress and is reconciled).
    Completed {
        /// What was stored (or offered to the store).
        result: StoredResult,
        /// What the answer passes on; `None` when reading it reached the
        /// lease's deadline, and `result` says so.
        kept: Option<A::Kept>,
        /// The write.
        written: Result<Record, StoreError>,
    },
    /// The effect ran (or may have) and its end was not final: released
    /// or marked ambiguous, as `completion` says (or the write failed).
    Settled {
        /// Release or unknown.
        completion: Completion,
        /// How the effect ended.
        ran: Ran<A>,
        /// The write.
        written: Result<(), StoreError>,
    },
}

/// How an effect that was not final ended.
#[non_exhaustive]
pub enum Ran<A> {
    /// It answered.
    Answered(A),
    /// It was cut at its lease's deadline after `forward_ms`.
    LeaseEnded {
        /// How long it was given, in milliseconds.
        forward_ms: u64,
    },
    /// Its answer was final but cannot be stored at all
    /// ([`Answer::keep`]); marked ambiguous.
    Unstorable,
    /// It panicked; marked ambiguous. Resume the panic.
    Panicked(Box<dyn Any + Send>),
}

impl<A: Answer> AttemptEnd<A> {
    /// Whether this attempt held the record at some point (and has let go
    /// of it): whoever waits on the key should ask again.
    pub fn held(&self) -> bool {
        match self {
            AttemptEnd::Replay(_)
            | AttemptEnd::InFlight { .. }
            | AttemptEnd::Refused(_)
            | AttemptEnd::StoreUnavailable(_) => false,
            AttemptEnd::Shed { released } => released.is_some(),
            AttemptEnd::Verified(_)
            | AttemptEnd::Unverified { .. }
            | AttemptEnd::LeaseSpent { .. }
            | AttemptEnd::Completed { .. }
            | AttemptEnd::Settled { .. } => true,
        }
    }
}

impl<A: Answer> Ran<A> {
    /// What happened, for the log.
    pub(crate) fn cause(&self) -> String {
        match self {
            Ran::Answered(answer) => answer.cause(),
            Ran::LeaseEnded { forward_ms } => {
                format!("no answer within the {forward_ms} ms left of the lease")
            }
            Ran::Unstorable => "the final answer cannot be stored".to_owned(),
            Ran::Panicked(_) => "the effect panicked".to_owned(),
        }
    }
}

//! Run once: claim the intent's record, run the effect only when this
//! delivery acquired it, record what the effect's answer means, and tell
//! the consumer what to do with the message. Every decision is the core's:
//! the claim table ([`idem_core::decision`], applied by the store) and the
//! completion table ([`CompletionTable`]), as in the HTTP layer.
//!
//! | the claim finds | the effect answers | the record | the message |
//! | --- | --- | --- | --- |
//! | nothing (or a tombstone past its horizon) | final | completed, answer stored | [`Outcome::Ack`] ([`Done::Executed`]) |
//! | | release (not processed) | released | [`Outcome::Retry`] ([`RetryReason::Released`]) |
//! | | unknown (5xx, timeout, lost) | ambiguous | [`Outcome::Retry`] ([`RetryReason::OutcomeUnknown`]) |
//! | | panics | ambiguous, then the panic goes on | never settled |
//! | completed, same payload | not run | unchanged | [`Outcome::Ack`] ([`Done::Replayed`]) |
//! | in progress, lease valid | not run | unchanged | [`Outcome::Retry`] ([`RetryReason::InFlight`]) |
//! | ambiguous, or in progress with its lease over | not run | ambiguous | [`Outcome::Retry`] ([`RetryReason::OutcomeUnknown`]) |
//! | ambiguous, and the settler ([`RunOnce::with_settle_on_retry`]) resolves it | not run | resolved | the claim again: [`Outcome::Ack`] ([`Done::Replayed`]) when it ran, or run now when it did not |
//! | any live record, other payload | not run | unchanged | [`Outcome::Reject`] ([`RejectReason::KeyReused`]) |
//! | a tombstone (past retention) | not run | unchanged | [`Outcome::Reject`] ([`RejectReason::Late`]) |
//! | the store fails | not run | unchanged | [`Outcome::Retry`] ([`RetryReason::StoreUnavailable`]) |
//! | nothing, but the store's answer left too little of its lease ([`idem_core::lease`]) | not run | released | [`Outcome::Retry`] ([`RetryReason::LeaseSpent`]) |
//!
//! The attempt is not written here: [`RunOnce::run`] hands it to
//! [`idem_attempt::Driver`], the same lifecycle the HTTP layer runs, and
//! renders its end. Where the two adapters once differed, they now agree
//! on purpose: a release (after a refused verification, or a lease spent)
//! goes through the driver's one settle, as over HTTP, with the same log;
//! an ambiguous record a delivery meets is settled first when a settler is
//! given, as the layer's `with_settle_on_retry` does; and every delay is
//! the core's [`Duration`], kept to the millisecond here because a
//! broker's redelivery delay takes milliseconds (HTTP rounds the same
//! delay up to whole seconds for `Retry-After`).
//!
//! A retried message is never acked: it comes back, and the claim decides
//! again. A record the store could not settle after the effect ran stays
//! in progress until its lease ends; the next claim (or the reconciler's
//! sweep) then marks it ambiguous, and it is reconciled, never run again
//! blindly.
//!
//! **A dropped future.** If the future of [`RunOnce::run`] is dropped while
//! the effect runs (a consumer shutting down without draining, a timeout
//! around the whole call), nothing is written: the record stays
//! `in_progress` under this attempt's token until its lease ends. With the
//! default policy ([`idem_core::LeaseExpiry::Reconcile`]) the next claim of
//! the key, or the reconciler's sweep of expired leases, then marks it
//! ambiguous, and it is resolved by asking the provider; with
//! [`idem_core::LeaseExpiry::Takeover`] the next delivery runs the effect
//! again, which is only safe where the effect itself dedups by the key. A
//! future dropped while the store applies `complete` may or may not have
//! stored the answer: the record is completed or in progress, never
//! completed without an effect. The same holds when the effect outlives
//! its lease: a later claim marks the record ambiguous and this attempt's
//! write is fenced.
//!
//! **The effect's deadline.** The effect never outlives the lease the
//! store granted: [`RunOnce::run`] notes its monotonic time just before
//! it sends the claim, and gives the effect until that instant plus the
//! granted lease, less a margin ([`idem_core::lease::lease_left`]), in
//! [`Attempt::deadline`]. An effect still running then is dropped and its
//! outcome is unknown (the record is marked ambiguous); when the store's
//! answer came so late that less than [`idem_core::FORWARD_MS_MIN`] is
//! left, the effect is not run at all and the record is released.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_attempt::{Answer, AttemptEnd, Driver, Granted, Polling, Ran, Unknowns};
use idem_core::{
    AttemptOutcome, ClaimRequest, Completion, CompletionTable, EffectEnd, Fingerprint,
    FingerprintError, HeaderBytes, IdempotencyKey, LEASE_MS_MAX, LimitError, Policy, RecordId,
    Refusal, Scope, SettleOnRetry, Store, StoreError, StoredResult, Timestamp, Token, Unverified,
    VerifyFresh, WindowWatch, attempt, check_owner, check_region,
};

use crate::template::KeyRefusal;

/// How long to wait before a retry when the store failed, in milliseconds
/// ([`idem_core::attempt::STORE_RETRY`]).
pub const STORE_RETRY_MS: u64 = attempt::STORE_RETRY.as_millis() as u64;
/// How long to wait before a retry when the effect was released as not
/// processed, in milliseconds ([`idem_core::attempt::RELEASED_RETRY`]).
pub const RELEASED_RETRY_MS: u64 = attempt::RELEASED_RETRY.as_millis() as u64;
/// The shortest wait before a retry of a message in flight elsewhere, in
/// milliseconds: its lease may end any moment, but not in a busy loop.
pub const IN_FLIGHT_RETRY_MS_MIN: u64 = 100;

/// Runs effects at most once per intent, against one store, with one
/// policy and one completion table (a subscription's).
#[derive(Clone)]
pub struct RunOnce {
    store: Arc<dyn Store>,
    policy: Policy,
    completion: CompletionTable,
    owner: String,
    region: Option<String>,
    /// How long a delivery that finds its intent in flight waits for that
    /// attempt's outcome.
    wait: Duration,
    /// The store's suspect window, and who verifies a fresh claim inside it.
    window: Arc<WindowWatch>,
    verifier: Option<Arc<dyn VerifyFresh>>,
    /// Who settles an ambiguous record a delivery meets, before it is
    /// handed back as "outcome unknown".
    settler: Option<Arc<dyn SettleOnRetry>>,
}

/// What a message asks for: the record it claims and the fingerprint of
/// its payload. [`crate::IntentSpec::intent`] derives one from a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    /// Scope and key.
    pub id: RecordId,
    /// The payload's fingerprint.
    pub fingerprint: Fingerprint,
}

/// What the effect is given: the record it runs for and the attempt's
/// token. Forward `id.key` to the service so that it can dedup and be
/// reconciled by it; finish before `deadline` (the effect is dropped there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// Scope and key.
    pub id: RecordId,
    /// This attempt's fencing token.
    pub token: Token,
    /// When this attempt's lease ends (store clock).
    pub lease_until: Timestamp,
    /// When the effect must be over, in this process's monotonic time: the
    /// granted lease counted from just before the claim was sent, less its
    /// margin ([`idem_core::lease`]). Give any timeout of the effect's own
    /// at most this.
    pub deadline: Instant,
}

/// The effect's answer when it got one: a status in HTTP terms (what the
/// completion table classifies) and what to store and replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The status.
    pub status: u16,
    /// Headers worth replaying, values as the bytes received.
    pub headers: Vec<(String, HeaderBytes)>,
    /// The body worth replaying.
    pub body: Vec<u8>,
    /// Why the answer's headers and body cannot be kept, when they cannot
    /// (its body was over [`idem_core::RESULT_BODY_BYTES_MAX`], or failed
    /// after the status arrived): the status still decides, and a final
    /// one completes the record with [`StoredResult::not_stored`].
    pub not_stored: Option<String>,
}

/// What the consumer must do with the message.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The record is final: ack the message.
    Ack {
        /// Run now, or replayed.
        done: Done,
    },
    /// Not final, or not known: do not ack; let the message come back after
    /// `after` (nak with delay).
    Retry {
        /// When to try again.
        after: Duration,
        /// Why.
        reason: RetryReason,
    },
    /// Never run, and never will be: send the message to the sink
    /// [`RejectReason::sink`] names.
    Reject {
        /// Why.
        reason: RejectReason,
    },
}

/// How an acked message's intent was done.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Done {
    /// The effect ran in this call; this is its stored answer.
    Executed {
        /// The stored answer.
        result: StoredResult,
    },
    /// The effect ran before, for an earlier delivery; it was not run again.
    Replayed {
        /// Its stored answer; `None` only if the store lost it.
        result: Option<StoredResult>,
    },
}

/// Why a message must come back later.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryReason {
    /// Another delivery holds the record under a valid lease.
    InFlight,
    /// The outcome of an attempt is unknown (this one's or an earlier one's):
    /// the record is ambiguous until reconciled; a later delivery replays
    /// the reconciled answer or, if it was not executed, runs.
    OutcomeUnknown,
    /// The effect answered that it did not process the message; the record
    /// was released so that a later delivery runs it.
    Released,
    /// The effect ran (or may have) but the store did not record what its
    /// answer means: the record stays in progress until its lease ends and
    /// is then reconciled.
    NotRecorded {
        /// What the answer meant.
        completion: Completion,
        /// Why it was not recorded (the store failed, or a newer attempt
        /// owns the record and the write was fenced).
        error: StoreError,
    },
    /// The store did not answer the claim: nothing was run.
    StoreUnavailable(StoreError),
    /// The store acquired the record, but its answer came with less than
    /// [`idem_core::FORWARD_MS_MIN`] of the lease left: nothing was run,
    /// and the record was released (or, if the release failed, it is
    /// reconciled after its lease).
    LeaseSpent {
        /// The lease the store granted, in milliseconds.
        lease_ms: u64,
        /// What was left of it when the answer came, in milliseconds.
        left_ms: u64,
    },
    /// The store answered with a claim this version does not know.
    UnknownClaim,
    /// Inside the store's suspect window (it may have lost records), the
    /// provider could not yet say whether this intent ran: nothing was
    /// run, and the record was released.
    Unverified {
        /// Why (the lookup failed, or a forgotten attempt may still run).
        reason: String,
    },
}

/// Why a message is never run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectReason {
    /// The key cannot be derived from the message.
    NoKey(KeyRefusal),
    /// The payload cannot be fingerprinted in its declared format.
    BadPayload(FingerprintError),
    /// The key is bound to another payload: another intent reuses it.
    KeyReused {
        /// The key.
        key: IdempotencyKey,
        /// Its scope.
        scope: Scope,
    },
    /// The key is past retention and its tombstone caught the message: a
    /// late replay (a redrive, a resubmission) of an intent done long ago.
    Late {
        /// The key.
        key: IdempotencyKey,
        /// When the intent's effect completed.
        completed_at: Option<Timestamp>,
        /// Until when its tombstone is kept.
        tombstone_until: Option<Timestamp>,
    },
}

/// Where a rejected message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sink {
    /// The dead-letter queue: the message is wrong and needs a person.
    DeadLetter,
    /// The late sink: the message was right, but too late to compare with
    /// what was done; count it and look at it, never run it.
    Late,
}

impl RunOnce {
    /// Runs against `store` with `policy`, classifying answers with
    /// `completion`. Records are labelled `idem-consume-<pid>` until
    /// [`RunOnce::with_owner`].
    pub fn new(store: Arc<dyn Store>, policy: Policy, completion: CompletionTable) -> RunOnce {
        RunOnce {
            store,
            policy,
            completion,
            owner: format!("idem-consume-{}", std::process::id()),
            region: None,
            wait: Duration::ZERO,
            window: Arc::default(),
            verifier: None,
            settler: None,
        }
    }

    /// Asks `settler` to settle an ambiguous record when a delivery meets
    /// it (the reconciler `idem consume` runs, for subscriptions with a
    /// lookup), then claims again: a completion is acked as a replay, a
    /// "not executed" runs here. Without one the delivery is retried after
    /// a lease ([`RetryReason::OutcomeUnknown`]), as before a reconciler's
    /// sweep settles it. The HTTP layer's `with_settle_on_retry` is the same.
    pub fn with_settle_on_retry(self, settler: Arc<dyn SettleOnRetry>) -> RunOnce {
        RunOnce {
            settler: Some(settler),
            ..self
        }
    }

    /// Verifies every fresh claim while `window` says the store may have
    /// lost records (a suspect window after a failover or a restore): asks
    /// `verifier` (the reconciler, for subscriptions with a lookup) before
    /// the effect runs. Found: the record is completed with the provider's
    /// answer and the message acked as a replay. Not yet provable, or no
    /// answer: released and retried, nothing run. Without a verifier that
    /// covers the subscription, the effect runs, with a warning.
    pub fn with_suspect_window(
        self,
        window: Arc<WindowWatch>,
        verifier: Option<Arc<dyn VerifyFresh>>,
    ) -> RunOnce {
        RunOnce {
            window,
            verifier,
            ..self
        }
    }

    /// Lets a delivery that finds its intent in flight (another delivery
    /// runs it) wait up to `wait` for that attempt's outcome, asking the
    /// claim again every [`idem_core::lease::WAIT_POLL_MS`], instead of
    /// being handed back at once: a completion is then acked as a replay,
    /// a release runs it here. Zero (the default) waits not at all.
    pub fn with_wait(self, wait: Duration) -> RunOnce {
        RunOnce { wait, ..self }
    }

    /// Labels the records this runner acquires with `owner` (a consumer
    /// name helps an operator); refused when over the store's limits.
    pub fn with_owner(self, owner: impl Into<String>) -> Result<RunOnce, LimitError> {
        let owner = owner.into();
        check_owner(&owner)?;
        Ok(RunOnce { owner, ..self })
    }

    /// Writes `region` on the records this runner acquires (none by
    /// default), so an operator sees where an attempt came from; refused
    /// when it is not a region name ([`idem_core::check_region`]).
    pub fn with_region(self, region: impl Into<String>) -> Result<RunOnce, LimitError> {
        let region = region.into();
        check_region(&region)?;
        Ok(RunOnce {
            region: Some(region),
            ..self
        })
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Claims `intent`, runs `effect` only if this call acquired it, and
    /// records what its answer means (see the module documentation).
    ///
    /// `effect` gets the [`Attempt`] and answers with a [`Reply`], or with
    /// how it failed: [`AttemptOutcome::NotSent`] when the request never
    /// left, [`AttemptOutcome::Lost`] when it was sent and the answer is
    /// unknown (a timeout, a reset). If it panics, the record is marked
    /// ambiguous and the panic resumes.
    ///
    /// The attempt is [`idem_attempt::Driver::run`], the one the HTTP layer
    /// runs too; this renders its end as an [`Outcome`].
    pub async fn run<E, F>(&self, intent: &Intent, effect: E) -> Outcome
    where
        E: FnOnce(Attempt) -> F,
        F: Future<Output = Result<Reply, AttemptOutcome>>,
    {
        self.run_within(intent, LEASE_MS_MAX, effect).await
    }

    /// [`RunOnce::run`] with a lease of at most `lease_ms_max` (never less
    /// than [`idem_core::LEASE_MS_MIN`]): for a caller that will be stopped
    /// sooner than the policy's lease, such as a function invocation that
    /// ends at its deadline. The record it leaves when stopped then blocks
    /// a retry no longer than the caller could have run; the effect's
    /// [`Attempt::deadline`] follows the shorter lease.
    pub async fn run_within<E, F>(&self, intent: &Intent, lease_ms_max: u64, effect: E) -> Outcome
    where
        E: FnOnce(Attempt) -> F,
        F: Future<Output = Result<Reply, AttemptOutcome>>,
    {
        let mut request = ClaimRequest {
            id: intent.id.clone(),
            fingerprint: intent.fingerprint,
            legacy_fingerprint: None,
            owner: self.owner.clone(),
            region: self.region.clone(),
            policy: self.policy.with_lease_at_most(lease_ms_max),
        };
        let waits = Polling(self.wait);
        // An unknown outcome awaits reconciliation: the log says so, as it
        // did before the driver (a consumer's reconciler sweeps beside it).
        let driver = Driver::new(&*self.store, &self.completion)
            .with_unknowns(Unknowns::Reconciler)
            .with_window(&self.window, self.verifier.as_deref())
            .with_settler(self.settler.as_deref())
            .with_claimant(&waits);
        let end = driver
            .run(&mut request, |granted| {
                let answered = effect(Attempt::from(granted));
                async move { Replied(answered.await) }
            })
            .await;
        self.render(&request.id, end)
    }

    /// The consumer's words for how the attempt ended.
    fn render(&self, id: &RecordId, end: AttemptEnd<Replied>) -> Outcome {
        let unknown = attempt::outcome_unknown_retry(&self.policy);
        match end {
            AttemptEnd::Replay(record) => replayed(record.result),
            AttemptEnd::InFlight { retry_after } => Outcome::Retry {
                after: retry_after.max(Duration::from_millis(IN_FLIGHT_RETRY_MS_MIN)),
                reason: RetryReason::InFlight,
            },
            AttemptEnd::Refused(refusal) => refused(id, refusal, unknown),
            AttemptEnd::StoreUnavailable(e) => {
                tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "store unavailable; nothing was run");
                retry(attempt::STORE_RETRY, RetryReason::StoreUnavailable(e))
            }
            AttemptEnd::Verified(written) => match written {
                Ok(record) => replayed(record.result),
                Err(error) => self.not_recorded(id, Completion::Final, error),
            },
            AttemptEnd::Unverified {
                why,
                retry_after,
                released,
            } => match released {
                Ok(()) => retry(
                    retry_after,
                    RetryReason::Unverified {
                        reason: why_unverified(why),
                    },
                ),
                Err(error) => self.not_recorded(id, Completion::Release, error),
            },
            AttemptEnd::LeaseSpent {
                lease_ms,
                left_ms,
                released,
            } => match released {
                Ok(()) => retry(
                    attempt::RELEASED_RETRY,
                    RetryReason::LeaseSpent { lease_ms, left_ms },
                ),
                Err(error) => self.not_recorded(id, Completion::Release, error),
            },
            AttemptEnd::Completed {
                result, written, ..
            } => match written {
                Ok(_) => Outcome::Ack {
                    done: Done::Executed { result },
                },
                Err(error) => self.not_recorded(id, Completion::Final, error),
            },
            AttemptEnd::Settled {
                completion,
                ran,
                written,
            } => {
                if let Ran::Panicked(panic) = ran {
                    std::panic::resume_unwind(panic);
                }
                match (written, completion) {
                    (Err(error), completion) => self.not_recorded(id, completion, error),
                    (Ok(()), Completion::Release) => {
                        retry(attempt::RELEASED_RETRY, RetryReason::Released)
                    }
                    (Ok(()), _) => retry(unknown, RetryReason::OutcomeUnknown),
                }
            }
            // A wait that ended in work always goes on here (the default
            // claimant has capacity); anything newer is retried, not acked.
            _ => retry(attempt::STORE_RETRY, RetryReason::UnknownClaim),
        }
    }

    fn not_recorded(&self, id: &RecordId, completion: Completion, error: StoreError) -> Outcome {
        tracing::warn!(scope = %id.scope, key = %id.key, completion = completion.as_str(), error = %error, "the effect's answer was not recorded; the record is reconciled after its lease");
        retry(
            attempt::outcome_unknown_retry(&self.policy),
            RetryReason::NotRecorded { completion, error },
        )
    }
}

/// The effect's answer as the driver judges it.
struct Replied(Result<Reply, AttemptOutcome>);

impl Answer for Replied {
    type Kept = ();

    fn end(&self) -> EffectEnd {
        match &self.0 {
            Ok(reply) => EffectEnd::Answered {
                status: reply.status,
            },
            Err(failure) => EffectEnd::Failed(*failure),
        }
    }

    fn cause(&self) -> String {
        match &self.0 {
            Ok(reply) => format!("the effect answered {}", reply.status),
            Err(AttemptOutcome::NotSent) => "the effect's request never left".to_owned(),
            Err(_) => "the effect's answer was lost".to_owned(),
        }
    }

    fn excerpt(&mut self) -> impl Future<Output = Option<Vec<u8>>> + Send {
        // The reply is already whole in memory; the note keeps its start.
        let body = match &self.0 {
            Ok(reply) if !reply.body.is_empty() => {
                let head = reply.body.len().min(idem_core::AMBIGUITY_EXCERPT_BYTES_MAX);
                Some(reply.body[..head].to_vec())
            }
            _ => None,
        };
        std::future::ready(body)
    }

    fn keep(self) -> impl Future<Output = Option<(StoredResult, ())>> + Send {
        // Only a status outside 100..=599 cannot be stored at all; a
        // completion table never declares one final.
        let kept = match self.0 {
            Ok(reply) => stored(reply).ok().map(|result| (result, ())),
            Err(_) => None,
        };
        std::future::ready(kept)
    }
}

impl From<Granted> for Attempt {
    fn from(granted: Granted) -> Attempt {
        Attempt {
            id: granted.id,
            token: granted.token,
            lease_until: granted.lease_until,
            deadline: granted.deadline,
        }
    }
}

impl Intent {
    /// The intent keyed `key` in `scope`, with the payload's `fingerprint`.
    pub fn new(scope: Scope, key: IdempotencyKey, fingerprint: Fingerprint) -> Intent {
        Intent {
            id: RecordId { scope, key },
            fingerprint,
        }
    }
}

impl Reply {
    /// A reply with only a status.
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            not_stored: None,
        }
    }

    /// A reply whose status arrived but whose headers and body cannot be
    /// kept, and why.
    pub fn not_stored(status: u16, why: impl Into<String>) -> Reply {
        Reply {
            not_stored: Some(why.into()),
            ..Reply::status(status)
        }
    }
}

impl Outcome {
    /// True only for [`Outcome::Ack`]: the one outcome after which the
    /// message may be acked.
    pub fn is_ack(&self) -> bool {
        matches!(self, Outcome::Ack { .. })
    }
}

impl RejectReason {
    /// Where the message goes: the late sink for a late replay, the
    /// dead-letter queue for everything else.
    pub fn sink(&self) -> Sink {
        match self {
            RejectReason::Late { .. } => Sink::Late,
            _ => Sink::DeadLetter,
        }
    }

    /// A short code for the reason, as every sink copy carries it (the
    /// `Idem-Reason` header or attribute): `no-key`, `bad-payload`,
    /// `key-reused` or `expired`.
    pub fn code(&self) -> &'static str {
        match self {
            RejectReason::NoKey(_) => "no-key",
            RejectReason::BadPayload(_) => "bad-payload",
            RejectReason::KeyReused { .. } => "key-reused",
            RejectReason::Late { .. } => "expired",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ack {
                done: Done::Executed { result },
            } => write!(f, "ack: run once, answered {}", result.status()),
            Outcome::Ack {
                done: Done::Replayed { result: Some(r) },
            } => write!(
                f,
                "ack: done before (answered {}), not run again",
                r.status()
            ),
            Outcome::Ack { .. } => f.write_str("ack: done before, not run again"),
            Outcome::Retry { after, reason } => {
                write!(f, "retry after {} ms: {reason}", after.as_millis())
            }
            Outcome::Reject { reason } => write!(f, "reject: {reason}"),
        }
    }
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryReason::InFlight => {
                f.write_str("another delivery of this intent is running; nothing was run")
            }
            RetryReason::OutcomeUnknown => f.write_str(
                "the outcome of an attempt is unknown and awaits reconciliation; nothing was run again",
            ),
            RetryReason::Released => f.write_str(
                "the effect did not process the message; the key was released for a later delivery",
            ),
            RetryReason::NotRecorded { completion, error } => write!(
                f,
                "the effect's answer ({}) was not recorded: {error}; the record will be reconciled",
                completion.as_str()
            ),
            RetryReason::StoreUnavailable(e) => {
                write!(f, "the store did not answer ({e}); nothing was run")
            }
            RetryReason::LeaseSpent { lease_ms, left_ms } => write!(
                f,
                "the store's answer left {left_ms} ms of its {lease_ms} ms lease, too little \
                 to run the effect; nothing was run and the key was released"
            ),
            RetryReason::UnknownClaim => {
                f.write_str("the store answered with an unknown claim; nothing was run")
            }
            RetryReason::Unverified { reason } => write!(
                f,
                "the store may have lost records (a suspect window is open) and the provider \
                 could not yet say whether this intent ran ({reason}); nothing was run and the \
                 key was released"
            ),
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::NoKey(e) => write!(f, "no key can be derived ({e}); nothing was run"),
            RejectReason::BadPayload(e) => {
                write!(
                    f,
                    "the payload cannot be fingerprinted ({e}); nothing was run"
                )
            }
            RejectReason::KeyReused { key, .. } => write!(
                f,
                "key {:?} is already used by a different payload; nothing was run",
                key.as_str()
            ),
            RejectReason::Late {
                key, completed_at, ..
            } => {
                write!(f, "key {:?} is past its retention", key.as_str())?;
                if let Some(at) = completed_at {
                    write!(f, " (done at {} ms since the epoch)", at.as_millis())?;
                }
                f.write_str("; a late replay, not run")
            }
        }
    }
}

impl std::error::Error for RejectReason {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RejectReason::NoKey(e) => Some(e),
            RejectReason::BadPayload(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Display for Sink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sink::DeadLetter => "dead-letter",
            Sink::Late => "late",
        })
    }
}

fn retry(after: Duration, reason: RetryReason) -> Outcome {
    Outcome::Retry { after, reason }
}

/// The reply as a stored result. A reply whose headers or body cannot be
/// kept is stored as [`StoredResult::not_stored`], as the gateway stores
/// it: the effect happened and must be recorded as final whatever it
/// answered. Only a status outside 100..=599 is refused.
fn stored(reply: Reply) -> Result<StoredResult, LimitError> {
    let status = reply.status;
    let why = match reply.not_stored {
        Some(why) => why,
        None => match StoredResult::new(status, reply.headers, reply.body) {
            Ok(result) => return Ok(result),
            Err(e @ LimitError::BadStatus { .. }) => return Err(e),
            Err(e) => e.to_string(),
        },
    };
    // Checks the status the same way.
    StoredResult::new(status, Vec::new(), Vec::new())?;
    Ok(StoredResult::not_stored(&format!(
        "it answered {status}; {why}"
    )))
}

fn replayed(result: Option<StoredResult>) -> Outcome {
    Outcome::Ack {
        done: Done::Replayed { result },
    }
}

/// A claim's refusal: rejected for good, or retried after an unknown
/// outcome is reconciled.
fn refused(id: &RecordId, refusal: Refusal, unknown: Duration) -> Outcome {
    match refusal {
        Refusal::KeyReused => Outcome::Reject {
            reason: RejectReason::KeyReused {
                key: id.key.clone(),
                scope: id.scope.clone(),
            },
        },
        Refusal::OutcomeUnknown => retry(unknown, RetryReason::OutcomeUnknown),
        Refusal::Expired {
            completed_at,
            tombstone_until,
        } => Outcome::Reject {
            reason: RejectReason::Late {
                key: id.key.clone(),
                completed_at,
                tombstone_until,
            },
        },
        _ => retry(attempt::STORE_RETRY, RetryReason::UnknownClaim),
    }
}

/// Why a fresh claim inside the suspect window was not run, in words.
fn why_unverified(why: Unverified) -> String {
    match why {
        Unverified::LookupFailed { reason } => reason,
        _ => "an attempt the store forgot may still be running".to_owned(),
    }
}

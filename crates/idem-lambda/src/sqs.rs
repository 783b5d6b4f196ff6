//! An SQS-triggered function: every record of the batch goes through
//! [`RunOnce::run_within`], and the function answers with the records that
//! must come back ([`SqsBatchResponse`], the event source mapping's
//! `ReportBatchItemFailures`).
//!
//! | the record's outcome | reported | why |
//! | --- | --- | --- |
//! | [`Outcome::Ack`] (run now, or replayed) | success | the intent is done; SQS deletes the message |
//! | [`Outcome::Retry`] (in flight elsewhere, outcome unknown, store down, released by the effect) | failed | it must come back after the visibility timeout; the claim decides again |
//! | [`Outcome::Reject`], dead-letter sink (key reused with another payload, no usable key) | failed, or success once sent to the dead-letter queue when one is given | see below |
//! | [`Outcome::Reject`], late sink (past retention, caught by the tombstone) | success, counted and logged, or sent to the late queue when one is given | never run: the intent was done long ago |
//! | a FIFO record after a failed record of its message group | failed, not run | SQS FIFO keeps a group's order only if none after a failure is deleted |
//!
//! **Where a rejected record goes.** By default it is reported failed, so
//! that the source queue's redrive policy moves it to the queue's own
//! dead-letter queue after `maxReceiveCount` receives. That is the place an
//! operator already watches, the message keeps its attributes and receive
//! count, the function needs no permission on another queue, and nothing is
//! lost if a send fails. Each receive until then is one claim that runs
//! nothing: a reused key stays reused and a missing key stays missing.
//! Without a redrive policy such a record returns until the queue's
//! retention drops it; give the function a dead-letter queue of its own
//! ([`SqsRunOnce::with_dead_letter_queue`]) to have it sent there with the
//! reason at once and then reported success (reported failed when the send
//! fails, so the record is never dropped unrecorded).
//!
//! **Concurrency.** Records without a `MessageGroupId` attribute (a
//! standard queue) run concurrently, at most [`SqsRunOnce::with_concurrency`]
//! at once. Records of a FIFO queue run one after another within their
//! message group, groups concurrently, and once one of a group is reported
//! failed the rest of that group are reported failed without running, as
//! Powertools' `SqsFifoPartialProcessor` does with `skip_group_on_error`.
//!
//! **The invocation's deadline.** Each record's lease is at most the time
//! left before the invocation's deadline, less a margin, counted when the
//! record is claimed ([`lease_ms_max`]): a record whose invocation timed out
//! blocks its redelivery no longer than the invocation could have run, and
//! the effect's [`Attempt::deadline`] falls before the runtime stops it.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures_util::StreamExt;
use idem_core::AttemptOutcome;
use idem_message::{
    Attempt, Done, IntentSpec, Message, Outcome, RejectReason, Reply, RetryReason, RunOnce, Sink,
};
use lambda_runtime::{Context, LambdaEvent};

/// How many records of one batch run at once by default: SQS hands a
/// function at most 10 records per batch unless a batching window is set.
pub const CONCURRENCY_DEFAULT: usize = 10;

/// The time kept back before the invocation's deadline by default, in
/// milliseconds: enough to record the outcome and return the batch
/// response before the runtime stops the invocation.
pub const DEADLINE_MARGIN_MS_DEFAULT: u64 = 500;

/// The message attribute whose presence marks a FIFO queue's record.
pub const MESSAGE_GROUP_ID: &str = "MessageGroupId";

/// Runs an SQS batch's records at most once per intent: one per function,
/// built once per execution environment and shared by every invocation.
#[derive(Clone)]
pub struct SqsRunOnce {
    runner: RunOnce,
    spec: IntentSpec,
    concurrency: usize,
    margin_ms: u64,
    dead_letter: Option<Arc<dyn RejectQueue>>,
    late_queue: Option<Arc<dyn RejectQueue>>,
    late: Arc<AtomicU64>,
}

/// A queue a rejected record is sent to, with the reason: the dead-letter
/// queue ([`SqsRunOnce::with_dead_letter_queue`]) or the late queue
/// ([`SqsRunOnce::with_late_queue`]). Implement it with the SQS client the
/// function already has (`SendMessage` of the body, the attributes and the
/// reason); an error leaves the record reported failed, so it comes back.
pub trait RejectQueue: Send + Sync {
    /// Sends `record` with `reason`; `Err` says why it was not sent.
    fn send<'a>(
        &'a self,
        record: &'a SqsMessage,
        reason: &'a RejectReason,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;
}

/// What became of one record of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordReport {
    /// The record's `messageId` (its batch item identifier).
    pub message_id: String,
    /// What was done with it.
    pub verdict: Verdict,
}

/// What was done with a record, and so whether it is reported failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// The intent is done, now or before: reported success.
    Acked(Done),
    /// Not final or not known: reported failed, so that it comes back.
    Retry(RetryReason),
    /// Never run, and never will be; `to` says where the record went.
    Rejected {
        /// Why.
        reason: RejectReason,
        /// Where it went.
        to: RejectedTo,
    },
    /// A FIFO record not run because an earlier record of its message
    /// group was reported failed: reported failed too.
    GroupBlocked {
        /// The message group.
        group: String,
    },
}

/// Where a rejected record went.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectedTo {
    /// Reported failed, for the source queue's redrive policy to move to
    /// its dead-letter queue after `maxReceiveCount` receives.
    Redrive,
    /// Sent to the function's own queue for its sink: reported success.
    Sent,
    /// The send failed (the reason is here): reported failed.
    SendFailed(String),
    /// A late record without a late queue: counted, logged, reported
    /// success.
    Dropped,
}

impl SqsRunOnce {
    /// Runs each record's intent, as `spec` reads it from the record, with
    /// `runner`. Rejected records are reported failed for the source
    /// queue's redrive policy; late ones are counted and dropped.
    pub fn new(runner: RunOnce, spec: IntentSpec) -> SqsRunOnce {
        SqsRunOnce {
            runner,
            spec,
            concurrency: CONCURRENCY_DEFAULT,
            margin_ms: DEADLINE_MARGIN_MS_DEFAULT,
            dead_letter: None,
            late_queue: None,
            late: Arc::default(),
        }
    }

    /// Runs at most `records` records (or FIFO message groups) at once; at
    /// least one.
    pub fn with_concurrency(self, records: usize) -> SqsRunOnce {
        SqsRunOnce {
            concurrency: records.max(1),
            ..self
        }
    }

    /// Keeps `margin` back before the invocation's deadline when capping a
    /// record's lease (default [`DEADLINE_MARGIN_MS_DEFAULT`]).
    pub fn with_deadline_margin(self, margin: Duration) -> SqsRunOnce {
        SqsRunOnce {
            margin_ms: u64::try_from(margin.as_millis()).unwrap_or(u64::MAX),
            ..self
        }
    }

    /// Sends records whose key is reused or missing to `queue` and reports
    /// them success, instead of failing them for the redrive policy.
    pub fn with_dead_letter_queue(self, queue: Arc<dyn RejectQueue>) -> SqsRunOnce {
        SqsRunOnce {
            dead_letter: Some(queue),
            ..self
        }
    }

    /// Sends late records (past retention) to `queue`, instead of only
    /// counting and logging them.
    pub fn with_late_queue(self, queue: Arc<dyn RejectQueue>) -> SqsRunOnce {
        SqsRunOnce {
            late_queue: Some(queue),
            ..self
        }
    }

    /// How many late records this function dropped since it was built
    /// (sent to no late queue).
    pub fn late_dropped(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }

    /// The function's answer to `event`: each record run through `effect`
    /// at most once per intent, and the batch item failures naming exactly
    /// the records that must come back. `effect` gets the record (a copy
    /// its future may keep) and its [`Attempt`]; it answers as
    /// [`RunOnce::run`]'s effect does.
    pub async fn handle<E, F>(&self, event: LambdaEvent<SqsEvent>, effect: E) -> SqsBatchResponse
    where
        E: Fn(SqsMessage, Attempt) -> F,
        F: Future<Output = Result<Reply, AttemptOutcome>>,
    {
        let reports = self.run_batch(&event.payload, &event.context, effect).await;
        batch_response(&reports)
    }

    /// [`SqsRunOnce::handle`], with what became of each record, in the
    /// batch's order.
    pub async fn run_batch<E, F>(
        &self,
        event: &SqsEvent,
        context: &Context,
        effect: E,
    ) -> Vec<RecordReport>
    where
        E: Fn(SqsMessage, Attempt) -> F,
        F: Future<Output = Result<Reply, AttemptOutcome>>,
    {
        let deadline = context.deadline();
        let slots: Mutex<Vec<Option<Verdict>>> = Mutex::new(vec![None; event.records.len()]);
        futures_util::stream::iter(groups(&event.records))
            .for_each_concurrent(self.concurrency, |group| {
                let (effect, slots) = (&effect, &slots);
                async move {
                    let mut blocked: Option<String> = None;
                    for index in group {
                        let record = &event.records[index];
                        let verdict = match &blocked {
                            Some(group) => Verdict::GroupBlocked {
                                group: group.clone(),
                            },
                            None => self.run_record(record, deadline, effect).await,
                        };
                        if verdict.failed() {
                            blocked = record.attributes.get(MESSAGE_GROUP_ID).cloned();
                        }
                        if let Ok(mut slots) = slots.lock() {
                            slots[index] = Some(verdict);
                        }
                    }
                }
            })
            .await;
        let verdicts = slots.into_inner().unwrap_or_else(PoisonError::into_inner);
        event
            .records
            .iter()
            .zip(verdicts)
            .map(|(record, verdict)| RecordReport {
                message_id: record.message_id.clone().unwrap_or_default(),
                // Every index belongs to exactly one group, so every slot
                // was filled; an empty one would be a bug, and a record
                // reported failed comes back rather than being lost.
                verdict: verdict.unwrap_or(Verdict::Retry(RetryReason::UnknownClaim)),
            })
            .collect()
    }

    /// One record: its intent, the run, and where a rejection goes.
    async fn run_record<E, F>(
        &self,
        record: &SqsMessage,
        deadline: SystemTime,
        effect: &E,
    ) -> Verdict
    where
        E: Fn(SqsMessage, Attempt) -> F,
        F: Future<Output = Result<Reply, AttemptOutcome>>,
    {
        let headers = headers(record);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, *v)).collect();
        let message = Message {
            payload: record.body.as_deref().unwrap_or_default().as_bytes(),
            headers: &headers,
            message_id: record.message_id.as_deref(),
        };
        let outcome = match self.spec.intent(&message) {
            Ok(intent) => {
                let lease_ms = lease_ms_max(deadline, SystemTime::now(), self.margin_ms);
                self.runner
                    .run_within(&intent, lease_ms, |attempt| effect(record.clone(), attempt))
                    .await
            }
            Err(reason) => Outcome::Reject { reason },
        };
        match outcome {
            Outcome::Ack { done } => Verdict::Acked(done),
            Outcome::Retry { reason, .. } => Verdict::Retry(reason),
            Outcome::Reject { reason } => self.reject(record, reason).await,
            // A newer outcome this version does not know: never acked.
            _ => Verdict::Retry(RetryReason::UnknownClaim),
        }
    }

    /// Where a rejected record goes (see the module documentation).
    async fn reject(&self, record: &SqsMessage, reason: RejectReason) -> Verdict {
        let id = record.message_id.as_deref().unwrap_or_default();
        let (queue, otherwise) = match reason.sink() {
            Sink::Late => (&self.late_queue, RejectedTo::Dropped),
            Sink::DeadLetter => (&self.dead_letter, RejectedTo::Redrive),
        };
        let to = match queue {
            Some(queue) => match queue.send(record, &reason).await {
                Ok(()) => RejectedTo::Sent,
                Err(error) => {
                    tracing::warn!(message_id = id, sink = %reason.sink(), %error, "the rejected record was not sent; it is reported failed");
                    RejectedTo::SendFailed(error)
                }
            },
            None => otherwise,
        };
        if to == RejectedTo::Dropped {
            self.late.fetch_add(1, Ordering::Relaxed);
        }
        tracing::warn!(message_id = id, sink = %reason.sink(), to = %to, "{reason}");
        Verdict::Rejected { reason, to }
    }
}

impl Verdict {
    /// True when the record is reported failed and comes back.
    pub fn failed(&self) -> bool {
        match self {
            Verdict::Acked(_) => false,
            Verdict::Retry(_) | Verdict::GroupBlocked { .. } => true,
            Verdict::Rejected { to, .. } => {
                matches!(to, RejectedTo::Redrive | RejectedTo::SendFailed(_))
            }
        }
    }
}

impl fmt::Display for RejectedTo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectedTo::Redrive => f.write_str("reported failed for the redrive policy"),
            RejectedTo::Sent => f.write_str("sent to its queue"),
            RejectedTo::SendFailed(e) => write!(f, "not sent ({e}); reported failed"),
            RejectedTo::Dropped => f.write_str("counted and dropped"),
        }
    }
}

/// The longest lease a record claimed at `now` may take, in milliseconds:
/// what is left before the invocation's `deadline`, less `margin_ms`
/// (zero when the deadline has passed; [`RunOnce::run_within`] then leases
/// the shortest lease a policy accepts).
pub fn lease_ms_max(deadline: SystemTime, now: SystemTime, margin_ms: u64) -> u64 {
    let left = deadline.duration_since(now).unwrap_or(Duration::ZERO);
    u64::try_from(left.as_millis())
        .unwrap_or(u64::MAX)
        .saturating_sub(margin_ms)
}

/// The batch item failures of `reports`: exactly the failed records.
pub fn batch_response(reports: &[RecordReport]) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for report in reports.iter().filter(|r| r.verdict.failed()) {
        response.add_failure(report.message_id.clone());
    }
    response
}

/// The records' indexes by how they may run: each FIFO message group in
/// the batch's order, and every other record on its own.
fn groups(records: &[SqsMessage]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut by_group: HashMap<&str, usize> = HashMap::new();
    for (index, record) in records.iter().enumerate() {
        match record.attributes.get(MESSAGE_GROUP_ID) {
            Some(group) => match by_group.get(group.as_str()) {
                Some(&at) => out[at].push(index),
                None => {
                    by_group.insert(group, out.len());
                    out.push(vec![index]);
                }
            },
            None => out.push(vec![index]),
        }
    }
    out
}

/// The record's string message attributes (`String` and `Number` types),
/// which key templates read as headers (`{header:name}`).
fn headers(record: &SqsMessage) -> Vec<(&str, &str)> {
    record
        .message_attributes
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.string_value.as_deref()?)))
        .collect()
}

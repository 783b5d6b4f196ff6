//! The contract file's shape: one struct per TOML section, every field documented.
//!
//! Every section except `[operation]` is optional *in the parser* so that a
//! missing section becomes an UNANSWERED question in the report rather than a
//! parse error or a silent default. Every struct denies unknown fields so a
//! typo is an error, never an ignored line. See docs/contracts.md.

use serde::Deserialize;

/// One operation's idempotency contract, as read from a contract file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    /// `[operation]`: which operation this contract describes.
    pub operation: Operation,
    /// `[intent]`: the business decision a key names.
    pub intent: Option<Intent>,
    /// `[key]`: how and where the key is made.
    pub key: Option<KeySpec>,
    /// `[propagation]`: which dependencies receive the key.
    pub propagation: Option<Propagation>,
    /// `[fingerprint]`: what the request fingerprint covers.
    pub fingerprint: Option<Fingerprint>,
    /// `[concurrency]`: what a second attempt sees while the first runs.
    pub concurrency: Option<Concurrency>,
    /// `[completion]`: whether results are stored and replayed.
    pub completion: Option<Completion>,
    /// `[ambiguity]`: how an unknown outcome is reconciled.
    pub ambiguity: Option<Ambiguity>,
    /// `[retention]`: how long records and tombstones live.
    pub retention: Option<Retention>,
    /// `[scope]`: where a key is unique.
    pub scope: Option<Scope>,
    /// `[regions]`: regions, replication and where claims are accepted.
    pub regions: Option<Regions>,
    /// `[recovery]`: what a restore from backup brings back.
    pub recovery: Option<Recovery>,
    /// `[replay.*]`: every way another attempt of the same intent can arrive.
    pub replay: Option<ReplaySources>,
    /// `[testing]`: which failure cases the operation's tests exercise.
    pub testing: Option<Testing>,
}

/// `[operation]`: the operation's name (the route or consumer) and a note.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Operation {
    /// Short name, e.g. `"create-payout"`.
    pub name: String,
    /// Free text for people; not judged.
    pub description: Option<String>,
}

/// `[intent]`: one business decision, and the fields that identify it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Intent {
    /// The decision in words, e.g. `"pay seller S for settlement period P"`.
    pub description: String,
    /// The business fields that identify one intent, e.g. `["seller_id", "settlement_id"]`.
    pub fields: Vec<String>,
}

/// `[key]`: how the idempotency key is made.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySpec {
    /// Where the key's value comes from.
    pub source: KeySource,
    /// For `source = "business"`: the template, e.g. `"payout:{seller_id}:{settlement_id}"`.
    pub template: Option<String>,
    /// Where the key is minted.
    pub minted_at: Option<MintedAt>,
    /// For a UUID minted at the boundary: is it persisted before the first attempt?
    pub persisted_before_retries: Option<bool>,
}

/// Where a key's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    /// Built from business fields by a template.
    Business,
    /// A random UUID.
    Uuid,
    /// A hash of the message content (e.g. SQS FIFO content-based deduplication).
    ContentHash,
}

/// Where a key is minted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MintedAt {
    /// Once, where the intent becomes stable, before any retry loop.
    Boundary,
    /// Inside the retry loop: every attempt gets its own key.
    PerAttempt,
}

/// `[propagation]`: the dependencies the effect passes through.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Propagation {
    /// The header or attribute that carries the key downstream (informational).
    pub header: Option<String>,
    /// Every dependency called by the operation; `[]` says there are none.
    #[serde(default, rename = "dependency")]
    pub dependencies: Vec<Dependency>,
}

/// `[[propagation.dependency]]`: one downstream system.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dependency {
    /// Name, e.g. `"bank-provider"`.
    pub name: String,
    /// Does this dependency perform (part of) the business effect?
    pub performs_effect: bool,
    /// Is the key passed on to it?
    pub receives_key: bool,
    /// Does it deduplicate by the key it receives?
    pub dedups: bool,
    /// How long it remembers a key; required when `dedups = true`.
    pub dedup_window_s: Option<u64>,
}

/// `[fingerprint]`: what the fingerprint hashes and what the effect depends on.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fingerprint {
    /// Parts hashed, as dotted paths: `"method"`, `"path"`, `"body"`, `"header.x-tenant"`, `"attributes.currency"`.
    pub hashes: Vec<String>,
    /// Every input that changes the effect, in the same path form.
    pub effect_inputs: Vec<String>,
    /// Paths removed from the hash (e.g. `"body.trace_id"`); must not be effect inputs.
    #[serde(default)]
    pub excluded: Vec<String>,
    /// What happens when a key arrives with a different fingerprint.
    pub on_mismatch: OnMismatch,
}

/// Behaviour on same key, different fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMismatch {
    /// Rejected (422), no effect.
    Reject,
    /// The first request's stored result is returned.
    Replay,
    /// The request is executed anyway.
    Execute,
}

/// `[concurrency]`: a second attempt while the first is in flight.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Concurrency {
    /// What a concurrent attempt gets.
    pub in_flight: InFlight,
    /// How long a claim holds before it counts as abandoned.
    pub lease_ms: u64,
    /// The longest the upstream effect may take before the caller gives up.
    pub upstream_timeout_ms: u64,
    /// What happens to an `in_progress` record whose lease expired.
    pub on_lease_expiry: LeaseExpiry,
}

/// What a concurrent attempt gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlight {
    /// 409 with Retry-After.
    Reject,
    /// Waits for the first attempt's result.
    Wait,
    /// Runs alongside the first attempt.
    Execute,
}

/// What happens when a lease expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseExpiry {
    /// The record becomes `ambiguous` and is reconciled.
    Reconcile,
    /// The next attempt acquires it with a new token and runs the effect again.
    Takeover,
}

/// `[completion]`: whether the result is stored and replayed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Completion {
    /// Is the final result stored with the record?
    pub results_stored: bool,
    /// Does a caller read the result (an HTTP response), or only an acknowledgement (a queue consumer)?
    pub caller_reads_result: bool,
}

/// `[ambiguity]`: how an unknown outcome is resolved.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ambiguity {
    /// The reconciliation method.
    pub reconcile: Reconcile,
    /// For `provider_lookup`: the lookup request built from the key.
    pub lookup: Option<String>,
    /// Reconciler tries before an operator is asked.
    pub max_tries: Option<u32>,
}

/// How an unknown outcome is reconciled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reconcile {
    /// Ask the provider by the stable business reference.
    ProviderLookup,
    /// The effect and its record commit in one transaction: no unknown outcome exists.
    SameTransaction,
    /// The effect is written to an outbox in the record's transaction and relayed with the key.
    Outbox,
    /// An operator resolves each ambiguous record.
    Manual,
    /// The attempt is simply retried.
    Retry,
    /// Nothing is done.
    None,
}

/// `[retention]`: how long a record and its tombstone live, from the first claim.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Full record (with result) lifetime.
    pub retention_s: u64,
    /// Tombstone lifetime, counted from the first claim like `retention_s`.
    pub tombstone_s: u64,
}

/// `[scope]`: where a key is unique.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    /// The level at which records are kept and looked up.
    pub level: ScopeLevel,
}

/// Where records are kept and looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeLevel {
    /// In one process's memory.
    Process,
    /// Per tenant / credential, in a shared store.
    Tenant,
    /// Per queue (e.g. a FIFO queue's deduplication).
    Queue,
    /// Per region.
    Region,
    /// One key space everywhere.
    Global,
}

/// `[regions]`: regions, replication and where claims are accepted.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Regions {
    /// Region names; one name means a single-region deployment.
    pub names: Vec<String>,
    /// How the record store replicates between regions.
    pub replication: Replication,
    /// Where claims are accepted; required with more than one region.
    pub claims: Option<Claims>,
    /// Typical replication lag, for the trade-off text (informational).
    pub replication_lag_ms: Option<u64>,
}

/// Record store replication between regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Replication {
    /// No replication.
    None,
    /// Asynchronous: a write is acknowledged before the other region has it.
    Async,
    /// Synchronous: a write is acknowledged once every region has it.
    Sync,
}

/// Where claims are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Claims {
    /// Each key is routed to its home region; only it accepts claims.
    HomeRegion,
    /// Any region accepts a claim for any key (active-active).
    AnyRegion,
}

/// `[recovery]`: what a restore from backup brings back.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recovery {
    /// How records and business data are restored relative to each other.
    pub restore: Restore,
    /// Hours between two backups: the most a restore can lose.
    pub backup_interval_h: Option<u64>,
    /// A restore opens idem's suspect window (`idem store restore`, or
    /// `idem store mark-restored` after the operator's own restore), in
    /// which fresh keys are verified with the provider before they run.
    #[serde(default)]
    pub suspect_window: bool,
}

/// How records are restored relative to the business data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Restore {
    /// One backup, one point in time: records and data come back together.
    Together,
    /// Records are rolled back while the business data is not.
    RecordsWithoutData,
    /// Business data is rolled back while the records are not.
    DataWithoutRecords,
    /// Nothing is backed up.
    NoBackups,
}

/// `[replay]`: every source of another attempt. Each sub-table is required
/// (see [`crate::horizon`]); `{ enabled = false }` says a source does not exist.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaySources {
    /// Client and SDK retries.
    pub client: Option<ClientRetries>,
    /// Queue redelivery.
    pub queue: Option<QueueRedelivery>,
    /// Dead-letter queue and redrive practice.
    pub dlq: Option<DeadLetter>,
    /// Backlog recovery after a consumer outage.
    pub backlog: Option<Backlog>,
    /// Partner resubmission.
    pub partner: Option<Partner>,
    /// Batch reprocessing.
    pub batch: Option<Batch>,
    /// Failover catch-up.
    pub failover: Option<Failover>,
}

/// `[replay.client]`: client and SDK retries.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientRetries {
    /// `false` says there are no client retries; the other fields must then be absent.
    pub enabled: Option<bool>,
    /// Total attempts, including the first (≥ 1).
    pub attempts: Option<u32>,
    /// Per-attempt timeout.
    pub timeout_ms: Option<u64>,
    /// Longest backoff between two attempts.
    pub backoff_max_ms: Option<u64>,
}

/// `[replay.queue]`: at-least-once queue redelivery.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueRedelivery {
    /// `false` says no queue delivers this operation.
    pub enabled: Option<bool>,
    /// Visibility timeout: a received, unacknowledged message reappears after it.
    pub visibility_timeout_s: Option<u64>,
    /// Receives before the message moves to the DLQ (≥ 1).
    pub max_receives: Option<u32>,
}

/// `[replay.dlq]`: the dead-letter queue and its redrive practice.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetter {
    /// `false` says there is no DLQ.
    pub enabled: Option<bool>,
    /// How long the DLQ keeps a message.
    pub retention_s: Option<u64>,
    /// Who redrives, and when.
    pub redrive: Option<Redrive>,
    /// For `redrive = "automatic"`: delay before the automatic redrive.
    pub redrive_after_s: Option<u64>,
}

/// Redrive practice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Redrive {
    /// A person redrives: any time within the DLQ's retention.
    Manual,
    /// A job redrives after `redrive_after_s`.
    Automatic,
    /// Messages are never redriven.
    Never,
}

/// `[replay.backlog]`: delay before a message is first received after an outage.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backlog {
    /// `false` says there is no backlog (no queue, or consumers never stop).
    pub enabled: Option<bool>,
    /// Longest backlog recovery: outage plus drain time.
    pub recovery_max_s: Option<u64>,
}

/// `[replay.partner]`: a partner resubmits the same intent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Partner {
    /// `false` says no partner resubmits.
    pub enabled: Option<bool>,
    /// Latest resubmission after the intent.
    pub resubmission_window_s: Option<u64>,
}

/// `[replay.batch]`: a batch job is run again over past intents.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// `false` says no batch reprocessing happens.
    pub enabled: Option<bool>,
    /// Oldest intent a reprocessing run can include.
    pub reprocessing_window_s: Option<u64>,
}

/// `[replay.failover]`: attempts delayed by a failover.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failover {
    /// `false` says no failover delays attempts.
    pub enabled: Option<bool>,
    /// Longest time from failover to the last held-back attempt arriving.
    pub catch_up_s: Option<u64>,
}

/// `[testing]`: the failure cases the operation's tests exercise.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Testing {
    /// Cases covered by tests.
    pub covers: Vec<TestCase>,
}

/// A failure case a test can exercise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestCase {
    /// The same intent delivered twice.
    Duplicate,
    /// Two attempts at once.
    Concurrent,
    /// A timeout after the request was sent (unknown outcome).
    Ambiguous,
    /// Same key, different payload.
    FingerprintMismatch,
    /// A replay after retention (tombstone).
    LateReplay,
    /// A DLQ redrive.
    Redrive,
    /// A regional failover.
    Failover,
}

impl TestCase {
    /// The name as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            TestCase::Duplicate => "duplicate",
            TestCase::Concurrent => "concurrent",
            TestCase::Ambiguous => "ambiguous",
            TestCase::FingerprintMismatch => "fingerprint_mismatch",
            TestCase::LateReplay => "late_replay",
            TestCase::Redrive => "redrive",
            TestCase::Failover => "failover",
        }
    }
}

/// `enabled` defaults to true: a present section describes a real source.
pub(crate) fn on(enabled: Option<bool>) -> bool {
    enabled.unwrap_or(true)
}

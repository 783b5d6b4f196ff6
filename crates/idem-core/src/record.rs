//! What a store keeps per (scope, key): the record, its state, the fencing
//! token of the attempt that owns it, and the stored result.

use std::fmt;

use crate::{AmbiguityNote, Fingerprint, HeaderBytes, IdempotencyKey, Scope, Timestamp};

/// The largest stored response body, in bytes (docs/contract.md, "Policy and limits").
pub const RESULT_BODY_BYTES_MAX: usize = 1024 * 1024;
/// The most headers a stored result may keep.
pub const RESULT_HEADERS_MAX: usize = 64;
/// The largest single stored header (name plus value), in bytes.
pub const RESULT_HEADER_BYTES_MAX: usize = 8 * 1024;
/// The status of the result a record completes with when its attempt's
/// own answer cannot be stored ([`StoredResult::not_stored`]).
pub const RESULT_NOT_STORED_STATUS: u16 = 502;
/// The problem `type` of that result.
pub const RESULT_NOT_STORED_TYPE: &str = "urn:idem:problem:result-not-stored";
/// The problem title of that result.
pub const RESULT_NOT_STORED_TITLE: &str = "The result was too large to store";
/// The longest owner label, in bytes.
pub const OWNER_BYTES_MAX: usize = 255;
// A note names the owner as its node, within its own limit.
const _: () = assert!(crate::AMBIGUITY_NODE_BYTES_MAX == OWNER_BYTES_MAX);
/// The longest region name, in bytes.
pub const REGION_BYTES_MAX: usize = 64;
/// The longest resolution actor or reason, in bytes.
pub const RESOLUTION_TEXT_BYTES_MAX: usize = 4096;

/// Where a record lives: a key is unique within its scope.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct RecordId {
    /// The scope the key is unique in.
    pub scope: Scope,
    /// The key naming the intent.
    pub key: IdempotencyKey,
}

/// A fencing token: never handed out twice by a store, and compared for
/// equality, so an attempt holding an earlier token can never overwrite a
/// later one. Memory and SQLite also hand tokens out in increasing order;
/// PostgreSQL does one after another, but not always when a release and a
/// new claim of one key race (docs/stores.md).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Token(pub u64);

/// The state a record is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// An attempt holds the record under a lease.
    InProgress,
    /// The effect happened once; its result is stored and replayed.
    Completed,
    /// The outcome of the attempt is unknown; it waits for reconciliation.
    Ambiguous,
    /// Past retention: the result is gone, the fingerprint and completion time
    /// are kept so that a late replay is caught rather than executed.
    Tombstone,
}

/// A final result as it will be replayed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "UncheckedResult")]
pub struct StoredResult {
    status: u16,
    headers: Vec<(String, HeaderBytes)>,
    body: Vec<u8>,
}

/// A result as read from outside, checked by [`StoredResult::new`] before use.
#[derive(serde::Deserialize)]
struct UncheckedResult {
    status: u16,
    headers: Vec<(String, HeaderBytes)>,
    body: Vec<u8>,
}

impl TryFrom<UncheckedResult> for StoredResult {
    type Error = LimitError;
    fn try_from(r: UncheckedResult) -> Result<Self, LimitError> {
        StoredResult::new(r.status, r.headers, r.body)
    }
}

/// How an ambiguous record was resolved, and by whom.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resolution {
    /// What the resolver found.
    pub outcome: Outcome,
    /// Who or what resolved it (an operator, the reconciler).
    pub by: String,
    /// Why.
    pub reason: String,
    /// When (filled in by the store).
    pub at: Option<Timestamp>,
}

/// The finding of a resolution.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Outcome {
    /// The effect happened; this is its result. The record becomes `completed`.
    Completed {
        /// The result to store and replay.
        result: StoredResult,
    },
    /// The effect did not happen. The record is released so a retry may run.
    NotExecuted,
}

/// The most journal entries a store keeps per record: the oldest beyond
/// this are dropped when a resolution is appended.
pub const JOURNAL_PER_RECORD_MAX: usize = 100;

/// What a resolution found, as the journal keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolved {
    /// The effect happened; the record became `completed`.
    Completed,
    /// The effect did not happen; the record was released.
    NotExecuted,
}

/// One resolution of an ambiguous record, kept by the store in a journal
/// that outlives the record: a release (not executed), a purge or a new
/// acquisition of the key does not remove it. Written in the same atomic
/// step as the resolution itself.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct JournalEntry {
    /// The record resolved.
    pub id: RecordId,
    /// The token of the attempt whose outcome was unknown.
    pub token: Token,
    /// What the resolver found.
    pub outcome: Resolved,
    /// The stored result's status, when resolved as completed.
    pub status: Option<u16>,
    /// Who or what resolved it.
    pub by: String,
    /// Why.
    pub reason: String,
    /// When, by the store's clock.
    pub at: Timestamp,
    /// The operator's verb, when the entry is an `expire` or an `evict`
    /// rather than a resolution; `outcome` then says what the key is
    /// treated as afterwards (see [`crate::decision::apply_verb`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verb: Option<Verb>,
}

/// An operator's deliberate act on a key, apart from resolving it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verb {
    /// A completed record becomes a tombstone now: its answer is dropped,
    /// a late retry is caught (`key-expired`), never executed.
    Expire,
    /// The record, tombstone or not, is removed so that the intent may run
    /// again; refused while an attempt may still commit.
    Evict,
}

/// A [`Verb`] with who applies it and why, its texts checked.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VerbRequest {
    /// The verb.
    pub verb: Verb,
    /// Who applies it (an operator's name).
    pub by: String,
    /// Why: required, never empty.
    pub reason: String,
}

/// The failed provider lookups of one ambiguous attempt, kept by the store
/// beside its record so that every reconciler (a restarted gateway, the
/// next cron run of `idem reconcile --once`, another node) counts the same
/// tries and waits the same backoff. A store keeps at most one per record
/// and deletes it when the record is resolved, so there are never more
/// than there are ambiguous records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LookupTries {
    /// The attempt the lookups were about: a count never carries over to
    /// another attempt of the same key.
    pub token: Token,
    /// Failed lookups of that attempt, at least 1.
    pub failures: u32,
    /// When the next lookup may start (store clock).
    pub next_at: Timestamp,
}

/// One record: `(scope, key) → fingerprint, state, token, owner, region, lease, times, result`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// Scope and key.
    pub id: RecordId,
    /// The fingerprint of the request that acquired the key.
    pub fingerprint: Fingerprint,
    /// The stored state. See [`Record::state_at`] for the state at a time.
    pub state: State,
    /// The fencing token of the current acquisition.
    pub token: Token,
    /// A label of whoever holds or held the record.
    pub owner: String,
    /// The region of the attempt that acquired the record (a takeover
    /// records the taker's): `None` when that writer had no region
    /// configured, or the record was written before records kept one.
    #[serde(default)]
    pub region: Option<String>,
    /// When the lease of an `in_progress` record ends.
    pub lease_until: Timestamp,
    /// When the record was acquired.
    pub created_at: Timestamp,
    /// When the effect completed (or was resolved as completed).
    pub completed_at: Option<Timestamp>,
    /// When the result stops being replayed: completion + retention.
    pub expires_at: Option<Timestamp>,
    /// When the tombstone is dropped: completion + tombstone horizon.
    pub tombstone_until: Option<Timestamp>,
    /// Retention of the policy that acquired the record, in seconds.
    pub retention_s: u64,
    /// Tombstone horizon of the policy that acquired the record, in seconds.
    pub tombstone_s: u64,
    /// The stored result of a `completed` record.
    pub result: Option<StoredResult>,
    /// How the record was resolved, if it was ever ambiguous and resolved.
    pub resolution: Option<Resolution>,
    /// Why an `ambiguous` record is, as the attempt that marked it said
    /// ([`crate::Store::note_ambiguity`]): `None` when it said nothing (its
    /// lease ended first, or its store keeps no note). Dropped when the
    /// record completes.
    #[serde(default)]
    pub ambiguity: Option<AmbiguityNote>,
}

/// Why a result, owner or resolution text was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitError {
    /// Status outside 100..=599.
    BadStatus {
        /// The offered status.
        status: u16,
    },
    /// Body over [`RESULT_BODY_BYTES_MAX`].
    BodyTooLarge {
        /// Its size.
        bytes: usize,
    },
    /// More than [`RESULT_HEADERS_MAX`] headers, or one over [`RESULT_HEADER_BYTES_MAX`].
    HeadersTooLarge {
        /// What exactly.
        detail: String,
    },
    /// A text field holding a control character.
    ControlCharacter {
        /// Which field.
        field: &'static str,
    },
    /// A region name that is empty or holds a byte other than an ASCII
    /// letter, digit, `-`, `_` or `.`.
    BadRegion {
        /// The offered name.
        region: String,
    },
    /// A required text field that is empty (or only white space).
    Empty {
        /// Which field.
        field: &'static str,
    },
    /// A text field over its limit.
    TextTooLong {
        /// Which field.
        field: &'static str,
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
}

impl StoredResult {
    /// The result a record completes with when its attempt's answer was
    /// final but cannot be kept (a body over [`RESULT_BODY_BYTES_MAX`] or
    /// unreadable, headers over their limits): the effect happened, so the
    /// record must become final and never run again, and a replay must not
    /// pass an empty body off as the answer. A 502 problem document
    /// (`application/problem+json`, [`RESULT_NOT_STORED_TYPE`]) saying so
    /// and `why`; the gateway and the queue consumer both store it.
    pub fn not_stored(why: &str) -> StoredResult {
        let detail = format!(
            "the effect happened once and will not be repeated, but its response could not \
             be stored: {why}"
        );
        let body = serde_json::json!({
            "type": RESULT_NOT_STORED_TYPE,
            "title": RESULT_NOT_STORED_TITLE,
            "status": RESULT_NOT_STORED_STATUS,
            "detail": detail,
        })
        .to_string()
        .into_bytes();
        let headers = vec![(
            "content-type".to_owned(),
            HeaderBytes::from("application/problem+json"),
        )];
        // A `why` long enough to overflow the body limit loses the body, never the status.
        let body = if body.len() > RESULT_BODY_BYTES_MAX {
            Vec::new()
        } else {
            body
        };
        StoredResult {
            status: RESULT_NOT_STORED_STATUS,
            headers,
            body,
        }
    }

    /// A result to store, checked against the stored-response limits.
    pub fn new(
        status: u16,
        headers: Vec<(String, HeaderBytes)>,
        body: Vec<u8>,
    ) -> Result<StoredResult, LimitError> {
        if !(100..=599).contains(&status) {
            return Err(LimitError::BadStatus { status });
        }
        if body.len() > RESULT_BODY_BYTES_MAX {
            return Err(LimitError::BodyTooLarge { bytes: body.len() });
        }
        if headers.len() > RESULT_HEADERS_MAX {
            return Err(LimitError::HeadersTooLarge {
                detail: format!("{} headers; at most {RESULT_HEADERS_MAX}", headers.len()),
            });
        }
        if let Some((name, value)) = headers
            .iter()
            .find(|(n, v)| n.len() + v.len() > RESULT_HEADER_BYTES_MAX)
        {
            return Err(LimitError::HeadersTooLarge {
                detail: format!(
                    "header {name} is {} bytes; at most {RESULT_HEADER_BYTES_MAX}",
                    name.len() + value.len()
                ),
            });
        }
        Ok(StoredResult {
            status,
            headers,
            body,
        })
    }

    /// The response status.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The stored headers, in the order they were given; values are the
    /// bytes as given, UTF-8 or not.
    pub fn headers(&self) -> &[(String, HeaderBytes)] {
        &self.headers
    }

    /// The response body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }
}

impl Resolution {
    /// A resolution, its texts checked against their limits; the store sets `at`.
    pub fn new(outcome: Outcome, by: &str, reason: &str) -> Result<Resolution, LimitError> {
        check_text("resolved_by", by, RESOLUTION_TEXT_BYTES_MAX)?;
        check_text("reason", reason, RESOLUTION_TEXT_BYTES_MAX)?;
        Ok(Resolution {
            outcome,
            by: by.to_owned(),
            reason: reason.to_owned(),
            at: None,
        })
    }
}

impl VerbRequest {
    /// A verb, its texts checked: `reason` must not be empty, and both stay
    /// within [`RESOLUTION_TEXT_BYTES_MAX`].
    pub fn new(verb: Verb, by: &str, reason: &str) -> Result<VerbRequest, LimitError> {
        let request = VerbRequest {
            verb,
            by: by.to_owned(),
            reason: reason.to_owned(),
        };
        request.check_limits()?;
        Ok(request)
    }

    /// Checks `by` and `reason` again (the fields are public, so the
    /// decision checks before any store writes).
    pub fn check_limits(&self) -> Result<(), LimitError> {
        check_text("resolved_by", &self.by, RESOLUTION_TEXT_BYTES_MAX)?;
        check_text("reason", &self.reason, RESOLUTION_TEXT_BYTES_MAX)?;
        if self.reason.trim().is_empty() {
            return Err(LimitError::Empty { field: "reason" });
        }
        Ok(())
    }
}

impl Verb {
    /// The name as stored and shown: `expire` or `evict`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Expire => "expire",
            Verb::Evict => "evict",
        }
    }

    /// The past tense a journal line reads: `expired` or `evicted`.
    pub fn past(self) -> &'static str {
        match self {
            Verb::Expire => "expired",
            Verb::Evict => "evicted",
        }
    }
}

impl std::str::FromStr for Verb {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "expire" => Ok(Verb::Expire),
            "evict" => Ok(Verb::Evict),
            other => Err(format!("unknown verb {other:?}; expected expire or evict")),
        }
    }
}

impl Resolution {
    /// Checks `by` and `reason` against their limits (the fields are public,
    /// so stores check again before writing).
    pub fn check_limits(&self) -> Result<(), LimitError> {
        check_text("resolved_by", &self.by, RESOLUTION_TEXT_BYTES_MAX)?;
        check_text("reason", &self.reason, RESOLUTION_TEXT_BYTES_MAX)
    }
}

impl Record {
    /// The state at `now`: a `completed` record past `expires_at` is a
    /// tombstone whether or not the purge has dropped its result yet.
    pub fn state_at(&self, now: Timestamp) -> State {
        match (self.state, self.expires_at) {
            (State::Completed, Some(expires_at)) if now >= expires_at => State::Tombstone,
            (state, _) => state,
        }
    }

    /// Whether the attempt holding this record may still commit its effect
    /// at `now`: it is `in_progress` or `ambiguous` and its lease has not
    /// ended. Until then no verdict or verb may act as if it never ran
    /// (`decision::resolve`'s "not executed", `decision::apply_verb`'s
    /// evict), and the console offers neither.
    pub fn may_still_commit(&self, now: Timestamp) -> bool {
        matches!(self.state, State::InProgress | State::Ambiguous) && now < self.lease_until
    }
}

/// Checks an owner label: at most [`OWNER_BYTES_MAX`] bytes, no control
/// characters (every store must be able to keep it as text).
pub fn check_owner(owner: &str) -> Result<(), LimitError> {
    check_text("owner", owner, OWNER_BYTES_MAX)?;
    if owner.chars().any(char::is_control) {
        return Err(LimitError::ControlCharacter { field: "owner" });
    }
    Ok(())
}

/// Checks a region name: 1 to [`REGION_BYTES_MAX`] bytes of ASCII letters,
/// digits, `-`, `_` and `.` (`eu-west`, `us_east.2`), so that it reads the
/// same in every store, header, log line and table column.
pub fn check_region(region: &str) -> Result<(), LimitError> {
    check_text("region", region, REGION_BYTES_MAX)?;
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    if region.is_empty() || !region.bytes().all(allowed) {
        return Err(LimitError::BadRegion {
            region: region.to_owned(),
        });
    }
    Ok(())
}

fn check_text(field: &'static str, text: &str, max: usize) -> Result<(), LimitError> {
    if text.len() > max {
        return Err(LimitError::TextTooLong {
            field,
            bytes: text.len(),
            max,
        });
    }
    Ok(())
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl State {
    /// The state's name as stored and shown: `in_progress`, `completed`, …
    pub fn as_str(self) -> &'static str {
        match self {
            State::InProgress => "in_progress",
            State::Completed => "completed",
            State::Ambiguous => "ambiguous",
            State::Tombstone => "tombstone",
        }
    }
}

impl std::str::FromStr for State {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "in_progress" => Ok(State::InProgress),
            "completed" => Ok(State::Completed),
            "ambiguous" => Ok(State::Ambiguous),
            "tombstone" => Ok(State::Tombstone),
            other => Err(format!(
                "unknown state {other:?}; expected in_progress, completed, ambiguous or tombstone"
            )),
        }
    }
}

impl Resolved {
    /// The name as stored and shown: `completed` or `not_executed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolved::Completed => "completed",
            Resolved::NotExecuted => "not_executed",
        }
    }
}

impl std::str::FromStr for Resolved {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "completed" => Ok(Resolved::Completed),
            "not_executed" => Ok(Resolved::NotExecuted),
            other => Err(format!(
                "unknown resolution outcome {other:?}; expected completed or not_executed"
            )),
        }
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.scope, self.key)
    }
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::BadStatus { status } => {
                write!(f, "status {status} is not an HTTP status (100-599)")
            }
            LimitError::BodyTooLarge { bytes } => write!(
                f,
                "result body is {bytes} bytes; at most {RESULT_BODY_BYTES_MAX} can be stored"
            ),
            LimitError::HeadersTooLarge { detail } => write!(f, "result headers: {detail}"),
            LimitError::ControlCharacter { field } => {
                write!(f, "{field} contains a control character")
            }
            LimitError::BadRegion { region } => write!(
                f,
                "region {region:?} is not a region name: use 1 to {REGION_BYTES_MAX} ASCII \
                 letters, digits, '-', '_' or '.'"
            ),
            LimitError::Empty { field } => write!(f, "{field} must not be empty"),
            LimitError::TextTooLong { field, bytes, max } => {
                write!(f, "{field} is {bytes} bytes; at most {max} are allowed")
            }
        }
    }
}

impl std::error::Error for LimitError {}

//! The `Store` trait: apply the decision functions of [`crate::decision`]
//! atomically to one record, against the store's own clock.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::decision::{Claim, ClaimRequest};
use crate::record::{
    JournalEntry, LimitError, Record, RecordId, Resolution, State, StoredResult, Token,
};

/// The future every store operation returns. Boxed so that `dyn Store` works
/// and the core needs no async runtime; a store that answers at once (the
/// memory store) returns a ready future.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The most records one `list` or `purge` call handles.
pub const LIST_LIMIT_MAX: usize = 10_000;

/// A durable map of records that applies the shared decision atomically.
///
/// Every method evaluates time against the store's clock. Implementations
/// must pass the conformance suite in `idem-conformance`.
pub trait Store: Send + Sync {
    /// Claims (scope, key) for one attempt: one atomic decision.
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, Claim>;

    /// Stores the final result of the attempt holding `token`.
    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        result: StoredResult,
    ) -> StoreFuture<'a, Record>;

    /// Removes the record of the attempt holding `token` (not processed).
    fn release<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, ()>;

    /// Marks the record of the attempt holding `token` as outcome unknown.
    fn mark_ambiguous<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, Record>;

    /// Resolves an ambiguous record; returns the completed record, or `None`
    /// when it was released as not executed. A resolution that succeeds
    /// appends exactly one [`JournalEntry`] (the one `decision::resolve`
    /// returns) in the same atomic step as the record's write; one that is
    /// refused appends nothing.
    fn resolve<'a>(
        &'a self,
        id: &'a RecordId,
        resolution: Resolution,
    ) -> StoreFuture<'a, Option<Record>>;

    /// The resolution journal of (scope, key), oldest first: every
    /// resolution of every ambiguity episode of the key, whether the record
    /// still exists or not. The journal is small and the purge leaves it
    /// alone; each store keeps at most the last
    /// [`JOURNAL_PER_RECORD_MAX`](crate::JOURNAL_PER_RECORD_MAX)
    /// entries per record, dropping the oldest on append.
    fn resolutions<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Vec<JournalEntry>>;

    /// The record, as stored.
    fn get<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Option<Record>>;

    /// Records in (scope, key) order, optionally only those in one state at
    /// the store's current time.
    fn list<'a>(&'a self, query: &'a ListQuery) -> StoreFuture<'a, Vec<Record>>;

    /// Turns completed records past retention into tombstones and deletes
    /// tombstones past their horizon, changing at most `limit` records in all
    /// (capped at [`LIST_LIMIT_MAX`]; 0 changes nothing). Call it until the
    /// report is empty to catch up.
    fn purge(&self, limit: usize) -> StoreFuture<'_, PurgeReport>;
}

/// Which records `list` returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Only records in this state (at the store's current time).
    pub state: Option<State>,
    /// Only records after this one in (scope, key) order: a cursor.
    pub after: Option<RecordId>,
    /// At most this many, capped at [`LIST_LIMIT_MAX`]; 0 means the cap.
    pub limit: usize,
}

impl ListQuery {
    /// The limit to apply: `limit`, or [`LIST_LIMIT_MAX`] if 0 or larger.
    pub fn effective_limit(&self) -> usize {
        if self.limit == 0 {
            LIST_LIMIT_MAX
        } else {
            self.limit.min(LIST_LIMIT_MAX)
        }
    }
}

/// What a purge did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PurgeReport {
    /// Completed records past retention whose result was dropped.
    pub tombstoned: u64,
    /// Tombstones past their horizon that were deleted.
    pub deleted: u64,
}

/// What went wrong in a store, and what the caller can do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// No record for this (scope, key).
    NotFound {
        /// The record asked for.
        id: RecordId,
    },
    /// The token presented is not the current owner of an `in_progress`
    /// record: a newer attempt took over, the record was marked ambiguous or
    /// removed. The write was refused; the caller must not act as the owner.
    Fenced {
        /// The record.
        id: RecordId,
        /// The token presented.
        presented: Token,
        /// The record's current token and state, if it still exists.
        current: Option<(Token, State)>,
    },
    /// The operation does not apply to a record in this state.
    WrongState {
        /// The record.
        id: RecordId,
        /// Its state.
        state: State,
        /// The operation refused.
        operation: &'static str,
    },
    /// A value over one of the contract's limits.
    Limit(LimitError),
    /// The store cannot be reached or written right now. The operation may
    /// or may not have been applied (a networked store can lose the reply to
    /// a commit), so the caller must neither act as an owner nor assume the
    /// write is absent: fail closed, and let a later claim decide.
    Unavailable {
        /// What is unavailable (a path, a host).
        store: String,
        /// Why.
        reason: String,
    },
    /// The store stopped working for good in this process (a worker thread
    /// it cannot do without died): every later operation fails the same
    /// way. As with `Unavailable`, the operation may or may not have been
    /// applied. Retrying is useless; reopen the store, or let the process
    /// exit so that a supervisor restarts it (`idem serve` does).
    Stopped {
        /// What stopped (a path).
        store: String,
        /// Why, as far as is known.
        reason: String,
    },
    /// The store holds data this version cannot read (a newer schema, a
    /// foreign file, a damaged row). Needs a person.
    Incompatible {
        /// What (a path, a host).
        store: String,
        /// Why, and what to do.
        reason: String,
    },
}

impl StoreError {
    /// A store written by a newer idem than this one: refused, never
    /// migrated backwards.
    pub fn newer_schema(store: &str, version: i64, supported: i64) -> StoreError {
        StoreError::Incompatible {
            store: store.to_owned(),
            reason: format!(
                "schema version {version} is newer than this idem supports ({supported}); \
                 upgrade idem"
            ),
        }
    }

    /// True when retrying later may succeed (the store was unavailable).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }
}

impl From<LimitError> for StoreError {
    fn from(e: LimitError) -> Self {
        StoreError::Limit(e)
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::NotFound { id } => write!(
                f,
                "no record for scope {:?} key {:?}",
                id.scope.as_str(),
                id.key.as_str()
            ),
            StoreError::Fenced {
                id,
                presented,
                current,
            } => {
                write!(
                    f,
                    "token {presented} no longer owns scope {:?} key {:?}",
                    id.scope.as_str(),
                    id.key.as_str()
                )?;
                match current {
                    Some((token, state)) => {
                        write!(f, " (the record is {state} with token {token})")
                    }
                    None => f.write_str(" (the record no longer exists)"),
                }
            }
            StoreError::WrongState {
                id,
                state,
                operation,
            } => write!(
                f,
                "cannot {operation} scope {:?} key {:?}: the record is {state}",
                id.scope.as_str(),
                id.key.as_str()
            ),
            StoreError::Limit(e) => e.fmt(f),
            StoreError::Unavailable { store, reason } => {
                write!(f, "store {store} is unavailable: {reason}")
            }
            StoreError::Stopped { store, reason } => {
                write!(f, "store {store} stopped for good: {reason}")
            }
            StoreError::Incompatible { store, reason } => {
                write!(f, "store {store} cannot be used: {reason}")
            }
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Limit(e) => Some(e),
            _ => None,
        }
    }
}

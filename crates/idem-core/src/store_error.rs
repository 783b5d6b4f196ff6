//! What went wrong in a store ([`StoreError`]), apart from the [`Store`]
//! trait so that the parts the trait is made of (the suspect window, the
//! lookups' verdicts) can name it without importing the trait.
//!
//! [`Store`]: crate::Store

use std::fmt;

use crate::Timestamp;
use crate::record::{LimitError, RecordId, State, Token};

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
    /// A "not executed" verdict about an attempt that may still commit: its
    /// lease runs until `until`, and the upstream may still be processing
    /// the request. Nothing was changed; ask again after `until`.
    MayStillCommit {
        /// The record.
        id: RecordId,
        /// The attempt the verdict was about.
        token: Token,
        /// When the attempt's lease ends (store clock).
        until: Timestamp,
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
            StoreError::MayStillCommit { id, token, until } => write!(
                f,
                "the attempt holding token {token} of scope {:?} key {:?} may still commit \
                 until its lease ends ({} ms since the epoch, store clock); \"not executed\" \
                 is accepted only after that",
                id.scope.as_str(),
                id.key.as_str(),
                until.as_millis()
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

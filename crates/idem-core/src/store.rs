//! The `Store` trait: apply the decision functions of [`crate::decision`]
//! atomically to one record, against the store's own clock.

use std::future::Future;
use std::pin::Pin;

use crate::decision::{Claim, ClaimRequest};
use crate::record::{
    JournalEntry, LookupTries, Record, RecordId, Resolution, State, StoredResult, Token,
    VerbRequest,
};
use crate::store_error::StoreError;
use crate::window::{SuspectWindow, WindowOpening};
use crate::{AmbiguityNote, Timestamp};

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

    /// Keeps `note`, why the record of the attempt holding `token` is
    /// ambiguous ([`crate::decision::note_ambiguity`]), in
    /// [`Record::ambiguity`]: written after [`Store::mark_ambiguous`] by
    /// the same attempt. Refused, nothing written, when the record is gone,
    /// belongs to another attempt or is not ambiguous: a note about an
    /// attempt that moved on is dropped. The default keeps no note and
    /// answers `Ok`: a store without a place for it loses only the note.
    fn note_ambiguity<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        note: AmbiguityNote,
    ) -> StoreFuture<'a, ()> {
        let _ = (id, token, note);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Resolves an ambiguous record; returns the completed record, or `None`
    /// when it was released as not executed. A resolution that succeeds
    /// appends exactly one [`JournalEntry`] (the one `decision::resolve`
    /// returns) and deletes the record's [`LookupTries`] in the same atomic
    /// step as the record's write; one that is refused changes nothing.
    ///
    /// The verdict is about the attempt holding `token` and is refused
    /// ([`StoreError::Fenced`]) when the record now belongs to another
    /// attempt; "not executed" is refused ([`StoreError::MayStillCommit`])
    /// until that attempt's lease has ended (see [`crate::decision::resolve`]).
    fn resolve<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        resolution: Resolution,
    ) -> StoreFuture<'a, Option<Record>>;

    /// Applies an operator's verb ([`crate::decision::apply_verb`]) to the
    /// record of the attempt holding `token`: `expire` returns the
    /// tombstone it left, `evict` returns `None` (the record is gone). A
    /// verb that succeeds appends exactly one [`JournalEntry`] and deletes
    /// the record's [`LookupTries`] in the same atomic step as the record's
    /// write; one that is refused ([`StoreError::NotFound`],
    /// [`StoreError::Fenced`], [`StoreError::WrongState`],
    /// [`StoreError::MayStillCommit`], [`StoreError::Limit`]) changes
    /// nothing. The journal keeps the entry after the record is evicted,
    /// as it does after a purge.
    fn apply_verb<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        request: VerbRequest,
    ) -> StoreFuture<'a, Option<Record>>;

    /// Counts one failed provider lookup of the ambiguous attempt holding
    /// `token` and keeps `next_at`, the earliest time of its next lookup:
    /// [`crate::decision::note_failed_lookup`] applied atomically to the
    /// record and its kept tries. Returns the tries now kept. Refused,
    /// nothing written, when the record is gone, belongs to another attempt
    /// or is no longer ambiguous.
    fn note_failed_lookup<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        next_at: Timestamp,
    ) -> StoreFuture<'a, LookupTries>;

    /// The failed lookups kept for the attempt holding `token` of `id`
    /// (through [`crate::decision::tries_of_attempt`]): `None` when none
    /// failed, or the kept tries are about another attempt.
    fn lookup_tries<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
    ) -> StoreFuture<'a, Option<LookupTries>>;

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
    /// the store's current time. A row this version cannot read is reported
    /// in [`Listing::damaged`] and the scan goes on past it: one bad row never
    /// stops a listing, a purge or a reconciler sweep for every other tenant.
    fn list<'a>(&'a self, query: &'a ListQuery) -> StoreFuture<'a, Listing>;

    /// Turns completed records past retention into tombstones and deletes
    /// tombstones past their horizon, changing at most `limit` records in all
    /// (capped at [`LIST_LIMIT_MAX`]; 0 changes nothing). Call it until the
    /// report is empty to catch up. The records changed are the first in
    /// the order of [`decision::purge_due`] (the longest due first), then
    /// (scope, key): every store changes the same ones, and a store can
    /// find them through an index on the due instant instead of scanning
    /// past everything it already purged.
    ///
    /// [`decision::purge_due`]: crate::decision::purge_due
    fn purge(&self, limit: usize) -> StoreFuture<'_, PurgeReport>;

    /// Says that a request waits for the attempt holding `id`, so that a
    /// store shared by several processes tells whoever listens
    /// ([`Store::on_completed`]) when that record completes. The mark goes
    /// with the record, so it needs no expiry of its own. A store used by
    /// one process needs nothing: the process wakes its own waiters. The
    /// default does nothing.
    fn note_waiting<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, ()> {
        let _ = id;
        Box::pin(std::future::ready(Ok(())))
    }

    /// Registers `wake`, to be called with each record that completed in
    /// any process sharing this store and that a request noted waiting on
    /// ([`Store::note_waiting`]). The default never calls it.
    fn on_completed(&self, wake: WakeFn) {
        let _ = wake;
    }

    /// The suspect window the store keeps ([`crate::window`]), open or
    /// closed; `None` when none was ever opened. The default keeps none.
    fn suspect_window(&self) -> StoreFuture<'_, Option<SuspectWindow>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Opens the suspect window, or extends the open one
    /// ([`SuspectWindow::opened`] applied atomically against the store's
    /// clock), and returns it. The default refuses: the store keeps none.
    fn open_suspect_window<'a>(
        &'a self,
        opening: &'a WindowOpening,
    ) -> StoreFuture<'a, SuspectWindow> {
        let _ = opening;
        Box::pin(std::future::ready(Err(StoreError::Incompatible {
            store: "this store".into(),
            reason: "it keeps no suspect window".into(),
        })))
    }

    /// Registers `opened`, to be called with each window this store opens
    /// by itself (a PostgreSQL store that finds itself on a promoted
    /// server), before the connection that found it is used. The default
    /// never calls it.
    fn on_window_opened(&self, opened: WindowFn) {
        let _ = opened;
    }

    /// What this store was asked to watch for by itself on its server
    /// ([`Watch`]), and whether the server lets it: a PostgreSQL store on
    /// an engine that refuses what a watch takes runs without it and says
    /// so here, and a readiness probe names each. The default watches
    /// nothing.
    fn watches(&self) -> Vec<(Watch, Watching)> {
        Vec::new()
    }
}

/// Something a store shared by several processes notices by itself, when
/// asked to and when its server allows it ([`Store::watches`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Watch {
    /// A server that is not the one written to before (a promoted standby,
    /// a restore), which opens the suspect window. Off, only an operator
    /// opens it (`idem store mark-restored`).
    Promotion,
    /// Completions in other processes of records a request here waits
    /// on, which wake the waiters at once. Off, waiters learn of them at
    /// their next poll ([`crate::WAIT_POLL_MS`]).
    Completions,
}

impl Watch {
    /// Its name, as a readiness probe says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Watch::Promotion => "promotion_check",
            Watch::Completions => "completion_notices",
        }
    }
}

/// Whether a [`Watch`] is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Watching {
    /// It is.
    Active,
    /// It is not: the server refused what it takes.
    Off {
        /// What was refused, and what is lost.
        reason: String,
    },
}

/// What [`Store::on_window_opened`] calls with the window opened.
pub type WindowFn = std::sync::Arc<dyn Fn(&SuspectWindow) + Send + Sync>;

/// What [`Store::on_completed`] calls with a completed record's id.
pub type WakeFn = std::sync::Arc<dyn Fn(&RecordId) + Send + Sync>;

/// Which records `list` returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Only records in this state (at the store's current time).
    pub state: Option<State>,
    /// Only rows after this position in (scope, key) order: a cursor, usually
    /// the [`Listing::next`] of the previous page.
    pub after: Option<ListCursor>,
    /// At most this many rows, capped at [`LIST_LIMIT_MAX`]; 0 means the cap.
    /// Damaged rows count: a page never reads more than this.
    pub limit: usize,
}

/// A position in (scope, key) order. It is raw text, not a [`RecordId`],
/// because the last row a page read may be one that cannot be decoded into
/// valid types, and the next page must still start after it.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ListCursor {
    /// The scope's text.
    pub scope: String,
    /// The key's own text.
    pub key: String,
}

/// One page of [`Store::list`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// The records read, in (scope, key) order.
    pub records: Vec<Record>,
    /// Rows in the page that this version cannot read, in (scope, key) order.
    pub damaged: Vec<DamagedRow>,
    /// Where the next page starts, or `None` when this page reached the end.
    pub next: Option<ListCursor>,
}

/// A stored row that cannot be decoded: where it is and why. It needs a
/// person (`idem records show` names it); every other row stays usable.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DamagedRow {
    /// The row's scope, as stored (lossily decoded if it is not UTF-8).
    pub scope: String,
    /// The row's key, as stored (lossily decoded if it is not UTF-8).
    pub key: String,
    /// What cannot be read.
    pub reason: String,
}

impl From<&RecordId> for ListCursor {
    fn from(id: &RecordId) -> Self {
        ListCursor {
            scope: id.scope.as_str().to_owned(),
            key: id.key.as_str().to_owned(),
        }
    }
}

impl From<RecordId> for ListCursor {
    fn from(id: RecordId) -> Self {
        ListCursor::from(&id)
    }
}

impl ListCursor {
    /// True when `id` comes after this position in (scope, key) byte order.
    pub fn precedes(&self, id: &RecordId) -> bool {
        (self.scope.as_bytes(), self.key.as_bytes())
            < (id.scope.as_str().as_bytes(), id.key.as_str().as_bytes())
    }
}

impl Listing {
    /// A page of `rows` read in order: `next` is the last row's position
    /// when the page is full (`rows == limit`), else `None`.
    pub fn page(
        records: Vec<Record>,
        damaged: Vec<DamagedRow>,
        last: Option<ListCursor>,
        rows: usize,
        limit: usize,
    ) -> Listing {
        Listing {
            records,
            damaged,
            next: if rows >= limit { last } else { None },
        }
    }
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
    /// Candidate rows that cannot be read and were left alone (see
    /// [`DamagedRow`]); `idem records list` names them.
    pub damaged: u64,
}

impl PurgeReport {
    /// True when the purge changed nothing, so a catch-up loop may stop.
    /// Damaged rows do not count: they stay until a person repairs them.
    pub fn changed_nothing(&self) -> bool {
        self.tombstoned == 0 && self.deleted == 0
    }
}

//! The memory store: the shared decision over a `BTreeMap`, for tests and the
//! simulator. Nothing survives the process; every answer is immediate.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::AmbiguityNote;
use crate::decision::{self, Claim, ClaimRequest, Write};
use crate::record::{
    JOURNAL_PER_RECORD_MAX, JournalEntry, LookupTries, Record, RecordId, Resolution, StoredResult,
    Token, VerbRequest,
};
use crate::store::{ListCursor, ListQuery, Listing, PurgeReport, Store, StoreFuture};
use crate::store_error::StoreError;
use crate::window::{SuspectWindow, WindowOpening};
use crate::{Clock, State, Timestamp};

/// An in-memory [`Store`] with an injected clock.
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    records: BTreeMap<RecordId, Record>,
    last_token: u64,
    /// The resolution journal per record, oldest first; never purged.
    journal: BTreeMap<RecordId, VecDeque<JournalEntry>>,
    /// Failed lookups per ambiguous record; removed when it is resolved.
    tries: BTreeMap<RecordId, LookupTries>,
    /// The suspect window, once one was opened.
    window: Option<SuspectWindow>,
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore {
            clock,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied write:
        // every write below is a single map operation.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A decision that writes the record and appends to its journal,
    /// under one lock, clearing its failed lookups: a resolution or a
    /// verb. Returns the record written, or `None` when it was removed.
    fn journaled(
        &self,
        id: &RecordId,
        decide: impl FnOnce(Option<&Record>, Timestamp) -> Result<(Write, JournalEntry), StoreError>,
    ) -> Result<Option<Record>, StoreError> {
        let mut inner = self.lock();
        let now = self.clock.now();
        let Inner {
            records,
            journal,
            tries,
            ..
        } = &mut *inner;
        let (write, entry) = decide(records.get(id), now)?;
        let out = match &write {
            Write::Put(r) => Some(r.clone()),
            _ => None,
        };
        apply(records, id, write);
        tries.remove(id);
        append(journal, id, entry);
        Ok(out)
    }

    fn with_record<T>(
        &self,
        id: &RecordId,
        f: impl FnOnce(Option<&Record>, Timestamp) -> Result<(T, Write), StoreError>,
    ) -> Result<T, StoreError> {
        let mut inner = self.lock();
        let now = self.clock.now();
        let (out, write) = f(inner.records.get(id), now)?;
        apply(&mut inner.records, id, write);
        Ok(out)
    }
}

fn apply(records: &mut BTreeMap<RecordId, Record>, id: &RecordId, write: Write) {
    match write {
        Write::None => {}
        Write::Put(record) => {
            records.insert(id.clone(), record);
        }
        Write::Delete => {
            records.remove(id);
        }
    }
}

/// Appends `entry` to the journal of `id`, keeping the newest
/// [`JOURNAL_PER_RECORD_MAX`].
fn append(
    journal: &mut BTreeMap<RecordId, VecDeque<JournalEntry>>,
    id: &RecordId,
    entry: JournalEntry,
) {
    let entries = journal.entry(id.clone()).or_default();
    entries.push_back(entry);
    while entries.len() > JOURNAL_PER_RECORD_MAX {
        entries.pop_front();
    }
}

fn ready<'a, T: Send + 'a>(value: Result<T, StoreError>) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(value))
}

impl Store for MemoryStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, Claim> {
        if let Err(e) = req.check_labels() {
            return ready(Err(e.into()));
        }
        let mut inner = self.lock();
        let now = self.clock.now();
        let Inner {
            records,
            last_token,
            ..
        } = &mut *inner;
        let (claim, write) = decision::claim(records.get(&req.id), req, now, || {
            *last_token += 1;
            Token(*last_token)
        });
        apply(records, &req.id, write);
        ready(Ok(claim))
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        result: StoredResult,
    ) -> StoreFuture<'a, Record> {
        ready(self.with_record(id, |existing, now| {
            let done = decision::complete(existing, id, token, result, now)?;
            Ok((done.clone(), Write::Put(done)))
        }))
    }

    fn release<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, ()> {
        ready(self.with_record(id, |existing, now| {
            decision::release(existing, id, token, now)?;
            Ok(((), Write::Delete))
        }))
    }

    fn mark_ambiguous<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, Record> {
        ready(self.with_record(id, |existing, now| {
            let marked = decision::mark_ambiguous(existing, id, token, now)?;
            Ok((marked.clone(), Write::Put(marked)))
        }))
    }

    fn note_ambiguity<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        note: AmbiguityNote,
    ) -> StoreFuture<'a, ()> {
        ready(self.with_record(id, |existing, now| {
            let noted = decision::note_ambiguity(existing, id, token, note, now)?;
            Ok(((), Write::Put(noted)))
        }))
    }

    fn resolve<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        resolution: Resolution,
    ) -> StoreFuture<'a, Option<Record>> {
        ready(self.journaled(id, |existing, now| {
            decision::resolve(existing, id, token, resolution, now)
        }))
    }

    fn apply_verb<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        request: VerbRequest,
    ) -> StoreFuture<'a, Option<Record>> {
        ready(self.journaled(id, |existing, now| {
            decision::apply_verb(existing, id, token, &request, now)
        }))
    }

    fn note_failed_lookup<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        next_at: Timestamp,
    ) -> StoreFuture<'a, LookupTries> {
        let mut inner = self.lock();
        let now = self.clock.now();
        let Inner { records, tries, .. } = &mut *inner;
        let noted =
            decision::note_failed_lookup(records.get(id), tries.get(id), id, token, next_at, now);
        if let Ok(noted) = noted {
            tries.insert(id.clone(), noted);
        }
        ready(noted)
    }

    fn lookup_tries<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
    ) -> StoreFuture<'a, Option<LookupTries>> {
        let inner = self.lock();
        ready(Ok(decision::tries_of_attempt(inner.tries.get(id), token)))
    }

    fn resolutions<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Vec<JournalEntry>> {
        let inner = self.lock();
        let entries = inner
            .journal
            .get(id)
            .map(|e| e.iter().cloned().collect())
            .unwrap_or_default();
        ready(Ok(entries))
    }

    fn get<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Option<Record>> {
        ready(Ok(self.lock().records.get(id).cloned()))
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> StoreFuture<'a, Listing> {
        let inner = self.lock();
        let now = self.clock.now();
        let limit = query.effective_limit();
        // The memory store holds only valid records, so nothing is damaged.
        let records: Vec<Record> = inner
            .records
            .iter()
            .filter(|(id, _)| query.after.as_ref().is_none_or(|after| after.precedes(id)))
            .map(|(_, r)| r)
            .filter(|r| query.state.is_none_or(|s| r.state_at(now) == s))
            .take(limit)
            .cloned()
            .collect();
        let last = records.last().map(|r| ListCursor::from(&r.id));
        let rows = records.len();
        ready(Ok(Listing::page(records, Vec::new(), last, rows, limit)))
    }

    fn purge(&self, limit: usize) -> StoreFuture<'_, PurgeReport> {
        let mut inner = self.lock();
        let now = self.clock.now();
        let mut report = PurgeReport::default();
        let mut writes: Vec<(Option<Timestamp>, RecordId, Write)> = inner
            .records
            .iter()
            .filter(|(_, r)| r.state_at(now) == State::Tombstone)
            .map(|(id, r)| (decision::purge_due(r), id.clone(), decision::purge(r, now)))
            .filter(|(_, _, w)| *w != Write::None)
            .collect();
        // The longest due first, then (scope, key): the map iterates in
        // (scope, key) order and the sort is stable.
        writes.sort_by_key(|(due, _, _)| *due);
        writes.truncate(limit.min(crate::store::LIST_LIMIT_MAX));
        for (_, id, write) in writes {
            match write {
                Write::Delete => report.deleted += 1,
                Write::Put(_) => report.tombstoned += 1,
                Write::None => {}
            }
            apply(&mut inner.records, &id, write);
        }
        ready(Ok(report))
    }

    fn suspect_window(&self) -> StoreFuture<'_, Option<SuspectWindow>> {
        ready(Ok(self.lock().window.clone()))
    }

    fn open_suspect_window<'a>(
        &'a self,
        opening: &'a WindowOpening,
    ) -> StoreFuture<'a, SuspectWindow> {
        let mut inner = self.lock();
        let window = SuspectWindow::opened(inner.window.as_ref(), opening, self.clock.now());
        inner.window = Some(window.clone());
        ready(Ok(window))
    }
}

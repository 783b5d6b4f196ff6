//! The [`Store`] operations: each one [`DynamoStore::modify`] of one item,
//! decided by [`idem_core::decision`].

use idem_core::decision::{self, Claim, ClaimRequest, Plan, Write};
use idem_core::{
    AmbiguityNote, JournalEntry, ListQuery, Listing, LookupTries, Outcome, PurgeReport, Record,
    RecordId, Resolution, State, Store, StoreError, StoreFuture, StoredResult, SuspectWindow,
    Timestamp, Token, Verb, VerbRequest, Watch, Watching, WindowOpening,
};

use crate::item::{self, Item};
use crate::table::WriteRefused;
use crate::{DynamoStore, MODIFY_TRIES, record_of, write_id};

/// What a decision asks of the item. It lives for one decision and is
/// written at once; boxing the item would only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Change {
    /// Nothing.
    Keep,
    /// Write this item.
    Put(Item),
    /// Delete the item.
    Delete,
}

/// What one decision over an item found.
type Decided<T> = Result<(T, Change), StoreError>;

impl DynamoStore {
    /// Reads `id`'s item (or starts from `guess`), decides with `decide`,
    /// writes the change under a condition on the version decided on, and
    /// decides again on what it finds when the condition fails. A decision
    /// reached on a guess that writes nothing is checked against a fresh
    /// read first: a guess may be out of date. A write that meets itself
    /// (its answer was lost and it was sent again) is recognised by its
    /// write id.
    async fn modify<T>(
        &self,
        id: &RecordId,
        guess: Option<Item>,
        decide: impl Fn(&Item, Timestamp, Timestamp) -> Decided<T>,
    ) -> Result<T, StoreError> {
        let pk = item::pk_of(id);
        let (mut current, mut guessed) = match guess {
            Some(item) => (item, true),
            None => (self.read(id).await?, false),
        };
        for _ in 0..MODIFY_TRIES {
            let (now, judged) = self.times();
            let decided = decide(&current, now, judged);
            if guessed && !matches!(decided, Ok((_, Change::Put(_) | Change::Delete))) {
                current = self.read(id).await?;
                guessed = false;
                continue;
            }
            let (out, change) = decided?;
            let wid = write_id()?;
            let sent = match &change {
                Change::Keep => {
                    self.remember(id, &current);
                    return Ok(out);
                }
                Change::Put(new) => {
                    let (attrs, chunks) = new
                        .to_attributes(id, current.version + 1, &wid)
                        .map_err(|why| self.damaged(id, &why))?;
                    for chunk in chunks {
                        self.table.put(chunk).await?;
                    }
                    self.table.put_if(attrs, current.version).await
                }
                Change::Delete => self.table.delete_if(&pk, current.version).await,
            };
            let found = match sent {
                Ok(()) => {
                    self.settled(id, &change, &wid, current.version + 1);
                    return Ok(out);
                }
                Err(WriteRefused::Store(e)) => {
                    self.recent().remove(id);
                    return Err(e);
                }
                Err(WriteRefused::Condition(Some(attrs))) => self.load(id, &attrs).await?,
                Err(WriteRefused::Condition(None)) => self.read(id).await?,
            };
            let met_itself = match &change {
                Change::Put(_) => found.version > 0 && found.write_id == wid,
                Change::Delete => found.version == 0,
                Change::Keep => false,
            };
            if met_itself {
                self.settled(id, &change, &wid, current.version + 1);
                return Ok(out);
            }
            current = found;
            guessed = false;
        }
        self.recent().remove(id);
        Err(StoreError::Unavailable {
            store: self.table.label(),
            reason: format!("{id} changed under {MODIFY_TRIES} decisions in a row; try again"),
        })
    }

    /// Remembers what was written for the next change of `id`.
    fn settled(&self, id: &RecordId, change: &Change, wid: &str, version: u64) {
        match change {
            Change::Put(new) => {
                let mut kept = new.clone();
                kept.version = version;
                kept.write_id = wid.to_owned();
                self.remember(id, &kept);
            }
            Change::Delete | Change::Keep => {
                self.recent().remove(id);
            }
        }
    }

    async fn claim_item(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        req.check_labels()?;
        // A fresh key is the common case: put first, read only if it fails.
        // A key this process saw in flight is asked about with a read.
        let guess = self.guess(&req.id).unwrap_or_else(Item::missing);
        self.modify(&req.id, Some(guess), |current, now, judged| {
            let mut next = current.clone();
            // Only a lease is judged late: a record in progress is the only
            // one whose answer turns on a lease's end. Retention and the
            // tombstone horizon are read at `now`, as listings read them.
            let at = match record_of(current) {
                Some(r) if r.state == State::InProgress => judged,
                _ => now,
            };
            match decision::plan(record_of(current), req, at) {
                // The lease is judged over `skew` late, but a caller is told
                // when it ends: retrying then meets at most `skew` of wait.
                Plan::Answer(Claim::InFlight { lease_until, .. }, Write::None) => {
                    let retry_after_ms = now.millis_until(lease_until);
                    let claim = Claim::InFlight {
                        lease_until,
                        retry_after_ms,
                    };
                    Ok((claim, Change::Keep))
                }
                Plan::Answer(claim, Write::None) => Ok((claim, Change::Keep)),
                Plan::Answer(claim, Write::Put(record)) => {
                    next.record = Some(record);
                    Ok((claim, Change::Put(next)))
                }
                Plan::Answer(claim, Write::Delete) => {
                    next.record = None;
                    Ok((claim, Change::Put(next)))
                }
                Plan::Acquire { took_over } => {
                    let token = item::next_token(current.last_token, now, Self::random_u32()?);
                    let (claim, write) = decision::acquire(req, now, Token(token), took_over);
                    next.last_token = token;
                    next.tries = None;
                    if let Write::Put(record) = write {
                        next.record = Some(record);
                    }
                    Ok((claim, Change::Put(next)))
                }
            }
        })
        .await
    }

    /// A change of one attempt's record: `step` decides the new record
    /// (`None`: no record) from the current one.
    async fn attempt_step<T: Clone>(
        &self,
        id: &RecordId,
        step: impl Fn(Option<&Record>, Timestamp) -> Result<(T, Option<Record>), StoreError>,
    ) -> Result<T, StoreError> {
        self.modify(id, self.guess(id), |current, now, _| {
            let (out, record) = step(record_of(current), now)?;
            let mut next = current.clone();
            next.record = record;
            Ok((out, Change::Put(next)))
        })
        .await
    }

    async fn resolve_item(
        &self,
        id: &RecordId,
        token: Token,
        resolution: &Resolution,
    ) -> Result<Option<Record>, StoreError> {
        self.modify(id, None, |current, now, judged| {
            if let Some(r) = record_of(current)
                && resolution.outcome == Outcome::NotExecuted
                && r.token == token
                && r.state == State::Ambiguous
                && judged < r.lease_until
            {
                return Err(StoreError::MayStillCommit {
                    id: id.clone(),
                    token,
                    until: r.lease_until.plus_millis(self.skew_ms),
                });
            }
            let decided =
                decision::resolve(record_of(current), id, token, resolution.clone(), now)?;
            Ok(journaled(current, decided))
        })
        .await
    }

    /// An operator's verb ([`decision::apply_verb`]) in one conditional
    /// write of the item: the record's change, the journal's entry and the
    /// end of the tries together. "May still commit" is judged, like a
    /// "not executed" verdict, against the store's clock less the
    /// tolerated skew.
    async fn verb_item(
        &self,
        id: &RecordId,
        token: Token,
        request: &VerbRequest,
    ) -> Result<Option<Record>, StoreError> {
        self.modify(id, None, |current, now, judged| {
            if let Some(r) = record_of(current)
                && request.verb == Verb::Evict
                && r.token == token
                && matches!(r.state, State::InProgress | State::Ambiguous)
                && judged < r.lease_until
            {
                return Err(StoreError::MayStillCommit {
                    id: id.clone(),
                    token,
                    until: r.lease_until.plus_millis(self.skew_ms),
                });
            }
            let decided = decision::apply_verb(record_of(current), id, token, request, now)?;
            Ok(journaled(current, decided))
        })
        .await
    }

    async fn purge_items(&self, limit: usize) -> Result<PurgeReport, StoreError> {
        let mut report = PurgeReport::default();
        let limit = limit.min(idem_core::LIST_LIMIT_MAX);
        if limit == 0 {
            return Ok(report);
        }
        let now = self.clock.now();
        let (candidates, damaged) = crate::setup::due_candidates(&self.table, now, limit).await?;
        report.damaged = damaged;
        for (_, id) in candidates {
            if report.tombstoned + report.deleted >= limit as u64 {
                break;
            }
            let done = self
                .modify(&id, None, |current, now, _| {
                    let Some(record) = record_of(current) else {
                        return Ok((Write::None, Change::Keep));
                    };
                    match decision::purge(record, now) {
                        Write::None => Ok((Write::None, Change::Keep)),
                        Write::Put(tombstone) => {
                            let mut next = current.clone();
                            next.record = Some(tombstone.clone());
                            Ok((Write::Put(tombstone), Change::Put(next)))
                        }
                        Write::Delete if current.journal.is_empty() => {
                            Ok((Write::Delete, Change::Delete))
                        }
                        Write::Delete => {
                            let mut next = current.clone();
                            next.record = None;
                            next.tries = None;
                            Ok((Write::Delete, Change::Put(next)))
                        }
                    }
                })
                .await;
            match done {
                Ok(Write::Put(_)) => report.tombstoned += 1,
                Ok(Write::Delete) => report.deleted += 1,
                Ok(Write::None) => {}
                Err(StoreError::Incompatible { .. }) => report.damaged += 1,
                Err(e) => return Err(e),
            }
        }
        Ok(report)
    }

    async fn window_item(&self) -> Result<Option<(SuspectWindow, u64)>, StoreError> {
        match self.table.get(item::WINDOW_PK).await? {
            None => Ok(None),
            Some(attrs) => crate::setup::window_from(&attrs).map(Some).map_err(|why| {
                StoreError::Incompatible {
                    store: self.table.label(),
                    reason: format!("the suspect window's item cannot be read: {why}"),
                }
            }),
        }
    }

    async fn open_window(&self, opening: &WindowOpening) -> Result<SuspectWindow, StoreError> {
        for _ in 0..MODIFY_TRIES {
            let held = self.window_item().await?;
            let now = self.clock.now();
            let window = SuspectWindow::opened(held.as_ref().map(|(w, _)| w), opening, now);
            let version = held.as_ref().map_or(0, |(_, v)| *v);
            let attrs = crate::setup::window_attrs(&window, version + 1);
            match self.table.put_if(attrs, version).await {
                Ok(()) => return Ok(window),
                Err(WriteRefused::Store(e)) => return Err(e),
                // Another opening got there first: open again on top of it.
                Err(WriteRefused::Condition(_)) => continue,
            }
        }
        Err(StoreError::Unavailable {
            store: self.table.label(),
            reason: "the suspect window changed under every try; try again".into(),
        })
    }
}

impl Store for DynamoStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, Claim> {
        Box::pin(self.claim_item(req))
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        result: StoredResult,
    ) -> StoreFuture<'a, Record> {
        Box::pin(self.attempt_step(id, move |existing, now| {
            let done = decision::complete(existing, id, token, result.clone(), now)?;
            Ok((done.clone(), Some(done)))
        }))
    }

    fn release<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, ()> {
        Box::pin(self.attempt_step(id, move |existing, now| {
            decision::release(existing, id, token, now)?;
            Ok(((), None))
        }))
    }

    fn mark_ambiguous<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, Record> {
        Box::pin(self.attempt_step(id, move |existing, now| {
            let marked = decision::mark_ambiguous(existing, id, token, now)?;
            Ok((marked.clone(), Some(marked)))
        }))
    }

    fn note_ambiguity<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        note: AmbiguityNote,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.attempt_step(id, move |existing, now| {
            let noted = decision::note_ambiguity(existing, id, token, note.clone(), now)?;
            Ok(((), Some(noted)))
        }))
    }

    fn resolve<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        resolution: Resolution,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move { self.resolve_item(id, token, &resolution).await })
    }

    fn apply_verb<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        request: VerbRequest,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move { self.verb_item(id, token, &request).await })
    }

    fn note_failed_lookup<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        next_at: Timestamp,
    ) -> StoreFuture<'a, LookupTries> {
        Box::pin(self.modify(id, None, move |current, now, _| {
            let tries = decision::note_failed_lookup(
                record_of(current),
                current.tries.as_ref(),
                id,
                token,
                next_at,
                now,
            )?;
            let mut next = current.clone();
            next.tries = Some(tries);
            Ok((tries, Change::Put(next)))
        }))
    }

    fn lookup_tries<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
    ) -> StoreFuture<'a, Option<LookupTries>> {
        Box::pin(async move {
            let item = self.read(id).await?;
            Ok(decision::tries_of_attempt(item.tries.as_ref(), token))
        })
    }

    fn resolutions<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Vec<JournalEntry>> {
        Box::pin(async move { Ok(self.read(id).await?.journal) })
    }

    fn get<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move { Ok(self.read(id).await?.record) })
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> StoreFuture<'a, Listing> {
        Box::pin(async move {
            let now = self.clock.now();
            crate::setup::list(&self.table, query, now).await
        })
    }

    fn purge(&self, limit: usize) -> StoreFuture<'_, PurgeReport> {
        Box::pin(self.purge_items(limit))
    }

    fn watches(&self) -> Vec<(Watch, Watching)> {
        vec![
            (
                Watch::Completions,
                Watching::Off {
                    reason: "DynamoDB notifies no one: a waiter learns of another process's \
                             completion at its next poll (one read per key every 250 ms)"
                        .into(),
                },
            ),
            (
                Watch::Promotion,
                Watching::Off {
                    reason: "DynamoDB has no promotion to notice: a point-in-time restore \
                             makes a new table; run `idem store mark-restored --since` on it"
                        .into(),
                },
            ),
        ]
    }

    fn suspect_window(&self) -> StoreFuture<'_, Option<SuspectWindow>> {
        Box::pin(async move { Ok(self.window_item().await?.map(|(w, _)| w)) })
    }

    fn open_suspect_window<'a>(
        &'a self,
        opening: &'a WindowOpening,
    ) -> StoreFuture<'a, SuspectWindow> {
        Box::pin(self.open_window(opening))
    }
}

/// The item after a resolution or a verb: the record's write, the
/// journal's entry and the end of the failed lookups, for one conditional
/// write; and the record written (`None` when it was removed).
fn journaled(current: &Item, (write, entry): (Write, JournalEntry)) -> (Option<Record>, Change) {
    let mut next = current.clone();
    next.tries = None;
    next.record = match write {
        Write::Put(record) => Some(record),
        Write::Delete | Write::None => None,
    };
    next.append_journal(entry);
    (next.record.clone(), Change::Put(next))
}

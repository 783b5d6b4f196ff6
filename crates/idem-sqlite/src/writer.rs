//! The one writer thread: group commit. Concurrent operations queue up while
//! a batch is being made durable; the next batch takes them all, applies each
//! in its own savepoint and pays one fsync for the lot. A caller hears back
//! only after the batch committed. If the thread panics it stops for good
//! and leaves the cause behind, so that every later caller hears
//! `StoreError::Stopped` with it instead of a `503` that never ends.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use idem_core::decision::{self, Write};
use idem_core::{
    AmbiguityNote, Claim, ClaimRequest, Clock, JournalEntry, LIST_LIMIT_MAX, LookupTries,
    PurgeReport, Record, RecordId, Resolution, StoreError, StoredResult, SuspectWindow, Timestamp,
    Token, VerbRequest, WindowOpening,
};
use rusqlite::{Connection, OptionalExtension};
use tokio::sync::{mpsc, oneshot};

use crate::counters::Counters;
use crate::row;
use crate::schema;
use crate::window;

/// Where a caller waits for the result of its operation.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// One write operation, with owned inputs and its reply channel.
pub(crate) enum Op {
    Claim {
        req: ClaimRequest,
        reply: Reply<Claim>,
    },
    Complete {
        id: RecordId,
        token: Token,
        result: StoredResult,
        reply: Reply<Record>,
    },
    Release {
        id: RecordId,
        token: Token,
        reply: Reply<()>,
    },
    MarkAmbiguous {
        id: RecordId,
        token: Token,
        reply: Reply<Record>,
    },
    NoteAmbiguity {
        id: RecordId,
        token: Token,
        note: Box<AmbiguityNote>,
        reply: Reply<()>,
    },
    Resolve {
        id: RecordId,
        token: Token,
        resolution: Resolution,
        reply: Reply<Option<Record>>,
    },
    Verb {
        id: RecordId,
        token: Token,
        request: VerbRequest,
        reply: Reply<Option<Record>>,
    },
    NoteFailedLookup {
        id: RecordId,
        token: Token,
        next_at: Timestamp,
        reply: Reply<LookupTries>,
    },
    Purge {
        limit: usize,
        reply: Reply<PurgeReport>,
    },
    OpenWindow {
        opening: WindowOpening,
        reply: Reply<SuspectWindow>,
    },
}

impl Op {
    /// Whether the operation changes at most one row with one statement,
    /// whatever the record holds: a claim (an insert that may do nothing,
    /// then at most one write of the decision), a completion, a release and
    /// a mark (a read, then one write). Every other operation may write
    /// several statements and needs a savepoint to fail alone.
    fn writes_one_statement(&self) -> bool {
        matches!(
            self,
            Op::Claim { .. }
                | Op::Complete { .. }
                | Op::Release { .. }
                | Op::MarkAmbiguous { .. }
                | Op::NoteAmbiguity { .. }
        )
    }
}

/// Why the writer stopped, set once by the writer thread when it panicked;
/// callers read it when their operation went unanswered.
pub(crate) type Death = Arc<OnceLock<String>>;

/// The writer thread's state: its connection and the fencing counter.
pub(crate) struct Writer {
    conn: Connection,
    clock: Arc<dyn Clock>,
    store: String,
    batch_max: usize,
    /// The last fencing token handed out. Each batch starts from the larger
    /// of this and `meta.last_token` (another process may share the file)
    /// and writes it back before COMMIT, so tokens increase across batches,
    /// restarts, processes and deleted records.
    last_token: u64,
    counters: Arc<Counters>,
}

impl Writer {
    pub(crate) fn new(
        conn: Connection,
        clock: Arc<dyn Clock>,
        store: String,
        batch_max: usize,
        last_token: u64,
        counters: Arc<Counters>,
    ) -> Writer {
        Writer {
            conn,
            clock,
            store,
            batch_max,
            last_token,
            counters,
        }
    }

    /// Runs until every sender is gone and the queue is drained, or until
    /// a panic: then the cause goes into `death` before the queue and the
    /// waiting callers' replies are dropped, so that they read it. The
    /// connection is dropped too (SQLite rolls back the open transaction);
    /// nothing is retried on a thread whose state a panic interrupted.
    pub(crate) fn run(mut self, mut queue: mpsc::Receiver<Op>, death: &Death) {
        let mut batch = Vec::with_capacity(self.batch_max);
        let mut done = Vec::with_capacity(self.batch_max);
        let served = panic::catch_unwind(AssertUnwindSafe(|| {
            while let Some(first) = queue.blocking_recv() {
                batch.push(first);
                self.run_batch(&mut queue, &mut batch, &mut done);
            }
        }));
        if let Err(payload) = served {
            let _ = death.set(format!(
                "the writer thread panicked ({}); nothing it had not committed was stored",
                panic_message(payload.as_ref())
            ));
        }
    }

    /// One transaction for the whole batch; each caller is answered only
    /// after COMMIT returned, and told `Unavailable` if it failed.
    ///
    /// Operations that arrive while the batch is being applied join it
    /// (up to `batch_max`): callers answered by the previous commit come
    /// back during this one, and absorbing them keeps one large batch per
    /// fsync instead of two half-size ones taking turns.
    fn run_batch(
        &mut self,
        queue: &mut mpsc::Receiver<Op>,
        batch: &mut Vec<Op>,
        done: &mut Vec<Done>,
    ) {
        let begun = self.exec("BEGIN IMMEDIATE").and_then(|()| {
            self.load_token().inspect_err(|_| {
                let _ = self.conn.execute_batch("ROLLBACK");
            })
        });
        let failed = match begun {
            Ok(stored) => {
                loop {
                    fill(queue, batch, self.batch_max - done.len());
                    if batch.is_empty() {
                        break;
                    }
                    done.extend(batch.drain(..).map(|op| self.apply_in_savepoint(op)));
                }
                self.commit(stored).err()
            }
            Err(e) => Some(e),
        };
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        let ops = done.len() + batch.len();
        self.counters.ops.fetch_add(ops as u64, Ordering::Relaxed);
        for d in done.drain(..) {
            d.send(failed.as_ref());
        }
        if let Some(e) = failed {
            for op in batch.drain(..) {
                Done::failed(op, e.clone()).send(None);
            }
        }
    }

    /// Writes the fencing counter back if the batch handed out tokens, then
    /// commits. `stored` is the counter as the batch found it.
    fn commit(&mut self, stored: u64) -> Result<(), StoreError> {
        let commit = || -> rusqlite::Result<()> {
            if self.last_token > stored {
                self.conn
                    .prepare_cached("UPDATE meta SET last_token = ?1 WHERE id = 1")?
                    .execute([row::int(self.last_token)])?;
            }
            self.conn.prepare_cached("COMMIT")?.execute([])?;
            Ok(())
        };
        commit().map_err(|e| {
            // Best effort: the connection must leave the failed transaction
            // before the next batch; if even this fails the next BEGIN fails
            // too and reports it.
            let _ = self.conn.execute_batch("ROLLBACK");
            schema::unavailable(
                &self.store,
                format!("the batch could not be committed, nothing in it was stored: {e}"),
            )
        })
    }

    /// The fencing counter as stored; the batch continues from it if another
    /// process sharing the file went further.
    fn load_token(&mut self) -> Result<u64, StoreError> {
        let stored: i64 = self
            .conn
            .prepare_cached("SELECT last_token FROM meta WHERE id = 1")
            .and_then(|mut stmt| stmt.query_row([], |r| r.get(0)))
            .map_err(|e| schema::error(&self.store, &e))?;
        let stored = u64::try_from(stored).map_err(|_| StoreError::Incompatible {
            store: self.store.clone(),
            reason: format!("the fencing counter (meta.last_token) is negative ({stored})"),
        })?;
        self.last_token = self.last_token.max(stored);
        Ok(stored)
    }

    /// Applies one operation so that its failure undoes its own writes and
    /// nothing else in the batch: inside `SAVEPOINT op` when it may write
    /// more than one statement, on its own otherwise, since SQLite undoes
    /// a failed statement's changes by itself.
    fn apply_in_savepoint(&mut self, op: Op) -> Done {
        if op.writes_one_statement() {
            return self.apply(op);
        }
        if let Err(e) = self.exec("SAVEPOINT op") {
            return Done::failed(op, e);
        }
        let done = self.apply(op);
        let end = if done.is_err() {
            self.exec("ROLLBACK TO op")
                .and_then(|()| self.exec("RELEASE op"))
        } else {
            self.exec("RELEASE op")
        };
        match end {
            Ok(()) => done,
            Err(e) => done.with_error(e),
        }
    }

    fn apply(&mut self, op: Op) -> Done {
        match op {
            Op::Claim { req, reply } => Done::Claim(reply, self.claim(&req)),
            Op::Complete {
                id,
                token,
                result,
                reply,
            } => {
                let out = self
                    .decide(&id, |existing, now| {
                        decision::complete(existing, &id, token, result, now)
                    })
                    .and_then(|done| self.put(&done).map(|()| done));
                Done::Record(reply, out)
            }
            Op::Release { id, token, reply } => {
                let out = self
                    .decide(&id, |existing, now| {
                        decision::release(existing, &id, token, now)
                    })
                    .and_then(|_| self.delete(&id));
                Done::Unit(reply, out)
            }
            Op::MarkAmbiguous { id, token, reply } => {
                let out = self
                    .decide(&id, |existing, now| {
                        decision::mark_ambiguous(existing, &id, token, now)
                    })
                    .and_then(|marked| self.put(&marked).map(|()| marked));
                Done::Record(reply, out)
            }
            Op::NoteAmbiguity {
                id,
                token,
                note,
                reply,
            } => {
                let out = self
                    .decide(&id, |existing, now| {
                        decision::note_ambiguity(existing, &id, token, *note, now)
                    })
                    .and_then(|noted| self.put(&noted));
                Done::Unit(reply, out)
            }
            Op::Resolve {
                id,
                token,
                resolution,
                reply,
            } => {
                let out = self
                    .decide(&id, |existing, now| {
                        decision::resolve(existing, &id, token, resolution, now)
                    })
                    .and_then(|decided| self.journaled(&id, decided));
                Done::MaybeRecord(reply, out)
            }
            Op::Verb {
                id,
                token,
                request,
                reply,
            } => {
                let out = self
                    .decide(&id, |existing, now| {
                        decision::apply_verb(existing, &id, token, &request, now)
                    })
                    .and_then(|decided| self.journaled(&id, decided));
                Done::MaybeRecord(reply, out)
            }
            Op::NoteFailedLookup {
                id,
                token,
                next_at,
                reply,
            } => Done::Tries(reply, self.note_failed_lookup(&id, token, next_at)),
            Op::Purge { limit, reply } => Done::Purge(reply, self.purge(limit)),
            Op::OpenWindow { opening, reply } => {
                let out = window::read(&self.conn, &self.store).and_then(|held| {
                    let opened = SuspectWindow::opened(held.as_ref(), &opening, self.clock.now());
                    window::write(&self.conn, &self.store, &opened).map(|()| opened)
                });
                Done::Window(reply, out)
            }
        }
    }

    /// The record of `id` as it is now, and the writer's clock, given to a
    /// decision.
    fn decide<T>(
        &self,
        id: &RecordId,
        decision: impl FnOnce(Option<&Record>, Timestamp) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let existing = self.read(id)?;
        decision(existing.as_ref(), self.clock.now())
    }

    /// `decision::note_failed_lookup` on the record and the tries kept for
    /// it, the new tries written.
    fn note_failed_lookup(
        &self,
        id: &RecordId,
        token: Token,
        next_at: Timestamp,
    ) -> Result<LookupTries, StoreError> {
        let existing = self.read(id)?;
        let kept = row::tries(&self.conn, id, &self.store)?;
        let now = self.clock.now();
        let tries = decision::note_failed_lookup(
            existing.as_ref(),
            kept.as_ref(),
            id,
            token,
            next_at,
            now,
        )?;
        row::put_tries(&self.conn, id, &tries).map_err(|e| schema::error(&self.store, &e))?;
        Ok(tries)
    }

    /// Applies a journaled write (a resolution, a verb): in the operation's
    /// savepoint, the record's write, the journal's append, the removal of
    /// the lookup tries and a verb's count commit together or not at all.
    fn journaled(
        &self,
        id: &RecordId,
        (write, entry): (Write, JournalEntry),
    ) -> Result<Option<Record>, StoreError> {
        row::append_journal(&self.conn, &entry)
            .and_then(|()| self.conn.prepare_cached(row::TRIES_DELETE))
            .and_then(|mut stmt| stmt.execute((id.scope.as_str(), id.key.as_str())))
            .map_err(|e| schema::error(&self.store, &e))?;
        if entry.verb.is_some() {
            // Counted in the verb's own savepoint: every process sharing
            // the file reads the count and forgets the replays it keeps.
            self.conn
                .prepare_cached(row::VERBS_COUNT)
                .and_then(|mut stmt| stmt.execute([]))
                .map_err(|e| schema::error(&self.store, &e))?;
        }
        match write {
            Write::Put(done) => self.put(&done).map(|()| Some(done)),
            write => self.write(id, &write).map(|()| None),
        }
    }

    fn claim(&mut self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let now = self.clock.now();
        let token = Token(self.last_token.saturating_add(1));
        // Most claims are for a fresh key. The decision for "no record" is
        // an acquisition: insert its record unless one exists, one B-tree
        // descent instead of a read and then a write. The token is only
        // taken if the insert happened.
        if let (claim, Write::Put(record)) = decision::acquire(req, now, token, None)
            && self.insert_new(&record)?
        {
            self.last_token = token.0;
            return Ok(claim);
        }
        let existing = self.read(&req.id)?;
        let last_token = &mut self.last_token;
        let (claim, write) = decision::claim(existing.as_ref(), req, now, || {
            *last_token = token.0;
            token
        });
        self.write(&req.id, &write)?;
        Ok(claim)
    }

    /// Applies `decision::purge` to the first `limit` records it would
    /// change, the longest due first (`decision::purge_due`), then in
    /// (scope, key) order, as the memory store does.
    fn purge(&mut self, limit: usize) -> Result<PurgeReport, StoreError> {
        let now = self.clock.now();
        let limit = limit.min(LIST_LIMIT_MAX);
        // The rows `decision::purge` changes: tombstones past their horizon
        // and completed records past retention (see `Record::state_at`),
        // the longest due first (`decision::purge_due`), each part read in
        // that order from its partial index and merged.
        let candidates = self
            .conn
            .prepare_cached(&format!(
                "SELECT {cols}, expires_at_ms AS due FROM records \
                 WHERE state = 'completed' AND expires_at_ms <= ?1 \
                 UNION ALL \
                 SELECT {cols}, tombstone_until_ms AS due FROM records \
                 WHERE state = 'tombstone' AND tombstone_until_ms <= ?1 \
                 ORDER BY due, scope, key LIMIT ?2",
                cols = row::COLUMNS
            ))
            .and_then(|mut stmt| {
                let rows = stmt
                    .query_map((row::int(now.as_millis()), row::int(limit as u64)), |r| {
                        Ok(row::decode_listed(r).1)
                    })?;
                rows.collect::<Result<Vec<_>, _>>()
            })
            .map_err(|e| schema::error(&self.store, &e))?;
        let mut report = PurgeReport::default();
        for record in candidates {
            // A row that cannot be read is left for a person and counted;
            // it must not stop the purge of every other record.
            let Ok(record) = record else {
                report.damaged += 1;
                continue;
            };
            let write = decision::purge(&record, now);
            match write {
                Write::Delete => report.deleted += 1,
                Write::Put(_) => report.tombstoned += 1,
                Write::None => continue,
            }
            self.write(&record.id, &write)?;
        }
        Ok(report)
    }

    fn read(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let found = self
            .conn
            .prepare_cached(row::GET)
            .and_then(|mut stmt| {
                stmt.query_row((id.scope.as_str(), id.key.as_str()), |r| {
                    Ok(row::decode(r, &self.store))
                })
                .optional()
            })
            .map_err(|e| schema::error(&self.store, &e))?;
        found.transpose()
    }

    fn write(&self, id: &RecordId, write: &Write) -> Result<(), StoreError> {
        match write {
            Write::None => Ok(()),
            Write::Put(record) => self.put(record),
            Write::Delete => self.delete(id),
        }
    }

    fn put(&self, record: &Record) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(row::PUT)
            .and_then(|mut stmt| row::put(&mut stmt, record))
            .map(|_| ())
            .map_err(|e| schema::error(&self.store, &e))
    }

    /// Inserts `record` if its (scope, key) has none; true if it did.
    fn insert_new(&self, record: &Record) -> Result<bool, StoreError> {
        self.conn
            .prepare_cached(row::INSERT_NEW)
            .and_then(|mut stmt| row::put(&mut stmt, record))
            .map(|rows| rows == 1)
            .map_err(|e| schema::error(&self.store, &e))
    }

    fn delete(&self, id: &RecordId) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(row::DELETE)
            .and_then(|mut stmt| stmt.execute((id.scope.as_str(), id.key.as_str())))
            .map(|_| ())
            .map_err(|e| schema::error(&self.store, &e))
    }

    fn exec(&self, sql: &str) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute([]))
            .map(|_| ())
            .map_err(|e| schema::error(&self.store, &e))
    }
}

/// An applied operation waiting for its batch to commit.
enum Done {
    Claim(Reply<Claim>, Result<Claim, StoreError>),
    Record(Reply<Record>, Result<Record, StoreError>),
    Unit(Reply<()>, Result<(), StoreError>),
    MaybeRecord(Reply<Option<Record>>, Result<Option<Record>, StoreError>),
    Tries(Reply<LookupTries>, Result<LookupTries, StoreError>),
    Purge(Reply<PurgeReport>, Result<PurgeReport, StoreError>),
    Window(Reply<SuspectWindow>, Result<SuspectWindow, StoreError>),
}

impl Done {
    /// An operation that could not run: its answer is `e`.
    fn failed(op: Op, e: StoreError) -> Done {
        match op {
            Op::Claim { reply, .. } => Done::Claim(reply, Err(e)),
            Op::Complete { reply, .. } | Op::MarkAmbiguous { reply, .. } => {
                Done::Record(reply, Err(e))
            }
            Op::Release { reply, .. } | Op::NoteAmbiguity { reply, .. } => {
                Done::Unit(reply, Err(e))
            }
            Op::Resolve { reply, .. } | Op::Verb { reply, .. } => Done::MaybeRecord(reply, Err(e)),
            Op::NoteFailedLookup { reply, .. } => Done::Tries(reply, Err(e)),
            Op::Purge { reply, .. } => Done::Purge(reply, Err(e)),
            Op::OpenWindow { reply, .. } => Done::Window(reply, Err(e)),
        }
    }

    fn is_err(&self) -> bool {
        match self {
            Done::Claim(_, r) => r.is_err(),
            Done::Record(_, r) => r.is_err(),
            Done::Unit(_, r) => r.is_err(),
            Done::MaybeRecord(_, r) => r.is_err(),
            Done::Tries(_, r) => r.is_err(),
            Done::Purge(_, r) => r.is_err(),
            Done::Window(_, r) => r.is_err(),
        }
    }

    fn with_error(self, e: StoreError) -> Done {
        match self {
            Done::Claim(reply, _) => Done::Claim(reply, Err(e)),
            Done::Record(reply, _) => Done::Record(reply, Err(e)),
            Done::Unit(reply, _) => Done::Unit(reply, Err(e)),
            Done::MaybeRecord(reply, _) => Done::MaybeRecord(reply, Err(e)),
            Done::Tries(reply, _) => Done::Tries(reply, Err(e)),
            Done::Purge(reply, _) => Done::Purge(reply, Err(e)),
            Done::Window(reply, _) => Done::Window(reply, Err(e)),
        }
    }

    /// Answers the caller: its own result if the batch committed, else the
    /// commit's error. A caller that stopped waiting is not an error.
    fn send(self, failed: Option<&StoreError>) {
        fn answer<T>(reply: Reply<T>, out: Result<T, StoreError>, failed: Option<&StoreError>) {
            let _ = reply.send(match failed {
                Some(e) => Err(e.clone()),
                None => out,
            });
        }
        match self {
            Done::Claim(reply, out) => answer(reply, out, failed),
            Done::Record(reply, out) => answer(reply, out, failed),
            Done::Unit(reply, out) => answer(reply, out, failed),
            Done::MaybeRecord(reply, out) => answer(reply, out, failed),
            Done::Tries(reply, out) => answer(reply, out, failed),
            Done::Purge(reply, out) => answer(reply, out, failed),
            Done::Window(reply, out) => answer(reply, out, failed),
        }
    }
}

/// A panic's message, when it has one.
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "no message"
    }
}

/// Moves operations already queued into `batch` until it holds `room`.
fn fill(queue: &mut mpsc::Receiver<Op>, batch: &mut Vec<Op>, room: usize) {
    while batch.len() < room {
        match queue.try_recv() {
            Ok(op) => batch.push(op),
            Err(_) => return,
        }
    }
}

//! The embedded default idem store: one SQLite file in WAL mode with
//! `synchronous=FULL`, written by one thread that group-commits concurrent
//! operations so they share an fsync.
//!
//! The store applies the shared decision functions of
//! [`idem_core::decision`] and nothing else; it passes the same conformance
//! suite as [`idem_core::MemoryStore`]. A caller is answered only after the
//! transaction holding its operation committed.
//!
//! ```
//! use idem_core::{ClaimRequest, IdempotencyKey, Policy, RecordId, Scope, Store};
//! use idem_core::{Claim, Fingerprint, StoredResult};
//! use idem_sqlite::{SqliteOptions, SqliteStore};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open(dir.path().join("idem.db"), SqliteOptions::default())?;
//! let req = ClaimRequest {
//!     id: RecordId {
//!         scope: Scope::new("POST /payouts|tenant-7")?,
//!         key: IdempotencyKey::parse("payout-847-2026-W36")?,
//!     },
//!     fingerprint: Fingerprint::from_bytes([7; 32]),
//!     legacy_fingerprint: None,
//!     owner: "node-1".to_owned(),
//!     region: None,
//!     policy: Policy::default(),
//! };
//! let rt = tokio::runtime::Runtime::new()?;
//! rt.block_on(async {
//!     let Claim::Acquired { token, .. } = store.claim(&req).await? else {
//!         panic!("a fresh key is acquired");
//!     };
//!     let result = StoredResult::new(201, vec![], b"paid".to_vec())?;
//!     store.complete(&req.id, token, result).await?;
//!     assert!(matches!(store.claim(&req).await?, Claim::Replay { .. }));
//!     Ok(())
//! })
//! # }
//! ```
//!
//! ## Group commit
//! Callers queue operations (bounded, [`WRITE_QUEUE_MAX`]) for one writer
//! thread. It opens a `BEGIN IMMEDIATE` transaction, applies every queued
//! operation so that one operation's error undoes only its own writes (in
//! its own `SAVEPOINT` when it may write several statements; claims,
//! completions, releases and marks write one, which SQLite undoes by
//! itself), keeps taking operations that arrive meanwhile up to
//! [`SqliteOptions::batch_max`], commits once (one fsync with
//! `synchronous=FULL`), and only then answers each caller. If the commit
//! fails, every caller in the batch gets [`StoreError::Unavailable`].
//! If the writer thread panics, the store has stopped for good: that
//! caller and every later one get [`StoreError::Stopped`], naming the
//! panic; reopen the store (`idem serve` exits so that a supervisor
//! restarts it).
//! `get` and `list` run on reader threads with their own connections.
//!
//! ## Replays from memory
//! A completed record is final until its own times say otherwise, so the
//! store keeps the completed records it replayed (bounded by
//! [`SqliteOptions::replay_cache_bytes`], oldest out first) and answers a
//! claim on one of them by the shared decision at the writer's clock,
//! without the writer, whenever that decision writes nothing (see
//! [`ReplayCache`]). A claim that would write goes to the writer. An
//! operator's verb is the one change a completed record can undergo: the
//! file counts them (`meta.verbs`), a reader thread reads the count at
//! most four times a second while claims come, and memory answers only
//! while the last reading is under a second old, so a verb applied by any
//! process sharing the file is honoured here within that second.
//!
//! ## Schema
//! One table, `records`, keyed by `(scope, key)` (see `schema.rs`; since
//! version 4 each record keeps the region of the attempt that acquired it); the
//! resolution journal `resolutions`, keyed by `(scope, key, seq)`, which
//! outlives releases and purges and keeps the last
//! [`JOURNAL_PER_RECORD_MAX`](idem_core::JOURNAL_PER_RECORD_MAX) entries per
//! record; `lookup_tries`, keyed by `(scope, key)`, the failed provider
//! lookups of each ambiguous attempt (deleted when the record is
//! resolved); a one-row table `meta` holds the fencing counter, so tokens keep
//! increasing after records are deleted, across restarts and between
//! processes sharing the file, and (since version 9) the count of verbs. The file is marked with
//! `PRAGMA application_id` = [`APPLICATION_ID`] and versioned with
//! `PRAGMA user_version` = [`SCHEMA_VERSION`].

mod backup;
mod checkpoint;
mod counters;
mod reader;
mod row;
mod schema;
mod window;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use idem_core::{
    AmbiguityNote, Claim, ClaimRequest, Clock, JournalEntry, ListQuery, Listing, LookupTries,
    PurgeReport, Record, RecordId, ReplayCache, Resolution, Store, StoreError, StoreFuture,
    StoredResult, SuspectWindow, SystemClock, Timestamp, Token, VerbRequest, WindowOpening,
};
use tokio::sync::{mpsc, oneshot};

use crate::counters::Counters;
use crate::reader::ReadOp;
use crate::writer::{Death, Op, Reply, Writer};

pub use backup::{BackupReport, RestoreReport, backup, restore};
pub use schema::{APPLICATION_ID, Found, SCHEMA_VERSION};

/// The most operations one group commit takes.
pub const BATCH_MAX_LIMIT: usize = 4096;
/// The most reader threads a store runs.
pub const READERS_MAX: usize = 64;
/// Write operations that may wait for the writer; callers beyond this wait
/// to enqueue.
pub const WRITE_QUEUE_MAX: usize = 4096;
/// Read operations that may wait for a reader.
pub const READ_QUEUE_MAX: usize = 1024;
/// Bytes of completed records a store keeps in memory by default.
pub const REPLAY_CACHE_BYTES_DEFAULT: usize = 8 << 20;

/// How to open a [`SqliteStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteOptions {
    /// The most operations committed in one transaction (one fsync). 1 means
    /// one transaction per operation; 0 is taken as 1 and values above
    /// [`BATCH_MAX_LIMIT`] as that limit. Default 256.
    pub batch_max: usize,
    /// Reader threads (each with its own connection) serving `get` and
    /// `list`, between 1 and [`READERS_MAX`]. Default 2.
    pub readers: usize,
    /// Create the file if it does not exist. When false, a missing file is
    /// an error. Default true.
    pub create: bool,
    /// Bytes of completed records kept in memory to answer replays without
    /// the writer ([`ReplayCache`]); 0 keeps none. Default
    /// [`REPLAY_CACHE_BYTES_DEFAULT`].
    pub replay_cache_bytes: usize,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            batch_max: 256,
            readers: 2,
            create: true,
            replay_cache_bytes: REPLAY_CACHE_BYTES_DEFAULT,
        }
    }
}

/// What the writer thread has done since the store was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions run (each one fsync when it commits).
    pub batches: u64,
    /// Operations run in them.
    pub ops: u64,
    /// WAL checkpoints run off the commit path, by the checkpointer thread.
    pub checkpoints: u64,
    /// Checkpoints the writer ran in a commit because the WAL had reached
    /// its bound (the checkpointer could not keep up): each is a stall.
    pub inline_checkpoints: u64,
    /// Commits that copied back the last few pages the checkpointer had
    /// left, so that the WAL could restart (a small copy, one sync).
    pub catch_ups: u64,
}

impl WriterStats {
    /// What happened between `earlier` and these counts.
    pub fn since(&self, earlier: &WriterStats) -> WriterStats {
        WriterStats {
            batches: self.batches.saturating_sub(earlier.batches),
            ops: self.ops.saturating_sub(earlier.ops),
            checkpoints: self.checkpoints.saturating_sub(earlier.checkpoints),
            inline_checkpoints: self
                .inline_checkpoints
                .saturating_sub(earlier.inline_checkpoints),
            catch_ups: self.catch_ups.saturating_sub(earlier.catch_ups),
        }
    }
}

/// A [`Store`] in one SQLite file.
///
/// Dropping it lets the writer finish the operations already queued, then
/// stops and joins its threads.
pub struct SqliteStore {
    // Field order matters: the senders drop before `_threads`, so the threads
    // see their queues close and exit before `_threads` joins them.
    writes: mpsc::Sender<Op>,
    reads: mpsc::Sender<ReadOp>,
    path: PathBuf,
    store: String,
    counters: Arc<Counters>,
    death: Death,
    /// The clock the writer decides by, for answers from `replays`.
    clock: Arc<dyn Clock>,
    replays: Arc<ReplayCache>,
    _threads: Threads,
}

impl SqliteStore {
    /// Opens (or creates) the database at `path` with the system clock.
    pub fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with_clock(path, options, Arc::new(SystemClock))
    }

    /// What opening `path` would refuse before it writes anything, judged
    /// without creating or writing a file (`idem serve --check`): a missing
    /// directory, a directory or a read-only file in the file's place, a
    /// file that is not an idem store or is of a newer schema. The errors
    /// are the ones [`SqliteStore::open`] gives.
    pub fn check(path: impl AsRef<Path>) -> Result<Found, StoreError> {
        schema::check(path.as_ref())
    }

    /// Opens (or creates) the database at `path`, deciding expiry against
    /// `clock`.
    ///
    /// Fails with [`StoreError::Incompatible`] when the file is not an idem
    /// database or has a newer schema, and with [`StoreError::Unavailable`]
    /// when it cannot be opened for writing; both name the path.
    pub fn open_with_clock(
        path: impl AsRef<Path>,
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let store = path.display().to_string();
        let (mut conn, last_token) = schema::open_writer(&path, options.create)?;
        let checkpointer = schema::open_checkpointer(&path)?;
        let readers = (0..options.readers.clamp(1, READERS_MAX))
            .map(|_| schema::open_reader(&path))
            .collect::<Result<Vec<_>, _>>()?;

        // Declared before the queues so that, if a spawn fails, the queues
        // close (locals drop in reverse order) before `threads` joins.
        let mut threads = Threads(Vec::with_capacity(readers.len() + 1));
        let counters = Arc::new(Counters::default());
        let (wake, woken) = std::sync::mpsc::sync_channel(1);
        let progress = Arc::new(checkpoint::Progress::default());
        checkpoint::hand_off(
            &mut conn,
            wake,
            Arc::clone(&progress),
            Arc::clone(&counters),
        )
        .map_err(|e| schema::error(&store, &e))?;
        let batch_max = options.batch_max.clamp(1, BATCH_MAX_LIMIT);
        let writer = Writer::new(
            conn,
            Arc::clone(&clock),
            store.clone(),
            batch_max,
            last_token,
            Arc::clone(&counters),
        );
        let (writes, write_queue) = mpsc::channel(WRITE_QUEUE_MAX);
        let (reads, read_queue) = mpsc::channel(READ_QUEUE_MAX);
        let read_queue = Arc::new(Mutex::new(read_queue));

        let death = Death::default();
        let writer_death = Arc::clone(&death);
        threads.spawn(&store, "idem-sqlite-writer".to_owned(), move || {
            writer.run(write_queue, &writer_death)
        })?;
        let checkpoints = Arc::clone(&counters);
        threads.spawn(&store, "idem-sqlite-checkpointer".to_owned(), move || {
            checkpoint::run(checkpointer, woken, progress, checkpoints)
        })?;
        for (n, conn) in readers.into_iter().enumerate() {
            let (clock, queue, name) = (Arc::clone(&clock), Arc::clone(&read_queue), store.clone());
            threads.spawn(&store, format!("idem-sqlite-reader-{n}"), move || {
                reader::run(conn, clock, name, queue)
            })?;
        }
        Ok(SqliteStore {
            writes,
            reads,
            path,
            store,
            counters,
            death,
            clock,
            replays: Arc::new(ReplayCache::new(options.replay_cache_bytes)),
            _threads: threads,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Batches and operations the writer has run: `ops / batches` is the
    /// mean group-commit size.
    pub fn stats(&self) -> WriterStats {
        WriterStats {
            batches: self.counters.batches.load(Ordering::Relaxed),
            ops: self.counters.ops.load(Ordering::Relaxed),
            checkpoints: self.counters.checkpoints.load(Ordering::Relaxed),
            inline_checkpoints: self.counters.inline_checkpoints.load(Ordering::Relaxed),
            catch_ups: self.counters.catch_ups.load(Ordering::Relaxed),
        }
    }

    fn write<T: Send + 'static>(&self, op: impl FnOnce(Reply<T>) -> Op) -> StoreFuture<'_, T> {
        let (reply, answer) = oneshot::channel();
        let op = op(reply);
        Box::pin(async move {
            self.writes.send(op).await.map_err(|_| self.stopped())?;
            match answer.await {
                Ok(out) => out,
                Err(_) => {
                    // The writer dropped the reply while unwinding; it
                    // records the cause before it drops the queue.
                    self.writes.closed().await;
                    Err(self.stopped())
                }
            }
        })
    }

    fn read<T: Send + 'static>(&self, op: impl FnOnce(Reply<T>) -> ReadOp) -> StoreFuture<'_, T> {
        let (reply, answer) = oneshot::channel();
        let op = op(reply);
        Box::pin(async move {
            self.reads.send(op).await.map_err(|_| self.stopped())?;
            answer.await.map_err(|_| self.stopped())?
        })
    }

    /// A thread dropped an operation: it panicked (a bug, or SQLite
    /// aborted), and the store cannot work without it.
    fn stopped(&self) -> StoreError {
        let cause = self
            .death
            .get()
            .map_or("a worker thread panicked; its message is in the log", |c| c);
        StoreError::Stopped {
            store: self.store.clone(),
            reason: format!("{cause}; reopen the store (restart the process)"),
        }
    }
}

impl Store for SqliteStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, Claim> {
        if let Err(e) = req.check_labels() {
            return Box::pin(std::future::ready(Err(e.into())));
        }
        // A replay of a completed record this store wrote or replayed is
        // answered from memory, by the decision and the writer's clock
        // (`ReplayCache` says why that is the writer's answer).
        let at = Instant::now();
        if self.replays.verbs_refresh_due(at) {
            // A full queue skips this renewal; a claim asks again once
            // `VERBS_REFRESH_AGE_MS` has passed.
            let replays = Arc::clone(&self.replays);
            let _ = self.reads.try_send(ReadOp::NoteVerbs { replays });
        }
        if let Some(answer) = self.replays.answer(req, &*self.clock, at) {
            return Box::pin(std::future::ready(Ok(answer)));
        }
        let since = self.replays.generation();
        // Every other claim goes to the writer: its fresh-key fast path is
        // one INSERT, and deciding on a reader first cost fresh keys a
        // second hop and smaller commit groups (measured: 26.8k → 22k
        // pairs/s).
        let req = req.clone();
        let claim = self.write(|reply| Op::Claim { req, reply });
        Box::pin(async move {
            let claim = claim.await?;
            if let Claim::Replay { record } = &claim {
                self.replays.keep(record, since);
            }
            Ok(claim)
        })
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        result: StoredResult,
    ) -> StoreFuture<'a, Record> {
        // The completed record is not kept in `replays`: most keys are
        // never retried, and keeping every completion cost the fresh-key
        // path a clone and the gateway's memory a copy of each record (RSS
        // 36 -> 62 MiB under bench/gateway.sh). It is kept once replayed.
        let id = id.clone();
        self.write(|reply| Op::Complete {
            id,
            token,
            result,
            reply,
        })
    }

    fn release<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, ()> {
        let id = id.clone();
        self.write(|reply| Op::Release { id, token, reply })
    }

    fn mark_ambiguous<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, Record> {
        let id = id.clone();
        self.write(|reply| Op::MarkAmbiguous { id, token, reply })
    }

    fn note_ambiguity<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        note: AmbiguityNote,
    ) -> StoreFuture<'a, ()> {
        let id = id.clone();
        let note = Box::new(note);
        self.write(|reply| Op::NoteAmbiguity {
            id,
            token,
            note,
            reply,
        })
    }

    fn resolve<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        resolution: Resolution,
    ) -> StoreFuture<'a, Option<Record>> {
        let id = id.clone();
        self.write(|reply| Op::Resolve {
            id,
            token,
            resolution,
            reply,
        })
    }

    fn apply_verb<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        request: VerbRequest,
    ) -> StoreFuture<'a, Option<Record>> {
        // A replay kept in memory would outlive the record the verb
        // changes: forget it before, and after (when the caller awaits
        // this to the end), which also refuses every record read meanwhile
        // (`ReplayCache::generation`); either way the count of verbs this
        // write raises reaches this process within a second, as it does
        // every other.
        self.replays.forget(id);
        let owned = id.clone();
        let applied = self.write(|reply| Op::Verb {
            id: owned,
            token,
            request,
            reply,
        });
        Box::pin(async move {
            let out = applied.await;
            self.replays.forget(id);
            out
        })
    }

    fn note_failed_lookup<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        next_at: Timestamp,
    ) -> StoreFuture<'a, LookupTries> {
        let id = id.clone();
        self.write(|reply| Op::NoteFailedLookup {
            id,
            token,
            next_at,
            reply,
        })
    }

    fn lookup_tries<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
    ) -> StoreFuture<'a, Option<LookupTries>> {
        let id = id.clone();
        self.read(|reply| ReadOp::LookupTries { id, token, reply })
    }

    fn resolutions<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Vec<JournalEntry>> {
        let id = id.clone();
        self.read(|reply| ReadOp::Resolutions { id, reply })
    }

    fn get<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Option<Record>> {
        let id = id.clone();
        self.read(|reply| ReadOp::Get { id, reply })
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> StoreFuture<'a, Listing> {
        let query = query.clone();
        self.read(|reply| ReadOp::List { query, reply })
    }

    fn purge(&self, limit: usize) -> StoreFuture<'_, PurgeReport> {
        self.write(|reply| Op::Purge { limit, reply })
    }

    fn suspect_window(&self) -> StoreFuture<'_, Option<SuspectWindow>> {
        self.read(|reply| ReadOp::Window { reply })
    }

    fn open_suspect_window<'a>(
        &'a self,
        opening: &'a WindowOpening,
    ) -> StoreFuture<'a, SuspectWindow> {
        let opening = opening.clone();
        self.write(|reply| Op::OpenWindow { opening, reply })
    }
}

/// The store's threads, joined on drop (after the queues closed).
struct Threads(Vec<JoinHandle<()>>);

impl Threads {
    fn spawn(
        &mut self,
        store: &str,
        name: String,
        f: impl FnOnce() + Send + 'static,
    ) -> Result<(), StoreError> {
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(f)
            .map_err(|e| schema::unavailable(store, format!("cannot start a thread: {e}")))?;
        self.0.push(handle);
        Ok(())
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        for handle in self.0.drain(..) {
            // A thread that panicked has already failed its callers with
            // `Unavailable`; there is nothing more to report here.
            let _ = handle.join();
        }
    }
}

//! The shared idem store: PostgreSQL, for many stateless gateway nodes.
//!
//! The store applies the shared decision functions of
//! [`idem_core::decision`] and nothing else, and passes the same conformance
//! suite as [`idem_core::MemoryStore`]. What PostgreSQL adds:
//!
//! - **Time from the database.** With [`PgOptions::clock`] `None`, leases
//!   and expiry are judged by the database's `clock_timestamp()`, read in
//!   the statement that decides (after the row lock is granted), so nodes
//!   with skewed clocks agree. An injected clock (tests) is passed as a
//!   parameter in the same place: one code path.
//! - **A new key in one round trip**: `INSERT … SELECT … ON CONFLICT (scope,
//!   key) DO NOTHING RETURNING …` builds exactly the record
//!   `decision::claim(None, …)` builds, with a token from a sequence.
//! - **A replay without a lock.** When the key exists, one `SELECT` in
//!   autocommit reads the record and the clock; a claim that writes
//!   nothing there (a replay, a 409, a 422, a late replay, an unknown
//!   outcome: `decision::answer_without_write`) is answered from it, so a
//!   replay of a hot key never queues behind its row lock.
//! - **A completion in one round trip**: one statement locks the record,
//!   reads it, writes the completion where `decision::complete`'s fencing
//!   check passes, and returns both, which are held to the decision.
//! - **Every other change** by a locked read-decide-write in one
//!   transaction: `SELECT … FOR UPDATE`, the shared decision, its write,
//!   `COMMIT`.
//! - **Tokens** from a `SEQUENCE`: unique and increasing across nodes,
//!   releases and deletes.
//! - **A claim in the caller's transaction** ([`PgStore::claim_in`],
//!   [`PgStore::complete_in`]): the effect's own rows and the record
//!   commit together, or neither does.
//! - A pool of connections ([`deadpool_postgres`]) that discards broken
//!   ones on checkout, so the store heals after a server restart.
//! - **A bound on every operation.** The server cancels a statement past
//!   [`PgOptions::statement_timeout_ms`]; the client gives up on a whole
//!   operation (pool wait, connect, every round trip) past
//!   [`PgOptions::operation_timeout_ms`] and closes its connection, so a
//!   primary that stops answering (frozen, or behind a network black hole)
//!   fails operations with [`StoreError::Unavailable`] instead of hanging
//!   them. TCP keepalives find a vanished peer of an idle connection.
//!
//! ```no_run
//! use idem_core::{Claim, ClaimRequest, Fingerprint, IdempotencyKey, Policy, RecordId};
//! use idem_core::{Scope, Store, StoredResult};
//! use idem_postgres::{PgOptions, PgStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgStore::connect("postgres://idem@db:5432/app", PgOptions::default()).await?;
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
//! if let Claim::Acquired { token, .. } = store.claim(&req).await? {
//!     let result = StoredResult::new(201, vec![], b"paid".to_vec())?;
//!     store.complete(&req.id, token, result).await?;
//! }
//! assert!(matches!(store.claim(&req).await?, Claim::Replay { .. }));
//! # Ok(())
//! # }
//! ```
//!
//! ## Errors
//! A malformed URL, refused credentials, a missing permission or a schema
//! of a newer version are [`StoreError::Incompatible`], saying what to fix;
//! a server that is unreachable, restarting, overloaded or that dropped the
//! connection is [`StoreError::Unavailable`] (the gateway answers 503 and
//! fails closed). Every message names the host, port, database and schema,
//! never the password.
//!
//! Work that a serialization failure or a deadlock rolled back is run
//! again, up to [`CONFLICT_RETRIES_MAX`] times, before the failure is
//! `Unavailable`: every statement in autocommit, and a claim's locked
//! transaction as a whole; never the caller's own transaction.
//!
//! ## Managed and PG-compatible engines
//! What such an engine refuses is done without, and said: the promotion
//! check when its functions are revoked or absent
//! ([`PgStore::promotion_check`]), the completion notices when `LISTEN` is
//! not supported ([`PgStore::completion_notices`]); [`Store::watches`]
//! gives both to a readiness probe.
//!
//! ## Schema
//! In the schema [`PgOptions::schema`]: `records` keyed by `(scope, key)`
//! (text in `COLLATE "C"`, so listing order is byte order), the resolution
//! journal `resolutions` keyed by `(scope, key, seq)` (appended in the
//! resolve's transaction, never purged, the last
//! [`JOURNAL_PER_RECORD_MAX`](idem_core::JOURNAL_PER_RECORD_MAX) entries
//! per record), `lookup_tries` keyed by `(scope, key)` (the failed provider
//! lookups of each ambiguous attempt, deleted in the resolve's
//! transaction), the sequence `tokens`, and `schema_version` (one row,
//! [`SCHEMA_VERSION`]). `connect` creates and migrates them in one
//! transaction under an advisory lock, so nodes starting together do not
//! race.

mod batch;
mod config;
mod db_clock;
mod error;
mod listen;
mod ops;
pub mod replication;
mod retry;
mod row;
mod schema;
mod window;

#[cfg(test)]
mod mutants;
#[cfg(test)]
mod plans;
/// The integration tests' support, shared by the tests inside the crate.
#[cfg(test)]
#[path = "../tests/support/mod.rs"]
mod test_support;

/// The tests' shared support names the crate as its users do.
#[cfg(test)]
extern crate self as idem_postgres;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use idem_core::decision;
use idem_core::{
    AmbiguityNote, Claim, ClaimRequest, JournalEntry, ListQuery, Listing, LookupTries, PurgeReport,
    Record, RecordId, Resolution, Store, StoreError, StoreFuture, StoredResult, SuspectWindow,
    Timestamp, Token, VerbRequest, Watch, Watching, WindowFn, WindowOpening,
};
use tokio_postgres::NoTls;

use crate::batch::{Batched, Batcher};
use crate::ops::{Completion, Ctx, Decided, Exec, Inserted};
use crate::schema::Found;

pub use config::{
    APPLICATION_NAME_DEFAULT, BATCH_LANES_DEFAULT, BATCH_LANES_MAX, CONNECT_TIMEOUT_MS_DEFAULT,
    CONNECT_TIMEOUT_MS_MAX, OPERATION_TIMEOUT_MS_DEFAULT, OPERATION_TIMEOUT_MS_MAX,
    POOL_SIZE_DEFAULT, POOL_SIZE_MAX, PgOptions, REPLAY_CACHE_BYTES_DEFAULT,
    REPLAY_CACHE_BYTES_MAX, SCHEMA_BYTES_MAX, SCHEMA_DEFAULT, STATEMENT_TIMEOUT_MS_DEFAULT,
    STATEMENT_TIMEOUT_MS_MAX, URL_PARAMETERS, check_url, redact_url,
};
/// The pool, re-exported so callers of [`PgStore::client`] name the same
/// version.
pub use deadpool_postgres;
pub use retry::CONFLICT_RETRIES_MAX;
pub use schema::SCHEMA_VERSION;
/// The driver, re-exported so callers of [`PgStore::claim_in`] name the
/// same `Transaction` type.
pub use tokio_postgres;

/// A [`Store`] in a PostgreSQL schema, shared by any number of nodes.
pub struct PgStore {
    shared: Arc<Shared>,
    /// How the pool connects, for the listener's own connection.
    pg: tokio_postgres::Config,
    /// Claims of new keys, many to a statement.
    claims: Arc<Batcher<ClaimRequest>>,
    /// Completions, many to a statement.
    completions: Arc<Batcher<Completion>>,
    /// Whether writes go through the batchers (`batch_lanes` above 0).
    batching: bool,
    synchronous: replication::Required,
    promotion: window::PromotionWatch,
    window_sql: window::Statements,
    notices: listen::Notices,
}

impl PgStore {
    /// From now on, every new pooled connection compares the server it
    /// reached with the one the schema was last written on, and a server
    /// that is not that one (a promoted standby, a point-in-time restore, a
    /// copy in another cluster) opens the suspect window for `length_ms`
    /// before the connection is used (`0`: never). The connections already
    /// pooled are dropped and one new connection is checked now; returns the
    /// window that check opened, if any. A gateway calls this before it
    /// serves.
    pub async fn open_window_on_promotion(
        &self,
        length_ms: u64,
    ) -> Result<Option<SuspectWindow>, StoreError> {
        self.promotion.set_length(length_ms);
        self.shared.pool.retain(|_, _| false);
        let mut client = self.client().await?;
        // The hook checked it already; a second check finds it recorded.
        let opened = self
            .promotion
            .check(
                &mut client,
                &self.window_sql,
                (&self.shared.ctx.store, self.shared.ctx.clock.as_deref()),
            )
            .await;
        drop(Object::take(client));
        self.shared.pool.retain(|_, _| false);
        opened
    }

    /// Whether the promotion check of [`PgStore::open_window_on_promotion`]
    /// runs: `None` when it was not asked for, [`Watching::Off`] when the
    /// server refused the functions it reads (`pg_control_system()` and
    /// `pg_walfile_name(pg_current_wal_lsn())`: revoked on Aurora, absent
    /// on CockroachDB and YugabyteDB). Off, the store serves as ever, a
    /// promotion or a restore is not noticed, and the window opens only
    /// by [`Store::open_suspect_window`].
    pub fn promotion_check(&self) -> Option<Watching> {
        self.promotion.watching()
    }

    /// Whether completions in other processes are heard
    /// ([`Store::on_completed`]): `None` when nothing asked to hear them,
    /// [`Watching::Off`] when the server refused `LISTEN`. Off, waiters
    /// learn of a completion elsewhere at their next poll.
    pub fn completion_notices(&self) -> Option<Watching> {
        self.notices.watching()
    }

    /// Connects to `url` (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB`),
    /// creating the schema or migrating it to [`SCHEMA_VERSION`]. idem's
    /// own query parameters ([`URL_PARAMETERS`], e.g.
    /// `?schema=gw_a&operation_timeout_ms=2000`) override the fields of
    /// `options` with the same names.
    ///
    /// Opens one connection for the migration and checks nothing more: the
    /// pool opens its connections as operations need them.
    pub async fn connect(url: &str, options: PgOptions) -> Result<PgStore, StoreError> {
        let (store, _) = PgStore::open(url, options, true).await?;
        Ok(store)
    }

    /// Connects to an existing store for inspection: `None` (and nothing
    /// created) when the schema holds no idem tables; an existing older
    /// schema is migrated as by [`PgStore::connect`].
    pub async fn connect_existing(
        url: &str,
        options: PgOptions,
    ) -> Result<Option<PgStore>, StoreError> {
        let (store, found) = PgStore::open(url, options, false).await?;
        Ok((found == Found::Ready).then_some(store))
    }

    /// A pooled connection, for running your own statements (such as a
    /// transaction for [`PgStore::claim_in`]) on the store's pool.
    pub async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.shared.client().await
    }

    /// Claims in the caller's transaction: the same decision as
    /// [`Store::claim`], its write part of `tx`. Commit makes the record
    /// visible together with whatever else `tx` wrote; rollback undoes
    /// both, and the key can be claimed again.
    ///
    /// While `tx` is open, another claimer of the same key waits for it
    /// (it then gets [`Claim::Replay`] after a commit that completed the
    /// record, [`Claim::InFlight`] after one that did not, or acquires
    /// after a rollback, with a lease counted from then); it never
    /// acquires a second time. Keep `tx` short: a waiting claimer holds a
    /// pooled connection. `tx` may be on any connection to the store's
    /// database, e.g. from [`PgStore::client`] (it dereferences to a
    /// [`tokio_postgres::Transaction`]), at `READ COMMITTED`; at stricter
    /// isolation a concurrent claim may fail with a serialization error,
    /// reported as [`StoreError::Unavailable`]: retry the transaction.
    pub async fn claim_in(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        req: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        req.check_labels()?;
        ops::claim_on(&Exec::Foreign(tx), &self.shared.ctx, req).await
    }

    /// Completes in the caller's transaction: the same transition as
    /// [`Store::complete`], its write part of `tx`.
    pub async fn complete_in(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        id: &RecordId,
        token: Token,
        result: StoredResult,
    ) -> Result<Record, StoreError> {
        ops::complete_one(&Exec::Foreign(tx), &self.shared.ctx, id, token, result).await
    }

    /// From now on, every new pooled connection is checked with
    /// [`replication::check`] and refused when the server does not wait for
    /// a synchronous standby (the operation that wanted it fails as
    /// [`StoreError::Unavailable`]); the connections already pooled are
    /// dropped, and one new connection is checked now. A gateway route in
    /// `synchronous` mode calls this before it serves.
    pub async fn require_synchronous_replication(
        &self,
    ) -> Result<replication::ReplicationSettings, replication::ReplicationError> {
        self.shared.pool.retain(|_, _| false);
        let client =
            self.client()
                .await
                .map_err(|e| replication::ReplicationError::Unreadable {
                    store: self.shared.ctx.store.clone(),
                    reason: e.to_string(),
                })?;
        let settings = replication::check(&client, &self.shared.ctx.store).await;
        // Checked on this caller's runtime: not kept for the operations.
        drop(Object::take(client));
        // Only now does the hook check every new connection, so a refusal
        // here names the settings rather than a pool failure.
        self.synchronous.set();
        self.shared.pool.retain(|_, _| false);
        settings
    }

    /// The batches of writes this store has sent ([`PgOptions::batch_lanes`]).
    pub fn batch_stats(&self) -> BatchStats {
        let (claim_batches, claims) = self.claims.counts();
        let (completion_batches, completions) = self.completions.counts();
        BatchStats {
            claim_batches,
            claims,
            completion_batches,
            completions,
        }
    }

    /// The schema holding the store's tables.
    pub fn schema(&self) -> &str {
        &self.shared.ctx.schema.name
    }

    /// The store as messages name it: `postgres://USER@HOST:PORT/DB
    /// (schema S)`, without the password.
    pub fn name(&self) -> &str {
        &self.shared.ctx.store
    }

    async fn open(
        url: &str,
        options: PgOptions,
        create: bool,
    ) -> Result<(PgStore, Found), StoreError> {
        let target = config::target(url, &options)?;
        let store = target.store;
        let options = target.options;
        let ctx = Ctx {
            schema: schema::Schema::new(&options.schema),
            store: store.clone(),
            clock: options.clock,
            replays: idem_core::ReplayCache::new(
                options.replay_cache_bytes.min(REPLAY_CACHE_BYTES_MAX),
            ),
            db_clock: db_clock::DbClock::default(),
            #[cfg(test)]
            cache_clock_behind_ms: std::sync::atomic::AtomicU64::new(0),
        };
        let found = migrate(&target.pg, &ctx, create, target.operation_timeout).await?;
        let pg = target.pg.clone();
        let manager = Manager::from_config(
            target.pg,
            NoTls,
            ManagerConfig {
                // `Fast` checks only that the connection is open; a
                // connection the server closed is discarded on checkout.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let synchronous = replication::Required::default();
        let promotion = window::PromotionWatch::default();
        let window_sql = window::Statements::new(&options.schema);
        let pool = Pool::builder(manager)
            .post_create(synchronous.hook(store.clone()))
            .post_create(promotion.hook(window_sql.clone(), store.clone(), ctx.clock.clone()))
            .max_size(target.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(target.timeout))
            .create_timeout(Some(target.timeout))
            .recycle_timeout(Some(target.timeout))
            .build()
            .map_err(|e| error::unavailable(&store, format!("cannot build the pool: {e}")))?;
        let lanes = options.batch_lanes.min(BATCH_LANES_MAX);
        let shared = Arc::new(Shared {
            pool,
            ctx,
            timeout: target.timeout,
            operation_timeout: target.operation_timeout,
            #[cfg(test)]
            answers_before_commit: std::sync::atomic::AtomicBool::new(false),
        });
        let pg = PgStore {
            batching: lanes > 0,
            claims: Batcher::new(
                lanes,
                store.clone(),
                Shared::runner(&shared, Shared::insert_batch),
            ),
            completions: Batcher::new(
                lanes,
                store.clone(),
                Shared::runner(&shared, Shared::complete_batch),
            ),
            shared,
            pg,
            synchronous,
            promotion,
            window_sql,
            notices: listen::Notices::default(),
        };
        Ok((pg, found))
    }

    /// [`Shared::bounded`], from now.
    async fn bounded<T>(
        &self,
        op: impl AsyncFnOnce(&mut deadpool_postgres::Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.shared.bounded(self.shared.deadline(), op).await
    }

    /// Runs `transition` as a locked read-decide-write in its own
    /// transaction on a pooled connection.
    async fn modify<T>(
        &self,
        id: &RecordId,
        transition: impl FnOnce(Option<&Record>, Timestamp) -> Result<Decided<T>, StoreError>,
    ) -> Result<T, StoreError> {
        self.bounded(async |client| {
            let tx = client
                .transaction()
                .await
                .map_err(|e| self.shared.ctx.error(&e))?;
            let out = ops::modify(&Exec::PooledTx(&tx), &self.shared.ctx, id, transition).await?;
            tx.commit().await.map_err(|e| self.shared.ctx.error(&e))?;
            Ok(out)
        })
        .await
    }

    /// A replay of a record this store saw completed is answered from
    /// memory while the record is surely completed by the database's clock
    /// ([`PgOptions::replay_cache_bytes`]). Otherwise: the fast path in a
    /// batch of claims (one statement and one commit
    /// for every claim of a new key queued meanwhile), then, for a key that
    /// has a record, on a pooled connection in autocommit: a read without
    /// a lock for an answer that writes nothing, then the locked path in a
    /// transaction, retried if the record vanished in between (and, apart,
    /// if a conflict rolled it back: `retry`). One deadline covers it all.
    async fn claim_pooled(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        req.check_labels()?;
        let clock_due = self.shared.ctx.clock_refresh_due();
        if clock_due
            || self
                .shared
                .ctx
                .replays
                .verbs_refresh_due(std::time::Instant::now())
        {
            tokio::spawn(Shared::refresh_clock(Arc::clone(&self.shared), clock_due));
        }
        if let Some(answer) = self.shared.ctx.cached_answer(req) {
            return Ok(answer);
        }
        let deadline = self.shared.deadline();
        let batched = if self.batching {
            tokio::time::timeout_at(deadline, self.claims.submit(req.clone()))
                .await
                .map_err(|_| self.shared.late())??
        } else {
            Inserted::Alone
        };
        let mut insert = match batched {
            Inserted::Acquired {
                claim,
                token,
                waited_ms,
            } => {
                let settled = self
                    .shared
                    .bounded(deadline, async |client| {
                        let exec = Exec::Pooled(client);
                        let acquired = (claim, token, waited_ms);
                        ops::settle_inserted(&exec, &self.shared.ctx, req, acquired).await
                    })
                    .await?;
                if let Some(claim) = settled {
                    return Ok(claim);
                }
                false
            }
            Inserted::Exists => false,
            Inserted::Alone => true,
        };
        let ctx = &self.shared.ctx;
        self.shared
            .bounded(deadline, async |client| {
                for _ in 0..ops::CLAIM_ATTEMPTS_MAX {
                    let exec = Exec::Pooled(client);
                    if insert && let Some(claim) = ops::insert_new(&exec, ctx, req).await? {
                        return Ok(claim);
                    }
                    insert = true;
                    if let Some(claim) = ops::answer_unlocked(&exec, ctx, req).await? {
                        return Ok(claim);
                    }
                    if let Some(claim) = claim_locked(client, ctx, req).await? {
                        return Ok(claim);
                    }
                }
                Err(ops::vanishing(ctx, &req.id))
            })
            .await
    }

    /// A completion in a batch of completions: one statement and one
    /// commit for every completion queued meanwhile.
    async fn complete_pooled(
        &self,
        id: &RecordId,
        token: Token,
        result: StoredResult,
    ) -> Result<Record, StoreError> {
        let deadline = self.shared.deadline();
        if !self.batching {
            return self
                .shared
                .bounded(deadline, async move |client| {
                    let exec = Exec::Pooled(client);
                    ops::complete_one(&exec, &self.shared.ctx, id, token, result).await
                })
                .await;
        }
        let completion = Completion::new(&self.shared.ctx, id, token, result)?;
        tokio::time::timeout_at(deadline, self.completions.submit(completion))
            .await
            .map_err(|_| self.shared.late())?
    }

    async fn purge_pooled(&self, limit: usize) -> Result<PurgeReport, StoreError> {
        if limit == 0 {
            return Ok(PurgeReport::default());
        }
        self.bounded(async |client| {
            let tx = client
                .transaction()
                .await
                .map_err(|e| self.shared.ctx.error(&e))?;
            let report = ops::purge(&Exec::PooledTx(&tx), &self.shared.ctx, limit).await?;
            tx.commit().await.map_err(|e| self.shared.ctx.error(&e))?;
            Ok(report)
        })
        .await
    }
}

/// The batches of writes a [`PgStore`] has sent: each batch is one
/// statement and one commit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Statements inserting new keys.
    pub claim_batches: u64,
    /// Claims they carried.
    pub claims: u64,
    /// Statements completing records.
    pub completion_batches: u64,
    /// Completions they carried.
    pub completions: u64,
}

/// What every operation needs, shared with the tasks that run batches.
struct Shared {
    pool: Pool,
    ctx: Ctx,
    timeout: Duration,
    operation_timeout: Duration,
    /// The mutant the tests must catch: each batch's statement runs in a
    /// transaction that is rolled back after its answers were taken, as a
    /// batch that answers before its commit does when the commit then never
    /// lands (the server dies, the connection breaks).
    #[cfg(test)]
    answers_before_commit: std::sync::atomic::AtomicBool,
}

impl Shared {
    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| error::from_pool(&self.ctx.store, e, self.timeout))
    }

    /// The deadline of an operation starting now.
    fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.operation_timeout
    }

    /// Runs `op` on a pooled connection before `deadline`, which covers
    /// the pool wait and connecting too. Past it, the connection is taken
    /// out of the pool and closed: it is mid-statement and may answer late
    /// or never, and the next operation must not queue behind it. Whatever
    /// `op` had sent may still commit; the caller only hears `Unavailable`.
    async fn bounded<T>(
        &self,
        deadline: tokio::time::Instant,
        op: impl AsyncFnOnce(&mut deadpool_postgres::Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut client = tokio::time::timeout_at(deadline, self.client())
            .await
            .map_err(|_| self.late())??;
        match tokio::time::timeout_at(deadline, op(&mut client)).await {
            Ok(out) => out,
            Err(_) => {
                drop(Object::take(client));
                Err(self.late())
            }
        }
    }

    /// An operation that did not finish within the deadline.
    fn late(&self) -> StoreError {
        error::unavailable(
            &self.ctx.store,
            format!(
                "the operation did not finish within {} ms (operation_timeout_ms): the server \
                 is not answering; it may or may not have applied it",
                self.operation_timeout.as_millis()
            ),
        )
    }

    /// Renews the readings of the database's clock and of its count of
    /// verbs, which bound what the replay cache answers, on a task of its
    /// own so that no claim waits for it; `clock` says whether
    /// [`Ctx::clock_refresh_due`] began it. A failure only leaves the
    /// readings to age: claims then go to the server, which reports it.
    async fn refresh_clock(shared: Arc<Shared>, clock: bool) {
        let deadline = shared.deadline();
        // The outcome is the reading itself, kept by `read_clock`.
        let _ = shared
            .bounded(deadline, async |client| {
                ops::read_clock(&Exec::Pooled(client), &shared.ctx).await
            })
            .await;
        if clock {
            shared.ctx.db_clock.end_refresh();
        }
    }

    /// A batcher's runner calling `run` on this.
    fn runner<I, F>(shared: &Arc<Shared>, run: fn(Arc<Shared>, Vec<I>) -> F) -> batch::RunFn<I>
    where
        I: Batched,
        F: Future<Output = Vec<Result<I::Out, StoreError>>> + Send + 'static,
    {
        let shared = Arc::clone(shared);
        Arc::new(move |items| Box::pin(run(Arc::clone(&shared), items)))
    }

    /// One statement inserting every new key of `reqs`. When it fails
    /// for a reason about its rows rather than the server, each claim is
    /// told to insert alone, so that one bad row fails only its own.
    async fn insert_batch(
        self: Arc<Self>,
        reqs: Vec<ClaimRequest>,
    ) -> Vec<Result<Inserted, StoreError>> {
        let refs: Vec<&ClaimRequest> = reqs.iter().collect();
        let ran = self
            .bounded(self.deadline(), async |client| {
                #[cfg(test)]
                if self.answers_before_commit() {
                    return self
                        .uncommitted(client, async |exec| {
                            Ok(ops::insert_batch(exec, &self.ctx, &refs).await)
                        })
                        .await;
                }
                Ok(ops::insert_batch(&Exec::Pooled(client), &self.ctx, &refs).await)
            })
            .await;
        let failed = match ran {
            Ok(Ok(answers)) => return answers,
            Ok(Err(e)) if reqs.len() > 1 && ops::each_alone(&e) => {
                return reqs.iter().map(|_| Ok(Inserted::Alone)).collect();
            }
            Ok(Err(e)) => self.ctx.error(&e),
            Err(e) => e,
        };
        reqs.iter().map(|_| Err(failed.clone())).collect()
    }

    /// One statement completing every record of `done`. When it fails for
    /// a reason about its rows rather than the server, each completion runs
    /// alone, so that one bad row fails only its own.
    async fn complete_batch(
        self: Arc<Self>,
        done: Vec<Completion>,
    ) -> Vec<Result<Record, StoreError>> {
        let n = done.len();
        let ran = self
            .bounded(self.deadline(), async |client| {
                #[cfg(test)]
                if self.answers_before_commit() {
                    return self
                        .uncommitted(client, async |exec| {
                            ops::complete_batch(exec, &self.ctx, done)
                                .await
                                .map_err(|(e, _)| self.ctx.error(&e))
                        })
                        .await;
                }
                let exec = Exec::Pooled(client);
                match ops::complete_batch(&exec, &self.ctx, done).await {
                    Ok(answers) => Ok(answers),
                    Err((e, done)) if n > 1 && ops::each_alone(&e) => {
                        let mut answers = Vec::with_capacity(n);
                        for c in done {
                            let one = ops::complete_one(&exec, &self.ctx, &c.id, c.token, c.result);
                            answers.push(one.await);
                        }
                        Ok(answers)
                    }
                    Err((e, _)) => Err(self.ctx.error(&e)),
                }
            })
            .await;
        ran.unwrap_or_else(|failed| (0..n).map(|_| Err(failed.clone())).collect())
    }
}

#[cfg(test)]
impl Shared {
    fn answers_before_commit(&self) -> bool {
        self.answers_before_commit
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The mutant's statement: run in a transaction that never commits.
    async fn uncommitted<T>(
        &self,
        client: &mut deadpool_postgres::Client,
        op: impl AsyncFnOnce(&Exec<'_, '_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let tx = client.transaction().await.map_err(|e| self.ctx.error(&e))?;
        let out = op(&Exec::PooledTx(&tx)).await;
        tx.rollback().await.map_err(|e| self.ctx.error(&e))?;
        out
    }
}

impl Batched for ClaimRequest {
    type Out = Inserted;
    fn id(&self) -> &RecordId {
        &self.id
    }
}

impl Batched for Completion {
    type Out = Record;
    fn id(&self) -> &RecordId {
        &self.id
    }
}

impl Store for PgStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, Claim> {
        Box::pin(self.claim_pooled(req))
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        result: StoredResult,
    ) -> StoreFuture<'a, Record> {
        Box::pin(self.complete_pooled(id, token, result))
    }

    fn release<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, ()> {
        Box::pin(self.modify(id, ops::release(id, token)))
    }

    fn mark_ambiguous<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, Record> {
        Box::pin(self.modify(id, ops::mark_ambiguous(id, token)))
    }

    fn note_ambiguity<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        note: AmbiguityNote,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.modify(id, ops::note_ambiguity(id, token, note)))
    }

    fn resolve<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        resolution: Resolution,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(self.modify(id, ops::resolve(id, token, resolution)))
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
        self.shared.ctx.replays.forget(id);
        Box::pin(async move {
            let out = self.modify(id, ops::apply_verb(id, token, request)).await;
            self.shared.ctx.replays.forget(id);
            out
        })
    }

    fn note_failed_lookup<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        next_at: Timestamp,
    ) -> StoreFuture<'a, LookupTries> {
        Box::pin(self.bounded(async move |client| {
            let tx = client
                .transaction()
                .await
                .map_err(|e| self.shared.ctx.error(&e))?;
            let exec = Exec::PooledTx(&tx);
            let noted =
                ops::note_failed_lookup(&exec, &self.shared.ctx, id, token, next_at).await?;
            tx.commit().await.map_err(|e| self.shared.ctx.error(&e))?;
            Ok(noted)
        }))
    }

    fn lookup_tries<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
    ) -> StoreFuture<'a, Option<LookupTries>> {
        Box::pin(self.bounded(async move |client| {
            let kept = ops::tries(&Exec::Pooled(client), &self.shared.ctx, id).await?;
            Ok(decision::tries_of_attempt(kept.as_ref(), token))
        }))
    }

    fn resolutions<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Vec<JournalEntry>> {
        Box::pin(self.bounded(async |client| {
            ops::resolutions(&Exec::Pooled(client), &self.shared.ctx, id).await
        }))
    }

    fn get<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, Option<Record>> {
        Box::pin(
            self.bounded(async |client| {
                ops::get(&Exec::Pooled(client), &self.shared.ctx, id).await
            }),
        )
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> StoreFuture<'a, Listing> {
        Box::pin(self.bounded(async |client| {
            ops::list(&Exec::Pooled(client), &self.shared.ctx, query).await
        }))
    }

    fn purge(&self, limit: usize) -> StoreFuture<'_, PurgeReport> {
        Box::pin(self.purge_pooled(limit))
    }

    /// Marks the record, once this store's listener has `LISTEN` in
    /// place; before that, or on an engine that refuses it, nothing: a
    /// mark only serves the process that hears what it causes, and waiters
    /// poll anyway.
    fn note_waiting<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, ()> {
        if !self.notices.heard() {
            return Box::pin(std::future::ready(Ok(())));
        }
        Box::pin(self.bounded(async move |client| {
            ops::note_waiting(&Exec::Pooled(client), &self.shared.ctx, id).await
        }))
    }

    /// Starts a connection that `LISTEN`s on the schema's channel (its
    /// name: `idem_` and a digest of the schema's); it reconnects after a
    /// second when it ends, for as long as the runtime lives, unless the
    /// server refuses `LISTEN` ([`PgStore::completion_notices`]).
    fn on_completed(&self, wake: idem_core::WakeFn) {
        listen::spawn(
            self.pg.clone(),
            (
                self.shared.ctx.schema.channel.clone(),
                self.shared.ctx.store.clone(),
            ),
            wake,
            self.notices.clone(),
        );
    }

    fn suspect_window(&self) -> StoreFuture<'_, Option<SuspectWindow>> {
        Box::pin(self.bounded(async |client| {
            window::read(&***client, &self.window_sql, &self.shared.ctx.store).await
        }))
    }

    fn open_suspect_window<'a>(
        &'a self,
        opening: &'a WindowOpening,
    ) -> StoreFuture<'a, SuspectWindow> {
        let now = self
            .shared
            .ctx
            .clock
            .as_ref()
            .map(|c| row::int(c.now().as_millis()));
        Box::pin(self.bounded(async move |client| {
            let tx = client
                .transaction()
                .await
                .map_err(|e| self.shared.ctx.error(&e))?;
            let opened = window::open(
                &*tx,
                &self.window_sql,
                &self.shared.ctx.store,
                (now, opening),
            )
            .await?;
            tx.commit().await.map_err(|e| self.shared.ctx.error(&e))?;
            Ok(opened)
        }))
    }

    fn on_window_opened(&self, opened: WindowFn) {
        self.promotion.listen(opened);
    }

    /// The promotion check and the completion notices, each once asked for.
    fn watches(&self) -> Vec<(Watch, Watching)> {
        [
            (Watch::Promotion, self.promotion_check()),
            (Watch::Completions, self.completion_notices()),
        ]
        .into_iter()
        .filter_map(|(watch, watching)| Some((watch, watching?)))
        .collect()
    }
}

/// A claim's locked read-decide-write in a transaction of its own, run
/// again when a conflict rolled it back (`retry`): the `None` of
/// [`ops::claim_locked`] when the record vanished.
async fn claim_locked(
    client: &mut deadpool_postgres::Client,
    ctx: &Ctx,
    req: &ClaimRequest,
) -> Result<Option<Claim>, StoreError> {
    let mut retries = 0;
    loop {
        let conflict = retry::Conflict::default();
        let attempt = async {
            let tx = client.transaction().await.map_err(|e| ctx.error(&e))?;
            let claim = ops::claim_locked(&Exec::RetriedTx(&tx, &conflict), ctx, req).await?;
            tx.commit().await.map_err(|e| {
                conflict.note(&e);
                ctx.error(&e)
            })?;
            Ok(claim)
        };
        match attempt.await {
            Err(_) if conflict.seen() && retries < retry::CONFLICT_RETRIES_MAX => {
                retries += 1;
                retry::pause(retries).await;
            }
            answer => return answer,
        }
    }
}

/// Creates or migrates the schema on a connection of its own, closed
/// afterwards: the pool starts empty, and opens its connections on the
/// runtime of the operations that need them.
async fn migrate(
    pg: &tokio_postgres::Config,
    ctx: &Ctx,
    create: bool,
    operation_timeout: Duration,
) -> Result<Found, StoreError> {
    // `connect_timeout` bounds the TCP connect only; a server that accepts
    // and then says nothing must not hang the start either.
    let timeout = pg.get_connect_timeout().copied().unwrap_or_default();
    let (mut client, connection) = tokio::time::timeout(timeout, pg.connect(NoTls))
        .await
        .map_err(|_| {
            error::unavailable(
                &ctx.store,
                format!(
                    "the server did not answer within {} ms",
                    timeout.as_millis()
                ),
            )
        })?
        .map_err(|e| error::from_pg(&ctx.store, &e))?;
    let driver = tokio::spawn(connection);
    let found = tokio::time::timeout(
        operation_timeout,
        schema::migrate(&mut client, &ctx.schema, &ctx.store, create),
    )
    .await
    .unwrap_or_else(|_| {
        Err(error::unavailable(
            &ctx.store,
            format!(
                "creating or checking the schema did not finish within {} ms \
                 (operation_timeout_ms): the server is not answering",
                operation_timeout.as_millis()
            ),
        ))
    });
    drop(client);
    if found.is_err() {
        // A server that stopped answering would keep the driver waiting.
        driver.abort();
    }
    // The connection ends once the client is gone; wait for it so that it
    // closes cleanly even if the caller's runtime stops right after.
    let _ = driver.await;
    found
}

//! Every store operation as statements over one connection or transaction:
//! the fast path for a new key, the locked read-decide-write for the rest,
//! reads, and the purge. The decisions are `idem_core::decision`'s; this
//! module only reads the record, asks, and applies the answer.
//!
//! The same functions serve the pooled store and a caller's own transaction
//! ([`Exec`]), so a claim in the caller's transaction is the store's claim.

use std::slice;
use std::sync::Arc;
use std::time::Instant;

use idem_core::decision::{self, Plan, Write};
use idem_core::{
    AmbiguityNote, Claim, ClaimRequest, Clock, JOURNAL_PER_RECORD_MAX, JournalEntry,
    LIST_LIMIT_MAX, ListQuery, Listing, LookupTries, PurgeReport, Record, RecordId, ReplayCache,
    Resolution, State, StoreError, StoredResult, Timestamp, Token, Verb, VerbRequest,
};
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use crate::db_clock::DbClock;
use crate::error;
use crate::retry::{self, CONFLICT_RETRIES_MAX, Conflict};
use crate::row::{self, Columns, Param, int};
use crate::schema::{Schema, now_param};

/// How many times a claim retries when the record it conflicted with is
/// gone before it could be locked (released or purged in between).
pub(crate) const CLAIM_ATTEMPTS_MAX: usize = 3;

/// A fast-path insert that took longer than this (it waited for another
/// transaction inserting the same key, which then rolled back) restarts
/// its lease from the database's clock after the wait.
const FAST_PATH_WAIT_MS_MAX: u64 = 10;

/// Where statements run.
pub(crate) enum Exec<'a, 't> {
    /// A pooled connection, outside a transaction: statements are prepared
    /// once per connection.
    Pooled(&'a deadpool_postgres::Client),
    /// A transaction on a pooled connection.
    PooledTx(&'a deadpool_postgres::Transaction<'t>),
    /// A transaction on a pooled connection that is run again when a
    /// conflict rolled it back: a statement that meets one notes it.
    RetriedTx(&'a deadpool_postgres::Transaction<'t>, &'a Conflict),
    /// The caller's transaction: typed statements, one round trip each,
    /// nothing left prepared on a connection the store does not own.
    Foreign(&'a tokio_postgres::Transaction<'t>),
}

impl Exec<'_, '_> {
    /// On the store's own connections `sql` is prepared once per
    /// connection and run from its generic plan (`config::PLANNER_SETTINGS`);
    /// in the caller's transaction it is a typed statement.
    async fn query(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let values = || -> Vec<&(dyn ToSql + Sync)> { params.iter().map(|(v, _)| *v).collect() };
        match self {
            Exec::Pooled(client) => {
                let stmt = client.prepare_cached(sql).await?;
                client.query(&stmt, &values()).await
            }
            Exec::PooledTx(tx) | Exec::RetriedTx(tx, _) => {
                let stmt = tx.prepare_cached(sql).await?;
                tx.query(&stmt, &values()).await
            }
            Exec::Foreign(tx) => tx.query_typed(sql, params).await,
        }
    }
}

/// What every operation needs besides a connection: the statements, the
/// store's name for messages, the clock (`None`: the database's), and the
/// completed records kept to answer replays with what the database's
/// clock is known to read.
pub(crate) struct Ctx {
    pub(crate) schema: Schema,
    pub(crate) store: String,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) replays: ReplayCache,
    pub(crate) db_clock: DbClock,
    /// The mutant the tests must catch: the replay cache judges expiry by
    /// a reading of the store's clock this many milliseconds behind it.
    #[cfg(test)]
    pub(crate) cache_clock_behind_ms: std::sync::atomic::AtomicU64,
}

impl Ctx {
    /// A replay answered from memory: the kept record is completed at the
    /// latest the store's clock can read now (the injected clock's now, or
    /// the bound on the database's), so the store would answer the same.
    pub(crate) fn cached_answer(&self, req: &ClaimRequest) -> Option<Claim> {
        let latest = match &self.clock {
            Some(clock) => clock.now(),
            None => self.db_clock.latest_at(Instant::now())?,
        };
        #[cfg(test)]
        let latest = Timestamp::from_millis(
            latest.as_millis().saturating_sub(
                self.cache_clock_behind_ms
                    .load(std::sync::atomic::Ordering::Relaxed),
            ),
        );
        self.replays
            .answer_while_completed(req, latest, Instant::now())
    }

    /// Whether a claim should renew the reading of the database's clock
    /// that bounds what memory answers ([`DbClock::begin_refresh`]): never
    /// with an injected clock or with the cache off.
    pub(crate) fn clock_refresh_due(&self) -> bool {
        if self.clock.is_some() || !self.db_clock.begin_refresh(Instant::now()) {
            return false;
        }
        if self.replays.usage().0 == 0 {
            self.db_clock.end_refresh();
            return false;
        }
        true
    }

    /// The injected clock's now, bound as `$1` of every time-reading
    /// statement; NULL selects the database's clock.
    fn now(&self) -> Option<i64> {
        self.clock.as_ref().map(|c| int(c.now().as_millis()))
    }

    pub(crate) fn error(&self, e: &tokio_postgres::Error) -> StoreError {
        error::from_pg(&self.store, e)
    }

    async fn query(
        &self,
        exec: &Exec<'_, '_>,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, StoreError> {
        self.run(exec, sql, params)
            .await
            .map_err(|e| self.error(&e))
    }

    /// `sql` on `exec`; the server's error as it came. In autocommit, a
    /// statement a conflict rolled back runs again (`retry`); in a
    /// transaction run again as a whole, the conflict is noted for it.
    async fn run(
        &self,
        exec: &Exec<'_, '_>,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let mut retries = 0;
        loop {
            let ran = exec.query(sql, params).await;
            let Err(e) = &ran else {
                return ran;
            };
            match exec {
                Exec::Pooled(_) if retry::conflict(e) && retries < CONFLICT_RETRIES_MAX => {
                    retries += 1;
                    retry::pause(retries).await;
                }
                Exec::RetriedTx(_, conflict) => {
                    conflict.note(e);
                    return ran;
                }
                _ => return ran,
            }
        }
    }

    /// A value of a row this store wrote that does not read back.
    fn damaged(&self, what: &str, why: String) -> StoreError {
        error::damaged(&self.store, what, &why)
    }
}

/// The fast path: a new key in one statement, the values those of
/// `decision::claim(None, …)` at the statement's now with a token from the
/// sequence. `None` when a record exists (the statement changed nothing).
pub(crate) async fn insert_new(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    req: &ClaimRequest,
) -> Result<Option<Claim>, StoreError> {
    let now = ctx.now();
    let fingerprint: &[u8] = req.fingerprint.as_bytes();
    let (lease, retention, tombstone) = (
        int(req.policy.lease_ms()),
        int(req.policy.retention_s()),
        int(req.policy.tombstone_s()),
    );
    let region = req.region.as_deref();
    let params: [Param<'_>; 9] = [
        now_param(&now),
        (&req.id.scope.as_str(), Type::TEXT),
        (&req.id.key.as_str(), Type::TEXT),
        (&fingerprint, Type::BYTEA),
        (&req.owner, Type::TEXT),
        (&lease, Type::INT8),
        (&retention, Type::INT8),
        (&tombstone, Type::INT8),
        (&region, Type::TEXT),
    ];
    let rows = ctx.query(exec, &ctx.schema.insert_new, &params).await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let acquired = acquired(ctx, req, row)?;
    settle_inserted(exec, ctx, req, acquired).await
}

/// The claim's answer from a read that takes no lock, when the decision on
/// the record it finds writes nothing (`decision::answer_without_write`: a
/// replay, a 409, a 422, a late replay, an unknown outcome); `None` sends
/// the claim to the locked path. Only in autocommit: the statement's
/// snapshot is taken after the claim began, so the record it read held at
/// an instant of the claim, and its clock is read in the same statement.
/// A caller's transaction may hold an older snapshot, so `claim_in` locks.
pub(crate) async fn answer_unlocked(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    req: &ClaimRequest,
) -> Result<Option<Claim>, StoreError> {
    if !matches!(exec, Exec::Pooled(_)) {
        return Ok(None);
    }
    let now = ctx.now();
    let params: [Param<'_>; 3] = [
        now_param(&now),
        (&req.id.scope.as_str(), Type::TEXT),
        (&req.id.key.as_str(), Type::TEXT),
    ];
    let since = ctx.replays.generation();
    let sent = Instant::now();
    let rows = ctx.query(exec, &ctx.schema.peek, &params).await?;
    let received = Instant::now();
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let now = row::time(row, 0, "now_ms").map_err(|why| ctx.damaged(&req.id.to_string(), why))?;
    ctx.db_clock.note(sent, received, now);
    // A row that does not read back is for the locked path to report.
    let Ok(Some(seen)) = row::decode(row, 1, &ctx.store) else {
        return Ok(None);
    };
    let answer = decision::answer_without_write(Some(&seen), req, now);
    if let Some(Claim::Replay { record }) = &answer {
        ctx.replays.keep(record, since);
    }
    Ok(answer)
}

/// The locked read-decide-write for a key that has a record: the shared
/// claim decision at the time the lock was granted, a token from the
/// sequence only if it acquires, its write applied. `None` when the record
/// vanished since the fast path saw it.
pub(crate) async fn claim_locked(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    req: &ClaimRequest,
) -> Result<Option<Claim>, StoreError> {
    let (now, existing) = lock(exec, ctx, &req.id).await?;
    let Some(existing) = existing else {
        return Ok(None);
    };
    let (claim, write) = match decision::plan(Some(&existing), req, now) {
        Plan::Answer(claim, write) => (claim, write),
        Plan::Acquire { took_over } => {
            let token = next_token(exec, ctx).await?;
            decision::acquire(req, now, token, took_over)
        }
    };
    apply(exec, ctx, &req.id, write).await?;
    Ok(Some(claim))
}

/// A claim: the fast path (a new key, or in autocommit an answer that
/// writes nothing), then the locked path, again if the record vanished in
/// between (bounded by [`CLAIM_ATTEMPTS_MAX`]). On one connection, so in
/// the caller's transaction this is the whole claim.
pub(crate) async fn claim_on(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    req: &ClaimRequest,
) -> Result<Claim, StoreError> {
    for _ in 0..CLAIM_ATTEMPTS_MAX {
        if let Some(claim) = insert_new(exec, ctx, req).await? {
            return Ok(claim);
        }
        if let Some(claim) = answer_unlocked(exec, ctx, req).await? {
            return Ok(claim);
        }
        if let Some(claim) = claim_locked(exec, ctx, req).await? {
            return Ok(claim);
        }
    }
    Err(vanishing(ctx, &req.id))
}

/// The claim could not settle: the record kept disappearing between the
/// insert and the lock. Nothing was acquired.
pub(crate) fn vanishing(ctx: &Ctx, id: &RecordId) -> StoreError {
    error::unavailable(
        &ctx.store,
        format!(
            "the record for scope {:?} key {:?} was removed {CLAIM_ATTEMPTS_MAX} times while \
             claiming it; nothing was claimed, retry",
            id.scope.as_str(),
            id.key.as_str()
        ),
    )
}

/// What a transition for [`modify`] decided: the answer, the write to
/// apply, and the journal entry to append with it (resolutions and verbs
/// only).
pub(crate) type Decided<T> = (T, Write, Option<JournalEntry>);

/// Locked read-decide-write on one record: `transition` gets the record
/// (if any) and the time the lock was granted, and returns the answer, the
/// write to apply and the journal entry to append, both in the caller's
/// transaction.
pub(crate) async fn modify<T>(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    id: &RecordId,
    transition: impl FnOnce(Option<&Record>, Timestamp) -> Result<Decided<T>, StoreError>,
) -> Result<T, StoreError> {
    let (now, existing) = lock(exec, ctx, id).await?;
    let (out, write, entry) = transition(existing.as_ref(), now)?;
    apply(exec, ctx, id, write).await?;
    if let Some(entry) = entry {
        append_journal(exec, ctx, &entry).await?;
        if entry.verb.is_some() {
            // Every gateway reads the count and forgets the replays it
            // keeps (`Ctx::cached_answer`).
            ctx.query(exec, &ctx.schema.verbs_count, &[]).await?;
        }
        // A resolution or a verb ends the ambiguity, and its failed lookups
        // with it.
        let params: [Param<'_>; 2] = [
            (&id.scope.as_str(), Type::TEXT),
            (&id.key.as_str(), Type::TEXT),
        ];
        ctx.query(exec, &ctx.schema.tries_delete, &params).await?;
    }
    Ok(out)
}

/// `decision::note_failed_lookup` under the record's lock: the record and
/// the tries kept for it read, the new tries written, in the caller's
/// transaction.
pub(crate) async fn note_failed_lookup(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    id: &RecordId,
    token: Token,
    next_at: Timestamp,
) -> Result<LookupTries, StoreError> {
    let (now, existing) = lock(exec, ctx, id).await?;
    let kept = tries(exec, ctx, id).await?;
    let noted =
        decision::note_failed_lookup(existing.as_ref(), kept.as_ref(), id, token, next_at, now)?;
    let (token, failures, next_at) = (
        int(noted.token.0),
        i64::from(noted.failures),
        int(noted.next_at.as_millis()),
    );
    let params: [Param<'_>; 5] = [
        (&id.scope.as_str(), Type::TEXT),
        (&id.key.as_str(), Type::TEXT),
        (&token, Type::INT8),
        (&failures, Type::INT8),
        (&next_at, Type::INT8),
    ];
    ctx.query(exec, &ctx.schema.tries_put, &params).await?;
    Ok(noted)
}

/// The failed lookups kept for `id`, whichever attempt they are about.
pub(crate) async fn tries(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    id: &RecordId,
) -> Result<Option<LookupTries>, StoreError> {
    let params: [Param<'_>; 2] = [
        (&id.scope.as_str(), Type::TEXT),
        (&id.key.as_str(), Type::TEXT),
    ];
    let rows = ctx.query(exec, &ctx.schema.tries_get, &params).await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let damaged = |why: String| ctx.damaged(&format!("the failed lookups of {id}"), why);
    let token = row::unsigned(row, 0, "token").map_err(damaged)?;
    let failures = row::unsigned(row, 1, "failures").map_err(damaged)?;
    let failures = u32::try_from(failures)
        .map_err(|_| damaged(format!("failures is {failures}, more than a u32")))?;
    let next_at = row::time(row, 2, "next_at_ms").map_err(damaged)?;
    Ok(Some(LookupTries {
        token: Token(token),
        failures,
        next_at,
    }))
}

/// Notes that a request waits on the attempt holding `id`, so that its
/// completion notifies the schema's channel. A record no longer in
/// progress is left alone: its answer is already there to be claimed.
pub(crate) async fn note_waiting(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    id: &RecordId,
) -> Result<(), StoreError> {
    let params: [Param<'_>; 2] = [
        (&id.scope.as_str(), Type::TEXT),
        (&id.key.as_str(), Type::TEXT),
    ];
    ctx.query(exec, &ctx.schema.wait_note, &params).await?;
    Ok(())
}

/// `decision::complete` in one statement and one round trip: the SQL locks
/// the record, reads it as it was and writes the completion only where the
/// decision's fencing check passes; the row it returns is then held to the
/// decision on the record as read, so a statement that ever disagreed with
/// `decision::complete` is reported as a bug instead of answered.
pub(crate) async fn complete_one(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    id: &RecordId,
    token: Token,
    result: StoredResult,
) -> Result<Record, StoreError> {
    let now = ctx.now();
    let token_param = int(token.0);
    let status = i32::from(result.status());
    let headers = encode_headers(ctx, &result)?;
    let body = result.body();
    let params: [Param<'_>; 7] = [
        now_param(&now),
        (&id.scope.as_str(), Type::TEXT),
        (&id.key.as_str(), Type::TEXT),
        (&token_param, Type::INT8),
        (&status, Type::INT4),
        (&headers, Type::TEXT),
        (&body, Type::BYTEA),
    ];
    let rows = ctx.query(exec, &ctx.schema.complete, &params).await?;
    let row = rows
        .first()
        .ok_or_else(|| ctx.damaged(&id.to_string(), "the completion returned no row".into()))?;
    held_to_decision(ctx, id, token, result, row)
}

/// A completion's row (the time, the record as it was, the record as
/// written) held to `decision::complete` on the record as it was: the
/// written record when they agree, the decision's refusal when nothing was
/// written, and a bug reported when the statement ever disagreed.
fn held_to_decision(
    ctx: &Ctx,
    id: &RecordId,
    token: Token,
    result: StoredResult,
    row: &Row,
) -> Result<Record, StoreError> {
    let now = row::time(row, 0, "now_ms").map_err(|why| ctx.damaged(&id.to_string(), why))?;
    let old = row::decode(row, 1, &ctx.store)?;
    let written = row::decode(row, 1 + row::COLUMNS.len(), &ctx.store)?;
    match (
        decision::complete(old.as_ref(), id, token, result, now),
        written,
    ) {
        (Ok(done), Some(written)) if done == written => Ok(done),
        (Err(refused), None) => Err(refused),
        (decided, written) => Err(StoreError::Incompatible {
            store: ctx.store.clone(),
            reason: format!(
                "the completion of {id} wrote {written:?}, but the decision answers \
                 {decided:?}; this is a bug in idem-postgres"
            ),
        }),
    }
}

/// `decision::release` as a transition for [`modify`]: the record deleted.
pub(crate) fn release(
    id: &RecordId,
    token: Token,
) -> impl FnOnce(Option<&Record>, Timestamp) -> Result<Decided<()>, StoreError> + Send + '_ {
    move |existing, now| {
        decision::release(existing, id, token, now)?;
        Ok(((), Write::Delete, None))
    }
}

/// `decision::mark_ambiguous` as a transition for [`modify`].
pub(crate) fn mark_ambiguous(
    id: &RecordId,
    token: Token,
) -> impl FnOnce(Option<&Record>, Timestamp) -> Result<Decided<Record>, StoreError> + Send + '_ {
    move |existing, now| {
        let marked = decision::mark_ambiguous(existing, id, token, now)?;
        Ok((marked.clone(), Write::Put(marked), None))
    }
}

/// `decision::note_ambiguity` as a transition for [`modify`].
pub(crate) fn note_ambiguity(
    id: &RecordId,
    token: Token,
    note: AmbiguityNote,
) -> impl FnOnce(Option<&Record>, Timestamp) -> Result<Decided<()>, StoreError> + Send + '_ {
    move |existing, now| {
        let noted = decision::note_ambiguity(existing, id, token, note, now)?;
        Ok(((), Write::Put(noted), None))
    }
}

/// `decision::resolve` as a transition for [`modify`]: the completed record,
/// or `None` when it was released as not executed, and its journal entry.
pub(crate) fn resolve(
    id: &RecordId,
    token: Token,
    resolution: Resolution,
) -> impl FnOnce(Option<&Record>, Timestamp) -> Result<Decided<Option<Record>>, StoreError> + Send + '_
{
    move |existing, now| {
        let (write, entry) = decision::resolve(existing, id, token, resolution, now)?;
        let out = match &write {
            Write::Put(record) => Some(record.clone()),
            _ => None,
        };
        Ok((out, write, Some(entry)))
    }
}

/// `decision::apply_verb` as a transition for [`modify`]: the tombstone an
/// `expire` left, or `None` after an `evict`, and its journal entry.
pub(crate) fn apply_verb(
    id: &RecordId,
    token: Token,
    request: VerbRequest,
) -> impl FnOnce(Option<&Record>, Timestamp) -> Result<Decided<Option<Record>>, StoreError> + Send + '_
{
    move |existing, now| {
        let (write, entry) = decision::apply_verb(existing, id, token, &request, now)?;
        let out = match &write {
            Write::Put(record) => Some(record.clone()),
            _ => None,
        };
        Ok((out, write, Some(entry)))
    }
}

/// The newest [`JOURNAL_PER_RECORD_MAX`] journal entries of `id`, oldest
/// first.
pub(crate) async fn resolutions(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    id: &RecordId,
) -> Result<Vec<JournalEntry>, StoreError> {
    let limit = int(JOURNAL_PER_RECORD_MAX as u64);
    let params: [Param<'_>; 3] = [
        (&id.scope.as_str(), Type::TEXT),
        (&id.key.as_str(), Type::TEXT),
        (&limit, Type::INT8),
    ];
    let rows = ctx.query(exec, &ctx.schema.journal_get, &params).await?;
    rows.iter()
        .map(|row| row::decode_entry(row, id, &ctx.store))
        .collect()
}

/// Appends `entry` to the journal and keeps the newest
/// [`JOURNAL_PER_RECORD_MAX`] entries of its record, in one statement. Run
/// it under the record's lock, which numbers the entries without a race.
async fn append_journal(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    entry: &JournalEntry,
) -> Result<(), StoreError> {
    let token = int(entry.token.0);
    let status = entry.status.map(i32::from);
    let (by, reason) = (entry.by.as_bytes(), entry.reason.as_bytes());
    let at = int(entry.at.as_millis());
    let keep = int(JOURNAL_PER_RECORD_MAX as u64);
    let verb = entry.verb.map(Verb::as_str);
    let params: [Param<'_>; 10] = [
        (&entry.id.scope.as_str(), Type::TEXT),
        (&entry.id.key.as_str(), Type::TEXT),
        (&token, Type::INT8),
        (&entry.outcome.as_str(), Type::TEXT),
        (&status, Type::INT4),
        (&by, Type::BYTEA),
        (&reason, Type::BYTEA),
        (&at, Type::INT8),
        (&keep, Type::INT8),
        (&verb, Type::TEXT),
    ];
    ctx.query(exec, &ctx.schema.journal_append, &params).await?;
    Ok(())
}

/// The record, as stored.
pub(crate) async fn get(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    id: &RecordId,
) -> Result<Option<Record>, StoreError> {
    let params: [Param<'_>; 2] = [
        (&id.scope.as_str(), Type::TEXT),
        (&id.key.as_str(), Type::TEXT),
    ];
    let rows = ctx.query(exec, &ctx.schema.get, &params).await?;
    match rows.first() {
        Some(row) => row::decode(row, 0, &ctx.store),
        None => Ok(None),
    }
}

/// Records in (scope, key) byte order after the cursor, filtered by their
/// state at the store's now, exactly like the memory store.
pub(crate) async fn list(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    query: &ListQuery,
) -> Result<Listing, StoreError> {
    let now = ctx.now();
    let limit = int(query.effective_limit() as u64);
    let (after_scope, after_key) = match &query.after {
        Some(after) => (after.scope.as_str(), after.key.as_str()),
        None => ("", ""),
    };
    let mut params: Vec<Param<'_>> = Vec::with_capacity(4);
    let mut clauses: Vec<&str> = Vec::with_capacity(2);
    let mut sql = match query.state.map(state_clause) {
        Some(clause) if clause.contains("now.ms") => {
            params.push(now_param(&now));
            clauses.push(clause);
            ctx.schema.select_at_now.clone()
        }
        Some(clause) => {
            clauses.push(clause);
            ctx.schema.select.clone()
        }
        None => ctx.schema.select.clone(),
    };
    let cursor;
    if query.after.is_some() {
        params.push((&after_scope, Type::TEXT));
        params.push((&after_key, Type::TEXT));
        let n = params.len();
        cursor = format!("(scope, key) > (${}, ${n})", n - 1);
        clauses.push(&cursor);
    }
    if !clauses.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&clauses.join(" AND "));
    }
    params.push((&limit, Type::INT8));
    sql.push_str(&format!(" ORDER BY scope, key LIMIT ${}", params.len()));
    let rows = ctx.query(exec, &sql, &params).await?;
    let (mut records, mut damaged, mut last) = (Vec::with_capacity(rows.len()), Vec::new(), None);
    for row in &rows {
        let (at, decoded) = row::decode_listed(row, 0);
        match decoded {
            Ok(record) => records.push(record),
            Err(bad) => damaged.push(bad),
        }
        last = Some(at);
    }
    Ok(Listing::page(
        records,
        damaged,
        last,
        rows.len(),
        query.effective_limit(),
    ))
}

/// Applies `decision::purge` to the first `limit` records it would change,
/// the longest due first (`decision::purge_due`), then in (scope, key)
/// order, locked, as the memory store does. Run it in a transaction so the
/// locks hold until the writes commit.
pub(crate) async fn purge(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    limit: usize,
) -> Result<PurgeReport, StoreError> {
    let mut report = PurgeReport::default();
    let limit = int(limit.min(LIST_LIMIT_MAX) as u64);
    if limit == 0 {
        return Ok(report);
    }
    let now = ctx.now();
    let params: [Param<'_>; 2] = [now_param(&now), (&limit, Type::INT8)];
    let rows = ctx.query(exec, &ctx.schema.purge, &params).await?;
    let (mut puts, mut deletes) = (Vec::new(), Vec::new());
    for row in &rows {
        let now = row::time(row, 0, "now").map_err(|why| ctx.damaged("the purge", why))?;
        // A row that cannot be read is left for a person and counted; it
        // must not stop the purge of every other record.
        let Ok(record) = row::decode_listed(row, 1).1 else {
            report.damaged += 1;
            continue;
        };
        match decision::purge(&record, now) {
            Write::None => {}
            Write::Put(tombstone) => puts.push(tombstone),
            Write::Delete => deletes.push(record.id),
        }
    }
    report.tombstoned = puts.len() as u64;
    report.deleted = deletes.len() as u64;
    put(exec, ctx, &puts).await?;
    delete(exec, ctx, &deletes).await?;
    Ok(report)
}

/// `Record::state_at(now) == state` in SQL, reading `now.ms` in the
/// completed and tombstone cases. The literal `state = 'ambiguous'` lets
/// PostgreSQL use the partial index `records_ambiguous`.
fn state_clause(state: State) -> &'static str {
    match state {
        State::InProgress => "state = 'in_progress'",
        State::Ambiguous => "state = 'ambiguous'",
        State::Completed => {
            "(state = 'completed' AND (expires_at_ms IS NULL OR expires_at_ms > now.ms))"
        }
        State::Tombstone => {
            "(state = 'tombstone' OR (state = 'completed' AND expires_at_ms <= now.ms))"
        }
    }
}

/// Reads what the fast path's insert or a lease restart returned (token,
/// `created_at_ms`, `lease_until_ms`, the time after the statement): the
/// answer of the shared decision for those values, checked against the
/// lease the SQL stored, the token, and how long the statement waited in
/// milliseconds.
fn acquired(ctx: &Ctx, req: &ClaimRequest, row: &Row) -> Result<(Claim, Token, u64), StoreError> {
    let mut values = [0u64; 4];
    for (idx, name) in ["token", "created_at_ms", "lease_until_ms", "now_ms"]
        .into_iter()
        .enumerate()
    {
        values[idx] =
            row::unsigned(row, idx, name).map_err(|why| ctx.damaged("a new record", why))?;
    }
    let [token, created_at, stored_lease_until, after] = values;
    let (token, created_at) = (Token(token), Timestamp::from_millis(created_at));
    let (claim, _) = decision::acquire(req, created_at, token, None);
    match claim {
        Claim::Acquired { lease_until, .. } if lease_until.as_millis() == stored_lease_until => {
            Ok((claim, token, after.saturating_sub(created_at.as_millis())))
        }
        other => Err(StoreError::Incompatible {
            store: ctx.store.clone(),
            reason: format!(
                "the fast path stored lease_until_ms {stored_lease_until} for {}, but the \
                 decision answers {other:?}; this is a bug in idem-postgres",
                req.id
            ),
        }),
    }
}

/// The fast-path insert waited for another transaction inserting the same
/// key (which rolled back), so its lease started before the wait. Restart
/// it from the clock after the wait, as the decision would have had it
/// run then; if the record changed meanwhile, decide on it as it is.
async fn restart_lease(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    req: &ClaimRequest,
    token: Token,
) -> Result<Option<Claim>, StoreError> {
    let now = ctx.now();
    let (lease, token_param) = (int(req.policy.lease_ms()), int(token.0));
    let params: [Param<'_>; 5] = [
        now_param(&now),
        (&req.id.scope.as_str(), Type::TEXT),
        (&req.id.key.as_str(), Type::TEXT),
        (&token_param, Type::INT8),
        (&lease, Type::INT8),
    ];
    let rows = ctx.query(exec, &ctx.schema.restart_lease, &params).await?;
    match rows.first() {
        Some(row) => acquired(ctx, req, row).map(|(claim, _, _)| Some(claim)),
        None => Ok(None),
    }
}

/// The record (if any), locked until the transaction ends, and the time
/// read after the lock was granted.
async fn lock(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    id: &RecordId,
) -> Result<(Timestamp, Option<Record>), StoreError> {
    let now = ctx.now();
    let params: [Param<'_>; 3] = [
        now_param(&now),
        (&id.scope.as_str(), Type::TEXT),
        (&id.key.as_str(), Type::TEXT),
    ];
    let rows = ctx.query(exec, &ctx.schema.lock, &params).await?;
    let row = rows
        .first()
        .ok_or_else(|| ctx.damaged(&id.to_string(), "the locked read returned no row".into()))?;
    let now = row::time(row, 0, "now_ms").map_err(|why| ctx.damaged(&id.to_string(), why))?;
    Ok((now, row::decode(row, 1, &ctx.store)?))
}

/// Reads the database's clock and its count of verbs, and keeps both
/// readings for [`Ctx::cached_answer`] ([`Ctx::clock_refresh_due`]).
pub(crate) async fn read_clock(exec: &Exec<'_, '_>, ctx: &Ctx) -> Result<(), StoreError> {
    let now = ctx.now();
    let params: [Param<'_>; 1] = [now_param(&now)];
    let sent = Instant::now();
    let rows = ctx.query(exec, &ctx.schema.clock, &params).await?;
    let received = Instant::now();
    let Some(row) = rows.first() else {
        let why = "the clock's statement returned no row".to_owned();
        return Err(ctx.damaged("the database's clock", why));
    };
    let now =
        row::time(row, 0, "now_ms").map_err(|why| ctx.damaged("the database's clock", why))?;
    let verbs =
        row::unsigned(row, 1, "verbs").map_err(|why| ctx.damaged("the count of verbs", why))?;
    ctx.db_clock.note(sent, received, now);
    ctx.replays.note_verbs(verbs, sent);
    Ok(())
}

async fn next_token(exec: &Exec<'_, '_>, ctx: &Ctx) -> Result<Token, StoreError> {
    let rows = ctx.query(exec, &ctx.schema.next_token, &[]).await?;
    let token = match rows.first() {
        Some(row) => row::unsigned(row, 0, "nextval"),
        None => Err("nextval returned no row".to_owned()),
    };
    token
        .map(Token)
        .map_err(|why| ctx.damaged("the tokens sequence", why))
}

async fn apply(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    id: &RecordId,
    write: Write,
) -> Result<(), StoreError> {
    match write {
        Write::None => Ok(()),
        Write::Put(record) => put(exec, ctx, slice::from_ref(&record)).await,
        Write::Delete => delete(exec, ctx, slice::from_ref(id)).await,
    }
}

/// Inserts or replaces `records` in one statement.
async fn put(exec: &Exec<'_, '_>, ctx: &Ctx, records: &[Record]) -> Result<(), StoreError> {
    if records.is_empty() {
        return Ok(());
    }
    let columns = Columns::new(records)
        .map_err(|e| ctx.damaged("a record to write", format!("cannot encode it: {e}")))?;
    ctx.query(exec, &ctx.schema.put, &columns.params()).await?;
    Ok(())
}

/// Deletes the records of `ids` in one statement.
async fn delete(exec: &Exec<'_, '_>, ctx: &Ctx, ids: &[RecordId]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let scopes: Vec<&str> = ids.iter().map(|id| id.scope.as_str()).collect();
    let keys: Vec<&str> = ids.iter().map(|id| id.key.as_str()).collect();
    let params: [Param<'_>; 2] = [(&scopes, Type::TEXT_ARRAY), (&keys, Type::TEXT_ARRAY)];
    ctx.query(exec, &ctx.schema.delete, &params).await?;
    Ok(())
}

/// One claim's share of a batched insert ([`insert_batch`]).
pub(crate) enum Inserted {
    /// Its key was new: acquired, with the token and how long the
    /// statement had waited when it inserted the row.
    Acquired {
        claim: Claim,
        token: Token,
        waited_ms: u64,
    },
    /// Its key has a record: the claim goes on as an unbatched one would
    /// after its insert changed nothing.
    Exists,
    /// The statement failed for a reason about some row ([`each_alone`]):
    /// the claim inserts alone.
    Alone,
}

/// Whether a failed batch statement should be tried again write by write:
/// an error about one row's values or about the statement meeting another
/// transaction (a deadlock, a serialization failure) says nothing about
/// the other rows, which must not fail with it. Anything else (the server
/// is down, the deadline passed) would fail each of them alone too.
pub(crate) fn each_alone(e: &tokio_postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else {
        return false;
    };
    matches!(db.code().code().get(..2), Some("22" | "23" | "40" | "54"))
}

/// The fast path for many claims in one statement (one commit): each
/// request's answer as [`insert_new`] would give it, in the order given.
/// The requests hold distinct records. An error of the statement is
/// returned whole, for the caller to judge with [`each_alone`].
pub(crate) async fn insert_batch(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    reqs: &[&ClaimRequest],
) -> Result<Vec<Result<Inserted, StoreError>>, tokio_postgres::Error> {
    let now = ctx.now();
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&reqs[a].id, &reqs[b].id);
        (a.scope.as_str(), a.key.as_str()).cmp(&(b.scope.as_str(), b.key.as_str()))
    });
    let sorted = || order.iter().map(|&i| reqs[i]);
    let scopes: Vec<&str> = sorted().map(|r| r.id.scope.as_str()).collect();
    let keys: Vec<&str> = sorted().map(|r| r.id.key.as_str()).collect();
    let fingerprints: Vec<&[u8]> = sorted().map(|r| &r.fingerprint.as_bytes()[..]).collect();
    let owners: Vec<&str> = sorted().map(|r| r.owner.as_str()).collect();
    let leases: Vec<i64> = sorted().map(|r| int(r.policy.lease_ms())).collect();
    let retentions: Vec<i64> = sorted().map(|r| int(r.policy.retention_s())).collect();
    let tombstones: Vec<i64> = sorted().map(|r| int(r.policy.tombstone_s())).collect();
    let regions: Vec<Option<&str>> = sorted().map(|r| r.region.as_deref()).collect();
    let params: [Param<'_>; 9] = [
        now_param(&now),
        (&scopes, Type::TEXT_ARRAY),
        (&keys, Type::TEXT_ARRAY),
        (&fingerprints, Type::BYTEA_ARRAY),
        (&owners, Type::TEXT_ARRAY),
        (&leases, Type::INT8_ARRAY),
        (&retentions, Type::INT8_ARRAY),
        (&tombstones, Type::INT8_ARRAY),
        (&regions, Type::TEXT_ARRAY),
    ];
    let rows = ctx.run(exec, &ctx.schema.insert_batch, &params).await?;
    let mut answers: Vec<Result<Inserted, StoreError>> =
        reqs.iter().map(|_| Ok(Inserted::Exists)).collect();
    for row in &rows {
        let (scope, key): (&str, &str) = match (row.try_get(4), row.try_get(5)) {
            (Ok(scope), Ok(key)) => (scope, key),
            _ => continue,
        };
        let Some(at) = reqs
            .iter()
            .position(|r| r.id.scope.as_str() == scope && r.id.key.as_str() == key)
        else {
            continue;
        };
        answers[at] =
            acquired(ctx, reqs[at], row).map(|(claim, token, waited_ms)| Inserted::Acquired {
                claim,
                token,
                waited_ms,
            });
    }
    Ok(answers)
}

/// What an acquired fast-path claim answers: the claim itself, or, when
/// its statement waited past [`FAST_PATH_WAIT_MS_MAX`], the claim with its
/// lease restarted from the clock after the wait (`None`: the record
/// changed meanwhile; decide on it as it is).
pub(crate) async fn settle_inserted(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    req: &ClaimRequest,
    (claim, token, waited_ms): (Claim, Token, u64),
) -> Result<Option<Claim>, StoreError> {
    if waited_ms > FAST_PATH_WAIT_MS_MAX {
        return restart_lease(exec, ctx, req, token).await;
    }
    Ok(Some(claim))
}

/// One completion of a batch ([`complete_batch`]), its headers encoded
/// as the column holds them.
pub(crate) struct Completion {
    pub(crate) id: RecordId,
    pub(crate) token: Token,
    pub(crate) result: StoredResult,
    pub(crate) headers: String,
}

impl Completion {
    /// Fails only if the headers cannot be encoded.
    pub(crate) fn new(
        ctx: &Ctx,
        id: &RecordId,
        token: Token,
        result: StoredResult,
    ) -> Result<Completion, StoreError> {
        let headers = encode_headers(ctx, &result)?;
        Ok(Completion {
            id: id.clone(),
            token,
            result,
            headers,
        })
    }
}

fn encode_headers(ctx: &Ctx, result: &StoredResult) -> Result<String, StoreError> {
    serde_json::to_string(result.headers())
        .map_err(|e| ctx.damaged("a result to write", format!("cannot encode it: {e}")))
}

/// Many completions in one statement (one commit): each one's answer as
/// [`complete_one`] would give it, in the order given. The completions
/// hold distinct records. An error of the statement is returned whole,
/// with the completions, for the caller to judge with [`each_alone`].
pub(crate) async fn complete_batch(
    exec: &Exec<'_, '_>,
    ctx: &Ctx,
    done: Vec<Completion>,
) -> Result<Vec<Result<Record, StoreError>>, (tokio_postgres::Error, Vec<Completion>)> {
    let now = ctx.now();
    let scopes: Vec<&str> = done.iter().map(|c| c.id.scope.as_str()).collect();
    let keys: Vec<&str> = done.iter().map(|c| c.id.key.as_str()).collect();
    let tokens: Vec<i64> = done.iter().map(|c| int(c.token.0)).collect();
    let statuses: Vec<i32> = done.iter().map(|c| i32::from(c.result.status())).collect();
    let headers: Vec<&str> = done.iter().map(|c| c.headers.as_str()).collect();
    let bodies: Vec<&[u8]> = done.iter().map(|c| c.result.body()).collect();
    let params: [Param<'_>; 7] = [
        now_param(&now),
        (&scopes, Type::TEXT_ARRAY),
        (&keys, Type::TEXT_ARRAY),
        (&tokens, Type::INT8_ARRAY),
        (&statuses, Type::INT4_ARRAY),
        (&headers, Type::TEXT_ARRAY),
        (&bodies, Type::BYTEA_ARRAY),
    ];
    let rows = match ctx.run(exec, &ctx.schema.complete_batch, &params).await {
        Ok(rows) => rows,
        Err(e) => return Err((e, done)),
    };
    let mut rows = rows.into_iter();
    let answers = done
        .into_iter()
        .map(|c| match rows.next() {
            Some(row) => held_to_decision(ctx, &c.id, c.token, c.result, &row),
            None => Err(ctx.damaged(
                &c.id.to_string(),
                "the batched completion returned no row for it".into(),
            )),
        })
        .collect();
    Ok(answers)
}

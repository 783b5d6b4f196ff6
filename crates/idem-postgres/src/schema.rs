//! The store's schema: its tables, the statements every operation runs
//! against them (spliced with the schema name once, at connect), and the
//! versioned migrations that create and upgrade them, serialised between
//! nodes that start together by an advisory lock.

use idem_core::StoreError;
use tokio_postgres::types::Type;

use crate::error;
use crate::row::{self, COLUMNS, Param};

/// The schema steps, in order: step `i` moves `schema_version.version` from
/// `i` to `i + 1`. `{s}` is the schema name. Append only; never edit a step
/// that has shipped.
const MIGRATIONS: &[&str] = &[
    // 1: records keyed by (scope, key) in byte order (COLLATE "C", so that
    // ORDER BY and the `after` cursor agree with Rust's `Ord` on strings);
    // JSON kept as text, not jsonb, because jsonb refuses the NUL a
    // serialised resolution reason may hold; a partial index for the few
    // ambiguous records operators and the reconciler list; the fencing
    // sequence, so tokens keep increasing after the record that held the
    // last one is deleted, and across nodes. No CHECK constraints: every
    // value comes from a validated type and is validated again when a row
    // is decoded, while PostgreSQL re-parses each CHECK expression on every
    // single-row INSERT (measured: ~15 µs of server CPU per claim, the
    // largest part of the fast path's cost over a bare insert).
    "CREATE TABLE {s}.records (
        scope TEXT COLLATE \"C\" NOT NULL,
        key TEXT COLLATE \"C\" NOT NULL,
        fingerprint BYTEA NOT NULL,
        state TEXT NOT NULL,
        token BIGINT NOT NULL,
        owner TEXT NOT NULL,
        lease_until_ms BIGINT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        completed_at_ms BIGINT,
        expires_at_ms BIGINT,
        tombstone_until_ms BIGINT,
        retention_s BIGINT NOT NULL,
        tombstone_s BIGINT NOT NULL,
        result_status INTEGER,
        result_headers TEXT,
        result_body BYTEA,
        resolution TEXT,
        PRIMARY KEY (scope, key)
    );
    CREATE INDEX records_ambiguous ON {s}.records (scope, key) WHERE state = 'ambiguous';
    CREATE SEQUENCE {s}.tokens AS BIGINT MINVALUE 1 NO CYCLE;",
    // 2: the resolution journal: one row per resolution, numbered per
    // (scope, key) by `seq` (the primary key is also the index reading a
    // record's journal by (scope, key)), kept when the record is released
    // or purged (the purge never touches it); the resolve keeps the last
    // `JOURNAL_PER_RECORD_MAX` rows per record. Actor and reason are bytes
    // (UTF-8), because TEXT refuses the NUL a reason may hold.
    "CREATE TABLE {s}.resolutions (
        scope TEXT COLLATE \"C\" NOT NULL,
        key TEXT COLLATE \"C\" NOT NULL,
        seq BIGINT NOT NULL,
        token BIGINT NOT NULL,
        outcome TEXT NOT NULL,
        status INTEGER,
        resolved_by BYTEA NOT NULL,
        reason BYTEA NOT NULL,
        at_ms BIGINT NOT NULL,
        PRIMARY KEY (scope, key, seq)
    );",
    // 3: failed provider lookups of the ambiguous attempt holding `token`,
    // at most one row per record, written under the record's lock and
    // deleted in the transaction that resolves it: the table holds no more
    // rows than there are ambiguous records.
    "CREATE TABLE {s}.lookup_tries (
        scope TEXT COLLATE \"C\" NOT NULL,
        key TEXT COLLATE \"C\" NOT NULL,
        token BIGINT NOT NULL,
        failures BIGINT NOT NULL,
        next_at_ms BIGINT NOT NULL,
        PRIMARY KEY (scope, key)
    );",
    // 4: the origin region of the attempt that acquired each record; NULL
    // when its writer had no region, and for every record written before
    // this step (a nullable column without a default rewrites no row and
    // holds the table's lock only for the catalog change).
    "ALTER TABLE {s}.records ADD COLUMN region TEXT;",
    // 5: the purge's candidates in the order it takes them
    // (`decision::purge_due`, then (scope, key)), one partial index per
    // state it changes, so a purge call reads the records it changes
    // instead of sorting every record in the table. Built once, holding
    // writes to the table while it is (a plain CREATE INDEX: migrations
    // run in one transaction).
    "CREATE INDEX records_expiring ON {s}.records (expires_at_ms, scope, key)
        WHERE state = 'completed';
    CREATE INDEX records_tombstones ON {s}.records (tombstone_until_ms, scope, key)
        WHERE state = 'tombstone';",
    // 6: whether a request waits on the record's attempt
    // (`Store::note_waiting`), so that its completion notifies the schema's
    // channel, and only then: a completion nobody waits for reads one more
    // column of the row it writes anyway (a table of waited-on keys, probed
    // by every completion, cost 28 to 40 % of an update's throughput in
    // pgbench; the flag, nothing measurable). Nullable without a default:
    // no row is rewritten, and the column is not indexed, so setting it is
    // a HOT update.
    "ALTER TABLE {s}.records ADD COLUMN waited BOOLEAN;",
    // 7: the suspect window (`idem_core::window`), at most one row, kept
    // after it closes so that its version keeps counting; and the server
    // the schema was last written on (timeline and system identifier), so
    // that a connection to another one (a promoted standby, a restore)
    // opens the window.
    "CREATE TABLE {s}.suspect_window (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        opened_at_ms BIGINT NOT NULL,
        until_ms BIGINT NOT NULL,
        since_ms BIGINT,
        cause TEXT NOT NULL,
        version BIGINT NOT NULL
    );
    CREATE TABLE {s}.server_epoch (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        timeline BIGINT NOT NULL,
        system_identifier TEXT NOT NULL
    );",
    // 8: the operator's verb of a journal entry (`expire`, `evict`), NULL
    // for a resolution and for every entry written before this step. The
    // journal is small (bounded per record), so checking the new column's
    // constraint over it is quick.
    "ALTER TABLE {s}.resolutions ADD COLUMN verb TEXT
        CHECK (verb IS NULL OR verb = 'expire' OR verb = 'evict');",
    // 9: why an ambiguous record is, as its attempt said
    // (`idem_core::AmbiguityNote`, JSON text); NULL when it said nothing,
    // once the record completes, and for every record written before this
    // step (adding a nullable column rewrites no row).
    "ALTER TABLE {s}.records ADD COLUMN ambiguity TEXT;",
    // 10: how many operator's verbs the schema has applied, counted in
    // each verb's transaction, so that every gateway sharing it stops
    // answering replays of a record a verb changed
    // (`idem_core::ReplayCache::note_verbs`). A table, not a sequence: a
    // sequence moves before the verb commits, and a reading between the
    // two would be taken for the verb seen.
    "CREATE TABLE {s}.verbs (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        applied BIGINT NOT NULL CHECK (applied >= 0)
    );
    INSERT INTO {s}.verbs (id, applied) VALUES (1, 0);",
];

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// First key of the advisory lock that serialises migrations: "idem" in
/// ASCII; the second key is a hash of the schema name.
const MIGRATION_LOCK_CLASS: i32 = 0x6964_656d;

/// "The store's now" in milliseconds since the Unix epoch, as SQL: the
/// injected clock's value, bound as parameter `$1` of every statement that
/// reads time, or, when that is NULL, the database's clock, read when the
/// expression is evaluated (`clock_timestamp()`, not `now()`, which is the
/// transaction's start). One code path for both.
const STORE_NOW_MS: &str =
    "COALESCE($1::bigint, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)";

/// The most seconds whose milliseconds fit a `bigint`: a retention or
/// tombstone horizon beyond it saturates, as `Timestamp::plus_millis` does.
const SECONDS_MAX: i64 = i64::MAX / 1000;

/// A validated schema name and every statement the store runs in it.
pub(crate) struct Schema {
    pub(crate) name: String,
    /// The channel completions of waited-on keys are notified on.
    pub(crate) channel: String,
    /// A request waits on a record in progress: its flag, set once.
    pub(crate) wait_note: String,
    /// The fast path: a new key in one statement, or no row on conflict;
    /// it also returns the time after the insert, to notice a wait. A key
    /// that has a record is skipped before a token is drawn for it: a
    /// drawn token is a write (every 32nd is logged, and its commit waits
    /// for the disk), which a replay or a retry must not cost. The check
    /// is a per-row subquery, not `NOT EXISTS`, which would be planned as
    /// an anti-join that a generic plan may make a full scan of `records`.
    pub(crate) insert_new: String,
    /// The fast path for many new keys in one statement: the rows given as
    /// one array per column, inserted in the order given (sorted by the
    /// caller, so that two batches sharing keys wait on each other in one
    /// order and never deadlock), nothing for a key that has a record (no
    /// token drawn for it either, as in `insert_new`); per
    /// inserted row, what `insert_new` returns and its scope and key.
    pub(crate) insert_batch: String,
    /// The record read without a lock, and the time in the same
    /// statement: no row when there is no record.
    pub(crate) peek: String,
    /// Restarts the lease of a record the fast path just inserted.
    pub(crate) restart_lease: String,
    /// The locked read: the record (if any), locked, and the time after the
    /// lock was granted.
    pub(crate) lock: String,
    /// A completion in one statement: the record locked and read as it
    /// was, the time after the lock, and the record as written, written
    /// only when `$4` holds it `in_progress` (the fencing check of
    /// `decision::complete`, which the caller checks the row against).
    pub(crate) complete: String,
    /// The same for many records: one row per input row, in input order,
    /// laid out as `complete`'s; the records locked in (scope, key) order.
    pub(crate) complete_batch: String,
    pub(crate) next_token: String,
    /// The store's now (`now_ms`) and its count of verbs (`verbs`):
    /// renews the readings that bound which replays memory may answer
    /// (`db_clock`, `ReplayCache::note_verbs`).
    pub(crate) clock: String,
    /// Counts one operator's verb, in the verb's transaction.
    pub(crate) verbs_count: String,
    /// Insert or replace records given as one array per column.
    pub(crate) put: String,
    /// Delete records given as arrays of scopes and keys.
    pub(crate) delete: String,
    pub(crate) get: String,
    /// Purge candidates, the longest due first (`decision::purge_due`),
    /// then in (scope, key) order: the first `$2` of each state read from
    /// its partial index, merged, then each looked up by its key, locked
    /// and checked again as it is after the lock; with the time. The
    /// lookup is a lateral subquery with its own lock, so that no plan can
    /// read every due record to find the batch's.
    pub(crate) purge: String,
    /// Appends one resolution, numbered after the record's last, and drops
    /// the record's entries older than its newest `$9`.
    pub(crate) journal_append: String,
    /// A record's newest `$3` journal entries, oldest first.
    pub(crate) journal_get: String,
    /// The failed lookups kept for one record.
    pub(crate) tries_get: String,
    /// Keeps the failed lookups of one record, replacing what was kept.
    pub(crate) tries_put: String,
    /// Drops the failed lookups of a record that was resolved.
    pub(crate) tries_delete: String,
    /// `SELECT <columns> FROM records`, the start of a list query.
    pub(crate) select: String,
    /// The same joined with `now` (one row, column `ms`: the store's now as
    /// parameter `$1` or the database's clock), for filters that read it.
    pub(crate) select_at_now: String,
}

impl Schema {
    /// Every statement run on the pooled connections, by name, for the
    /// plan check (`src/plans.rs`). The fields are taken apart one by one
    /// so that a statement added to `Schema` does not compile until it is
    /// listed here, or named as no statement of its own.
    #[cfg(test)]
    pub(crate) fn statements(&self) -> Vec<(&'static str, &str)> {
        let Schema {
            name: _,
            channel: _,
            wait_note,
            insert_new,
            insert_batch,
            peek,
            restart_lease,
            lock,
            complete,
            complete_batch,
            next_token,
            clock,
            verbs_count,
            put,
            delete,
            get,
            purge,
            journal_append,
            journal_get,
            tries_get,
            tries_put,
            tries_delete,
            // The start of every list query, not a statement of its own.
            select: _,
            select_at_now: _,
        } = self;
        vec![
            ("wait_note", wait_note),
            ("insert_new", insert_new),
            ("insert_batch", insert_batch),
            ("peek", peek),
            ("restart_lease", restart_lease),
            ("lock", lock),
            ("complete", complete),
            ("complete_batch", complete_batch),
            ("next_token", next_token),
            ("clock", clock),
            ("verbs_count", verbs_count),
            ("put", put),
            ("delete", delete),
            ("get", get),
            ("purge", purge),
            ("journal_append", journal_append),
            ("journal_get", journal_get),
            ("tries_get", tries_get),
            ("tries_put", tries_put),
            ("tries_delete", tries_delete),
        ]
    }

    /// The statements for schema `name`, which `config::target` validated
    /// (it needs no quoting). The long ones are built by the functions
    /// after this impl, in the order of the tables they touch: `records`
    /// (claims, completions, the purge), `resolutions`, `lookup_tries`.
    pub(crate) fn new(name: &str) -> Schema {
        let cols = COLUMNS.join(", ");
        let now = STORE_NOW_MS;
        let s = name;
        let channel = channel(name);
        Schema {
            name: name.to_owned(),
            wait_note: format!(
                "UPDATE {s}.records SET waited = true WHERE scope = $1 AND key = $2 \
                 AND state = 'in_progress' AND waited IS DISTINCT FROM true"
            ),
            insert_new: insert_new(s),
            insert_batch: insert_batch(s),
            peek: format!(
                "SELECT {now} AS now_ms, {cols} FROM {s}.records WHERE scope = $2 AND key = $3"
            ),
            restart_lease: restart_lease(s),
            lock: lock(s),
            complete: complete(s, &channel),
            complete_batch: complete_batch(s, &channel),
            next_token: format!("SELECT nextval('{s}.tokens')"),
            clock: format!(
                "SELECT {now} AS now_ms, (SELECT applied FROM {s}.verbs WHERE id = 1) AS verbs"
            ),
            verbs_count: format!("UPDATE {s}.verbs SET applied = applied + 1 WHERE id = 1"),
            put: put(s),
            delete: format!(
                "DELETE FROM {s}.records WHERE (scope, key) IN \
                 (SELECT * FROM unnest($1::text[], $2::text[]))"
            ),
            get: format!("SELECT {cols} FROM {s}.records WHERE scope = $1 AND key = $2"),
            purge: purge(s),
            journal_append: journal_append(s),
            journal_get: journal_get(s),
            tries_get: format!(
                "SELECT token, failures, next_at_ms FROM {s}.lookup_tries \
                 WHERE scope = $1 AND key = $2"
            ),
            tries_put: tries_put(s),
            tries_delete: format!("DELETE FROM {s}.lookup_tries WHERE scope = $1 AND key = $2"),
            select: format!("SELECT {cols} FROM {s}.records"),
            channel,
            select_at_now: format!(
                "WITH now AS MATERIALIZED (SELECT {now} AS ms) \
                 SELECT {cols} FROM {s}.records, now"
            ),
        }
    }
}

/// What a completion sets from the record as it was (`old`) at the time
/// read after its lock (`now`), as `decision::complete` does.
fn completed() -> String {
    format!(
        "state = 'completed', completed_at_ms = now.ms, \
         expires_at_ms = now.ms + LEAST(LEAST(old.retention_s, {SECONDS_MAX}) * 1000, \
         9223372036854775807 - now.ms), \
         tombstone_until_ms = now.ms + LEAST(LEAST(old.tombstone_s, {SECONDS_MAX}) * 1000, \
         9223372036854775807 - now.ms),"
    )
}

/// `Schema::insert_new`: a new key claimed in one statement.
fn insert_new(s: &str) -> String {
    let now = STORE_NOW_MS;
    format!(
        "INSERT INTO {s}.records (scope, key, fingerprint, state, token, owner, \
         lease_until_ms, created_at_ms, retention_s, tombstone_s, region) \
         SELECT $2, $3, $4, 'in_progress', nextval('{s}.tokens'), $5, \
         now.ms + LEAST($6::bigint, 9223372036854775807 - now.ms), now.ms, $7, $8, \
         $9::text \
         FROM (SELECT {now} AS ms) AS now \
         WHERE (SELECT true FROM {s}.records AS r WHERE r.scope = $2 AND r.key = $3) \
         IS NULL \
         ON CONFLICT (scope, key) DO NOTHING \
         RETURNING token, created_at_ms, lease_until_ms, {now}"
    )
}

/// `Schema::insert_batch`: many new keys claimed in one statement.
fn insert_batch(s: &str) -> String {
    let now = STORE_NOW_MS;
    format!(
        "INSERT INTO {s}.records (scope, key, fingerprint, state, token, owner, \
         lease_until_ms, created_at_ms, retention_s, tombstone_s, region) \
         SELECT b.scope, b.key, b.fingerprint, 'in_progress', nextval('{s}.tokens'), \
         b.owner, now.ms + LEAST(b.lease, 9223372036854775807 - now.ms), now.ms, \
         b.retention, b.tombstone, b.region \
         FROM (SELECT {now} AS ms) AS now, \
         unnest($2::text[], $3::text[], $4::bytea[], $5::text[], $6::bigint[], \
         $7::bigint[], $8::bigint[], $9::text[]) WITH ORDINALITY \
         AS b(scope, key, fingerprint, owner, lease, retention, tombstone, region, n) \
         WHERE (SELECT true FROM {s}.records AS r WHERE r.scope = b.scope AND r.key = b.key) \
         IS NULL \
         ORDER BY b.n \
         ON CONFLICT (scope, key) DO NOTHING \
         RETURNING token, created_at_ms, lease_until_ms, {now}, scope, key"
    )
}

/// `Schema::restart_lease`.
fn restart_lease(s: &str) -> String {
    let now = STORE_NOW_MS;
    format!(
        "UPDATE {s}.records AS r SET created_at_ms = now.ms, \
         lease_until_ms = now.ms + LEAST($5::bigint, 9223372036854775807 - now.ms) \
         FROM (SELECT {now} AS ms) AS now \
         WHERE r.scope = $2 AND r.key = $3 AND r.token = $4 AND r.state = 'in_progress' \
         RETURNING r.token, r.created_at_ms, r.lease_until_ms, now.ms"
    )
}

/// `Schema::lock`: the locked read.
fn lock(s: &str) -> String {
    let now = STORE_NOW_MS;
    let cols = COLUMNS.join(", ");
    format!(
        "WITH locked AS MATERIALIZED (\
         SELECT {cols} FROM {s}.records WHERE scope = $2 AND key = $3 FOR UPDATE) \
         SELECT {now} AS now_ms, locked.* FROM (SELECT) AS one LEFT JOIN locked ON true"
    )
}

/// `Schema::complete`: a completion in one statement.
fn complete(s: &str, channel: &str) -> String {
    let now = STORE_NOW_MS;
    let cols = COLUMNS.join(", ");
    let completed = completed();
    format!(
        "WITH old AS MATERIALIZED (\
         SELECT {cols} FROM {s}.records WHERE scope = $2 AND key = $3 FOR UPDATE), \
         now AS MATERIALIZED (SELECT (SELECT count(*) FROM old) AS locked, {now} AS ms), \
         done AS (UPDATE {s}.records AS r SET {completed} \
         result_status = $5, result_headers = $6, result_body = $7 \
         FROM old, now \
         WHERE r.scope = old.scope AND r.key = old.key \
         AND old.token = $4 AND old.state = 'in_progress' \
         RETURNING {}, r.waited) \
         SELECT now.ms, old.*, done.*, \
         (SELECT pg_notify('{channel}', done.scope || chr(10) || done.key) WHERE done.waited) \
         FROM now LEFT JOIN old ON true LEFT JOIN done ON true",
        COLUMNS.map(|c| format!("r.{c}")).join(", ")
    )
}

/// `Schema::complete_batch`: many completions in one statement.
fn complete_batch(s: &str, channel: &str) -> String {
    let now = STORE_NOW_MS;
    let completed = completed();
    format!(
        "WITH input AS MATERIALIZED (SELECT * FROM unnest($2::text[], $3::text[], \
         $4::bigint[], $5::int[], $6::text[], $7::bytea[]) WITH ORDINALITY \
         AS i(scope, key, token, status, headers, body, n)), \
         old AS MATERIALIZED (SELECT {} FROM {s}.records r \
         JOIN input ON r.scope = input.scope AND r.key = input.key \
         ORDER BY r.scope, r.key FOR UPDATE OF r), \
         now AS MATERIALIZED (SELECT (SELECT count(*) FROM old) AS locked, {now} AS ms), \
         done AS (UPDATE {s}.records AS r SET {completed} \
         result_status = input.status, result_headers = input.headers, \
         result_body = input.body \
         FROM old, now, input \
         WHERE r.scope = old.scope AND r.key = old.key \
         AND input.scope = old.scope AND input.key = old.key \
         AND old.token = input.token AND old.state = 'in_progress' \
         RETURNING {}, r.waited) \
         SELECT now.ms, old.*, done.*, \
         (SELECT pg_notify('{channel}', done.scope || chr(10) || done.key) WHERE done.waited) \
         FROM input CROSS JOIN now \
         LEFT JOIN old ON old.scope = input.scope AND old.key = input.key \
         LEFT JOIN done ON done.scope = input.scope AND done.key = input.key \
         ORDER BY input.n",
        COLUMNS.map(|c| format!("r.{c}")).join(", "),
        COLUMNS.map(|c| format!("r.{c}")).join(", ")
    )
}

/// `Schema::put`: records inserted or replaced, one array per column.
fn put(s: &str) -> String {
    let cols = COLUMNS.join(", ");
    let unnest: Vec<String> = row::ARRAY_TYPES
        .iter()
        .enumerate()
        .map(|(i, ty)| format!("${}::{ty}", i + 1))
        .collect();
    let update: Vec<String> = COLUMNS[2..]
        .iter()
        .map(|c| format!("{c} = EXCLUDED.{c}"))
        .collect();
    format!(
        "INSERT INTO {s}.records ({cols}) SELECT * FROM unnest({}) \
         ON CONFLICT (scope, key) DO UPDATE SET {}",
        unnest.join(", "),
        update.join(", ")
    )
}

/// `Schema::purge`: the purge's candidates, locked and checked again.
fn purge(s: &str) -> String {
    let now = STORE_NOW_MS;
    let cols = COLUMNS.join(", ");
    format!(
        "WITH now AS MATERIALIZED (SELECT {now} AS ms), \
         due AS MATERIALIZED (SELECT * FROM (\
         (SELECT r.scope, r.key, r.expires_at_ms AS at FROM {s}.records r \
         WHERE r.state = 'completed' AND r.expires_at_ms <= (SELECT ms FROM now) \
         ORDER BY r.expires_at_ms, r.scope, r.key LIMIT $2) \
         UNION ALL \
         (SELECT r.scope, r.key, r.tombstone_until_ms FROM {s}.records r \
         WHERE r.state = 'tombstone' AND r.tombstone_until_ms <= (SELECT ms FROM now) \
         ORDER BY r.tombstone_until_ms, r.scope, r.key LIMIT $2)) AS both_states \
         ORDER BY at, scope, key LIMIT $2) \
         SELECT now.ms, r.* FROM due CROSS JOIN now CROSS JOIN LATERAL (\
         SELECT {cols} FROM {s}.records AS r \
         WHERE r.scope = due.scope AND r.key = due.key \
         AND ((r.state = 'tombstone' AND r.tombstone_until_ms <= now.ms) \
          OR (r.state = 'completed' AND r.expires_at_ms <= now.ms)) \
         FOR UPDATE) AS r \
         ORDER BY due.at, r.scope, r.key"
    )
}

/// `Schema::journal_append`, on `resolutions`.
fn journal_append(s: &str) -> String {
    format!(
        "WITH appended AS (\
         INSERT INTO {s}.resolutions (scope, key, seq, token, outcome, status, \
         resolved_by, reason, at_ms, verb) \
         SELECT $1, $2, COALESCE(MAX(seq), 0) + 1, $3, $4, $5, $6, $7, $8, $10 \
         FROM {s}.resolutions WHERE scope = $1 AND key = $2 RETURNING seq) \
         DELETE FROM {s}.resolutions WHERE scope = $1 AND key = $2 \
         AND seq <= (SELECT seq FROM appended) - $9"
    )
}

/// `Schema::journal_get`, on `resolutions`.
fn journal_get(s: &str) -> String {
    format!(
        "SELECT token, outcome, status, resolved_by, reason, at_ms, verb FROM (\
         SELECT * FROM {s}.resolutions WHERE scope = $1 AND key = $2 \
         ORDER BY seq DESC LIMIT $3) AS newest ORDER BY seq"
    )
}

/// `Schema::tries_put`, on `lookup_tries`.
fn tries_put(s: &str) -> String {
    format!(
        "INSERT INTO {s}.lookup_tries (scope, key, token, failures, next_at_ms) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (scope, key) DO UPDATE SET \
         token = EXCLUDED.token, failures = EXCLUDED.failures, \
         next_at_ms = EXCLUDED.next_at_ms"
    )
}

/// The notification channel of schema `name`: `idem_` and the first 16
/// bytes of its SHA-256 in hex, within the 63 bytes of an identifier.
pub(crate) fn channel(name: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("idem_{hex}")
}

/// What the schema holds when `connect` looks at it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// Migrated to [`SCHEMA_VERSION`] (now, or already).
    Ready,
    /// No idem tables, and `create` was off: nothing was created.
    Missing,
}

/// Brings the schema to [`SCHEMA_VERSION`]: nothing to do when it is
/// already there (no lock, no DDL, so a role without CREATE can run a
/// migrated store); otherwise, one transaction holding the advisory lock
/// re-checks and applies the missing steps in order. Refuses a newer
/// version and a schema holding tables that are not idem's.
pub(crate) async fn migrate(
    client: &mut tokio_postgres::Client,
    schema: &Schema,
    store: &str,
    create: bool,
) -> Result<Found, StoreError> {
    let seen = probe(client, schema, store).await?;
    if let Some(version) = seen.version {
        check_version(version, store)?;
        if version == SCHEMA_VERSION {
            return Ok(Found::Ready);
        }
    } else if !create {
        return Ok(Found::Missing);
    }
    let pg = |e: tokio_postgres::Error| error::from_pg(store, &e);
    let tx = client.transaction().await.map_err(pg)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&MIGRATION_LOCK_CLASS, &schema.name],
    )
    .await
    .map_err(pg)?;
    let seen = probe(&tx, schema, store).await?;
    let from = match seen.version {
        Some(version) => version,
        None => bootstrap(&tx, schema, store, &seen).await?,
    };
    check_version(from, store)?;
    let s = &schema.name;
    for (step, sql) in MIGRATIONS.iter().enumerate().skip(from.max(0) as usize) {
        let what = format!("apply schema step {} in schema {s}", step + 1);
        let missing = format!("the role needs CREATE on schema {s}");
        tx.batch_execute(&sql.replace("{s}", s))
            .await
            .map_err(|e| error::ddl(store, &e, &what, &missing))?;
    }
    if from < SCHEMA_VERSION {
        tx.execute(
            &format!("UPDATE {s}.schema_version SET version = $1 WHERE id = 1"),
            &[&SCHEMA_VERSION],
        )
        .await
        .map_err(pg)?;
    }
    tx.commit().await.map_err(pg)?;
    Ok(Found::Ready)
}

/// The schema as `probe` saw it.
struct Seen {
    schema_exists: bool,
    /// Tables, sequences and other relations in the schema.
    relations: i64,
    /// `schema_version.version`, if that table exists.
    version: Option<i32>,
    user: String,
    database: String,
}

async fn probe(
    client: &impl tokio_postgres::GenericClient,
    schema: &Schema,
    store: &str,
) -> Result<Seen, StoreError> {
    let pg = |e: tokio_postgres::Error| error::from_pg(store, &e);
    let row = client
        .query_one(
            "SELECT n.oid IS NOT NULL, \
                    (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid), \
                    to_regclass($2) IS NOT NULL, current_user::text, current_database()::text \
             FROM (SELECT) AS one LEFT JOIN pg_namespace n ON n.nspname = $1",
            &[&schema.name, &format!("{}.schema_version", schema.name)],
        )
        .await
        .map_err(pg)?;
    let get = |e: tokio_postgres::Error| error::damaged(store, "the catalog", &error::chain(&e));
    let has_version_table: bool = row.try_get(2).map_err(get)?;
    let version = if has_version_table {
        let sql = format!(
            "SELECT version FROM {}.schema_version WHERE id = 1",
            schema.name
        );
        let found = client.query_opt(&sql, &[]).await.map_err(pg)?;
        let version: Option<i32> = match found {
            Some(row) => row.try_get(0).map_err(get)?,
            None => None,
        };
        Some(version.ok_or_else(|| StoreError::Incompatible {
            store: store.to_owned(),
            reason: format!(
                "{}.schema_version has no version row; restore the schema from a backup",
                schema.name
            ),
        })?)
    } else {
        None
    };
    Ok(Seen {
        schema_exists: row.try_get(0).map_err(get)?,
        relations: row.try_get(1).map_err(get)?,
        version,
        user: row.try_get(3).map_err(get)?,
        database: row.try_get(4).map_err(get)?,
    })
}

/// Creates the schema (if missing) and its version table at version 0;
/// refuses a schema that already holds someone else's tables.
async fn bootstrap(
    tx: &tokio_postgres::Transaction<'_>,
    schema: &Schema,
    store: &str,
    seen: &Seen,
) -> Result<i32, StoreError> {
    let (s, user, db) = (&schema.name, &seen.user, &seen.database);
    if !seen.schema_exists {
        let what = format!("create schema {s} in database {db} as role {user}");
        let missing = format!(
            "the role needs CREATE on the database (GRANT CREATE ON DATABASE {db} TO {user}), \
             or an administrator creates the schema for it (CREATE SCHEMA {s} AUTHORIZATION {user})"
        );
        tx.batch_execute(&format!("CREATE SCHEMA {s}"))
            .await
            .map_err(|e| error::ddl(store, &e, &what, &missing))?;
    } else if seen.relations > 0 {
        return Err(StoreError::Incompatible {
            store: store.to_owned(),
            reason: format!(
                "schema {s} holds {} tables or sequences but no idem schema_version; \
                 it belongs to something else: choose another schema",
                seen.relations
            ),
        });
    }
    let what = format!("create table {s}.schema_version as role {user}");
    let missing =
        format!("the role needs CREATE on schema {s} (GRANT CREATE ON SCHEMA {s} TO {user})");
    tx.batch_execute(&format!(
        "CREATE TABLE {s}.schema_version (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            version INTEGER NOT NULL
        );
        INSERT INTO {s}.schema_version (id, version) VALUES (1, 0);"
    ))
    .await
    .map_err(|e| error::ddl(store, &e, &what, &missing))?;
    Ok(0)
}

fn check_version(version: i32, store: &str) -> Result<(), StoreError> {
    if version > SCHEMA_VERSION {
        return Err(StoreError::newer_schema(
            store,
            i64::from(version),
            i64::from(SCHEMA_VERSION),
        ));
    }
    Ok(())
}

/// Parameter `$1` of every statement reading [`STORE_NOW_MS`]: the
/// injected clock's now, or NULL for the database's clock.
pub(crate) fn now_param(now: &Option<i64>) -> Param<'_> {
    (now, Type::INT8)
}

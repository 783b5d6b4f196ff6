//! Opening a database file: refusing files that are not ours, marking and
//! migrating files that are, and setting the pragmas durability depends on.
//! Every error names the path and says what to do.

use std::path::Path;
use std::time::Duration;

use idem_core::StoreError;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};

/// `PRAGMA application_id` of every idem database: "idem" in ASCII.
pub const APPLICATION_ID: i32 = 0x6964_656d;

/// The schema steps, in order: step `i` moves `user_version` from `i` to
/// `i + 1`. Append only; never edit a step that has shipped.
const MIGRATIONS: &[&str] = &[
    // 1: records keyed by (scope, key) in one B-tree (WITHOUT ROWID: a claim
    // writes one tree, not a table plus an index); a partial index for the
    // few ambiguous records operators and the reconciler list; the fencing
    // counter, so tokens keep increasing after the record that held the
    // last one is deleted.
    "CREATE TABLE records (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        fingerprint BLOB NOT NULL,
        -- An OR chain, not IN (...): SQLite builds an ephemeral table for an
        -- IN list on every insert.
        state TEXT NOT NULL CHECK (state = 'in_progress' OR state = 'completed'
            OR state = 'ambiguous' OR state = 'tombstone'),
        token INTEGER NOT NULL,
        owner TEXT NOT NULL,
        lease_until_ms INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL,
        completed_at_ms INTEGER,
        expires_at_ms INTEGER,
        tombstone_until_ms INTEGER,
        retention_s INTEGER NOT NULL,
        tombstone_s INTEGER NOT NULL,
        result_status INTEGER,
        result_headers TEXT,
        result_body BLOB,
        resolution TEXT,
        PRIMARY KEY (scope, key)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX records_ambiguous ON records (scope, key) WHERE state = 'ambiguous';
    CREATE TABLE meta (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        last_token INTEGER NOT NULL
    ) STRICT;
    INSERT INTO meta (id, last_token) VALUES (1, 0);",
    // 2: the resolution journal: one row per resolution, numbered per
    // (scope, key) by `seq`, kept when the record is released or purged
    // (the purge never touches it); the writer keeps the last
    // `JOURNAL_PER_RECORD_MAX` rows per record.
    "CREATE TABLE resolutions (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        seq INTEGER NOT NULL,
        token INTEGER NOT NULL,
        outcome TEXT NOT NULL CHECK (outcome = 'completed' OR outcome = 'not_executed'),
        status INTEGER,
        resolved_by TEXT NOT NULL,
        reason TEXT NOT NULL,
        at_ms INTEGER NOT NULL,
        PRIMARY KEY (scope, key, seq)
    ) STRICT, WITHOUT ROWID;",
    // 3: failed provider lookups of the ambiguous attempt holding `token`,
    // at most one row per record, deleted when the record is resolved: the
    // table holds no more rows than there are ambiguous records.
    "CREATE TABLE lookup_tries (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        token INTEGER NOT NULL,
        failures INTEGER NOT NULL,
        next_at_ms INTEGER NOT NULL,
        PRIMARY KEY (scope, key)
    ) STRICT, WITHOUT ROWID;",
    // 4: the origin region of the attempt that acquired each record; NULL
    // when its writer had no region, and for every record written before
    // this step (adding a nullable column rewrites no row).
    "ALTER TABLE records ADD COLUMN region TEXT;",
    // 5: the purge's candidates in the order it takes them
    // (`decision::purge_due`, then (scope, key)), one partial index per
    // state it changes, so a purge reads the records it changes and not
    // every record it has already purged (1,000,000 expired records took
    // 105 s by a scan in key order, holding the writer 100 ms per call).
    "CREATE INDEX records_expiring ON records (expires_at_ms, scope, key)
        WHERE state = 'completed';
    CREATE INDEX records_tombstones ON records (tombstone_until_ms, scope, key)
        WHERE state = 'tombstone';",
    // 6: the suspect window (`idem_core::window`): at most one row, kept
    // after it closes so that its version keeps counting.
    "CREATE TABLE suspect_window (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        opened_at_ms INTEGER NOT NULL,
        until_ms INTEGER NOT NULL,
        since_ms INTEGER,
        cause TEXT NOT NULL,
        version INTEGER NOT NULL
    ) STRICT;",
    // 7: the operator's verb of a journal entry (`expire`, `evict`), NULL
    // for a resolution and for every entry written before this step. The
    // outcome's CHECK needs no widening: a verb's entry says `completed`
    // or `not_executed` as a resolution does, and the verb beside it.
    "ALTER TABLE resolutions ADD COLUMN verb TEXT
        CHECK (verb IS NULL OR verb = 'expire' OR verb = 'evict');",
    // 8: why an ambiguous record is, as its attempt said
    // (`idem_core::AmbiguityNote`, JSON text); NULL when it said nothing,
    // once the record completes, and for every record written before this
    // step (adding a nullable column rewrites no row).
    "ALTER TABLE records ADD COLUMN ambiguity TEXT;",
    // 9: how many operator's verbs this file has applied, counted in each
    // verb's transaction, so that every process sharing the file stops
    // answering replays of a record a verb changed
    // (`idem_core::ReplayCache::note_verbs`).
    "ALTER TABLE meta ADD COLUMN verbs INTEGER NOT NULL DEFAULT 0 CHECK (verbs >= 0);",
];

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How long a connection waits for a lock held by another connection.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// WAL pages after which a commit by a connection other than the writer's
/// (a migration, a restore) checkpoints them, as SQLite's autocheckpoint
/// does; the writer's connection checkpoints off its commit path instead
/// (`checkpoint`), at the same size.
const WAL_AUTOCHECKPOINT_PAGES: i64 = crate::checkpoint::CHECKPOINT_PAGES as i64;

/// The size the WAL file is cut back to after a checkpoint reset it, so a
/// WAL that grew while a long read held back checkpoints does not keep its
/// disk space.
const WAL_BYTES_MAX: i64 = 64 * 1024 * 1024;

/// Opens the writer's connection: checks the file is an idem database (or
/// empty), switches it to WAL, migrates it, and returns the connection with
/// the last fencing token handed out.
pub(crate) fn open_writer(path: &Path, create: bool) -> Result<(Connection, u64), StoreError> {
    let store = path.display().to_string();
    check_path(path, create, &store)?;
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| unavailable(&store, format!("cannot open the database file: {e}")))?;
    if conn.is_readonly("main").map_err(|e| error(&store, &e))? {
        return Err(unavailable(
            &store,
            "the file can only be opened read-only; idem needs to write it".to_owned(),
        ));
    }
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| error(&store, &e))?;
    // Look before writing anything: a foreign file must be left untouched,
    // and switching the journal mode would touch it.
    identify(&conn, &store)?;
    set_durable(&conn, &store)?;
    migrate(conn, &store)
}

/// What [`check`] found at a store's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Found {
    /// No file: opening creates it.
    Nothing,
    /// An empty database: opening makes it an idem store.
    Empty,
    /// An idem store at this schema version; opening upgrades an older one
    /// in place.
    Store(i64),
}

/// What [`open_writer`] refuses before it writes anything, judged without
/// creating or writing a file: the directory, what is in the file's place,
/// and an existing file's marking and schema version. Only a start finds
/// what needs a write (WAL on this file system, the file's lock).
pub(crate) fn check(path: &Path) -> Result<Found, StoreError> {
    let store = path.display().to_string();
    check_path(path, true, &store)?;
    if !path.exists() {
        return Ok(Found::Nothing);
    }
    let conn = open_to_look(path, &store)?;
    Ok(match identify(&conn, &store)? {
        Kind::Fresh => Found::Empty,
        Kind::Idem(version) => Found::Store(version),
    })
}

/// A read-only connection that leaves nothing behind. Even read-only,
/// SQLite creates a WAL database's `-wal` and `-shm` files when they are
/// missing, and cannot remove them; they are missing only when no process
/// has the file open, and then the file alone holds every commit, so it is
/// read as it is on disk (`immutable`). With them, it is read through them,
/// as the process that writes it sees it.
fn open_to_look(path: &Path, store: &str) -> Result<Connection, StoreError> {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = if Path::new(&wal).exists() {
        Connection::open_with_flags(path, flags)
    } else {
        // A URI escapes every byte but the unreserved ones, so that any
        // file name (`?`, `#`, `%`, bytes not UTF-8) names this file.
        let absolute = std::path::absolute(path)
            .map_err(|e| unavailable(store, format!("cannot read the path: {e}")))?;
        let escaped = percent_encoding::percent_encode(
            absolute.as_os_str().as_encoded_bytes(),
            URI_PATH_ESCAPED,
        );
        Connection::open_with_flags(
            format!("file://{escaped}?immutable=1"),
            flags | OpenFlags::SQLITE_OPEN_URI,
        )
    }
    .map_err(|e| unavailable(store, format!("cannot open the database file: {e}")))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| error(store, &e))?;
    Ok(conn)
}

/// What a path in an SQLite URI escapes: all but RFC 3986's unreserved
/// characters and `/`.
const URI_PATH_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// Opens a reader's connection to a database the writer has already opened.
pub(crate) fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let store = path.display().to_string();
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| unavailable(&store, format!("cannot open a reader connection: {e}")))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| error(&store, &e))?;
    conn.pragma_update(None, "query_only", true)
        .map_err(|e| error(&store, &e))?;
    Ok(conn)
}

/// Opens the checkpointer's connection: it writes nothing but copies WAL
/// pages into the database file, so it is not `query_only`.
pub(crate) fn open_checkpointer(path: &Path) -> Result<Connection, StoreError> {
    let store = path.display().to_string();
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| {
        unavailable(
            &store,
            format!("cannot open the checkpointer's connection: {e}"),
        )
    })?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| error(&store, &e))?;
    Ok(conn)
}

/// Maps a SQLite error to the store error a caller can act on: a file that
/// is damaged or not a database needs a person; anything else may pass.
pub(crate) fn error(store: &str, e: &rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => StoreError::Incompatible {
            store: store.to_owned(),
            reason: format!("not an idem database: {e}"),
        },
        Some(ErrorCode::DatabaseCorrupt) => StoreError::Incompatible {
            store: store.to_owned(),
            reason: format!("the database is damaged: {e}; restore it from a backup"),
        },
        _ => unavailable(store, e.to_string()),
    }
}

/// The store cannot be used right now, for `reason`.
pub(crate) fn unavailable(store: &str, reason: String) -> StoreError {
    StoreError::Unavailable {
        store: store.to_owned(),
        reason,
    }
}

/// What the file is, judged by its header and schema.
enum Kind {
    /// Empty: no tables and no marking. Ours to initialise.
    Fresh,
    /// An idem database at this schema version.
    Idem(i64),
}

/// Errors SQLite gives vaguely ("unable to open database file"), said plainly.
fn check_path(path: &Path, create: bool, store: &str) -> Result<(), StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        return Err(unavailable(
            store,
            format!("directory {} does not exist", dir.display()),
        ));
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(unavailable(
            store,
            "is a directory, not a database file".to_owned(),
        )),
        // Refused even where the process could write it anyway (root): the
        // file was marked read-only on purpose, and a store must not
        // pretend to be durable on a file someone froze.
        Ok(meta) if meta.permissions().readonly() => Err(unavailable(
            store,
            "the file is read-only; idem needs to write it".to_owned(),
        )),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => Err(unavailable(
            store,
            "the database file does not exist and create is off".to_owned(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(unavailable(store, format!("cannot read the file: {e}"))),
    }
}

fn identify(conn: &Connection, store: &str) -> Result<Kind, StoreError> {
    let pragma = |name: &str| -> Result<i64, StoreError> {
        conn.pragma_query_value(None, name, |row| row.get(0))
            .map_err(|e| error(store, &e))
    };
    let application_id = pragma("application_id")?;
    let version = pragma("user_version")?;
    let objects: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))
        .map_err(|e| error(store, &e))?;
    let foreign = |reason: String| StoreError::Incompatible {
        store: store.to_owned(),
        reason: format!("not an idem database: {reason}"),
    };
    if application_id == 0 && objects == 0 && version == 0 {
        return Ok(Kind::Fresh);
    }
    if application_id != i64::from(APPLICATION_ID) {
        return Err(foreign(if application_id == 0 {
            format!(
                "a SQLite database of another application ({objects} schema objects, \
                 no idem application_id); use another path"
            )
        } else {
            format!(
                "a SQLite database of another application (application_id {application_id:#x}); \
                 use another path"
            )
        }));
    }
    if version > SCHEMA_VERSION {
        return Err(StoreError::newer_schema(store, version, SCHEMA_VERSION));
    }
    Ok(Kind::Idem(version))
}

fn set_durable(conn: &Connection, store: &str) -> Result<(), StoreError> {
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(|e| error(store, &e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(unavailable(
            store,
            format!(
                "cannot switch to WAL journal mode (SQLite kept {mode:?}); use a local file system"
            ),
        ));
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .and_then(|()| conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES))
        .and_then(|()| conn.pragma_update(None, "journal_size_limit", WAL_BYTES_MAX))
        .map_err(|e| error(store, &e))
}

/// Applies the missing migrations and marks the file, in one transaction
/// that also re-checks the file (another process may have opened it first).
fn migrate(mut conn: Connection, store: &str) -> Result<(Connection, u64), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| error(store, &e))?;
    let from = match identify(&tx, store)? {
        Kind::Fresh => 0,
        Kind::Idem(version) => version,
    };
    for (step, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(from).unwrap_or(0))
    {
        tx.execute_batch(sql)
            .map_err(|e| unavailable(store, format!("schema step {} failed: {e}", step + 1)))?;
    }
    if from < SCHEMA_VERSION {
        tx.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(|e| error(store, &e))?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(|e| error(store, &e))?;
    }
    let last_token: Option<i64> = tx
        .query_row("SELECT last_token FROM meta WHERE id = 1", [], |row| {
            row.get(0)
        })
        .optional()
        .map_err(|e| error(store, &e))?;
    let last_token = last_token
        .and_then(|t| u64::try_from(t).ok())
        .ok_or_else(|| StoreError::Incompatible {
            store: store.to_owned(),
            reason: "the fencing counter (table meta) is missing or negative; \
                     restore the database from a backup"
                .to_owned(),
        })?;
    tx.commit().map_err(|e| error(store, &e))?;
    Ok((conn, last_token))
}

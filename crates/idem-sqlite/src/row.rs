//! How a [`Record`] maps to one row of the `records` table and back, so that
//! the writer and the readers agree on every column and a damaged row becomes
//! an error naming its scope and key instead of a panic.

use idem_core::{
    AmbiguityNote, DamagedRow, Fingerprint, HeaderBytes, IdempotencyKey, JOURNAL_PER_RECORD_MAX,
    JournalEntry, ListCursor, LookupTries, Record, RecordId, Resolution, Scope, State, StoreError,
    StoredResult, Timestamp, Token, Verb, check_region,
};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, Row, Statement, params};

/// Every column of `records`, in the order [`bind`] and [`decode`] use.
pub(crate) const COLUMNS: &str = "scope, key, fingerprint, state, token, owner, \
     lease_until_ms, created_at_ms, completed_at_ms, expires_at_ms, tombstone_until_ms, \
     retention_s, tombstone_s, result_status, result_headers, result_body, resolution, region, \
     ambiguity";

/// Inserts or replaces one whole record.
pub(crate) const PUT: &str = "INSERT OR REPLACE INTO records (scope, key, fingerprint, state, \
     token, owner, lease_until_ms, created_at_ms, completed_at_ms, expires_at_ms, \
     tombstone_until_ms, retention_s, tombstone_s, result_status, result_headers, result_body, \
     resolution, region, ambiguity) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)";

/// Inserts a record unless one exists for its (scope, key).
pub(crate) const INSERT_NEW: &str = "INSERT INTO records (scope, key, fingerprint, state, \
     token, owner, lease_until_ms, created_at_ms, completed_at_ms, expires_at_ms, \
     tombstone_until_ms, retention_s, tombstone_s, result_status, result_headers, result_body, \
     resolution, region, ambiguity) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19) \
     ON CONFLICT (scope, key) DO NOTHING";

/// Reads one record by primary key.
pub(crate) const GET: &str = "SELECT scope, key, fingerprint, state, token, owner, \
     lease_until_ms, created_at_ms, completed_at_ms, expires_at_ms, tombstone_until_ms, \
     retention_s, tombstone_s, result_status, result_headers, result_body, resolution, region, \
     ambiguity FROM records WHERE scope = ?1 AND key = ?2";

/// Removes one record by primary key.
pub(crate) const DELETE: &str = "DELETE FROM records WHERE scope = ?1 AND key = ?2";

/// Appends one resolution to the journal, numbered after the record's last.
pub(crate) const JOURNAL_APPEND: &str = "INSERT INTO resolutions (scope, key, seq, token, \
     outcome, status, resolved_by, reason, at_ms, verb) \
     SELECT ?1, ?2, COALESCE(MAX(seq), 0) + 1, ?3, ?4, ?5, ?6, ?7, ?8, ?9 \
     FROM resolutions WHERE scope = ?1 AND key = ?2";

/// Drops a record's journal entries older than its newest `?3`.
pub(crate) const JOURNAL_TRIM: &str = "DELETE FROM resolutions WHERE scope = ?1 AND key = ?2 \
     AND seq <= (SELECT MAX(seq) FROM resolutions WHERE scope = ?1 AND key = ?2) - ?3";

/// A record's newest `?3` journal entries, oldest first.
pub(crate) const JOURNAL_GET: &str = "SELECT token, outcome, status, resolved_by, reason, at_ms, verb \
     FROM (SELECT * FROM resolutions WHERE scope = ?1 AND key = ?2 ORDER BY seq DESC LIMIT ?3) \
     ORDER BY seq";

/// The failed lookups kept for one record.
pub(crate) const TRIES_GET: &str =
    "SELECT token, failures, next_at_ms FROM lookup_tries WHERE scope = ?1 AND key = ?2";

/// Keeps the failed lookups of one record, replacing what was kept.
pub(crate) const TRIES_PUT: &str = "INSERT OR REPLACE INTO lookup_tries \
     (scope, key, token, failures, next_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)";

/// Drops the failed lookups of a record that was resolved.
pub(crate) const TRIES_DELETE: &str = "DELETE FROM lookup_tries WHERE scope = ?1 AND key = ?2";

/// Counts one operator's verb applied to the file.
pub(crate) const VERBS_COUNT: &str = "UPDATE meta SET verbs = verbs + 1 WHERE id = 1";

/// How many operator's verbs the file has applied.
pub(crate) const VERBS_READ: &str = "SELECT verbs FROM meta WHERE id = 1";

/// The failed lookups kept for `id`, read on `conn` (the writer's, inside
/// its transaction, or a reader's).
pub(crate) fn tries(
    conn: &Connection,
    id: &RecordId,
    store: &str,
) -> Result<Option<LookupTries>, StoreError> {
    let read = |r: &Row<'_>| -> rusqlite::Result<(i64, i64, i64)> {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    };
    let found = conn
        .prepare_cached(TRIES_GET)
        .and_then(|mut stmt| {
            stmt.query_row((id.scope.as_str(), id.key.as_str()), read)
                .optional()
        })
        .map_err(|e| crate::schema::error(store, &e))?;
    let Some((token, failures, next_at)) = found else {
        return Ok(None);
    };
    let bad = |what: &str, value: i64| {
        damaged(
            store,
            &id.to_string(),
            &format!("lookup_tries.{what} is {value}"),
        )
    };
    Ok(Some(LookupTries {
        token: Token(u64::try_from(token).map_err(|_| bad("token", token))?),
        failures: u32::try_from(failures).map_err(|_| bad("failures", failures))?,
        next_at: Timestamp::from_millis(
            u64::try_from(next_at).map_err(|_| bad("next_at_ms", next_at))?,
        ),
    }))
}

/// Keeps `tries` for `id`.
pub(crate) fn put_tries(
    conn: &Connection,
    id: &RecordId,
    tries: &LookupTries,
) -> rusqlite::Result<()> {
    conn.prepare_cached(TRIES_PUT)?.execute(params![
        id.scope.as_str(),
        id.key.as_str(),
        int(tries.token.0),
        i64::from(tries.failures),
        int(tries.next_at.as_millis()),
    ])?;
    Ok(())
}

/// A `u64` as SQLite's signed 64-bit integer. Times are milliseconds since
/// 1970 and tokens count acquisitions, so real values are far below
/// `i64::MAX`; a saturated "far future" (`u64::MAX`) is kept as `i64::MAX`,
/// which compares the same way against any real clock.
pub(crate) fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Binds `record` to the parameters of [`PUT`] or [`INSERT_NEW`] and runs
/// it; returns the number of rows written.
pub(crate) fn put(stmt: &mut Statement<'_>, record: &Record) -> Result<usize, rusqlite::Error> {
    let (status, headers, body) = match &record.result {
        Some(r) => (
            Some(i64::from(r.status())),
            Some(serde_json::to_string(r.headers()).map_err(not_sql)?),
            Some(r.body()),
        ),
        None => (None, None, None),
    };
    let resolution = match &record.resolution {
        Some(r) => Some(serde_json::to_string(r).map_err(not_sql)?),
        None => None,
    };
    let ambiguity = match &record.ambiguity {
        Some(note) => Some(serde_json::to_string(note).map_err(not_sql)?),
        None => None,
    };
    stmt.execute(params![
        record.id.scope.as_str(),
        record.id.key.as_str(),
        &record.fingerprint.as_bytes()[..],
        record.state.as_str(),
        int(record.token.0),
        record.owner.as_str(),
        int(record.lease_until.as_millis()),
        int(record.created_at.as_millis()),
        record.completed_at.map(|t| int(t.as_millis())),
        record.expires_at.map(|t| int(t.as_millis())),
        record.tombstone_until.map(|t| int(t.as_millis())),
        int(record.retention_s),
        int(record.tombstone_s),
        status,
        headers,
        body,
        resolution,
        record.region.as_deref(),
        ambiguity,
    ])
}

/// Appends `entry` to the journal with [`JOURNAL_APPEND`], then keeps the
/// newest [`JOURNAL_PER_RECORD_MAX`] entries of its record.
pub(crate) fn append_journal(conn: &Connection, entry: &JournalEntry) -> rusqlite::Result<()> {
    let (scope, key) = (entry.id.scope.as_str(), entry.id.key.as_str());
    conn.prepare_cached(JOURNAL_APPEND)?.execute(params![
        scope,
        key,
        int(entry.token.0),
        entry.outcome.as_str(),
        entry.status.map(i64::from),
        entry.by.as_str(),
        entry.reason.as_str(),
        int(entry.at.as_millis()),
        entry.verb.map(Verb::as_str),
    ])?;
    conn.prepare_cached(JOURNAL_TRIM)?.execute(params![
        scope,
        key,
        int(JOURNAL_PER_RECORD_MAX as u64)
    ])?;
    Ok(())
}

/// Decodes one row selected by [`JOURNAL_GET`] for `id`.
pub(crate) fn decode_entry(
    row: &Row<'_>,
    id: &RecordId,
    store: &str,
) -> Result<JournalEntry, StoreError> {
    let entry = || -> Result<JournalEntry, String> {
        let status = match row.get::<_, Option<i64>>(2).map_err(|e| e.to_string())? {
            None => None,
            Some(s) => Some(u16::try_from(s).map_err(|_| format!("status {s}"))?),
        };
        Ok(JournalEntry {
            id: id.clone(),
            token: Token(unsigned(row, 0, "token")?),
            outcome: text(row, 1)?.parse()?,
            status,
            by: text(row, 3)?,
            reason: text(row, 4)?,
            at: time(row, 5, "at_ms")?,
            verb: match row.get::<_, Option<String>>(6).map_err(|e| e.to_string())? {
                None => None,
                Some(verb) => Some(verb.parse()?),
            },
        })
    };
    entry().map_err(|why| StoreError::Incompatible {
        store: store.to_owned(),
        reason: format!("a resolution of {id} cannot be read: {why}"),
    })
}

/// Decodes one row selected with [`COLUMNS`]. `store` names the database in
/// the error.
pub(crate) fn decode(row: &Row<'_>, store: &str) -> Result<Record, StoreError> {
    let scope: String = text(row, 0).map_err(|e| damaged(store, "a record", &e))?;
    let key: String = text(row, 1).map_err(|e| damaged(store, &format!("scope {scope:?}"), &e))?;
    let at = format!("scope {scope:?} key {key:?}");
    fields(row, scope, key).map_err(|e| damaged(store, &at, &e))
}

/// Decodes one row of a scan: its position (raw text, so a scan can go on
/// past it) and the record, or why the row cannot be read.
pub(crate) fn decode_listed(row: &Row<'_>) -> (ListCursor, Result<Record, DamagedRow>) {
    let raw = |idx: usize| match row.get_ref(idx) {
        Ok(ValueRef::Text(b) | ValueRef::Blob(b)) => String::from_utf8_lossy(b).into_owned(),
        Ok(other) => format!("<{}>", other.data_type()),
        Err(e) => format!("<{e}>"),
    };
    let (scope, key) = (raw(0), raw(1));
    let decoded = match (text(row, 0), text(row, 1)) {
        (Ok(s), Ok(k)) => fields(row, s, k),
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    let at = ListCursor {
        scope: scope.clone(),
        key: key.clone(),
    };
    let decoded = decoded.map_err(|reason| DamagedRow { scope, key, reason });
    (at, decoded)
}

/// A row read from a database that is not in the shape this version wrote.
pub(crate) fn damaged(store: &str, at: &str, why: &str) -> StoreError {
    StoreError::Incompatible {
        store: store.to_owned(),
        reason: format!("the record at {at} cannot be read: {why}"),
    }
}

fn fields(row: &Row<'_>, scope: String, key: String) -> Result<Record, String> {
    let id = RecordId {
        scope: Scope::new(scope).map_err(|e| format!("scope: {e}"))?,
        key: IdempotencyKey::new(key).map_err(|e| format!("key: {e}"))?,
    };
    let fingerprint = match row.get_ref(2).map_err(|e| e.to_string())? {
        ValueRef::Blob(b) => <[u8; 32]>::try_from(b)
            .map(Fingerprint::from_bytes)
            .map_err(|_| format!("fingerprint is {} bytes, not 32", b.len()))?,
        other => return Err(format!("fingerprint is {}, not a blob", other.data_type())),
    };
    let state: State = text(row, 3)?.parse()?;
    let result = match row.get::<_, Option<i64>>(13).map_err(|e| e.to_string())? {
        None => None,
        Some(status) => Some(stored_result(row, status)?),
    };
    let resolution = match row
        .get::<_, Option<String>>(16)
        .map_err(|e| e.to_string())?
    {
        None => None,
        Some(json) => Some(
            serde_json::from_str::<Resolution>(&json).map_err(|e| format!("resolution: {e}"))?,
        ),
    };
    let region: Option<String> = row.get(17).map_err(|e| format!("region: {e}"))?;
    let ambiguity = match row
        .get::<_, Option<String>>(18)
        .map_err(|e| format!("ambiguity: {e}"))?
    {
        None => None,
        Some(json) => Some(
            serde_json::from_str::<AmbiguityNote>(&json).map_err(|e| format!("ambiguity: {e}"))?,
        ),
    };
    if let Some(region) = &region {
        check_region(region).map_err(|e| format!("region: {e}"))?;
    }
    Ok(Record {
        id,
        fingerprint,
        state,
        token: Token(unsigned(row, 4, "token")?),
        owner: text(row, 5)?,
        region,
        lease_until: time(row, 6, "lease_until_ms")?,
        created_at: time(row, 7, "created_at_ms")?,
        completed_at: optional_time(row, 8, "completed_at_ms")?,
        expires_at: optional_time(row, 9, "expires_at_ms")?,
        tombstone_until: optional_time(row, 10, "tombstone_until_ms")?,
        retention_s: unsigned(row, 11, "retention_s")?,
        tombstone_s: unsigned(row, 12, "tombstone_s")?,
        result,
        resolution,
        ambiguity,
    })
}

fn stored_result(row: &Row<'_>, status: i64) -> Result<StoredResult, String> {
    let status = u16::try_from(status).map_err(|_| format!("result status {status}"))?;
    let headers: Vec<(String, HeaderBytes)> = match row.get::<_, Option<String>>(14) {
        Ok(Some(json)) => {
            serde_json::from_str(&json).map_err(|e| format!("result headers: {e}"))?
        }
        Ok(None) => Vec::new(),
        Err(e) => return Err(e.to_string()),
    };
    let body = match row.get_ref(15).map_err(|e| e.to_string())? {
        ValueRef::Blob(b) => b.to_vec(),
        ValueRef::Null => Vec::new(),
        other => return Err(format!("result body is {}, not a blob", other.data_type())),
    };
    StoredResult::new(status, headers, body).map_err(|e| format!("result: {e}"))
}

fn text(row: &Row<'_>, idx: usize) -> Result<String, String> {
    row.get(idx).map_err(|e| e.to_string())
}

fn unsigned(row: &Row<'_>, idx: usize, name: &str) -> Result<u64, String> {
    let value: i64 = row.get(idx).map_err(|e| format!("{name}: {e}"))?;
    u64::try_from(value).map_err(|_| format!("{name} is negative ({value})"))
}

fn time(row: &Row<'_>, idx: usize, name: &str) -> Result<Timestamp, String> {
    unsigned(row, idx, name).map(Timestamp::from_millis)
}

fn optional_time(row: &Row<'_>, idx: usize, name: &str) -> Result<Option<Timestamp>, String> {
    match row.get::<_, Option<i64>>(idx) {
        Ok(None) => Ok(None),
        Ok(Some(_)) => time(row, idx, name).map(Some),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

fn not_sql(e: serde_json::Error) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(e))
}

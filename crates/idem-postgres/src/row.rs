//! How a [`Record`] maps to a row of `records` and back, so that every
//! statement agrees on the columns and a damaged row becomes an error naming
//! its scope and key instead of a panic.

use idem_core::{
    AmbiguityNote, DamagedRow, Fingerprint, HeaderBytes, IdempotencyKey, JournalEntry, ListCursor,
    Record, RecordId, Resolution, Scope, State, StoreError, StoredResult, Timestamp, Token,
    check_region,
};
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use crate::error;

/// Every column of `records`, in the order [`decode`] and [`Columns`] use.
pub(crate) const COLUMNS: [&str; 19] = [
    "scope",
    "key",
    "fingerprint",
    "state",
    "token",
    "owner",
    "lease_until_ms",
    "created_at_ms",
    "completed_at_ms",
    "expires_at_ms",
    "tombstone_until_ms",
    "retention_s",
    "tombstone_s",
    "result_status",
    "result_headers",
    "result_body",
    "resolution",
    "region",
    "ambiguity",
];

/// The array type of each column, for `unnest` in the put statement.
pub(crate) const ARRAY_TYPES: [&str; 19] = [
    "text[]", "text[]", "bytea[]", "text[]", "bigint[]", "text[]", "bigint[]", "bigint[]",
    "bigint[]", "bigint[]", "bigint[]", "bigint[]", "bigint[]", "int[]", "text[]", "bytea[]",
    "text[]", "text[]", "text[]",
];

/// A statement parameter with its type: prepared statements ignore the
/// type, one-round-trip typed queries on a caller's transaction need it.
pub(crate) type Param<'p> = (&'p (dyn ToSql + Sync), Type);

/// A `u64` as PostgreSQL's `bigint`. Times are milliseconds since 1970 and
/// tokens count acquisitions, far below `i64::MAX`; a saturated "far
/// future" is kept as `i64::MAX` ([`Timestamp::MAX`]), which compares the
/// same way against any real clock.
pub(crate) fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Records as one array per column, bound to the put statement so that one
/// statement writes one record or a whole purge batch.
pub(crate) struct Columns<'r> {
    scope: Vec<&'r str>,
    key: Vec<&'r str>,
    fingerprint: Vec<&'r [u8]>,
    state: Vec<&'static str>,
    token: Vec<i64>,
    owner: Vec<&'r str>,
    lease_until: Vec<i64>,
    created_at: Vec<i64>,
    completed_at: Vec<Option<i64>>,
    expires_at: Vec<Option<i64>>,
    tombstone_until: Vec<Option<i64>>,
    retention_s: Vec<i64>,
    tombstone_s: Vec<i64>,
    status: Vec<Option<i32>>,
    headers: Vec<Option<String>>,
    body: Vec<Option<&'r [u8]>>,
    resolution: Vec<Option<String>>,
    region: Vec<Option<&'r str>>,
    ambiguity: Vec<Option<String>>,
}

impl<'r> Columns<'r> {
    /// The columns of `records`; fails only if a value cannot be encoded.
    pub(crate) fn new(records: &'r [Record]) -> Result<Columns<'r>, serde_json::Error> {
        let n = records.len();
        let mut c = Columns {
            scope: Vec::with_capacity(n),
            key: Vec::with_capacity(n),
            fingerprint: Vec::with_capacity(n),
            state: Vec::with_capacity(n),
            token: Vec::with_capacity(n),
            owner: Vec::with_capacity(n),
            lease_until: Vec::with_capacity(n),
            created_at: Vec::with_capacity(n),
            completed_at: Vec::with_capacity(n),
            expires_at: Vec::with_capacity(n),
            tombstone_until: Vec::with_capacity(n),
            retention_s: Vec::with_capacity(n),
            tombstone_s: Vec::with_capacity(n),
            status: Vec::with_capacity(n),
            headers: Vec::with_capacity(n),
            body: Vec::with_capacity(n),
            resolution: Vec::with_capacity(n),
            region: Vec::with_capacity(n),
            ambiguity: Vec::with_capacity(n),
        };
        for r in records {
            c.push(r)?;
        }
        Ok(c)
    }

    fn push(&mut self, r: &'r Record) -> Result<(), serde_json::Error> {
        let ms = |t: Option<Timestamp>| t.map(|t| int(t.as_millis()));
        self.scope.push(r.id.scope.as_str());
        self.key.push(r.id.key.as_str());
        self.fingerprint.push(&r.fingerprint.as_bytes()[..]);
        self.state.push(r.state.as_str());
        self.token.push(int(r.token.0));
        self.owner.push(&r.owner);
        self.lease_until.push(int(r.lease_until.as_millis()));
        self.created_at.push(int(r.created_at.as_millis()));
        self.completed_at.push(ms(r.completed_at));
        self.expires_at.push(ms(r.expires_at));
        self.tombstone_until.push(ms(r.tombstone_until));
        self.retention_s.push(int(r.retention_s));
        self.tombstone_s.push(int(r.tombstone_s));
        let result = r.result.as_ref();
        self.status.push(result.map(|r| i32::from(r.status())));
        self.headers.push(match result {
            Some(r) => Some(serde_json::to_string(r.headers())?),
            None => None,
        });
        self.body.push(result.map(StoredResult::body));
        self.resolution.push(match &r.resolution {
            Some(resolution) => Some(serde_json::to_string(resolution)?),
            None => None,
        });
        self.region.push(r.region.as_deref());
        self.ambiguity.push(match &r.ambiguity {
            Some(note) => Some(serde_json::to_string(note)?),
            None => None,
        });
        Ok(())
    }

    /// The parameters of the put statement, in [`COLUMNS`] order.
    pub(crate) fn params(&self) -> [Param<'_>; 19] {
        [
            (&self.scope, Type::TEXT_ARRAY),
            (&self.key, Type::TEXT_ARRAY),
            (&self.fingerprint, Type::BYTEA_ARRAY),
            (&self.state, Type::TEXT_ARRAY),
            (&self.token, Type::INT8_ARRAY),
            (&self.owner, Type::TEXT_ARRAY),
            (&self.lease_until, Type::INT8_ARRAY),
            (&self.created_at, Type::INT8_ARRAY),
            (&self.completed_at, Type::INT8_ARRAY),
            (&self.expires_at, Type::INT8_ARRAY),
            (&self.tombstone_until, Type::INT8_ARRAY),
            (&self.retention_s, Type::INT8_ARRAY),
            (&self.tombstone_s, Type::INT8_ARRAY),
            (&self.status, Type::INT4_ARRAY),
            (&self.headers, Type::TEXT_ARRAY),
            (&self.body, Type::BYTEA_ARRAY),
            (&self.resolution, Type::TEXT_ARRAY),
            (&self.region, Type::TEXT_ARRAY),
            (&self.ambiguity, Type::TEXT_ARRAY),
        ]
    }
}

/// Decodes the record in the [`COLUMNS`] starting at column `first`, or
/// `None` when they are NULL (the outer join of the locked read found no
/// record). `store` names the database in the error.
pub(crate) fn decode(row: &Row, first: usize, store: &str) -> Result<Option<Record>, StoreError> {
    let scope: Option<String> = row
        .try_get(first)
        .map_err(|e| error::damaged(store, "a record", &error::chain(&e)))?;
    let Some(scope) = scope else {
        return Ok(None);
    };
    let key: String = row
        .try_get(first + 1)
        .map_err(|e| error::damaged(store, &format!("scope {scope:?}"), &error::chain(&e)))?;
    let at = format!("scope {scope:?} key {key:?}");
    let fields = Fields { row, first };
    fields
        .record(scope, key)
        .map(Some)
        .map_err(|why| error::damaged(store, &at, &why))
}

/// Decodes one row of a scan (record columns from `first`): its position
/// (raw text, so a scan can go on past it) and the record, or why the row
/// cannot be read.
pub(crate) fn decode_listed(row: &Row, first: usize) -> (ListCursor, Result<Record, DamagedRow>) {
    let raw = |idx: usize| match row.try_get::<_, Option<&str>>(first + idx) {
        Ok(Some(text)) => text.to_owned(),
        Ok(None) => "<null>".to_owned(),
        Err(e) => format!("<{}>", error::chain(&e)),
    };
    let (scope, key) = (raw(0), raw(1));
    let fields = Fields { row, first };
    let decoded = fields
        .record(scope.clone(), key.clone())
        .map_err(|reason| DamagedRow {
            scope: scope.clone(),
            key: key.clone(),
            reason,
        });
    (ListCursor { scope, key }, decoded)
}

/// Decodes one row of the journal read (`token, outcome, status,
/// resolved_by, reason, at_ms, verb`) for `id`.
pub(crate) fn decode_entry(
    row: &Row,
    id: &RecordId,
    store: &str,
) -> Result<JournalEntry, StoreError> {
    let fields = Fields { row, first: 0 };
    let entry = || -> Result<JournalEntry, String> {
        let status = match fields.get::<Option<i32>>(2, "status")? {
            None => None,
            Some(s) => Some(u16::try_from(s).map_err(|_| format!("status {s}"))?),
        };
        let utf8 = |idx, name: &str| -> Result<String, String> {
            String::from_utf8(fields.get::<Vec<u8>>(idx, name)?).map_err(|e| format!("{name}: {e}"))
        };
        Ok(JournalEntry {
            id: id.clone(),
            token: Token(fields.unsigned(0, "token")?),
            outcome: fields.get::<&str>(1, "outcome")?.parse()?,
            status,
            by: utf8(3, "resolved_by")?,
            reason: utf8(4, "reason")?,
            at: fields.time(5, "at_ms")?,
            verb: match fields.get::<Option<&str>>(6, "verb")? {
                None => None,
                Some(verb) => Some(verb.parse()?),
            },
        })
    };
    entry().map_err(|why| error::damaged(store, &format!("a resolution of {id}"), &why))
}

/// Reads a timestamp column (milliseconds), such as the `now` a statement
/// returns.
pub(crate) fn time(row: &Row, idx: usize, name: &str) -> Result<Timestamp, String> {
    unsigned(row, idx, name).map(Timestamp::from_millis)
}

/// Reads a non-negative `bigint` column.
pub(crate) fn unsigned(row: &Row, idx: usize, name: &str) -> Result<u64, String> {
    let value: i64 = row
        .try_get(idx)
        .map_err(|e| format!("{name}: {}", error::chain(&e)))?;
    u64::try_from(value).map_err(|_| format!("{name} is negative ({value})"))
}

/// One row's record columns, from column `first` on.
struct Fields<'a> {
    row: &'a Row,
    first: usize,
}

impl Fields<'_> {
    fn record(&self, scope: String, key: String) -> Result<Record, String> {
        let id = RecordId {
            scope: Scope::new(scope).map_err(|e| format!("scope: {e}"))?,
            key: IdempotencyKey::new(key).map_err(|e| format!("key: {e}"))?,
        };
        let fingerprint: &[u8] = self.get(2, "fingerprint")?;
        let fingerprint = <[u8; 32]>::try_from(fingerprint)
            .map(Fingerprint::from_bytes)
            .map_err(|_| format!("fingerprint is {} bytes, not 32", fingerprint.len()))?;
        let state: State = self.get::<&str>(3, "state")?.parse()?;
        let result = match self.get::<Option<i32>>(13, "result_status")? {
            None => None,
            Some(status) => Some(self.result(status)?),
        };
        let resolution = match self.get::<Option<&str>>(16, "resolution")? {
            None => None,
            Some(json) => Some(
                serde_json::from_str::<Resolution>(json).map_err(|e| format!("resolution: {e}"))?,
            ),
        };
        let region = self.get::<Option<&str>>(17, "region")?;
        if let Some(region) = region {
            check_region(region).map_err(|e| format!("region: {e}"))?;
        }
        let ambiguity = match self.get::<Option<&str>>(18, "ambiguity")? {
            None => None,
            Some(json) => Some(
                serde_json::from_str::<AmbiguityNote>(json)
                    .map_err(|e| format!("ambiguity: {e}"))?,
            ),
        };
        Ok(Record {
            id,
            fingerprint,
            state,
            token: Token(self.unsigned(4, "token")?),
            owner: self.get::<&str>(5, "owner")?.to_owned(),
            region: region.map(str::to_owned),
            lease_until: self.time(6, "lease_until_ms")?,
            created_at: self.time(7, "created_at_ms")?,
            completed_at: self.optional_time(8, "completed_at_ms")?,
            expires_at: self.optional_time(9, "expires_at_ms")?,
            tombstone_until: self.optional_time(10, "tombstone_until_ms")?,
            retention_s: self.unsigned(11, "retention_s")?,
            tombstone_s: self.unsigned(12, "tombstone_s")?,
            result,
            resolution,
            ambiguity,
        })
    }

    fn result(&self, status: i32) -> Result<StoredResult, String> {
        let status = u16::try_from(status).map_err(|_| format!("result status {status}"))?;
        let headers: Vec<(String, HeaderBytes)> = match self
            .get::<Option<&str>>(14, "result_headers")?
        {
            Some(json) => serde_json::from_str(json).map_err(|e| format!("result headers: {e}"))?,
            None => Vec::new(),
        };
        let body: Option<&[u8]> = self.get(15, "result_body")?;
        let body = body.map(<[u8]>::to_vec).unwrap_or_default();
        StoredResult::new(status, headers, body).map_err(|e| format!("result: {e}"))
    }

    fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
        &'a self,
        idx: usize,
        name: &str,
    ) -> Result<T, String> {
        self.row
            .try_get(self.first + idx)
            .map_err(|e| format!("{name}: {}", error::chain(&e)))
    }

    fn unsigned(&self, idx: usize, name: &str) -> Result<u64, String> {
        unsigned(self.row, self.first + idx, name)
    }

    fn time(&self, idx: usize, name: &str) -> Result<Timestamp, String> {
        time(self.row, self.first + idx, name)
    }

    fn optional_time(&self, idx: usize, name: &str) -> Result<Option<Timestamp>, String> {
        match self.get::<Option<i64>>(idx, name)? {
            None => Ok(None),
            Some(_) => self.time(idx, name).map(Some),
        }
    }
}

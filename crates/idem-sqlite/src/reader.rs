//! The reader threads: `get` and `list` on their own connections, so that
//! operators' queries never wait behind the writer's fsync (WAL lets readers
//! see the last commit while a new one is being written).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use idem_core::decision;
use idem_core::{
    Clock, JOURNAL_PER_RECORD_MAX, JournalEntry, ListQuery, Listing, LookupTries, Record, RecordId,
    ReplayCache, State, StoreError, SuspectWindow, Token,
};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension};
use tokio::sync::mpsc;

use crate::row;
use crate::schema;
use crate::writer::Reply;

/// One read operation, with owned inputs and its reply channel.
pub(crate) enum ReadOp {
    Get {
        id: RecordId,
        reply: Reply<Option<Record>>,
    },
    List {
        query: ListQuery,
        reply: Reply<Listing>,
    },
    /// The resolution journal of one record.
    Resolutions {
        id: RecordId,
        reply: Reply<Vec<JournalEntry>>,
    },
    /// The failed lookups kept for one attempt.
    LookupTries {
        id: RecordId,
        token: Token,
        reply: Reply<Option<LookupTries>>,
    },
    /// The suspect window.
    Window { reply: Reply<Option<SuspectWindow>> },
    /// Reads the count of operator's verbs into `replays`; nobody waits
    /// for it, and a failure only lets the last reading age.
    NoteVerbs { replays: Arc<ReplayCache> },
}

/// The queue every reader thread takes work from.
pub(crate) type SharedQueue = Arc<Mutex<mpsc::Receiver<ReadOp>>>;

/// Serves read operations until the queue closes.
pub(crate) fn run(conn: Connection, clock: Arc<dyn Clock>, store: String, queue: SharedQueue) {
    loop {
        // Hold the lock only while waiting, so that the other readers take
        // the next operation while this one runs.
        let op = {
            let mut receiver = queue
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            receiver.blocking_recv()
        };
        match op {
            Some(ReadOp::Get { id, reply }) => {
                let _ = reply.send(get(&conn, &store, &id));
            }
            Some(ReadOp::List { query, reply }) => {
                let _ = reply.send(list(&conn, &store, clock.as_ref(), &query));
            }
            Some(ReadOp::Resolutions { id, reply }) => {
                let _ = reply.send(resolutions(&conn, &store, &id));
            }
            Some(ReadOp::LookupTries { id, token, reply }) => {
                let kept = row::tries(&conn, &id, &store);
                let _ = reply.send(kept.map(|k| decision::tries_of_attempt(k.as_ref(), token)));
            }
            Some(ReadOp::Window { reply }) => {
                let _ = reply.send(crate::window::read(&conn, &store));
            }
            Some(ReadOp::NoteVerbs { replays }) => note_verbs(&conn, &replays),
            None => return,
        }
    }
}

/// Reads the count of operator's verbs and notes it in `replays`, with the
/// instant its read began.
fn note_verbs(conn: &Connection, replays: &ReplayCache) {
    let read_at = Instant::now();
    let count = conn
        .prepare_cached(row::VERBS_READ)
        .and_then(|mut stmt| stmt.query_row([], |row| row.get::<_, i64>(0)));
    if let Ok(count) = count
        && let Ok(count) = u64::try_from(count)
    {
        replays.note_verbs(count, read_at);
    }
}

fn get(conn: &Connection, store: &str, id: &RecordId) -> Result<Option<Record>, StoreError> {
    conn.prepare_cached(row::GET)
        .and_then(|mut stmt| {
            stmt.query_row((id.scope.as_str(), id.key.as_str()), |r| {
                Ok(row::decode(r, store))
            })
            .optional()
        })
        .map_err(|e| schema::error(store, &e))?
        .transpose()
}

/// The newest `JOURNAL_PER_RECORD_MAX` journal entries of `id`, oldest first.
fn resolutions(
    conn: &Connection,
    store: &str,
    id: &RecordId,
) -> Result<Vec<JournalEntry>, StoreError> {
    let limit = row::int(JOURNAL_PER_RECORD_MAX as u64);
    conn.prepare_cached(row::JOURNAL_GET)
        .and_then(|mut stmt| {
            stmt.query_map((id.scope.as_str(), id.key.as_str(), limit), |r| {
                Ok(row::decode_entry(r, id, store))
            })?
            .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|e| schema::error(store, &e))?
        .into_iter()
        .collect()
}

/// Records in (scope, key) order after the cursor, filtered by their state at
/// the store's now, exactly like the memory store.
fn list(
    conn: &Connection,
    store: &str,
    clock: &dyn Clock,
    query: &ListQuery,
) -> Result<Listing, StoreError> {
    let now = row::int(clock.now().as_millis());
    let mut clauses: Vec<&str> = Vec::new();
    let mut params: Vec<Value> = Vec::new();
    if let Some(state) = query.state {
        clauses.push(state_clause(state));
        if matches!(state, State::Completed | State::Tombstone) {
            params.push(Value::Integer(now));
        }
    }
    if let Some(after) = &query.after {
        clauses.push("(scope, key) > (?, ?)");
        params.push(Value::Text(after.scope.clone()));
        params.push(Value::Text(after.key.clone()));
    }
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    let limit = query.effective_limit();
    params.push(Value::Integer(row::int(limit as u64)));
    let sql = format!(
        "SELECT {} FROM records {filter} ORDER BY scope, key LIMIT ?",
        row::COLUMNS
    );
    let rows = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| {
            stmt.query_map(rusqlite::params_from_iter(params), |r| {
                Ok(row::decode_listed(r))
            })?
            .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|e| schema::error(store, &e))?;
    let count = rows.len();
    let (mut records, mut damaged, mut last) = (Vec::new(), Vec::new(), None);
    for (at, decoded) in rows {
        match decoded {
            Ok(record) => records.push(record),
            Err(bad) => damaged.push(bad),
        }
        last = Some(at);
    }
    Ok(Listing::page(records, damaged, last, count, limit))
}

/// `Record::state_at(now) == state` in SQL, with `now` as the one parameter
/// of the completed and tombstone cases. The literal `state = 'ambiguous'`
/// lets SQLite use the partial index `records_ambiguous`.
fn state_clause(state: State) -> &'static str {
    match state {
        State::InProgress => "state = 'in_progress'",
        State::Ambiguous => "state = 'ambiguous'",
        State::Completed => {
            "(state = 'completed' AND (expires_at_ms IS NULL OR expires_at_ms > ?))"
        }
        State::Tombstone => "(state = 'tombstone' OR (state = 'completed' AND expires_at_ms <= ?))",
    }
}

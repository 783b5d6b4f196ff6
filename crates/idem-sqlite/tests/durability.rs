//! What the file promises beyond one process: records in every state survive
//! close and reopen unchanged, tokens keep growing across reopen and
//! deletes, every file the store refuses is refused with a message naming
//! the path and the reason (by a check that writes nothing too), and
//! concurrent operations really share commits.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use idem_conformance::checks;
use idem_core::{
    Claim, ListQuery, ManualClock, Outcome, Record, Resolution, State, Store, StoreError,
    StoredResult, Timestamp, Token,
};
use idem_sqlite::{APPLICATION_ID, Found, SCHEMA_VERSION, SqliteOptions, SqliteStore, WriterStats};
use support::{id, request};
use tokio::task::JoinSet;

mod support;

const START_MS: u64 = 1_700_000_000_000;

/// Headers with repeats and an empty value, a body with every byte value.
fn result() -> StoredResult {
    let headers = vec![
        ("content-type".to_owned(), "application/json".into()),
        ("x-dup".to_owned(), "b".into()),
        ("x-dup".to_owned(), "a".into()),
        ("x-empty".to_owned(), "".into()),
        ("x-latin1".to_owned(), b"caf\xe9".as_slice().into()),
    ];
    StoredResult::new(201, headers, (0..=255u8).collect()).unwrap()
}

fn open(path: &Path, clock: &ManualClock, options: SqliteOptions) -> SqliteStore {
    SqliteStore::open_with_clock(path, options, Arc::new(clock.clone())).unwrap()
}

async fn acquire(store: &SqliteStore, key: &str) -> Token {
    match store.claim(&request(key)).await.unwrap() {
        Claim::Acquired { token, .. } => token,
        other => panic!("{key}: expected Acquired, got {other:?}"),
    }
}

/// One record in each state, stored and as a purge leaves it.
async fn every_state(store: &SqliteStore, clock: &ManualClock) {
    let t = acquire(store, "tombstoned").await;
    store
        .complete(&id("tombstoned"), t, result())
        .await
        .unwrap();
    clock.advance_millis(60_000);
    assert_eq!(store.purge(100).await.unwrap().tombstoned, 1);

    acquire(store, "in-progress").await;
    let t = acquire(store, "completed").await;
    store.complete(&id("completed"), t, result()).await.unwrap();
    let t = acquire(store, "ambiguous").await;
    store.mark_ambiguous(&id("ambiguous"), t).await.unwrap();
    let t = acquire(store, "resolved").await;
    store.mark_ambiguous(&id("resolved"), t).await.unwrap();
    let outcome = Outcome::Completed { result: result() };
    let resolution = Resolution::new(outcome, "operator ann", "found in the ledger").unwrap();
    store.resolve(&id("resolved"), t, resolution).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_in_every_state_survive_reopen_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let clock = ManualClock::new(Timestamp::from_millis(START_MS));
    let store = open(&path, &clock, SqliteOptions::default());
    every_state(&store, &clock).await;
    let before = store.list(&ListQuery::default()).await.unwrap().records;
    let states: Vec<State> = before.iter().map(|r| r.state).collect();
    for state in [
        State::InProgress,
        State::Completed,
        State::Ambiguous,
        State::Tombstone,
    ] {
        assert!(states.contains(&state), "{state} is covered: {states:?}");
    }
    drop(store);

    let store = open(&path, &clock, SqliteOptions::default());
    let after = store.list(&ListQuery::default()).await.unwrap().records;
    assert_eq!(after, before);
    for record in &before {
        assert_eq!(store.get(&record.id).await.unwrap().as_ref(), Some(record));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_after_delete_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let clock = ManualClock::new(Timestamp::from_millis(START_MS));
    let mut seen = Vec::new();
    for round in 0..3 {
        let store = open(&path, &clock, SqliteOptions::default());
        // The record holding the highest token is released (deleted), so
        // only the persisted counter remembers it.
        let token = acquire(&store, "k").await;
        store.release(&id("k"), token).await.unwrap();
        seen.push(token);
        seen.push(acquire(&store, &format!("other-{round}")).await);
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, seen, "tokens strictly increase: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_sharing_a_file_hand_out_increasing_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let clock = ManualClock::new(Timestamp::from_millis(START_MS));
    // Two stores on one file, as two processes on one node would have.
    let stores = [
        open(&path, &clock, SqliteOptions::default()),
        open(&path, &clock, SqliteOptions::default()),
    ];
    let mut last = Token(0);
    for i in 0..20 {
        let token = acquire(&stores[i % 2], &format!("shared-{i}")).await;
        assert!(token > last, "claim {i}: {token} after {last}");
        last = token;
    }
}

/// How a refused file is prepared, and what the error must say.
struct Refusal {
    name: &'static str,
    setup: fn(&Path) -> PathBuf,
    create: bool,
    incompatible: bool,
    reason: &'static str,
}

fn not_sqlite(dir: &Path) -> PathBuf {
    let path = dir.join("notes.txt");
    std::fs::write(&path, "these are my notes, not a database\n".repeat(200)).unwrap();
    path
}

fn sqlite_file(dir: &Path, sql: &str) -> PathBuf {
    let path = dir.join("other.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(sql).unwrap();
    path
}

fn other_application(dir: &Path) -> PathBuf {
    sqlite_file(dir, "PRAGMA application_id = 42; CREATE TABLE t (x);")
}

fn unmarked_tables(dir: &Path) -> PathBuf {
    sqlite_file(
        dir,
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);",
    )
}

fn newer_schema(dir: &Path) -> PathBuf {
    let path = dir.join("idem.db");
    drop(SqliteStore::open(&path, SqliteOptions::default()).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", 10).unwrap();
    path
}

fn missing_directory(dir: &Path) -> PathBuf {
    dir.join("no-such-dir").join("idem.db")
}

fn missing_file(dir: &Path) -> PathBuf {
    dir.join("idem.db")
}

fn read_only(dir: &Path) -> PathBuf {
    let path = dir.join("idem.db");
    drop(SqliteStore::open(&path, SqliteOptions::default()).unwrap());
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&path, perms).unwrap();
    path
}

fn directory(dir: &Path) -> PathBuf {
    let path = dir.join("a-directory");
    std::fs::create_dir(&path).unwrap();
    path
}

#[test]
fn refused_files_are_named_with_the_reason() {
    let cases = [
        Refusal {
            name: "not sqlite",
            setup: not_sqlite,
            create: true,
            incompatible: true,
            reason: "not an idem database: file is not a database",
        },
        Refusal {
            name: "another application's id",
            setup: other_application,
            create: true,
            incompatible: true,
            reason: "not an idem database: a SQLite database of another application (application_id 0x2a)",
        },
        Refusal {
            name: "tables without idem marking",
            setup: unmarked_tables,
            create: true,
            incompatible: true,
            reason: "not an idem database: a SQLite database of another application (1 schema objects, no idem application_id)",
        },
        Refusal {
            name: "newer schema",
            setup: newer_schema,
            create: true,
            incompatible: true,
            reason: "schema version 10 is newer than this idem supports (9); upgrade idem",
        },
        Refusal {
            name: "missing directory",
            setup: missing_directory,
            create: true,
            incompatible: false,
            reason: "no-such-dir does not exist",
        },
        Refusal {
            name: "missing file, create off",
            setup: missing_file,
            create: false,
            incompatible: false,
            reason: "the database file does not exist and create is off",
        },
        Refusal {
            name: "read-only file",
            setup: read_only,
            create: true,
            incompatible: false,
            reason: "the file is read-only; idem needs to write it",
        },
        Refusal {
            name: "a directory",
            setup: directory,
            create: true,
            incompatible: false,
            reason: "is a directory, not a database file",
        },
    ];
    assert_eq!(SCHEMA_VERSION, 9, "update the newer-schema case");
    for case in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = (case.setup)(dir.path());
        let before = std::fs::read(&path).ok();
        // What a start would refuse, a check refuses with the same error,
        // and leaves every file as it found it.
        let checked = case.create.then(|| {
            let files = files_in(dir.path());
            let err = SqliteStore::check(&path)
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert_eq!(
                files_in(dir.path()),
                files,
                "{}: a check left a file",
                case.name
            );
            err
        });
        let options = SqliteOptions {
            create: case.create,
            ..SqliteOptions::default()
        };
        let err = match SqliteStore::open(&path, options) {
            Ok(_) => panic!("{}: opened", case.name),
            Err(e) => e,
        };
        let (store, reason) = match &err {
            StoreError::Incompatible { store, reason } if case.incompatible => (store, reason),
            StoreError::Unavailable { store, reason } if !case.incompatible => (store, reason),
            other => panic!("{}: wrong kind of error: {other:?}", case.name),
        };
        assert_eq!(store, &path.display().to_string(), "{}", case.name);
        assert!(
            reason.contains(case.reason),
            "{}: {reason:?} should contain {:?}",
            case.name,
            case.reason
        );
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        if let Some(checked) = checked {
            assert_eq!(checked, Err(message.clone()), "{}: checked", case.name);
        }
        assert_eq!(
            std::fs::read(&path).ok(),
            before,
            "{}: a refused file is left untouched",
            case.name
        );
    }
}

/// The names in `dir`, and the size of each file, sorted.
fn files_in(dir: &Path) -> Vec<(String, u64)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let size = entry.metadata().unwrap().len();
            (entry.file_name().to_string_lossy().into_owned(), size)
        })
        .collect();
    files.sort();
    files
}

/// A check says what a start would find, whether a process has the store
/// open or not, and never leaves a file behind, not even the WAL's.
#[test]
fn a_check_finds_what_a_start_would_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Any byte may be in a name; the check reads this very file.
    let path = dir.path().join("what?#%20 idem.db");
    let check = |path: &Path| {
        let files = files_in(dir.path());
        let found = SqliteStore::check(path).unwrap();
        assert_eq!(
            files_in(dir.path()),
            files,
            "{found:?}: a check left a file"
        );
        found
    };
    assert_eq!(check(&path), Found::Nothing);
    std::fs::write(&path, b"").unwrap();
    assert_eq!(check(&path), Found::Empty);
    let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    assert_eq!(check(&path), Found::Store(SCHEMA_VERSION), "while open");
    drop(store);
    assert_eq!(check(&path), Found::Store(SCHEMA_VERSION), "closed");
    assert!(!dir.path().join("what?#%20 idem.db-wal").exists());
}

#[test]
fn marks_its_file_and_closes_it_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let wal = dir.path().join("idem.db-wal");
    let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    assert!(wal.exists(), "WAL mode");
    drop(store);
    // SQLite removes the WAL when its last connection closes: dropping the
    // store closed the writer's and every reader's connection.
    assert!(!wal.exists(), "every connection closed");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let pragma = |name: &str| -> i64 { conn.pragma_query_value(None, name, |r| r.get(0)).unwrap() };
    assert_eq!(pragma("application_id"), i64::from(APPLICATION_ID));
    assert_eq!(pragma("user_version"), SCHEMA_VERSION);
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    // Reopening an existing idem file (create off) works.
    let options = SqliteOptions {
        create: false,
        ..SqliteOptions::default()
    };
    SqliteStore::open(&path, options).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_row_is_named_and_stops_no_scan() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let clock = ManualClock::new(Timestamp::from_millis(START_MS));
    // The rows are damaged behind the store's back after it wrote them: its
    // replay cache would answer the completed ones from what it wrote, so
    // this store keeps none and reads every claim from the file.
    let options = SqliteOptions {
        replay_cache_bytes: 0,
        ..SqliteOptions::default()
    };
    let store = open(&path, &clock, options);
    for key in ["a", "b-headers", "c", "d-key", "e"] {
        let t = acquire(&store, key).await;
        store.complete(&id(key), t, result()).await.unwrap();
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "UPDATE records SET result_headers = 'not json' WHERE key = 'b-headers';
         UPDATE records SET key = 'd key' WHERE key = 'd-key';",
    )
    .unwrap();
    // The one damaged record is an error naming it, for its own key only.
    let expect = "the record at scope \"POST /payouts|tenant-a\" key \"b-headers\"";
    let own = [
        store.get(&id("b-headers")).await.map(|_| ()),
        store.claim(&request("b-headers")).await.map(|_| ()),
    ];
    for err in own {
        match err {
            Err(StoreError::Incompatible { store, reason }) => {
                assert_eq!(store, path.display().to_string());
                assert!(reason.contains(expect), "{reason}");
            }
            other => panic!("expected Incompatible, got {other:?}"),
        }
    }
    // Every other record, every listing and the purge go on.
    let scope = "POST /payouts|tenant-a";
    let good = [id("a"), id("c"), id("e")];
    checks::damaged_rows_do_not_stop_scans(
        &store,
        &good,
        &[(scope, "b-headers"), (scope, "d key")],
    )
    .await;
    assert!(matches!(
        store.claim(&request("c")).await,
        Ok(Claim::Replay { .. })
    ));
}

async fn concurrent_claims(store: Arc<SqliteStore>, n: usize) -> WriterStats {
    let before = store.stats();
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let store = Arc::clone(&store);
        tasks.spawn(async move { store.claim(&request(&format!("c-{i}"))).await });
    }
    while let Some(joined) = tasks.join_next().await {
        assert!(matches!(joined.unwrap(), Ok(Claim::Acquired { .. })));
    }
    let after = store.stats();
    after.since(&before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_operations_share_commits() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_millis(START_MS));
    let grouped = Arc::new(open(
        &dir.path().join("g.db"),
        &clock,
        SqliteOptions::default(),
    ));
    let stats = concurrent_claims(grouped, 64).await;
    assert_eq!(stats.ops, 64);
    assert!(stats.batches < stats.ops, "{stats:?}");

    let single = SqliteOptions {
        batch_max: 1,
        ..SqliteOptions::default()
    };
    let single = Arc::new(open(&dir.path().join("s.db"), &clock, single));
    let stats = concurrent_claims(single, 64).await;
    assert_eq!(
        stats,
        WriterStats {
            batches: 64,
            ops: 64,
            ..WriterStats::default()
        }
    );
}

/// Fenced operations in a batch fail alone: the valid operations sharing
/// their transaction are committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_operation_does_not_fail_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let clock = ManualClock::new(Timestamp::from_millis(START_MS));
    let store = Arc::new(open(&path, &clock, SqliteOptions::default()));
    let mut tokens = Vec::new();
    for i in 0..64 {
        tokens.push(acquire(&store, &format!("f-{i}")).await);
    }
    let before = store.stats();
    let mut tasks = JoinSet::new();
    for (i, token) in tokens.iter().enumerate() {
        let store = Arc::clone(&store);
        // Odd keys present a stale token.
        let token = if i % 2 == 0 {
            *token
        } else {
            Token(token.0 - 1)
        };
        tasks.spawn(async move {
            let id = id(&format!("f-{i}"));
            (i, store.complete(&id, token, result()).await)
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (i, outcome) = joined.unwrap();
        match (i % 2, outcome) {
            (0, Ok(record)) => assert_eq!(record.state, State::Completed),
            (1, Err(StoreError::Fenced { .. })) => {}
            (_, other) => panic!("f-{i}: {other:?}"),
        }
    }
    let stats = store.stats();
    assert!(stats.batches - before.batches < stats.ops - before.ops);
    drop(store);
    let store = open(&path, &clock, SqliteOptions::default());
    let records: Vec<Record> = store.list(&ListQuery::default()).await.unwrap().records;
    assert_eq!(records.len(), 64);
    for record in &records {
        let n: usize = record.id.key.as_str()[2..].parse().unwrap();
        let expect = if n.is_multiple_of(2) {
            State::Completed
        } else {
            State::InProgress
        };
        assert_eq!(record.state, expect, "{}", record.id);
    }
}

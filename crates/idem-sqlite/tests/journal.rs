//! The resolution journal on disk: a version-1 file (before the journal)
//! and a version-6 file (before operators' verbs) migrate on open and keep
//! their records and entries, and the journal's append is part of the
//! resolve's and the verb's savepoint: when it fails, the record is
//! untouched.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::path::Path;
use std::sync::Arc;

use idem_conformance::checks;
use idem_core::{
    ClaimRequest, Fingerprint, IdempotencyKey, ManualClock, Policy, RecordId, Scope, Store,
    Timestamp, Verb,
};
use idem_sqlite::{SCHEMA_VERSION, SqliteOptions, SqliteStore};

fn open(path: &Path) -> SqliteStore {
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    SqliteStore::open_with_clock(path, SqliteOptions::default(), Arc::new(clock)).unwrap()
}

/// Claims `key` and marks it ambiguous.
async fn ambiguous(store: &SqliteStore, key: &str) -> RecordId {
    let req = ClaimRequest {
        id: RecordId {
            scope: Scope::new("POST /payouts|tenant-a").unwrap(),
            key: IdempotencyKey::parse(key).unwrap(),
        },
        fingerprint: Fingerprint::from_bytes([1; 32]),
        legacy_fingerprint: None,
        owner: "node-1".to_owned(),
        region: None,
        policy: Policy::default(),
    };
    checks::ambiguous(store, &req).await;
    req.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_file_migrates_on_open() {
    assert_eq!(SCHEMA_VERSION, 9);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = open(&path);
    let id = ambiguous(&store, "from-v1").await;
    drop(store);
    // Back to version 1: step 1's tables and columns only.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "DROP TABLE resolutions; DROP TABLE lookup_tries; \
         DROP INDEX records_expiring; DROP INDEX records_tombstones; \
         ALTER TABLE records DROP COLUMN region; DROP TABLE suspect_window; \
         ALTER TABLE records DROP COLUMN ambiguity; ALTER TABLE meta DROP COLUMN verbs; \
         PRAGMA user_version = 1;",
    )
    .unwrap();

    let store = open(&path);
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION, "migrated");
    checks::resolve_is_journaled(&store, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_journal_append_undoes_the_resolve() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = open(&path);
    let id = ambiguous(&store, "refused-append").await;
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON resolutions \
         BEGIN SELECT RAISE(ABORT, 'journal refused'); END;",
    )
    .unwrap();
    checks::failed_append_undoes_resolve(&store, &id).await;
    conn.execute_batch("DROP TRIGGER refuse").unwrap();
    checks::resolve_is_journaled(&store, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_6_file_gains_the_verb_column_and_keeps_its_journal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = open(&path);
    let resolved = ambiguous(&store, "resolved-in-v6").await;
    checks::resolve_is_journaled(&store, &resolved).await;
    let before = store.resolutions(&resolved).await.unwrap();
    let kept = ambiguous(&store, "kept-in-v6").await;
    drop(store);
    // Back to version 6: the journal without its verb column.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "ALTER TABLE resolutions DROP COLUMN verb; ALTER TABLE records DROP COLUMN ambiguity; \
         ALTER TABLE meta DROP COLUMN verbs; PRAGMA user_version = 6;",
    )
    .unwrap();

    let store = open(&path);
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION, "migrated");
    assert_eq!(store.resolutions(&resolved).await.unwrap(), before, "kept");
    assert_eq!(before[0].verb, None, "a resolution names no verb");
    checks::verb_is_journaled(&store, &resolved, Verb::Expire).await;
    checks::resolve_is_journaled(&store, &kept).await;
    checks::verb_is_journaled(&store, &kept, Verb::Evict).await;
    let refused = conn.execute(
        "UPDATE resolutions SET verb = 'purge' WHERE key = 'kept-in-v6'",
        [],
    );
    assert!(refused.is_err(), "the column's CHECK holds: {refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_journal_append_undoes_the_verb() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = open(&path);
    let id = ambiguous(&store, "refused-verb").await;
    checks::resolve_is_journaled(&store, &id).await;
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON resolutions \
         BEGIN SELECT RAISE(ABORT, 'journal refused'); END;",
    )
    .unwrap();
    checks::failed_append_undoes_verb(&store, &id).await;
    conn.execute_batch("DROP TRIGGER refuse").unwrap();
    checks::verb_is_journaled(&store, &id, Verb::Evict).await;
}

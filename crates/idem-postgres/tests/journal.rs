//! The resolution journal in PostgreSQL: a version-1 schema (before the
//! journal) and a version-7 schema (before operators' verbs) migrate on
//! connect and keep their records and entries, and the journal's append is
//! part of the resolve's and the verb's transaction: when it fails, the
//! record is untouched.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use idem_conformance::checks;
use idem_core::{Claim, RecordId, Store, StoreError, StoredResult, Verb};
use idem_postgres::{PgStore, SCHEMA_VERSION};
use support::{SchemaGuard, admin, request};

/// Claims `key` and marks it ambiguous.
async fn ambiguous(store: &PgStore, key: &str) -> RecordId {
    let req = request(key, 1, 30_000);
    checks::ambiguous(store, &req).await;
    req.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_schema_migrates_on_connect() {
    assert_eq!(SCHEMA_VERSION, 10);
    let schema = SchemaGuard::new();
    let store = schema.store(None).await;
    let id = ambiguous(&store, "from-v1").await;
    drop(store);
    let s = schema.name();
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "DROP TABLE {s}.resolutions; DROP TABLE {s}.lookup_tries; \
             DROP INDEX {s}.records_expiring; DROP INDEX {s}.records_tombstones; \
             ALTER TABLE {s}.records DROP COLUMN region; ALTER TABLE {s}.records DROP COLUMN waited; \
             DROP TABLE {s}.suspect_window; DROP TABLE {s}.server_epoch; \
             ALTER TABLE {s}.records DROP COLUMN ambiguity; DROP TABLE {s}.verbs; \
             UPDATE {s}.schema_version SET version = 1"
        ))
        .await
        .unwrap();

    let store = schema.store(None).await;
    let sql = format!("SELECT version FROM {s}.schema_version");
    let version: i32 = admin.query_one(&sql, &[]).await.unwrap().get(0);
    assert_eq!(version, SCHEMA_VERSION, "migrated");
    checks::resolve_is_journaled(&store, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_journal_append_undoes_the_resolve() {
    let schema = SchemaGuard::new();
    let store = schema.store(None).await;
    let id = ambiguous(&store, "refused-append").await;
    let s = schema.name();
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'journal refused'; END $$; \
             CREATE TRIGGER refuse BEFORE INSERT ON {s}.resolutions \
             FOR EACH ROW EXECUTE FUNCTION {s}.refuse();"
        ))
        .await
        .unwrap();
    checks::failed_append_undoes_resolve(&store, &id).await;
    admin
        .batch_execute(&format!("DROP TRIGGER refuse ON {s}.resolutions"))
        .await
        .unwrap();
    checks::resolve_is_journaled(&store, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_7_schema_gains_the_verb_column_and_keeps_its_journal() {
    let schema = SchemaGuard::new();
    let store = schema.store(None).await;
    let resolved = ambiguous(&store, "resolved-in-v7").await;
    checks::resolve_is_journaled(&store, &resolved).await;
    let before = store.resolutions(&resolved).await.unwrap();
    let kept = ambiguous(&store, "kept-in-v7").await;
    drop(store);
    let s = schema.name();
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "ALTER TABLE {s}.resolutions DROP COLUMN verb; \
             ALTER TABLE {s}.records DROP COLUMN ambiguity; DROP TABLE {s}.verbs; \
             UPDATE {s}.schema_version SET version = 7"
        ))
        .await
        .unwrap();

    let store = schema.store(None).await;
    let sql = format!("SELECT version FROM {s}.schema_version");
    let version: i32 = admin.query_one(&sql, &[]).await.unwrap().get(0);
    assert_eq!(version, SCHEMA_VERSION, "migrated");
    assert_eq!(store.resolutions(&resolved).await.unwrap(), before, "kept");
    assert_eq!(before[0].verb, None, "a resolution names no verb");
    checks::verb_is_journaled(&store, &resolved, Verb::Expire).await;
    checks::resolve_is_journaled(&store, &kept).await;
    checks::verb_is_journaled(&store, &kept, Verb::Evict).await;
    let sql = format!("UPDATE {s}.resolutions SET verb = 'purge'");
    let refused = admin.execute(&sql, &[]).await;
    assert!(refused.is_err(), "the column's CHECK holds: {refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_journal_append_undoes_the_verb() {
    let schema = SchemaGuard::new();
    let store = schema.store(None).await;
    let id = ambiguous(&store, "refused-verb").await;
    checks::resolve_is_journaled(&store, &id).await;
    let s = schema.name();
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'journal refused'; END $$; \
             CREATE TRIGGER refuse BEFORE INSERT ON {s}.resolutions \
             FOR EACH ROW EXECUTE FUNCTION {s}.refuse();"
        ))
        .await
        .unwrap();
    checks::failed_append_undoes_verb(&store, &id).await;
    admin
        .batch_execute(&format!("DROP TRIGGER refuse ON {s}.resolutions"))
        .await
        .unwrap();
    checks::verb_is_journaled(&store, &id, Verb::Evict).await;
}

/// A row this version cannot read (here: a result header list that is not
/// JSON, a key with a space) is an error for its own key and is named in
/// every listing, which goes on past it; so does the purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_row_is_named_and_stops_no_scan() {
    let schema = SchemaGuard::new();
    let store = schema.store(None).await;
    for key in ["a", "b-headers", "c", "d-key", "e"] {
        let req = request(key, 1, 30_000);
        let Claim::Acquired { token, .. } = store.claim(&req).await.unwrap() else {
            panic!("{key} is acquired");
        };
        let result = StoredResult::new(201, vec![("x".into(), "y".into())], b"ok".to_vec());
        store
            .complete(&req.id, token, result.unwrap())
            .await
            .unwrap();
    }
    let s = schema.name();
    admin()
        .await
        .batch_execute(&format!(
            "UPDATE {s}.records SET result_headers = 'not json' WHERE key = 'b-headers'; \
             UPDATE {s}.records SET key = 'd key' WHERE key = 'd-key';"
        ))
        .await
        .unwrap();
    match store.get(&support::id("b-headers")).await {
        Err(StoreError::Incompatible { reason, .. }) => {
            assert!(reason.contains("key \"b-headers\""), "{reason}");
        }
        other => panic!("expected Incompatible, got {other:?}"),
    }
    let scope = "POST /payouts|tenant-a";
    let good = [support::id("a"), support::id("c"), support::id("e")];
    let damaged = [(scope, "b-headers"), (scope, "d key")];
    checks::damaged_rows_do_not_stop_scans(&store, &good, &damaged).await;
}

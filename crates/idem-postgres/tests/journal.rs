//! The resolution journal in PostgreSQL: a version-1 schema (before the
//! journal) migrates on connect and keeps its records, and the journal's
//! append is part of the resolve's transaction: when it fails, the record
//! is untouched.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use idem_conformance::checks;
use idem_core::RecordId;
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
    assert_eq!(SCHEMA_VERSION, 2);
    let schema = SchemaGuard::new();
    let store = schema.store(None).await;
    let id = ambiguous(&store, "from-v1").await;
    drop(store);
    let s = schema.name();
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "DROP TABLE {s}.resolutions; UPDATE {s}.schema_version SET version = 1"
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

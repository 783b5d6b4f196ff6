//! What `connect` does to the schema: nodes starting together create it
//! once, connecting again changes nothing, a newer version and someone
//! else's schema are refused, and inspecting (`connect_existing`) never
//! creates anything.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use idem_core::{Claim, Store, StoreError};
use idem_postgres::{PgStore, SCHEMA_VERSION};
use support::{SchemaGuard, admin, request, url};

/// `schema_version` rows of the schema: (id, version).
async fn versions(admin: &tokio_postgres::Client, schema: &str) -> Vec<(i32, i32)> {
    let sql = format!("SELECT id, version FROM {schema}.schema_version ORDER BY id");
    let rows = admin.query(&sql, &[]).await.unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

async fn schema_exists(admin: &tokio_postgres::Client, schema: &str) -> bool {
    let row = admin
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
            &[&schema],
        )
        .await
        .unwrap();
    row.get::<_, i64>(0) == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_starting_together_create_the_schema_once() {
    let schema = SchemaGuard::new();
    let admin = admin().await;
    let starts: Vec<_> = (0..6)
        .map(|_| {
            let options = schema.options(None);
            tokio::spawn(async move { PgStore::connect(&url(), options).await })
        })
        .collect();
    let mut stores = Vec::new();
    for start in starts {
        match start.await.unwrap() {
            Ok(store) => stores.push(store),
            Err(e) => panic!("a node failed to start: {e}"),
        }
    }
    assert_eq!(versions(&admin, schema.name()).await, [(1, SCHEMA_VERSION)]);
    let req = request("kept", 1, 30_000);
    assert!(matches!(
        stores[0].claim(&req).await.unwrap(),
        Claim::Acquired { .. }
    ));

    let again = schema.store(None).await;
    assert_eq!(versions(&admin, schema.name()).await, [(1, SCHEMA_VERSION)]);
    assert!(
        again.get(&req.id).await.unwrap().is_some(),
        "connecting again keeps the records"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_version_is_refused() {
    let schema = SchemaGuard::new();
    schema.store(None).await;
    let admin = admin().await;
    let newer = SCHEMA_VERSION + 1;
    admin
        .execute(
            &format!("UPDATE {}.schema_version SET version = $1", schema.name()),
            &[&newer],
        )
        .await
        .unwrap();
    let refusals = [
        PgStore::connect(&url(), schema.options(None)).await.err(),
        PgStore::connect_existing(&url(), schema.options(None))
            .await
            .err(),
    ];
    for refusal in refusals {
        let Some(StoreError::Incompatible { store, reason }) = refusal else {
            panic!("a newer schema must be refused, got {refusal:?}");
        };
        assert!(store.contains(schema.name()), "{store}");
        let expect = format!("schema version {newer} is newer than this idem supports");
        assert!(reason.contains(&expect), "{reason}");
        assert!(reason.contains("upgrade idem"), "{reason}");
    }
    assert_eq!(versions(&admin, schema.name()).await, [(1, newer)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspecting_a_missing_store_creates_nothing() {
    let schema = SchemaGuard::new();
    let admin = admin().await;
    let found = PgStore::connect_existing(&url(), schema.options(None))
        .await
        .unwrap();
    assert!(found.is_none(), "no schema, no store");
    assert!(
        !schema_exists(&admin, schema.name()).await,
        "nothing created"
    );

    let store = schema.store(None).await;
    let req = request("seen", 1, 30_000);
    store.claim(&req).await.unwrap();
    let Some(inspector) = PgStore::connect_existing(&url(), schema.options(None))
        .await
        .unwrap()
    else {
        panic!("an existing store is found");
    };
    assert!(inspector.get(&req.id).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_holding_other_tables_is_refused() {
    let schema = SchemaGuard::new();
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {s}; CREATE TABLE {s}.records (id int)",
            s = schema.name()
        ))
        .await
        .unwrap();
    let refusal = PgStore::connect(&url(), schema.options(None)).await.err();
    let Some(StoreError::Incompatible { reason, .. }) = refusal else {
        panic!("a foreign schema must be refused, got {refusal:?}");
    };
    assert!(
        reason.contains("belongs to something else") && reason.contains("choose another schema"),
        "{reason}"
    );
    let found = PgStore::connect_existing(&url(), schema.options(None))
        .await
        .unwrap();
    assert!(found.is_none(), "no idem store there");
}

//! A payout service that claims its idempotency key in its own
//! transaction, so the ledger row and the idempotency record commit
//! together or not at all: a retry replays, a rolled-back attempt leaves
//! the key free, and concurrent attempts write one row.
//!
//! Run against a server (it creates a schema and drops it at the end):
//!
//! ```text
//! IDEM_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run -p idem-postgres --example ledger
//! ```

use std::error::Error;
use std::sync::Arc;

use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, Policy, RecordId, Scope, StoredResult,
};
use idem_postgres::{PgOptions, PgStore};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// What one payout attempt did.
#[derive(Debug, PartialEq)]
enum Paid {
    /// This attempt wrote the ledger row.
    Now,
    /// An earlier attempt did; this is its stored answer.
    Replayed(String),
    /// The attempt failed before commit: nothing was written.
    RolledBack,
    /// Another attempt is in flight, or the outcome is unknown.
    Refused(String),
}

#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("idem_ledger_example_{}", std::process::id());
    let options = PgOptions {
        schema: schema.clone(),
        ..PgOptions::default()
    };
    let store = Arc::new(PgStore::connect(&url, options).await?);
    let outcome = run(&store).await;
    store
        .client()
        .await?
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await?;
    outcome
}

async fn run(store: &Arc<PgStore>) -> Result<()> {
    let s = store.schema();
    store
        .client()
        .await?
        .batch_execute(&format!(
            "CREATE TABLE {s}.ledger (payout TEXT PRIMARY KEY, seller BIGINT, cents BIGINT)"
        ))
        .await?;

    let first = pay(store, "payout-847-2026-W36", false).await?;
    let retry = pay(store, "payout-847-2026-W36", false).await?;
    println!("first attempt: {first:?}\nretry: {retry:?}");
    assert_eq!(first, Paid::Now);
    assert!(matches!(retry, Paid::Replayed(_)));

    let crashed = pay(store, "payout-848-2026-W36", true).await?;
    let after = pay(store, "payout-848-2026-W36", false).await?;
    println!("attempt that failed before commit: {crashed:?}\nits retry: {after:?}");
    assert_eq!((crashed, after), (Paid::RolledBack, Paid::Now));

    let racers: Vec<_> = (0..8)
        .map(|_| {
            let store = Arc::clone(store);
            tokio::spawn(async move { pay(&store, "payout-849-2026-W36", false).await })
        })
        .collect();
    let mut paid_now = 0;
    for racer in racers {
        if racer.await?? == Paid::Now {
            paid_now += 1;
        }
    }
    let rows: i64 = store
        .client()
        .await?
        .query_one(&format!("SELECT count(*) FROM {s}.ledger"), &[])
        .await?
        .get(0);
    println!("8 concurrent attempts: {paid_now} paid; ledger rows: {rows}");
    assert_eq!((paid_now, rows), (1, 3));
    Ok(())
}

/// One attempt at a payout: claim, write the ledger row and complete, all
/// in one transaction. `fail` simulates a crash before commit.
async fn pay(store: &PgStore, payout: &str, fail: bool) -> Result<Paid> {
    let req = ClaimRequest {
        id: RecordId {
            scope: Scope::from_parts("POST /payouts", "tenant-7", None)?,
            key: IdempotencyKey::parse(payout)?,
        },
        fingerprint: Fingerprint::from_bytes([7; 32]),
        legacy_fingerprint: None,
        owner: "payout-service".to_owned(),
        region: None,
        policy: Policy::default(),
    };
    let mut client = store.client().await?;
    let tx = client.transaction().await?;
    let token = match store.claim_in(&tx, &req).await? {
        Claim::Acquired { token, .. } => token,
        Claim::Replay { record } => {
            let body = record.result.map(|r| r.body().to_vec()).unwrap_or_default();
            return Ok(Paid::Replayed(String::from_utf8_lossy(&body).into_owned()));
        }
        other => return Ok(Paid::Refused(format!("{other:?}"))),
    };
    let sql = format!(
        "INSERT INTO {}.ledger (payout, seller, cents) VALUES ($1, 847, 125000)",
        store.schema()
    );
    tx.execute(&sql, &[&payout]).await?;
    if fail {
        tx.rollback().await?;
        return Ok(Paid::RolledBack);
    }
    let result = StoredResult::new(201, vec![], br#"{"paid":125000}"#.to_vec())?;
    store.complete_in(&tx, &req.id, token, result).await?;
    tx.commit().await?;
    Ok(Paid::Now)
}

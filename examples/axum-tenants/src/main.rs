//! Serves the multi-tenant payouts example on 127.0.0.1:3001 with its
//! reconciler beside it, until Ctrl-C.
//!
//! `curl -X POST localhost:3001/payouts -H 'Authorization: Tenant acme'
//! -H 'Idempotency-Key: p-1' -d '{"amount":100}'` twice: one payout, and
//! the second answer carries `Idempotent-Replayed: true`.

use std::sync::Arc;

use axum_tenants::{Ledger, service};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let store = Arc::new(idem_sqlite::SqliteStore::open(
        "tenants-idem.db",
        idem_sqlite::SqliteOptions::default(),
    )?);
    let service = service(store, Arc::new(Ledger::default()))?;
    let (stop, stopped) = tokio::sync::watch::channel(());
    let scans = service.reconciler.spawn(async move {
        let mut stopped = stopped;
        let _ = stopped.changed().await;
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    println!("payouts on http://127.0.0.1:3001, records in tenants-idem.db");
    axum::serve(listener, service.router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // axum waited for its connections; an attempt whose client hung up
    // runs on without one, each bounded by its lease.
    for attempts in &service.attempts {
        attempts.finished().await;
    }
    drop(stop);
    scans.await?;
    Ok(())
}

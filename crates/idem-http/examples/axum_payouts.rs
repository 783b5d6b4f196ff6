//! A payouts service in axum with the idempotency layer in-process: the
//! handler pays at most once per key, and retries get the stored answer.
//!
//! Run: `cargo run -p idem-http --example axum_payouts`, then
//! `curl -X POST localhost:3000/payouts -H 'Idempotency-Key: p-1' -H 'content-type: application/json' -d '{"seller":847,"amount":1200}'`
//! twice: one payout, and the second answer carries `Idempotent-Replayed: true`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::http::{Method, StatusCode};
use axum::routing::post;
use idem_core::Store;
use idem_http::Route;

/// The effects the handler performed: the thing idempotency protects.
#[derive(Default)]
pub struct Ledger {
    /// Payouts made.
    pub payouts: AtomicU64,
}

/// The app: `POST /payouts` protected, `GET /health` not.
pub fn app(store: Arc<dyn Store>, ledger: Arc<Ledger>) -> Result<Router, idem_http::RouteError> {
    let payouts = Route::builder()
        .name("payouts")
        .methods([Method::POST])
        .fingerprint_exclude(["/request_time"])
        .layer(store)?;
    let pay = move |body: String| {
        let ledger = ledger.clone();
        async move {
            let n = ledger.payouts.fetch_add(1, Ordering::SeqCst) + 1;
            (
                StatusCode::CREATED,
                format!("{{\"payout\":{n},\"request\":{body}}}"),
            )
        }
    };
    Ok(Router::new()
        .route("/payouts", post(pay).route_layer(payouts))
        .route("/health", axum::routing::get(|| async { "ok" })))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(idem_sqlite::SqliteStore::open(
        "payouts-idem.db",
        idem_sqlite::SqliteOptions::default(),
    )?);
    let router = app(store, Arc::new(Ledger::default()))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("payouts on http://127.0.0.1:3000, records in payouts-idem.db");
    axum::serve(listener, router).await?;
    Ok(())
}

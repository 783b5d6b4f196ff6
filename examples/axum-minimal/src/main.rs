//! The smallest axum service the idempotency layer protects: one POST
//! route on an SQLite file, to measure what depending on the layer costs.

use std::sync::Arc;

use axum::Router;
use axum::routing::post;
use idem_http::Route;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(idem_sqlite::SqliteStore::open(
        "minimal-idem.db",
        idem_sqlite::SqliteOptions::default(),
    )?);
    let payouts = Route::builder().name("payouts").layer(store)?;
    let app = Router::new().route("/payouts", post(|| async { "paid" }).route_layer(payouts));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app).await?;
    Ok(())
}

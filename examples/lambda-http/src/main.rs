//! The function's entry point: the store is built once, before the
//! runtime's loop, and every invocation shares it.

use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    let url = std::env::var("IDEM_STORE").unwrap_or_else(|_| "/tmp/idem.db".to_owned());
    let store = lambda_http_payouts::open_store(&url).await?;
    let function = lambda_http_payouts::function(store, Arc::default())?;
    lambda_http::run(function).await
}

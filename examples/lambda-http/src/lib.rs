//! An HTTP Lambda function protected by the idempotency layer: `POST
//! /payouts` pays once per `Idempotency-Key`, and a retry with the same key
//! and body gets the first answer back, marked `idempotent-replayed: true`.
//! The store is built once per execution environment ([`open_store`], in
//! `main` before `lambda_http::run`) and shared by every invocation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::Method;
use idem_core::{Store, SystemClock};
use idem_http::{Route, RouteError};
use idem_lambda::{Idempotency, IdempotencyLayer};
use lambda_http::tower::Layer;
use lambda_http::{Body, Error, Request, Response, Service, http};

/// The payouts this execution environment made: the effect the layer
/// protects.
#[derive(Debug, Default)]
pub struct Ledger {
    paid: AtomicU64,
}

impl Ledger {
    /// How many payouts were made.
    pub fn paid(&self) -> u64 {
        self.paid.load(Ordering::SeqCst)
    }
}

/// The store `IDEM_STORE` names: `dynamodb://TABLE?…` for a DynamoDB table
/// (the one store every execution environment of a function shares), or
/// an SQLite file path (one environment only: a sketch, or a test).
/// Default: `/tmp/idem.db`, the one writable directory of a function.
pub async fn open_store(url: &str) -> Result<Arc<dyn Store>, Error> {
    let clock = Arc::new(SystemClock);
    if url.starts_with("dynamodb://") {
        let url = idem_dynamodb::DynamoUrl::parse(url)?;
        return Ok(Arc::new(
            idem_dynamodb::DynamoStore::open(&url, clock).await?,
        ));
    }
    let path = url.strip_prefix("sqlite://").unwrap_or(url);
    let options = idem_sqlite::SqliteOptions::default();
    Ok(Arc::new(idem_sqlite::SqliteStore::open(path, options)?))
}

/// The function: `POST /payouts` pays into `ledger` once per key, behind
/// idem-http's layer on `store`. The lease (10 s) is no longer than the
/// function's timeout should be: a lambda_http invocation cut at its
/// timeout leaves its record in progress until the lease ends.
pub fn function(
    store: Arc<dyn Store>,
    ledger: Arc<Ledger>,
) -> Result<
    Idempotency<
        impl Service<Request, Response = Response<Body>, Error = Error, Future: Send>
        + Clone
        + Send
        + 'static,
    >,
    RouteError,
> {
    let layer = Route::builder()
        .name("payouts")
        .methods([Method::POST])
        .path("/payouts")
        .lease(Duration::from_secs(10))
        .layer(store)?;
    let pay = lambda_http::service_fn(move |_request: Request| {
        let ledger = ledger.clone();
        async move {
            let n = ledger.paid.fetch_add(1, Ordering::SeqCst) + 1;
            let response = Response::builder()
                .status(201)
                .header("content-type", "application/json")
                .body(Body::from(format!(r#"{{"payout": {n}}}"#)))?;
            Ok::<_, Error>(response)
        }
    });
    Ok(IdempotencyLayer::from(layer).layer(pay))
}

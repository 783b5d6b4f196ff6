//! A payouts service in axum as a multi-tenant user writes it: its own
//! authentication middleware puts the caller in a request extension, the
//! idempotency layer sits on the one route that pays (`route_layer`, no
//! path restated) and scopes keys by that caller, and the reconciler runs
//! in the same process, asking the service's own ledger whether a payout
//! whose answer was lost happened.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Extension, Request};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Router, body::Bytes};
use idem_core::{HeaderBytes, Store, StoredResult, SystemClock};
use idem_http::{Attempts, IdempotencyLayer, Route};
use idem_reconcile::{Finding, ReconcileSettings, Reconciler, provider_fn};

/// Who the caller is: what the service's authentication established.
#[derive(Clone, Debug)]
pub struct User {
    /// The tenant the caller acts for.
    pub tenant: String,
}

/// The payouts made, by the reference the layer forwarded for each record
/// (`{scope_digest}:{key}`: two tenants' same key are two references).
#[derive(Default)]
pub struct Ledger {
    paid: Mutex<HashMap<String, String>>,
    count: AtomicU64,
    lose_next_answer: AtomicBool,
}

impl Ledger {
    /// How many payouts were made.
    pub fn payouts(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// The next payout is made but its answer is lost (a 500 after the
    /// effect): the outcome the reconciler settles.
    pub fn lose_next_answer(&self) {
        self.lose_next_answer.store(true, Ordering::SeqCst);
    }

    fn pay(&self, reference: &str, tenant: &str, body: &[u8]) -> (String, bool) {
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        let answer = format!(
            "{{\"payout\":{n},\"tenant\":{tenant:?},\"bytes\":{}}}",
            body.len()
        );
        let mut paid = self.paid.lock().unwrap_or_else(|e| e.into_inner());
        paid.insert(reference.to_owned(), answer.clone());
        (answer, self.lose_next_answer.swap(false, Ordering::SeqCst))
    }

    fn find(&self, reference: &str) -> Option<String> {
        let paid = self.paid.lock().unwrap_or_else(|e| e.into_inner());
        paid.get(reference).cloned()
    }
}

/// The service and the reconciler that settles its unknown outcomes.
pub struct Service {
    /// The router to serve.
    pub router: Router,
    /// Spawn it beside the router ([`Reconciler::spawn`]).
    pub reconciler: Arc<Reconciler>,
    /// The attempts of both routes' layers: await them once the server
    /// has drained, so that an attempt whose client stopped waiting is
    /// not cut mid-effect ([`IdempotencyLayer::attempts`]).
    pub attempts: [Attempts; 2],
}

/// Builds the service over `store`: `POST /payouts` and
/// `POST /payouts/{id}/cancel` protected per tenant, `GET /health` not.
pub fn service(
    store: Arc<dyn Store>,
    ledger: Arc<Ledger>,
) -> Result<Service, Box<dyn std::error::Error + Send + Sync>> {
    let payouts = Route::builder()
        .name("payouts")
        .lease(Duration::from_secs(10))
        .principal_from_extension(|user: &User| user.tenant.clone())
        .forward_key_template("{scope_digest}:{key}")
        .build()?;
    // The ledger is asked by the reference the layer forwarded for the record.
    let asked = (payouts.clone(), ledger.clone());
    let provider = provider_fn(move |id| {
        let reference = asked.0.forwarded_key(&id);
        let paid = asked.1.find(&reference);
        async move {
            match paid.map(|body| StoredResult::new(201, json(), body.into_bytes())) {
                Some(Ok(result)) => Finding::Found {
                    result,
                    reason: "in the ledger".into(),
                },
                Some(Err(e)) => Finding::Failed {
                    reason: e.to_string(),
                },
                None => Finding::NotFound {
                    reason: "not in the ledger".into(),
                },
            }
        }
    });
    let reconciler = Arc::new(Reconciler::with_providers(
        store.clone(),
        vec![("payouts".into(), provider)],
        ReconcileSettings::default(),
        Arc::new(SystemClock),
    )?);
    let layer = IdempotencyLayer::new(store.clone(), vec![payouts])
        .with_settle_on_retry(reconciler.clone());
    // No name: the operation is the route axum matched, `POST /payouts/{id}/cancel`.
    let cancels = Route::builder()
        .principal_from_extension(|user: &User| user.tenant.clone())
        .layer(store)?;
    let attempts = [layer.attempts(), cancels.attempts()];
    let router = Router::new()
        .route("/payouts", post(pay).route_layer(layer))
        .route("/payouts/{id}/cancel", post(cancel).route_layer(cancels))
        .route("/health", axum::routing::get(|| async { "ok" }))
        .layer(middleware::from_fn(authenticate))
        .with_state(ledger);
    Ok(Service {
        router,
        reconciler,
        attempts,
    })
}

fn json() -> Vec<(String, HeaderBytes)> {
    vec![("content-type".into(), "application/json".to_owned().into())]
}

async fn pay(
    axum::extract::State(ledger): axum::extract::State<Arc<Ledger>>,
    Extension(user): Extension<User>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // The layer passes on the record's reference in the key header.
    let Some(reference) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let (answer, lost) = ledger.pay(reference, &user.tenant, &body);
    let status = match lost {
        true => StatusCode::INTERNAL_SERVER_ERROR,
        false => StatusCode::CREATED,
    };
    (status, [(header::CONTENT_TYPE, "application/json")], answer).into_response()
}

async fn cancel(axum::extract::Path(id): axum::extract::Path<u64>) -> String {
    format!("{{\"cancelled\":{id}}}")
}

/// A stand-in for the service's real authentication: `Authorization:
/// Tenant <name>` names the caller; without it, 401.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let tenant = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Tenant "))
        .map(str::to_owned);
    match tenant {
        Some(tenant) => {
            request.extensions_mut().insert(User { tenant });
            next.run(request).await
        }
        None if request.uri().path() == "/health" => next.run(request).await,
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

//! Two tenants, one key: the reconciler asks the provider by the exact
//! reference the gateway forwarded for each record, so one tenant's record
//! is never completed with another tenant's effect. Real parts: the route's
//! own renderer of the forwarded key, a provider over HTTP on 127.0.0.1, a
//! SQLite store on a temporary file, a manual clock.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State as AxumState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, ManualClock, Policy, RecordId, Scope, State,
    Store, Timestamp,
};
use idem_http::{ForwardKeySpec, Route, RouteSpec};
use idem_reconcile::{
    ForwardedKey, Lookup, LookupSpec, ReconcileSettings, ReconcileSpec, Reconciler,
};
use idem_sqlite::{SqliteOptions, SqliteStore};

/// The provider's ledger: what it answers for each reference it was sent.
type Known = Arc<Mutex<HashMap<String, String>>>;

async fn by_reference(
    AxumState(known): AxumState<Known>,
    Path(reference): Path<String>,
) -> Response {
    match known.lock().unwrap().get(&reference) {
        Some(body) => (StatusCode::OK, body.clone()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn provider(known: Known) -> String {
    let app = axum::Router::new()
        .route("/by-ref/{reference}", axum::routing::get(by_reference))
        .with_state(known);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

fn claim_request(tenant: &str, key: &str) -> ClaimRequest {
    ClaimRequest {
        id: RecordId {
            scope: Scope::from_parts("payouts", tenant, None).unwrap(),
            key: IdempotencyKey::parse(key).unwrap(),
        },
        fingerprint: Fingerprint::from_bytes([1; 32]),
        legacy_fingerprint: None,
        owner: "gateway-1".into(),
        region: None,
        policy: Policy::DEFAULT,
    }
}

/// The route as the gateway runs it: the forwarded reference holds the
/// scope digest, so each tenant's "k" is its own reference upstream.
fn route() -> Arc<Route> {
    let spec = RouteSpec {
        name: Some("payouts".into()),
        forward_key: Some(ForwardKeySpec {
            header: None,
            template: Some("{scope_digest}:{key}".into()),
        }),
        ..Default::default()
    };
    Arc::new(Route::new(&spec).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_record_is_never_completed_with_another_tenants_effect() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open_with_clock(
            dir.path().join("idem.db"),
            SqliteOptions::default(),
            Arc::new(clock.clone()),
        )
        .unwrap(),
    );
    // Both tenants chose key "k"; both attempts ended ambiguous.
    let mut ids = Vec::new();
    for tenant in ["tenant-a", "tenant-b"] {
        let request = claim_request(tenant, "k");
        let Claim::Acquired { token, .. } = store.claim(&request).await.unwrap() else {
            panic!("a fresh key is acquired");
        };
        store.mark_ambiguous(&request.id, token).await.unwrap();
        ids.push(request.id);
    }
    let (a, b) = (&ids[0], &ids[1]);
    // Only A's attempt reached the provider, under the reference forwarded for A.
    let route = route();
    assert_ne!(route.forwarded_key(a), route.forwarded_key(b));
    let known = Known::default();
    known
        .lock()
        .unwrap()
        .insert(route.forwarded_key(a), "{\"paid\":\"tenant-a\"}".into());
    let base = provider(Arc::clone(&known)).await;
    let forwarded: ForwardedKey = Arc::new(move |id: &RecordId| route.forwarded_key(id));
    let lookup = Lookup::new(
        &LookupSpec {
            url: Some(format!("{base}/by-ref/{{forwarded_key}}")),
            timeout_ms: Some(2_000),
            ..Default::default()
        },
        forwarded,
    )
    .unwrap();
    let settings = ReconcileSettings::new(&ReconcileSpec {
        seed: Some(7),
        ..Default::default()
    })
    .unwrap();
    let reconciler = Reconciler::new(
        Arc::clone(&store),
        vec![("payouts".into(), lookup)],
        settings,
        Arc::new(clock.clone()),
    )
    .unwrap();

    let report = reconciler.run_once().await;
    assert_eq!((report.scanned, report.completed), (2, 1), "{report}");
    let a_record = store.get(a).await.unwrap().unwrap();
    assert_eq!(a_record.state, State::Completed);
    assert_eq!(a_record.result.unwrap().body(), b"{\"paid\":\"tenant-a\"}");
    let b_record = store.get(b).await.unwrap().unwrap();
    assert_eq!(
        b_record.state,
        State::Ambiguous,
        "B is not given A's payout"
    );
    assert_eq!(b_record.result, None);

    // Past B's lease, "not found" by B's own reference releases B.
    clock.set(b_record.lease_until);
    let report = reconciler.run_once().await;
    assert_eq!((report.scanned, report.released), (1, 1), "{report}");
    assert_eq!(store.get(b).await.unwrap(), None);
}

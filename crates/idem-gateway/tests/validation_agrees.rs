//! Config validation and the store agree: whatever owner, route name and
//! tenant a config and a request may carry, once the config is accepted the
//! request is either refused for its own fault or claimed, stored and
//! replayed by a real SQLite store, never refused by the store afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use idem_gateway::{FileConfig, GatewayConfig, Overrides};
use idem_http::{IdempotencyLayer, PrincipalSpec, RouteSpec};
use idem_sqlite::{SqliteOptions, SqliteStore};
use proptest::prelude::*;
use tower::{Layer, ServiceExt, service_fn};

/// Text a careless or hostile config author may write: control characters,
/// separators, quotes, backslashes, non-ASCII, and lengths around the limits.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,40}",
        "[a-z|\\\\\"%,\t\n\u{0}\u{7f}\u{85}é]{0,20}",
        (0usize..1100).prop_map(|n| "n".repeat(n)),
        any::<String>(),
    ]
}

fn tenant() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[ -~]{0,40}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..300),
    ]
}

fn config(owner: &str, name: &str) -> Option<GatewayConfig> {
    let file = FileConfig {
        owner: Some(owner.to_owned()),
        routes: vec![RouteSpec {
            name: Some(name.to_owned()),
            path: Some("/payouts".into()),
            principal: Some(PrincipalSpec::Header("x-tenant-id".into())),
            ..Default::default()
        }],
        ..Default::default()
    };
    let overrides = Overrides {
        upstream: Some("http://127.0.0.1:9".into()),
        ..Default::default()
    };
    GatewayConfig::from_parts(file, Some(Path::new("idem.toml")), &overrides).ok()
}

async fn exchange(config: &GatewayConfig, dir: &Path, tenant: &[u8]) -> Vec<(u16, String)> {
    let store = Arc::new(SqliteStore::open(dir.join("idem.db"), SqliteOptions::default()).unwrap());
    let effects = Arc::new(AtomicUsize::new(0));
    let counter = effects.clone();
    let payouts = service_fn(move |_req: Request<Full<Bytes>>| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        let body = Full::new(Bytes::from(format!("payout {n}")));
        async move { Ok::<_, std::convert::Infallible>(Response::new(body)) }
    });
    let service = IdempotencyLayer::new(store, config.routes.clone())
        .with_owner(config.owner.clone())
        .layer(payouts);
    let mut replies = Vec::new();
    for _ in 0..2 {
        let req = Request::post("/payouts")
            .header("idempotency-key", "k-1")
            .header(
                "x-tenant-id",
                http::HeaderValue::from_bytes(tenant).unwrap(),
            )
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let res = service.clone().oneshot(req).await.unwrap();
        let status = res.status().as_u16();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        replies.push((status, String::from_utf8_lossy(&body).into_owned()));
    }
    assert!(effects.load(Ordering::SeqCst) <= 1, "{replies:?}");
    replies
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn what_the_config_accepts_the_store_keeps(owner in text(), name in text(), tenant in tenant()) {
        let Some(config) = config(&owner, &name) else {
            // Refused at start: nothing to agree on.
            return Ok(());
        };
        prop_assume!(http::HeaderValue::from_bytes(&tenant).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let replies = runtime.block_on(exchange(&config, dir.path(), &tenant));
        match replies[0].0 {
            // Executed once, then replayed from the store.
            200 => prop_assert_eq!(&replies[1], &replies[0]),
            // The request's own tenant header is refused, and again.
            400 => {
                prop_assert!(replies[0].1.contains("invalid-principal"), "{:?}", replies);
                prop_assert_eq!(replies[1].0, 400);
            }
            _ => prop_assert!(false, "accepted config, refused request: {:?}", replies),
        }
    }
}

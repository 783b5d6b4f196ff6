//! The admin listener's probes, black-box: `/healthz` and `/readyz` answer
//! without the admin token and without any record's data, and `/readyz`
//! turns not ready, naming the check, while the store is frozen (a real
//! PostgreSQL behind a relay that stops forwarding), and ready again once
//! it answers.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{Gateway, PgSchema, Site, Upstream, key, post, send};

const TOKEN: &str = "admin-token-0123456789abcdef";
const PAYOUT: &str = r#"{"seller":847,"amount":1200}"#;

async fn readiness(admin: std::net::SocketAddr) -> (u16, Value) {
    let reply = send("GET", &format!("http://{admin}/readyz"), &[], "").await;
    let doc = serde_json::from_str(&reply.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", reply.body));
    (reply.status, doc)
}

fn check<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no {name} check: {doc}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_without_the_token_and_without_record_data() {
    let (up, site) = (Upstream::start().await, Site::new());
    let (gw, admin) = Gateway::start_admin(&up.url(), &site.store(), None, TOKEN);
    let paid = post(&gw.url("/payouts"), &[key("k-probe-secret")], PAYOUT).await;
    assert_eq!(paid.status, 201);

    for auth in [None, Some("Bearer wrong-token-0123456789")] {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", *a)).collect();
        let health = send("GET", &format!("http://{admin}/healthz"), &headers, "").await;
        assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
        let ready = send("GET", &format!("http://{admin}/readyz"), &headers, "").await;
        assert_eq!(ready.status, 200, "{}", ready.body);
        assert!(!ready.body.contains("k-probe-secret"), "{}", ready.body);
    }
    let (status, doc) = readiness(admin).await;
    assert_eq!((status, &doc["ready"]), (200, &Value::Bool(true)), "{doc}");
    for name in ["store_read", "store_write", "suspect_window", "reconciler"] {
        assert_eq!(check(&doc, name)["ok"], true, "{doc}");
    }
    // Everything else on the listener still needs the token.
    let records = send("GET", &format!("http://{admin}/records"), &[], "").await;
    assert_eq!(records.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_not_ready_while_the_store_is_frozen_and_ready_again_after() {
    let up = Upstream::start().await;
    let schema = PgSchema::new("probes_frozen");
    let (relay, relayed) = schema.through_relay().await;
    let store = format!("{relayed}&operation_timeout_ms=1000");
    let (_gw, admin) = Gateway::start_admin_url(&up.url(), &store, TOKEN);
    let (status, doc) = readiness(admin).await;
    assert_eq!(status, 200, "{doc}");

    relay.freeze();
    // An answer is reused for a second; the next one checks the store.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let doc = loop {
        let began = std::time::Instant::now();
        let (status, doc) = readiness(admin).await;
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "the probe itself hung for {:?}",
            began.elapsed()
        );
        if status == 503 {
            break doc;
        }
        assert!(std::time::Instant::now() < deadline, "still ready: {doc}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(doc["ready"], false, "{doc}");
    let read = check(&doc, "store_read");
    assert_eq!(read["ok"], false, "{doc}");
    // The process still serves: liveness stays, so it is not restarted
    // for its store's outage.
    let health = send("GET", &format!("http://{admin}/healthz"), &[], "").await;
    assert_eq!(health.status, 200);

    relay.thaw();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, doc) = readiness(admin).await;
        if status == 200 {
            assert_eq!(doc["ready"], true, "{doc}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still not ready: {doc}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_paths_answer_on_the_proxy_listener_only_when_asked() {
    let up = Upstream::start().await;
    // Off (the default): the paths are the upstream's.
    let site = Site::new();
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let upstreams = send("GET", &gw.url("/healthz"), &[], "").await;
    assert_ne!(
        upstreams.body, "ok\n",
        "the gateway answered a path it was not given"
    );

    let site = Site::new();
    let config = site.config("probe_paths = true\n");
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let health = send("GET", &gw.url("/healthz"), &[], "").await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    let ready = send("GET", &gw.url("/readyz"), &[], "").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    let doc: Value = serde_json::from_str(&ready.body).unwrap();
    assert_eq!(doc["ready"], true, "{doc}");
    // Only GET on exactly those paths: the rest is the upstream's.
    let other = send("GET", &gw.url("/healthz/deep"), &[], "").await;
    assert_eq!(other.status, upstreams.status, "{other:?}");
    let paid = post(&gw.url("/healthz"), &[key("probe-post")], PAYOUT).await;
    assert_ne!(paid.body, "ok\n", "{paid:?}");

    // A route that protects GET on a probe path would never see it: refused.
    let site = Site::new();
    let config = site
        .config("probe_paths = true\n[[route]]\nmethods = [\"GET\", \"POST\"]\npath = \"/**\"\n");
    let out = support::idem(&[
        "serve",
        "--upstream",
        &up.url(),
        "--config",
        config.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let said = support::text(&out.stderr);
    assert!(
        said.contains("probe_paths: route[0] protects GET /healthz"),
        "{said}"
    );
}

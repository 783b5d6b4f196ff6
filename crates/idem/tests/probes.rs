//! The admin listener's probes, black-box: `/healthz` and `/readyz` answer
//! without the admin token and without any record's data, and `/readyz`
//! turns not ready, naming the check, while the store is frozen (a real
//! PostgreSQL behind a relay that stops forwarding), and ready again once
//! it answers. What `/readyz` says is check names and statuses from a
//! fixed vocabulary, never what a check ran into: neither a backup's path
//! nor a store URL with its password reaches a caller without the token.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::{Gateway, PgSchema, Site, Upstream, idem, key, post, send, text};

const TOKEN: &str = "admin-token-0123456789abcdef";
const PAYOUT: &str = r#"{"seller":847,"amount":1200}"#;

/// The checks every gateway runs.
const CHECKS: [&str; 4] = ["store_read", "store_write", "suspect_window", "reconciler"];
/// The checks a gateway on PostgreSQL runs besides: what its store
/// watches for by itself.
const STORE_CHECKS: [&str; 2] = ["promotion_check", "completion_notices"];
/// Every status `/readyz` may give a check.
const STATUSES: [&str; 10] = [
    "ok",
    "failed",
    "timeout",
    "closed",
    "open",
    "unknown",
    "off",
    "stalled",
    "connected",
    "disconnected",
];

/// `/readyz` at `base` (`http://host:port`): its status and body, which
/// holds nothing but the fixed vocabulary.
async fn readiness_at(base: &str) -> (u16, Value) {
    let reply = send("GET", &format!("{base}/readyz"), &[], "").await;
    (reply.status, parsed(&reply.body))
}

/// A `/readyz` body, which holds nothing but the fixed vocabulary.
fn parsed(body: &str) -> Value {
    let doc = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    assert_fixed_vocabulary(&doc);
    doc
}

async fn readiness(admin: std::net::SocketAddr) -> (u16, Value) {
    readiness_at(&format!("http://{admin}")).await
}

/// `{"ready": bool, "checks": {name: status}}`, each name one of the
/// gateway's checks and each status one of the vocabulary's: there is no
/// room for text a check ran into.
fn assert_fixed_vocabulary(doc: &Value) {
    let fields = doc.as_object().unwrap_or_else(|| panic!("{doc}"));
    let mut names: Vec<_> = fields.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["checks", "ready"], "{doc}");
    assert!(doc["ready"].is_boolean(), "{doc}");
    let checks = doc["checks"].as_object().unwrap_or_else(|| panic!("{doc}"));
    for (name, status) in checks {
        let name = name.as_str();
        assert!(
            CHECKS.contains(&name) || STORE_CHECKS.contains(&name),
            "{name}: {doc}"
        );
        let status = status.as_str().unwrap_or_else(|| panic!("{doc}"));
        assert!(STATUSES.contains(&status), "{name}: {status}: {doc}");
    }
    for name in CHECKS {
        assert!(checks.contains_key(name), "no {name} check: {doc}");
    }
}

fn check<'a>(doc: &'a Value, name: &str) -> &'a str {
    doc["checks"][name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} check: {doc}"))
}

/// Polls `/readyz` at `base` until it answers 503, within `limit`; the
/// body as sent.
async fn not_ready_within(base: &str, limit: Duration) -> String {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let began = std::time::Instant::now();
        let reply = send("GET", &format!("{base}/readyz"), &[], "").await;
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "the probe itself hung for {:?}",
            began.elapsed()
        );
        if reply.status == 503 {
            return reply.body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still ready: {reply:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
    let found: Vec<_> = CHECKS.iter().map(|name| check(&doc, name)).collect();
    assert_eq!(found, ["ok", "ok", "closed", "off"], "{doc}");
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
    let (_gw, admin) = Gateway::start_admin_url(&up.url(), &store, None, TOKEN);
    let (status, doc) = readiness(admin).await;
    assert_eq!(status, 200, "{doc}");

    relay.freeze();
    // An answer is reused for a second; the next one checks the store.
    let said = not_ready_within(&format!("http://{admin}"), Duration::from_secs(10)).await;
    let doc = parsed(&said);
    assert_eq!(doc["ready"], false, "{doc}");
    // The store's own deadline (1 s) ends the read before the probe's.
    assert_eq!(check(&doc, "store_read"), "failed", "{doc}");
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
    let (status, doc) = readiness_at(&gw.url("")).await;
    assert_eq!((status, &doc["ready"]), (200, &Value::Bool(true)), "{doc}");
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

/// Where the restore test keeps its backup: every part of the path is
/// distinctive, so that any of it in a body is found.
const VAULT: &str = "vault-q7x3";
const BACKUP: &str = "nightly-k9z2.db";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_a_window_is_open_and_never_the_backups_path() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let paid = post(&gw.url("/payouts"), &[key("k-before-backup")], PAYOUT).await;
    assert_eq!(paid.status, 201);
    let backup = site.dir.path().join(VAULT).join(BACKUP);
    std::fs::create_dir(backup.parent().unwrap()).unwrap();
    store_cmd(
        &["backup", "--store", &sqlite(&site.store()), "--to"],
        &backup,
    );
    drop(gw);
    store_cmd(
        &["restore", "--store", &sqlite(&site.store()), "--from"],
        &backup,
    );

    let config = site.config("probe_paths = true\n");
    let (gw, admin) = Gateway::start_admin(&up.url(), &site.store(), Some(&config), TOKEN);
    for base in [format!("http://{admin}"), gw.url("")] {
        let reply = send("GET", &format!("{base}/readyz"), &[], "").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_no_part_of(&reply.body, &backup);
        let (_, doc) = readiness_at(&base).await;
        assert_eq!(check(&doc, "suspect_window"), "open", "{doc}");
    }
    // The cause is the operator's, behind the token, and in the log.
    let bearer = format!("Bearer {TOKEN}");
    let window = send(
        "GET",
        &format!("http://{admin}/window"),
        &[("authorization", &bearer)],
        "",
    )
    .await;
    assert_eq!(window.status, 200, "{}", window.body);
    assert!(window.body.contains(BACKUP), "{}", window.body);
    assert!(gw.logs().contains(BACKUP), "{}", gw.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_of_a_store_that_is_down_never_says_its_url_or_password() {
    let up = Upstream::start().await;
    let schema = PgSchema::new("probes_secret");
    let (relay, relayed) = schema.through_relay().await;
    let (scheme, rest) = relayed.split_once("://").unwrap();
    let (userinfo, rest) = rest.split_once('@').unwrap();
    // The tests' own password where their URL has one (a server that
    // trusts the client ignores it); either way it is there to leak.
    let (user, password) = userinfo
        .split_once(':')
        .unwrap_or((userinfo, "pw-s3cr3t-5d8e"));
    let store = format!("{scheme}://{user}:{password}@{rest}&operation_timeout_ms=1000");
    let site = Site::new();
    let config = site.config("probe_paths = true\n");
    let (gw, admin) = Gateway::start_admin_url(&up.url(), &store, Some(&config), TOKEN);
    let ready = send("GET", &format!("http://{admin}/readyz"), &[], "").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    let doc = parsed(&ready.body);
    for name in STORE_CHECKS {
        assert_eq!(check(&doc, name), "ok", "{doc}");
    }

    relay.freeze();
    let relay_addr = relay.addr().to_string();
    for base in [format!("http://{admin}"), gw.url("")] {
        let said = not_ready_within(&base, Duration::from_secs(10)).await;
        for secret in [password, &relay_addr, &schema.name, user, "postgres"] {
            assert!(!said.contains(secret), "{secret} in {said}");
        }
        let doc = parsed(&said);
        // The store's own deadline (1 s) ends the read before the probe's.
        assert_eq!(check(&doc, "store_read"), "failed", "{doc}");
        assert_eq!(check(&doc, "suspect_window"), "unknown", "{doc}");
    }
    // Why is the log's: the check and what it ran into, the password
    // masked there too.
    let logged = gw.logs();
    assert!(
        logged.contains("not ready: a probe check failed") && logged.contains("store_read"),
        "{logged}"
    );
    assert!(!logged.contains(password), "{logged}");
    relay.thaw();
}

fn sqlite(store: &Path) -> String {
    format!("sqlite://{}", store.display())
}

/// `idem store ARGS PATH`, which must succeed.
fn store_cmd(args: &[&str], path: &Path) {
    let mut all = vec!["store"];
    all.extend_from_slice(args);
    all.push(path.to_str().unwrap());
    let out = idem(&all);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `body` holds neither `path` nor any of its parts.
fn assert_no_part_of(body: &str, path: &Path) {
    assert!(!body.contains(&*path.to_string_lossy()), "{body}");
    for part in path.iter().map(|p| p.to_string_lossy()) {
        if part != "/" {
            assert!(!body.contains(&*part), "{part:?} of {path:?} in {body}");
        }
    }
    let stem = path.file_stem().unwrap().to_string_lossy();
    assert!(!body.contains(&*stem), "{stem:?} in {body}");
}

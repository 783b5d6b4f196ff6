//! The status URL and `Prefer: respond-async` (docs/http.md, "The status
//! URL"): through a real `idem serve`, on SQLite and on PostgreSQL, a
//! caller asks `GET <path>/.idem/{key}` about its own key and gets the
//! stored answer, 202 while it runs (or the answer after `Prefer: wait`),
//! 409 `outcome-unknown` (settled on the spot where the route has a
//! lookup), 422 `key-expired`, or 404 `key-unknown`; another tenant's key
//! is answered byte for byte as a key never seen; the status URL never
//! runs anything; and a request that prefers to respond async is accepted
//! with the status URL as its `Location`, where its answer appears, with
//! the upstream paid once.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::{Gateway, PgSchema, Reply, Site, Upstream, key, post, segment, send};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;
const KEY_UNKNOWN: &str = "urn:idem:problem:key-unknown";

/// One route `payouts` on every path, its tenant from `x-tenant-id`, with
/// `extra` route lines and `after` (a lookup) appended.
fn config(site: &Site, extra: &str, after: &str) -> PathBuf {
    site.config(&format!(
        "[reconcile]\ninterval_s = 3600\n\
         [[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/**\"\n\
         principal = {{ header = \"x-tenant-id\" }}\n{extra}\n{after}"
    ))
}

/// Asks the status URL of `k` under `path` as `tenant`.
async fn status(gw: &Gateway, path: &str, tenant: &str, k: &str, extra: &[(&str, &str)]) -> Reply {
    let url = gw.url(&format!("{path}/.idem/{}", segment(k)));
    let mut headers = vec![("x-tenant-id", tenant)];
    headers.extend_from_slice(extra);
    send("GET", &url, &headers, "").await
}

async fn pay(gw: &Gateway, path: &str, tenant: &str, k: &str) -> Reply {
    post(&gw.url(path), &[("x-tenant-id", tenant), key(k)], PAYOUT).await
}

/// Every state a key can be in, asked through its status URL.
async fn every_state(up: &Upstream, gw: &Gateway) {
    // Never seen: 404 key-unknown.
    let never = status(gw, "/payouts", "acme", "never-sent", &[]).await;
    assert_eq!(never.status, 404, "{never:?}");
    assert_eq!(never.problem().as_deref(), Some(KEY_UNKNOWN));

    // Completed: the stored answer, marked replayed.
    let paid = pay(gw, "/payouts", "acme", "done-1").await;
    assert_eq!(paid.status, 201, "{paid:?}");
    let asked = status(gw, "/payouts", "acme", "done-1", &[]).await;
    asked.assert_replay_of(&paid);
    assert_eq!(asked.header("location"), paid.header("location"));
    assert!(asked.header("idempotency-expires").is_some(), "{asked:?}");

    // Another tenant's key is a key never seen, byte for byte (minus Date).
    let foreign = status(gw, "/payouts", "globex", "done-1", &[]).await;
    let unseen = status(gw, "/payouts", "globex", "never-sent", &[]).await;
    assert_eq!(
        foreign, unseen,
        "another tenant's key answers as an unknown one"
    );
    assert_eq!(foreign.status, 404);

    // Outcome unknown without a lookup: 409, and nothing ran again.
    let failed = pay(gw, "/fail", "acme", "unknown-1").await;
    assert_eq!(failed.status, 500, "{failed:?}");
    let asked = status(gw, "/fail", "acme", "unknown-1", &[]).await;
    assert_eq!(asked.status, 409, "{asked:?}");
    assert_eq!(
        asked.problem().as_deref(),
        Some("urn:idem:problem:outcome-unknown")
    );
    assert!(asked.header("retry-after").is_some(), "{asked:?}");

    // In flight: 202 with a short Retry-After, then the answer after a wait.
    let slow_url = gw.url("/slow-before?ms=2500");
    let running = tokio::spawn(async move {
        post(&slow_url, &[("x-tenant-id", "acme"), key("slow-1")], PAYOUT).await
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let asked = status(gw, "/slow-before", "acme", "slow-1", &[]).await;
    assert_eq!(asked.status, 202, "{asked:?}");
    // A young attempt on a route whose forwards took milliseconds: a
    // second, not the lease's 30.
    assert_eq!(asked.header("retry-after"), Some("1"), "{asked:?}");
    let started = Instant::now();
    let waited = status(
        gw,
        "/slow-before",
        "acme",
        "slow-1",
        &[("prefer", "wait=10")],
    )
    .await;
    let first = running.await.unwrap();
    assert_eq!(first.status, 201, "{first:?}");
    waited.assert_replay_of(&first);
    assert_eq!(
        waited.header("preference-applied"),
        Some("wait=10"),
        "{waited:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "woken, not timed out"
    );

    // The status URL ran nothing: one payment per key that was sent.
    let keys: Vec<_> = up.effects().into_iter().filter_map(|e| e.key).collect();
    assert_eq!(keys, ["done-1", "unknown-1", "slow-1"], "{keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_url_answers_every_state_on_sqlite() {
    let up = Upstream::start().await;
    let site = Site::new();
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config(&site, "", "")));
    every_state(&up, &gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_url_answers_every_state_on_postgres() {
    let up = Upstream::start().await;
    let site = Site::new();
    let schema = PgSchema::new("status_url");
    let gw = Gateway::start_url(&up.url(), &schema.store_url(), Some(&config(&site, "", "")));
    every_state(&up, &gw).await;
}

/// The 409 of a retry while the attempt runs advises a `Retry-After` from
/// the attempt's age and the route's observed latency, not the lease: on
/// a route with no forward observed yet, what is left of the lease; after
/// fast forwards, a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_of_an_attempt_in_flight_follows_the_route_s_latency() {
    let up = Upstream::start().await;
    let site = Site::new();
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config(&site, "", "")));
    let in_flight = |k: &'static str| {
        let url = gw.url("/slow-before?ms=1500");
        let running =
            tokio::spawn(
                async move { post(&url, &[("x-tenant-id", "acme"), key(k)], PAYOUT).await },
            );
        let url = gw.url("/slow-before?ms=1500");
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let retry = post(&url, &[("x-tenant-id", "acme"), key(k)], PAYOUT).await;
            assert_eq!(retry.status, 409, "{retry:?}");
            assert_eq!(running.await.unwrap().status, 201);
            retry.header("retry-after").unwrap().parse::<u64>().unwrap()
        }
    };
    let unobserved = in_flight("young-0").await;
    assert!(
        unobserved >= 20,
        "no latency observed yet: the lease's rest, {unobserved}"
    );
    for i in 0..3 {
        let paid = pay(&gw, "/payouts", "acme", &format!("fast-{i}")).await;
        assert_eq!(paid.status, 201);
    }
    // The running mean now holds one 1.5 s forward and three fast ones:
    // under 1.5 s, less the attempt's age.
    let observed = in_flight("young-1").await;
    assert_eq!(observed, 1, "a young attempt on a fast route");
}

/// `cors_expose = true`: every answer of the route, the upstream's, a
/// replay, a refusal and the status URL's, names idem's headers once in
/// `Access-Control-Expose-Headers`, merged with the upstream's; a route
/// without it passes the upstream's list untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_callers_can_read_idem_s_headers_where_the_route_exposes_them() {
    let up = Upstream::start().await;
    let site = Site::new();
    let idem_s = "Idempotent-Replayed, Idempotency-Expires, Retry-After, Location, \
                  Preference-Applied";
    let merged = "X-Request-Id, location, Idempotent-Replayed, Idempotency-Expires, \
                  Retry-After, Preference-Applied";
    let gw = Gateway::start(
        &up.url(),
        &site.store(),
        Some(&config(&site, "cors_expose = true", "")),
    );
    let first = pay(&gw, "/exposing", "acme", "cors-1").await;
    assert_eq!(first.status, 201, "{first:?}");
    let expose = "access-control-expose-headers";
    assert_eq!(first.header(expose), Some(merged), "{first:?}");
    let replay = pay(&gw, "/exposing", "acme", "cors-1").await;
    replay.assert_replay_of(&first);
    assert_eq!(replay.header(expose), Some(idem_s), "{replay:?}");
    let reused = post(
        &gw.url("/exposing"),
        &[("x-tenant-id", "acme"), key("cors-1")],
        "{}",
    )
    .await;
    assert_eq!(reused.status, 422, "{reused:?}");
    assert_eq!(reused.header(expose), Some(idem_s), "{reused:?}");
    let asked = status(&gw, "/exposing", "acme", "cors-1", &[]).await;
    assert_eq!(asked.header(expose), Some(idem_s), "{asked:?}");
    let unknown = status(&gw, "/exposing", "acme", "cors-2", &[]).await;
    assert_eq!(unknown.header(expose), Some(idem_s), "{unknown:?}");
    drop(gw);
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config(&site, "", "")));
    let plain = pay(&gw, "/exposing", "acme", "cors-3").await;
    assert_eq!(
        plain.header(expose),
        Some("X-Request-Id, location"),
        "{plain:?}"
    );
    let replay = pay(&gw, "/exposing", "acme", "cors-3").await;
    assert_eq!(replay.header(expose), None, "{replay:?}");
}

/// `GET <path>/.idem` publishes the route's policy as JSON: its key
/// header, limits, retention, what a 5xx means and the status URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_resource_publishes_its_idempotency_policy() {
    let up = Upstream::start().await;
    let site = Site::new();
    let extra = "retention_s = 7200\ntombstone_s = 86400\nlease_ms = 40000\n\
                 body_bytes_max = 4096\ncompletion = { release = [503] }\nwait_ms = 100";
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config(&site, extra, "")));
    let asked = send(
        "GET",
        &gw.url("/payouts/.idem"),
        &[("x-tenant-id", "acme")],
        "",
    )
    .await;
    assert_eq!(asked.status, 200, "{asked:?}");
    assert_eq!(asked.header("content-type"), Some("application/json"));
    let doc: serde_json::Value = serde_json::from_str(&asked.body).unwrap();
    let want = serde_json::json!({
        "key_header": "idempotency-key",
        "key_required": true,
        "key_bytes_max": 255,
        "methods": ["POST"],
        "body_bytes_max": 4096,
        "lease_ms": 40000,
        "retention_s": 7200,
        "tombstone_s": 86400,
        "on_lease_expiry": "reconcile",
        "server_error": "unknown",
        "server_error_exceptions": { "503": "release" },
        "unknown_settled_by": "operator",
        "wait_ms": { "default": 100, "max": doc["wait_ms"]["max"] },
        "status_url": "/payouts/.idem/{key}",
        "respond_async": true,
    });
    assert_eq!(doc, want);
    assert!(doc["wait_ms"]["max"].as_u64().unwrap() <= 40000, "{doc}");
    // Nothing was forwarded to publish it.
    assert_eq!(up.hits(), 0);
}

/// Past retention: the key-expired problem; past the tombstone too: a key
/// never seen.
async fn tombstone(gw: &Gateway) {
    let paid = pay(gw, "/payouts", "acme", "old-1").await;
    assert_eq!(paid.status, 201, "{paid:?}");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let asked = status(gw, "/payouts", "acme", "old-1", &[]).await;
    assert_eq!(asked.status, 422, "{asked:?}");
    assert_eq!(
        asked.problem().as_deref(),
        Some("urn:idem:problem:key-expired")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstoned_key_is_expired_through_its_status_url_on_sqlite_and_postgres() {
    let up = Upstream::start().await;
    let site = Site::new();
    let cfg = config(&site, "retention_s = 1\ntombstone_s = 3600", "");
    let gw = Gateway::start(&up.url(), &site.store(), Some(&cfg));
    tombstone(&gw).await;
    let schema = PgSchema::new("status_tomb");
    let gw = Gateway::start_url(&up.url(), &schema.store_url(), Some(&cfg));
    tombstone(&gw).await;
}

/// With a lookup, an unknown outcome is settled when its status URL is
/// asked: the provider has the payment, so the answer is the stored one,
/// with the status the lookup's `found_status` maps it to (`want`); a
/// retry of the request replays the same.
async fn settled_by_lookup(up: &Upstream, gw: &Gateway, want: u16) {
    let failed = pay(gw, "/fail", "acme", "settle-1").await;
    assert_eq!(failed.status, 500, "{failed:?}");
    let asked = status(gw, "/fail", "acme", "settle-1", &[]).await;
    assert_eq!(asked.status, want, "{asked:?}");
    pay(gw, "/fail", "acme", "settle-1")
        .await
        .assert_replay_of(&asked);
    assert_eq!(
        asked.header("idempotent-replayed"),
        Some("true"),
        "{asked:?}"
    );
    assert!(asked.body.contains("\"found_by\":\"lookup\""), "{asked:?}");
    assert_eq!(up.effects().len(), 1, "the status URL ran nothing");
    assert_eq!(up.lookups(), 1, "one lookup settled it");
}

fn lookup_config(site: &Site, up: &Upstream, lookup_extra: &str) -> PathBuf {
    config(
        site,
        "lease_ms = 500\nforward_key = { template = \"{scope_digest}:{key}\" }",
        &format!(
            "[[lookup]]\nroute = \"payouts\"\nurl = \"{}/payouts/by-key/{{forwarded_key}}\"\n\
             timeout_ms = 500\n{lookup_extra}\n",
            up.url()
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_is_settled_through_its_status_url_with_found_status_on_sqlite() {
    let up = Upstream::start().await;
    let site = Site::new();
    let lookup = lookup_config(&site, &up, "found_status = 201");
    let cfg = format!(
        "response_timeout_ms = 400\n{}",
        std::fs::read_to_string(lookup).unwrap()
    );
    let cfg = site.config(&cfg);
    let gw = Gateway::start(&up.url(), &site.store(), Some(&cfg));
    settled_by_lookup(&up, &gw, 201).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_is_settled_through_its_status_url_on_postgres() {
    let up = Upstream::start().await;
    let site = Site::new();
    let schema = PgSchema::new("status_settle");
    let cfg = format!(
        "response_timeout_ms = 400\n{}",
        std::fs::read_to_string(lookup_config(&site, &up, "")).unwrap()
    );
    let cfg = site.config(&cfg);
    let gw = Gateway::start_url(&up.url(), &schema.store_url(), Some(&cfg));
    settled_by_lookup(&up, &gw, 200).await;
}

/// `Prefer: respond-async`: 202 with the status URL as `Location` before
/// the upstream answers; polling it ends in the stored answer; one payment.
async fn respond_async(up: &Upstream, gw: &Gateway) {
    // A key with quotes, a backslash, a slash and a percent sign, sent in
    // the header's quoted form.
    let own = r#"a/b"c\d%"#;
    let header = r#""a/b\"c\\d%""#;
    let started = Instant::now();
    let accepted = post(
        &gw.url("/slow?ms=1500"),
        &[
            ("x-tenant-id", "acme"),
            key(header),
            ("prefer", "respond-async"),
        ],
        PAYOUT,
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_millis(1_400),
        "before the answer"
    );
    assert_eq!(accepted.status, 202, "{accepted:?}");
    assert_eq!(accepted.header("preference-applied"), Some("respond-async"));
    // When to ask: within the lease the store granted (30 s), at least 1 s.
    let retry_after = accepted.header("retry-after").map(str::parse::<u64>);
    assert!(
        matches!(retry_after, Some(Ok(1..=30))),
        "{retry_after:?}: {accepted:?}"
    );
    let location = accepted.header("location").unwrap().to_owned();
    assert_eq!(
        location,
        format!("/slow/.idem/{}?method=POST", segment(own))
    );
    let answer = loop {
        let asked = send("GET", &gw.url(&location), &[("x-tenant-id", "acme")], "").await;
        if asked.status != 202 {
            break asked;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{asked:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(answer.header("idempotent-replayed"), Some("true"));
    assert_eq!(up.hits(), 1, "the upstream saw one request");
    let effects = up.effects();
    assert_eq!(effects.len(), 1, "{effects:?}");
    // A retry of a known key with respond-async is answered as usual.
    let again = post(
        &gw.url("/slow?ms=1500"),
        &[
            ("x-tenant-id", "acme"),
            key(header),
            ("prefer", "respond-async"),
        ],
        PAYOUT,
    )
    .await;
    again.assert_replay_of(&answer);
    assert_eq!(again.header("preference-applied"), None, "{again:?}");
    assert_eq!(up.hits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn respond_async_then_the_status_url_on_sqlite_and_postgres() {
    let up = Upstream::start().await;
    let site = Site::new();
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config(&site, "", "")));
    respond_async(&up, &gw).await;
    drop(gw);
    let up = Upstream::start().await;
    let schema = PgSchema::new("status_async");
    let gw = Gateway::start_url(&up.url(), &schema.store_url(), Some(&config(&site, "", "")));
    respond_async(&up, &gw).await;
}

/// Malformed keys in the URL are refused; a route may rename or turn off
/// its status URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_keys_are_refused_and_the_status_url_is_configurable() {
    let up = Upstream::start().await;
    let site = Site::new();
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config(&site, "", "")));
    for bad in ["%FF", "a%20b", "%C3%A9"] {
        let url = gw.url(&format!("/payouts/.idem/{bad}"));
        let asked = send("GET", &url, &[("x-tenant-id", "acme")], "").await;
        assert_eq!(asked.status, 400, "{bad}: {asked:?}");
        assert_eq!(
            asked.problem().as_deref(),
            Some("urn:idem:problem:invalid-key"),
            "{bad}"
        );
    }
    drop(gw);
    let renamed = config(&site, "status_url = \"{path}/_status/{key}\"", "");
    let gw = Gateway::start(&up.url(), &site.store(), Some(&renamed));
    let paid = pay(&gw, "/payouts", "acme", "r-1").await;
    let url = gw.url("/payouts/_status/r-1");
    send("GET", &url, &[("x-tenant-id", "acme")], "")
        .await
        .assert_replay_of(&paid);
    drop(gw);
    let off = config(&site, "status_url = \"off\"", "");
    let gw = Gateway::start(&up.url(), &site.store(), Some(&off));
    let url = gw.url("/payouts/.idem/r-1");
    let passed = send("GET", &url, &[("x-tenant-id", "acme")], "").await;
    assert_ne!(passed.problem().as_deref(), Some(KEY_UNKNOWN), "{passed:?}");
    assert_eq!(passed.header("idempotent-replayed"), None, "{passed:?}");
}

/// A route scoped by the default (the caller's credentials): callers who
/// send none share one anonymous scope, so asking by key alone would hand
/// one of them another's answer. Their status URL knows no key and their
/// respond-async is answered when the attempt ends; a caller with a
/// credential asks about its own key as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_callers_cannot_read_answers_by_key() {
    let up = Upstream::start().await;
    let site = Site::new();
    let route = "[[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/**\"\n";
    let gw = Gateway::start(&up.url(), &site.store(), Some(&site.config(route)));
    let ask = |k: &str, headers: Vec<(&'static str, &'static str)>| {
        let url = gw.url(&format!("/payouts/.idem/{}", segment(k)));
        async move { send("GET", &url, &headers, "").await }
    };
    // Anonymous: the answer exists, but the status URL does not give it.
    let paid = post(&gw.url("/payouts"), &[key("anon-1")], PAYOUT).await;
    assert_eq!(paid.status, 201, "{paid:?}");
    let asked = ask("anon-1", vec![]).await;
    assert_eq!(asked.status, 404, "{asked:?}");
    assert_eq!(asked.problem().as_deref(), Some(KEY_UNKNOWN));
    let prefer = ("prefer", "respond-async");
    let sync = post(&gw.url("/payouts"), &[key("anon-2"), prefer], PAYOUT).await;
    assert_eq!(sync.status, 201, "answered when it ended: {sync:?}");
    assert_eq!(sync.header("preference-applied"), None);
    // With a credential, the caller's own key is answered.
    let bearer = ("authorization", "Bearer caller-7");
    let own = post(&gw.url("/payouts"), &[key("cred-1"), bearer], PAYOUT).await;
    assert_eq!(own.status, 201, "{own:?}");
    ask("cred-1", vec![bearer]).await.assert_replay_of(&own);
    assert_eq!(
        ask("cred-1", vec![]).await.status,
        404,
        "not to the anonymous"
    );
    assert_eq!(up.effects().len(), 3);
}

/// One key under two methods of one route is two intents: the `Location`
/// of a PUT that prefers to respond async names its method, and polling it
/// ends in the PUT's answer, never the POST's stored under the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn respond_async_is_polled_in_its_own_method_s_scope() {
    let up = Upstream::start().await;
    let site = Site::new();
    let route = "[[route]]\nmethods = [\"POST\", \"PUT\"]\npath = \"/**\"\n\
        principal = { header = \"x-tenant-id\" }\n";
    let gw = Gateway::start(&up.url(), &site.store(), Some(&site.config(route)));
    let tenant = ("x-tenant-id", "acme");
    let posted = post(&gw.url("/slow?ms=10"), &[tenant, key("both-1")], PAYOUT).await;
    assert_eq!(posted.status, 201, "{posted:?}");
    let headers = [tenant, key("both-1"), ("prefer", "respond-async")];
    let accepted = send("PUT", &gw.url("/slow?ms=800"), &headers, PAYOUT).await;
    assert_eq!(accepted.status, 202, "{accepted:?}");
    let location = accepted.header("location").unwrap().to_owned();
    assert_eq!(location, "/slow/.idem/both-1?method=PUT");
    let started = Instant::now();
    let answer = loop {
        let asked = send("GET", &gw.url(&location), &[tenant], "").await;
        if asked.status != 202 {
            break asked;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{asked:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The test upstream refuses PUT with 405: a final answer, stored.
    assert_eq!(
        answer.status, 405,
        "the PUT's own answer, not the POST's: {answer:?}"
    );
    let again = [tenant, key("both-1")];
    let put_again = send("PUT", &gw.url("/slow?ms=800"), &again, PAYOUT).await;
    assert_eq!(put_again.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        (put_again.status, &put_again.body),
        (answer.status, &answer.body)
    );
    assert_eq!(
        up.effects().len(),
        1,
        "the POST paid once; the PUT was refused"
    );
}

//! What an operator does with a running gateway, black-box: the admin API
//! behind its token, resolving ambiguous records through the API and the
//! CLI, the metrics page, late replays after retention, and the purge.
//! Every test counts the effects the upstream really performed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::{
    Gateway, Reply, Site, Upstream, eventually, idem, key, metric, post, segment, send, text,
};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;
const TOKEN: &str = "ops-test-token-5f2c9a7e41d8";

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// A request to the admin API with the right token.
async fn admin(method: &str, addr: SocketAddr, path: &str, body: &str) -> Reply {
    let auth = bearer();
    send(
        method,
        &format!("http://{addr}{path}"),
        &[("authorization", &auth)],
        body,
    )
    .await
}

fn json(reply: &Reply) -> serde_json::Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{e}: {reply:?}"))
}

fn store_url(site: &Site) -> String {
    format!("sqlite://{}", site.store().display())
}

/// The one ambiguous record, as the admin API lists it: (scope, key, token).
async fn only_ambiguous(admin_addr: SocketAddr) -> (String, String, u64) {
    let listed = admin("GET", admin_addr, "/records?state=ambiguous&limit=10", "").await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let page = json(&listed);
    let records = page["records"].as_array().unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    let scope = records[0]["scope"].as_str().unwrap().to_owned();
    let key = records[0]["key"].as_str().unwrap().to_owned();
    (scope, key, records[0]["token"].as_u64().unwrap())
}

/// `idem records list --state ambiguous --format json` on `store`.
fn ambiguous_records(store: &str) -> serde_json::Value {
    let args = [
        "records",
        "list",
        "--state",
        "ambiguous",
        "--format",
        "json",
        "--store",
        store,
    ];
    let out = idem(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_requests_without_the_right_token() {
    let (up, site) = (Upstream::start().await, Site::new());
    let (gw, admin_addr) = Gateway::start_admin(&up.url(), &site.store(), None, TOKEN);
    let wrong_token = format!("Bearer {TOKEN}x");
    let wrong_scheme = format!("Basic {TOKEN}");
    let refused: [&[(&str, &str)]; 4] = [
        &[],
        &[("authorization", &wrong_token)],
        &[("authorization", &wrong_scheme)],
        &[("authorization", "Bearer ")],
    ];
    for path in [
        "/records",
        "/records?state=ambiguous",
        "/metrics",
        "/records/a/b",
    ] {
        for headers in refused {
            let url = format!("http://{admin_addr}{path}");
            let reply = send("GET", &url, headers, "").await;
            assert_eq!(reply.status, 401, "{path} {headers:?}: {reply:?}");
            assert_eq!(
                reply.problem().as_deref(),
                Some("urn:idem:problem:unauthorized")
            );
            assert_eq!(
                reply.header("content-type"),
                Some("application/problem+json")
            );
            assert!(reply.header("www-authenticate").is_some());
        }
    }
    // A flood of refusals is answered in full but cannot flood the log:
    // at most ten refusal lines a minute.
    for i in 0..200 {
        let url = format!("http://{admin_addr}/guess-{i}");
        assert_eq!(send("GET", &url, &[], "").await.status, 401);
    }
    let refusal_lines = gw
        .logs()
        .matches("refused a request without a valid token")
        .count();
    assert_eq!(refusal_lines, 10, "{}", gw.logs());
    let ok = admin("GET", admin_addr, "/records", "").await;
    assert_eq!(
        (ok.status, ok.body.as_str()),
        (200, r#"{"damaged":[],"next":null,"records":[]}"#)
    );
    // The metrics are on the admin listener only, never on the proxy's.
    let public = send("GET", &gw.url("/metrics"), &[], "").await;
    assert!(!public.body.contains("idem_claims_total"), "{public:?}");
    assert!(
        !gw.logs().contains(TOKEN),
        "the token is never logged: {}",
        gw.logs()
    );
}

#[test]
fn serve_refuses_an_admin_listener_without_a_strong_token() {
    let site = Site::new();
    let config =
        site.config("admin_listen = \"127.0.0.1:0\"\nadmin_token_env = \"PAYOUTS_ADMIN\"\n");
    let config = config.to_str().unwrap().to_owned();
    let store = store_url(&site);
    let base = [
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--store",
        &store,
    ];
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: [Case; 4] = [
        (
            vec!["--admin-listen", "127.0.0.1:0"],
            vec![],
            "environment variable IDEM_ADMIN_TOKEN is not set",
        ),
        (
            vec!["--admin-listen", "127.0.0.1:0"],
            vec![("IDEM_ADMIN_TOKEN", "short")],
            "environment variable IDEM_ADMIN_TOKEN: the token is 5 bytes; at least 16 are required",
        ),
        (
            vec!["--config", &config],
            vec![("IDEM_ADMIN_TOKEN", TOKEN)],
            "environment variable PAYOUTS_ADMIN is not set",
        ),
        (
            vec!["--admin-listen", "localhost"],
            vec![("IDEM_ADMIN_TOKEN", TOKEN)],
            "--admin-listen: \"localhost\" is not an address",
        ),
    ];
    for (args, env, expect) in cases {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_idem"));
        cmd.args(base).args(&args).env_remove("IDEM_ADMIN_TOKEN");
        cmd.env_remove("PAYOUTS_ADMIN");
        for (name, value) in &env {
            cmd.env(name, value);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?} {env:?}");
        let err = text(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(!site.store().exists(), "nothing was opened: {args:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_record_resolved_through_the_admin_api_is_replayed() {
    let (up, site) = (Upstream::start().await, Site::new());
    let (gw, admin_addr) = Gateway::start_admin(&up.url(), &site.store(), None, TOKEN);
    let first = post(&gw.url("/fail"), &[key("a-1")], PAYOUT).await;
    assert_eq!(first.status, 500);
    let (scope, key_, token) = only_ambiguous(admin_addr).await;
    assert_eq!(key_, "a-1");
    let logged = eventually(Duration::from_secs(5), || {
        let logs = gw.logs();
        logs.contains("outcome unknown") && logs.contains("upstream answered 500")
    });
    assert!(logged.await, "the log says why: {}", gw.logs());

    // The API's list is the CLI's `--format json`, record for record.
    let listed = admin("GET", admin_addr, "/records?state=ambiguous", "").await;
    assert_eq!(
        json(&listed)["records"],
        ambiguous_records(&store_url(&site))
    );

    let path = format!("/records/{}/{}", segment(&scope), segment(&key_));
    let shown = admin("GET", admin_addr, &path, "").await;
    assert_eq!(shown.status, 200, "{shown:?}");
    assert_eq!(json(&shown)["state"], "ambiguous");

    let resolve = format!("{path}/resolve");
    let bad = format!(r#"{{"token":{token},"outcome":"completed"}}"#);
    let bad = admin("POST", admin_addr, &resolve, &bad).await;
    assert_eq!(bad.status, 400, "{bad:?}");
    assert_eq!(
        bad.problem().as_deref(),
        Some("urn:idem:problem:invalid-request")
    );
    assert!(
        json(&bad)["detail"]
            .as_str()
            .unwrap()
            .contains("field `reason`")
    );

    let body = r#""outcome":"completed","status":201,"headers":[["content-type","application/json"]],"body":"{\"payout\":\"manual-1\"}","reason":"provider ledger shows payout manual-1"}"#;
    // A verdict about another attempt of the key is refused.
    let stale = format!(r#"{{"token":{},{body}"#, token + 1);
    let stale = admin("POST", admin_addr, &resolve, &stale).await;
    assert_eq!(stale.status, 409, "{stale:?}");
    assert_eq!(
        stale.problem().as_deref(),
        Some("urn:idem:problem:other-attempt")
    );
    let body = format!(r#"{{"token":{token},{body}"#);
    let body = body.as_str();
    let resolved = admin("POST", admin_addr, &resolve, body).await;
    assert_eq!(resolved.status, 200, "{resolved:?}");
    let resolved = json(&resolved);
    assert_eq!(resolved["outcome"], "completed");
    assert_eq!(resolved["record"]["state"], "completed");

    let retry = post(&gw.url("/fail"), &[key("a-1")], PAYOUT).await;
    assert_eq!(
        (retry.status, retry.body.as_str()),
        (201, "{\"payout\":\"manual-1\"}"),
        "{retry:?}"
    );
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.header("content-type"), Some("application/json"));
    assert_eq!(up.effects().len(), 1, "the upstream saw one effect");

    let again = admin("POST", admin_addr, &resolve, body).await;
    assert_eq!(again.status, 409, "{again:?}");
    assert_eq!(
        again.problem().as_deref(),
        Some("urn:idem:problem:not-ambiguous")
    );
    let missing = format!("/records/{}/nope/resolve", segment(&scope));
    let missing = admin("POST", admin_addr, &missing, body).await;
    assert_eq!(missing.status, 404, "{missing:?}");
    assert_eq!(
        missing.problem().as_deref(),
        Some("urn:idem:problem:record-not-found")
    );

    let out = idem(&[
        "records",
        "show",
        &scope,
        "a-1",
        "--format",
        "json",
        "--store",
        &store_url(&site),
    ]);
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(record["resolution"]["by"], "operator:admin");
    assert_eq!(
        record["resolution"]["reason"],
        "provider ledger shows payout manual-1"
    );
    let page = admin("GET", admin_addr, "/metrics", "").await.body;
    assert_eq!(
        metric(
            &page,
            "idem_resolutions_total{by=\"operator\",outcome=\"completed\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_record_resolved_as_not_executed_with_the_cli_runs_once() {
    let (up, site) = (Upstream::start().await, Site::new());
    // A 503 declared an unknown outcome: the record becomes ambiguous,
    // though this upstream really did nothing the first time. A short lease
    // (and a response timeout within it), so that "not executed" is
    // accepted within the test.
    let config = site.config(
        "response_timeout_ms = 500\n\n[[route]]\npath = \"/busy-once\"\nlease_ms = 1000\n\
         completion = { unknown = [503] }\n\n[[route]]\n",
    );
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let url = gw.url("/busy-once");
    assert_eq!(post(&url, &[key("b-1")], PAYOUT).await.status, 503);
    let blocked = post(&url, &[key("b-1")], PAYOUT).await;
    assert_eq!(
        blocked.problem().as_deref(),
        Some("urn:idem:problem:outcome-unknown")
    );
    assert_eq!(
        post(&gw.url("/payouts"), &[key("done-1")], PAYOUT)
            .await
            .status,
        201
    );
    let store = store_url(&site);
    let listed = ambiguous_records(&store);
    let scope = listed[0]["scope"].as_str().unwrap().to_owned();
    let token = listed[0]["token"].as_u64().unwrap().to_string();
    let lease_until = listed[0]["lease_until"].as_str().unwrap().to_owned();

    // The CLI shares the SQLite file with the running gateway.
    let resolve = |key: &str, scope: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["records", "resolve", scope, key, "--not-executed"])
            .args(["--token", &token])
            .args([
                "--reason",
                "provider has no payout for b-1",
                "--store",
                &store,
            ])
            .env("USER", "alice")
            .output()
            .unwrap()
    };
    // While the attempt's lease runs, "not executed" proves nothing yet.
    let early = resolve("b-1", &scope);
    assert!(
        !early.status.success(),
        "accepted before the lease ended at {lease_until}"
    );
    let said = text(&early.stderr);
    assert!(said.contains("may still commit"), "{said}");
    let leased = eventually(Duration::from_secs(5), || {
        use idem_core::Clock as _;
        idem_gateway::rfc3339(idem_core::SystemClock.now()) > lease_until
    });
    assert!(leased.await, "the lease ends");
    let out = resolve("b-1", &scope);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("as not_executed by operator:alice") && said.contains("the next retry runs"),
        "{said}"
    );

    // The record is gone, but who released it, when and why is kept.
    let out = idem(&[
        "records", "show", &scope, "b-1", "--format", "json", "--store", &store,
    ]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["state"], serde_json::Value::Null, "{shown}");
    assert_eq!(
        shown["resolutions"][0]["outcome"], "not_executed",
        "{shown}"
    );
    assert_eq!(shown["resolutions"][0]["by"], "operator:alice", "{shown}");
    assert_eq!(
        shown["resolutions"][0]["reason"],
        "provider has no payout for b-1"
    );

    let retry = post(&url, &[key("b-1")], PAYOUT).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(
        retry.header("idempotent-replayed"),
        None,
        "executed, not replayed"
    );
    let replay = post(&url, &[key("b-1")], PAYOUT).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    let paid: Vec<_> = up
        .effects()
        .into_iter()
        .filter(|e| e.path == "/busy-once")
        .collect();
    assert_eq!(paid.len(), 1, "the retry executed once");

    // A verdict about the first attempt cannot touch the retry's record,
    // and a record that is not there is refused: exit 1.
    let out = resolve("b-1", &scope);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(&format!("token {token} no longer owns"))
            && text(&out.stderr).contains("(the record is completed with token"),
        "{}",
        text(&out.stderr)
    );
    let out = resolve("never-sent", &scope);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no record for scope")
            && text(&out.stderr).contains("never-sent"),
        "{}",
        text(&out.stderr)
    );
    // --completed stores the operator's result, with an explicit --by.
    let dir = site.dir.path();
    std::fs::write(dir.join("body.json"), "{\"payout\":\"manual\"}").unwrap();
    assert_eq!(post(&url, &[key("b-2")], PAYOUT).await.status, 503);
    let listed = ambiguous_records(&store);
    let token = listed[0]["token"].as_u64().unwrap().to_string();
    assert_eq!(listed[0]["key"], "b-2");
    let out = idem(&[
        "records",
        "resolve",
        &scope,
        "b-2",
        "--token",
        &token,
        "--completed",
        "--status",
        "201",
        "--header",
        "content-type: application/json",
        "--body",
        dir.join("body.json").to_str().unwrap(),
        "--reason",
        "paid by hand",
        "--by",
        "operator:bob",
        "--store",
        &store,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("as completed by operator:bob"),
        "{}",
        text(&out.stdout)
    );
    let replay = post(&url, &[key("b-2")], PAYOUT).await;
    assert_eq!(
        (replay.status, replay.body.as_str()),
        (201, "{\"payout\":\"manual\"}")
    );
    assert_eq!(replay.header("content-type"), Some("application/json"));
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_every_decision_exercised() {
    let (up, site) = (Upstream::start().await, Site::new());
    // `/busy-once` answers 503 before any effect: released where declared.
    let config = site.config(
        "[[route]]\npath = \"/busy-once\"\ncompletion = { release = [503] }\n\n[[route]]\n",
    );
    let (gw, admin_addr) = Gateway::start_admin(&up.url(), &site.store(), Some(&config), TOKEN);
    let payouts = gw.url("/payouts");
    assert_eq!(post(&payouts, &[key("m-1")], PAYOUT).await.status, 201);
    assert_eq!(post(&payouts, &[key("m-1")], PAYOUT).await.status, 201);
    assert_eq!(
        post(&payouts, &[key("m-1")], "{\"amount\":1}").await.status,
        422
    );
    assert_eq!(post(&payouts, &[], PAYOUT).await.status, 400);
    assert_eq!(
        post(&gw.url("/fail"), &[key("m-2")], PAYOUT).await.status,
        500
    );
    assert_eq!(
        post(&gw.url("/fail"), &[key("m-2")], PAYOUT).await.status,
        409
    );
    assert_eq!(
        post(&gw.url("/busy-once"), &[key("m-3")], PAYOUT)
            .await
            .status,
        503
    );
    let slow = gw.url("/slow?ms=1500");
    let first = tokio::spawn({
        let slow = slow.clone();
        async move { post(&slow, &[key("m-4")], PAYOUT).await }
    });
    assert!(eventually(Duration::from_secs(10), || up.hits() == 4).await);
    assert_eq!(post(&slow, &[key("m-4")], PAYOUT).await.status, 409);
    assert_eq!(first.await.unwrap().status, 201);

    let page = admin("GET", admin_addr, "/metrics", "").await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let page = page.body;
    let expect = [
        ("idem_claims_total{decision=\"acquired\"}", 4.0),
        ("idem_claims_total{decision=\"replay\"}", 1.0),
        ("idem_claims_total{decision=\"mismatch\"}", 1.0),
        ("idem_claims_total{decision=\"in_flight\"}", 1.0),
        ("idem_claims_total{decision=\"outcome_unknown\"}", 1.0),
        ("idem_claims_total{decision=\"expired\"}", 0.0),
        ("idem_claims_total{decision=\"taken_over\"}", 0.0),
        ("idem_problems_total{type=\"key-reused\"}", 1.0),
        ("idem_problems_total{type=\"missing-key\"}", 1.0),
        ("idem_problems_total{type=\"outcome-unknown\"}", 1.0),
        ("idem_problems_total{type=\"request-in-progress\"}", 1.0),
        ("idem_problems_total{type=\"store-unavailable\"}", 0.0),
        ("idem_completions_total{outcome=\"final\"}", 2.0),
        ("idem_completions_total{outcome=\"released\"}", 1.0),
        ("idem_completions_total{outcome=\"ambiguous\"}", 1.0),
        ("idem_marked_ambiguous_total", 1.0),
        ("idem_late_replays_total", 0.0),
        ("idem_fenced_writes_total", 0.0),
        ("idem_store_errors_total", 0.0),
        ("idem_store_seconds_count{op=\"claim\"}", 8.0),
        ("idem_store_seconds_count{op=\"complete\"}", 2.0),
        ("idem_store_seconds_count{op=\"release\"}", 1.0),
        ("idem_store_seconds_count{op=\"mark_ambiguous\"}", 1.0),
        ("idem_store_seconds_bucket{op=\"claim\",le=\"+Inf\"}", 8.0),
        ("idem_upstream_seconds_count", 4.0),
    ];
    for (series, want) in expect {
        assert_eq!(metric(&page, series), Some(want), "{series}\n{page}");
    }
    let slow_bucket = metric(&page, "idem_upstream_seconds_bucket{le=\"0.5\"}").unwrap();
    assert!(
        slow_bucket <= 3.0,
        "the 1.5 s answer is above 0.5 s\n{page}"
    );
    assert_eq!(
        metric(&page, "idem_upstream_seconds_bucket{le=\"10\"}"),
        Some(4.0)
    );
    for family in [
        "idem_claims_total",
        "idem_store_seconds",
        "idem_purged_total",
    ] {
        assert!(page.contains(&format!("# HELP {family} ")), "{family}");
        assert!(page.contains(&format!("# TYPE {family} ")), "{family}");
    }
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let (_, value) = line.rsplit_once(' ').unwrap();
        assert!(value.parse::<f64>().is_ok(), "{line}");
    }
    assert_eq!(up.effects().len(), 3, "m-1, m-2 and m-4 paid; m-3 did not");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_after_retention_is_refused_counted_and_purged_to_a_tombstone() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config =
        site.config("purge_interval_s = 1\n\n[[route]]\nretention_s = 1\ntombstone_s = 3600\n");
    let (gw, admin_addr) = Gateway::start_admin(&up.url(), &site.store(), Some(&config), TOKEN);
    let url = gw.url("/payouts");
    assert_eq!(post(&url, &[key("late-1")], PAYOUT).await.status, 201);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let late = post(&url, &[key("late-1")], PAYOUT).await;
    assert_eq!(late.status, 422, "{late:?}");
    assert_eq!(
        late.problem().as_deref(),
        Some("urn:idem:problem:key-expired")
    );
    assert_eq!(up.effects().len(), 1, "a late replay is never executed");
    assert!(
        eventually(Duration::from_secs(5), || {
            let logs = gw.logs();
            logs.contains("late replay after retention refused") && logs.contains("key=late-1")
        })
        .await,
        "{}",
        gw.logs()
    );

    let store = store_url(&site);
    let listed = idem(&["records", "list", "--format", "json", "--store", &store]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let scope = listed[0]["scope"].as_str().unwrap().to_owned();
    let show = || {
        let out = idem(&[
            "records", "show", &scope, "late-1", "--format", "json", "--store", &store,
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let purged = eventually(Duration::from_secs(10), || show()["result"].is_null()).await;
    assert!(
        purged,
        "the purge dropped the result: {}\n{}",
        show(),
        gw.logs()
    );
    let record = show();
    assert_eq!(record["state"], "tombstone");
    assert!(
        record["completed_at"].is_string(),
        "the tombstone keeps the completion time"
    );
    assert!(gw.logs().contains("retention purge"), "{}", gw.logs());

    let page = admin("GET", admin_addr, "/metrics", "").await.body;
    let expect = [
        ("idem_late_replays_total", 1.0),
        ("idem_claims_total{decision=\"expired\"}", 1.0),
        ("idem_problems_total{type=\"key-expired\"}", 1.0),
        ("idem_purged_total{what=\"tombstoned\"}", 1.0),
        ("idem_purged_total{what=\"deleted\"}", 0.0),
    ];
    for (series, want) in expect {
        assert_eq!(metric(&page, series), Some(want), "{series}\n{page}");
    }
    // Still refused after the purge, and the purge stops with the gateway.
    let after = post(&url, &[key("late-1")], PAYOUT).await;
    assert_eq!(
        after.problem().as_deref(),
        Some("urn:idem:problem:key-expired")
    );
    assert_eq!(up.effects().len(), 1);
    let status = tokio::task::spawn_blocking(move || gw.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// A gateway with `region = "eu"` writes its region on every record it
/// acquires, and operators see it in the admin API and in `idem records
/// show` and `list`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_shows_the_region_of_the_gateway_that_acquired_it() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = site.config("region = \"eu\"\n\n[[route]]\n");
    let (gw, admin_addr) = Gateway::start_admin(&up.url(), &site.store(), Some(&config), TOKEN);
    let first = post(&gw.url("/payouts"), &[key("r-1")], PAYOUT).await;
    assert_eq!(first.status, 201, "{first:?}");

    let listed = admin("GET", admin_addr, "/records?limit=10", "").await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let page = json(&listed);
    let records = page["records"].as_array().unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["key"], "r-1");
    assert_eq!(records[0]["region"], "eu", "the admin API names the region");
    let scope = records[0]["scope"].as_str().unwrap().to_owned();

    let store = store_url(&site);
    let shown = idem(&[
        "records", "show", &scope, "r-1", "--format", "json", "--store", &store,
    ]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    let record: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(record["region"], "eu", "records show --format json");
    let shown = idem(&["records", "show", &scope, "r-1", "--store", &store]);
    let shown = text(&shown.stdout);
    assert!(
        shown
            .lines()
            .any(|l| l.split_whitespace().eq(["region", "eu"])),
        "records show names the region:\n{shown}"
    );
    let listed = idem(&["records", "list", "--store", &store]);
    let listed = text(&listed.stdout);
    let header: Vec<&str> = listed.lines().next().unwrap().split_whitespace().collect();
    let row: Vec<&str> = listed.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(header.last(), Some(&"REGION"), "{listed}");
    assert_eq!(row.last(), Some(&"eu"), "{listed}");
    drop(gw);
}

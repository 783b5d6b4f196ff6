//! The admin API in-process, over a memory store: authentication first,
//! then every endpoint and every refusal.

use std::sync::Arc;

use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, ManualClock, MemoryStore, Policy, RecordId,
    Scope, Store, Token,
};
use idem_http::Metrics;
use tower::ServiceExt;

use super::*;

const TOKEN: &str = "0123456789abcdef-admin";

struct Fixture {
    clock: ManualClock,
    store: Arc<MemoryStore>,
    metrics: Arc<Metrics>,
    app: axum::Router,
}

fn fixture() -> Fixture {
    fixture_of(Operators::from(AdminToken::new(TOKEN).unwrap()))
}

fn fixture_of(operators: Operators) -> Fixture {
    // The views are judged at the wall clock's now: start there.
    let clock = ManualClock::new(idem_core::SystemClock.now());
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let metrics = Arc::new(Metrics::new());
    let app = router(
        store.clone(),
        metrics.clone(),
        operators,
        RefusalLog::default(),
    );
    Fixture {
        clock,
        store,
        metrics,
        app,
    }
}

fn id(scope: &str, key: &str) -> RecordId {
    RecordId {
        scope: Scope::new(scope).unwrap(),
        key: IdempotencyKey::parse(key).unwrap(),
    }
}

/// An ambiguous record: acquired, then its outcome unknown. Returns its token.
async fn ambiguous(store: &MemoryStore, id: &RecordId) -> Token {
    let req = ClaimRequest {
        id: id.clone(),
        fingerprint: Fingerprint::from_bytes([3; 32]),
        legacy_fingerprint: None,
        owner: "gw-1".into(),
        region: None,
        policy: Policy::DEFAULT,
    };
    let Claim::Acquired { token, .. } = store.claim(&req).await.unwrap() else {
        panic!("fresh key");
    };
    store.mark_ambiguous(id, token).await.unwrap();
    token
}

/// (status, content-type, body)
async fn send(
    app: &axum::Router,
    method: &str,
    uri: &str,
    auth: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(auth) = auth {
        req = req.header("authorization", auth);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let ct = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, ct, String::from_utf8_lossy(&bytes).into_owned())
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

fn problem_type(body: &str) -> String {
    let doc: serde_json::Value = serde_json::from_str(body).unwrap();
    doc["type"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn every_endpoint_needs_the_exact_token() {
    let f = fixture();
    let wrong = [
        None,
        Some("".to_owned()),
        Some(TOKEN.to_owned()),
        Some(format!("Basic {TOKEN}")),
        Some("Bearer 0123456789abcdef-admiN".to_owned()),
        Some("Bearer 0123456789abcdef-admin-and-more".to_owned()),
        Some("Bearer 0123456789abcdef".to_owned()),
        Some("Bearer ".to_owned()),
    ];
    for path in ["/metrics", "/records", "/records/a/b", "/nowhere"] {
        for auth in &wrong {
            let (status, ct, body) = send(&f.app, "GET", path, auth.as_deref(), "").await;
            assert_eq!(status, 401, "{path} {auth:?}");
            assert_eq!(ct, "application/problem+json");
            assert_eq!(problem_type(&body), "urn:idem:problem:unauthorized");
        }
    }
    let lower = format!("bearer {TOKEN}");
    let (status, ct, body) = send(&f.app, "GET", "/metrics", Some(&lower), "").await;
    assert_eq!((status, ct.as_str()), (200, METRICS_CONTENT_TYPE));
    assert!(body.contains("# TYPE idem_claims_total counter"));
}

#[tokio::test]
async fn lists_shows_and_resolves_records() {
    let f = fixture();
    let (scope, key) = ("POST /payouts|anonymous", "p/1 x");
    let rid = id(scope, "p/1x");
    let token = ambiguous(&f.store, &rid).await;
    let auth = bearer();
    let auth = Some(auth.as_str());

    let (status, _, body) =
        send(&f.app, "GET", "/records?state=ambiguous&limit=10", auth, "").await;
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    let list = &page["records"];
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["key"], "p/1x");
    assert_eq!(list[0]["state"], "ambiguous");
    assert_eq!(page["damaged"], serde_json::json!([]));
    assert_eq!(page["next"], serde_json::Value::Null);

    let path = "/records/POST%20%2Fpayouts%7Canonymous/p%2F1x";
    let (status, _, body) = send(&f.app, "GET", path, auth, "").await;
    assert_eq!(status, 200, "{body}");
    let shown: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (shown["scope"].as_str(), shown["owner"].as_str()),
        (Some(scope), Some("gw-1"))
    );
    let _ = key;

    let resolve = format!("{path}/resolve");
    let body = r#"{"outcome":"completed","status":201,"headers":[["content-type","application/json"]],"body":"{\"payout\":7}","reason":"provider shows payout 7"}"#;
    let stale = format!("{{\"token\":{},{}", token.0 + 1, &body[1..]);
    let (status, _, answer) = send(&f.app, "POST", &resolve, auth, &stale).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(problem_type(&answer), "urn:idem:problem:other-attempt");
    let body = format!("{{\"token\":{},{}", token.0, &body[1..]);
    let body = body.as_str();
    let (status, _, answer) = send(&f.app, "POST", &resolve, auth, body).await;
    assert_eq!(status, 200, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["outcome"], "completed");
    assert_eq!(
        answer["by"], "operator:admin",
        "the single token is operator admin"
    );
    assert_eq!(answer["record"]["state"], "completed");
    assert_eq!(answer["record"]["result"]["body"], "{\"payout\":7}");
    assert_eq!(
        answer["record"]["resolution"]["reason"],
        "provider shows payout 7"
    );
    assert!(
        f.metrics
            .render()
            .contains("idem_resolutions_total{by=\"operator\",outcome=\"completed\"} 1\n")
    );

    let (status, _, again) = send(&f.app, "POST", &resolve, auth, body).await;
    assert_eq!(status, 409, "{again}");
    assert_eq!(problem_type(&again), "urn:idem:problem:not-ambiguous");
    assert!(again.contains("this one is completed"), "{again}");

    let other = id(scope, "p-2");
    let token = ambiguous(&f.store, &other).await;
    let not_executed = format!(
        r#"{{"token":{},"outcome":"not_executed","reason":"not in the provider's ledger"}}"#,
        token.0
    );
    let path = "/records/POST%20%2Fpayouts%7Canonymous/p-2/resolve";
    let (status, _, answer) = send(&f.app, "POST", path, auth, &not_executed).await;
    assert_eq!(status, 409, "while the lease runs: {answer}");
    assert_eq!(problem_type(&answer), "urn:idem:problem:may-still-commit");
    f.clock.advance_millis(Policy::DEFAULT.lease_ms());
    let (status, _, answer) = send(&f.app, "POST", path, auth, &not_executed).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"record\":null"), "{answer}");
    assert_eq!(f.store.get(&other).await.unwrap(), None, "released");
}

#[tokio::test]
async fn refusals_are_problems_that_say_what_to_fix() {
    let f = fixture();
    ambiguous(&f.store, &id("s", "k")).await;
    let auth = bearer();
    let auth = Some(auth.as_str());
    let cases: [(&str, &str, &str, u16, &str, &str); 18] = [
        (
            "GET",
            "/records?after_scope=a%2&after_key=k",
            "",
            400,
            "invalid-request",
            "query parameter `after_scope` \"a%2\" has a %",
        ),
        (
            "GET",
            "/records?after_scope=%ff&after_key=k",
            "",
            400,
            "invalid-request",
            "query parameter `after_scope` \"%ff\" is not UTF-8",
        ),
        (
            "GET",
            "/records?state=ambiguous&state=completed",
            "",
            400,
            "invalid-request",
            "duplicate field `state`",
        ),
        (
            "GET",
            "/records/s%ff/k",
            "",
            400,
            "invalid-request",
            "path segment scope \"s%ff\" is not UTF-8",
        ),
        (
            "POST",
            "/records/%/k/resolve",
            "{}",
            400,
            "invalid-request",
            "path segment scope \"%\" has a %",
        ),
        (
            "GET",
            "/records?state=done",
            "",
            400,
            "invalid-request",
            "query parameter `state`",
        ),
        (
            "GET",
            "/records?limit=0",
            "",
            400,
            "invalid-request",
            "query parameter `limit`",
        ),
        (
            "GET",
            "/records?sort=key",
            "",
            400,
            "invalid-request",
            "query parameter `sort` is unknown",
        ),
        (
            "GET",
            "/records?after_key=k",
            "",
            400,
            "invalid-request",
            "go together",
        ),
        (
            "GET",
            "/records/s/k%2",
            "",
            400,
            "invalid-request",
            "path segment key",
        ),
        (
            "GET",
            "/records/s/bad%20key",
            "",
            400,
            "invalid-request",
            "path segment key \"bad key\"",
        ),
        (
            "GET",
            "/records/s/nope",
            "",
            404,
            "record-not-found",
            "no record for scope \"s\" key \"nope\"",
        ),
        (
            "POST",
            "/records/s/nope/resolve",
            r#"{"token":1,"outcome":"not_executed","reason":"r"}"#,
            404,
            "record-not-found",
            "no record",
        ),
        (
            "POST",
            "/records/s/k/resolve",
            "{\"outcome\":",
            400,
            "invalid-request",
            "not valid JSON",
        ),
        (
            "POST",
            "/records/s/k/resolve",
            r#"{"token":1,"outcome":"completed","reason":"r","status":42}"#,
            400,
            "invalid-request",
            "field `status`",
        ),
        (
            "DELETE",
            "/records/s/k",
            "",
            405,
            "method-not-allowed",
            "use GET",
        ),
        (
            "GET",
            "/records/s/k/resolve",
            "",
            405,
            "method-not-allowed",
            "use POST",
        ),
        ("GET", "/", "", 404, "not-found", "GET /records"),
    ];
    for (method, path, body, status, slug, detail) in cases {
        let (got, ct, text) = send(&f.app, method, path, auth, body).await;
        assert_eq!(got, status, "{method} {path}: {text}");
        assert_eq!(ct, "application/problem+json", "{method} {path}");
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["type"], format!("urn:idem:problem:{slug}"));
        assert_eq!(doc["status"], status);
        let said = doc["detail"].as_str().unwrap();
        assert!(said.contains(detail), "{method} {path}: {said}");
    }
    // Refused resolutions changed nothing.
    let record = f.store.get(&id("s", "k")).await.unwrap().unwrap();
    assert_eq!(record.state, idem_core::State::Ambiguous);
}

#[test]
fn escapes_are_checked_strictly() {
    let cases = [
        ("abc", Ok(())),
        ("a%20b%7Cc", Ok(())),
        ("a+b", Ok(())),
        ("%e2%82%ac", Ok(())),
        ("%", Err("not followed by two hex digits")),
        ("%+1", Err("not followed by two hex digits")),
        ("a%2", Err("not followed by two hex digits")),
        ("%ff", Err("not UTF-8")),
    ];
    for (raw, want) in cases {
        match (extract::strict_escapes(raw), want) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(part)) => assert!(e.contains(part), "{raw}: {e}"),
            (got, want) => panic!("{raw}: got {got:?}, want {want:?}"),
        }
    }
}

/// Keys and scopes that need escaping reach the record they name through
/// the router: axum decodes `%2F` inside a segment, and keeps `+`.
#[tokio::test]
async fn escaped_segments_address_the_right_record() {
    let f = fixture();
    let auth = bearer();
    let auth = Some(auth.as_str());
    let cases = [
        ("POST /a|t", "a/b", "/records/POST%20%2Fa%7Ct/a%2Fb"),
        ("s", "\"q\"", "/records/s/%22q%22"),
        ("s", "a\\b", "/records/s/a%5Cb"),
        ("s", "a+b", "/records/s/a+b"),
        ("s", "c+d", "/records/s/c%2Bd"),
        ("s p", "%41", "/records/s%20p/%2541"),
    ];
    for (scope, key, _) in cases {
        let rid = RecordId {
            scope: Scope::new(scope).unwrap(),
            key: IdempotencyKey::new(key).unwrap(),
        };
        ambiguous(&f.store, &rid).await;
    }
    for (scope, key, path) in cases {
        let (status, _, body) = send(&f.app, "GET", path, auth, "").await;
        assert_eq!(status, 200, "{path}: {body}");
        let shown: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (shown["scope"].as_str(), shown["key"].as_str()),
            (Some(scope), Some(key)),
            "{path}"
        );
    }
    // `+` is a plus in a path, not a space.
    let (status, _, body) = send(&f.app, "GET", "/records/s%20p/a%20b", auth, "").await;
    assert_eq!(status, 400, "{body}");
    // In a query, `+` is a space.
    let (status, _, body) = send(
        &f.app,
        "GET",
        "/records?after_scope=s+p&after_key=%41",
        auth,
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page["records"].as_array().map(Vec::len), Some(0), "{body}");
}

#[tokio::test]
async fn refusals_carry_their_headers_and_bodies_are_bounded() {
    let f = fixture();
    let auth = bearer();
    let req = |method: &str, uri: &str, body: Body| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", &auth)
            .body(body)
            .unwrap()
    };
    let cases = [
        ("DELETE", "/records/s/k", "GET, HEAD"),
        ("POST", "/metrics", "GET, HEAD"),
        ("GET", "/records/s/k/resolve", "POST"),
    ];
    for (method, uri, allow) in cases {
        let res = f
            .app
            .clone()
            .oneshot(req(method, uri, Body::empty()))
            .await
            .unwrap();
        assert_eq!(res.status(), 405, "{method} {uri}");
        assert_eq!(res.headers()["allow"], allow, "{method} {uri}");
    }
    let res = f
        .app
        .clone()
        .oneshot(Request::get("/nowhere").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        res.headers()["www-authenticate"],
        "Bearer realm=\"idem-admin\""
    );

    let big = Body::from(vec![b' '; ADMIN_BODY_BYTES_MAX + 1]);
    let res = f
        .app
        .clone()
        .oneshot(req("POST", "/records/s/k/resolve", big))
        .await
        .unwrap();
    assert_eq!(res.status(), 413);
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(doc["type"], "urn:idem:problem:body-too-large");
    assert_eq!(doc["title"], "Request body is too large");
    // Just under the bound, the body is read (and refused as JSON).
    let fits = Body::from(vec![b' '; ADMIN_BODY_BYTES_MAX]);
    let res = f
        .app
        .clone()
        .oneshot(req("POST", "/records/s/k/resolve", fits))
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
}

/// A router merged or nested beside the admin API is outside its token
/// check, while every admin path and the fallback stay behind it.
#[tokio::test]
async fn routers_mounted_beside_it_authenticate_by_themselves() {
    let f = fixture();
    let ui = axum::Router::new().route("/ui", axum::routing::get(|| async { "console" }));
    let nested = axum::Router::new().route("/", axum::routing::get(|| async { "nested" }));
    let app = f.app.clone().merge(ui).nest("/console", nested);
    for (path, status) in [
        ("/ui", 200),
        ("/console", 200),
        ("/records", 401),
        ("/nowhere", 401),
        ("/records/s/k/resolve", 401),
    ] {
        let (got, _, body) = send(&app, "GET", path, None, "").await;
        assert_eq!(got, status, "{path}: {body}");
    }
    let auth = bearer();
    let (got, _, body) = send(&app, "GET", "/nowhere", Some(&auth), "").await;
    assert_eq!(
        (got, problem_type(&body).as_str()),
        (404, "urn:idem:problem:not-found")
    );
}

/// Without the token every method on every path gets the same answer,
/// byte for byte: no `Allow`, no other status, nothing that tells which
/// paths or methods exist.
#[tokio::test]
async fn every_refusal_without_the_token_is_the_same() {
    let f = fixture();
    let ui = axum::Router::new().route("/ui", axum::routing::get(|| async { "console" }));
    let app = f.app.clone().merge(ui);
    let long = format!("/records/{}", "k".repeat(60_000));
    let methods = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH",
    ];
    let paths = [
        "/metrics",
        "/records",
        "/records/",
        "//records",
        "/records//",
        "/records/s/k",
        "/records/s/k/",
        "/records%2Fs%2Fk",
        "/records/s/k/resolve",
        "/./records",
        "/nowhere",
        long.as_str(),
    ];
    let mut answers = std::collections::BTreeMap::new();
    for method in methods {
        for path in paths {
            let req = Request::builder().method(method).uri(path);
            let res = app
                .clone()
                .oneshot(req.body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = res.status().as_u16();
            let headers: Vec<String> = res
                .headers()
                .iter()
                .filter(|(name, _)| *name != "content-length")
                .map(|(name, value)| format!("{name}: {value:?}"))
                .collect();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            let body = if method == "HEAD" { None } else { Some(body) };
            let shown = format!("{method} {:.40}", path);
            answers
                .entry((status, headers, body.is_some()))
                .or_insert_with(Vec::new)
                .push(shown);
            if let Some(body) = body {
                assert_eq!(
                    problem_type(std::str::from_utf8(&body).unwrap()),
                    "urn:idem:problem:unauthorized"
                );
            }
        }
    }
    // One answer with a body and the same without (HEAD).
    assert_eq!(answers.len(), 2, "{answers:#?}");
    assert!(
        answers.keys().all(|(status, _, _)| *status == 401),
        "{answers:#?}"
    );
}

#[test]
fn tokens_are_compared_whole() {
    let token = AdminToken::new("0123456789abcdef").unwrap();
    assert!(token.matches(b"0123456789abcdef"));
    for other in [
        &b""[..],
        b"0123456789abcde",
        b"0123456789abcdeF",
        b"0123456789abcdef0",
    ] {
        assert!(!token.matches(other), "{other:?}");
    }
    assert_eq!(format!("{token:?}"), "AdminToken(***)");
}

#[test]
fn refused_paths_are_logged_cut_to_a_bound() {
    let long = "/".repeat(60_000);
    let wide = format!("/{}", "é".repeat(200));
    let cases: [(&str, String); 3] = [
        ("/records", "/records".to_owned()),
        (&long, format!("{}… (60000 bytes)", "/".repeat(256))),
        // 'é' is two bytes: the cut falls back to the boundary before it.
        (&wide, format!("/{}… (401 bytes)", "é".repeat(127))),
    ];
    for (path, expected) in cases {
        assert_eq!(super::logged_path(path), expected);
    }
}

#[tokio::test]
async fn the_suspect_window_is_shown_open_and_then_closed() {
    let f = fixture();
    let (status, _, body) = send(&f.app, "GET", "/window", Some(&bearer()), "").await;
    assert_eq!((status, body.as_str()), (200, r#"{"window":null}"#));
    let opening = idem_core::WindowOpening {
        length_ms: 90_000,
        since: Some(f.clock.now()),
        cause: "restored <from> a backup".into(),
    };
    f.store.open_suspect_window(&opening).await.unwrap();
    let (status, _, body) = send(&f.app, "GET", "/window", Some(&bearer()), "").await;
    assert_eq!(status, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let w = &doc["window"];
    assert_eq!(w["open"], true, "{body}");
    assert_eq!(w["cause"], "restored <from> a backup");
    assert_eq!(w["version"], 1);
    assert!(w["closes_in_s"].as_u64().unwrap() <= 90, "{body}");
    assert!(w["since"].is_string(), "{body}");
    // Closed once its time has passed, by the wall clock the view uses: a
    // window the store opened two hours ago for a minute.
    let f = fixture();
    f.clock.set(idem_core::Timestamp::from_millis(
        f.clock.now().as_millis() - 7_200_000,
    ));
    f.store
        .open_suspect_window(&idem_core::WindowOpening {
            length_ms: 60_000,
            since: None,
            cause: "short".into(),
        })
        .await
        .unwrap();
    let (_, _, body) = send(&f.app, "GET", "/window", Some(&bearer()), "").await;
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["window"]["open"], false, "{body}");
    assert_eq!(doc["window"]["closes_in_s"], 0, "{body}");
    let (status, _, _) = send(&f.app, "GET", "/window", None, "").await;
    assert_eq!(status, 401, "the window needs the token");
}

/// Each verb's refusals, table-driven, then each applied once: a refusal
/// changes nothing and journals nothing; an applied verb journals exactly
/// one entry under the admin API's name.
#[tokio::test]
async fn verbs_are_refused_or_applied_and_journaled_once() {
    let f = fixture();
    let auth = bearer();
    let auth = Some(auth.as_str());
    let unsure = id("s", "unsure");
    let unsure_token = ambiguous(&f.store, &unsure).await;
    let done = id("s", "done");
    let req = ClaimRequest {
        id: done.clone(),
        fingerprint: Fingerprint::from_bytes([4; 32]),
        legacy_fingerprint: None,
        owner: "gw-1".into(),
        region: None,
        policy: Policy::DEFAULT,
    };
    let Claim::Acquired { token, .. } = f.store.claim(&req).await.unwrap() else {
        panic!("fresh key");
    };
    let result = idem_core::StoredResult::new(201, vec![], b"{\"payout\":1}".to_vec()).unwrap();
    f.store.complete(&done, token, result).await.unwrap();
    let body = |token: Token| format!(r#"{{"token":{},"reason":"ticket 7"}}"#, token.0);
    // (verb, key, token, status, problem type)
    let refusals = [
        ("expire", "unsure", unsure_token, 409, "not-completed"),
        ("evict", "unsure", unsure_token, 409, "may-still-commit"),
        ("expire", "done", Token(token.0 + 1), 409, "other-attempt"),
        ("evict", "done", Token(token.0 + 1), 409, "other-attempt"),
        ("evict", "missing", token, 404, "record-not-found"),
    ];
    for (verb, key, presented, status, kind) in refusals {
        let path = format!("/records/s/{key}/{verb}");
        let (got, _, answer) = send(&f.app, "POST", &path, auth, &body(presented)).await;
        assert_eq!(got, status, "{verb} {key}: {answer}");
        assert_eq!(problem_type(&answer), format!("urn:idem:problem:{kind}"));
    }
    for id in [&unsure, &done] {
        assert_eq!(f.store.resolutions(id).await.unwrap(), [], "{id} journaled");
    }
    let (got, _, answer) = send(&f.app, "GET", "/records/s/done/expire", auth, "").await;
    assert_eq!(got, 405, "{answer}");

    let (got, _, answer) = send(&f.app, "POST", "/records/s/done/expire", auth, &body(token)).await;
    assert_eq!(got, 200, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["verb"], "expire");
    assert_eq!(answer["record"]["state"], "tombstone");
    f.clock.advance_millis(Policy::DEFAULT.lease_ms());
    for (key, state) in [("done", "tombstone"), ("unsure", "ambiguous")] {
        let held = if key == "done" { token } else { unsure_token };
        let path = format!("/records/s/{key}/evict");
        let (got, _, answer) = send(&f.app, "POST", &path, auth, &body(held)).await;
        assert_eq!(got, 200, "evict of a record {state}: {answer}");
        assert!(answer.contains("\"record\":null"), "{answer}");
    }
    let journal = f.store.resolutions(&done).await.unwrap();
    let seen: Vec<_> = journal.iter().map(|e| (e.verb, e.by.as_str())).collect();
    let by = OperatorName::new(ADMIN_OPERATOR).unwrap().by();
    let by = by.as_str();
    assert_eq!(seen, [(Some(Verb::Expire), by), (Some(Verb::Evict), by)]);
    let journal = f.store.resolutions(&unsure).await.unwrap();
    assert_eq!(journal.len(), 1, "{journal:?}");
    assert_eq!(journal[0].outcome, idem_core::Resolved::NotExecuted);
}

/// Each operator's token, or the trusted proxy's header where one is
/// configured, journals the resolution under that operator's name; a
/// header is worth nothing where none is configured, nor behind a wrong
/// token, nor on a change another site's page could have sent.
#[tokio::test]
async fn resolutions_are_journaled_under_the_operators_name() {
    let name = |n: &str| OperatorName::new(n).unwrap();
    let header = http::HeaderName::from_static("x-forwarded-user");
    let named = vec![
        (
            name("ana"),
            AdminToken::new("ana-0123456789abcdef").unwrap(),
        ),
        (name("bo"), AdminToken::new("bo-0123456789abcdef").unwrap()),
    ];
    const JSON: &[(&str, &str)] = &[("content-type", "application/json")];
    const PLAIN: &[(&str, &str)] = &[("content-type", "text/plain")];
    const CROSS_SITE: &[(&str, &str)] = &[
        ("content-type", "application/json"),
        ("sec-fetch-site", "cross-site"),
    ];
    let ana = "Bearer ana-0123456789abcdef";
    let carla = Some("carla@example.com");
    // (header configured, Authorization, the header's value, other
    // headers, the operator journaled or None for a 401)
    let cases = [
        (Some(header.clone()), ana, None, &[][..], Some("ana")),
        (
            Some(header.clone()),
            "Bearer bo-0123456789abcdef",
            None,
            &[],
            Some("bo"),
        ),
        (
            Some(header.clone()),
            "",
            carla,
            JSON,
            Some("carla@example.com"),
        ),
        (Some(header.clone()), "", Some("not a name"), JSON, None),
        (None, "", Some("carla"), JSON, None),
        (None, ana, Some("carla"), &[], Some("ana")),
        // What another site's page can make the operator's browser send
        // through the proxy: a body that is no JSON (no preflight stops
        // it), or one the browser says came from elsewhere.
        (Some(header.clone()), "", carla, &[], None),
        (Some(header.clone()), "", carla, PLAIN, None),
        (Some(header.clone()), "", carla, CROSS_SITE, None),
        // A wrong token is refused, not passed on to the header; a right
        // one needs no JSON (no browser adds it by itself).
        (
            Some(header.clone()),
            "Bearer wrong-0123456789abcdef",
            carla,
            JSON,
            None,
        ),
        (Some(header.clone()), ana, carla, PLAIN, Some("ana")),
    ];
    for (configured, auth, forwarded_user, extra, want) in cases {
        let f = fixture_of(Operators::new(named.clone(), configured.clone()).unwrap());
        let rid = id("payouts|aa11", "k-1");
        let token = ambiguous(&f.store, &rid).await;
        let mut req = Request::builder()
            .method("POST")
            .uri("/records/payouts%7Caa11/k-1/resolve");
        if !auth.is_empty() {
            req = req.header("authorization", auth);
        }
        if let Some(user) = forwarded_user {
            req = req.header("x-forwarded-user", user);
        }
        for (name, value) in extra {
            req = req.header(*name, *value);
        }
        let body = format!(
            r#"{{"token":{},"outcome":"completed","reason":"seen at the provider"}}"#,
            token.0
        );
        let res = f
            .app
            .clone()
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = res.status().as_u16();
        let case = format!("{configured:?} {auth:?} {forwarded_user:?} {extra:?}");
        match want {
            Some(operator) => {
                assert_eq!(status, 200, "{case}");
                let journal = f.store.resolutions(&rid).await.unwrap();
                assert_eq!(journal.len(), 1, "{case}");
                assert_eq!(journal[0].by, format!("operator:{operator}"), "{case}");
            }
            None => {
                assert_eq!(status, 401, "{case}");
                assert!(
                    f.store.resolutions(&rid).await.unwrap().is_empty(),
                    "{case}"
                );
            }
        }
    }
}

//! Problem types that dereference and refusals in a client's dialect,
//! black-box through `idem serve`: with `problem_type_base` every problem's
//! `type` is the base and its slug, an anchor of docs/problems.md; a route
//! with `error_dialect = "stripe"` answers Stripe's error object (400 for a
//! reused key, 409 kept for a key in flight), its status URL's refusals
//! alike, and a mistaken setting is refused naming its field.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::path::Path;

use support::{Gateway, Site, Upstream, eventually, key, post};

const BASE: &str = "https://docs.example.com/idem/problems#";

fn config(site: &Site) -> std::path::PathBuf {
    site.config(&format!(
        "problem_type_base = \"{BASE}\"\nresponse_timeout_ms = 5000\n\n\
         [[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/payouts\"\n\n\
         [[route]]\nname = \"charges\"\nmethods = [\"POST\"]\npath = \"/slow-before\"\n\
         error_dialect = \"stripe\"\n"
    ))
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn problem_types_take_the_configured_base_and_a_route_may_answer_in_stripe_s_dialect() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config(&site)));
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/problems.md"),
    )
    .unwrap();

    // RFC 9457 on the default route, its type under the configured base,
    // pointing at an anchor of docs/problems.md.
    let url = gw.url("/payouts");
    assert_eq!(
        post(&url, &[key("p-1")], r#"{"amount":1}"#).await.status,
        201
    );
    let reused = post(&url, &[key("p-1")], r#"{"amount":2}"#).await;
    assert_eq!(reused.status, 422, "{reused:?}");
    assert_eq!(
        reused.header("content-type"),
        Some("application/problem+json")
    );
    let doc = json(&reused.body);
    assert_eq!(doc["type"], format!("{BASE}key-reused"));
    assert_eq!(doc["title"], "Idempotency-Key is already used");
    let anchor = doc["type"].as_str().unwrap().strip_prefix(BASE).unwrap();
    assert!(
        page.contains(&format!("<a id=\"{anchor}\"></a>")),
        "{anchor}"
    );
    let missing = post(&url, &[], r#"{"amount":1}"#).await;
    assert_eq!(json(&missing.body)["type"], format!("{BASE}missing-key"));
    // The status URL's refusals are the route's too: under the base here,
    // in Stripe's shape on the route that declares it.
    let asked = support::send("GET", &gw.url("/payouts/.idem/never"), &[], "").await;
    assert_eq!(asked.status, 404, "{asked:?}");
    assert_eq!(json(&asked.body)["type"], format!("{BASE}key-unknown"));
    let asked = support::send("GET", &gw.url("/slow-before/.idem/never"), &[], "").await;
    assert_eq!(asked.status, 404, "{asked:?}");
    assert_eq!(
        json(&asked.body)["error"]["code"],
        "key-unknown",
        "{asked:?}"
    );

    // Stripe's error object on the route that declares it.
    let url = gw.url("/slow-before?ms=1500");
    let hits = up.hits();
    let first = {
        let url = url.clone();
        tokio::spawn(async move { post(&url, &[key("c-1")], r#"{"amount":1}"#).await })
    };
    let limit = std::time::Duration::from_secs(10);
    assert!(
        eventually(limit, || up.hits() > hits).await,
        "the attempt runs"
    );
    let in_flight = post(&url, &[key("c-1")], r#"{"amount":1}"#).await;
    assert_eq!(in_flight.status, 409, "{in_flight:?}");
    assert_eq!(in_flight.header("content-type"), Some("application/json"));
    assert!(in_flight.header("retry-after").is_some(), "{in_flight:?}");
    let error = &json(&in_flight.body)["error"];
    assert_eq!(error["type"], "idempotency_error", "{in_flight:?}");
    assert_eq!(error["code"], "request-in-progress");
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert_eq!(first.await.unwrap().status, 201);
    let reused = post(&url, &[key("c-1")], r#"{"amount":2}"#).await;
    assert_eq!(
        reused.status, 400,
        "Stripe answers a reused key 400: {reused:?}"
    );
    assert_eq!(reused.header("content-type"), Some("application/json"));
    let body = json(&reused.body);
    assert_eq!(
        (&body["error"]["type"], &body["error"]["code"]),
        (
            &serde_json::json!("idempotency_error"),
            &serde_json::json!("key-reused")
        ),
        "{body}"
    );
    assert!(body.get("type").is_none(), "no problem members: {body}");
    assert_eq!(
        up.effects()
            .iter()
            .filter(|e| e.key.as_deref() == Some("c-1"))
            .count(),
        1
    );
}

#[test]
fn a_bad_problem_type_base_or_dialect_is_refused_naming_the_field() {
    let site = Site::new();
    let cases = [
        (
            "problem_type_base = \"docs example\"\n[[route]]\npath = \"/p\"\n",
            "problem_type_base",
        ),
        (
            "[[route]]\npath = \"/p\"\nerror_dialect = \"paypal\"\n",
            "route[0].error_dialect",
        ),
    ];
    for (text_, field) in cases {
        let config = site.config(text_);
        let store = format!("sqlite://{}", site.store().display());
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "http://127.0.0.1:9",
            ])
            .args(["--store", &store, "--config", config.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("{text_}: idem serve started");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut said = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut said).unwrap();
        assert!(!status.success(), "{text_}: {said}");
        assert!(
            said.contains(&format!("idem.toml: {field}")),
            "{field}: {said}"
        );
    }
}

//! A replay is the answer that was given: header values that are not UTF-8
//! (obs-text bytes HTTP allows, such as 0xE9) come back byte for byte from
//! the real `idem serve` on SQLite and on PostgreSQL, and are shown escaped,
//! never dropped, by `idem records show`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a failed test

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use support::{Gateway, PgSchema, Site, client, idem, text};

/// The headers the upstream answers with: names and raw value bytes, in
/// order. `x-payout-ref` twice, to show order and repeats are kept too.
const ANSWERED: [(&str, &[u8]); 6] = [
    ("content-type", b"text/plain; name=\"caf\xe9\""),
    ("location", b"/payouts/caf\xe9"),
    ("x-payout-ref", b"r\xe9f\t\xff end"),
    ("x-payout-ref", b"second \x80"),
    ("x-note", "naïve".as_bytes()),
    ("x-empty-ish", b"\xe9"),
];

const CONFIG: &str = r#"
[[route]]
name = "raw"
methods = ["POST"]
path = "/raw"
replay_headers = ["x-payout-ref", "x-note", "x-empty-ish"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_header_values_replay_byte_for_byte_on_sqlite() {
    let (upstream, hits) = start_upstream().await;
    let site = Site::new();
    let config = site.config(CONFIG);
    let gw = Gateway::start(&upstream, &site.store(), Some(&config));
    replays_byte_for_byte(&gw, &hits, "bytes-sqlite").await;
    let store = format!("sqlite://{}", site.store().display());
    shown_escaped(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_header_values_replay_byte_for_byte_on_postgres() {
    let (upstream, hits) = start_upstream().await;
    let (site, schema) = (Site::new(), PgSchema::new("header_bytes"));
    let config = site.config(CONFIG);
    let gw = Gateway::start_url(&upstream, &schema.store_url(), Some(&config));
    replays_byte_for_byte(&gw, &hits, "bytes-postgres").await;
    shown_escaped(&schema.store_url());
}

/// The first answer and its replay carry the upstream's exact header bytes;
/// the upstream ran once.
async fn replays_byte_for_byte(gw: &Gateway, hits: &AtomicUsize, key: &str) {
    let first = raw_post(gw, key).await;
    assert_eq!(first.0, StatusCode::CREATED);
    assert_eq!(answered(&first.1), want(), "the first answer");
    let replay = raw_post(gw, key).await;
    assert_eq!(replay.0, StatusCode::CREATED);
    assert_eq!(
        replay.1.iter().find(|(n, _)| n == "idempotent-replayed"),
        Some(&("idempotent-replayed".to_owned(), b"true".to_vec())),
        "{:?}",
        replay.1
    );
    assert_eq!(answered(&replay.1), want(), "the replay");
    assert_eq!(replay.2, first.2, "the body");
    assert_eq!(hits.load(Ordering::SeqCst), 1, "the upstream ran once");
}

/// `idem records show` names every stored header, other bytes as `\xNN`.
fn shown_escaped(store: &str) {
    let listed = idem(&["records", "list", "--format", "json", "--store", store]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let scope = listed[0]["scope"].as_str().unwrap().to_owned();
    let key = listed[0]["key"].as_str().unwrap().to_owned();
    let out = idem(&[
        "records", "show", &scope, &key, "--format", "json", "--store", store,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let headers = &shown["result"]["headers"];
    let want = serde_json::json!([
        ["content-type", "text/plain; name=\"caf\\xe9\""],
        ["location", "/payouts/caf\\xe9"],
        ["x-payout-ref", "r\\xe9f\t\\xff end"],
        ["x-payout-ref", "second \\x80"],
        ["x-note", "naïve"],
        ["x-empty-ish", "\\xe9"],
    ]);
    assert_eq!(headers, &want, "{shown}");
    let out = idem(&["records", "show", &scope, &key, "--store", store]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("/payouts/caf\\xe9"), "{said}");
}

fn want() -> Vec<(String, Vec<u8>)> {
    ANSWERED
        .iter()
        .map(|(n, v)| ((*n).to_owned(), v.to_vec()))
        .collect()
}

/// The answered headers among `headers`, in order.
fn answered(headers: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .filter(|(n, _)| ANSWERED.iter().any(|(a, _)| a == n))
        .cloned()
        .collect()
}

/// POSTs to `/raw` with `key`: status, every header as raw bytes, body.
async fn raw_post(gw: &Gateway, key: &str) -> (StatusCode, Vec<(String, Vec<u8>)>, Vec<u8>) {
    let req = Request::post(gw.url("/raw"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from("{\"amount\":1}"))
        .unwrap();
    let response = client().request(req).await.unwrap();
    let status = response.status();
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, body.to_vec())
}

/// An upstream that answers every POST /raw with [`ANSWERED`]; counts hits.
async fn start_upstream() -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .route("/raw", axum::routing::post(answer))
        .with_state(hits.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), hits)
}

async fn answer(State(hits): State<Arc<AtomicUsize>>) -> Response {
    hits.fetch_add(1, Ordering::SeqCst);
    let mut response = (StatusCode::CREATED, "paid").into_response();
    let headers = response.headers_mut();
    headers.remove("content-type");
    for (name, value) in ANSWERED {
        headers.append(name, HeaderValue::from_bytes(value).unwrap());
    }
    response
}

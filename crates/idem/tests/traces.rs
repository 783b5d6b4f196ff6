//! Traces, black-box: `idem serve` with `OTEL_EXPORTER_OTLP_ENDPOINT` set
//! exports its spans to an OTLP/HTTP receiver in this test. The caller's
//! trace is continued, the upstream's request is a child of the forward
//! span, a malformed `traceparent` starts a new trace, the reconciler's
//! and the admin API's verdicts have spans, spans queued at SIGTERM are
//! flushed, and no credential reaches an attribute.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::IntoResponse;
use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use support::{Gateway, Site, eventually, post, segment, send};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;
const ADMIN_TOKEN: &str = "admin-token-7c1e5b9f03a2";
/// The caller's credential: the scope's principal is its digest.
const CREDENTIAL: &str = "Bearer cred-4d8a61f2be7039";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const TRACE_FAIL: &str = "0af7651916cd43dd8448eb211c80319c";

/// What the OTLP receiver got: resource attributes and spans.
#[derive(Clone, Default)]
struct Collector {
    resource: Arc<Mutex<Vec<KeyValue>>>,
    spans: Arc<Mutex<Vec<Span>>>,
}

/// One request the upstream received, with its trace headers.
#[derive(Clone, Debug)]
struct Hop {
    path: String,
    key: Option<String>,
    traceparent: Vec<String>,
    tracestate: Option<String>,
}

type Hops = Arc<Mutex<Vec<Hop>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_continue_the_callers_trace_and_parent_the_upstream() {
    let (collector, otlp, hops, upstream) = receivers().await;
    let site = Site::new();
    let (gw, admin) = start(&site, upstream, otlp);
    send_every_kind(&gw, admin, &hops).await;

    // Nothing is exported before the end (a 60 s batch delay): every span
    // below was flushed at SIGTERM.
    let early = collector.spans.lock().unwrap().len();
    assert_eq!(
        early, 0,
        "spans exported before exit: the flush goes untested"
    );
    let logs = terminate(gw);
    let spans = collector.spans.lock().unwrap().clone();
    assert!(!spans.is_empty(), "no spans flushed at exit:\n{logs}");
    let hops = hops.lock().unwrap().clone();

    check_continued_trace(&spans, &hops);
    check_new_traces(&spans, &hops);
    check_verdicts(&spans);
    check_no_secret(&spans, &collector.resource.lock().unwrap());
    let service = attr(&collector.resource.lock().unwrap(), "service.name");
    assert_eq!(service.as_deref(), Some("idem-trace-test"));
    assert!(
        !logs.contains("idem.request") && !logs.contains("idem.claim"),
        "log lines keep their shape, without span prefixes:\n{logs}"
    );
    check_log_trace_ids(&logs, &spans);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_log_lines_keep_their_shape_with_traces_on() {
    let (collector, otlp, _hops, upstream) = receivers().await;
    let site = Site::new();
    let (gw, _admin) = start_logging(&site, upstream, otlp, "text");
    let caller = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let headers = [
        ("idempotency-key", "t-text"),
        ("authorization", CREDENTIAL),
        ("traceparent", caller.as_str()),
    ];
    assert_eq!(
        post(&gw.url("/payouts"), &headers, PAYOUT).await.status,
        201
    );
    let logs = terminate(gw);
    assert!(
        !collector.spans.lock().unwrap().is_empty(),
        "traces were on: spans exported\n{logs}"
    );
    let completed = logs
        .lines()
        .find(|l| l.contains("completed") && l.contains("t-text"))
        .unwrap_or_else(|| panic!("no completed line:\n{logs}"));
    assert!(
        !completed.contains("idem.")
            && !completed.contains("trace_id")
            && !completed.starts_with('{'),
        "a text line without span prefixes or ids: {completed}"
    );
}

/// The log is JSON (`IDEM_LOG_FORMAT=json`): a line written while a
/// request was served names the request's trace and a span of it, so a
/// log backend joins the two; a line outside any request names none.
fn check_log_trace_ids(logs: &str, spans: &[Span]) {
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let of_key = |key: &str| {
        lines
            .iter()
            .find(|l| l["key"] == key && l["trace_id"].is_string())
            .unwrap_or_else(|| panic!("no line for {key} with a trace id:\n{logs}"))
    };
    let continued = of_key("t-1");
    assert_eq!(continued["trace_id"], TRACE, "{continued}");
    let span_id = continued["span_id"].as_str().unwrap();
    assert!(
        spans
            .iter()
            .any(|s| hex(&s.trace_id) == TRACE && hex(&s.span_id) == span_id),
        "{continued}: its span_id is no exported span of the trace"
    );
    let fresh = of_key("t-2");
    let fresh_trace = fresh["trace_id"].as_str().unwrap();
    assert!(
        fresh_trace.len() == 32 && fresh_trace != TRACE && fresh_trace != "0".repeat(32),
        "{fresh}"
    );
    let outside = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.contains("listening"))
        })
        .unwrap_or_else(|| panic!("no listening line:\n{logs}"));
    assert!(outside.get("trace_id").is_none(), "{outside}");
}

/// t-1 continues the caller's trace; t-2 has none; t-3…t-5 send a
/// malformed one; then the unknown outcomes.
async fn send_every_kind(gw: &Gateway, admin: SocketAddr, hops: &Hops) {
    let auth = ("authorization", CREDENTIAL);

    let caller = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let headers = [
        ("idempotency-key", "t-1"),
        auth,
        ("traceparent", caller.as_str()),
        ("tracestate", "vendor=abc"),
    ];
    assert_eq!(
        post(&gw.url("/payouts"), &headers, PAYOUT).await.status,
        201
    );
    let fresh = [("idempotency-key", "t-2"), auth];
    assert_eq!(post(&gw.url("/payouts"), &fresh, PAYOUT).await.status, 201);
    let upper = format!("00-{}-{CALLER_SPAN}-01", TRACE.to_uppercase());
    let malformed: [(&str, Vec<(&str, &str)>); 3] = [
        ("t-3", vec![("traceparent", upper.as_str())]),
        (
            "t-4",
            vec![
                ("traceparent", caller.as_str()),
                ("traceparent", caller.as_str()),
            ],
        ),
        (
            "t-5",
            vec![
                ("traceparent", caller.as_str()),
                ("connection", "traceparent"),
            ],
        ),
    ];
    for (key, extra) in &malformed {
        let mut headers = vec![("idempotency-key", *key), auth];
        headers.extend(extra.iter().copied());
        assert_eq!(
            post(&gw.url("/payouts"), &headers, PAYOUT).await.status,
            201,
            "{key}"
        );
    }
    send_unknown_outcomes(gw, admin, hops).await;
}

/// t-6 is ambiguous and resolved by the reconciler's lookup, t-7 by hand
/// through the admin API.
async fn send_unknown_outcomes(gw: &Gateway, admin: SocketAddr, hops: &Hops) {
    let auth = ("authorization", CREDENTIAL);
    // Ambiguous, then resolved by the reconciler's lookup.
    let failing = format!("00-{TRACE_FAIL}-{CALLER_SPAN}-01");
    let headers = [
        ("idempotency-key", "t-6"),
        auth,
        ("traceparent", failing.as_str()),
    ];
    assert_eq!(post(&gw.url("/fail"), &headers, PAYOUT).await.status, 500);
    let looked_up = || {
        hops.lock()
            .unwrap()
            .iter()
            .any(|h| h.path.starts_with("/lookups/"))
    };
    assert!(
        eventually(Duration::from_secs(10), looked_up).await,
        "{}",
        gw.logs()
    );
    // Ambiguous, no lookup: resolved through the admin API.
    let headers = [("idempotency-key", "t-7"), auth];
    assert_eq!(
        post(&gw.url("/fail-manual"), &headers, PAYOUT).await.status,
        500
    );
    resolve_by_hand(admin, "t-7").await;
    let mut replay = post(
        &gw.url("/fail"),
        &[("idempotency-key", "t-6"), auth],
        PAYOUT,
    )
    .await;
    for _ in 0..100 {
        if replay.status != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        replay = post(
            &gw.url("/fail"),
            &[("idempotency-key", "t-6"), auth],
            PAYOUT,
        )
        .await;
    }
    assert_eq!(
        replay.status, 200,
        "the reconciler completed t-6: {replay:?}"
    );
}

/// The caller's trace goes on through the gateway's spans to the upstream.
fn check_continued_trace(spans: &[Span], hops: &[Hop]) {
    let hop = hop(hops, "t-1");
    assert_eq!(hop.tracestate.as_deref(), Some("vendor=abc"), "{hop:?}");
    let (trace, parent) = parse(&hop.traceparent);
    assert_eq!(
        trace, TRACE,
        "the upstream is in the caller's trace: {hop:?}"
    );
    let mine: Vec<&Span> = spans.iter().filter(|s| hex(&s.trace_id) == TRACE).collect();
    let named = |name: &str| {
        let found: Vec<&&Span> = mine.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name} span in {}", names(&mine));
        *found[0]
    };
    let request = named("idem.request");
    assert_eq!(
        hex(&request.parent_span_id),
        CALLER_SPAN,
        "the caller's span is the parent"
    );
    assert_eq!(
        attr(&request.attributes, "http.route").as_deref(),
        Some("/payouts")
    );
    let forward = named("idem.forward");
    assert_eq!(
        hex(&forward.span_id),
        parent,
        "the upstream's parent is the forward span"
    );
    assert_eq!(
        attr(&forward.attributes, "http.response.status_code").as_deref(),
        Some("201")
    );
    let claim = named("idem.claim");
    assert_eq!(
        attr(&claim.attributes, "idem.decision").as_deref(),
        Some("acquired")
    );
    let complete = named("idem.complete");
    assert_eq!(
        attr(&complete.attributes, "idem.outcome").as_deref(),
        Some("completed")
    );
    for span in [claim, forward, complete] {
        assert_eq!(
            span.parent_span_id, request.span_id,
            "{} under the request",
            span.name
        );
        assert_eq!(
            attr(&span.attributes, "idem.key").as_deref(),
            Some("t-1"),
            "{}",
            span.name
        );
        let scope = attr(&span.attributes, "idem.scope").unwrap_or_default();
        assert!(scope.starts_with("payouts|"), "{}: {scope}", span.name);
        let digest = attr(&span.attributes, "idem.scope_digest").unwrap_or_default();
        assert!(
            digest.len() == 16 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "{digest}"
        );
    }
}

/// Without a valid caller's context each request starts a trace of its
/// own, and the upstream is in it.
fn check_new_traces(spans: &[Span], hops: &[Hop]) {
    let mut seen = Vec::new();
    for key in ["t-2", "t-3", "t-4", "t-5"] {
        let hop = hop(hops, key);
        let (trace, parent) = parse(&hop.traceparent);
        assert_ne!(
            trace, TRACE,
            "{key}: a new trace, not the caller's: {hop:?}"
        );
        let forward = spans
            .iter()
            .find(|s| s.name == "idem.forward" && hex(&s.span_id) == parent)
            .unwrap_or_else(|| panic!("{key}: no forward span {parent}"));
        assert_eq!(hex(&forward.trace_id), trace, "{key}");
        assert_eq!(attr(&forward.attributes, "idem.key").as_deref(), Some(key));
        assert!(!seen.contains(&trace), "{key}: one trace per request");
        seen.push(trace);
    }
}

/// The unknown outcome is marked, looked up and resolved; the operator's
/// verdict has its span too.
fn check_verdicts(spans: &[Span]) {
    let with = |name: &str, key: &str| -> Span {
        let found = spans
            .iter()
            .find(|s| s.name == name && attr(&s.attributes, "idem.key").as_deref() == Some(key));
        found
            .unwrap_or_else(|| panic!("no {name} for {key} in {}", names(spans)))
            .clone()
    };
    let marked = with("idem.mark_ambiguous", "t-6");
    assert_eq!(hex(&marked.trace_id), TRACE_FAIL);
    assert_eq!(
        attr(&marked.attributes, "idem.outcome").as_deref(),
        Some("ambiguous")
    );
    let lookup = with("idem.lookup", "t-6");
    assert_eq!(
        attr(&lookup.attributes, "idem.finding").as_deref(),
        Some("found")
    );
    let resolved = with("idem.resolve", "t-6");
    assert_eq!(
        resolved.parent_span_id, lookup.span_id,
        "the verdict is under its lookup"
    );
    let expect = [
        ("idem.resolver", "reconciler"),
        ("idem.outcome", "completed"),
    ];
    for (name, value) in expect {
        assert_eq!(
            attr(&resolved.attributes, name).as_deref(),
            Some(value),
            "{name}"
        );
    }
    let by_hand = with("idem.resolve", "t-7");
    assert_eq!(
        attr(&by_hand.attributes, "idem.resolver").as_deref(),
        Some("operator")
    );
    let outcome = by_hand
        .events
        .iter()
        .find_map(|e| attr(&e.attributes, "outcome"));
    assert_eq!(
        outcome.as_deref(),
        Some("completed"),
        "{:?}",
        by_hand.events
    );
}

/// Neither the caller's credential nor the admin token is in any
/// attribute, event or name.
fn check_no_secret(spans: &[Span], resource: &[KeyValue]) {
    let mut seen: Vec<String> = resource.iter().flat_map(texts).collect();
    for span in spans {
        seen.push(span.name.clone());
        seen.extend(span.attributes.iter().flat_map(texts));
        for event in &span.events {
            seen.push(event.name.clone());
            seen.extend(event.attributes.iter().flat_map(texts));
        }
    }
    assert!(
        seen.len() > spans.len() * 3,
        "attributes were read: {}",
        seen.len()
    );
    let secrets = [
        ADMIN_TOKEN,
        CREDENTIAL,
        CREDENTIAL.trim_start_matches("Bearer "),
    ];
    for text in &seen {
        for secret in secrets {
            assert!(!text.contains(secret), "a secret in a trace: {text}");
        }
    }
}

/// Lists the one ambiguous record of `key` and resolves it as completed.
async fn resolve_by_hand(admin: SocketAddr, key: &str) {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let headers = [("authorization", auth.as_str())];
    let base = format!("http://{admin}/records");
    let listed = send("GET", &format!("{base}?state=ambiguous"), &headers, "").await;
    let page: serde_json::Value = serde_json::from_str(&listed.body).unwrap();
    let record = page["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("{key} is not ambiguous: {page}"))
        .clone();
    let scope = segment(record["scope"].as_str().unwrap());
    let url = format!("{base}/{scope}/{}/resolve", segment(key));
    let body = format!(
        r#"{{"token":{},"outcome":"completed","status":201,"headers":[],"body":"","reason":"ledger checked"}}"#,
        record["token"]
    );
    let resolved = send("POST", &url, &headers, &body).await;
    assert_eq!(resolved.status, 200, "{resolved:?}");
}

/// Routes `/payouts`, `/fail` (with a lookup) and `/fail-manual` (none),
/// each scoped by the caller's credential (a digest of it).
fn config(site: &Site, upstream: SocketAddr) -> std::path::PathBuf {
    let principal = "principal = { credential_headers = [\"authorization\"] }";
    let forward = "forward_key = { template = \"{scope_digest}:{key}\" }";
    let mut text =
        String::from("[reconcile]\ninterval_s = 1\nbackoff_ms = 50\nbackoff_max_ms = 200\n");
    for (name, path) in [
        ("payouts", "/payouts"),
        ("failing", "/fail"),
        ("manual", "/fail-manual"),
    ] {
        text.push_str(&format!(
            "[[route]]\nname = \"{name}\"\nmethods = [\"POST\"]\npath = \"{path}\"\n{principal}\n{forward}\n"
        ));
    }
    text.push_str(&format!(
        "[[lookup]]\nroute = \"failing\"\nurl = \"http://{upstream}/lookups/{{forwarded_key}}\"\n"
    ));
    site.config(&text)
}

/// The OTLP receiver and the upstream of a test, each on a port of its
/// own: what they received, and where.
async fn receivers() -> (Collector, SocketAddr, Hops, SocketAddr) {
    let collector = Collector::default();
    let otlp = serve(
        axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .with_state(collector.clone()),
    )
    .await;
    let hops = Hops::default();
    let upstream = serve(
        axum::Router::new()
            .fallback(upstream)
            .with_state(hops.clone()),
    )
    .await;
    (collector, otlp, hops, upstream)
}

/// `idem serve` exporting traces to `otlp`, with its admin API, logging
/// JSON lines.
fn start(site: &Site, upstream: SocketAddr, otlp: SocketAddr) -> (Gateway, SocketAddr) {
    start_logging(site, upstream, otlp, "json")
}

/// [`start`] with the log in `format`.
fn start_logging(
    site: &Site,
    upstream: SocketAddr,
    otlp: SocketAddr,
    format: &str,
) -> (Gateway, SocketAddr) {
    let endpoint = format!("http://{otlp}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_SERVICE_NAME", "idem-trace-test"),
        ("OTEL_BSP_SCHEDULE_DELAY", "60000"),
        ("IDEM_LOG_FORMAT", format),
    ];
    let config = config(site, upstream);
    let upstream = format!("http://{upstream}");
    Gateway::start_admin_env(&upstream, &site.store(), Some(&config), ADMIN_TOKEN, &env)
}

/// SIGTERM, a clean exit, and the whole log.
fn terminate(gw: Gateway) -> String {
    let log = gw.log.clone();
    let status = gw.terminate();
    // The reader thread may still hold the last lines.
    std::thread::sleep(Duration::from_millis(100));
    let log = log.lock().unwrap().join("\n");
    assert!(status.success(), "{status}: {log}");
    log
}

async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The OTLP/HTTP receiver: protobuf in, an empty success out.
async fn receive(State(collector): State<Collector>, body: Bytes) -> axum::response::Response {
    let request = ExportTraceServiceRequest::decode(body).unwrap();
    for resource_spans in request.resource_spans {
        if let Some(resource) = resource_spans.resource {
            *collector.resource.lock().unwrap() = resource.attributes;
        }
        for scope_spans in resource_spans.scope_spans {
            collector.spans.lock().unwrap().extend(scope_spans.spans);
        }
    }
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    ([("content-type", "application/x-protobuf")], answer).into_response()
}

/// The upstream: records each request's trace headers; `/fail…` answers
/// 500, `/lookups/…` finds the payout, everything else pays (201).
async fn upstream(
    State(hops): State<Hops>,
    uri: Uri,
    headers: HeaderMap,
) -> axum::response::Response {
    let text = |v: &axum::http::HeaderValue| v.to_str().unwrap().to_owned();
    let hop = Hop {
        path: uri.path().to_owned(),
        key: headers.get("idempotency-key").map(text),
        traceparent: headers.get_all("traceparent").iter().map(text).collect(),
        tracestate: headers.get("tracestate").map(text),
    };
    let status = match hop.path.as_str() {
        p if p.starts_with("/fail") => 500,
        p if p.starts_with("/lookups/") => 200,
        _ => 201,
    };
    hops.lock().unwrap().push(hop);
    let status = axum::http::StatusCode::from_u16(status).unwrap();
    (
        status,
        [("content-type", "application/json")],
        "{\"paid\":true}",
    )
        .into_response()
}

/// The hop that carried `key` (the forwarded reference ends with it).
fn hop<'a>(hops: &'a [Hop], key: &str) -> &'a Hop {
    let suffix = format!(":{key}");
    hops.iter()
        .find(|h| h.key.as_deref().is_some_and(|k| k.ends_with(&suffix)))
        .unwrap_or_else(|| panic!("no hop for {key}: {hops:?}"))
}

/// The trace id and parent id of the one `traceparent` sent upstream.
fn parse(traceparent: &[String]) -> (String, String) {
    assert_eq!(traceparent.len(), 1, "{traceparent:?}");
    let fields: Vec<&str> = traceparent[0].split('-').collect();
    assert_eq!((fields.len(), fields[0]), (4, "00"), "{traceparent:?}");
    (fields[1].to_owned(), fields[2].to_owned())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn names(spans: &[impl std::borrow::Borrow<Span>]) -> String {
    let names: Vec<&str> = spans.iter().map(|s| s.borrow().name.as_str()).collect();
    names.join(", ")
}

/// An attribute's value as text.
fn attr(attributes: &[KeyValue], key: &str) -> Option<String> {
    let kv = attributes.iter().find(|kv| kv.key == key)?;
    texts(kv).into_iter().nth(1)
}

/// A key and every text in its value, nested values included.
fn texts(kv: &KeyValue) -> Vec<String> {
    let mut out = vec![kv.key.clone()];
    let mut stack: Vec<&AnyValue> = kv.value.iter().collect();
    while let Some(value) = stack.pop() {
        match &value.value {
            Some(Value::StringValue(s)) => out.push(s.clone()),
            Some(Value::IntValue(i)) => out.push(i.to_string()),
            Some(Value::BoolValue(b)) => out.push(b.to_string()),
            Some(Value::DoubleValue(d)) => out.push(d.to_string()),
            Some(Value::BytesValue(b)) => out.push(String::from_utf8_lossy(b).into_owned()),
            Some(Value::ArrayValue(a)) => stack.extend(&a.values),
            Some(Value::KvlistValue(l)) => {
                for kv in &l.values {
                    out.extend(texts(kv));
                }
            }
            _ => {}
        }
    }
    out
}

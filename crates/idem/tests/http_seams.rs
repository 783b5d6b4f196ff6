//! The seams where a request can slip past the contract on its way through
//! `idem serve`: how a path is spelled, which headers a client declares
//! hop-by-hop, and what an upstream's error status says about the effect.
//! Requests are written byte for byte on a raw socket, so that no client
//! library tidies the spelling under test.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use support::{Gateway, Reply, Site};

const PAYOUT: &str = r#"{"seller":847,"amount":1200}"#;

/// What the upstream received, one entry per request that reached it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// An upstream that pays on every request it receives and records it.
/// A path ending in `/pays-then-503` pays, then answers 503, as a mesh or
/// an overloaded proxy in front of a committed application can.
struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    async fn start() -> Recorder {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let app = axum::Router::new()
            .fallback(record)
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Recorder { addr, seen, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn record(
    State(seen): State<Arc<Mutex<Vec<Seen>>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    _body: Bytes,
) -> Response {
    let target = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned());
    let n = {
        let mut seen = seen.lock().unwrap();
        seen.push(Seen {
            method: method.to_string(),
            target: target.clone(),
            headers: headers
                .iter()
                .map(|(n, v)| {
                    let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
                    (n.as_str().to_owned(), value)
                })
                .collect(),
        });
        seen.len()
    };
    if uri.path().ends_with("/pays-then-503") {
        return (StatusCode::SERVICE_UNAVAILABLE, "upstream connect error").into_response();
    }
    if let Some(status) = uri.path().rsplit_once("/owns-headers-").map(|(_, s)| s) {
        // An upstream that sends the gateway's own headers.
        let status = StatusCode::from_bytes(status.as_bytes()).unwrap();
        return (
            status,
            [
                ("idempotency-expires", UPSTREAM_EXPIRES),
                ("idempotent-replayed", "true"),
            ],
            format!("{{\"payout\":{n}}}"),
        )
            .into_response();
    }
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!("{{\"payout\":{n}}}"),
    )
        .into_response()
}

/// Sends one HTTP/1.1 request exactly as written (`target` and `headers`
/// unchanged) and reads the answer by its `Content-Length`.
async fn raw(addr: SocketAddr, method: &str, target: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = format!(
        "{method} {target} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        PAYOUT.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(PAYOUT);
    tokio::task::spawn_blocking(move || exchange(addr, &request))
        .await
        .unwrap()
}

fn exchange(addr: SocketAddr, request: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status = line.split(' ').nth(1).unwrap().parse().unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        let Some((name, value)) = line.trim_end().split_once(':') else {
            break;
        };
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// The past date an upstream sends as its own `Idempotency-Expires`.
const UPSTREAM_EXPIRES: &str = "Thu, 01 Jan 1970 00:00:00 GMT";

/// The gateway's headers are the gateway's: an upstream's own
/// `Idempotency-Expires` and `Idempotent-Replayed` never reach the client,
/// on an answer that was not recorded, on a first execution, or on a
/// replay — even where the route asks to replay them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_the_gateway_owns_never_come_from_the_upstream() {
    let (up, site) = (Recorder::start().await, Site::new());
    let gw = start(
        &up,
        &site,
        "[[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/payouts/**\"\n\
         replay_headers = [\"idempotency-expires\", \"idempotent-replayed\"]\n",
    );
    let owned = |reply: &Reply| {
        (
            reply.header("idempotency-expires").map(str::to_owned),
            reply.header("idempotent-replayed").map(str::to_owned),
        )
    };
    // A 500 after the effect: nothing recorded, so no expiry and no replay.
    let unknown = raw(
        gw.addr,
        "POST",
        "/payouts/owns-headers-500",
        &[("idempotency-key", "o-1")],
    )
    .await;
    assert_eq!(unknown.status, 500, "{unknown:?}");
    assert_eq!(owned(&unknown), (None, None), "{unknown:?}");
    // A first execution: the gateway's expiry, not replayed.
    let path = "/payouts/owns-headers-201";
    let first = raw(gw.addr, "POST", path, &[("idempotency-key", "o-2")]).await;
    assert_eq!(first.status, 201, "{first:?}");
    let (expires, replayed) = owned(&first);
    assert_eq!(replayed, None, "{first:?}");
    let expires = expires.expect("the gateway's own expiry");
    assert_ne!(expires, UPSTREAM_EXPIRES);
    // Its replay: the gateway's headers, once each.
    let again = raw(gw.addr, "POST", path, &[("idempotency-key", "o-2")]).await;
    assert_eq!(
        owned(&again),
        (Some(expires), Some("true".to_owned())),
        "{again:?}"
    );
    let count = |name: &str| again.headers.iter().filter(|(n, _)| n == name).count();
    assert_eq!(
        (count("idempotency-expires"), count("idempotent-replayed")),
        (1, 1)
    );
    // A request the contract does not cover (a GET) passes through, but
    // never with headers that would say it does.
    let passed = raw(gw.addr, "GET", path, &[]).await;
    assert_eq!(passed.status, 201, "{passed:?}");
    assert_eq!(owned(&passed), (None, None), "{passed:?}");
}

/// A gateway whose one route protects POST under `/payouts/`.
fn payouts_gateway(up: &Recorder, site: &Site) -> Gateway {
    start(
        up,
        site,
        "[[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/payouts/**\"\n",
    )
}

fn start(up: &Recorder, site: &Site, config: &str) -> Gateway {
    let config = site.config(config);
    Gateway::start(&up.url(), &site.store(), Some(&config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_after_the_effect_is_an_unknown_outcome_never_a_second_payment() {
    let (up, site) = (Recorder::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let key = [("idempotency-key", "u-1")];
    let first = raw(gw.addr, "POST", "/pays-then-503", &key).await;
    assert_eq!(first.status, 503, "{first:?}");
    for _ in 0..3 {
        let retry = raw(gw.addr, "POST", "/pays-then-503", &key).await;
        assert_eq!(retry.status, 409, "{retry:?}");
        assert_eq!(
            retry.problem().as_deref(),
            Some("urn:idem:problem:outcome-unknown")
        );
    }
    assert_eq!(up.seen().len(), 1, "the retries never reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_opts_in_releases_a_503() {
    let (up, site) = (Recorder::start().await, Site::new());
    let gw = start(&up, &site, "[[route]]\ncompletion = { release = [503] }\n");
    let key = [("idempotency-key", "u-2")];
    assert_eq!(
        raw(gw.addr, "POST", "/pays-then-503", &key).await.status,
        503
    );
    assert_eq!(
        raw(gw.addr, "POST", "/pays-then-503", &key).await.status,
        503
    );
    assert_eq!(up.seen().len(), 2, "released: the retry ran, as declared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_option_cannot_strip_what_the_contract_is_built_on() {
    let (up, site) = (Recorder::start().await, Site::new());
    let gw = start(
        &up,
        &site,
        "[[route]]\npath = \"/renamed/**\"\nupstream_dedups = true\n\
         forward_key = { header = \"x-upstream-key\" }\n\n\
         [[route]]\nupstream_dedups = true\nprincipal_headers = [\"authorization\", \"x-tenant\"]\n",
    );
    // (path, Connection value, the header the upstream must get the key in)
    let cases = [
        ("/payouts", "idempotency-key", "idempotency-key"),
        ("/payouts", "Idempotency-Key", "idempotency-key"),
        ("/payouts", "close, IDEMPOTENCY-KEY", "idempotency-key"),
        (
            "/payouts",
            "keep-alive,idempotency-key ,te",
            "idempotency-key",
        ),
        ("/renamed/1", "x-upstream-key", "x-upstream-key"),
        (
            "/renamed/2",
            "idempotency-key, X-Upstream-Key",
            "x-upstream-key",
        ),
        (
            "/payouts",
            "content-type, content-length, host",
            "idempotency-key",
        ),
        ("/payouts", "authorization, x-tenant", "idempotency-key"),
    ];
    for (i, (path, connection, forwarded)) in cases.into_iter().enumerate() {
        let key = format!("h-{i}");
        let headers = [
            ("idempotency-key", key.as_str()),
            ("connection", connection),
            ("authorization", "Bearer tenant-a"),
            ("x-tenant", "a"),
        ];
        let reply = raw(gw.addr, "POST", path, &headers).await;
        assert_eq!(reply.status, 201, "{connection}: {reply:?}");
        let seen = up.seen().pop().unwrap();
        assert_eq!(seen.header(forwarded), Some(key.as_str()), "{connection}");
        assert_eq!(seen.header("connection"), None, "{connection}");
        for end_to_end in ["content-type", "authorization", "x-tenant"] {
            assert!(
                seen.header(end_to_end).is_some(),
                "{connection}: {end_to_end}"
            );
        }
        assert_eq!(seen.header("content-type"), Some("application/json"));
        assert_eq!(seen.header("authorization"), Some("Bearer tenant-a"));
    }
    assert_eq!(up.seen().len(), cases.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_named_in_connection_still_separates_tenants() {
    let (up, site) = (Recorder::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    for tenant in ["Bearer tenant-a", "Bearer tenant-b"] {
        let headers = [
            ("idempotency-key", "same-key"),
            ("connection", "authorization"),
            ("authorization", tenant),
        ];
        let reply = raw(gw.addr, "POST", "/payouts", &headers).await;
        assert_eq!(reply.status, 201, "{tenant}: {reply:?}");
        assert_eq!(reply.header("idempotent-replayed"), None, "{tenant}");
        let seen = up.seen().pop().unwrap();
        assert_eq!(seen.header("authorization"), Some(tenant));
    }
    assert_eq!(up.seen().len(), 2, "one payout per tenant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_never_reach_the_upstream() {
    let (up, site) = (Recorder::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let headers = [
        ("idempotency-key", "hop-1"),
        ("connection", "x-trace-hop, Keep-Alive"),
        ("x-trace-hop", "1"),
        ("keep-alive", "timeout=5"),
        ("te", "trailers"),
        ("proxy-authorization", "Basic cHJveHk6c2VjcmV0"),
        ("proxy-connection", "keep-alive"),
    ];
    for method in ["POST", "GET"] {
        let reply = raw(gw.addr, method, "/payouts", &headers).await;
        assert_eq!(reply.status, 201, "{method}: {reply:?}");
        let seen = up.seen().pop().unwrap();
        assert_eq!(seen.method, method);
        for (hop, _) in headers.iter().skip(1) {
            assert_eq!(seen.header(hop), None, "{method}: {hop} was forwarded");
        }
        assert_eq!(seen.header("idempotency-key"), Some("hop-1"));
    }
}

/// What the gateway must do with one spelling of a request target.
#[derive(Clone, Copy, Debug)]
enum Spelled {
    /// The route protects it (no key: 400 `missing-key`); with a key, the
    /// upstream receives exactly this target.
    Protected(&'static str),
    /// 400 `invalid-path`: upstreams disagree on what it means.
    Refused,
    /// Not protected; the upstream receives exactly this target.
    Passed(&'static str),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_protected_path_is_protected_or_refused() {
    use Spelled::{Passed, Protected, Refused};
    let (up, site) = (Recorder::start().await, Site::new());
    let gw = payouts_gateway(&up, &site);
    let cases = [
        ("/payouts/x", Protected("/payouts/x")),
        ("//payouts/x", Protected("/payouts/x")),
        ("/payouts//x", Protected("/payouts/x")),
        ("/%70ayouts/x", Protected("/payouts/x")),
        ("/pay%6Fu%74s/%7e", Protected("/payouts/~")),
        ("/%70AYOUTS/x", Protected("/pAYOUTS/x")),
        ("/Payouts/x", Protected("/Payouts/x")),
        ("/PAYOUTS", Protected("/PAYOUTS")),
        ("/payouts/./x", Protected("/payouts/x")),
        ("/x/../payouts/y", Protected("/payouts/y")),
        ("/./payouts", Protected("/payouts")),
        ("/payouts/x/", Protected("/payouts/x/")),
        ("/payouts;x", Protected("/payouts;x")),
        (
            "/payouts;jsessionid=1/x",
            Protected("/payouts;jsessionid=1/x"),
        ),
        ("/payouts%3Bx/y", Protected("/payouts%3Bx/y")),
        ("/payouts/%c3%a9", Protected("/payouts/%C3%A9")),
        ("/payouts/x?a=%2F&b=..", Protected("/payouts/x?a=%2F&b=..")),
        ("http://example.com/payouts/x", Protected("/payouts/x")),
        ("http://example.com//payouts/./x", Protected("/payouts/x")),
        ("/payouts%2Fx", Refused),
        ("/payouts%2fx", Refused),
        ("/refunds/%2F", Refused),
        ("/payouts%5Cx", Refused),
        ("/payouts\\x", Refused),
        ("/payouts%00", Refused),
        ("/payouts/%2E%2E/refunds", Refused),
        ("/payouts/.%2e", Refused),
        ("/payouts/%2e", Refused),
        ("/x/..;/payouts/y", Refused),
        ("/x/..%3B/payouts/y", Refused),
        ("/..", Refused),
        ("/../payouts", Refused),
        ("/payouts/../../x", Refused),
        ("/pay%zzouts", Refused),
        ("/payouts/%", Refused),
        ("/payouts/%C0%AE%C0%AE/x", Refused),
        (
            "http://example.com/PAYOUTS;x/../payouts/y",
            Protected("/payouts/y"),
        ),
        ("http://example.com", Passed("/")),
        ("/refunds/x", Passed("/refunds/x")),
        ("/refunds//x/./y", Passed("/refunds/x/y")),
        ("/payoutsx", Passed("/payoutsx")),
        ("/payouts/../refunds", Passed("/refunds")),
        ("/refunds/%7Ex?b=%2F&a=1", Passed("/refunds/~x?b=%2F&a=1")),
    ];
    for (i, (target, expect)) in cases.into_iter().enumerate() {
        let before = up.seen().len();
        let bare = raw(gw.addr, "POST", target, &[]).await;
        let key = format!("s-{i}");
        let keyed = raw(gw.addr, "POST", target, &[("idempotency-key", &key)]).await;
        let seen = up.seen();
        let forwarded: Vec<&str> = seen[before..].iter().map(|s| s.target.as_str()).collect();
        match expect {
            Protected(path) => {
                assert_eq!(
                    (bare.status, bare.problem().as_deref()),
                    (400, Some("urn:idem:problem:missing-key")),
                    "{target}: {bare:?}"
                );
                assert_eq!(keyed.status, 201, "{target}: {keyed:?}");
                assert_eq!(forwarded, [path], "{target}");
            }
            Refused => {
                for reply in [&bare, &keyed] {
                    assert_eq!(reply.status, 400, "{target}: {reply:?}");
                }
                assert_eq!(
                    keyed.problem().as_deref(),
                    Some("urn:idem:problem:invalid-path"),
                    "{target}: {keyed:?}"
                );
                assert!(forwarded.is_empty(), "{target}: {forwarded:?}");
            }
            Passed(path) => {
                assert_eq!((bare.status, keyed.status), (201, 201), "{target}");
                assert_eq!(forwarded, [path, path], "{target}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_on_many_spellings_of_one_endpoint_pays_once() {
    let (up, site) = (Recorder::start().await, Site::new());
    // The zero-config catch-all route: the operation is the request's path.
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let key = [("idempotency-key", "one")];
    let first = raw(gw.addr, "POST", "/payouts/x", &key).await;
    assert_eq!(first.status, 201, "{first:?}");
    for replayed in ["//payouts/x", "/%70ayouts/./x", "/y/../payouts//x"] {
        let reply = raw(gw.addr, "POST", replayed, &key).await;
        reply.assert_replay_of(&first);
    }
    // Upstreams that ignore case, a trailing slash or matrix parameters
    // serve these as /payouts/x too: same scope, another request → 422.
    for reused in [
        "/Payouts/x",
        "/payouts/x/",
        "/payouts;v=1/x",
        "/PAYOUTS/X;a",
    ] {
        let reply = raw(gw.addr, "POST", reused, &key).await;
        assert_eq!(
            reply.problem().as_deref(),
            Some("urn:idem:problem:key-reused"),
            "{reused}: {reply:?}"
        );
    }
    assert_eq!(up.seen().len(), 1);
}

/// A method in any case reaches the same handler of a lenient upstream
/// (Django, Flask), and `fetch()` sends `patch` as written: every case of
/// a protected method is protected, and a respelling with the same key is
/// another request (422), never a second effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_of_a_protected_method_is_protected() {
    let up = Recorder::start().await;
    let (named, catch_all) = (Site::new(), Site::new());
    let gateways = [
        start(
            &up,
            &named,
            "[[route]]\nname = \"payouts\"\nmethods = [\"post\", \"PATCH\"]\npath = \"/payouts/**\"\n",
        ),
        Gateway::start(&up.url(), &catch_all.store(), None),
    ];
    for (g, gw) in gateways.iter().enumerate() {
        for (i, method) in ["post", "Post", "pOsT", "patch", "Patch", "PATCH", "POST"]
            .into_iter()
            .enumerate()
        {
            let before = up.seen().len();
            let bare = raw(gw.addr, method, "/payouts/1", &[]).await;
            assert_eq!(
                (bare.status, bare.problem().as_deref()),
                (400, Some("urn:idem:problem:missing-key")),
                "{method}: {bare:?}"
            );
            let key = format!("m-{g}-{i}");
            let first = raw(gw.addr, method, "/payouts/1", &[("idempotency-key", &key)]).await;
            assert_eq!(first.status, 201, "{method}: {first:?}");
            let again = raw(gw.addr, method, "/payouts/1", &[("idempotency-key", &key)]).await;
            again.assert_replay_of(&first);
            let other = if method == method.to_ascii_uppercase() {
                method.to_ascii_lowercase()
            } else {
                method.to_ascii_uppercase()
            };
            let respelt = raw(gw.addr, &other, "/payouts/1", &[("idempotency-key", &key)]).await;
            assert_eq!(
                respelt.problem().as_deref(),
                Some("urn:idem:problem:key-reused"),
                "{method} then {other}: {respelt:?}"
            );
            let seen = up.seen();
            assert_eq!(seen.len(), before + 1, "{method}: one effect");
            assert_eq!(seen[before].method, method, "forwarded as sent");
        }
        for method in ["get", "put", "GET"] {
            let passed = raw(gw.addr, method, "/payouts/1", &[]).await;
            assert_eq!(passed.status, 201, "{method} is not protected: {passed:?}");
        }
    }
}

/// What a protected request's query must get.
#[derive(Clone, Copy, Debug)]
enum Query {
    /// Forwarded once; the same key again replays it.
    Runs,
    /// 400 `invalid-query`: upstreams read it in different ways.
    Refused,
}

/// Query spellings that upstreams read differently never share a stored
/// answer: a malformed escape is refused, and `;` is neither `%3B` nor `&`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_spellings_that_upstreams_read_apart_never_share_an_answer() {
    use Query::{Refused, Runs};
    let (up, site) = (Recorder::start().await, Site::new());
    let gw = payouts_gateway(&up, &site);
    let cases = [
        ("?ref=%zz", Refused),
        ("?ref=%25zz", Runs),
        ("?ref=%4", Refused),
        ("?ref=%254", Runs),
        ("?ref=%", Refused),
        ("?ref=%25", Runs),
        ("?a=1&%g0=2", Refused),
        ("?amount=1;currency=eur", Runs),
        ("?amount=1%3Bcurrency=eur", Runs),
        ("?amount=1&currency=eur", Runs),
        ("?amount=1%3bcurrency=eur", Runs),
    ];
    // One key for every spelling: each that runs is another request.
    let key = [("idempotency-key", "q-1")];
    let first = raw(gw.addr, "POST", "/payouts/x?ref=first", &key).await;
    assert_eq!(first.status, 201, "{first:?}");
    for (i, (query, expect)) in cases.into_iter().enumerate() {
        let target = format!("/payouts/x{query}");
        let before = up.seen().len();
        let reused = raw(gw.addr, "POST", &target, &key).await;
        let own = [("idempotency-key", format!("q-own-{i}"))];
        let own = [(own[0].0, own[0].1.as_str())];
        let alone = raw(gw.addr, "POST", &target, &own).await;
        let again = raw(gw.addr, "POST", &target, &own).await;
        let forwarded = up.seen().len() - before;
        match expect {
            Refused => {
                for reply in [&reused, &alone, &again] {
                    assert_eq!(
                        (reply.status, reply.problem().as_deref()),
                        (400, Some("urn:idem:problem:invalid-query")),
                        "{query}: {reply:?}"
                    );
                }
                assert_eq!(forwarded, 0, "{query}");
            }
            Runs => {
                assert_eq!(
                    reused.problem().as_deref(),
                    Some("urn:idem:problem:key-reused"),
                    "{query} is another request than ?ref=first: {reused:?}"
                );
                assert_eq!(alone.status, 201, "{query}: {alone:?}");
                again.assert_replay_of(&alone);
                assert_eq!(forwarded, 1, "{query}");
            }
        }
    }
    // `%3B` in either case is one spelling, and the escape is what the
    // upstream receives.
    let semi = [("idempotency-key", "q-semi")];
    let upper = raw(gw.addr, "POST", "/payouts/x?a=1%3Bb", &semi).await;
    let lower = raw(gw.addr, "POST", "/payouts/x?a=1%3bb", &semi).await;
    lower.assert_replay_of(&upper);
    let literal = raw(gw.addr, "POST", "/payouts/x?a=1;b", &semi).await;
    assert_eq!(
        literal.problem().as_deref(),
        Some("urn:idem:problem:key-reused"),
        "{literal:?}"
    );
    // Upstreams that split pairs at `;` read these pairs apart: an escaped
    // `=` after a `;`, and the same pairs in another order across a `;`.
    for (i, (first, other)) in [
        ("?x=1;a=2", "?x=1;a%3D2"),
        ("?x=1;amount=200&amount=100", "?amount=100&x=1;amount=200"),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("q-split-{i}");
        let key = [("idempotency-key", key.as_str())];
        let ran = raw(gw.addr, "POST", &format!("/payouts/x{first}"), &key).await;
        assert_eq!(ran.status, 201, "{first}: {ran:?}");
        let respelt = raw(gw.addr, "POST", &format!("/payouts/x{other}"), &key).await;
        assert_eq!(
            respelt.problem().as_deref(),
            Some("urn:idem:problem:key-reused"),
            "{other} after {first}: {respelt:?}"
        );
    }
    // An unprotected route passes any query on untouched.
    let passed = raw(gw.addr, "POST", "/refunds/x?ref=%zz", &[]).await;
    assert_eq!(passed.status, 201, "{passed:?}");
    assert_eq!(up.seen().last().unwrap().target, "/refunds/x?ref=%zz");
}

//! Slow clients against the real `idem serve` process: connections that
//! stall in every phase (TLS handshake on the admin listener, a half-sent
//! request head, a stalled body, an idle keep-alive connection) each hold
//! only their own connection, so a normal client's protected request, the
//! console and the admin API still answer at once; and a stalled
//! connection is closed once its phase's bound has passed, whatever the
//! bound and however far into the phase it stalled. Slow bodies share a
//! byte budget, a head holds at most the read buffer, and a connection
//! over the listener's cap is closed at once.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_testkit::tls::Pki;
use proptest::prelude::*;
use support::{Gateway, Site, Upstream, key, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "0123456789abcdef-slow-clients";
const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;
/// The in-flight limit of the first test: small, so that a few dozen
/// stalls would take every slot if a stall held one.
const IN_FLIGHT_MAX: usize = 40;
/// Stalls per phase: twice the in-flight limit, and more than the 64
/// handshakes the admin listener used to run at once.
const STALLS: usize = 2 * IN_FLIGHT_MAX;
/// What a normal client may wait for an answer while the stalls hold.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);
/// What a close may take beyond its bound on a loaded machine.
const CLOSE_SLACK: Duration = Duration::from_millis(2_500);

/// The phases a connection can stall in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Connected to the TLS admin listener, no ClientHello.
    Handshake,
    /// This many bytes of a protected request's head sent.
    Head(usize),
    /// A protected request's head and this many of its 100 body bytes.
    Body(usize),
    /// One request answered, the connection kept alive and left idle.
    Idle,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalls_in_every_phase_leave_the_proxy_and_the_console_answering() {
    let site = Site::new();
    let pki = Pki::write(site.dir.path()).unwrap();
    let up = Upstream::start().await;
    // Bounds far longer than the test, so that every stall still holds
    // while the normal clients are served.
    let config = site.config(&format!(
        "requests_in_flight_max = {IN_FLIGHT_MAX}\n\
         admin_tls_cert_file = \"cert.pem\"\nadmin_tls_key_file = \"key.pem\"\n\
         header_read_timeout_ms = 60000\nbody_read_timeout_ms = 60000\n\
         tls_handshake_timeout_ms = 60000\n"
    ));
    let (gw, admin) = Gateway::start_admin(&up.url(), &site.store(), Some(&config), TOKEN);
    let mut stalls = Vec::new();
    for phase in [
        Phase::Idle,
        Phase::Handshake,
        Phase::Head(40),
        Phase::Body(1),
    ] {
        let target = match phase {
            Phase::Handshake => admin,
            _ => gw.addr,
        };
        // In batches within the in-flight limit: the idle stalls' one
        // request each must be served, not shed.
        for batch in (0..STALLS).collect::<Vec<_>>().chunks(IN_FLIGHT_MAX / 2) {
            let opened: Vec<_> = batch
                .iter()
                .map(|&i| tokio::spawn(stall(target, phase, i)))
                .collect();
            for stall in opened {
                stalls.push((phase, stall.await.unwrap().0));
            }
        }
    }

    let https = https_client(&pki);
    let started = Instant::now();
    let paid = tokio::time::timeout(
        ANSWER_WITHIN,
        post(&gw.url("/payouts"), &[key("normal-1")], PAYOUT),
    )
    .await
    .expect("the protected request waited behind the stalls");
    assert_eq!(paid.status, 201, "{paid:?}\n{}", gw.logs());
    for (path, token, expect) in [
        ("/ui", None, 303),
        ("/ui/sign-in", None, 200),
        ("/metrics", Some(TOKEN), 200),
        ("/records?state=ambiguous", Some(TOKEN), 200),
    ] {
        let url = format!("https://{admin}{path}");
        let answer = tokio::time::timeout(ANSWER_WITHIN, get(&https, &url, token))
            .await
            .unwrap_or_else(|_| panic!("{path} waited behind the stalls"));
        assert_eq!(answer.0, expect, "{path}: {}", answer.1);
    }
    let took = started.elapsed();
    assert_eq!(up.effects().len(), 1, "one effect, the normal client's");

    // Every stall was still held while the normal clients were served:
    // none was closed, none was answered.
    for (phase, stream) in &stalls {
        let mut byte = [0u8; 1];
        match stream.try_read(&mut byte) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("a {phase:?} stall ended after {took:?}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_hold_only_the_bytes_they_sent_within_the_body_budget() {
    let site = Site::new();
    let up = Upstream::start().await;
    let config = site.config(
        "body_buffer_bytes_max = 2500\nbody_read_timeout_ms = 60000\n\
         [[route]]\npath = \"/payouts\"\nbody_bytes_max = 1000\n",
    );
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let url = gw.url("/payouts");
    // Two bodies of 1000 bytes stall after 900: 1800 of the 2500 held.
    let mut stalls = stall_bodies(gw.addr, 0).await;
    // 800 more do not fit: refused at once, nothing claimed or forwarded
    // (asked until the gateway has read what the stalls sent, which on a
    // machine busy with the other tests can take seconds). A probe that
    // arrives before a stall's bytes are counted fits, and the stall's
    // bytes may then be the ones refused: its connection is answered, and
    // the stalls are set up again.
    let mut refused = None;
    for attempt in 0..750 {
        let reply = post(&url, &[key(&format!("over-{attempt}"))], &padded(800)).await;
        if reply.status == 503 {
            refused = Some((attempt, reply));
            break;
        }
        if stalls.iter().any(answered) {
            stalls = stall_bodies(gw.addr, attempt + 1).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (attempt, reply) = refused.expect("a body over the budget was read");
    assert_eq!(
        reply.problem().as_deref(),
        Some("urn:idem:problem:overloaded"),
        "{reply:?}"
    );
    assert_eq!(reply.header("retry-after"), Some("1"), "{reply:?}");
    assert_eq!(
        up.hits(),
        attempt,
        "only the bodies read before the stalls were"
    );
    // 600 fit beside the stalls.
    let fits = post(&url, &[key("fits")], &padded(600)).await;
    assert_eq!(fits.status, 201, "{fits:?}");
    // Hung up, the stalls give their bytes back; the refused key was never
    // claimed and runs now.
    drop(stalls);
    let mut again = None;
    for _ in 0..100 {
        let reply = post(&url, &[key(&format!("over-{attempt}"))], &padded(800)).await;
        if reply.status == 201 {
            again = Some(reply);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = again.expect("the stalls' bytes were never given back");
    assert_eq!(again.header("idempotent-replayed"), None, "{again:?}");
}

/// Two connections that send a protected request's head and 900 of its
/// 1000 body bytes, and stall; `round` keeps their keys apart.
async fn stall_bodies(addr: std::net::SocketAddr, round: usize) -> Vec<TcpStream> {
    let mut stalls = Vec::new();
    for i in 0..2 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        // The 900 bytes must leave now: with Nagle's algorithm the kernel
        // may hold them behind the head's acknowledgement.
        stream.set_nodelay(true).unwrap();
        let head = format!(
            "POST /payouts HTTP/1.1\r\nHost: idem\r\nIdempotency-Key: budget-stall-{round}-{i}\r\n\
             Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream
            .write_all(&padded(1000).as_bytes()[..900])
            .await
            .unwrap();
        stalls.push(stream);
    }
    stalls
}

/// Whether the gateway answered (or closed) a stalled connection.
fn answered(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    !matches!(stream.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// A JSON object of exactly `bytes` bytes.
fn padded(bytes: usize) -> String {
    let pad = "x".repeat(bytes - r#"{"pad":""}"#.len());
    format!(r#"{{"pad":"{pad}"}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_holds_at_most_the_read_buffer() {
    let site = Site::new();
    let up = Upstream::start().await;
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let limit = idem_gateway::READ_BUFFER_BYTES_MAX;
    // (bytes of one header's value, answered by the upstream)
    for (value_bytes, forwarded) in [(limit / 2, true), (4 * limit, false)] {
        let request = format!(
            "GET /payouts/by-key/k HTTP/1.1\r\nHost: idem\r\nX-Pad: {}\r\n\
             Connection: close\r\n\r\n",
            "p".repeat(value_bytes)
        );
        let answer = exchange_raw(gw.addr, request.as_bytes()).await;
        if forwarded {
            assert!(
                answer.starts_with("HTTP/1.1 404"),
                "{value_bytes}: {answer}"
            );
        } else {
            assert!(
                answer.starts_with("HTTP/1.1 431"),
                "{value_bytes}: {answer}"
            );
        }
    }
    assert_eq!(
        up.lookups(),
        1,
        "only the head within the buffer was forwarded"
    );
}

/// A body the gateway refuses without reading it (over the route's limit,
/// or with no key where one is required) is still taken off the wire
/// while the client sends it, so that the client reads the refusal: a
/// connection closed under a client still writing answers it with a reset
/// instead, and the refusal is lost (hyper's client reports a broken pipe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_reaches_a_client_still_sending_the_body_it_refused() {
    let site = Site::new();
    let up = Upstream::start().await;
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let body = vec![b' '; 4 * 1024 * 1024];
    // (the key header, the refusal)
    for (key_header, status) in [("Idempotency-Key: big\r\n", 413), ("", 400)] {
        let mut stream = TcpStream::connect(gw.addr).await.unwrap();
        let head = format!(
            "POST /payouts HTTP/1.1\r\nHost: idem\r\n{key_header}\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        // Long enough for the refusal to be written and, were the body
        // dropped unread, the connection closed.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let sent = stream.write_all(&body).await;
        assert!(
            sent.is_ok(),
            "{status}: the body could not be sent: {sent:?}"
        );
        let answer = read_head(&mut stream).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{answer}"
        );
    }
    assert_eq!(up.hits(), 0, "nothing was forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_the_cap_is_closed_at_once_and_said_so() {
    let site = Site::new();
    let up = Upstream::start().await;
    let config = site.config("connections_max = 2\nheader_read_timeout_ms = 60000\n");
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let held = [
        stall(gw.addr, Phase::Head(0), 0).await.0,
        stall(gw.addr, Phase::Head(0), 1).await.0,
    ];
    // Closed without an answer, long before any timeout could end it.
    let mut third = TcpStream::connect(gw.addr).await.unwrap();
    let (answer, closed) = read_to_close(&mut third, Duration::from_secs(10)).await;
    assert!(closed.is_some() && answer.is_empty(), "{answer:?}");
    let warned = support::eventually(Duration::from_secs(5), || {
        gw.logs().contains("closing new ones at once")
    })
    .await;
    assert!(warned, "{}", gw.logs());
    // One place given back: a request is served on a new connection.
    drop(held);
    let mut answer = String::new();
    for _ in 0..50 {
        answer = exchange_raw(gw.addr, &protected_request("after-cap")).await;
        if answer.starts_with("HTTP/1.1 201") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    /// A connection stalled in any phase, at any point of it, is closed
    /// once the phase's bound has passed and not before, and meanwhile
    /// holds only its own connection: with one in-flight slot a normal
    /// request is served, and the connection's place is free again after.
    #[test]
    fn a_stalled_connection_is_closed_after_its_phase_bound(
        phase in phases(),
        bound_ms in 300u64..1_500,
    ) {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(closed_after_bound(phase, Duration::from_millis(bound_ms)));
    }
}

/// Every phase, stalled anywhere in it.
fn phases() -> impl Strategy<Value = Phase> {
    prop_oneof![
        Just(Phase::Handshake),
        (0..protected_head("k").len()).prop_map(Phase::Head),
        (0usize..100).prop_map(Phase::Body),
        Just(Phase::Idle),
    ]
}

/// One gateway whose bound for `phase` is `bound` (the others far longer),
/// one stalled connection, and what it may and may not hold.
async fn closed_after_bound(phase: Phase, bound: Duration) {
    let site = Site::new();
    let pki = Pki::write(site.dir.path()).unwrap();
    let up = Upstream::start().await;
    let ms = |own: bool| if own { bound.as_millis() } else { 60_000 };
    let config = site.config(&format!(
        "requests_in_flight_max = 1\nconnections_max = 2\nadmin_connections_max = 2\n\
         admin_tls_cert_file = \"cert.pem\"\nadmin_tls_key_file = \"key.pem\"\n\
         header_read_timeout_ms = {}\nbody_read_timeout_ms = {}\n\
         tls_handshake_timeout_ms = {}\n",
        ms(matches!(phase, Phase::Head(_) | Phase::Idle)),
        ms(matches!(phase, Phase::Body(_))),
        ms(phase == Phase::Handshake),
    ));
    let (gw, admin) = Gateway::start_admin(&up.url(), &site.store(), Some(&config), TOKEN);
    let (mut stalled, since) = stall(
        if phase == Phase::Handshake {
            admin
        } else {
            gw.addr
        },
        phase,
        0,
    )
    .await;

    // The stall holds its connection, not the one in-flight slot: a
    // normal request on the other connection is served.
    if phase == Phase::Handshake {
        let (status, page) = get(
            &https_client(&pki),
            &format!("https://{admin}/metrics"),
            Some(TOKEN),
        )
        .await;
        assert_eq!(status, 200, "{phase:?}: {page}");
    } else {
        let answer = exchange_raw(gw.addr, &protected_request("served-1")).await;
        assert!(
            answer.starts_with("HTTP/1.1 201"),
            "{phase:?}: {answer}\n{}",
            gw.logs()
        );
    }

    let (answer, closed_after) = read_to_close(&mut stalled, bound + CLOSE_SLACK).await;
    let closed_after = closed_after
        .and_then(|at| at.checked_duration_since(since))
        .unwrap_or_else(|| {
            panic!(
                "{phase:?}: still open {:?} after its bound {bound:?}",
                CLOSE_SLACK
            )
        });
    assert!(
        closed_after >= bound,
        "{phase:?}: closed after {closed_after:?}, before its bound {bound:?}"
    );
    match phase {
        Phase::Body(_) => assert!(
            answer.starts_with("HTTP/1.1 408") && answer.contains("urn:idem:problem:body-timeout"),
            "{phase:?}: {answer}"
        ),
        _ => assert!(!answer.starts_with("HTTP/1.1 2"), "{phase:?}: {answer}"),
    }
    assert_eq!(
        up.hits(),
        usize::from(phase != Phase::Handshake),
        "{phase:?}: only the normal request reached the upstream"
    );

    // Its place is free again: with the other place taken, a request is
    // served on a new connection (tried a few times: the gateway gives
    // the place back just after the close the client saw).
    if phase != Phase::Handshake {
        let mut answer = String::new();
        for _ in 0..50 {
            let _filler = TcpStream::connect(gw.addr).await.unwrap();
            answer = exchange_raw(gw.addr, &protected_request("served-2")).await;
            if answer.starts_with("HTTP/1.1 201") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            answer.starts_with("HTTP/1.1 201"),
            "{phase:?}: {answer}\n{}",
            gw.logs()
        );
    }
}

/// A connection to `addr` stalled in `phase` (`i` tells stalls apart), and
/// an instant no later than the one the gateway's bound for the phase
/// starts from: taken before the step that starts it, since this task may
/// resume well after the gateway has seen that step.
async fn stall(addr: SocketAddr, phase: Phase, i: usize) -> (TcpStream, Instant) {
    let mut since = Instant::now();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let key = format!("stall-{i}");
    match phase {
        Phase::Handshake => {}
        Phase::Head(sent) => {
            stream
                .write_all(&protected_head(&key)[..sent])
                .await
                .unwrap();
        }
        Phase::Body(sent) => {
            let mut bytes = protected_head(&key);
            bytes.extend(std::iter::repeat_n(b' ', sent));
            since = Instant::now();
            stream.write_all(&bytes).await.unwrap();
        }
        Phase::Idle => {
            let get = format!("GET /payouts/by-key/{key} HTTP/1.1\r\nHost: idem\r\n\r\n");
            since = Instant::now();
            stream.write_all(get.as_bytes()).await.unwrap();
            let head = read_head(&mut stream).await;
            assert!(head.starts_with("HTTP/1.1 404"), "{head}");
        }
    }
    (stream, since)
}

/// The head of a protected POST announcing a 100-byte body.
fn protected_head(key: &str) -> Vec<u8> {
    format!(
        "POST /payouts HTTP/1.1\r\nHost: idem\r\nIdempotency-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    .into_bytes()
}

/// A whole protected POST that closes its connection after the answer.
fn protected_request(key: &str) -> Vec<u8> {
    format!(
        "POST /payouts HTTP/1.1\r\nHost: idem\r\nIdempotency-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{PAYOUT}",
        PAYOUT.len()
    )
    .into_bytes()
}

/// Sends `request` on a new connection and reads the answer to the close;
/// empty when the connection was closed before it was answered.
async fn exchange_raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    if stream.write_all(request).await.is_err() {
        return String::new();
    }
    let (answer, closed) = read_to_close(&mut stream, Duration::from_secs(10)).await;
    assert!(closed.is_some(), "no close after the answer: {answer}");
    answer
}

/// What `stream` says until it closes (EOF or reset), and when it closed;
/// `None` when it is still open after `limit`.
async fn read_to_close(stream: &mut TcpStream, limit: Duration) -> (String, Option<Instant>) {
    let mut seen = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    (String::from_utf8_lossy(&seen).into_owned(), read.ok())
}

/// Reads one response head and its `Content-Length` body, no further.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "closed mid-head");
        seen.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&seen).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no content-length: {head}"));
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    head
}

type HttpsClient =
    Client<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, Body>;

/// An HTTPS client that trusts only the throwaway CA.
fn https_client(pki: &Pki) -> HttpsClient {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&pki.ca).unwrap())
        .unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}

async fn get(client: &HttpsClient, url: &str, token: Option<&str>) -> (u16, String) {
    let mut req = axum::http::Request::get(url);
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let res = client
        .request(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A client that asks for a large answer and never reads it holds its
/// connection open while the gateway writes; on SIGTERM it cannot hold the
/// stop forever: at the drain deadline (the response timeout and
/// `DRAIN_GRACE_MS`) its connection is closed and the process exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_answer_cannot_hold_the_stop() {
    let site = Site::new();
    let up = Upstream::start().await;
    let config = site
        .config("response_timeout_ms = 1000\n[[route]]\npath = \"/payouts\"\nlease_ms = 5000\n");
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let stream = never_reading(&gw, &up, 16_000_000).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // `terminate` fails the test if the process has not exited 15 s after
    // SIGTERM; the drain deadline here is 6 s.
    let status = tokio::task::spawn_blocking(move || gw.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    drop(stream);
}

/// While the gateway runs, a client that reads nothing of its answer holds
/// its connection only as long as `header_read_timeout_ms`: then the
/// gateway closes it, and what the client reads afterwards ends early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_answer_is_closed_after_the_bound() {
    const BYTES: usize = 16_000_000;
    let site = Site::new();
    let up = Upstream::start().await;
    let config = site.config(
        "header_read_timeout_ms = 1000\nresponse_timeout_ms = 3000\n\
         [[route]]\npath = \"/payouts\"\nlease_ms = 5000\n",
    );
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let mut stream = never_reading(&gw, &up, BYTES).await;
    // Well past the bound, the gateway has given up writing.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let mut read = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the connection is still open ({read} bytes read)"
    );
    assert!(
        read < BYTES,
        "the whole answer was still written: {read} bytes"
    );
    // The gateway itself answers others meanwhile.
    let ok = post(&gw.url("/payouts"), &[key("after-stall")], "{}").await;
    assert_eq!(ok.status, 201, "{ok:?}");
}

/// A connection with a 4 KiB receive buffer that has asked the upstream
/// (unprotected: the tests' routes cover /payouts only) for `bytes` bytes,
/// more than the kernel's buffers hold, and reads none of them.
async fn never_reading(gw: &Gateway, up: &Upstream, bytes: usize) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(gw.addr).await.unwrap();
    let ask =
        format!("POST /big?bytes={bytes} HTTP/1.1\r\nHost: idem\r\nContent-Length: 0\r\n\r\n");
    stream.write_all(ask.as_bytes()).await.unwrap();
    assert!(
        support::eventually(Duration::from_secs(10), || up.hits() == 1).await,
        "the upstream was never asked"
    );
    stream
}

//! An `https://` upstream for real: a TLS terminator on loopback with a
//! certificate from a throwaway CA, in front of a payout API that counts its
//! effects, and the gateway over a real SQLite store. Trusted, a POST goes
//! through once and replays. Not trusted, or under a name the certificate
//! does not hold, the handshake fails before the request is written: the
//! record is released, never ambiguous. A connection lost after the request
//! was sent stays an unknown outcome. Bad TLS files are refused at config
//! load, naming the file and the field.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::{ListQuery, State, Store};
use idem_gateway::{GatewayConfig, Overrides};
use idem_sqlite::{SqliteOptions, SqliteStore};
use idem_testkit::tls::{Pki, TlsFront};
use tokio::io::AsyncReadExt;

/// The payout API behind the TLS terminator: every POST is one effect.
async fn payouts() -> (SocketAddr, Arc<AtomicUsize>) {
    let effects = Arc::new(AtomicUsize::new(0));
    let counter = effects.clone();
    let app = axum::Router::new().fallback(move || {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move { (http::StatusCode::CREATED, format!("{{\"payout\":{n}}}")) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, effects)
}

/// A PKI in a fresh directory and the payout API behind its TLS front.
async fn https_payouts() -> (tempfile::TempDir, Pki, TlsFront, Arc<AtomicUsize>) {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::write(dir.path()).unwrap();
    let (api, effects) = payouts().await;
    let front = TlsFront::start(&pki, api).await.unwrap();
    (dir, pki, front, effects)
}

/// A server that reads the request and hangs up without an answer.
async fn hangs_up() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
        }
    });
    addr
}

/// The gateway of `config` (written to `dir`) over SQLite in `dir`.
async fn gateway(dir: &Path, config: &str) -> (SocketAddr, Arc<dyn Store>) {
    let path = dir.join("idem.toml");
    std::fs::write(&path, config).unwrap();
    let config = GatewayConfig::load(Some(&path), &Overrides::default()).unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(dir.join("idem.db"), SqliteOptions::default()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = store.clone();
    tokio::spawn(async move {
        idem_gateway::serve(&config, serving, listener, std::future::pending()).await
    });
    (addr, store)
}

async fn post(gateway: SocketAddr, key: &str) -> (u16, String, Option<String>) {
    let client: Client<HttpConnector, Body> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let req = Request::post(format!("http://{gateway}/payouts"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from("{\"amount\":5}"))
        .unwrap();
    let res = client.request(req).await.unwrap();
    let status = res.status().as_u16();
    let replayed = res
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        String::from_utf8_lossy(&body).into_owned(),
        replayed,
    )
}

async fn records(store: &Arc<dyn Store>) -> Vec<State> {
    let listing = store.list(&ListQuery::default()).await.unwrap();
    listing.records.iter().map(|r| r.state).collect()
}

#[tokio::test]
async fn a_trusted_https_upstream_is_forwarded_to_once_and_replayed() {
    let (dir, _pki, front, effects) = https_payouts().await;
    // Relative to the config file's directory.
    let config = format!(
        "upstream = \"https://{}\"\nupstream_ca_file = \"ca.pem\"\n",
        front.addr()
    );
    let (gw, store) = gateway(dir.path(), &config).await;
    let first = post(gw, "k-1").await;
    assert_eq!(
        (first.0, first.1.as_str()),
        (201, "{\"payout\":1}"),
        "{first:?}"
    );
    let again = post(gw, "k-1").await;
    assert_eq!((again.0, again.1.as_str()), (201, "{\"payout\":1}"));
    assert_eq!(again.2.as_deref(), Some("true"), "a replay: {again:?}");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(records(&store).await, vec![State::Completed]);
}

#[tokio::test]
async fn a_failed_handshake_proves_the_request_never_left() {
    let (dir, pki, front, effects) = https_payouts().await;
    let port = front.addr().port();
    // (upstream, CA line, what the handshake refuses, what it was checked
    // against: the field and file that can fix it)
    let cases = [
        (
            format!("https://127.0.0.1:{port}"),
            String::new(),
            "UnknownIssuer",
            "checked against the system's roots (no upstream_ca_file)",
        ),
        (
            format!("https://127.0.0.1:{port}"),
            format!("upstream_ca_file = {:?}", pki.other_ca),
            "UnknownIssuer",
            "checked against the system's roots and upstream_ca_file other-ca.pem",
        ),
        // The certificate names 127.0.0.1 only: verification checks names.
        (
            format!("https://localhost:{port}"),
            format!("upstream_ca_file = {:?}", pki.ca),
            "not valid for name \\\"localhost\\\"",
            "checked against the system's roots and upstream_ca_file ca.pem",
        ),
    ];
    for (i, (upstream, ca, why, trust)) in cases.iter().enumerate() {
        let site = dir.path().join(format!("case-{i}"));
        std::fs::create_dir(&site).unwrap();
        let config = format!("upstream = \"{upstream}\"\n{ca}\n");
        let (gw, store) = gateway(&site, &config).await;
        for attempt in 0..2 {
            let (status, body, _) = post(gw, "k-1").await;
            // A released record lets the retry run (and fail the same way);
            // an ambiguous one would answer 409 outcome-unknown.
            assert_eq!(status, 502, "{upstream} {ca} attempt {attempt}: {body}");
            assert!(body.contains("upstream-unreachable"), "{body}");
            assert!(body.contains(why), "{upstream} {ca}: {body}");
            assert!(body.contains(trust), "{upstream} {ca}: {body}");
        }
        assert_eq!(records(&store).await, vec![], "{upstream} {ca}: released");
    }
    assert_eq!(effects.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_stalled_handshake_is_bounded_by_the_connect_timeout() {
    let dir = tempfile::tempdir().unwrap();
    Pki::write(dir.path()).unwrap();
    // Accepts TCP and never answers the handshake.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let config = format!(
        "upstream = \"https://{addr}\"\nupstream_ca_file = \"ca.pem\"\nconnect_timeout_ms = 300\n"
    );
    let (gw, store) = gateway(dir.path(), &config).await;
    let started = std::time::Instant::now();
    let (status, body, _) = post(gw, "k-1").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("upstream-unreachable"), "{body}");
    assert!(body.contains("no connection within 300 ms"), "{body}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(records(&store).await, vec![], "released");
}

#[tokio::test]
async fn a_connection_lost_after_the_request_was_sent_stays_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::write(dir.path()).unwrap();
    let front = TlsFront::start(&pki, hangs_up().await).await.unwrap();
    let config = format!(
        "upstream = \"https://{}\"\nupstream_ca_file = \"ca.pem\"\n",
        front.addr()
    );
    let (gw, store) = gateway(dir.path(), &config).await;
    let (status, body, _) = post(gw, "k-1").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("upstream-failed"), "{body}");
    let (status, body, _) = post(gw, "k-1").await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("outcome-unknown"), "{body}");
    assert_eq!(records(&store).await, vec![State::Ambiguous]);
}

#[test]
fn bad_tls_files_are_refused_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    Pki::write(dir.path()).unwrap();
    std::fs::write(
        dir.path().join("ca.der"),
        [0x30u8, 0x82, 0x01, 0x0a, 0x02, 0x82],
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a certificate\n").unwrap();
    let https = "upstream = \"https://127.0.0.1:9\"\n";
    let admin = |cert: &str, key: &str| format!("{https}{cert}\n{key}\n");
    let cases = [
        (
            format!("{https}upstream_ca_file = \"missing.pem\""),
            "idem.toml: upstream_ca_file: cannot read ",
            "missing.pem",
        ),
        (
            format!("{https}upstream_ca_file = \"key.pem\""),
            "idem.toml: upstream_ca_file: ",
            "key.pem holds no certificate",
        ),
        (
            format!("{https}upstream_ca_file = \"ca.der\""),
            "idem.toml: upstream_ca_file: ",
            "ca.der is not a PEM file",
        ),
        (
            format!("{https}upstream_ca_file = \"notes.txt\""),
            "idem.toml: upstream_ca_file: ",
            "notes.txt is not a PEM file",
        ),
        (
            "upstream = \"http://127.0.0.1:9\"\nupstream_ca_file = \"ca.pem\"".to_owned(),
            "idem.toml: upstream_ca_file: ",
            "is not https://",
        ),
        (
            admin("admin_tls_cert_file = \"cert.pem\"", ""),
            "idem.toml: admin_tls_key_file: is required with admin_tls_cert_file",
            "",
        ),
        (
            admin("", "admin_tls_key_file = \"key.pem\""),
            "idem.toml: admin_tls_cert_file: is required with admin_tls_key_file",
            "",
        ),
        (
            admin(
                "admin_tls_cert_file = \"key.pem\"",
                "admin_tls_key_file = \"key.pem\"",
            ),
            "idem.toml: admin_tls_cert_file: ",
            "key.pem holds no certificate",
        ),
        (
            admin(
                "admin_tls_cert_file = \"cert.pem\"",
                "admin_tls_key_file = \"cert.pem\"",
            ),
            "idem.toml: admin_tls_key_file: ",
            "cert.pem holds no private key",
        ),
        (
            admin(
                "admin_tls_cert_file = \"cert.pem\"",
                "admin_tls_key_file = \"other-key.pem\"",
            ),
            "idem.toml: admin_tls_key_file: ",
            "the key must be the private key of the first certificate",
        ),
        (
            admin(
                "admin_tls_cert_file = \"missing.pem\"",
                "admin_tls_key_file = \"key.pem\"",
            ),
            "idem.toml: admin_tls_cert_file: cannot read ",
            "missing.pem",
        ),
    ];
    let path = dir.path().join("idem.toml");
    for (text, starts, names) in cases {
        std::fs::write(&path, &text).unwrap();
        let e = GatewayConfig::load(Some(&path), &Overrides::default())
            .unwrap_err()
            .to_string();
        let (_, after_dir) = e.split_once("idem.toml").unwrap();
        assert!(
            format!("idem.toml{after_dir}").starts_with(starts) && e.contains(names),
            "{text:?}: {e}"
        );
    }
    // Good files load, and say how the admin API speaks.
    let good = admin(
        "admin_tls_cert_file = \"cert.pem\"",
        "admin_tls_key_file = \"key.pem\"",
    ) + "upstream_ca_file = \"ca.pem\"";
    std::fs::write(&path, good).unwrap();
    let config = GatewayConfig::load(Some(&path), &Overrides::default()).unwrap();
    assert_eq!(config.admin_transport(), idem_gateway::AdminTransport::Tls);
    assert!(config.upstream_tls.is_some());
    // The command line names the same fields, relative to where it runs.
    let cli = Overrides {
        upstream: Some("https://127.0.0.1:9".into()),
        upstream_ca_file: Some(dir.path().join("nope.pem")),
        ..Overrides::default()
    };
    let e = GatewayConfig::load(None, &cli).unwrap_err().to_string();
    assert!(e.starts_with("upstream_ca_file: cannot read "), "{e}");
}

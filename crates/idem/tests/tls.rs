//! TLS through the real `idem serve` process: an `https://` upstream (a TLS
//! terminator with a throwaway CA's certificate in front of the payout API)
//! trusted through `--upstream-ca-file`, the same upstream refused without
//! it (released, never ambiguous), and the admin API served over HTTPS from
//! the config file's certificate and key.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_testkit::tls::{Pki, TlsFront};
use support::{Gateway, Site, Upstream, client, eventually, idem, key, post, text};

const TOKEN: &str = "0123456789abcdef-tls-admin";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_trusted_through_its_ca_file_and_refused_without() {
    let site = Site::new();
    let pki = Pki::write(site.dir.path()).unwrap();
    let up = Upstream::start().await;
    let front = TlsFront::start(&pki, up.addr).await.unwrap();
    let https = format!("https://{}", front.addr());
    let ca = pki.ca.to_str().unwrap();
    let gw = Gateway::start_args(&https, &site.store(), None, &["--upstream-ca-file", ca]);
    let body = r#"{"amount":5}"#;
    let first = post(&gw.url("/payouts"), &[key("pay-1")], body).await;
    assert_eq!(first.status, 201, "{first:?}\n{}", gw.logs());
    post(&gw.url("/payouts"), &[key("pay-1")], body)
        .await
        .assert_replay_of(&first);
    assert_eq!(up.effects().len(), 1);

    // The system's roots do not hold the throwaway CA: every handshake
    // fails, before the request is written, so the record is released and
    // the retry is refused the same way, not as an unknown outcome.
    let untrusting = Site::new();
    let gw = Gateway::start(&https, &untrusting.store(), None);
    for attempt in 0..2 {
        let reply = post(&gw.url("/payouts"), &[key("pay-2")], body).await;
        assert_eq!(reply.status, 502, "attempt {attempt}: {reply:?}");
        assert_eq!(
            reply.problem().as_deref(),
            Some("urn:idem:problem:upstream-unreachable"),
            "attempt {attempt}: {reply:?}"
        );
        assert!(reply.body.contains("invalid peer certificate"), "{reply:?}");
    }
    assert_eq!(up.hits(), 1, "nothing reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_speaks_https_with_the_configured_certificate() {
    let site = Site::new();
    let pki = Pki::write(site.dir.path()).unwrap();
    let up = Upstream::start().await;
    // Relative to the config file's directory, where the PKI was written.
    let config =
        site.config("admin_tls_cert_file = \"cert.pem\"\nadmin_tls_key_file = \"key.pem\"\n");
    let (gw, admin) = Gateway::start_admin(&up.url(), &site.store(), Some(&config), TOKEN);
    let said_tls = eventually(Duration::from_secs(5), || {
        gw.logs().contains("transport=Tls")
    })
    .await;
    assert!(said_tls, "{}", gw.logs());
    let https = https_client(&pki);

    let (status, page) = get(&https, &format!("https://{admin}/metrics"), Some(TOKEN)).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("idem_claims_total"), "{page}");
    let (status, _) = get(&https, &format!("https://{admin}/metrics"), None).await;
    assert_eq!(status, 401, "the token is still required over TLS");
    // The console on the same listener marks its session cookie Secure.
    let cookie = sign_in_cookie(&https, &format!("https://{admin}/ui/sign-in")).await;
    assert!(cookie.contains("Secure"), "{cookie}");
    assert!(cookie.contains("HttpOnly"), "{cookie}");

    // Plain HTTP gets no answer: the listener wants a TLS handshake.
    let plain = tokio::time::timeout(
        Duration::from_secs(10),
        client().request(
            axum::http::Request::get(format!("http://{admin}/metrics"))
                .header("authorization", format!("Bearer {TOKEN}"))
                .body(Body::empty())
                .unwrap(),
        ),
    )
    .await
    .expect("plain HTTP to the TLS listener ends at once");
    assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
    // One client's failed handshake does not stop the listener.
    let (status, _) = get(&https, &format!("https://{admin}/metrics"), Some(TOKEN)).await;
    assert_eq!(status, 200);
    // An idle TLS connection does not hold up a graceful stop.
    assert!(gw.terminate().success());

    // A certificate for an admin API that is off is a mistake, said at once.
    let said = refused_at_start(&up, &config);
    assert!(
        said.contains("admin_tls_cert_file: the admin API is off"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_listener_speaks_https_with_the_configured_certificate() {
    let site = Site::new();
    let pki = Pki::write(site.dir.path()).unwrap();
    let up = Upstream::start().await;
    let config = site.config("tls_cert_file = \"cert.pem\"\ntls_key_file = \"key.pem\"\n");
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    assert!(gw.logs().contains("tls=true"), "{}", gw.logs());
    let https = https_client(&pki);
    let url = format!("https://{}/payouts", gw.addr);
    let pay = || {
        axum::http::Request::post(&url)
            .header("idempotency-key", "tls-pay-1")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"amount":5}"#))
            .unwrap()
    };
    let first = https.request(pay()).await.unwrap();
    assert_eq!(first.status().as_u16(), 201, "{first:?}");
    let again = https.request(pay()).await.unwrap();
    assert_eq!(again.status().as_u16(), 201);
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );
    assert_eq!(up.effects().len(), 1, "the replay reached the upstream");

    // Plain HTTP gets no answer: the listener wants a TLS handshake.
    let plain = tokio::time::timeout(
        Duration::from_secs(10),
        client().request(
            axum::http::Request::post(gw.url("/payouts"))
                .header("idempotency-key", "tls-pay-2")
                .body(Body::from(r#"{"amount":5}"#))
                .unwrap(),
        ),
    )
    .await
    .expect("plain HTTP to the TLS listener ends at once");
    assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
    assert_eq!(up.effects().len(), 1, "plain HTTP reached the upstream");

    // A key without its certificate is refused at start, naming the field.
    let half = site.config("tls_key_file = \"key.pem\"\n");
    let said = refused_at_start(&up, &half);
    assert!(
        said.contains("tls_cert_file: is required with tls_key_file"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_homed_elsewhere_is_forwarded_to_an_https_peer() {
    let up = Upstream::start().await;
    let (eu_site, us_site) = (Site::new(), Site::new());
    let pki = Pki::write(eu_site.dir.path()).unwrap();
    let homed = "[[route]]\nname = \"payouts\"\npath = \"/payouts\"\n\
                 regions = { mode = \"home-region\", home = { from = \"key_prefix\", separator = \":\" } }\n";
    let us_config = us_site.config(&format!("region = \"us\"\n{homed}"));
    let us = Gateway::start(&up.url(), &us_site.store(), Some(&us_config));
    // The us gateway behind TLS, trusted by eu through its CA file.
    let front = TlsFront::start(&pki, us.addr).await.unwrap();
    let eu_config = eu_site.config(&format!(
        "region = \"eu\"\nupstream_ca_file = \"ca.pem\"\n[peers]\nus = \"https://{}\"\n{homed}",
        front.addr()
    ));
    let eu = Gateway::start(&up.url(), &eu_site.store(), Some(&eu_config));
    let body = r#"{"amount":5}"#;
    let first = post(&eu.url("/payouts"), &[key("us:pay-1")], body).await;
    assert_eq!(first.status, 201, "{first:?}\n{}", eu.logs());
    // The home region replays it, reached directly.
    post(&us.url("/payouts"), &[key("us:pay-1")], body)
        .await
        .assert_replay_of(&first);
    assert_eq!(up.effects().len(), 1);

    // Without the CA file the handshake fails: the key is not placed, and
    // nothing is claimed or run here in its stead.
    let untrusting = Site::new();
    let config = untrusting.config(&format!(
        "region = \"eu\"\n[peers]\nus = \"https://{}\"\n{homed}",
        front.addr()
    ));
    let eu = Gateway::start(&up.url(), &untrusting.store(), Some(&config));
    let refused = post(&eu.url("/payouts"), &[key("us:pay-2")], body).await;
    assert!(refused.status >= 500, "{refused:?}");
    assert_eq!(up.effects().len(), 1, "run without its home region");
    // The operator reads which roots refused the peer's certificate.
    let trust = "checked against the system's roots (no upstream_ca_file)";
    assert!(
        eventually(Duration::from_secs(5), || eu.logs().contains(trust)).await,
        "{}",
        eu.logs()
    );
}

/// What `idem serve` says when it refuses to start with `config`.
fn refused_at_start(up: &Upstream, config: &std::path::Path) -> String {
    let out = idem(&[
        "serve",
        "--upstream",
        &up.url(),
        "--config",
        config.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "started with {}", config.display());
    text(&out.stderr)
}

/// A route whose upstream pays and answers 500, with a lookup at `lookup`,
/// a reference per tenant, and a reconciler that scans every second.
fn failing_route_with_lookup(lookup: &str, extra: &str) -> String {
    format!(
        "{extra}\nresponse_timeout_ms = 1900\n\
         [reconcile]\ninterval_s = 1\nbackoff_ms = 50\nbackoff_max_ms = 200\nmax_tries = 100\n\
         [[route]]\nname = \"failing\"\nmethods = [\"POST\"]\npath = \"/fail\"\nlease_ms = 2000\n\
         forward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         [[lookup]]\nroute = \"failing\"\nurl = \"{lookup}/payouts/by-key/{{forwarded_key}}\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_lookup_trusts_the_upstream_ca_file_and_settles_the_retry() {
    let site = Site::new();
    let pki = Pki::write(site.dir.path()).unwrap();
    let up = Upstream::start().await;
    // The provider's lookup API over TLS; the upstream stays plain.
    let front = TlsFront::start(&pki, up.addr).await.unwrap();
    let https = format!("https://{}", front.addr());
    let config = site.config(&failing_route_with_lookup(
        &https,
        "upstream_ca_file = \"ca.pem\"",
    ));
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let body = r#"{"amount":5}"#;
    let first = post(&gw.url("/fail"), &[key("tls-look-1")], body).await;
    assert_eq!(first.status, 500, "{first:?}");
    let mut last = first;
    for _ in 0..100 {
        last = post(&gw.url("/fail"), &[key("tls-look-1")], body).await;
        if last.status != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        (last.status, last.header("idempotent-replayed")),
        (200, Some("true")),
        "{last:?}\n{}",
        gw.logs()
    );
    assert!(up.lookups() >= 1, "no lookup reached the provider");
    assert_eq!(up.effects().len(), 1);

    // Without the CA file the system's roots do not hold the throwaway CA:
    // the handshake fails, nothing reaches the provider, and the record
    // stays unknown rather than being guessed.
    let untrusting = Site::new();
    let config = untrusting.config(&failing_route_with_lookup(&https, ""));
    let gw = Gateway::start(&up.url(), &untrusting.store(), Some(&config));
    let lookups = up.lookups();
    let first = post(&gw.url("/fail"), &[key("tls-look-2")], body).await;
    assert_eq!(first.status, 500, "{first:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retry = post(&gw.url("/fail"), &[key("tls-look-2")], body).await;
    assert_eq!(
        retry.problem().as_deref(),
        Some("urn:idem:problem:outcome-unknown"),
        "{retry:?}"
    );
    assert_eq!(
        up.lookups(),
        lookups,
        "a lookup got through an untrusted handshake"
    );
    assert_eq!(
        up.effects().len(),
        2,
        "a retry of an unknown outcome ran it again"
    );
    let trust = "checked against the system's roots (no upstream_ca_file)";
    assert!(
        eventually(Duration::from_secs(5), || gw.logs().contains(trust)).await,
        "the failed lookup's log names what it trusted\n{}",
        gw.logs()
    );
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

/// Signs in to the console with the token; the session cookie set.
async fn sign_in_cookie(client: &HttpsClient, url: &str) -> String {
    let req = axum::http::Request::post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={TOKEN}")))
        .unwrap();
    let res = client.request(req).await.unwrap();
    assert_eq!(res.status().as_u16(), 303, "{res:?}");
    let cookie = res.headers().get("set-cookie").expect("a session cookie");
    cookie.to_str().unwrap().to_owned()
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

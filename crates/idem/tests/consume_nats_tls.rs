//! `idem consume` to a NATS server of the test's own that requires TLS and
//! a password, as every managed NATS does: reached through the CA file the
//! config names, and refused, naming the field and the file and never the
//! password, with another CA, another host name or a wrong password; to
//! one that verifies client certificates, reached with the certificate
//! and refused, about `cert_file`, without it; to one that takes a token
//! from the token file; and to one in operator mode, with the `.creds`
//! file of a user it knows and of one it does not.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::time::Duration;

use idem_testkit::brokers::nats::{Operator, OwnServer};
use idem_testkit::tls::Pki;
use support::broker::{
    Broker, Sub, consume_toml, drained, effects_per_key, own_server_bed, payout, payout_key,
    stop_settled,
};
use support::consume_suite::refused_at_start;
use support::nats::Nats;
use support::{Consumer, Upstream, eventually};

const PASSWORD: &str = "s3cret-nats-password";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_server_is_reached_through_its_ca_file_and_refused_by_name_otherwise() {
    let (up, site, data) = own_server_bed().await;
    let pki = Pki::write(site.dir.path()).unwrap();
    let (cert, key) = (pki.cert.to_str().unwrap(), pki.key.to_str().unwrap());
    let server = OwnServer::start_with(
        data.path(),
        &[
            "--tls",
            "--tlscert",
            cert,
            "--tlskey",
            key,
            "--user",
            "payer",
            "--pass",
            PASSWORD,
        ],
    );
    let port = server.port();
    let s = Nats::unique("tls");
    let store = format!("sqlite://{}", site.store().display());
    // The config: a tls:// URL with the user and password, the CA file
    // relative to the config file.
    let config_for = |host: &str, password: &str, ca: &str| {
        nats_config(
            &store,
            &up,
            &s,
            format!("tls://payer:{password}@{host}:{port}"),
            &format!("ca_file = \"{ca}\"\n"),
        )
    };
    let good = site.config(&config_for("127.0.0.1", PASSWORD, "ca.pem"));
    let consumer = Consumer::start(&good, 1);
    let options = async_nats::ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(pki.ca.clone())
        .user_and_password("payer".into(), PASSWORD.into());
    let url = format!("tls://127.0.0.1:{port}");
    let nats = Nats::connect_with(&url, options).await;
    one_payout_runs_once(&nats, &up, &store, &s, consumer, 847).await;

    // (what is wrong, config, the field named, what else must be named)
    let other_ca = pki
        .other_ca
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let cases = [
        (
            "another CA",
            config_for("127.0.0.1", PASSWORD, &other_ca),
            "nats.ca_file",
            other_ca.clone(),
        ),
        // The certificate names 127.0.0.1 only: the url's host is wrong.
        (
            "another name",
            config_for("localhost", PASSWORD, "ca.pem"),
            "nats.url",
            "localhost".to_owned(),
        ),
        (
            "a wrong password",
            config_for("127.0.0.1", "not-the-password", "ca.pem"),
            "nats.url",
            format!("payer:***@127.0.0.1:{port}"),
        ),
    ];
    for (what, text_of, field, named) in cases {
        refused_at_start(
            &site.config(&text_of),
            what,
            &format!("subscription[0].{field}"),
            &[&named],
            &[PASSWORD, "not-the-password"],
        );
    }
    nats.delete(&[&s]).await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_server_is_reached_through_the_token_file_and_refused_with_another() {
    let (up, site, data) = own_server_bed().await;
    const TOKEN: &str = "nats-token-never-shown-0123";
    let server = OwnServer::start_with(data.path(), &["--auth", TOKEN]);
    let s = Nats::unique("token");
    let store = format!("sqlite://{}", site.store().display());
    let config_for = |file: &str| {
        nats_config(
            &store,
            &up,
            &s,
            server.url(),
            &format!("token_file = \"{file}\"\n"),
        )
    };
    std::fs::write(site.dir.path().join("token.txt"), format!("{TOKEN}\n")).unwrap();
    std::fs::write(site.dir.path().join("wrong.txt"), "not-the-token\n").unwrap();
    let consumer = Consumer::start(&site.config(&config_for("token.txt")), 1);
    let nats = Nats::connect_with(
        &server.url(),
        async_nats::ConnectOptions::with_token(TOKEN.into()),
    )
    .await;
    one_payout_runs_once(&nats, &up, &store, &s, consumer, 848).await;

    refused_at_start(
        &site.config(&config_for("wrong.txt")),
        "a wrong token",
        "subscription[0].nats.token_file",
        &["wrong.txt"],
        &[TOKEN, "not-the-token"],
    );
    nats.delete(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_verifies_clients_is_reached_with_the_client_certificate() {
    let (up, site, data) = own_server_bed().await;
    let pki = Pki::write(site.dir.path()).unwrap();
    let (ca, cert, key) = (
        pki.ca.to_str().unwrap(),
        pki.cert.to_str().unwrap(),
        pki.key.to_str().unwrap(),
    );
    let server = OwnServer::start_with(
        data.path(),
        &[
            "--tlsverify",
            "--tlscert",
            cert,
            "--tlskey",
            key,
            "--tlscacert",
            ca,
        ],
    );
    let port = server.port();
    let s = Nats::unique("mtls");
    let store = format!("sqlite://{}", site.store().display());
    let config_with = |files: &str| {
        nats_config(
            &store,
            &up,
            &s,
            format!("tls://127.0.0.1:{port}"),
            &format!("ca_file = \"ca.pem\"\n{files}"),
        )
    };
    let with_cert = "cert_file = \"client-cert.pem\"\nkey_file = \"client-key.pem\"\n";
    let consumer = Consumer::start(&site.config(&config_with(with_cert)), 1);
    let options = async_nats::ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(pki.ca.clone())
        .add_client_certificate(pki.client_cert.clone(), pki.client_key.clone());
    let nats = Nats::connect_with(&format!("tls://127.0.0.1:{port}"), options).await;
    one_payout_runs_once(&nats, &up, &store, &s, consumer, 850).await;

    // Without the certificate the server refuses the handshake with an
    // alert: an error about cert_file.
    refused_at_start(
        &site.config(&config_with("")),
        "no client certificate",
        "subscription[0].nats.cert_file",
        &[],
        &[],
    );
    nats.delete(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creds_file_is_presented_to_an_operator_mode_server_and_a_stranger_is_refused() {
    let (up, site, data) = own_server_bed().await;
    let trust = Operator::write(site.dir.path());
    let server = OwnServer::start_with(data.path(), &["-c", trust.config.to_str().unwrap()]);
    let s = Nats::unique("creds");
    let store = format!("sqlite://{}", site.store().display());
    let config_for = |file: &str| {
        nats_config(
            &store,
            &up,
            &s,
            server.url(),
            &format!("creds_file = \"{file}\"\n"),
        )
    };
    let consumer = Consumer::start(&site.config(&config_for("payer.creds")), 1);
    let creds = std::fs::read_to_string(&trust.creds).unwrap();
    let options = async_nats::ConnectOptions::with_credentials(&creds).unwrap();
    let nats = Nats::connect_with(&server.url(), options).await;
    one_payout_runs_once(&nats, &up, &store, &s, consumer, 851).await;

    let seed = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("SU"))
            .unwrap()
            .to_owned()
    };
    let stranger = std::fs::read_to_string(&trust.stranger_creds).unwrap();
    refused_at_start(
        &site.config(&config_for("stranger.creds")),
        "a user of an account the server does not know",
        "subscription[0].nats.creds_file",
        &["stranger.creds"],
        &[&seed(&creds), &seed(&stranger)],
    );
    nats.delete(&[&s]).await;
}

/// Waits until `consumer` consumes (it declares the stream), publishes
/// one payout for `seller`, and checks that it ran once and everything
/// settled.
async fn one_payout_runs_once(
    nats: &Nats,
    up: &Upstream,
    store: &str,
    s: &str,
    consumer: Consumer,
    seller: u64,
) {
    assert!(
        consumer.logged("consuming", Duration::from_secs(15)).await,
        "{}",
        consumer.logs()
    );
    nats.publish_json(s, &payout(seller, "2026-W36", 1000 + seller), "m-1")
        .await;
    assert!(
        eventually(Duration::from_secs(15), || up.hits() == 1).await,
        "{}",
        consumer.logs()
    );
    stop_settled(nats, store, 1, &drained(s), vec![consumer]).await;
    assert_eq!(
        effects_per_key(up),
        [(payout_key(seller, "2026-W36"), 1)].into()
    );
}

/// The consumer's config for stream `s` at `url`, with `extra` lines in
/// its `[subscription.nats]` section.
fn nats_config(store: &str, up: &Upstream, s: &str, url: String, extra: &str) -> String {
    let sub = Sub {
        url: Some(url),
        ..Sub::new(s)
    };
    consume_toml::<Nats>(store, up, &[sub]).replace(
        "request_timeout_ms = 2000\n",
        &format!("request_timeout_ms = 2000\n{extra}"),
    )
}

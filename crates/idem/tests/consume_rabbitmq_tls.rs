//! `idem consume` to a RabbitMQ node of the test's own whose TLS listener
//! requires a client certificate, as a managed broker with mutual TLS
//! does: reached through the CA file, the client certificate and the
//! password file the config names (relative to it), and refused with
//! another CA, naming the field and the file and never the password.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::time::Duration;

use idem_testkit::brokers::rabbitmq::{Client, OwnNode};
use idem_testkit::tls::Pki;
use support::broker::{
    Broker, Publish, Sub, consume_toml, drained, effects_per_key, own_server_bed, payout,
    payout_key, stop_settled,
};
use support::consume_suite::refused_at_start;
use support::rabbit::Rabbit;
use support::{Consumer, eventually};

const PASSWORD: &str = "s3cret-rabbit-9c2d";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amqps_broker_is_reached_through_the_files_the_config_names_and_refused_otherwise() {
    let (up, site, data) = own_server_bed().await;
    let pki = Pki::write(site.dir.path()).unwrap();
    let node = OwnNode::start_tls(data.path(), &pki);
    node.add_user("payer", PASSWORD);
    std::fs::write(
        site.dir.path().join("password.txt"),
        format!("{PASSWORD}\n"),
    )
    .unwrap();
    let port = node.tls_port();
    let q = Rabbit::unique("tls");
    let store = format!("sqlite://{}", site.store().display());
    let config_for = |ca: &str| {
        let sub = Sub {
            url: Some(format!("amqps://payer@127.0.0.1:{port}/%2f")),
            ..Sub::new(&q)
        };
        consume_toml::<Rabbit>(&store, &up, &[sub]).replace(
            "settle_timeout_ms = 5000\n",
            &format!(
                "settle_timeout_ms = 5000\nca_file = \"{ca}\"\ncert_file = \"client-cert.pem\"\n\
                 key_file = \"client-key.pem\"\npassword_file = \"password.txt\"\n"
            ),
        )
    };
    let consumer = Consumer::start(&site.config(&config_for("ca.pem")), 1);
    assert!(
        consumer.logged("consuming", Duration::from_secs(15)).await,
        "{}",
        consumer.logs()
    );
    let rabbit = Rabbit {
        client: Client::connect_to(&node.url()).await,
    };
    rabbit
        .publish(
            &q,
            payout(849, "2026-W36", 1400).as_bytes(),
            Publish::json("m-1"),
        )
        .await;
    assert!(
        eventually(Duration::from_secs(15), || up.hits() == 1).await,
        "{}",
        consumer.logs()
    );
    stop_settled(&rabbit, &store, 1, &drained(&q), vec![consumer]).await;
    assert_eq!(
        effects_per_key(&up),
        [(payout_key(849, "2026-W36"), 1)].into()
    );

    refused_at_start(
        &site.config(&config_for("other-ca.pem")),
        "another CA",
        "subscription[0].rabbitmq.ca_file",
        &["other-ca.pem"],
        &[PASSWORD],
    );
    drop(node);
}

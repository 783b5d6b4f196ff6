//! RabbitMQ over `amqps://`, against a node of the test's own whose TLS
//! listener requires a client certificate (as a managed broker with mutual
//! TLS does): reached with the CA file, the client certificate and a
//! password file (a password of any characters, read as it is), and
//! refused with another CA, another host name, no client certificate or a
//! wrong password, each naming the field that can fix it and never a
//! password.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod rabbit_support;

use idem_broker::Subscription;
use idem_broker::rabbitmq::{RabbitConfig, RabbitSubscription};
use idem_testkit::brokers::rabbitmq::OwnNode;
use idem_testkit::tls::Pki;
use lapin::BasicProperties;
use rabbit_support::{Rabbit, TopologyCounts, config, next};

const PASSWORD: &str = "s3cret-rabbit-5b1e";
const WRONG: &str = "not-the-password-7f3a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_client_certificate_consumes_and_each_wrong_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::write(dir.path()).unwrap();
    let node = OwnNode::start_tls(dir.path(), &pki);
    node.add_user("payer", PASSWORD);
    std::fs::write(dir.path().join("password"), format!("{PASSWORD}\n")).unwrap();
    std::fs::write(dir.path().join("wrong"), format!("{WRONG}\n")).unwrap();
    let port = node.tls_port();
    let queue = config("tls").queue;
    let settings = |host: &str, ca: &str, client_cert: bool, password: &str| {
        let mut c = RabbitConfig::new(&queue);
        c.url = format!("amqps://payer@{host}:{port}/%2f");
        c.connect_timeout_ms = 10_000;
        c.settle_timeout_ms = 5_000;
        c.ca_file = Some(ca.into());
        if client_cert {
            c.cert_file = Some("client-cert.pem".into());
            c.key_file = Some("client-key.pem".into());
        }
        c.password_file = Some(password.into());
        c.relative_to(dir.path())
    };

    let good = settings("127.0.0.1", "ca.pem", true, "password");
    let sub = RabbitSubscription::connect(&good).await.unwrap();
    assert!(sub.connected(), "connected over TLS");
    assert_eq!(
        sub.describe(),
        format!("amqps://127.0.0.1:{port} vhost / queue {queue}")
    );
    let rabbit = Rabbit::connect_to(&node.url()).await;
    rabbit
        .publish(&queue, b"over tls", BasicProperties::default())
        .await;
    let d = next(&sub).await;
    assert_eq!(&d.message.payload[..], b"over tls");
    d.settle.ack().await.unwrap();
    assert_eq!(rabbit.wait_for_count(&queue, 0).await, 0);
    sub.close().await.unwrap();

    // (what is wrong, config, the field named, what the error must name,
    // whether it is transient).
    let cases = [
        (
            "another CA",
            settings("127.0.0.1", "other-ca.pem", true, "password"),
            "ca_file",
            "other-ca.pem",
            false,
        ),
        (
            "another host name",
            settings("localhost", "ca.pem", true, "password"),
            "url",
            "amqps://payer:***@localhost",
            false,
        ),
        (
            "a wrong password",
            settings("127.0.0.1", "ca.pem", true, "wrong"),
            "password_file",
            "amqps://payer:***@127.0.0.1",
            false,
        ),
    ];
    for (what, c, field, named, transient) in cases {
        let e = match RabbitSubscription::connect(&c).await {
            Ok(_) => panic!("{what}: connected"),
            Err(e) => e,
        };
        let said = e.to_string();
        assert_eq!(e.field, Some(field), "{what}: {said}");
        assert!(said.contains(named), "{what}: {named} in {said}");
        assert_eq!(e.transient, transient, "{what}: {said}");
        assert!(
            !said.contains(WRONG) && !said.contains(PASSWORD),
            "{what}: a password is shown: {said}"
        );
    }
    // Without a client certificate the node either sends its alert (seen:
    // about `cert_file`, permanent) or resets the connection first (a
    // reset may be the network's: transient, about `url`, the certificate
    // fields named as a hint); which one comes first is a race.
    let e = match RabbitSubscription::connect(&settings("127.0.0.1", "ca.pem", false, "password"))
        .await
    {
        Ok(_) => panic!("no client certificate: connected"),
        Err(e) => e,
    };
    let said = e.to_string();
    let alert = e.field == Some("cert_file") && !e.transient;
    let reset =
        e.field == Some("url") && e.transient && said.contains("set cert_file and key_file");
    assert!(alert || reset, "no client certificate: {e:?}");
    // A password with what a URL would need escaped, read from the file
    // as it is; and the same password in the URL, percent-encoded.
    const ODD: &str = "p@ss:w%rd/#?\"\\ é";
    node.add_user("odd", ODD);
    std::fs::write(dir.path().join("odd"), format!("{ODD}\r\n")).unwrap();
    let mut odd = settings("127.0.0.1", "ca.pem", true, "odd");
    odd.url = format!("amqps://odd@127.0.0.1:{port}/%2f");
    let sub = RabbitSubscription::connect(&odd).await.unwrap();
    sub.close().await.unwrap();
    let mut in_url = odd.clone();
    in_url.password_file = None;
    in_url.url = format!(
        "amqps://odd:{}@127.0.0.1:{port}/%2f",
        percent_encoding::utf8_percent_encode(ODD, percent_encoding::NON_ALPHANUMERIC)
    );
    let sub = RabbitSubscription::connect(&in_url).await.unwrap();
    assert!(!sub.describe().contains("p@ss"), "{}", sub.describe());
    sub.close().await.unwrap();
    let t = good.validate().unwrap();
    rabbit.delete(&t).await;
    rabbit.close().await;
    drop(node);
}

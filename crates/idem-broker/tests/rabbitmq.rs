//! The RabbitMQ adapter against the real broker on 127.0.0.1:5672: every
//! settlement, a crash, two consumers on one queue, headers, the declared
//! topology and the configuration's refusals. Every test uses queues of its
//! own and deletes them at the end.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod rabbit_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use idem_broker::Reason;
use idem_broker::rabbitmq::{
    ExchangeKind, REASON_DETAIL_HEADER, REASON_HEADER, RabbitConfig, RabbitSubscription,
};
use idem_testkit::tls::Pki;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};
use proptest::prelude::*;
use rabbit_support::{Rabbit, TopologyCounts, config, next, next_within, unique};

fn with_id(id: &str) -> BasicProperties {
    BasicProperties::default().with_message_id(id.into())
}

fn reason() -> Reason {
    Reason {
        code: "key-reused".into(),
        detail: "the key \"payout:847\" was used with another payload".into(),
    }
}

fn long(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).unwrap(),
        other => panic!("not a long string: {other:?}"),
    }
}

#[tokio::test]
async fn an_acked_message_is_not_delivered_again() {
    let rabbit = Rabbit::connect().await;
    let c = config("ack");
    let sub = RabbitSubscription::connect(&c).await.unwrap();
    let t = sub.topology().clone();
    rabbit
        .publish(t.queue(), b"{\"seller\":847}", with_id("m-1"))
        .await;

    let d = next(&sub).await;
    assert_eq!(&d.message.payload[..], b"{\"seller\":847}");
    assert_eq!(d.message.delivery, 1);
    assert_eq!(d.message.subject, t.queue());
    assert_eq!(d.message.message_id.as_deref(), Some("m-1"));
    d.settle.ack().await.unwrap();
    sub.close().await.unwrap();

    // Closing requeues whatever is unacknowledged: nothing is.
    assert_eq!(rabbit.counts(&t).await, [0, 0, 0, 0]);
    let sub = RabbitSubscription::connect(&c).await.unwrap();
    assert!(
        next_within(&sub, Duration::from_millis(500))
            .await
            .is_none()
    );
    sub.close().await.unwrap();
    rabbit.delete(&t).await;
    rabbit.close().await;
}

#[tokio::test]
async fn a_retried_message_comes_back_not_before_its_delay_and_counted() {
    let rabbit = Rabbit::connect().await;
    let sub = RabbitSubscription::connect(&config("retry")).await.unwrap();
    let t = sub.topology().clone();
    rabbit
        .publish(t.queue(), b"payout", with_id("m-retry"))
        .await;

    let first = next(&sub).await;
    assert_eq!(first.message.delivery, 1);
    let asked = Instant::now();
    first
        .settle
        .retry(Duration::from_millis(800))
        .await
        .unwrap();
    let second = next(&sub).await;
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_millis(800),
        "back after {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(8),
        "back only after {waited:?}"
    );
    assert_eq!(second.message.delivery, 2);
    assert_eq!(&second.message.payload[..], b"payout");
    assert_eq!(second.message.message_id.as_deref(), Some("m-retry"));
    assert_eq!(
        second.message.subject,
        t.queue(),
        "the original routing key"
    );

    second.settle.retry(Duration::ZERO).await.unwrap();
    let third = next(&sub).await;
    assert_eq!(third.message.delivery, 3);
    third.settle.ack().await.unwrap();
    sub.close().await.unwrap();
    assert_eq!(rabbit.counts(&t).await, [0, 0, 0, 0]);
    rabbit.delete(&t).await;
    rabbit.close().await;
}

#[tokio::test]
async fn a_dead_lettered_message_carries_its_reason_and_leaves_the_queue() {
    let rabbit = Rabbit::connect().await;
    let sub = RabbitSubscription::connect(&config("dead")).await.unwrap();
    let t = sub.topology().clone();
    let mut headers = FieldTable::default();
    headers.insert(
        "Idempotency-Key".into(),
        AMQPValue::LongString("payout:847".into()),
    );
    let props = with_id("m-dead")
        .with_headers(headers)
        .with_content_type("application/json".into());
    rabbit.publish(t.queue(), b"{}", props).await;

    let d = next(&sub).await;
    d.settle.dead_letter(reason()).await.unwrap();
    sub.close().await.unwrap();

    let copy = rabbit
        .get(t.dead_letter_queue())
        .await
        .expect("a copy on the dead-letter queue");
    let p = &copy.delivery.properties;
    let h = p.headers().clone().unwrap();
    assert_eq!(long(&h.inner()[REASON_HEADER]), "key-reused");
    assert_eq!(long(&h.inner()[REASON_DETAIL_HEADER]), reason().detail);
    assert_eq!(long(&h.inner()["Idempotency-Key"]), "payout:847");
    assert_eq!(p.message_id().as_ref().map(|m| m.as_str()), Some("m-dead"));
    assert_eq!(
        p.content_type().as_ref().map(|m| m.as_str()),
        Some("application/json")
    );
    assert_eq!(p.delivery_mode(), &Some(2));
    assert_eq!(&copy.delivery.data[..], b"{}");
    assert_eq!(
        rabbit.counts(&t).await,
        [0, 0, 0, 0],
        "one copy, original gone"
    );
    rabbit.delete(&t).await;
    rabbit.close().await;
}

#[tokio::test]
async fn a_late_message_is_copied_to_the_late_queue_and_leaves_the_queue() {
    let rabbit = Rabbit::connect().await;
    let sub = RabbitSubscription::connect(&config("late")).await.unwrap();
    let t = sub.topology().clone();
    rabbit.publish(t.queue(), b"late", with_id("m-late")).await;

    let d = next(&sub).await;
    let expired = Reason {
        code: "expired".into(),
        detail: "the key is past retention".into(),
    };
    d.settle.late(expired).await.unwrap();
    sub.close().await.unwrap();

    let copy = rabbit
        .get(t.late_queue())
        .await
        .expect("a copy on the late queue");
    let h = copy.delivery.properties.headers().clone().unwrap();
    assert_eq!(long(&h.inner()[REASON_HEADER]), "expired");
    assert_eq!(
        long(&h.inner()[REASON_DETAIL_HEADER]),
        "the key is past retention"
    );
    assert_eq!(&copy.delivery.data[..], b"late");
    assert_eq!(rabbit.counts(&t).await, [0, 0, 0, 0]);
    rabbit.delete(&t).await;
    rabbit.close().await;
}

#[tokio::test]
async fn a_delivery_dropped_unsettled_by_a_crash_is_delivered_again() {
    let rabbit = Rabbit::connect().await;
    let c = config("crash");
    let sub = RabbitSubscription::connect(&c).await.unwrap();
    let t = sub.topology().clone();
    rabbit
        .publish(t.queue(), b"crash", with_id("m-crash"))
        .await;

    let d = next(&sub).await;
    assert_eq!(d.message.delivery, 1);
    // The process dies: the delivery and the subscription go away unsettled.
    drop(d);
    drop(sub);

    let sub = RabbitSubscription::connect(&c).await.unwrap();
    let again = next(&sub).await;
    assert_eq!(&again.message.payload[..], b"crash");
    assert_eq!(again.message.message_id.as_deref(), Some("m-crash"));
    assert_eq!(again.message.delivery, 2, "redelivered after a crash");
    again.settle.ack().await.unwrap();
    sub.close().await.unwrap();
    assert_eq!(rabbit.counts(&t).await, [0, 0, 0, 0]);
    rabbit.delete(&t).await;
    rabbit.close().await;
}

#[tokio::test]
async fn a_settlement_on_a_closed_connection_fails_and_the_message_comes_back() {
    let rabbit = Rabbit::connect().await;
    let c = config("closed");
    let sub = RabbitSubscription::connect(&c).await.unwrap();
    let t = sub.topology().clone();
    rabbit.publish(t.queue(), b"one", with_id("m-1")).await;
    rabbit.publish(t.queue(), b"two", with_id("m-2")).await;
    rabbit.publish(t.queue(), b"three", with_id("m-3")).await;
    let ack = next(&sub).await;
    let dead = next(&sub).await;
    let retry = next(&sub).await;
    sub.close().await.unwrap();

    assert!(ack.settle.ack().await.is_err());
    assert!(dead.settle.dead_letter(reason()).await.is_err());
    assert!(retry.settle.retry(Duration::ZERO).await.is_err());
    assert_eq!(
        rabbit.wait_for_count(t.queue(), 3).await,
        3,
        "all three back"
    );
    assert_eq!(
        rabbit.counts(&t).await,
        [3, 0, 0, 0],
        "and no copy anywhere"
    );
    rabbit.delete(&t).await;
    rabbit.close().await;
}

#[tokio::test]
async fn a_failed_settlement_hands_the_message_back_and_the_next_connection_heals() {
    let rabbit = Rabbit::connect().await;
    let sub = RabbitSubscription::connect(&config("heal")).await.unwrap();
    let t = sub.topology().clone();
    rabbit.publish(t.queue(), b"heal", with_id("m-heal")).await;
    let first = next(&sub).await;

    // Someone deletes the dead-letter exchange: the copy cannot be sent
    // (the broker closes the publishing channel), so the original stays.
    rabbit.delete_exchange(t.dead_letter_exchange()).await;
    let e = first.settle.dead_letter(reason()).await.unwrap_err();
    assert!(e.transient, "{e}");

    // Handed back at once and delivered again, on a fresh connection that
    // declared the exchange again, where dead-lettering works.
    let second = next(&sub).await;
    assert_eq!(second.message.message_id.as_deref(), Some("m-heal"));
    assert_eq!(second.message.delivery, 2);
    second.settle.dead_letter(reason()).await.unwrap();
    sub.close().await.unwrap();
    assert!(rabbit.get(t.dead_letter_queue()).await.is_some());
    assert_eq!(rabbit.counts(&t).await, [0, 0, 0, 0]);
    rabbit.delete(&t).await;
    rabbit.close().await;
}

#[tokio::test]
async fn a_copy_no_queue_takes_makes_the_topology_be_declared_again_and_is_sent_again() {
    let rabbit = Rabbit::connect().await;
    let sub = RabbitSubscription::connect(&config("unroutable"))
        .await
        .unwrap();
    let t = sub.topology().clone();
    rabbit.publish(t.queue(), b"x", with_id("m-x")).await;
    let first = next(&sub).await;

    // The retry queue is gone: the broker confirms the copy but returns it
    // unrouted, and the channel stays open. The settlement declares the
    // topology again and sends the copy again, which now waits its TTL.
    rabbit.delete_queue(t.retry_queue()).await;
    first.settle.retry(Duration::ZERO).await.unwrap();
    let second = next(&sub).await;
    assert_eq!(second.message.message_id.as_deref(), Some("m-x"));
    assert_eq!(second.message.delivery, 2);

    // Likewise the dead-letter queue: the copy lands in the new one, and
    // only then is the original acknowledged.
    rabbit.delete_queue(t.dead_letter_queue()).await;
    second.settle.dead_letter(reason()).await.unwrap();
    sub.close().await.unwrap();
    let dead = rabbit.get(t.dead_letter_queue()).await.unwrap();
    assert_eq!(&dead.delivery.data[..], b"x");
    assert_eq!(rabbit.counts(&t).await, [0, 0, 0, 0]);
    rabbit.delete(&t).await;
    rabbit.close().await;
}

#[tokio::test]
async fn two_subscriptions_share_a_queue_without_sharing_a_delivery() {
    let rabbit = Rabbit::connect().await;
    let mut c = config("shared");
    c.prefetch = 1;
    let a = RabbitSubscription::connect(&c).await.unwrap();
    let b = RabbitSubscription::connect(&c).await.unwrap();
    let t = a.topology().clone();
    let ids: BTreeSet<String> = (0..8).map(|n| format!("m-{n}")).collect();
    for id in &ids {
        rabbit.publish(t.queue(), id.as_bytes(), with_id(id)).await;
    }

    // Each holds one unacknowledged delivery (prefetch 1): they differ.
    let (da, db) = tokio::join!(next(&a), next(&b));
    assert_ne!(da.message.message_id, db.message.message_id);
    let mut seen = vec![
        da.message.message_id.clone().unwrap(),
        db.message.message_id.clone().unwrap(),
    ];
    da.settle.ack().await.unwrap();
    db.settle.ack().await.unwrap();
    while seen.len() < ids.len() {
        for sub in [&a, &b] {
            if let Some(Ok(d)) = next_within(sub, Duration::from_millis(300)).await {
                seen.push(d.message.message_id.clone().unwrap());
                d.settle.ack().await.unwrap();
            }
        }
    }
    let distinct: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(
        seen.len(),
        distinct.len(),
        "no message delivered twice: {seen:?}"
    );
    assert_eq!(distinct, ids);
    a.close().await.unwrap();
    b.close().await.unwrap();
    assert_eq!(rabbit.counts(&t).await, [0, 0, 0, 0]);
    rabbit.delete(&t).await;
    rabbit.close().await;
}

#[tokio::test]
async fn headers_and_message_id_survive_delivery_retry_and_dead_letter() {
    let rabbit = Rabbit::connect().await;
    let sub = RabbitSubscription::connect(&config("headers"))
        .await
        .unwrap();
    let t = sub.topology().clone();
    let odd = "He said \"pay\" — ünïcødé ✓ 💸 'twice'";
    let mut headers = FieldTable::default();
    headers.insert("X-Odd-CaSe".into(), AMQPValue::LongString(odd.into()));
    headers.insert(
        "idempotency-key".into(),
        AMQPValue::LongString("payout:847:2026-W36".into()),
    );
    headers.insert("amount".into(), AMQPValue::LongLongInt(1200));
    rabbit
        .publish(
            t.queue(),
            b"{}",
            with_id("msg-ü-\"1\"").with_headers(headers),
        )
        .await;

    let expect = vec![
        ("X-Odd-CaSe".to_owned(), odd.to_owned()),
        ("amount".to_owned(), "1200".to_owned()),
        (
            "idempotency-key".to_owned(),
            "payout:847:2026-W36".to_owned(),
        ),
    ];
    let first = next(&sub).await;
    assert_eq!(first.message.headers, expect);
    assert_eq!(first.message.header("x-odd-case"), Some(odd));
    assert_eq!(first.message.message_id.as_deref(), Some("msg-ü-\"1\""));

    first.settle.retry(Duration::ZERO).await.unwrap();
    let second = next(&sub).await;
    assert_eq!(second.message.headers, expect, "after a retry");
    assert_eq!(second.message.message_id.as_deref(), Some("msg-ü-\"1\""));
    second.settle.dead_letter(reason()).await.unwrap();

    let copy = rabbit.get(t.dead_letter_queue()).await.unwrap();
    let h = copy.delivery.properties.headers().clone().unwrap();
    assert_eq!(long(&h.inner()["X-Odd-CaSe"]), odd);
    assert_eq!(h.inner()["amount"], AMQPValue::LongLongInt(1200));
    sub.close().await.unwrap();
    rabbit.delete(&t).await;
    rabbit.close().await;
}

#[tokio::test]
async fn a_queue_bound_to_an_exchange_keeps_the_routing_key_across_a_retry() {
    let rabbit = Rabbit::connect().await;
    let mut c = config("bound");
    c.exchange = Some(unique("x"));
    c.exchange_kind = ExchangeKind::Topic;
    c.routing_key = Some("payouts.*".into());
    let sub = RabbitSubscription::connect(&c).await.unwrap();
    let t = sub.topology().clone();
    let exchange = c.exchange.clone().unwrap();
    rabbit
        .publish_to(&exchange, "payouts.eu", b"eu", with_id("m-eu"))
        .await;

    let first = next(&sub).await;
    assert_eq!(first.message.subject, "payouts.eu");
    first.settle.retry(Duration::from_millis(50)).await.unwrap();
    let second = next(&sub).await;
    assert_eq!(second.message.subject, "payouts.eu");
    assert_eq!(second.message.delivery, 2);
    second.settle.ack().await.unwrap();
    sub.close().await.unwrap();
    rabbit.delete(&t).await;
    rabbit.close().await;
}

#[tokio::test]
async fn a_queue_declared_with_other_arguments_is_refused_naming_the_queue_and_argument() {
    let rabbit = Rabbit::connect().await;
    let c = config("inequivalent");
    let sub = RabbitSubscription::connect(&c).await.unwrap();
    let t = sub.topology().clone();
    sub.close().await.unwrap();

    let mut other = c.clone();
    other.dead_letter_exchange = Some(unique("other-dlx"));
    let e = RabbitSubscription::connect(&other).await.unwrap_err();
    assert!(!e.transient, "{e}");
    assert!(
        e.to_string().contains(&format!("queue `{}`", t.queue())),
        "{e}"
    );
    assert!(e.to_string().contains("`x-dead-letter-exchange`"), "{e}");

    // The declaration stops at the queue; the other exchange and its queue
    // were declared before it.
    let leftover = other.validate().unwrap();
    rabbit.delete(&t).await;
    rabbit.delete(&leftover).await;
    rabbit.close().await;
}

#[tokio::test]
async fn a_refused_login_is_permanent_and_an_absent_broker_transient() {
    let mut c = config("login");
    c.url = "amqp://guest:wrong@127.0.0.1:5672/%2f".into();
    let e = RabbitSubscription::connect(&c).await.unwrap_err();
    assert!(!e.transient, "{e}");
    assert!(
        !e.to_string().contains("wrong"),
        "the password is shown: {e}"
    );

    // Named by address, the password masked, and by field.
    c.url = "amqp://payer:s3cret@127.0.0.1:1/%2f".into();
    let e = RabbitSubscription::connect(&c).await.unwrap_err();
    assert!(e.transient, "{e}");
    assert_eq!(
        e.operation,
        "rabbitmq connect to amqp://payer:***@127.0.0.1:1/%2f"
    );
    assert_eq!(e.field, Some("url"));
    assert!(
        !e.to_string().contains("s3cret"),
        "the password is shown: {e}"
    );
}

#[tokio::test]
async fn the_content_type_is_the_property_else_the_header() {
    let rabbit = Rabbit::connect().await;
    let sub = RabbitSubscription::connect(&config("ctype")).await.unwrap();
    let t = sub.topology().clone();
    let table = |value: &str| {
        let mut headers = FieldTable::default();
        headers.insert("Content-Type".into(), AMQPValue::LongString(value.into()));
        headers
    };
    // (property, header, what the message says)
    let cases = [
        (Some("text/csv"), None, Some("text/csv")),
        (None, Some("text/plain"), Some("text/plain")),
        (Some("text/csv"), Some("text/plain"), Some("text/csv")),
        (None, None, None),
    ];
    for (property, header, _) in cases {
        let mut p = BasicProperties::default();
        if let Some(v) = property {
            p = p.with_content_type(v.into());
        }
        if let Some(v) = header {
            p = p.with_headers(table(v));
        }
        rabbit.publish(t.queue(), b"a,b", p).await;
    }
    for (property, header, want) in cases {
        let d = next(&sub).await;
        assert_eq!(
            d.message.content_type.as_deref(),
            want,
            "{property:?} {header:?}"
        );
        d.settle.ack().await.unwrap();
    }
    sub.close().await.unwrap();
    rabbit.delete(&t).await;
    rabbit.close().await;
}

#[test]
fn a_configuration_with_a_typo_or_a_bad_value_is_refused_naming_the_field() {
    let cases: &[(&str, &str)] = &[
        ("queue = 'q'\nprefech = 4", "prefech"),
        ("queu = 'q'", "queu"),
        ("prefetch = 4", "queue"),
        ("queue = 'q'\nretry = 'delayed'", "retry"),
        ("queue = 'q'\nexchange_kind = 'diect'", "exchange_kind"),
    ];
    for (text, field) in cases {
        let e = toml::from_str::<RabbitConfig>(text).unwrap_err();
        assert!(e.to_string().contains(field), "{text:?}: {e}");
    }

    let long = "q".repeat(250);
    let cases: &[(&str, &str)] = &[
        ("queue = 'q'\nprefetch = 0", "prefetch"),
        ("queue = ''", "queue"),
        ("queue = 'amq.mine'", "queue"),
        (&format!("queue = '{long}'"), "queue"),
        ("queue = 'q'\nurl = 'http://127.0.0.1'", "url"),
        // TLS files an amqp:// connection would silently not use.
        ("queue = 'q'\nca_file = 'ca.pem'", "ca_file"),
        (
            "queue = 'q'\ncert_file = 'c.pem'\nkey_file = 'k.pem'",
            "cert_file",
        ),
        (
            "queue = 'q'\nurl = 'amqps://127.0.0.1'\ncert_file = 'c.pem'",
            "key_file",
        ),
        (
            "queue = 'q'\nurl = 'amqps://127.0.0.1'\nca_file = '/nonexistent/ca.pem'",
            "ca_file",
        ),
        (
            "queue = 'q'\nurl = 'amqp://u:p@127.0.0.1'\npassword_file = '/nonexistent'",
            "password_file",
        ),
        (
            "queue = 'q'\nurl = 'amqp://u@127.0.0.1'\npassword_file = '/nonexistent'",
            "password_file",
        ),
        // No user to go with the password: the client would log in as guest.
        (
            "queue = 'q'\npassword_file = '/nonexistent'",
            "password_file",
        ),
        (
            "queue = 'q'\nurl = 'amqp://127.0.0.1'\npassword_file = '/nonexistent'",
            "password_file",
        ),
        // The client's parser would connect to localhost instead.
        ("queue = 'q'\nurl = 'amqp://u@[::1]:5672/%2f'", "url"),
        ("queue = 'q'\nrouting_key = 'k'", "routing_key"),
        ("queue = 'q'\nexchange = ''", "exchange"),
        ("queue = 'q'\ndead_letter_queue = 'q'", "dead_letter_queue"),
        ("queue = 'q'\nlate_queue = 'q.retry'", "late_queue"),
        ("queue = 'q'\nlate_queue = 'q.dead'", "late_queue"),
        (
            "queue = 'q'\ndead_letter_exchange = ''",
            "dead_letter_exchange",
        ),
        ("queue = 'q'\nconnect_timeout_ms = 0", "connect_timeout_ms"),
        ("queue = 'q'\nsettle_timeout_ms = 0", "settle_timeout_ms"),
    ];
    for (text, field) in cases {
        let c: RabbitConfig = toml::from_str(text).unwrap();
        let e = c.validate().unwrap_err();
        assert_eq!(e.field, *field, "{text:?}: {e}");
    }
}

#[test]
fn tls_and_password_files_are_read_at_validation_and_refused_by_field_and_path() {
    let dir = tempfile::tempdir().unwrap();
    Pki::write(dir.path()).unwrap();
    std::fs::write(dir.path().join("password"), "from-the-file\nignored\n").unwrap();
    std::fs::write(dir.path().join("empty"), "\n").unwrap();
    std::fs::write(
        dir.path().join("encrypted.pem"),
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
    )
    .unwrap();
    let with = |extra: &str| -> RabbitConfig {
        let c: RabbitConfig = toml::from_str(&format!(
            "queue = 'q'\nurl = 'amqps://payer@127.0.0.1/%2f'\n{extra}"
        ))
        .unwrap();
        c.relative_to(dir.path())
    };
    let good = with(
        "ca_file = 'ca.pem'\ncert_file = 'client-cert.pem'\nkey_file = 'client-key.pem'\n\
         password_file = 'password'",
    );
    good.validate().unwrap();
    assert_eq!(good.masked_url(), "amqps://payer:***@127.0.0.1:5671/%2f");
    // (config, field, what the reason names)
    let cases = [
        (
            "ca_file = 'password'",
            "ca_file",
            "password: holds no usable PEM",
        ),
        (
            "cert_file = 'client-cert.pem'\nkey_file = 'encrypted.pem'",
            "key_file",
            "encrypted.pem: holds no usable PEM PRIVATE KEY",
        ),
        (
            "cert_file = 'client-key.pem'\nkey_file = 'client-key.pem'",
            "cert_file",
            "client-key.pem: holds no usable PEM CERTIFICATE",
        ),
        (
            "cert_file = 'client-cert.pem'\nkey_file = 'ca.pem'",
            "key_file",
            "ca.pem: holds no usable PEM PRIVATE KEY",
        ),
        (
            "password_file = 'empty'",
            "password_file",
            "empty: holds no password",
        ),
        ("password_file = 'missing'", "password_file", "missing"),
    ];
    for (extra, field, named) in cases {
        let e = with(extra).validate().unwrap_err();
        assert_eq!(e.field, field, "{extra}: {e:?}");
        assert!(e.reason.contains(named), "{extra}: {e:?}");
    }
    let both: RabbitConfig = toml::from_str(
        "queue = 'q'\nurl = 'amqps://payer:inline@127.0.0.1'\npassword_file = 'password'",
    )
    .unwrap();
    let e = both.relative_to(dir.path()).validate().unwrap_err();
    assert_eq!(e.field, "password_file", "{e:?}");
    assert!(!e.reason.contains("inline"), "{e:?}");
    assert!(!e.reason.contains("from-the-file"), "{e:?}");
}

#[test]
fn a_configuration_left_to_its_defaults_derives_every_name_from_the_queue() {
    let c: RabbitConfig = toml::from_str("queue = 'payouts'").unwrap();
    assert_eq!(c, RabbitConfig::new("payouts"));
    assert_eq!(c.url, "amqp://guest:guest@127.0.0.1:5672/%2f");
    assert_eq!(c.prefetch, 16);
    let t = c.validate().unwrap();
    assert_eq!(
        [
            t.queue(),
            t.retry_queue(),
            t.dead_letter_exchange(),
            t.dead_letter_queue(),
            t.late_queue()
        ],
        [
            "payouts",
            "payouts.retry",
            "payouts.dlx",
            "payouts.dead",
            "payouts.late"
        ]
    );
    assert_eq!(t.binding(), None);

    let c: RabbitConfig = toml::from_str(
        "queue = 'payouts'\nexchange = 'amq.topic'\nexchange_kind = 'topic'\nlate_queue = 'late'",
    )
    .unwrap();
    let t = c.validate().unwrap();
    assert_eq!(t.binding(), Some(("amq.topic", "payouts")));
    assert_eq!(t.late_queue(), "late");
}

#[tokio::test]
async fn an_invalid_configuration_is_a_permanent_connect_error_naming_the_field() {
    let mut c = config("invalid");
    c.prefetch = 0;
    let e = RabbitSubscription::connect(&c).await.unwrap_err();
    assert!(!e.transient);
    assert!(e.to_string().contains("prefetch"), "{e}");
}

fn header_maps() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map("[A-Za-z][A-Za-z0-9_-]{0,24}", "\\PC{0,40}", 0..5)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever text headers and message id a publisher sets come out of a
    /// delivery as they went in.
    #[test]
    fn any_text_headers_round_trip(headers in header_maps(), id in "\\PC{1,40}") {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let rabbit = Rabbit::connect().await;
            let sub = RabbitSubscription::connect(&config("prop")).await.unwrap();
            let t = sub.topology().clone();
            let mut table = FieldTable::default();
            for (k, v) in &headers {
                table.insert(k.as_str().into(), AMQPValue::LongString(LongString::from(v.as_str())));
            }
            let props = BasicProperties::default().with_message_id(id.as_str().into()).with_headers(table);
            rabbit.publish(t.queue(), b"p", props).await;
            let d = next(&sub).await;
            let got: Vec<(String, String)> = d.message.headers.clone();
            let got_id = d.message.message_id.clone();
            let want: Vec<(String, String)> = headers.clone().into_iter().collect();
            d.settle.ack().await.unwrap();
            sub.close().await.unwrap();
            rabbit.delete(&t).await;
            rabbit.close().await;
            prop_assert_eq!(got, want);
            prop_assert_eq!(got_id, Some(id.clone()));
            Ok(())
        })?;
    }
}

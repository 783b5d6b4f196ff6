//! `idem consume` over the real RabbitMQ (127.0.0.1:5672), black-box: the
//! consumer suite (`support/consume_suite.rs`) with RabbitMQ as the
//! broker, each test's queue and the retry, dead-letter and late queues
//! the consumer declares for it, and RabbitMQ's own cases: a dead-letter
//! queue deleted under a running consumer, and a message's media type
//! from its property or its header.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::time::Duration;

use support::broker::{Bed, Broker, Publish, Sub, consume_toml, drained, payout};
use support::consume_suite::key_reused_is_dead_lettered;
use support::rabbit::Rabbit;
use support::{Consumer, eventually};

const WAIT: Duration = Duration::from_secs(15);

consume_suite!(Rabbit);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_dead_letter_queue_is_declared_again_and_the_poison_message_lands_in_it() {
    let bed = Bed::<Rabbit>::new().await;
    let q = Rabbit::unique("deaddeleted");
    let consumer = Consumer::start(&bed.config(&[Sub::new(&q)]), 1);
    bed.publish(&q, &payout(847, "2026-W36", 1200), "m-1").await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    // An operator deletes the dead-letter queue while the consumer runs:
    // the dead-letter exchange is left with no queue bound to it.
    bed.broker.client.delete_queue(&format!("{q}.dead")).await;
    let other = payout(847, "2026-W36", 9999);
    bed.publish(&q, &other, "m-2").await;
    // Five seconds in which a copy that cannot be routed would be handed
    // back and delivered again thousands of times.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let attempts = consumer
        .logs()
        .lines()
        .filter(|l| l.contains("message dead-lettered"))
        .count();
    let lines = consumer.logs().lines().count();
    assert!(
        (1..20).contains(&attempts) && lines < 60,
        "{attempts} dead-letter attempts, {lines} log lines in 5 s:\n{}",
        consumer.logs()
    );

    key_reused_is_dead_lettered(&bed, &q, &other, consumer).await;
    bed.delete(&[&q]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_reaches_the_endpoint_with_the_content_type_it_was_published_with() {
    let bed = Bed::<Rabbit>::new().await;
    let q = Rabbit::unique("csv");
    let sub = Sub {
        key: "payout:{header:intent-id}".into(),
        lookup: false,
        ..Sub::new(&q)
    };
    let text = consume_toml::<Rabbit>(&bed.store_url(), &bed.up, &[sub])
        .replace("key = ", "fingerprint = \"bytes\"\nkey = ");
    let consumer = Consumer::start(&bed.site.config(&text), 1);
    // (intent, content_type property, header, what the endpoint must see)
    let cases = [
        ("847-W36", Some("text/csv"), None, "text/csv"),
        ("848-W36", None, Some("text/csv"), "text/csv"),
        ("849-W36", Some("text/csv"), Some("text/plain"), "text/csv"),
        ("850-W36", None, None, "application/json"),
    ];
    for (intent, property, header, _) in cases {
        let mut headers = vec![("intent-id", intent)];
        headers.extend(header.map(|value| ("content-type", value)));
        let message = Publish {
            id: intent,
            content_type: property,
            headers: &headers,
        };
        bed.broker
            .publish(&q, b"seller_id,amount\n847,1200\n", message)
            .await;
    }
    bed.stop_settled(&bed.store_url(), cases.len(), &drained(&q), vec![consumer])
        .await;
    let effects = bed.up.effects();
    for (intent, _, _, want) in cases {
        let key = format!("payout:{intent}");
        let effect = effects
            .iter()
            .find(|e| e.key.as_deref() == Some(&key))
            .unwrap_or_else(|| panic!("{key} was not delivered: {effects:?}"));
        assert_eq!(effect.content_type.as_deref(), Some(want), "{key}");
    }
    bed.delete(&[&q]).await;
}

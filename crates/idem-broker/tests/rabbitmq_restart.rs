//! The broker restarts under a subscription: `next()` fails transiently
//! while it is down, a settlement of a delivery taken before fails, and once
//! the broker is back the subscription reconnects on its own, the
//! unacknowledged message comes again and nothing is lost or doubled.
//!
//! Alone in its test binary, because it stops the broker every other
//! RabbitMQ test depends on; cargo runs test binaries one after another.
//! The restart is `rabbitmqctl stop_app` / `start_app` (the RabbitMQ
//! application stops and closes every connection; the Erlang node stays),
//! and a guard starts the application again even if the test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod rabbit_support;

use std::time::{Duration, Instant};

use idem_broker::rabbitmq::RabbitSubscription;
use idem_testkit::brokers::rabbitmq::Outage;
use lapin::BasicProperties;
use rabbit_support::{Rabbit, TopologyCounts, config, next, next_within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_fails_next_transiently_then_redelivers_without_loss() {
    let rabbit = Rabbit::connect().await;
    let mut c = config("restart");
    c.connect_timeout_ms = 2_000;
    let sub = RabbitSubscription::connect(&c).await.unwrap();
    let t = sub.topology().clone();
    let persistent = BasicProperties::default().with_message_id("before".into());
    rabbit.publish(t.queue(), b"before", persistent).await;
    let before = next(&sub).await;
    assert_eq!(before.message.delivery, 1);

    let stopped = tokio::task::spawn_blocking(Outage::now).await.unwrap();
    let e = before.settle.ack().await.unwrap_err();
    assert!(e.transient, "{e}");
    for _ in 0..3 {
        let asked = Instant::now();
        let e = next_within(&sub, Duration::from_secs(5))
            .await
            .expect("next() answers while the broker is down")
            .expect_err("no delivery while the broker is down");
        assert!(e.transient, "{e}");
        assert!(asked.elapsed() < Duration::from_secs(5));
    }
    tokio::task::spawn_blocking(move || drop(stopped))
        .await
        .unwrap();

    // Back: the subscription reconnects by itself on a later next().
    let deadline = Instant::now() + Duration::from_secs(60);
    let again = loop {
        match next_within(&sub, Duration::from_secs(5)).await {
            Some(Ok(d)) => break d,
            Some(Err(e)) => assert!(e.transient, "{e}"),
            None => {}
        }
        assert!(
            Instant::now() < deadline,
            "no delivery 60 s after the restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(&again.message.payload[..], b"before");
    assert_eq!(again.message.message_id.as_deref(), Some("before"));
    assert_eq!(again.message.delivery, 2, "redelivered");
    again.settle.ack().await.unwrap();

    let rabbit = Rabbit::connect().await;
    let after = BasicProperties::default().with_message_id("after".into());
    rabbit.publish(t.queue(), b"after", after).await;
    let d = next(&sub).await;
    assert_eq!(d.message.message_id.as_deref(), Some("after"));
    assert_eq!(d.message.delivery, 1);
    d.settle.ack().await.unwrap();
    assert!(
        next_within(&sub, Duration::from_millis(500))
            .await
            .is_none(),
        "nothing doubled"
    );
    sub.close().await.unwrap();
    assert_eq!(rabbit.counts(&t).await, [0, 0, 0, 0]);
    rabbit.delete(&t).await;
    rabbit.close().await;
}

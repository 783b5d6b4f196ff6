//! RabbitMQ restarts under a running `idem consume`: the messages in hand
//! are paid but cannot be acked, the consumer waits the outage out and
//! reconnects by itself, the broker delivers the unacknowledged messages
//! again, and their records replay them: nothing is lost, nothing doubled.
//!
//! Alone in its test binary, because it stops the broker every other
//! RabbitMQ test depends on; cargo runs test binaries one after another.
//! The restart is `rabbitmqctl stop_app` / `start_app`, and a guard starts
//! the application again even if the test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::time::Duration;

use idem_testkit::brokers::rabbitmq::Outage;
use support::broker::{
    Broker, Counts, Sub, consume_toml, effects_per_key, payout, payout_key, settled, stop_settled,
};
use support::rabbit::Rabbit;
use support::{Consumer, Site, Upstream, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_run_loses_nothing_and_doubles_nothing() {
    // 20 payouts answered in 500 ms, two at a time: five seconds of work,
    // longer than `rabbitmqctl stop_app` takes to act.
    const SENT: u64 = 20;
    let up = Upstream::start().await;
    let site = Site::new();
    let q = Rabbit::unique("restart");
    let store = format!("sqlite://{}", site.store().display());
    let sub = Sub {
        deliver: "/slow?ms=500".into(),
        concurrency: 2,
        ..Sub::new(&q)
    };
    // With its own probe listener, whose /readyz must follow the outage.
    let port = idem_testkit::free_port().unwrap();
    let text = consume_toml::<Rabbit>(&store, &up, &[sub]).replace(
        "purge_interval_s = 1\n",
        &format!("purge_interval_s = 1\nprobe_listen = \"127.0.0.1:{port}\"\n"),
    );
    let readyz = || async move {
        support::send("GET", &format!("http://127.0.0.1:{port}/readyz"), &[], "").await
    };
    let consumer = Consumer::start(&site.config(&text), 1);
    let rabbit = Rabbit::connect().await;
    for seller in 0..SENT {
        let intent = payout(seller, "2026-W36", 100 + seller);
        rabbit
            .publish_json(&q, &intent, &format!("m-{seller}"))
            .await;
    }
    assert!(eventually(Duration::from_secs(15), || up.hits() >= 2).await);

    let down = tokio::task::spawn_blocking(Outage::now).await.unwrap();
    assert!(
        consumer
            .logged("broker cannot deliver", Duration::from_secs(15))
            .await,
        "the consumer did not notice the outage:\n{}",
        consumer.logs()
    );
    let paid_while_down = up.hits();
    // Not ready, naming the broker, while it is down (an answer is reused
    // for a second).
    let mut down_said = None;
    for _ in 0..50 {
        let reply = readyz().await;
        if reply.status == 503 {
            down_said = Some(reply.body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let down_said = down_said.expect("still ready 10 s into the outage");
    let doc: serde_json::Value = serde_json::from_str(&down_said).unwrap();
    assert_eq!(
        doc["checks"]["broker:payouts"], "disconnected",
        "{down_said}"
    );
    assert!(!down_said.contains("amqp"), "{down_said}");
    tokio::task::spawn_blocking(move || drop(down))
        .await
        .unwrap();

    // The old connection died with the broker.
    let rabbit = Rabbit::connect().await;
    // Ready again once the consumer has its connection back.
    let mut ready = false;
    for _ in 0..150 {
        if readyz().await.status == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        ready,
        "not ready 30 s after the broker came back:\n{}",
        consumer.logs()
    );
    let stopped = stop_settled(
        &rabbit,
        &store,
        SENT as usize,
        &[(&q, Counts::default())],
        vec![consumer],
    )
    .await;
    let want = (0..SENT).map(|s| (payout_key(s, "2026-W36"), 1)).collect();
    assert_eq!(effects_per_key(&up), want, "effects per key");
    let s = settled(&stopped, "payouts");
    // An ack lost with its connection may be sent again for the redelivery.
    assert!(s.acked >= SENT, "{s:?}");
    // The workers held paid messages when the broker went: their acks
    // failed, and the redeliveries were replays.
    assert!(
        s.settle_failed >= 1,
        "no message was in hand at the outage: {s:?}"
    );
    assert!(
        paid_while_down < SENT as usize,
        "every message ran before the outage: the restart tested nothing"
    );
    rabbit.delete(&[&q]).await;
}

//! NATS restarts under a running `idem consume`: the messages in hand are
//! paid but cannot be acked, the consumer waits the outage out and its
//! client reconnects by itself, JetStream delivers the unacknowledged
//! messages again after `ack_wait`, and their records replay them: nothing
//! is lost, nothing doubled.
//!
//! The server is the test's own (`nats-server -js` on a free port with a
//! store directory of its own), stopped with SIGTERM and started again on
//! the same port and store, and killed on drop even if the test fails: the
//! shared server the other tests use is never touched. In its own test
//! binary all the same, as the RabbitMQ restart test is.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::time::Duration;

use idem_testkit::brokers::nats::OwnServer;
use support::broker::{
    Broker, Counts, Sub, consume_toml, effects_per_key, payout, payout_key, settled, stop_settled,
};
use support::nats::Nats;
use support::{Consumer, Site, Upstream, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_run_loses_nothing_and_doubles_nothing() {
    // 20 payouts answered in 500 ms, two at a time, four at most delivered
    // and unsettled: five seconds of work, and the outage lands in it.
    const SENT: u64 = 20;
    let up = Upstream::start().await;
    let site = Site::new();
    let data = tempfile::tempdir().unwrap();
    let mut server = OwnServer::start(data.path());
    let s = Nats::unique("restart");
    let store = format!("sqlite://{}", site.store().display());
    let sub = Sub {
        url: Some(server.url()),
        deliver: "/slow?ms=500".into(),
        concurrency: 2,
        prefetch: 4,
        ..Sub::new(&s)
    };
    let consumer = Consumer::start(&site.config(&consume_toml::<Nats>(&store, &up, &[sub])), 1);
    let nats = Nats::connect_to(&server.url()).await;
    for seller in 0..SENT {
        let intent = payout(seller, "2026-W36", 100 + seller);
        nats.publish_json(&s, &intent, &format!("m-{seller}")).await;
    }
    drop(nats);
    assert!(eventually(Duration::from_secs(15), || up.hits() >= 2).await);

    let mut server = tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap();
    // The workers finish what they hold; its settlement fails.
    assert!(
        consumer
            .logged("cannot settle the message", Duration::from_secs(15))
            .await,
        "the consumer did not notice the outage:\n{}",
        consumer.logs()
    );
    let paid_while_down = up.hits();
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();

    let nats = Nats::connect_to(&server.url()).await;
    let stopped = stop_settled(
        &nats,
        &store,
        SENT as usize,
        &[(&s, Counts::default())],
        vec![consumer],
    )
    .await;
    let want = (0..SENT).map(|s| (payout_key(s, "2026-W36"), 1)).collect();
    assert_eq!(effects_per_key(&up), want, "effects per key");
    let c = settled(&stopped, "payouts");
    // An ack whose confirmation was lost may have taken effect: then the
    // message is not delivered again, and it counts once, as failed.
    assert!(c.acked + c.settle_failed >= SENT, "{c:?}");
    // The workers held paid messages when the server went: their acks
    // failed, and the redeliveries were replays.
    assert!(
        c.settle_failed >= 1,
        "no message was in hand at the outage: {c:?}"
    );
    assert!(
        paid_while_down < SENT as usize,
        "every message ran before the outage: the restart tested nothing"
    );
    nats.delete(&[&s]).await;
    drop(server);
}

/// `idem consume`'s own probe listener: ready while its broker connection
/// is live, not ready naming the broker while the server is down (the
/// process itself stays live), and ready again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_the_broker_while_it_is_down_and_is_ready_again_after() {
    let up = Upstream::start().await;
    let site = Site::new();
    let data = tempfile::tempdir().unwrap();
    let server = OwnServer::start(data.path());
    let s = Nats::unique("probes");
    let store = format!("sqlite://{}", site.store().display());
    let sub = Sub {
        url: Some(server.url()),
        ..Sub::new(&s)
    };
    let port = idem_testkit::free_port().unwrap();
    let text = consume_toml::<Nats>(&store, &up, &[sub]).replace(
        "purge_interval_s = 1\n",
        &format!("purge_interval_s = 1\nprobe_listen = \"127.0.0.1:{port}\"\n"),
    );
    let consumer = Consumer::start(&site.config(&text), 1);
    assert!(
        consumer
            .logged("probes listening", Duration::from_secs(15))
            .await,
        "{}",
        consumer.logs()
    );
    let get = |path: &'static str| async move {
        support::send("GET", &format!("http://127.0.0.1:{port}{path}"), &[], "").await
    };
    let ready = get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(broker_status(&ready.body), "connected", "{}", ready.body);
    // The broker's URL is the log's, never the probe's.
    let url = server.url();
    assert!(!ready.body.contains(&url), "{}", ready.body);

    let mut server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.stop();
        server
    })
    .await
    .unwrap();
    let mut down = None;
    for _ in 0..100 {
        let reply = get("/readyz").await;
        if reply.status == 503 {
            down = Some(reply);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let down = down.expect("still ready 20 s after the server stopped");
    assert_eq!(broker_status(&down.body), "disconnected", "{}", down.body);
    assert!(!down.body.contains(&url), "{}", down.body);
    assert_eq!(
        get("/healthz").await.status,
        200,
        "the process is still live"
    );

    server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let mut back = false;
    for _ in 0..150 {
        if get("/readyz").await.status == 200 {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        back,
        "not ready 30 s after the server came back:\n{}",
        consumer.logs()
    );
    let stopped = tokio::task::spawn_blocking(move || consumer.stop())
        .await
        .unwrap();
    assert!(stopped.status.success(), "{}", stopped.log);
    Nats::connect_to(&server.url()).await.delete(&[&s]).await;
}

/// What `/readyz`'s body says of the subscription `payouts`' broker.
fn broker_status(body: &str) -> String {
    let doc: serde_json::Value = serde_json::from_str(body).unwrap();
    doc["checks"]["broker:payouts"]
        .as_str()
        .unwrap_or_else(|| panic!("no broker check: {body}"))
        .to_owned()
}

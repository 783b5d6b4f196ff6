//! The NATS adapter against a real JetStream server: the one at
//! 127.0.0.1:4222 (`.ci/run` starts it), and, for the restart test, a
//! server of the test's own on a free port, so restarting it disturbs no
//! other test. Every test uses its own stream names and deletes them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use idem_broker::nats::{NatsConfig, NatsSubscription};
use idem_broker::{Delivery, Reason, Subscription};
use idem_testkit::brokers::nats::{OwnServer, URL};
use idem_testkit::brokers::unique;
use idem_testkit::services::Service;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};

/// One test's stream, its subject, and a client to publish and inspect with.
struct Fixture {
    js: Context,
    url: String,
    stream: String,
    subject: String,
}

impl Fixture {
    async fn new(url: &str) -> Fixture {
        let stream = unique("stream");
        let client = async_nats::connect(url)
            .await
            .unwrap_or_else(|e| panic!("{}", Service::Nats.missing(url, &e)));
        Fixture {
            js: jetstream::new(client),
            url: url.to_owned(),
            subject: format!("idemtest.{}.in", stream.to_lowercase()),
            stream,
        }
    }

    fn config(&self, ack_wait_ms: u64) -> NatsConfig {
        NatsConfig {
            url: self.url.clone(),
            ack_wait_ms,
            request_timeout_ms: 2_000,
            ..NatsConfig::new(&self.stream, [format!("{}.>", self.subject)])
        }
    }

    fn topic(&self, n: usize) -> String {
        format!("{}.{n}", self.subject)
    }

    async fn subscribe(&self, config: NatsConfig) -> NatsSubscription {
        NatsSubscription::connect(config).await.unwrap()
    }

    async fn publish(&self, topic: String, payload: &str, headers: HeaderMap) {
        self.js
            .publish_with_headers(topic, headers, Bytes::copy_from_slice(payload.as_bytes()))
            .await
            .unwrap()
            .await
            .unwrap();
    }

    async fn cleanup(self) {
        for name in [
            self.stream.clone(),
            format!("{}_DLQ", self.stream),
            format!("{}_LATE", self.stream),
        ] {
            let _ = self.js.delete_stream(&name).await;
        }
    }
}

/// The next delivery, or `None` if none arrives within `wait`.
async fn next_within(sub: &NatsSubscription, wait: Duration) -> Option<Delivery> {
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, sub.next()).await {
            Err(_) => return None,
            Ok(Ok(delivery)) => return Some(delivery),
            Ok(Err(e)) => {
                assert!(e.transient, "a permanent error: {e}");
                if Instant::now() >= deadline {
                    return None;
                }
            }
        }
    }
}

fn text(d: &Delivery) -> String {
    String::from_utf8(d.message.payload.to_vec()).unwrap()
}

fn header_map(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, *value);
    }
    map
}

#[tokio::test]
async fn an_acked_message_is_not_delivered_again() {
    let f = Fixture::new(URL).await;
    let sub = f.subscribe(f.config(1_000)).await;
    assert_eq!(
        sub.describe(),
        format!("nats://127.0.0.1:4222 {}/idem", f.stream)
    );
    f.publish(f.topic(1), "one", HeaderMap::new()).await;

    let d = next_within(&sub, Duration::from_secs(10)).await.unwrap();
    assert_eq!(text(&d), "one");
    assert_eq!(d.message.delivery, 1);
    assert_eq!(d.message.subject, f.topic(1));
    d.settle.ack().await.unwrap();

    // Past ack_wait, twice over: an unacked message would be back by now.
    assert!(
        next_within(&sub, Duration::from_millis(2_500))
            .await
            .is_none()
    );
    f.cleanup().await;
}

#[tokio::test]
async fn a_retried_message_comes_back_not_before_its_delay_counted_twice() {
    let f = Fixture::new(URL).await;
    // ack_wait far longer than the delay: the redelivery is the retry's.
    let sub = f.subscribe(f.config(30_000)).await;
    f.publish(f.topic(1), "again", HeaderMap::new()).await;

    let d = next_within(&sub, Duration::from_secs(10)).await.unwrap();
    let after = Duration::from_millis(1_500);
    let asked = Instant::now();
    d.settle.retry(after).await.unwrap();

    let d = next_within(&sub, Duration::from_secs(10)).await.unwrap();
    assert!(asked.elapsed() >= after, "back after {:?}", asked.elapsed());
    assert_eq!(text(&d), "again");
    assert_eq!(d.message.delivery, 2);
    d.settle.ack().await.unwrap();
    f.cleanup().await;
}

/// Which copy a test asks for.
#[derive(Clone, Copy)]
enum Sink {
    DeadLetter,
    Late,
}

async fn copy_is_stored_and_the_original_stops(sink: Sink) {
    let f = Fixture::new(URL).await;
    let config = f.config(1_000);
    let (copy_subject, copy_stream) = match sink {
        Sink::DeadLetter => (config.dead_letter_subject(), format!("{}_DLQ", f.stream)),
        Sink::Late => (config.late_subject(), format!("{}_LATE", f.stream)),
    };
    let sub = f.subscribe(config).await;
    let headers = header_map(&[
        ("Tenant", "t-7"),
        ("Nats-Msg-Id", "original-1"),
        ("Idem-Reason", "stale"),
    ]);
    f.publish(f.topic(3), r#"{"amount":"10.00"}"#, headers)
        .await;

    let d = next_within(&sub, Duration::from_secs(10)).await.unwrap();
    let reason = Reason {
        code: "key-reused".into(),
        detail: "the key was used\nwith another payload".into(),
    };
    match sink {
        Sink::DeadLetter => d.settle.dead_letter(reason).await.unwrap(),
        Sink::Late => d.settle.late(reason).await.unwrap(),
    }

    let stored = f.js.get_stream(&copy_stream).await.unwrap();
    assert_eq!(stored.cached_info().state.messages, 1);
    let copy = stored
        .get_last_raw_message_by_subject(&copy_subject)
        .await
        .unwrap();
    assert_eq!(&copy.payload[..], br#"{"amount":"10.00"}"#);
    let h = |name: &str| -> Vec<String> {
        copy.headers
            .get_all(name)
            .map(|v| v.as_str().to_owned())
            .collect()
    };
    assert_eq!(h("Tenant"), ["t-7"]);
    assert_eq!(h("Idem-Reason"), ["key-reused"]);
    assert_eq!(
        h("Idem-Reason-Detail"),
        ["the key was used with another payload"]
    );
    assert_eq!(h("Idem-Original-Subject"), [f.topic(3)]);
    assert_eq!(h("Idem-Original-Message-Id"), ["original-1"]);

    // Past ack_wait, twice over: the original is not delivered again.
    assert!(
        next_within(&sub, Duration::from_millis(2_500))
            .await
            .is_none()
    );
    f.cleanup().await;
}

#[tokio::test]
async fn a_dead_lettered_message_is_stored_with_its_reason_and_not_redelivered() {
    copy_is_stored_and_the_original_stops(Sink::DeadLetter).await;
}

#[tokio::test]
async fn a_late_message_is_copied_to_the_late_sink_and_not_redelivered() {
    copy_is_stored_and_the_original_stops(Sink::Late).await;
}

#[tokio::test]
async fn a_copy_no_stream_stores_fails_and_leaves_the_original_to_come_back() {
    let f = Fixture::new(URL).await;
    let sub = f.subscribe(f.config(1_000)).await;
    // The sink stream vanishes after start: nothing would store the copy.
    f.js.delete_stream(format!("{}_DLQ", f.stream))
        .await
        .unwrap();
    f.publish(f.topic(1), "kept", HeaderMap::new()).await;

    let d = next_within(&sub, Duration::from_secs(10)).await.unwrap();
    let reason = Reason {
        code: "no-key".into(),
        detail: "no key".into(),
    };
    assert!(d.settle.dead_letter(reason).await.is_err());

    let d = next_within(&sub, Duration::from_secs(10)).await.unwrap();
    assert_eq!(text(&d), "kept");
    assert_eq!(d.message.delivery, 2);
    d.settle.ack().await.unwrap();
    f.cleanup().await;
}

#[tokio::test]
async fn a_delivery_lost_in_a_crash_is_redelivered_to_the_next_subscription() {
    let f = Fixture::new(URL).await;
    let crashed = f.subscribe(f.config(1_000)).await;
    f.publish(f.topic(1), "survivor", HeaderMap::new()).await;
    let d = next_within(&crashed, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(d.message.delivery, 1);
    drop(d);
    drop(crashed);

    let next = f.subscribe(f.config(1_000)).await;
    let d = next_within(&next, Duration::from_secs(10)).await.unwrap();
    assert_eq!(text(&d), "survivor");
    assert_eq!(d.message.delivery, 2);
    d.settle.ack().await.unwrap();
    f.cleanup().await;
}

#[tokio::test]
async fn two_subscriptions_on_one_durable_share_the_messages_without_overlap() {
    let f = Fixture::new(URL).await;
    let config = NatsConfig {
        prefetch: 2,
        ..f.config(30_000)
    };
    let subs = [
        Arc::new(f.subscribe(config.clone()).await),
        Arc::new(f.subscribe(config).await),
    ];
    let total = 40;
    for n in 0..total {
        f.publish(f.topic(n), &format!("m{n}"), HeaderMap::new())
            .await;
    }

    let mut tasks = Vec::new();
    for sub in &subs {
        let sub = Arc::clone(sub);
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(d) = next_within(&sub, Duration::from_secs(3)).await {
                got.push(text(&d));
                tokio::time::sleep(Duration::from_millis(10)).await;
                d.settle.ack().await.unwrap();
            }
            got
        }));
    }
    let mut seen = BTreeMap::new();
    let mut per_sub = Vec::new();
    for task in tasks {
        let got = task.await.unwrap();
        per_sub.push(got.len());
        for payload in got {
            *seen.entry(payload).or_insert(0) += 1;
        }
    }
    assert_eq!(seen.len(), total, "every message delivered");
    assert!(
        seen.values().all(|&n| n == 1),
        "a message reached both: {seen:?}"
    );
    assert!(per_sub.iter().all(|&n| n > 0), "one took all: {per_sub:?}");
    f.cleanup().await;
}

#[tokio::test]
async fn headers_and_message_id_come_through_as_published() {
    let f = Fixture::new(URL).await;
    let sub = f.subscribe(f.config(5_000)).await;
    let odd = r#"say "hi" — ünïcødé ✓ 'x'"#;
    let headers = header_map(&[
        ("Nats-Msg-Id", "msg-Ä1"),
        ("X-oDD-Case", odd),
        ("x-rep", "1"),
        ("x-rep", "2"),
        ("Idempotency-Key", "\"quoted-key\""),
    ]);
    f.publish(f.topic(1), "h", headers).await;

    let d = next_within(&sub, Duration::from_secs(10)).await.unwrap();
    let m = &d.message;
    assert_eq!(m.message_id.as_deref(), Some("msg-Ä1"));
    let pairs: Vec<(&str, &str)> = m
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("Idempotency-Key", "\"quoted-key\""),
            ("Nats-Msg-Id", "msg-Ä1"),
            ("X-oDD-Case", odd),
            ("x-rep", "1"),
            ("x-rep", "2"),
        ]
    );
    assert_eq!(m.header("x-odd-case"), Some(odd));
    assert_eq!(m.content_type, None);
    d.settle.ack().await.unwrap();
    f.cleanup().await;
}

#[tokio::test]
async fn the_content_type_header_is_the_messages_content_type_whatever_its_case() {
    let f = Fixture::new(URL).await;
    let sub = f.subscribe(f.config(5_000)).await;
    f.publish(
        f.topic(1),
        "a,b",
        header_map(&[("content-TYPE", "text/csv")]),
    )
    .await;
    let d = next_within(&sub, Duration::from_secs(10)).await.unwrap();
    assert_eq!(d.message.content_type.as_deref(), Some("text/csv"));
    d.settle.ack().await.unwrap();
    f.cleanup().await;
}

#[tokio::test]
async fn a_deleted_durable_is_created_again_after_what_was_settled() {
    let f = Fixture::new(URL).await;
    let sub = f.subscribe(f.config(30_000)).await;
    for n in ["one", "two"] {
        f.publish(f.topic(1), n, HeaderMap::new()).await;
        let d = next_within(&sub, Duration::from_secs(10)).await.unwrap();
        assert_eq!(text(&d), n);
        d.settle.ack().await.unwrap();
    }
    // Long enough for the subscription to ask for the ack floor again.
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    assert!(
        next_within(&sub, Duration::from_millis(500))
            .await
            .is_none()
    );
    f.js.get_stream(&f.stream)
        .await
        .unwrap()
        .delete_consumer("idem")
        .await
        .unwrap();
    f.publish(f.topic(1), "three", HeaderMap::new()).await;

    // The next delivery is the first message not settled, not the stream's
    // first message, and the consumer keeps its configuration.
    let d = next_within(&sub, Duration::from_secs(15)).await.unwrap();
    assert_eq!(text(&d), "three");
    d.settle.ack().await.unwrap();
    let info =
        f.js.get_stream(&f.stream)
            .await
            .unwrap()
            .consumer_info("idem")
            .await
            .unwrap();
    assert_eq!(info.config.ack_wait, Duration::from_millis(30_000));
    assert_eq!(info.config.max_ack_pending, 64);
    f.cleanup().await;
}

#[tokio::test]
async fn a_deleted_stream_is_a_permanent_error_naming_the_field() {
    let f = Fixture::new(URL).await;
    let sub = f.subscribe(f.config(5_000)).await;
    f.js.delete_stream(&f.stream).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match sub.next().await {
                Err(e) if !e.transient => return e,
                Err(_) => {}
                Ok(d) => panic!("a delivery from a deleted stream: {d:?}"),
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(e.field, Some("stream"), "{e}");
    assert!(e.reason.contains(&f.stream), "{e}");
    f.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_server_is_named_with_the_password_masked() {
    let port = idem_testkit::free_port().unwrap();
    let config = NatsConfig {
        url: format!("nats://payer:s3cret@127.0.0.1:{port}"),
        request_timeout_ms: 1_000,
        ..NatsConfig::new("UNREACHABLE", ["unreachable.>"])
    };
    let e = NatsSubscription::connect(config).await.err().unwrap();
    assert_eq!(e.field, Some("url"), "{e}");
    let shown = e.to_string();
    assert!(
        shown.contains(&format!("nats://payer:***@127.0.0.1:{port}")),
        "{shown}"
    );
    assert!(!shown.contains("s3cret"), "{shown}");
}

/// Header names a publisher may use (not the server's `Nats-*`), with
/// values free of line breaks and of white space at either end, which the
/// client trims.
fn headers_strategy() -> impl Strategy<Value = Vec<(String, String)>> {
    let name = "[A-Za-z][A-Za-z0-9_-]{0,12}".prop_filter("Nats-* is the server's", |n| {
        !n.to_ascii_lowercase().starts_with("nats-")
    });
    let value = "[^\r\n]{0,24}".prop_map(|v| v.trim().to_owned());
    prop::collection::vec((name, value), 0..6)
}

#[test]
fn any_header_names_and_values_round_trip() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let f = rt.block_on(Fixture::new(URL));
    let sub = rt.block_on(f.subscribe(f.config(5_000)));
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let result = runner.run(&headers_strategy(), |published| {
        rt.block_on(async {
            let mut map = HeaderMap::new();
            for (n, v) in &published {
                map.append(n.as_str(), v.as_str());
            }
            f.publish(f.topic(1), "p", map).await;
            let d = next_within(&sub, Duration::from_secs(10))
                .await
                .ok_or_else(|| TestCaseError::fail("no delivery"))?;
            let mut expected = published.clone();
            expected.sort_by(|a, b| a.0.cmp(&b.0));
            let got = d.message.headers.clone();
            d.settle.ack().await.unwrap();
            prop_assert_eq!(got, expected);
            Ok(())
        })
    });
    rt.block_on(f.cleanup());
    result.unwrap();
}

#[tokio::test]
async fn a_typo_in_the_configuration_is_refused_naming_the_field() {
    let err = toml::from_str::<NatsConfig>(
        r#"
        stream = "PAYOUTS"
        subjects = ["payouts.>"]
        ack_wiat_ms = 5000
        "#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("ack_wiat_ms"), "{err}");

    let err = toml::from_str::<NatsConfig>("subjects = [\"payouts.>\"]").unwrap_err();
    assert!(err.to_string().contains("stream"), "{err}");

    let config: NatsConfig = toml::from_str(
        r#"
        stream = "PAYOUTS"
        subjects = ["payouts.>"]
        prefetch = 0
        "#,
    )
    .unwrap();
    let err = NatsSubscription::connect(config).await.err().unwrap();
    assert!(!err.transient);
    assert!(err.reason.starts_with("prefetch:"), "{err}");
}

#[tokio::test]
async fn the_broker_refuses_what_would_loop_or_mislead_naming_the_field() {
    let f = Fixture::new(URL).await;
    // A dead-letter subject the consumed stream captures: copies would loop.
    let looping = NatsConfig {
        dead_letter_subject: Some(f.topic(99)),
        ..f.config(1_000)
    };
    let err = NatsSubscription::connect(looping).await.err().unwrap();
    assert!(!err.transient);
    assert!(err.reason.starts_with("dead_letter_subject:"), "{err}");

    // The stream now exists with the fixture's subjects; other subjects are refused.
    let other = NatsConfig {
        subjects: vec![format!("{}.other", f.subject)],
        ..f.config(1_000)
    };
    let err = NatsSubscription::connect(other).await.err().unwrap();
    assert!(!err.transient);
    assert!(err.reason.starts_with("subjects:"), "{err}");

    // Declaring twice is harmless.
    let _first = f.subscribe(f.config(1_000)).await;
    let _second = f.subscribe(f.config(2_000)).await;
    f.cleanup().await;
}

#[tokio::test]
async fn a_server_restart_mid_run_loses_no_message_and_delivery_resumes() {
    let store = tempfile::tempdir().unwrap();
    let mut server = OwnServer::start(store.path());
    let f = Fixture::new(&server.url()).await;
    let sub = f
        .subscribe(NatsConfig {
            prefetch: 4,
            ..f.config(3_000)
        })
        .await;
    let total = 12;
    for n in 0..total {
        f.publish(f.topic(n), &format!("m{n}"), HeaderMap::new())
            .await;
    }
    let all: BTreeSet<String> = (0..total).map(|n| format!("m{n}")).collect();

    let mut acked = BTreeSet::new();
    for _ in 0..4 {
        let d = next_within(&sub, Duration::from_secs(10)).await.unwrap();
        acked.insert(text(&d));
        d.settle.ack().await.unwrap();
    }
    let held = next_within(&sub, Duration::from_secs(10)).await.unwrap();

    server.stop();
    // Whatever was prefetched may still come out; then the outage shows as a
    // transient error.
    let mut unsettled = vec![held];
    let deadline = Instant::now() + Duration::from_secs(40);
    let outage = loop {
        assert!(
            Instant::now() < deadline,
            "next() never reported the outage"
        );
        match tokio::time::timeout(Duration::from_secs(30), sub.next()).await {
            Ok(Ok(d)) => unsettled.push(d),
            Ok(Err(e)) => break e,
            Err(_) => panic!("next() neither delivered nor failed within 30 s"),
        }
    };
    assert!(outage.transient, "{outage}");
    // No settlement succeeds without a server, and none takes effect later.
    for d in unsettled {
        let e = d.settle.ack().await.unwrap_err();
        assert!(e.transient, "{e}");
    }

    server.restart();
    let deadline = Instant::now() + Duration::from_secs(90);
    while acked != all {
        assert!(
            Instant::now() < deadline,
            "still missing {:?}",
            all.difference(&acked).collect::<Vec<_>>()
        );
        let Some(d) = next_within(&sub, Duration::from_secs(10)).await else {
            continue;
        };
        let payload = text(&d);
        if d.settle.ack().await.is_ok() {
            acked.insert(payload);
        }
    }
    // Everything acked: nothing more comes, past ack_wait twice over.
    assert!(next_within(&sub, Duration::from_secs(7)).await.is_none());
    drop(sub);
    f.cleanup().await;
    server.stop();
}

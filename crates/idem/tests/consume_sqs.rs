//! `idem consume` over Amazon SQS on moto in server mode (127.0.0.1:4568,
//! started by `scripts/test.sh`), black-box: the consumer suite
//! (`support/consume_suite.rs`) with SQS as the broker, each test's queue
//! and its two sink queues created as an operator would, and SQS's own
//! cases: a visibility timeout shorter than the effect, a FIFO queue's
//! groups kept in order, a queue deleted under a running consumer, and a
//! redrive from the queue's redrive-policy dead-letter queue.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use aws_sdk_sqs::types::QueueAttributeName;
use support::sqs::Sqs;

consume_suite!(Sqs);

use std::collections::HashMap;
use std::time::{Duration, Instant};

use support::broker::{Bed, Broker, Publish, Sub, drained, payout, payout_key, settled};
use support::{Consumer, eventually};

const WAIT: Duration = Duration::from_secs(15);

/// A visibility timeout of 4 s (the suite's shortest) and an effect that
/// takes 5 s: the keeper
/// extends the message's visibility while it runs, so no other worker
/// receives it meanwhile: one effect, one delivery, acked, never retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_visibility_shorter_than_the_effect_is_extended_and_the_message_comes_once() {
    let bed = Bed::<Sqs>::new().await;
    let q = Sqs::unique("visibility");
    let sub = Sub {
        deliver: "/slow?ms=5000".into(),
        response_timeout_ms: 7_000,
        lease_ms: 10_000,
        ack_wait_ms: 2_000,
        concurrency: 4,
        ..Sub::new(&q)
    };
    let consumer = Consumer::start(&bed.config(&[sub]), 1);
    bed.publish(&q, &payout(847, "2026-W36", 1200), "m-1").await;
    let stopped = bed
        .stop_settled(&bed.store_url(), 1, &drained(&q), vec![consumer])
        .await;
    bed.assert_effects(&[(&payout_key(847, "2026-W36"), 1)]);
    let c = settled(&stopped, "payouts");
    assert_eq!(
        (c.acked, c.retried, c.settle_failed),
        (1, 0, 0),
        "delivered again while it ran: {c:?}\n{}",
        stopped[0].log
    );
    bed.delete(&[&q]).await;
}

/// Two message groups of a FIFO queue, three messages each, sent before a
/// consumer with four workers starts (SQS hands out a group's messages in
/// one batch): inside a group each message starts only once the one
/// before it was settled, in the order they were sent, and the groups run
/// side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_queue_keeps_each_group_in_order_and_runs_the_groups_side_by_side() {
    const EFFECT_MS: u64 = 1_000;
    let bed = Bed::<Sqs>::new().await;
    let q = format!("{}.fifo", Sqs::unique("fifo"));
    let sub = Sub {
        deliver: format!("/slow?ms={EFFECT_MS}"),
        response_timeout_ms: 3_000,
        lease_ms: 5_000,
        ack_wait_ms: 5_000,
        concurrency: 4,
        ..Sub::new(&q)
    };
    let config = bed.config(&[sub]);
    // Sent before the consumer starts: its first receive takes them all.
    let order: Vec<(u64, String)> = ["a", "b"]
        .into_iter()
        .enumerate()
        .flat_map(|(seller, _)| (1..=3).map(move |n| (seller as u64, format!("s{n}"))))
        .collect();
    for (seller, settlement) in &order {
        let group = if *seller == 0 { "a" } else { "b" };
        let id = format!("m-{seller}-{settlement}");
        let message = Publish {
            id: &id,
            content_type: Some("application/json"),
            headers: &[("group", group)],
        };
        let body = payout(*seller, settlement, 100);
        bed.broker.publish(&q, body.as_bytes(), message).await;
    }
    let consumer = Consumer::start(&config, 1);
    // When each effect began, as the test sees the payout API's ledger.
    let mut began: HashMap<String, Instant> = HashMap::new();
    let deadline = Instant::now() + WAIT;
    while began.len() < order.len() && Instant::now() < deadline {
        for effect in bed.up.effects() {
            if let Some(key) = effect.key {
                began.entry(key).or_insert_with(Instant::now);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(began.len(), order.len(), "{}", consumer.logs());
    for seller in [0, 1] {
        let keys: Vec<String> = (1..=3)
            .map(|n| payout_key(seller, &format!("s{n}")))
            .collect();
        for pair in keys.windows(2) {
            let gap = began[&pair[1]].saturating_duration_since(began[&pair[0]]);
            assert!(
                gap >= Duration::from_millis(EFFECT_MS * 3 / 4),
                "{} began {gap:?} after {}: not after it was settled",
                pair[1],
                pair[0]
            );
        }
    }
    // One group after the other would start the sixth effect five effects
    // after the first; side by side it starts well before (moto hands out
    // one group per receive, so the second group may start one long poll
    // after the first).
    let first = began.values().min().unwrap();
    let last = began.values().max().unwrap();
    assert!(
        *last - *first < Duration::from_millis(EFFECT_MS * 4),
        "the groups did not run side by side: {:?} from the first effect to the last",
        *last - *first
    );
    let stopped = bed
        .stop_settled(&bed.store_url(), order.len(), &drained(&q), vec![consumer])
        .await;
    assert_eq!(settled(&stopped, "payouts").acked, order.len() as u64);
    bed.delete(&[&q]).await;
}

/// A FIFO group's first message is refused once (503, released) while
/// the two after it, received in the same batch, would be paid at once:
/// the retry hands those two back with the same delay, so they are paid
/// after the first, in the order they were sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_fifo_message_takes_the_rest_of_its_group_back_with_it() {
    let bed = Bed::<Sqs>::new().await;
    let q = format!("{}.fifo", Sqs::unique("fiforetry"));
    let sub = Sub {
        deliver: "/busy-once".into(),
        concurrency: 4,
        ..Sub::new(&q)
    };
    let config = bed.config(&[sub]);
    let keys: Vec<String> = (1..=3).map(|n| payout_key(847, &format!("s{n}"))).collect();
    for key in &keys[1..] {
        bed.up.busy_answered(key);
    }
    for n in 1..=3 {
        let id = format!("m-{n}");
        let message = Publish {
            id: &id,
            content_type: Some("application/json"),
            headers: &[("group", "seller-847")],
        };
        let body = payout(847, &format!("s{n}"), 100);
        bed.broker.publish(&q, body.as_bytes(), message).await;
    }
    let consumer = Consumer::start(&config, 1);
    let stopped = bed
        .stop_settled(&bed.store_url(), 3, &drained(&q), vec![consumer])
        .await;
    let paid: Vec<String> = bed.up.effects().into_iter().filter_map(|e| e.key).collect();
    assert_eq!(paid, keys, "paid out of order\n{}", stopped[0].log);
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.retried), (3, 1), "{c:?}");
    bed.delete(&[&q]).await;
}

/// The queue deleted under a running consumer: SQS answers that it does
/// not exist, which waiting will not mend, so `idem consume` stops with an
/// error naming the field and the queue (a supervisor restarts it, and it
/// refuses to start until the queue is back). Created again, a consumer
/// started on it replays what was done and repeats no effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_deleted_under_the_consumer_stops_it_with_a_clear_error_and_no_effect_repeats() {
    let bed = Bed::<Sqs>::new().await;
    let q = Sqs::unique("deleted");
    let config = bed.config(&[Sub::new(&q)]);
    let mut consumer = Consumer::start(&config, 1);
    let intent = payout(847, "2026-W36", 1200);
    bed.publish(&q, &intent, "m-1").await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    let first_acked = || async { bed.broker.counts(&q).await == Default::default() };
    assert!(support::broker::until(WAIT, first_acked).await);

    bed.broker
        .client
        .delete_queue()
        .queue_url(support::sqs::url(&q))
        .send()
        .await
        .unwrap();
    let status = consumer.exited_within(Duration::from_secs(20));
    let logs = consumer.logs();
    assert!(
        status.is_some_and(|s| !s.success()),
        "still running, or exited 0: {status:?}\n{logs}"
    );
    for part in [
        "subscription[0].sqs.queue_url",
        "does not exist",
        q.as_str(),
    ] {
        assert!(logs.contains(part), "{part} is not named:\n{logs}");
    }

    support::sqs::create(&bed.broker.client, &q).await;
    let again = Consumer::start(&config, 1);
    bed.publish(&q, &intent, "m-1-again").await;
    let stopped = bed
        .stop_settled(&bed.store_url(), 1, &drained(&q), vec![again])
        .await;
    assert_eq!(bed.up.hits(), 1, "the effect ran again");
    assert_eq!(settled(&stopped, "payouts").acked, 1);
    bed.delete(&[&q]).await;
}

/// Gives queue `q` a redrive policy: after `count` receives SQS moves a
/// message to `<q>-redrive` on its own.
async fn redrive_policy(sqs: &Sqs, q: &str, count: u32) {
    let target = format!("{q}-redrive");
    support::sqs::create(&sqs.client, &target).await;
    let policy = format!(
        r#"{{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:123456789012:{target}","maxReceiveCount":"{count}"}}"#
    );
    sqs.client
        .set_queue_attributes()
        .queue_url(support::sqs::url(q))
        .attributes(QueueAttributeName::RedrivePolicy, policy)
        .send()
        .await
        .unwrap();
}

/// The queue's redrive policy (`maxReceiveCount` 2) is read at start and
/// becomes the bridge's delivery limit: an outcome the provider cannot
/// settle is dead-lettered by the consumer at the second delivery, with
/// its reason, before SQS would move it on its own. Once the provider
/// answers again, an operator redrives it. moto honours a redrive
/// policy's `maxReceiveCount` but not `StartMessageMoveTask`, so the
/// redrive here receives from the dead-letter queue and sends back to the
/// queue, as a redrive tool does: the key is the payload's, so the
/// redriven message replays the recorded outcome and runs nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_policy_bounds_the_deliveries_and_a_redriven_message_replays() {
    let bed = Bed::<Sqs>::new().await;
    let q = Sqs::unique("redrive");
    let sub = Sub {
        deliver: "/fail".into(),
        ..Sub::new(&q)
    };
    let config = bed.config(&[sub]);
    redrive_policy(&bed.broker, &q, 2).await;
    bed.up.set_lookup_down(true);
    let consumer = Consumer::start(&config, 1);
    assert!(
        consumer.logs().contains("max_receive_count=Some(2)"),
        "{}",
        consumer.logs()
    );
    let intent = payout(847, "2026-W36", 1200);
    bed.publish(&q, &intent, "m-1").await;
    let dead = || async { bed.broker.counts(&q).await.dead == 1 };
    assert!(
        support::broker::until(WAIT, dead).await,
        "{}",
        consumer.logs()
    );
    let copies = bed
        .broker
        .copies(&q, support::broker::Sink::DeadLetter)
        .await;
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].header("Idem-Reason"), Some("undecided"));
    assert_eq!(bed.up.hits(), 1);

    // The provider answers again; the operator sends the message back.
    bed.up.set_lookup_down(false);
    let body = copies[0].payload.clone();
    bed.publish(&q, &body, "m-1-redriven").await;
    let stopped = bed
        .stop_settled(&bed.store_url(), 1, &drained(&q), vec![consumer])
        .await;
    assert_eq!(bed.up.hits(), 1, "the redriven message ran again");
    bed.assert_effects(&[(&payout_key(847, "2026-W36"), 1)]);
    assert_eq!(settled(&stopped, "payouts").acked, 1);
    assert_eq!(
        bed.broker
            .attribute(
                &format!("{q}-redrive"),
                QueueAttributeName::ApproximateNumberOfMessages
            )
            .await,
        0,
        "SQS moved a message on its own"
    );
    let _ = bed
        .broker
        .client
        .delete_queue()
        .queue_url(support::sqs::url(&format!("{q}-redrive")))
        .send()
        .await;
    bed.delete(&[&q]).await;
}

/// `idem check --consumer` reads an SQS queue's redrive policy: one
/// receive of 4 s (the suite's shortest visibility) against a lease of 5 s
/// plus a 1.5 s response timeout is a warning that does not fail the check; a queue that cannot be reached
/// is said so, and the other checks still pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_check_warns_of_a_redrive_shorter_than_a_record_in_flight() {
    let bed = Bed::<Sqs>::new().await;
    let q = Sqs::unique("checked");
    let sub = Sub {
        lease_ms: 5_000,
        ..Sub::new(&q)
    };
    let config = bed.config(&[sub]);
    redrive_policy(&bed.broker, &q, 1).await;
    let path = config.to_str().unwrap().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        support::consume_suite::idem_bounded(&["check", "--consumer", &path])
    })
    .await
    .unwrap();
    let report = support::text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{report}");
    for part in [
        "WARN sqs.redrive",
        "maxReceiveCount 1",
        "INFO sqs.receive_count",
    ] {
        assert!(report.contains(part), "{part}:\n{report}");
    }

    let port = idem_testkit::free_port().unwrap();
    let moved = std::fs::read_to_string(&config).unwrap().replace(
        &support::sqs::url(""),
        &format!("http://127.0.0.1:{port}/123456789012/"),
    );
    let text = moved.replace(
        &format!(
            "endpoint_url = \"{}\"",
            idem_testkit::services::Service::Moto.endpoint()
        ),
        &format!("endpoint_url = \"http://127.0.0.1:{port}\""),
    );
    let path = bed.site.config(&text);
    let path = path.to_str().unwrap().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        support::consume_suite::idem_bounded(&["check", "--consumer", &path])
    })
    .await
    .unwrap();
    let report = support::text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(report.contains("WARN sqs.unreachable"), "{report}");
    assert!(report.contains("consumer.key_source"), "{report}");
    let _ = bed
        .broker
        .client
        .delete_queue()
        .queue_url(support::sqs::url(&format!("{q}-redrive")))
        .send()
        .await;
    bed.delete(&[&q]).await;
}

/// A TCP proxy in front of moto that can be cut: while cut it drops every
/// connection, those open included, so the SDK's requests fail at once
/// (connection refused or reset), as when the SQS endpoint is unreachable.
struct Cut {
    addr: std::net::SocketAddr,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Cut {
    async fn start(target: String) -> Cut {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = down.clone();
        let task = tokio::spawn(async move {
            let mut open = tokio::task::JoinSet::new();
            let mut was_down = false;
            loop {
                let accepted =
                    tokio::time::timeout(Duration::from_millis(50), listener.accept()).await;
                let is_down = flag.load(Ordering::SeqCst);
                if is_down && !was_down {
                    open.abort_all();
                }
                was_down = is_down;
                let Ok(Ok((mut client, _))) = accepted else {
                    continue;
                };
                if is_down {
                    continue; // dropped: the client sees a reset
                }
                let target = target.clone();
                open.spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Cut { addr, down, task }
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The SQS endpoint unreachable under a running consumer: receives fail,
/// `/readyz` says the subscription's broker is not connected (without
/// its address), nothing is delivered meanwhile; once the endpoint
/// answers again it is ready and the message sent during the outage runs
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_is_not_ready_until_a_receive_succeeds_again() {
    let bed = Bed::<Sqs>::new().await;
    let q = Sqs::unique("outage");
    let moto = idem_testkit::services::Service::Moto.endpoint();
    let cut = Cut::start(moto.trim_start_matches("http://").to_owned()).await;
    let port = idem_testkit::free_port().unwrap();
    let text = support::broker::consume_toml::<Sqs>(&bed.store_url(), &bed.up, &[Sub::new(&q)])
        .replace(
            &format!("endpoint_url = {moto:?}"),
            &format!("endpoint_url = \"http://{}\"", cut.addr),
        )
        .replace(
            "purge_interval_s = 1\n",
            &format!("purge_interval_s = 1\nprobe_listen = \"127.0.0.1:{port}\"\n"),
        );
    let readyz = || async move {
        support::send("GET", &format!("http://127.0.0.1:{port}/readyz"), &[], "").await
    };
    let consumer = Consumer::start(&bed.site.config(&text), 1);
    bed.publish(&q, &payout(1, "2026-W36", 100), "before").await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);

    cut.set_down(true);
    let mut said = None;
    for _ in 0..75 {
        let reply = readyz().await;
        if reply.status == 503 {
            said = Some(reply.body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let said =
        said.unwrap_or_else(|| panic!("still ready 15 s into the outage:\n{}", consumer.logs()));
    let doc: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert_eq!(doc["checks"]["broker:payouts"], "disconnected", "{said}");
    assert!(!said.contains("4568"), "{said}");
    bed.publish(&q, &payout(2, "2026-W36", 200), "during").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(bed.up.hits(), 1, "delivered while the endpoint was cut");

    cut.set_down(false);
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
        "not ready after the endpoint came back:\n{}",
        consumer.logs()
    );
    bed.stop_settled(&bed.store_url(), 2, &drained(&q), vec![consumer])
        .await;
    bed.assert_effects(&[
        (&payout_key(1, "2026-W36"), 1),
        (&payout_key(2, "2026-W36"), 1),
    ]);
    bed.delete(&[&q]).await;
}

/// Six messages received in one batch by one worker whose effect takes
/// 1.5 s: the last waits about 7.5 s for the worker, longer than the lease
/// plus the response timeout (4.5 s). Its visibility is kept as long as it
/// waits (the bound counts from when a worker takes it), so no message
/// ever shows visible again while the consumer holds it, and each is
/// delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_received_batch_keeps_its_visibility_while_it_waits_for_a_worker() {
    const SENT: u64 = 6;
    let bed = Bed::<Sqs>::new().await;
    let q = Sqs::unique("batch");
    let sub = Sub {
        deliver: "/slow?ms=1500".into(),
        response_timeout_ms: 2_000,
        lease_ms: 2_500,
        ack_wait_ms: 2_000,
        concurrency: 1,
        ..Sub::new(&q)
    };
    let config = bed.config(&[sub]);
    for seller in 0..SENT {
        let intent = payout(seller, "2026-W36", 100);
        bed.publish(&q, &intent, &format!("m-{seller}")).await;
    }
    let consumer = Consumer::start(&config, 1);
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    // From the first effect to the last, nothing of the queue is visible.
    while bed.up.hits() < SENT as usize {
        let (visible, _) = bed.broker.visible_and_not(&q).await;
        assert_eq!(
            visible,
            0,
            "a message held by the consumer became visible after {} effects\n{}",
            bed.up.hits(),
            consumer.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stopped = bed
        .stop_settled(
            &bed.store_url(),
            SENT as usize,
            &drained(&q),
            vec![consumer],
        )
        .await;
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.retried, c.settle_failed), (SENT, 0, 0), "{c:?}");
    bed.delete(&[&q]).await;
}

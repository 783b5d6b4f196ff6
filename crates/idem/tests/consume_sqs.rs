//! `idem consume` over Amazon SQS on moto in server mode (127.0.0.1:4568,
//! started by `scripts/test.sh`), black-box: the consumer suite
//! (`support/consume_suite.rs`) with SQS as the broker, each test's queue
//! and its two sink queues created as an operator would, and SQS's own
//! cases: a visibility timeout shorter than the effect, a FIFO queue's
//! groups kept in order, a queue deleted under a running consumer, and a
//! redrive from the queue's redrive-policy dead-letter queue.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use support::sqs::Sqs;

consume_suite!(Sqs);

use std::collections::HashMap;
use std::time::{Duration, Instant};

use support::broker::{Bed, Broker, Publish, Sub, drained, payout, payout_key, settled};
use support::{Consumer, eventually};

const WAIT: Duration = Duration::from_secs(15);

/// A visibility timeout of 2 s and an effect that takes 5 s: the keeper
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

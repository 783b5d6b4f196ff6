//! `idem consume` over the real NATS JetStream (127.0.0.1:4222), black-box:
//! the consumer suite (`support/consume_suite.rs`) with JetStream as the
//! broker, each test's stream read through one durable consumer whose
//! counts include what a consumer holds, and JetStream's own cases: its
//! delivery limit, and a durable consumer or a stream deleted under a
//! running consumer.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::time::Duration;

use support::broker::{
    Bed, Broker, Counts, Sink, Sub, drained, payout, payout_key, record_states, settled, stop_all,
};
use support::nats::Nats;
use support::{Consumer, eventually};

const WAIT: Duration = Duration::from_secs(15);

consume_suite!(Nats);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_still_undecided_at_max_deliver_is_dead_lettered_not_dropped() {
    let bed = Bed::<Nats>::new().await;
    let s = Nats::unique("undecided");
    // 500 and no lookup: nothing can decide the record, and JetStream
    // would stop delivering the message after its third delivery.
    let sub = Sub {
        deliver: "/fail".into(),
        max_deliver: Some(3),
        lookup: false,
        ..Sub::new(&s)
    };
    let consumer = Consumer::start(&bed.config(&[sub]), 1);
    let intent = payout(847, "2026-W36", 1200);
    bed.publish(&s, &intent, "m-1").await;

    let expect = Counts {
        dead: 1,
        ..Counts::default()
    };
    let seen = bed.broker.settle_at(&s, expect, WAIT).await;
    assert_eq!(seen, expect, "{}", consumer.logs());
    let stopped = stop_all(vec![consumer]).await;
    assert_eq!(bed.broker.counts(&s).await, expect, "after SIGTERM");
    let key = payout_key(847, "2026-W36");
    assert_eq!(
        record_states(&bed.store_url())
            .await
            .get(&key)
            .map(String::as_str),
        Some("ambiguous"),
        "the record stays to be resolved"
    );
    assert_eq!(bed.up.hits(), 1, "the service was called again");
    let dead = bed.broker.copies(&s, Sink::DeadLetter).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].payload, intent);
    assert_eq!(dead[0].header("Idem-Reason"), Some("undecided"));
    let detail = dead[0].header("Idem-Reason-Detail").unwrap();
    assert!(detail.contains("not final after 3 deliveries"), "{detail}");
    assert_eq!(dead[0].message_id.as_deref(), Some("m-1"));
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.retried, c.dead_lettered), (0, 2, 1), "{c:?}");
    bed.delete(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_durable_consumer_is_created_again_and_consumption_resumes() {
    let bed = Bed::<Nats>::new().await;
    let s = Nats::unique("durabledeleted");
    let consumer = Consumer::start(&bed.config(&[Sub::new(&s)]), 1);
    bed.publish(&s, &payout(847, "2026-W36", 1200), "m-1").await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    let settled_first = bed.broker.settle_at(&s, Counts::default(), WAIT).await;
    assert_eq!(settled_first, Counts::default());
    // An operator deletes the durable consumer while idem consume runs.
    bed.broker.delete_consumer(&s).await;
    bed.publish(&s, &payout(848, "2026-W36", 1300), "m-2").await;
    assert!(
        eventually(WAIT, || bed.up.hits() == 2).await,
        "a message published after the deletion was not consumed:\n{}",
        consumer.logs()
    );
    let warnings = consumer
        .logs()
        .lines()
        .filter(|l| l.contains("WARN"))
        .count();
    assert!(warnings < 10, "{warnings} warnings:\n{}", consumer.logs());

    let stopped = bed
        .stop_settled(&bed.store_url(), 2, &drained(&s), vec![consumer])
        .await;
    bed.assert_effects(&[
        (&payout_key(847, "2026-W36"), 1),
        (&payout_key(848, "2026-W36"), 1),
    ]);
    assert_eq!(bed.up.hits(), 2, "the service was called once per intent");
    assert!(
        stopped[0].log.contains("re-creating it"),
        "{}",
        stopped[0].log
    );
    bed.delete(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_stream_stops_idem_consume_with_a_non_zero_exit_naming_the_stream() {
    let bed = Bed::<Nats>::new().await;
    let s = Nats::unique("streamdeleted");
    let mut consumer = Consumer::start(&bed.config(&[Sub::new(&s)]), 1);
    bed.publish(&s, &payout(847, "2026-W36", 1200), "m-1").await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    let settled_first = bed.broker.settle_at(&s, Counts::default(), WAIT).await;
    assert_eq!(settled_first, Counts::default());
    // Its messages go with it: idem consume does not make an empty one
    // behind the operator's back, it stops for a supervisor to see.
    bed.broker.delete_stream(&s).await;
    let status = tokio::task::block_in_place(|| consumer.exited_within(Duration::from_secs(30)));
    let log = consumer.logs();
    let status = status.unwrap_or_else(|| panic!("still running 30 s later:\n{log}"));
    assert!(!status.success(), "exited {status:?}:\n{log}");
    assert!(log.contains(&format!("the stream `{s}` is gone")), "{log}");
    assert!(log.contains("subscription[0].nats.stream"), "{log}");
    for sink in [format!("{s}_DLQ"), format!("{s}_LATE")] {
        bed.broker.delete_stream(&sink).await;
    }
}

//! The black-box `idem consume` suite, written once and run per broker by
//! [`consume_suite!`]: real `idem consume` processes read a stream or
//! queue of their own and deliver to a payout API that records every
//! effect with its key; each message must be settled as
//! docs/consumers.md's settle table says. Every scenario ends by stopping
//! the consumers with SIGTERM once the records are final, and checks the
//! broker's counts again once it has taken back whatever they held:
//! nothing undelivered, nothing left unsettled, and exactly the expected
//! copies in the dead-letter and late sinks. A broker's own checks
//! (JetStream's `max_deliver`, RabbitMQ's retry queue) stay in its test
//! file, beside the suite.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::broker::{
    Bed, Broker, Counts, Publish, Sink, Sub, consume_toml, drained, payout, payout_key,
    record_states, settled, until,
};
use super::{Consumer, PgSchema, Site, eventually, text};

const WAIT: Duration = Duration::from_secs(15);

/// Instantiates every scenario of the suite as a test over `$broker`.
#[macro_export]
macro_rules! consume_suite {
    ($broker:ty) => {
        $crate::consume_suite!(@async $broker:
            one_intent_republished_under_three_message_ids_runs_once_and_all_are_acked,
            copies_arriving_while_the_first_runs_wait_for_it_and_are_acked_with_its_replay,
            a_consumer_killed_between_the_effect_and_the_ack_never_repeats_the_effect,
            two_consumers_racing_on_duplicates_make_one_effect_per_intent,
            an_ambiguous_outcome_is_held_back_until_the_reconciler_resolves_it,
            a_success_with_a_body_over_the_limit_is_final_and_never_run_again,
            a_key_reused_with_another_payload_is_dead_lettered_and_never_run,
            a_redrive_past_retention_is_copied_to_the_late_sink_and_never_run,
            messages_without_a_usable_intent_are_dead_lettered_with_the_reason_and_never_run,
            a_store_that_stops_answering_runs_and_acks_nothing_until_it_answers_again,
            sigterm_settles_every_message_in_hand_and_exits_zero,
        );
        $crate::consume_suite!(@sync $broker:
            config_errors_stop_idem_consume_naming_the_file_and_the_field,
            an_unreachable_broker_is_named_with_its_address_field_and_file_and_no_password,
            a_key_naming_the_message_fails_the_check_and_idem_consume_refuses_to_start,
        );
    };
    (@async $broker:ty: $($case:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::support::consume_suite::$case::<$broker>().await;
            }
        )*
    };
    (@sync $broker:ty: $($case:ident,)*) => {
        $(
            #[test]
            fn $case() {
                $crate::support::consume_suite::$case::<$broker>();
            }
        )*
    };
}

pub async fn one_intent_republished_under_three_message_ids_runs_once_and_all_are_acked<
    B: Broker,
>() {
    let bed = Bed::<B>::new().await;
    let q = B::unique("republish");
    let consumer = Consumer::start(&bed.config(&[Sub::new(&q)]), 1);
    let intent = payout(847, "2026-W36", 1200);
    for id in ["m-1", "m-2", "m-3"] {
        bed.publish(&q, &intent, id).await;
    }
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);

    let stopped = bed
        .stop_settled(&bed.store_url(), 1, &drained(&q), vec![consumer])
        .await;
    bed.assert_effects(&[(&payout_key(847, "2026-W36"), 1)]);
    assert_eq!(bed.up.hits(), 1, "the service was called once");
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.dead_lettered, c.late), (3, 0, 0), "{c:?}");
    bed.delete(&[&q]).await;
}

/// Copies that arrive while the first one's endpoint call runs wait for its
/// outcome (`wait_ms`, by default the response timeout) and are acked with
/// its replay: none is handed back to come again.
pub async fn copies_arriving_while_the_first_runs_wait_for_it_and_are_acked_with_its_replay<
    B: Broker,
>() {
    let bed = Bed::<B>::new().await;
    let q = B::unique("wait");
    // The default wait is the response timeout (1.5 s), which JetStream's
    // ack wait must cover together with the delivery after it.
    let sub = Sub {
        deliver: "/slow?ms=1000".into(),
        ack_wait_ms: 6_000,
        ..Sub::new(&q)
    };
    let consumer = Consumer::start(&bed.config(&[sub]), 1);
    let intent = payout(847, "2026-W36", 1200);
    for id in ["m-1", "m-2", "m-3"] {
        bed.publish(&q, &intent, id).await;
    }
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    let stopped = bed
        .stop_settled(&bed.store_url(), 1, &drained(&q), vec![consumer])
        .await;
    bed.assert_effects(&[(&payout_key(847, "2026-W36"), 1)]);
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.retried, c.dead_lettered), (3, 0, 0), "{c:?}");
    bed.delete(&[&q]).await;
}

pub async fn a_consumer_killed_between_the_effect_and_the_ack_never_repeats_the_effect<
    B: Broker,
>() {
    let bed = Bed::<B>::new().await;
    let q = B::unique("killed");
    // The service pays at once and answers a second later: the kill lands
    // after the effect and before any record of it or any ack. RabbitMQ
    // redelivers when the connection closes; JetStream after ack_wait
    // (2 s); SQS once the visibility (4 s) the killed consumer last set
    // has passed, up to about 5.3 s after the receive. The lease of 8 s
    // outlasts each, so the redelivery finds the record in progress and
    // is held back unless it comes more than 2.5 s late.
    // With the lease equal to ack_wait the second consumer's reconciler
    // could settle the record before a late redelivery arrived, which was
    // then rightly acked at once, with no retry (a lease of 1.6 s against
    // an ack wait of 4 s fails this way every time).
    let sub = Sub {
        deliver: "/slow?ms=1000".into(),
        lease_ms: 8_000,
        ..Sub::new(&q)
    };
    let config = bed.config(&[sub]);
    let first = Consumer::start(&config, 1);
    bed.publish(&q, &payout(847, "2026-W36", 1200), "m-1").await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    first.kill();
    let key = payout_key(847, "2026-W36");
    let states = record_states(&bed.store_url()).await;
    assert_eq!(states.get(&key).map(String::as_str), Some("in_progress"));
    bed.broker.assert_held(&q, 1).await;

    // The broker delivers the message again to a fresh consumer: held back
    // while the lease runs, then ambiguous until the reconciler finds the
    // payment by its key, then a replay, acked.
    let second = Consumer::start(&config, 1);
    let stopped = bed
        .stop_settled(&bed.store_url(), 1, &drained(&q), vec![second])
        .await;
    bed.assert_effects(&[(&key, 1)]);
    assert_eq!(bed.up.hits(), 1, "the redelivery reached the service");
    assert!(
        bed.up.lookups() >= 1,
        "resolved without asking the provider"
    );
    let c = settled(&stopped, "payouts");
    assert_eq!(c.acked, 1, "{c:?}");
    assert!(
        c.retried >= 1,
        "the redelivery was not held back while the lease ran: {c:?}"
    );
    bed.delete(&[&q]).await;
}

pub async fn two_consumers_racing_on_duplicates_make_one_effect_per_intent<B: Broker>() {
    const INTENTS: u64 = 20;
    const COPIES: u64 = 3;
    let bed = Bed::<B>::new().await;
    let q = B::unique("race");
    // A slow answer keeps the first copy in flight while the others arrive;
    // a small JetStream prefetch (shared by the durable) spreads the
    // messages over both processes.
    let sub = Sub {
        deliver: "/slow?ms=200".into(),
        prefetch: 8,
        ..Sub::new(&q)
    };
    let config = bed.config(&[sub]);
    let consumers = vec![Consumer::start(&config, 1), Consumer::start(&config, 1)];
    for copy in 0..COPIES {
        for seller in 0..INTENTS {
            let intent = payout(seller, "2026-W36", 100 + seller);
            bed.publish(&q, &intent, &format!("m-{seller}-{copy}"))
                .await;
        }
    }
    assert!(eventually(WAIT, || bed.up.hits() as u64 >= INTENTS).await);

    let stopped = bed
        .stop_settled(&bed.store_url(), INTENTS as usize, &drained(&q), consumers)
        .await;
    let keys: Vec<String> = (0..INTENTS).map(|s| payout_key(s, "2026-W36")).collect();
    let want: Vec<(&str, usize)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    bed.assert_effects(&want);
    let c = settled(&stopped, "payouts");
    assert_eq!(c.acked, INTENTS * COPIES, "{c:?}");
    for one in &stopped {
        let mine = settled(std::slice::from_ref(one), "payouts");
        assert!(
            mine.acked > 0,
            "a consumer took no message: no race was run"
        );
    }
    bed.delete(&[&q]).await;
}

pub async fn an_ambiguous_outcome_is_held_back_until_the_reconciler_resolves_it<B: Broker>() {
    let bed = Bed::<B>::new().await;
    let q = B::unique("ambiguous");
    // The service pays, then answers 500: the outcome is unknown.
    let sub = Sub {
        deliver: "/fail".into(),
        ..Sub::new(&q)
    };
    bed.up.set_lookup_down(true);
    let consumer = Consumer::start(&bed.config(&[sub]), 1);
    bed.publish(&q, &payout(847, "2026-W36", 1200), "m-1").await;
    let (broker, store, key) = (&bed.broker, bed.store_url(), payout_key(847, "2026-W36"));
    let (store, key, dest) = (store.as_str(), key.as_str(), q.as_str());
    assert!(
        until(WAIT, move || async move {
            record_states(store).await.get(key).map(String::as_str) == Some("ambiguous")
        })
        .await
    );
    // While the provider cannot say, the message is handed back with a
    // delay, never acked, delivered again, and the service is not called
    // again.
    assert!(
        until(WAIT, move || async move { broker.handed_back(dest).await }).await,
        "never handed back"
    );
    assert!(eventually(WAIT, || bed.up.lookups() >= 2).await);
    broker.assert_held(dest, 1).await;
    assert_eq!(bed.up.hits(), 1);
    assert_eq!(
        record_states(store).await.get(key).map(String::as_str),
        Some("ambiguous")
    );

    bed.up.set_lookup_down(false);
    let stopped = bed
        .stop_settled(store, 1, &drained(&q), vec![consumer])
        .await;
    assert_eq!(bed.up.hits(), 1, "the service was called again");
    bed.assert_effects(&[(key, 1)]);
    let c = settled(&stopped, "payouts");
    assert_eq!(c.acked, 1, "{c:?}");
    assert!(c.retried >= 2, "handed back while ambiguous: {c:?}");
    bed.delete(&[&q]).await;
}

pub async fn a_success_with_a_body_over_the_limit_is_final_and_never_run_again<B: Broker>() {
    let bed = Bed::<B>::new().await;
    let q = B::unique("big");
    // No lookup: only the answer itself can make the record final.
    let sub = Sub {
        deliver: "/big".into(),
        lookup: false,
        ..Sub::new(&q)
    };
    let consumer = Consumer::start(&bed.config(&[sub]), 1);
    let intent = payout(847, "2026-W36", 1200);
    bed.publish(&q, &intent, "m-1").await;
    let (store, key) = (bed.store_url(), payout_key(847, "2026-W36"));
    let (store, key) = (store.as_str(), key.as_str());
    assert!(
        until(WAIT, move || async move {
            record_states(store).await.get(key).map(String::as_str) == Some("completed")
        })
        .await,
        "not completed: {:?}\n{}",
        record_states(store).await,
        consumer.logs()
    );
    // A redelivery under another message id is a replay.
    bed.publish(&q, &intent, "m-2").await;
    let stopped = bed
        .stop_settled(store, 1, &drained(&q), vec![consumer])
        .await;
    bed.assert_effects(&[(key, 1)]);
    assert_eq!(bed.up.hits(), 1, "the service was called again");
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.retried, c.dead_lettered), (2, 0, 0), "{c:?}");

    let out = super::idem(&[
        "records",
        "show",
        "payouts|-",
        key,
        "--format",
        "json",
        "--store",
        store,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let result = &shown["result"];
    assert_eq!(result["status"], 502, "{shown}");
    let body: serde_json::Value =
        serde_json::from_str(result["body"].as_str().unwrap_or("null")).unwrap();
    assert_eq!(
        body["type"], "urn:idem:problem:result-not-stored",
        "{shown}"
    );
    assert!(
        body["detail"].as_str().unwrap().contains("answered 200"),
        "{shown}"
    );
    bed.delete(&[&q]).await;
}

pub async fn a_key_reused_with_another_payload_is_dead_lettered_and_never_run<B: Broker>() {
    let bed = Bed::<B>::new().await;
    let q = B::unique("reused");
    let consumer = Consumer::start(&bed.config(&[Sub::new(&q)]), 1);
    bed.publish(&q, &payout(847, "2026-W36", 1200), "m-1").await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    let other = payout(847, "2026-W36", 9999);
    bed.publish(&q, &other, "m-2").await;

    key_reused_is_dead_lettered(&bed, &q, &other, consumer).await;
    bed.delete(&[&q]).await;
}

/// Stops `consumer` once `other`, which reuses payout 847's key and was
/// published as `m-2`, is the one copy in `q`'s dead-letter sink with its
/// reason, and checks that the first payload ran once and was acked.
pub async fn key_reused_is_dead_lettered<B: Broker>(
    bed: &Bed<B>,
    q: &str,
    other: &str,
    consumer: Consumer,
) {
    let stopped = bed
        .stop_settled(
            &bed.store_url(),
            1,
            &[(q, Counts::copies(1, 0))],
            vec![consumer],
        )
        .await;
    bed.assert_effects(&[(&payout_key(847, "2026-W36"), 1)]);
    let dead = bed.broker.copies(q, Sink::DeadLetter).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].payload, other);
    assert_eq!(dead[0].header("Idem-Reason"), Some("key-reused"));
    assert_eq!(dead[0].message_id.as_deref(), Some("m-2"));
    let detail = dead[0].header("Idem-Reason-Detail").unwrap();
    assert!(detail.contains("payout:847:2026-W36"), "{detail}");
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.dead_lettered), (1, 1), "{c:?}");
}

pub async fn a_redrive_past_retention_is_copied_to_the_late_sink_and_never_run<B: Broker>() {
    let bed = Bed::<B>::new().await;
    let q = B::unique("late");
    let sub = Sub {
        retention_s: 1,
        tombstone_s: 86_400,
        ..Sub::new(&q)
    };
    let consumer = Consumer::start(&bed.config(&[sub]), 1);
    let intent = payout(847, "2026-W36", 1200);
    bed.publish(&q, &intent, "m-1").await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    // Past retention the record lists as a tombstone (before any purge).
    let (store, key) = (bed.store_url(), payout_key(847, "2026-W36"));
    let (store, key) = (store.as_str(), key.as_str());
    assert!(
        until(WAIT, move || async move {
            record_states(store).await.get(key).map(String::as_str) == Some("tombstone")
        })
        .await
    );
    bed.publish(&q, &intent, "m-redriven").await;

    let stopped = bed
        .stop_settled(store, 1, &[(&q, Counts::copies(0, 1))], vec![consumer])
        .await;
    bed.assert_effects(&[(key, 1)]);
    let late = bed.broker.copies(&q, Sink::Late).await;
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].payload, intent);
    assert_eq!(late[0].message_id.as_deref(), Some("m-redriven"));
    assert_eq!(late[0].header("Idem-Reason"), Some("expired"));
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.late, c.dead_lettered), (1, 1, 0), "{c:?}");
    bed.delete(&[&q]).await;
}

pub async fn messages_without_a_usable_intent_are_dead_lettered_with_the_reason_and_never_run<
    B: Broker,
>() {
    let bed = Bed::<B>::new().await;
    let (by_field, by_header) = (B::unique("nokey"), B::unique("badpayload"));
    let subs = [
        Sub {
            message_bytes_max: 256,
            lookup: false,
            ..Sub::new(&by_field)
        },
        Sub {
            name: "by-header".into(),
            key: "payout:{header:intent-id}".into(),
            // An endpoint of its own: two subscriptions may not share one.
            // No message of this test reaches it.
            deliver: "/reject".into(),
            lookup: false,
            ..Sub::new(&by_header)
        },
    ];
    let consumer = Consumer::start(&bed.config(&subs), 2);
    let oversized = format!(
        r#"{{"seller_id":847,"settlement_id":"2026-W36","note":"{}"}}"#,
        "x".repeat(300)
    );
    // (destination, payload, reason code, what the detail must name)
    let cases: [(&str, &str, &str, &str); 4] = [
        (&by_field, "not json", "no-key", "not JSON"),
        (
            &by_field,
            r#"{"seller_id":847}"#,
            "no-key",
            "/settlement_id",
        ),
        (
            &by_field,
            &oversized,
            "too-large",
            "message_bytes_max is 256",
        ),
        (&by_header, "not json", "bad-payload", "JSON"),
    ];
    for (i, (dest, payload, _, _)) in cases.iter().enumerate() {
        let id = format!("m-{i}");
        let message = Publish {
            id: &id,
            content_type: None,
            headers: &[("intent-id", "847-W36")],
        };
        bed.broker.publish(dest, payload.as_bytes(), message).await;
    }

    let stopped = bed
        .stop_settled(
            &bed.store_url(),
            0,
            &[
                (&by_field, Counts::copies(3, 0)),
                (&by_header, Counts::copies(1, 0)),
            ],
            vec![consumer],
        )
        .await;
    assert_eq!(
        bed.up.hits(),
        0,
        "a message without an intent was delivered"
    );
    let mut dead = bed.broker.copies(&by_field, Sink::DeadLetter).await;
    dead.extend(bed.broker.copies(&by_header, Sink::DeadLetter).await);
    assert_eq!(dead.len(), cases.len());
    for (i, (_, payload, code, names)) in cases.iter().enumerate() {
        let id = format!("m-{i}");
        let m = dead
            .iter()
            .find(|m| m.message_id.as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("{id} is not in a dead-letter sink"));
        assert_eq!(m.payload, *payload, "{id}");
        assert_eq!(m.header("Idem-Reason"), Some(*code), "{id}");
        let detail = m.header("Idem-Reason-Detail").unwrap();
        assert!(detail.contains(names), "{id}: {detail}");
    }
    assert_eq!(settled(&stopped, "payouts").dead_lettered, 3);
    assert_eq!(settled(&stopped, "by-header").dead_lettered, 1);
    bed.delete(&[&by_field, &by_header]).await;
}

/// The store's operation deadline, in its URL.
const OPERATION_TIMEOUT_MS: u64 = 1_000;

pub async fn a_store_that_stops_answering_runs_and_acks_nothing_until_it_answers_again<
    B: Broker,
>() {
    let bed = Bed::<B>::new().await;
    let q = B::unique("store_down");
    let schema = PgSchema::new(&format!("consume_{}_store_down", B::SECTION));
    // The consumer reaches PostgreSQL through the relay; the test reads the
    // records directly.
    let (relay, relayed) = schema.through_relay().await;
    let relayed = format!("{relayed}&operation_timeout_ms={OPERATION_TIMEOUT_MS}");
    let config = bed
        .site
        .config(&consume_toml::<B>(&relayed, &bed.up, &[Sub::new(&q)]));
    let consumer = Consumer::start(&config, 1);
    bed.publish(&q, &payout(1, "2026-W36", 100), "before").await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    // Its answer recorded first: a freeze between the effect and its
    // completion would leave it unsettled too.
    let first_completed = || async {
        record_states(&schema.store_url())
            .await
            .get(&payout_key(1, "2026-W36"))
            .is_some_and(|state| state == "completed")
    };
    assert!(until(WAIT, first_completed).await);
    // And acked, where the broker can tell: the consumer acks only once
    // the completion's answer came back through the relay, after the row
    // the test reads is committed. Frozen in between, that answer times
    // out and the first message is handed back too (JetStream's ack
    // pending 2 instead of 1, seen under load).
    let first_acked = || async { bed.broker.counts(&q).await == Counts::default() };
    assert!(until(WAIT, first_acked).await, "{}", consumer.logs());

    relay.freeze();
    bed.publish(&q, &payout(2, "2026-W36", 200), "frozen").await;
    // Refused for want of a store, handed back, and refused again when it
    // comes back: never delivered, never acked.
    let refusals = || {
        consumer
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("store unavailable") && l.contains("payout:2:2026-W36"))
            .count()
    };
    assert!(
        eventually(WAIT, || refusals() >= 2).await,
        "{}",
        consumer.logs()
    );
    assert_eq!(bed.up.hits(), 1, "delivered without a claim");
    bed.broker.assert_held(&q, 1).await;

    relay.thaw();
    let stopped = bed
        .stop_settled(&schema.store_url(), 2, &drained(&q), vec![consumer])
        .await;
    bed.assert_effects(&[
        (&payout_key(1, "2026-W36"), 1),
        (&payout_key(2, "2026-W36"), 1),
    ]);
    let c = settled(&stopped, "payouts");
    assert_eq!(c.acked, 2, "{c:?}");
    assert!(c.retried >= 2, "{c:?}");
    bed.delete(&[&q]).await;
}

pub async fn sigterm_settles_every_message_in_hand_and_exits_zero<B: Broker>() {
    const SENT: usize = 12;
    const WORKERS: usize = 4;
    let bed = Bed::<B>::new().await;
    let q = B::unique("sigterm");
    let sub = Sub {
        deliver: "/slow?ms=1500".into(),
        response_timeout_ms: 2_500,
        lease_ms: 3_000,
        ack_wait_ms: 3_000,
        concurrency: WORKERS,
        prefetch: 8,
        ..Sub::new(&q)
    };
    let config = bed.config(&[sub]);
    let consumer = Consumer::start(&config, 1);
    for seller in 0..SENT {
        let intent = payout(seller as u64, "2026-W36", 100);
        bed.publish(&q, &intent, &format!("m-{seller}")).await;
    }
    // Every worker holds a message whose answer is 1.5 s away.
    assert!(eventually(WAIT, || bed.up.hits() == WORKERS).await);
    let stopped = tokio::task::spawn_blocking(move || consumer.stop())
        .await
        .unwrap();
    assert!(
        stopped.status.success(),
        "{:?}\n{}",
        stopped.status,
        stopped.log
    );
    assert!(
        stopped.took >= Duration::from_secs(1) && stopped.took < Duration::from_secs(10),
        "stopped {:?} after SIGTERM: it must wait for the answers in hand, within the response timeout",
        stopped.took
    );
    let c = settled(std::slice::from_ref(&stopped), "payouts");
    assert_eq!(
        (c.acked, c.retried, c.settle_failed),
        (WORKERS as u64, 0, 0),
        "{c:?}"
    );
    assert_eq!(bed.up.hits(), WORKERS, "a message was taken after SIGTERM");
    // What was taken is acked; the rest waits to be delivered again:
    // nothing is lost, nothing taken is left unacknowledged.
    bed.broker.assert_left(&q, (SENT - WORKERS) as u64).await;
    let states = record_states(&bed.store_url()).await;
    assert_eq!(states.len(), WORKERS);
    assert!(states.values().all(|s| s == "completed"), "{states:?}");

    // The rest runs on the next start, each once.
    let next = Consumer::start(&config, 1);
    let stopped = bed
        .stop_settled(&bed.store_url(), SENT, &drained(&q), vec![next])
        .await;
    let keys: Vec<String> = (0..SENT)
        .map(|s| payout_key(s as u64, "2026-W36"))
        .collect();
    let want: Vec<(&str, usize)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    bed.assert_effects(&want);
    assert_eq!(settled(&stopped, "payouts").acked, (SENT - WORKERS) as u64);
    bed.delete(&[&q]).await;
}

// ---- Config errors, end to end ----

/// A consumer config that loads, for the cases to break one field of.
fn valid<B: Broker>(site: &Site) -> String {
    format!(
        r#"
store = "sqlite://{store}"

[[subscription]]
name = "payouts"
key = "payout:{{/seller_id}}:{{/settlement_id}}"
deliver = "http://127.0.0.1:9/payouts"
response_timeout_ms = 1000
lease_ms = 5000

{section}
[[lookup]]
subscription = "payouts"
url = "http://127.0.0.1:9/payouts/by-key/{{forwarded_key}}"
"#,
        store = site.store().display(),
        section = B::VALID_SECTION,
    )
}

/// Runs `idem` with `args`, killed if it has not ended within 20 s (a
/// config that loaded by mistake would consume forever).
pub fn idem_bounded(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .envs(super::dynamo::AWS_ENV.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `idem consume --config path`, which must stop at start (`what` is
/// wrong with the config) with an error about `field`
/// (`subscription[0].nats.ca_file`) that names each of `named` and none
/// of `secrets`.
pub fn refused_at_start(path: &Path, what: &str, field: &str, named: &[&str], secrets: &[&str]) {
    let out = idem_bounded(&["consume", "--config", path.to_str().unwrap()]);
    let stderr = super::text(&out.stderr);
    assert!(!out.status.success(), "{what}: it started\n{stderr}");
    assert!(stderr.contains(field), "{what}: {field}\n{stderr}");
    for name in named {
        assert!(stderr.contains(name), "{what}: {name}\n{stderr}");
    }
    for secret in secrets {
        assert!(
            !stderr.contains(secret),
            "{what}: a secret is shown\n{stderr}"
        );
    }
}

pub fn config_errors_stop_idem_consume_naming_the_file_and_the_field<B: Broker>() {
    // (what is wrong, replace this, with this, the field named)
    let mut cases = vec![
        ("a typo", "deliver =", "delivr =", "delivr"),
        (
            "an unclosed key template",
            "key = \"payout:{/seller_id}:{/settlement_id}\"",
            "key = \"payout:{/seller_id\"",
            "subscription[0].key",
        ),
        (
            "a lease no longer than the response timeout",
            "lease_ms = 5000",
            "lease_ms = 1000",
            "subscription[0].lease_ms",
        ),
        (
            "a lookup naming no subscription",
            "subscription = \"payouts\"\nurl",
            "subscription = \"refunds\"\nurl",
            "lookup[0].subscription",
        ),
    ];
    cases.extend(B::config_errors());
    let site = Site::new();
    let valid = valid::<B>(&site);
    for (what, from, to, field) in cases {
        assert!(valid.contains(from), "{what}: the case edits nothing");
        let path = site.config(&valid.replacen(from, to, 1));
        let out = idem_bounded(&["consume", "--config", path.to_str().unwrap()]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{what}: started\n{stderr}");
        assert!(
            stderr.contains(&path.display().to_string()),
            "{what}: the file is not named\n{stderr}"
        );
        assert!(
            stderr.contains(field),
            "{what}: {field} is not named\n{stderr}"
        );
    }
    // A typo is located by line and column, in the broker's section too.
    let mut typos = vec![("deliver =", "delivr =", "line 7, column 1")];
    typos.extend(B::typo_locations());
    for (from, to, at) in typos {
        let path = site.config(&valid.replacen(from, to, 1));
        let out = idem_bounded(&["consume", "--config", path.to_str().unwrap()]);
        assert!(
            text(&out.stderr).contains(at),
            "{to}: {}",
            text(&out.stderr)
        );
    }
}

pub fn an_unreachable_broker_is_named_with_its_address_field_and_file_and_no_password<B: Broker>() {
    let port = idem_testkit::free_port().unwrap();
    let (url, masked) = B::url_with_password(port);
    let site = Site::new();
    let header = format!("[subscription.{}]\n", B::SECTION);
    let config = valid::<B>(&site).replace(
        &header,
        &format!("{header}{} = {url:?}\n", B::ADDRESS_FIELD),
    );
    let path = site.config(&config);
    let out = idem_bounded(&["consume", "--config", path.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for part in [
        path.display().to_string(),
        format!("subscription[0].{}.{}", B::SECTION, B::ADDRESS_FIELD),
        masked,
    ] {
        assert!(stderr.contains(&part), "{part} is not named:\n{stderr}");
    }
    assert!(
        !stderr.contains("s3cret"),
        "the password is shown:\n{stderr}"
    );
}

pub fn a_key_naming_the_message_fails_the_check_and_idem_consume_refuses_to_start<B: Broker>() {
    let site = Site::new();
    let config = valid::<B>(&site).replace(
        "payout:{/seller_id}:{/settlement_id}",
        "payout:{message_id}",
    );
    let path = site.config(&config);
    let path = path.to_str().unwrap();

    let check = idem_bounded(&["check", "--consumer", path]);
    assert_eq!(check.status.code(), Some(1), "{}", text(&check.stderr));
    let report = text(&check.stdout);
    assert!(report.contains("consumer.key_source"), "{report}");
    assert!(report.contains("{message_id}"), "{report}");

    let consume = idem_bounded(&["consume", "--config", path]);
    let stderr = text(&consume.stderr);
    assert!(!consume.status.success(), "{stderr}");
    assert!(stderr.contains("refusing to start"), "{stderr}");
    assert!(stderr.contains("consumer.key_source"), "{stderr}");
}

//! `idem consume` over the real NATS JetStream (127.0.0.1:4222), black-box:
//! real `idem consume` processes read a stream of their own through one
//! durable consumer and deliver to a payout API that records every effect
//! with its key; each message must be settled as docs/consumers.md's
//! settle table says. Every test ends by stopping the consumers with
//! SIGTERM once the records are final, and checks the durable consumer's
//! counts before and after: nothing undelivered, nothing delivered and
//! left unacknowledged, and exactly the expected copies in the
//! dead-letter and late streams.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use async_nats::HeaderMap;
use support::nats::{
    Counts, Nats, Sink, Sub, URL, consume_toml, effects_per_key, payout, payout_key, record_states,
    settled, stop_all, stop_settled, unique, until,
};
use support::{Consumer, PgSchema, Site, Upstream, eventually, text};

const WAIT: Duration = Duration::from_secs(15);

/// One test's world: the payout API, a temp dir with the SQLite store and
/// the config file, and a client of the broker.
struct Bed {
    up: Upstream,
    site: Site,
    nats: Nats,
}

impl Bed {
    async fn new() -> Bed {
        Bed {
            up: Upstream::start().await,
            site: Site::new(),
            nats: Nats::connect(URL).await,
        }
    }

    fn store_url(&self) -> String {
        format!("sqlite://{}", self.site.store().display())
    }

    /// The config file for `subs` on the SQLite store.
    fn config(&self, subs: &[Sub]) -> PathBuf {
        self.site
            .config(&consume_toml(&self.store_url(), &self.up, subs))
    }

    /// Effects per key, checked against `expect`.
    #[track_caller]
    fn assert_effects(&self, expect: &[(&str, usize)]) {
        let want = expect.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
        assert_eq!(effects_per_key(&self.up), want, "effects per key");
    }

    /// Deletes the streams the consumer declared for `streams`.
    async fn drop_streams(self, streams: &[&str]) {
        for s in streams {
            self.nats.delete(s).await;
        }
    }
}

/// `stream` with nothing pending, nothing held and no copies.
fn drained(stream: &str) -> [(&str, Counts); 1] {
    [(stream, Counts::default())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_intent_republished_under_three_message_ids_runs_once_and_all_are_acked() {
    let bed = Bed::new().await;
    let s = unique("republish");
    let consumer = Consumer::start(&bed.config(&[Sub::new(&s)]), 1);
    let intent = payout(847, "2026-W36", 1200);
    for id in ["m-1", "m-2", "m-3"] {
        bed.nats.publish(&s, &intent, id).await;
    }
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);

    let stopped = stop_settled(&bed.nats, &bed.store_url(), 1, &drained(&s), vec![consumer]).await;
    bed.assert_effects(&[(&payout_key(847, "2026-W36"), 1)]);
    assert_eq!(bed.up.hits(), 1, "the service was called once");
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.dead_lettered, c.late), (3, 0, 0), "{c:?}");
    bed.drop_streams(&[&s]).await;
}

/// Copies that arrive while the first one's endpoint call runs wait for its
/// outcome (`wait_ms`, by default the response timeout) and are acked with
/// its replay: none is handed back to come again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_arriving_while_the_first_runs_wait_for_it_and_are_acked_with_its_replay() {
    let bed = Bed::new().await;
    let s = unique("wait");
    // The default wait is the response timeout (1.5 s), which JetStream's
    // ack wait must cover together with the delivery after it.
    let sub = Sub {
        deliver: "/slow?ms=1000".into(),
        ack_wait_ms: 6_000,
        ..Sub::new(&s)
    };
    let consumer = Consumer::start(&bed.config(&[sub]), 1);
    let intent = payout(847, "2026-W36", 1200);
    for id in ["m-1", "m-2", "m-3"] {
        bed.nats.publish(&s, &intent, id).await;
    }
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    let stopped = stop_settled(&bed.nats, &bed.store_url(), 1, &drained(&s), vec![consumer]).await;
    bed.assert_effects(&[(&payout_key(847, "2026-W36"), 1)]);
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.retried, c.dead_lettered), (3, 0, 0), "{c:?}");
    bed.drop_streams(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_between_the_effect_and_the_ack_never_repeats_the_effect() {
    let bed = Bed::new().await;
    let s = unique("killed");
    // The service pays at once and answers a second later: the kill lands
    // after the effect and before any record of it or any ack. JetStream
    // redelivers after ack_wait (2 s); the lease runs 3 s past it, so the
    // redelivery finds the record in progress and is held back unless it
    // comes more than 3 s late.
    // With the lease equal to ack_wait the second consumer's reconciler
    // could settle the record before a late redelivery arrived, which was
    // then rightly acked at once, with no retry (a lease of 1.6 s against
    // an ack wait of 4 s fails this way every time).
    let sub = Sub {
        deliver: "/slow?ms=1000".into(),
        lease_ms: 5_000,
        ..Sub::new(&s)
    };
    let config = bed.config(&[sub]);
    let first = Consumer::start(&config, 1);
    bed.nats
        .publish(&s, &payout(847, "2026-W36", 1200), "m-1")
        .await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    first.kill();
    let key = payout_key(847, "2026-W36");
    let states = record_states(&bed.store_url()).await;
    assert_eq!(states.get(&key).map(String::as_str), Some("in_progress"));
    let held = bed.nats.counts(&s).await;
    assert_eq!(
        held.ack_pending, 1,
        "the killed delivery is not held: {held:?}"
    );

    // JetStream delivers the message again after ack_wait to a fresh
    // consumer: held back while the lease runs, then ambiguous until the
    // reconciler finds the payment by its key, then a replay, acked.
    let second = Consumer::start(&config, 1);
    let stopped = stop_settled(&bed.nats, &bed.store_url(), 1, &drained(&s), vec![second]).await;
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
    bed.drop_streams(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_racing_on_duplicates_make_one_effect_per_intent() {
    const INTENTS: u64 = 20;
    const COPIES: u64 = 3;
    let bed = Bed::new().await;
    let s = unique("race");
    // A slow answer keeps the first copy in flight while the others arrive;
    // a small prefetch (shared by the durable) spreads the messages over
    // both processes.
    let sub = Sub {
        deliver: "/slow?ms=200".into(),
        prefetch: 8,
        ..Sub::new(&s)
    };
    let config = bed.config(&[sub]);
    let consumers = vec![Consumer::start(&config, 1), Consumer::start(&config, 1)];
    for copy in 0..COPIES {
        for seller in 0..INTENTS {
            let intent = payout(seller, "2026-W36", 100 + seller);
            bed.nats
                .publish(&s, &intent, &format!("m-{seller}-{copy}"))
                .await;
        }
    }
    assert!(eventually(WAIT, || bed.up.hits() as u64 >= INTENTS).await);

    let stopped = stop_settled(
        &bed.nats,
        &bed.store_url(),
        INTENTS as usize,
        &drained(&s),
        consumers,
    )
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
    bed.drop_streams(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_outcome_is_held_back_until_the_reconciler_resolves_it() {
    let bed = Bed::new().await;
    let s = unique("ambiguous");
    // The service pays, then answers 500: the outcome is unknown.
    let sub = Sub {
        deliver: "/fail".into(),
        ..Sub::new(&s)
    };
    bed.up.set_lookup_down(true);
    let consumer = Consumer::start(&bed.config(&[sub]), 1);
    bed.nats
        .publish(&s, &payout(847, "2026-W36", 1200), "m-1")
        .await;
    let (nats, store, key) = (&bed.nats, bed.store_url(), payout_key(847, "2026-W36"));
    let (store, key, stream) = (store.as_str(), key.as_str(), s.as_str());
    assert!(
        until(WAIT, move || async move {
            record_states(store).await.get(key).map(String::as_str) == Some("ambiguous")
        })
        .await
    );
    // While the provider cannot say, the message is handed back with a
    // delay (held by the durable, never acked), delivered again, and the
    // service is not called again.
    assert!(
        until(
            WAIT,
            move || async move { nats.redelivered(stream).await >= 1 }
        )
        .await,
        "never delivered again"
    );
    assert!(eventually(WAIT, || bed.up.lookups() >= 2).await);
    let held = nats.counts(stream).await;
    assert_eq!(
        held,
        Counts {
            ack_pending: 1,
            ..Counts::default()
        },
        "acked, dropped or copied while ambiguous"
    );
    assert_eq!(bed.up.hits(), 1);
    assert_eq!(
        record_states(store).await.get(key).map(String::as_str),
        Some("ambiguous")
    );

    bed.up.set_lookup_down(false);
    let stopped = stop_settled(&bed.nats, store, 1, &drained(&s), vec![consumer]).await;
    assert_eq!(bed.up.hits(), 1, "the service was called again");
    bed.assert_effects(&[(key, 1)]);
    let c = settled(&stopped, "payouts");
    assert_eq!(c.acked, 1, "{c:?}");
    assert!(c.retried >= 2, "handed back while ambiguous: {c:?}");
    bed.drop_streams(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_still_undecided_at_max_deliver_is_dead_lettered_not_dropped() {
    let bed = Bed::new().await;
    let s = unique("undecided");
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
    bed.nats.publish(&s, &intent, "m-1").await;

    let expect = Counts {
        dead: 1,
        ..Counts::default()
    };
    let seen = bed.nats.settle_at(&s, expect, WAIT).await;
    assert_eq!(seen, expect, "{}", consumer.logs());
    let stopped = stop_all(vec![consumer]).await;
    assert_eq!(bed.nats.counts(&s).await, expect, "after SIGTERM");
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
    let dead = bed.nats.copies(&s, Sink::DeadLetter).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].payload, intent);
    assert_eq!(dead[0].header("Idem-Reason").as_deref(), Some("undecided"));
    let detail = dead[0].header("Idem-Reason-Detail").unwrap();
    assert!(detail.contains("not final after 3 deliveries"), "{detail}");
    assert_eq!(
        dead[0].header("Idem-Original-Message-Id").as_deref(),
        Some("m-1")
    );
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.retried, c.dead_lettered), (0, 2, 1), "{c:?}");
    bed.drop_streams(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_durable_consumer_is_created_again_and_consumption_resumes() {
    let bed = Bed::new().await;
    let s = unique("durabledeleted");
    let consumer = Consumer::start(&bed.config(&[Sub::new(&s)]), 1);
    bed.nats
        .publish(&s, &payout(847, "2026-W36", 1200), "m-1")
        .await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    let settled_first = bed.nats.settle_at(&s, Counts::default(), WAIT).await;
    assert_eq!(settled_first, Counts::default());
    // An operator deletes the durable consumer while idem consume runs.
    bed.nats.delete_consumer(&s).await;
    bed.nats
        .publish(&s, &payout(848, "2026-W36", 1300), "m-2")
        .await;
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

    let stopped = stop_settled(&bed.nats, &bed.store_url(), 2, &drained(&s), vec![consumer]).await;
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
    bed.drop_streams(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_stream_stops_idem_consume_with_a_non_zero_exit_naming_the_stream() {
    let bed = Bed::new().await;
    let s = unique("streamdeleted");
    let mut consumer = Consumer::start(&bed.config(&[Sub::new(&s)]), 1);
    bed.nats
        .publish(&s, &payout(847, "2026-W36", 1200), "m-1")
        .await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    let settled_first = bed.nats.settle_at(&s, Counts::default(), WAIT).await;
    assert_eq!(settled_first, Counts::default());
    // Its messages go with it: idem consume does not make an empty one
    // behind the operator's back, it stops for a supervisor to see.
    bed.nats.delete_stream(&s).await;
    let status = tokio::task::block_in_place(|| consumer.exited_within(Duration::from_secs(30)));
    let log = consumer.logs();
    let status = status.unwrap_or_else(|| panic!("still running 30 s later:\n{log}"));
    assert!(!status.success(), "exited {status:?}:\n{log}");
    assert!(log.contains(&format!("the stream `{s}` is gone")), "{log}");
    assert!(log.contains("subscription[0].nats.stream"), "{log}");
    for sink in [format!("{s}_DLQ"), format!("{s}_LATE")] {
        bed.nats.delete_stream(&sink).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_payload_is_dead_lettered_and_never_run() {
    let bed = Bed::new().await;
    let s = unique("reused");
    let consumer = Consumer::start(&bed.config(&[Sub::new(&s)]), 1);
    bed.nats
        .publish(&s, &payout(847, "2026-W36", 1200), "m-1")
        .await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    let other = payout(847, "2026-W36", 9999);
    bed.nats.publish(&s, &other, "m-2").await;

    let expect = Counts {
        dead: 1,
        ..Counts::default()
    };
    let stopped = stop_settled(
        &bed.nats,
        &bed.store_url(),
        1,
        &[(&s, expect)],
        vec![consumer],
    )
    .await;
    bed.assert_effects(&[(&payout_key(847, "2026-W36"), 1)]);
    let dead = bed.nats.copies(&s, Sink::DeadLetter).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].payload, other);
    assert_eq!(dead[0].header("Idem-Reason").as_deref(), Some("key-reused"));
    assert_eq!(
        dead[0].header("Idem-Original-Message-Id").as_deref(),
        Some("m-2")
    );
    let detail = dead[0].header("Idem-Reason-Detail").unwrap();
    assert!(detail.contains("payout:847:2026-W36"), "{detail}");
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.dead_lettered), (1, 1), "{c:?}");
    bed.drop_streams(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_past_retention_goes_to_the_late_stream_and_is_never_run() {
    let bed = Bed::new().await;
    let s = unique("late");
    let sub = Sub {
        retention_s: 1,
        tombstone_s: 86_400,
        ..Sub::new(&s)
    };
    let consumer = Consumer::start(&bed.config(&[sub]), 1);
    let intent = payout(847, "2026-W36", 1200);
    bed.nats.publish(&s, &intent, "m-1").await;
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
    bed.nats.publish(&s, &intent, "m-redriven").await;

    let expect = Counts {
        late: 1,
        ..Counts::default()
    };
    let stopped = stop_settled(&bed.nats, store, 1, &[(&s, expect)], vec![consumer]).await;
    bed.assert_effects(&[(key, 1)]);
    let late = bed.nats.copies(&s, Sink::Late).await;
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].payload, intent);
    assert_eq!(
        late[0].header("Idem-Original-Message-Id").as_deref(),
        Some("m-redriven")
    );
    assert_eq!(late[0].header("Idem-Reason").as_deref(), Some("expired"));
    let c = settled(&stopped, "payouts");
    assert_eq!((c.acked, c.late, c.dead_lettered), (1, 1, 0), "{c:?}");
    bed.drop_streams(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_without_a_usable_intent_are_dead_lettered_with_the_reason_and_never_run() {
    let bed = Bed::new().await;
    let (by_field, by_header) = (unique("nokey"), unique("badpayload"));
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
    // (stream, payload, reason code, what the detail must name)
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
    for (i, (stream, payload, _, _)) in cases.iter().enumerate() {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("m-{i}").as_str());
        headers.insert("intent-id", "847-W36");
        bed.nats
            .publish_with(stream, payload.as_bytes(), headers)
            .await;
    }

    let expect = |dead| Counts {
        dead,
        ..Counts::default()
    };
    let stopped = stop_settled(
        &bed.nats,
        &bed.store_url(),
        0,
        &[(&by_field, expect(3)), (&by_header, expect(1))],
        vec![consumer],
    )
    .await;
    assert_eq!(
        bed.up.hits(),
        0,
        "a message without an intent was delivered"
    );
    let mut dead = bed.nats.copies(&by_field, Sink::DeadLetter).await;
    dead.extend(bed.nats.copies(&by_header, Sink::DeadLetter).await);
    assert_eq!(dead.len(), cases.len());
    for (i, (_, payload, code, names)) in cases.iter().enumerate() {
        let id = format!("m-{i}");
        let m = dead
            .iter()
            .find(|m| m.header("Idem-Original-Message-Id").as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("{id} is not in a dead-letter stream"));
        assert_eq!(m.payload, *payload, "{id}");
        assert_eq!(m.header("Idem-Reason").as_deref(), Some(*code), "{id}");
        let detail = m.header("Idem-Reason-Detail").unwrap();
        assert!(detail.contains(names), "{id}: {detail}");
    }
    assert_eq!(settled(&stopped, "payouts").dead_lettered, 3);
    assert_eq!(settled(&stopped, "by-header").dead_lettered, 1);
    bed.drop_streams(&[&by_field, &by_header]).await;
}

/// The store's operation deadline, in its URL.
const OPERATION_TIMEOUT_MS: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_answering_runs_and_acks_nothing_until_it_answers_again() {
    let bed = Bed::new().await;
    let s = unique("store_down");
    let schema = PgSchema::new("consume_nats_store_down");
    // The consumer reaches PostgreSQL through the relay; the test reads the
    // records directly.
    let (relay, relayed) = schema.through_relay().await;
    let relayed = format!("{relayed}&operation_timeout_ms={OPERATION_TIMEOUT_MS}");
    let config = bed
        .site
        .config(&consume_toml(&relayed, &bed.up, &[Sub::new(&s)]));
    let consumer = Consumer::start(&config, 1);
    bed.nats
        .publish(&s, &payout(1, "2026-W36", 100), "before")
        .await;
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
    // And acked: the consumer acks only once the completion's answer came
    // back through the relay, after the row the test reads is committed.
    // Frozen in between, that answer times out and the first message is
    // handed back too (ack-pending 2 instead of 1, seen under load).
    let first_acked = || async { bed.nats.counts(&s).await == Counts::default() };
    assert!(until(WAIT, first_acked).await, "{}", consumer.logs());

    relay.freeze();
    bed.nats
        .publish(&s, &payout(2, "2026-W36", 200), "frozen")
        .await;
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
    let held = bed.nats.counts(&s).await;
    assert_eq!(
        held,
        Counts {
            ack_pending: 1,
            ..Counts::default()
        },
        "acked, dropped or copied without a store"
    );

    relay.thaw();
    let stopped = stop_settled(
        &bed.nats,
        &schema.store_url(),
        2,
        &drained(&s),
        vec![consumer],
    )
    .await;
    bed.assert_effects(&[
        (&payout_key(1, "2026-W36"), 1),
        (&payout_key(2, "2026-W36"), 1),
    ]);
    let c = settled(&stopped, "payouts");
    assert_eq!(c.acked, 2, "{c:?}");
    assert!(c.retried >= 2, "{c:?}");
    bed.drop_streams(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_settles_every_message_in_hand_and_exits_zero() {
    const SENT: usize = 12;
    const WORKERS: usize = 4;
    let bed = Bed::new().await;
    let s = unique("sigterm");
    let sub = Sub {
        deliver: "/slow?ms=1500".into(),
        response_timeout_ms: 2_500,
        lease_ms: 3_000,
        ack_wait_ms: 3_000,
        concurrency: WORKERS,
        prefetch: 8,
        ..Sub::new(&s)
    };
    let config = bed.config(&[sub]);
    let consumer = Consumer::start(&config, 1);
    for seller in 0..SENT {
        bed.nats
            .publish(
                &s,
                &payout(seller as u64, "2026-W36", 100),
                &format!("m-{seller}"),
            )
            .await;
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
    // What was taken is acked; the rest is either still undelivered or
    // delivered to the stopped process's buffer and never taken, which
    // JetStream delivers again after ack_wait: nothing is lost, nothing
    // taken is left unacknowledged.
    let left = bed.nats.counts(&s).await;
    assert_eq!(
        (left.pending + left.ack_pending, left.dead, left.late),
        ((SENT - WORKERS) as u64, 0, 0),
        "{left:?}"
    );
    let states = record_states(&bed.store_url()).await;
    assert_eq!(states.len(), WORKERS);
    assert!(states.values().all(|s| s == "completed"), "{states:?}");

    // The rest runs on the next start, each once.
    let next = Consumer::start(&config, 1);
    let stopped = stop_settled(&bed.nats, &bed.store_url(), SENT, &drained(&s), vec![next]).await;
    let keys: Vec<String> = (0..SENT)
        .map(|s| payout_key(s as u64, "2026-W36"))
        .collect();
    let want: Vec<(&str, usize)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    bed.assert_effects(&want);
    assert_eq!(settled(&stopped, "payouts").acked, (SENT - WORKERS) as u64);
    bed.drop_streams(&[&s]).await;
}

// ---- Config errors, end to end ----

/// A consumer config that loads, for the cases to break one field of.
const VALID: &str = r#"
store = "sqlite://STORE"

[[subscription]]
name = "payouts"
key = "payout:{/seller_id}:{/settlement_id}"
deliver = "http://127.0.0.1:9/payouts"
response_timeout_ms = 1000
lease_ms = 5000

[subscription.nats]
stream = "IDEMC_CONFIG_NEVER_DECLARED"
subjects = ["idemc.config.never-declared"]
ack_wait_ms = 5000

[[lookup]]
subscription = "payouts"
url = "http://127.0.0.1:9/payouts/by-key/{forwarded_key}"
"#;

/// Runs `idem` with `args`, killed if it has not ended within 20 s (a
/// config that loaded by mistake would consume forever).
fn idem_bounded(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
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

#[test]
fn config_errors_stop_idem_consume_naming_the_file_and_the_field() {
    // (what is wrong, replace this, with this, the field named)
    let cases = [
        ("a typo", "deliver =", "delivr =", "delivr"),
        (
            "a typo in the broker's section",
            "ack_wait_ms =",
            "ack_wiat_ms =",
            "ack_wiat_ms",
        ),
        (
            "no broker",
            "[subscription.nats]\nstream = \"IDEMC_CONFIG_NEVER_DECLARED\"\n\
             subjects = [\"idemc.config.never-declared\"]\nack_wait_ms = 5000\n",
            "",
            "subscription[0].nats",
        ),
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
            "an ack wait no longer than the response timeout",
            "ack_wait_ms = 5000",
            "ack_wait_ms = 1000",
            "subscription[0].nats.ack_wait_ms",
        ),
        (
            "a broker delivery limit that cannot retry",
            "ack_wait_ms = 5000",
            "ack_wait_ms = 5000\nmax_deliver = 1",
            "subscription[0].nats.max_deliver",
        ),
        (
            "a stream name with a dot",
            "stream = \"IDEMC_CONFIG_NEVER_DECLARED\"",
            "stream = \"IDEMC.CONFIG\"",
            "subscription[0].nats.stream",
        ),
        (
            "a lookup naming no subscription",
            "subscription = \"payouts\"\nurl",
            "subscription = \"refunds\"\nurl",
            "lookup[0].subscription",
        ),
    ];
    let site = Site::new();
    let valid = VALID.replace("STORE", &site.store().display().to_string());
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
    for (from, to, at) in [
        ("deliver =", "delivr =", "line 7, column 1"),
        ("ack_wait_ms =", "ack_wiat_ms =", "line 14, column 1"),
    ] {
        let path = site.config(&valid.replacen(from, to, 1));
        let out = idem_bounded(&["consume", "--config", path.to_str().unwrap()]);
        assert!(
            text(&out.stderr).contains(at),
            "{to}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn an_unreachable_server_is_named_with_its_address_field_and_file_and_no_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let site = Site::new();
    let config = VALID
        .replace("STORE", &site.store().display().to_string())
        .replace(
            "[subscription.nats]\n",
            &format!("[subscription.nats]\nurl = \"nats://payer:s3cret@127.0.0.1:{port}\"\n"),
        );
    let path = site.config(&config);
    let out = idem_bounded(&["consume", "--config", path.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for part in [
        path.display().to_string(),
        "subscription[0].nats.url".to_owned(),
        format!("nats://payer:***@127.0.0.1:{port}"),
    ] {
        assert!(stderr.contains(&part), "{part} is not named:\n{stderr}");
    }
    assert!(
        !stderr.contains("s3cret"),
        "the password is shown:\n{stderr}"
    );
}

#[test]
fn a_key_naming_the_message_fails_the_check_and_idem_consume_refuses_to_start() {
    let site = Site::new();
    let config = VALID
        .replace("STORE", &site.store().display().to_string())
        .replace(
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

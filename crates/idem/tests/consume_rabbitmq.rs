//! `idem consume` over the real RabbitMQ (127.0.0.1:5672), black-box: real
//! `idem consume` processes read a queue of their own and deliver to a
//! payout API that records every effect with its key; each message must be
//! settled as docs/consumers.md's settle table says. Every test ends by
//! stopping the consumers with SIGTERM once the records are final, and
//! checks the queues again after the broker has taken back whatever the
//! consumers held: nothing is left unsettled.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use support::rabbit::{
    Queues, Rabbit, Sub, body, consume_toml, effects_per_key, header, payout, payout_key,
    record_states, settled, stop_settled, unique, until,
};
use support::{Consumer, PgSchema, Site, Upstream, eventually, text};

const WAIT: Duration = Duration::from_secs(15);

/// One test's world: the payout API, a temp dir with the SQLite store and
/// the config file, and a client of the broker.
struct Bed {
    up: Upstream,
    site: Site,
    rabbit: Rabbit,
}

impl Bed {
    async fn new() -> Bed {
        Bed {
            up: Upstream::start().await,
            site: Site::new(),
            rabbit: Rabbit::connect().await,
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

    /// Deletes what the consumer declared for `queues`.
    async fn drop_queues(self, queues: &[&str]) {
        for q in queues {
            self.rabbit.delete(q).await;
        }
        self.rabbit.close().await;
    }
}

/// `queue` with its retry, dead-letter and late queues all empty.
fn drained(queue: &str) -> [(&str, Queues); 1] {
    [(queue, Queues::default())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_intent_republished_under_three_message_ids_runs_once_and_all_are_acked() {
    let bed = Bed::new().await;
    let q = unique("republish");
    let consumer = Consumer::start(&bed.config(&[Sub::new(&q)]), 1);
    let intent = payout(847, "2026-W36", 1200);
    for id in ["m-1", "m-2", "m-3"] {
        bed.rabbit.publish(&q, &intent, id).await;
    }
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);

    let stopped = stop_settled(
        &bed.rabbit,
        &bed.store_url(),
        1,
        &drained(&q),
        vec![consumer],
    )
    .await;
    bed.assert_effects(&[(&payout_key(847, "2026-W36"), 1)]);
    assert_eq!(bed.up.hits(), 1, "the service was called once");
    let s = settled(&stopped, "payouts");
    assert_eq!((s.acked, s.dead_lettered, s.late), (3, 0, 0), "{s:?}");
    bed.drop_queues(&[&q]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_between_the_effect_and_the_ack_never_repeats_the_effect() {
    let bed = Bed::new().await;
    let q = unique("killed");
    // The service pays at once and answers a second later: the kill lands
    // after the effect and before any record of it or any ack.
    let sub = Sub {
        deliver: "/slow?ms=1000".into(),
        ..Sub::new(&q)
    };
    let config = bed.config(&[sub]);
    let first = Consumer::start(&config, 1);
    bed.rabbit
        .publish(&q, &payout(847, "2026-W36", 1200), "m-1")
        .await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    first.kill();
    let key = payout_key(847, "2026-W36");
    let states = record_states(&bed.store_url()).await;
    assert_eq!(states.get(&key).map(String::as_str), Some("in_progress"));

    // The broker delivers the message again to a fresh consumer: held back
    // while the lease runs, then ambiguous until the reconciler finds the
    // payment by its key, then a replay, acked.
    let second = Consumer::start(&config, 1);
    let stopped = stop_settled(&bed.rabbit, &bed.store_url(), 1, &drained(&q), vec![second]).await;
    bed.assert_effects(&[(&key, 1)]);
    assert_eq!(bed.up.hits(), 1, "the redelivery reached the service");
    assert!(
        bed.up.lookups() >= 1,
        "resolved without asking the provider"
    );
    let s = settled(&stopped, "payouts");
    assert_eq!(s.acked, 1, "{s:?}");
    assert!(
        s.retried >= 1,
        "the redelivery was acked before the record was final: {s:?}"
    );
    bed.drop_queues(&[&q]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_racing_on_duplicates_make_one_effect_per_intent() {
    const INTENTS: u64 = 20;
    const COPIES: u64 = 3;
    let bed = Bed::new().await;
    let q = unique("race");
    // A slow answer keeps the first copy in flight while the others arrive.
    let sub = Sub {
        deliver: "/slow?ms=200".into(),
        ..Sub::new(&q)
    };
    let config = bed.config(&[sub]);
    let consumers = vec![Consumer::start(&config, 1), Consumer::start(&config, 1)];
    for copy in 0..COPIES {
        for seller in 0..INTENTS {
            let intent = payout(seller, "2026-W36", 100 + seller);
            bed.rabbit
                .publish(&q, &intent, &format!("m-{seller}-{copy}"))
                .await;
        }
    }
    assert!(eventually(WAIT, || bed.up.hits() as u64 >= INTENTS).await);

    let stopped = stop_settled(
        &bed.rabbit,
        &bed.store_url(),
        INTENTS as usize,
        &drained(&q),
        consumers,
    )
    .await;
    let keys: Vec<String> = (0..INTENTS).map(|s| payout_key(s, "2026-W36")).collect();
    let want: Vec<(&str, usize)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    bed.assert_effects(&want);
    let s = settled(&stopped, "payouts");
    assert_eq!(s.acked, INTENTS * COPIES, "{s:?}");
    for c in &stopped {
        let mine = settled(std::slice::from_ref(c), "payouts");
        assert!(
            mine.acked > 0,
            "a consumer took no message: no race was run"
        );
    }
    bed.drop_queues(&[&q]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_outcome_is_held_back_until_the_reconciler_resolves_it() {
    let bed = Bed::new().await;
    let q = unique("ambiguous");
    // The service pays, then answers 500: the outcome is unknown.
    let sub = Sub {
        deliver: "/fail".into(),
        ..Sub::new(&q)
    };
    bed.up.set_lookup_down(true);
    let consumer = Consumer::start(&bed.config(&[sub]), 1);
    bed.rabbit
        .publish(&q, &payout(847, "2026-W36", 1200), "m-1")
        .await;
    let (rabbit, store, key) = (&bed.rabbit, bed.store_url(), payout_key(847, "2026-W36"));
    let (store, key, queue) = (store.as_str(), key.as_str(), q.as_str());
    assert!(
        until(WAIT, move || async move {
            record_states(store).await.get(key).map(String::as_str) == Some("ambiguous")
        })
        .await
    );
    // While the provider cannot say, the message is handed back (parked in
    // the retry queue), never acked, and the service is not called again.
    assert!(
        until(WAIT, move || async move {
            rabbit.queues(queue).await.retry == 1
        })
        .await
    );
    assert!(eventually(WAIT, || bed.up.lookups() >= 2).await);
    assert_eq!(bed.up.hits(), 1);
    assert_eq!(
        record_states(store).await.get(key).map(String::as_str),
        Some("ambiguous")
    );

    bed.up.set_lookup_down(false);
    let stopped = stop_settled(&bed.rabbit, store, 1, &drained(&q), vec![consumer]).await;
    assert_eq!(bed.up.hits(), 1, "the service was called again");
    bed.assert_effects(&[(key, 1)]);
    let s = settled(&stopped, "payouts");
    assert_eq!(s.acked, 1, "{s:?}");
    assert!(s.retried >= 2, "handed back while ambiguous: {s:?}");
    bed.drop_queues(&[&q]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_with_a_body_over_the_limit_is_final_and_never_run_again() {
    let bed = Bed::new().await;
    let q = unique("big");
    // No lookup: only the answer itself can make the record final.
    let sub = Sub {
        deliver: "/big".into(),
        lookup: false,
        ..Sub::new(&q)
    };
    let consumer = Consumer::start(&bed.config(&[sub]), 1);
    let intent = payout(847, "2026-W36", 1200);
    bed.rabbit.publish(&q, &intent, "m-1").await;
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
    bed.rabbit.publish(&q, &intent, "m-2").await;
    let stopped = stop_settled(&bed.rabbit, store, 1, &drained(&q), vec![consumer]).await;
    bed.assert_effects(&[(key, 1)]);
    assert_eq!(bed.up.hits(), 1, "the service was called again");
    let s = settled(&stopped, "payouts");
    assert_eq!((s.acked, s.retried, s.dead_lettered), (2, 0, 0), "{s:?}");

    let out = support::idem(&[
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
    bed.drop_queues(&[&q]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_payload_is_dead_lettered_and_never_run() {
    let bed = Bed::new().await;
    let q = unique("reused");
    let consumer = Consumer::start(&bed.config(&[Sub::new(&q)]), 1);
    bed.rabbit
        .publish(&q, &payout(847, "2026-W36", 1200), "m-1")
        .await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    let other = payout(847, "2026-W36", 9999);
    bed.rabbit.publish(&q, &other, "m-2").await;

    let expect = Queues {
        dead: 1,
        ..Queues::default()
    };
    let stopped = stop_settled(
        &bed.rabbit,
        &bed.store_url(),
        1,
        &[(&q, expect)],
        vec![consumer],
    )
    .await;
    bed.assert_effects(&[(&payout_key(847, "2026-W36"), 1)]);
    let dead = bed.rabbit.drain(&format!("{q}.dead")).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(body(&dead[0]), other);
    assert_eq!(
        header(&dead[0], "Idem-Reason").as_deref(),
        Some("key-reused")
    );
    let detail = header(&dead[0], "Idem-Reason-Detail").unwrap();
    assert!(detail.contains("payout:847:2026-W36"), "{detail}");
    let s = settled(&stopped, "payouts");
    assert_eq!((s.acked, s.dead_lettered), (1, 1), "{s:?}");
    bed.drop_queues(&[&q]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_dead_letter_queue_is_declared_again_and_the_poison_message_lands_in_it() {
    let bed = Bed::new().await;
    let q = unique("deaddeleted");
    let consumer = Consumer::start(&bed.config(&[Sub::new(&q)]), 1);
    bed.rabbit
        .publish(&q, &payout(847, "2026-W36", 1200), "m-1")
        .await;
    assert!(eventually(WAIT, || bed.up.hits() == 1).await);
    // An operator deletes the dead-letter queue while the consumer runs:
    // the dead-letter exchange is left with no queue bound to it.
    bed.rabbit.delete_queue(&format!("{q}.dead")).await;
    let other = payout(847, "2026-W36", 9999);
    bed.rabbit.publish(&q, &other, "m-2").await;
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

    let expect = Queues {
        dead: 1,
        ..Queues::default()
    };
    let stopped = stop_settled(
        &bed.rabbit,
        &bed.store_url(),
        1,
        &[(&q, expect)],
        vec![consumer],
    )
    .await;
    bed.assert_effects(&[(&payout_key(847, "2026-W36"), 1)]);
    let dead = bed.rabbit.drain(&format!("{q}.dead")).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(body(&dead[0]), other);
    assert_eq!(
        header(&dead[0], "Idem-Reason").as_deref(),
        Some("key-reused")
    );
    let s = settled(&stopped, "payouts");
    assert_eq!((s.acked, s.dead_lettered), (1, 1), "{s:?}");
    bed.drop_queues(&[&q]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_reaches_the_endpoint_with_the_content_type_it_was_published_with() {
    let bed = Bed::new().await;
    let q = unique("csv");
    let sub = Sub {
        key: "payout:{header:intent-id}".into(),
        lookup: false,
        ..Sub::new(&q)
    };
    let text = consume_toml(&bed.store_url(), &bed.up, &[sub])
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
        let mut headers = FieldTable::default();
        headers.insert("intent-id".into(), AMQPValue::LongString(intent.into()));
        if let Some(value) = header {
            headers.insert("content-type".into(), AMQPValue::LongString(value.into()));
        }
        let mut properties = BasicProperties::default()
            .with_message_id(intent.into())
            .with_headers(headers);
        if let Some(value) = property {
            properties = properties.with_content_type(value.into());
        }
        bed.rabbit
            .publish_with(&q, b"seller_id,amount\n847,1200\n", properties)
            .await;
    }
    stop_settled(
        &bed.rabbit,
        &bed.store_url(),
        cases.len(),
        &drained(&q),
        vec![consumer],
    )
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
    bed.drop_queues(&[&q]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_past_retention_goes_to_the_late_queue_and_is_never_run() {
    let bed = Bed::new().await;
    let q = unique("late");
    let sub = Sub {
        retention_s: 1,
        tombstone_s: 86_400,
        ..Sub::new(&q)
    };
    let consumer = Consumer::start(&bed.config(&[sub]), 1);
    let intent = payout(847, "2026-W36", 1200);
    bed.rabbit.publish(&q, &intent, "m-1").await;
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
    bed.rabbit.publish(&q, &intent, "m-redriven").await;

    let expect = Queues {
        late: 1,
        ..Queues::default()
    };
    let stopped = stop_settled(&bed.rabbit, store, 1, &[(&q, expect)], vec![consumer]).await;
    bed.assert_effects(&[(key, 1)]);
    let late = bed.rabbit.drain(&format!("{q}.late")).await;
    assert_eq!(late.len(), 1);
    assert_eq!(body(&late[0]), intent);
    assert_eq!(
        late[0]
            .delivery
            .properties
            .message_id()
            .as_ref()
            .map(|m| m.as_str()),
        Some("m-redriven")
    );
    assert_eq!(header(&late[0], "Idem-Reason").as_deref(), Some("expired"));
    let s = settled(&stopped, "payouts");
    assert_eq!((s.acked, s.late, s.dead_lettered), (1, 1, 0), "{s:?}");
    bed.drop_queues(&[&q]).await;
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
    // (queue, payload, reason code, what the detail must name)
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
    for (i, (queue, payload, _, _)) in cases.iter().enumerate() {
        let mut headers = FieldTable::default();
        headers.insert("intent-id".into(), AMQPValue::LongString("847-W36".into()));
        let properties = BasicProperties::default()
            .with_message_id(format!("m-{i}").into())
            .with_headers(headers);
        bed.rabbit
            .publish_with(queue, payload.as_bytes(), properties)
            .await;
    }

    let expect = |dead| Queues {
        dead,
        ..Queues::default()
    };
    let stopped = stop_settled(
        &bed.rabbit,
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
    let mut dead = bed.rabbit.drain(&format!("{by_field}.dead")).await;
    dead.extend(bed.rabbit.drain(&format!("{by_header}.dead")).await);
    assert_eq!(dead.len(), cases.len());
    for (i, (_, payload, code, names)) in cases.iter().enumerate() {
        let id = format!("m-{i}");
        let m = dead
            .iter()
            .find(|m| {
                m.delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|m| m.as_str())
                    == Some(&id)
            })
            .unwrap_or_else(|| panic!("{id} is not in a dead-letter queue"));
        assert_eq!(body(m), *payload, "{id}");
        assert_eq!(header(m, "Idem-Reason").as_deref(), Some(*code), "{id}");
        let detail = header(m, "Idem-Reason-Detail").unwrap();
        assert!(detail.contains(names), "{id}: {detail}");
    }
    assert_eq!(settled(&stopped, "payouts").dead_lettered, 3);
    assert_eq!(settled(&stopped, "by-header").dead_lettered, 1);
    bed.drop_queues(&[&by_field, &by_header]).await;
}

/// The store's operation deadline, in its URL.
const OPERATION_TIMEOUT_MS: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_answering_runs_and_acks_nothing_until_it_answers_again() {
    let bed = Bed::new().await;
    let q = unique("store-down");
    let schema = PgSchema::new("consume_store_down");
    // The consumer reaches PostgreSQL through the relay; the test reads the
    // records directly.
    let (relay, relayed) = schema.through_relay().await;
    let relayed = format!("{relayed}&operation_timeout_ms={OPERATION_TIMEOUT_MS}");
    let config = bed
        .site
        .config(&consume_toml(&relayed, &bed.up, &[Sub::new(&q)]));
    let consumer = Consumer::start(&config, 1);
    bed.rabbit
        .publish(&q, &payout(1, "2026-W36", 100), "before")
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

    relay.freeze();
    bed.rabbit
        .publish(&q, &payout(2, "2026-W36", 200), "frozen")
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

    relay.thaw();
    let stopped = stop_settled(
        &bed.rabbit,
        &schema.store_url(),
        2,
        &drained(&q),
        vec![consumer],
    )
    .await;
    bed.assert_effects(&[
        (&payout_key(1, "2026-W36"), 1),
        (&payout_key(2, "2026-W36"), 1),
    ]);
    let s = settled(&stopped, "payouts");
    assert_eq!(s.acked, 2, "{s:?}");
    assert!(s.retried >= 2, "{s:?}");
    bed.drop_queues(&[&q]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_settles_every_message_in_hand_and_exits_zero() {
    const SENT: usize = 12;
    const WORKERS: usize = 4;
    let bed = Bed::new().await;
    let q = unique("sigterm");
    let sub = Sub {
        deliver: "/slow?ms=1500".into(),
        response_timeout_ms: 2_500,
        lease_ms: 3_000,
        concurrency: WORKERS,
        ..Sub::new(&q)
    };
    let config = bed.config(&[sub]);
    let consumer = Consumer::start(&config, 1);
    for seller in 0..SENT {
        bed.rabbit
            .publish(
                &q,
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
    let s = settled(std::slice::from_ref(&stopped), "payouts");
    assert_eq!(
        (s.acked, s.retried, s.settle_failed),
        (WORKERS as u64, 0, 0),
        "{s:?}"
    );
    assert_eq!(bed.up.hits(), WORKERS, "a message was taken after SIGTERM");
    // What was taken is acked; what was not (waiting, or prefetched but not
    // taken) is back in the queue.
    bed.rabbit.wait_unconsumed(&q).await;
    let left = bed.rabbit.queues(&q).await;
    assert_eq!(
        left,
        Queues {
            ready: (SENT - WORKERS) as u32,
            ..Queues::default()
        }
    );
    let states = record_states(&bed.store_url()).await;
    assert_eq!(states.len(), WORKERS);
    assert!(states.values().all(|s| s == "completed"), "{states:?}");

    // The rest runs on the next start, each once.
    let next = Consumer::start(&config, 1);
    let stopped = stop_settled(
        &bed.rabbit,
        &bed.store_url(),
        SENT,
        &drained(&q),
        vec![next],
    )
    .await;
    let keys: Vec<String> = (0..SENT)
        .map(|s| payout_key(s as u64, "2026-W36"))
        .collect();
    let want: Vec<(&str, usize)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    bed.assert_effects(&want);
    assert_eq!(settled(&stopped, "payouts").acked, (SENT - WORKERS) as u64);
    bed.drop_queues(&[&q]).await;
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

[subscription.rabbitmq]
queue = "idem-consume-config-never-declared"

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
            "no broker",
            "[subscription.rabbitmq]\nqueue = \"idem-consume-config-never-declared\"\n",
            "",
            // The error is the subscription's (`subscription[0].nats` once
            // the bridge reads NATS too); its message names the section.
            "[subscription.rabbitmq] section",
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
    // A typo is located by line and column.
    let path = site.config(&valid.replacen("deliver =", "delivr =", 1));
    let out = idem_bounded(&["consume", "--config", path.to_str().unwrap()]);
    assert!(
        text(&out.stderr).contains("line 7, column 1"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_unreachable_broker_is_named_with_its_address_field_and_file_and_no_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let site = Site::new();
    let config = VALID
        .replace("STORE", &site.store().display().to_string())
        .replace(
            "[subscription.rabbitmq]\n",
            &format!(
                "[subscription.rabbitmq]\nurl = \"amqp://payer:s3cret@127.0.0.1:{port}/%2f\"\n"
            ),
        );
    let path = site.config(&config);
    let out = idem_bounded(&["consume", "--config", path.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for part in [
        path.display().to_string(),
        "subscription[0].rabbitmq.url".to_owned(),
        format!("amqp://payer:***@127.0.0.1:{port}/%2f"),
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

//! Amazon SQS's side of the consumer suite's bed, on moto in server mode
//! (started by `scripts/test.sh`; it serves SQS on the DynamoDB port):
//! each test's queue and its two sinks (`<q>-dead`, `<q>-late`, with
//! `.fifo` kept at the end for a FIFO queue) are created when the config
//! names them, as an operator creates them before `idem consume` starts;
//! counts come from `GetQueueAttributes`, copies from receiving from the
//! sinks.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName};
use idem_testkit::services::Service;

use super::broker::{Broker, Copy, Counts, Publish, Sink, Sub};

/// The message attribute the suite's publisher puts its message id in:
/// SQS mints its own `MessageId`, and a copy in a sink is a new message
/// with another one, so the producer's id travels as an attribute.
pub const ID_ATTRIBUTE: &str = "publish-id";

/// The shortest visibility timeout the suite gives a queue, in seconds:
/// the keeper extends it every third of it, and a moto loaded by the tests
/// running beside answers late enough that a 2 s timeout lapsed between
/// two extensions (a second delivery, replayed by idem, but counted).
const VISIBILITY_MIN_S: u64 = 4;

/// A plain SQS client beside the consumer under test.
pub struct Sqs {
    pub client: Client,
}

pub use idem_testkit::sqs::client;

/// The URL moto gives queue `name` (its account is always the same).
pub fn url(name: &str) -> String {
    format!(
        "{}/123456789012/{name}",
        Service::Moto.endpoint().trim_end_matches('/')
    )
}

/// Queue `dest`'s sink for `sink`: `<dest>-dead` or `<dest>-late`, `.fifo`
/// kept last.
pub fn sink_name(dest: &str, sink: Sink) -> String {
    let suffix = match sink {
        Sink::DeadLetter => "dead",
        Sink::Late => "late",
    };
    match dest.strip_suffix(".fifo") {
        Some(stem) => format!("{stem}-{suffix}.fifo"),
        None => format!("{dest}-{suffix}"),
    }
}

/// Creates queue `name` (FIFO when its name says so, content-based
/// deduplication on) unless it is there.
pub async fn create(client: &Client, name: &str) -> String {
    let mut create = client.create_queue().queue_name(name);
    if name.ends_with(".fifo") {
        create = create
            .attributes(QueueAttributeName::FifoQueue, "true")
            .attributes(QueueAttributeName::ContentBasedDeduplication, "true");
    }
    create.send().await.unwrap().queue_url.unwrap()
}

/// Creates `dest` and its two sinks, from synchronous code running inside
/// a test's runtime (the config is written there): on a thread of its own.
fn create_all_blocking(dest: &str) {
    let names = [
        dest.to_owned(),
        sink_name(dest, Sink::DeadLetter),
        sink_name(dest, Sink::Late),
    ];
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let client = client();
            for name in &names {
                create(&client, name).await;
            }
        });
    })
    .join()
    .unwrap();
}

impl Sqs {
    /// One attribute of queue `name`, as a number (0 when absent).
    pub async fn attribute(&self, name: &str, attribute: QueueAttributeName) -> u64 {
        let answer = self
            .client
            .get_queue_attributes()
            .queue_url(url(name))
            .attribute_names(attribute.clone())
            .send()
            .await
            .unwrap();
        answer
            .attributes()
            .and_then(|a| a.get(&attribute))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Queue `name`'s visible and invisible messages, read in one call so
    /// that a message changing visibility is counted once.
    pub async fn visible_and_not(&self, name: &str) -> (u64, u64) {
        let (visible, invisible) = (
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        );
        let answer = self
            .client
            .get_queue_attributes()
            .queue_url(url(name))
            .attribute_names(visible.clone())
            .attribute_names(invisible.clone())
            .send()
            .await
            .unwrap();
        let read = |a: &QueueAttributeName| {
            answer
                .attributes()
                .and_then(|m| m.get(a))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        (read(&visible), read(&invisible))
    }

    /// Messages in queue `name` whatever their visibility.
    async fn all(&self, name: &str) -> u64 {
        let (visible, invisible) = self.visible_and_not(name).await;
        visible + invisible
    }

    /// Receives everything visible in queue `name` and deletes it.
    pub async fn drain(&self, name: &str) -> Vec<aws_sdk_sqs::types::Message> {
        let mut taken = Vec::new();
        loop {
            let answer = self
                .client
                .receive_message()
                .queue_url(url(name))
                .max_number_of_messages(10)
                .message_attribute_names("All")
                .wait_time_seconds(0)
                .send()
                .await
                .unwrap();
            let batch = answer.messages.unwrap_or_default();
            if batch.is_empty() {
                return taken;
            }
            for m in batch {
                self.client
                    .delete_message()
                    .queue_url(url(name))
                    .receipt_handle(m.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
                taken.push(m);
            }
        }
    }
}

/// A String message attribute.
pub fn text(value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .unwrap()
}

/// A message's String attributes, by name.
pub fn attributes(m: &aws_sdk_sqs::types::Message) -> HashMap<String, String> {
    m.message_attributes()
        .into_iter()
        .flatten()
        .filter_map(|(n, v)| Some((n.clone(), v.string_value()?.to_owned())))
        .collect()
}

impl Broker for Sqs {
    const SECTION: &'static str = "sqs";
    // A retry is a visibility change of whole seconds: held back at most
    // 2 s, so the suite's redeliveries come within its waits.
    const RETRY_AFTER_MAX_MS: Option<u64> = Some(2_000);
    const ADDRESS_FIELD: &'static str = "endpoint_url";

    async fn connect() -> Sqs {
        Sqs { client: client() }
    }

    fn unique(prefix: &str) -> String {
        idem_testkit::brokers::unique(prefix)
    }

    /// Creates the queues, then names them. SQS's visibility stands for
    /// JetStream's ack wait; receives wait 1 s, so a consumer stops soon.
    fn section(s: &Sub) -> String {
        create_all_blocking(&s.dest);
        format!(
            r#"[subscription.sqs]
queue_url = {queue:?}
dead_letter_queue_url = {dead:?}
late_queue_url = {late:?}
region = "us-east-1"
endpoint_url = {endpoint:?}
wait_time_s = 1
visibility_timeout_s = {visibility}
"#,
            queue = url(&s.dest),
            dead = url(&sink_name(&s.dest, Sink::DeadLetter)),
            late = url(&sink_name(&s.dest, Sink::Late)),
            endpoint = s.url.clone().unwrap_or_else(|| Service::Moto.endpoint()),
            visibility = s.ack_wait_ms.div_ceil(1000).max(VISIBILITY_MIN_S),
        )
    }

    /// Sends with the headers as String attributes, the media type as a
    /// `content-type` attribute and the id as [`ID_ATTRIBUTE`]; to a FIFO
    /// queue in group `group` (a header of that name) or `payouts`.
    async fn publish(&self, queue: &str, payload: &[u8], message: Publish<'_>) {
        let mut send = self
            .client
            .send_message()
            .queue_url(url(queue))
            .message_body(String::from_utf8_lossy(payload))
            .message_attributes(ID_ATTRIBUTE, text(message.id));
        for (name, value) in message.headers {
            send = send.message_attributes(*name, text(value));
        }
        if let Some(media) = message.content_type {
            send = send.message_attributes("content-type", text(media));
        }
        if queue.ends_with(".fifo") {
            let group = message
                .headers
                .iter()
                .find(|(n, _)| *n == "group")
                .map_or("payouts", |(_, v)| v);
            send = send
                .message_group_id(group)
                .message_deduplication_id(message.id);
        }
        send.send().await.unwrap();
    }

    /// Visible messages wait; invisible ones (in hand, or handed back with
    /// a delay) are held; the sinks count whatever their visibility.
    async fn counts(&self, queue: &str) -> Counts {
        let (waiting, held) = self.visible_and_not(queue).await;
        Counts {
            waiting,
            held,
            dead: self.all(&sink_name(queue, Sink::DeadLetter)).await,
            late: self.all(&sink_name(queue, Sink::Late)).await,
        }
    }

    /// Waits (up to 15 s) until no message of `queue` is invisible: what a
    /// stopped consumer held comes back when its visibility ends (it hands
    /// back at once what it received and never started).
    async fn after_stop(&self, queue: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while self
            .attribute(
                queue,
                QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            )
            .await
            > 0
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{queue} still has invisible messages 15 s after its consumer stopped"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Receives the copies off the sink; the producer's id is read from
    /// [`ID_ATTRIBUTE`], the reason from its attributes.
    async fn copies(&self, queue: &str, sink: Sink) -> Vec<Copy> {
        let mut copies = Vec::new();
        for m in self.drain(&sink_name(queue, sink)).await {
            let headers: BTreeMap<String, String> = attributes(&m).into_iter().collect();
            copies.push(Copy {
                payload: m.body().unwrap_or_default().to_owned(),
                message_id: headers.get(ID_ATTRIBUTE).cloned(),
                headers,
            });
        }
        copies
    }

    /// SQS says nothing of a message's past without receiving it: a
    /// message handed back with a delay is invisible, which is what can be
    /// told from here (the suite checks the retries in the consumer's
    /// counts).
    async fn handed_back(&self, queue: &str) -> bool {
        self.counts(queue).await.held >= 1
    }

    /// Exactly `n` messages are waiting or invisible (held by a consumer,
    /// or handed back), and none was copied.
    async fn assert_held(&self, queue: &str, n: u64) {
        let seen = self.counts(queue).await;
        assert!(
            seen.waiting + seen.held == n && seen.dead == 0 && seen.late == 0,
            "dropped or copied while held back: {seen:?}"
        );
    }

    async fn assert_left(&self, queue: &str, n: u64) {
        self.after_stop(queue).await;
        assert_eq!(
            self.counts(queue).await,
            Counts {
                waiting: n,
                ..Counts::default()
            }
        );
    }

    /// Deletes each queue and its sinks.
    async fn delete(self, queues: &[&str]) {
        for queue in queues {
            for name in [
                (*queue).to_owned(),
                sink_name(queue, Sink::DeadLetter),
                sink_name(queue, Sink::Late),
            ] {
                let _ = self
                    .client
                    .delete_queue()
                    .queue_url(url(&name))
                    .send()
                    .await;
            }
        }
    }

    /// An endpoint with a password in its userinfo (no SQS endpoint has
    /// one, but one pasted from elsewhere must not reach a log).
    fn url_with_password(port: u16) -> (String, String) {
        (
            format!("http://payer:s3cret@127.0.0.1:{port}"),
            format!("http://payer:***@127.0.0.1:{port}"),
        )
    }

    const VALID_SECTION: &'static str = r#"[subscription.sqs]
queue_url = "https://sqs.us-east-1.amazonaws.com/123456789012/idem-consume-config-never-created"
dead_letter_queue_url = "https://sqs.us-east-1.amazonaws.com/123456789012/idem-consume-config-dead"
late_queue_url = "https://sqs.us-east-1.amazonaws.com/123456789012/idem-consume-config-late"
region = "us-east-1"
"#;

    fn config_errors() -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
        vec![
            (
                "no broker",
                Self::VALID_SECTION,
                "",
                "[subscription.sqs] section",
            ),
            (
                "a long poll past SQS's 20 s",
                "region = \"us-east-1\"",
                "region = \"us-east-1\"\nwait_time_s = 21",
                "subscription[0].sqs.wait_time_s",
            ),
            (
                "a batch past SQS's 10",
                "region = \"us-east-1\"",
                "region = \"us-east-1\"\nbatch_size = 11",
                "subscription[0].sqs.batch_size",
            ),
            (
                "a late sink that is the dead-letter sink",
                "idem-consume-config-late",
                "idem-consume-config-dead",
                "subscription[0].sqs.late_queue_url",
            ),
            (
                "no dead-letter sink",
                "dead_letter_queue_url = \"https://sqs.us-east-1.amazonaws.com/123456789012/idem-consume-config-dead\"\n",
                "",
                "dead_letter_queue_url",
            ),
        ]
    }

    fn typo_locations() -> Vec<(&'static str, &'static str, &'static str)> {
        vec![(
            "region = \"us-east-1\"",
            "regoin = \"us-east-1\"",
            "line 15, column 1",
        )]
    }
}

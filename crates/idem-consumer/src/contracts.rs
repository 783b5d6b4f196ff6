//! Each subscription's contract, judged by the twelve questions and
//! cross-checked against what the subscription enforces (the same checks
//! as a gateway route's, under `consumer.*` topics: retention, tombstone,
//! lease, takeover, lookup), plus where its key comes from. `idem consume` refuses to start when one fails;
//! `idem check --consumer` prints them.

use std::path::PathBuf;

use idem_contract::consumer::KeySource;
use idem_contract::{Enforcer, Finding, GatewayFacts, Judgement};
use idem_message::Source;

use crate::config::{ConsumeConfig, Subscription};

/// One subscription's contract and its cross-checks.
#[derive(Debug)]
pub struct SubscriptionContract {
    /// The subscription's name.
    pub subscription: String,
    /// The contract file, resolved against the config file's directory.
    pub path: PathBuf,
    /// The twelve questions and the cross-checks, or why the file could
    /// not be read.
    pub outcome: Judgement,
}

impl SubscriptionContract {
    /// True when the file was read and every question and cross-check passed.
    pub fn passed(&self) -> bool {
        idem_contract::judgement_passed(&self.outcome)
    }

    /// One line per failure, for logs and refusals.
    pub fn failures(&self) -> Vec<String> {
        idem_contract::judgement_failures(&self.outcome)
    }
}

/// The contracts the subscriptions name, judged, in config order.
pub fn evaluate(config: &ConsumeConfig) -> Vec<SubscriptionContract> {
    config
        .subscriptions
        .iter()
        .filter_map(|sub| {
            let path = sub.contract.clone()?;
            let outcome = idem_contract::load(&path).map(|contract| {
                let report = idem_contract::check(&contract);
                let cross = idem_contract::cross_check_for(
                    Enforcer::Consumer,
                    &contract,
                    &facts(config, sub),
                );
                (report, cross)
            });
            Some(SubscriptionContract {
                subscription: sub.name.clone(),
                path,
                outcome,
            })
        })
        .collect()
}

/// Where the subscription's key comes from, judged with or without a
/// contract (`consumer.key_source`).
pub fn key_source(sub: &Subscription) -> Finding {
    let template = sub.intent.key();
    let source = if template.uses_message_id() {
        KeySource::MessageId
    } else if template.sources().all(|s| matches!(s, Source::Header(_))) {
        KeySource::Header
    } else {
        KeySource::Payload
    };
    idem_contract::consumer::key_source_finding(source, template.as_str())
}

/// What the subscription enforces, in the contract crate's terms.
fn facts(config: &ConsumeConfig, sub: &Subscription) -> GatewayFacts {
    GatewayFacts {
        retention_s: sub.policy.retention_s(),
        tombstone_s: sub.policy.tombstone_s(),
        lease_ms: sub.policy.lease_ms(),
        on_lease_expiry_takeover: false,
        upstream_dedups: false,
        has_lookup: config.lookups.iter().any(|(op, _)| *op == sub.name),
        region_mode: None,
    }
}

/// What `idem check --consumer` says about a subscription's broker beside
/// the findings, read from the broker itself; a note never fails the
/// check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerNote {
    /// `WARN` (a setting that can hand a message on while its record is
    /// still in flight, a broker that cannot be reached) or `INFO`.
    pub level: &'static str,
    /// What it is about, e.g. `sqs.redrive`.
    pub topic: &'static str,
    /// The note, in words.
    pub text: String,
}

impl BrokerNote {
    fn warn(topic: &'static str, text: String) -> BrokerNote {
        BrokerNote {
            level: "WARN",
            topic,
            text,
        }
    }

    fn info(topic: &'static str, text: String) -> BrokerNote {
        BrokerNote {
            level: "INFO",
            topic,
            text,
        }
    }
}

/// How long `broker_notes` waits for a broker's answer.
const INSPECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Notes on `sub`'s broker, read from it: for an SQS queue, its redrive
/// policy against the time a record may stay in flight, and what its
/// receive count means. A broker that cannot be reached is a note too.
pub async fn broker_notes(sub: &Subscription) -> Vec<BrokerNote> {
    let crate::broker::Broker::Sqs(config) = &sub.broker else {
        return Vec::new();
    };
    let read = tokio::time::timeout(
        INSPECT_TIMEOUT,
        idem_broker::SqsSubscription::inspect(config),
    )
    .await;
    let hold_ms = sub.policy.lease_ms() + millis(sub.response_timeout);
    match read {
        Ok(Ok(attributes)) => {
            sqs_notes(&attributes, u64::from(config.visibility_timeout_s), hold_ms)
        }
        Ok(Err(e)) => vec![BrokerNote::warn(
            "sqs.unreachable",
            format!("cannot read the queue's attributes ({e}); the other checks stand"),
        )],
        Err(_) => vec![BrokerNote::warn(
            "sqs.unreachable",
            format!(
                "{} did not answer within {} s; the other checks stand",
                config.masked_url(),
                INSPECT_TIMEOUT.as_secs()
            ),
        )],
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The notes on an SQS queue's attributes, for a subscription that
/// receives with `visibility_s` and whose record may stay in flight for
/// `hold_ms` (the lease plus the response timeout).
pub fn sqs_notes(
    a: &idem_broker::sqs::QueueAttributes,
    visibility_s: u64,
    hold_ms: u64,
) -> Vec<BrokerNote> {
    let mut notes = vec![BrokerNote::info(
        "sqs.receive_count",
        "a message's delivery count is SQS's ApproximateReceiveCount: every receive adds \
         one (a retry, a redelivery after a crash or a visibility that ran out), and SQS may \
         count a receive whose answer was lost, so it is at least the deliveries this \
         consumer saw"
            .into(),
    )];
    match a.max_receive_count {
        Some(count) => {
            let horizon_ms = count.saturating_mul(visibility_s).saturating_mul(1000);
            let target = a
                .redrive_target
                .as_deref()
                .unwrap_or("its dead-letter queue");
            let text = format!(
                "redrive policy: maxReceiveCount {count} x visibility {visibility_s} s = {} s, \
                 lease + response timeout = {} ms; idem consume dead-letters a message still \
                 not final at delivery {count} itself, with its reason",
                horizon_ms / 1000,
                hold_ms
            );
            if horizon_ms < hold_ms {
                notes.push(BrokerNote::warn(
                    "sqs.redrive",
                    format!(
                        "{text}; shorter than the lease: a message can move to {target} \
                         while its record is still in flight. Raise maxReceiveCount or \
                         visibility_timeout_s"
                    ),
                ));
            } else {
                notes.push(BrokerNote::info("sqs.redrive", text));
            }
        }
        None => notes.push(BrokerNote::info(
            "sqs.redrive",
            "no redrive policy: SQS never moves a message on its own; set max_deliveries to \
             bound the deliveries of a message that stays undecided"
                .into(),
        )),
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_broker::sqs::QueueAttributes;

    #[test]
    fn a_redrive_shorter_than_the_lease_is_a_warning() {
        let policy = |count| QueueAttributes {
            max_receive_count: count,
            redrive_target: Some("arn:aws:sqs:us-east-1:1:payouts-dlq".into()),
            ..QueueAttributes::default()
        };
        let level = |notes: Vec<BrokerNote>| {
            notes
                .iter()
                .find(|n| n.topic == "sqs.redrive")
                .map(|n| n.level)
        };
        // 2 receives x 5 s = 10 s against 30 s + 10 s in flight.
        assert_eq!(level(sqs_notes(&policy(Some(2)), 5, 40_000)), Some("WARN"));
        assert_eq!(level(sqs_notes(&policy(Some(8)), 5, 40_000)), Some("INFO"));
        assert_eq!(level(sqs_notes(&policy(None), 5, 40_000)), Some("INFO"));
        let notes = sqs_notes(&policy(Some(2)), 5, 40_000);
        assert!(notes.iter().any(|n| n.topic == "sqs.receive_count"));
        assert!(
            notes.iter().any(|n| n.text.contains("payouts-dlq")),
            "{notes:?}"
        );
    }
}

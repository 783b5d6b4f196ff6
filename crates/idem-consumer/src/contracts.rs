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

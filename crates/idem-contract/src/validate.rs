//! Value checks the schema cannot express: ranges, fields required by another
//! field, and `enabled = false` sections that still carry values.
//!
//! These are load errors (exit 2), not review verdicts: a file that says
//! `max_receives = 0` describes no real system, so judging it would mislead.

use crate::error::{ContractError, Locator};
use crate::schema::{Contract, KeySource, Reconcile, Redrive, ReplaySources};

type Found = Vec<(String, String)>;

/// The first invalid value in `contract`, as an error located in the source text.
pub(crate) fn validate(contract: &Contract, loc: &Locator<'_>) -> Result<(), ContractError> {
    let mut found: Found = Vec::new();
    sections(contract, &mut found);
    if let Some(r) = &contract.replay {
        replay(r, &mut found);
    }
    match found.into_iter().next() {
        Some((field, reason)) => Err(loc.invalid(&field, reason)),
        None => Ok(()),
    }
}

fn bad(found: &mut Found, field: &str, reason: impl Into<String>) {
    found.push((field.to_string(), reason.into()));
}

/// Every section but `[replay.*]`, in the file's order: the first problem
/// found is the one reported.
fn sections(c: &Contract, found: &mut Found) {
    intent(c, found);
    key(c, found);
    propagation(c, found);
    concurrency(c, found);
    retention(c, found);
}

/// `[operation]` and `[intent]`: names that are not blank.
fn intent(c: &Contract, found: &mut Found) {
    if c.operation.name.trim().is_empty() {
        bad(found, "operation.name", "must not be empty");
    }
    if let Some(i) = &c.intent {
        if i.description.trim().is_empty() {
            bad(found, "intent.description", "must not be empty");
        }
        if i.fields.iter().any(|f| f.trim().is_empty()) {
            bad(found, "intent.fields", "field names must not be empty");
        }
    }
}

/// `[key]`: a business key has a balanced template, other sources none.
fn key(c: &Contract, found: &mut Found) {
    if let Some(k) = &c.key {
        match (k.source, &k.template) {
            (KeySource::Business, None) => bad(
                found,
                "key.template",
                "required when source = \"business\", e.g. \"payout:{seller_id}:{settlement_id}\"",
            ),
            (KeySource::Business, Some(t)) if placeholders(t).is_none() => bad(
                found,
                "key.template",
                "unbalanced `{` or `}` in the template",
            ),
            (KeySource::Uuid | KeySource::ContentHash, Some(_)) => bad(
                found,
                "key.template",
                "only meaningful with source = \"business\"",
            ),
            _ => {}
        }
    }
}

/// `[[propagation.dependency]]`: a dedup window exactly where it dedups,
/// and only by a key it receives.
fn propagation(c: &Contract, found: &mut Found) {
    if let Some(p) = &c.propagation {
        for (i, d) in p.dependencies.iter().enumerate() {
            let at = |f: &str| format!("propagation.dependency[{i}].{f}");
            match (d.dedups, d.dedup_window_s) {
                (true, None) => bad(found, &at("dedup_window_s"), "required when dedups = true"),
                (true, Some(0)) => bad(found, &at("dedup_window_s"), "must be greater than 0"),
                (false, Some(_)) => bad(found, &at("dedup_window_s"), "set while dedups = false"),
                _ => {}
            }
            if d.dedups && !d.receives_key {
                bad(
                    found,
                    &at("dedups"),
                    "a dependency cannot dedup by a key it does not receive",
                );
            }
        }
    }
}

/// `[concurrency]` and `[ambiguity]`: timeouts above zero, a lookup where
/// the provider is asked.
fn concurrency(c: &Contract, found: &mut Found) {
    if let Some(cc) = &c.concurrency {
        if cc.lease_ms == 0 {
            bad(found, "concurrency.lease_ms", "must be greater than 0");
        }
        if cc.upstream_timeout_ms == 0 {
            bad(
                found,
                "concurrency.upstream_timeout_ms",
                "must be greater than 0",
            );
        }
    }
    if let Some(a) = &c.ambiguity {
        if a.reconcile == Reconcile::ProviderLookup && a.lookup.is_none() {
            bad(
                found,
                "ambiguity.lookup",
                "required when reconcile = \"provider_lookup\"",
            );
        }
        if a.max_tries == Some(0) {
            bad(found, "ambiguity.max_tries", "must be at least 1");
        }
    }
}

/// `[retention]` and `[regions]`: horizons in order, regions named.
fn retention(c: &Contract, found: &mut Found) {
    if let Some(r) = &c.retention {
        if r.retention_s == 0 {
            bad(found, "retention.retention_s", "must be greater than 0");
        }
        if r.tombstone_s < r.retention_s {
            bad(
                found,
                "retention.tombstone_s",
                format!(
                    "{} is shorter than retention_s = {}; both count from the first claim",
                    r.tombstone_s, r.retention_s
                ),
            );
        }
    }
    if let Some(r) = &c.regions {
        if r.names.is_empty() {
            bad(found, "regions.names", "name at least one region");
        }
        if r.names.len() > 1 && r.claims.is_none() {
            bad(
                found,
                "regions.claims",
                "required with more than one region: \"home_region\" or \"any_region\"",
            );
        }
    }
}

/// Each `[replay.*]` section: `enabled = false` alone, or every field present.
fn replay(r: &ReplaySources, found: &mut Found) {
    if let Some(s) = &r.client {
        let fields = [
            ("attempts", s.attempts.map(u64::from)),
            ("timeout_ms", s.timeout_ms),
            ("backoff_max_ms", s.backoff_max_ms),
        ];
        toggle(found, "replay.client", s.enabled, &fields);
        if s.attempts == Some(0) {
            bad(
                found,
                "replay.client.attempts",
                "must be at least 1 (the first attempt counts)",
            );
        }
    }
    if let Some(s) = &r.queue {
        let fields = [
            ("visibility_timeout_s", s.visibility_timeout_s),
            ("max_receives", s.max_receives.map(u64::from)),
        ];
        toggle(found, "replay.queue", s.enabled, &fields);
        if s.max_receives == Some(0) {
            bad(found, "replay.queue.max_receives", "must be at least 1");
        }
        if s.visibility_timeout_s == Some(0) {
            bad(
                found,
                "replay.queue.visibility_timeout_s",
                "must be greater than 0",
            );
        }
    }
    if let Some(s) = &r.dlq {
        let redrive = s.redrive.map(|_| 0);
        let fields = [("retention_s", s.retention_s), ("redrive", redrive)];
        toggle(found, "replay.dlq", s.enabled, &fields);
        match (s.redrive, s.redrive_after_s) {
            (Some(Redrive::Automatic), None) => bad(
                found,
                "replay.dlq.redrive_after_s",
                "required when redrive = \"automatic\"",
            ),
            (Some(Redrive::Manual | Redrive::Never) | None, Some(_)) => bad(
                found,
                "replay.dlq.redrive_after_s",
                "only meaningful with redrive = \"automatic\"; a manual redrive can happen any time within retention_s",
            ),
            _ => {}
        }
    }
    let windows = [
        (
            "replay.backlog",
            r.backlog
                .as_ref()
                .map(|s| (s.enabled, ("recovery_max_s", s.recovery_max_s))),
        ),
        (
            "replay.partner",
            r.partner.as_ref().map(|s| {
                (
                    s.enabled,
                    ("resubmission_window_s", s.resubmission_window_s),
                )
            }),
        ),
        (
            "replay.batch",
            r.batch.as_ref().map(|s| {
                (
                    s.enabled,
                    ("reprocessing_window_s", s.reprocessing_window_s),
                )
            }),
        ),
        (
            "replay.failover",
            r.failover
                .as_ref()
                .map(|s| (s.enabled, ("catch_up_s", s.catch_up_s))),
        ),
    ];
    for (path, section) in windows {
        if let Some((enabled, field)) = section {
            toggle(found, path, enabled, &[field]);
        }
    }
}

fn toggle(found: &mut Found, path: &str, enabled: Option<bool>, fields: &[(&str, Option<u64>)]) {
    for (name, value) in fields {
        let field = format!("{path}.{name}");
        match (enabled.unwrap_or(true), value) {
            (true, None) => bad(
                found,
                &field,
                format!(
                    "required unless the source does not exist: write `{path} = {{ enabled = false }}`"
                ),
            ),
            (false, Some(_)) => bad(
                found,
                &field,
                "set while enabled = false; remove it or enable the source",
            ),
            _ => {}
        }
    }
}

/// The `{name}` placeholders of a template, or `None` if braces are unbalanced.
pub(crate) fn placeholders(template: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return None;
        }
        let after = &rest[open + 1..];
        let close = after.find('}')?;
        let name = &after[..close];
        if name.is_empty() || name.contains('{') {
            return None;
        }
        out.push(name.to_string());
        rest = &after[close + 1..];
    }
    Some(out)
}

//! The replay horizon: the latest moment after the intent at which another
//! attempt of it can still arrive, computed from the declared replay sources.
//!
//! An attempt reaches the operation along one *path*: optionally a re-entry
//! (a partner resubmits, a batch is reprocessed), then the delivery pipeline
//! (client retries, backlog, queue redelivery, DLQ redrive, the redriven
//! message's redelivery), then possibly a failover's catch-up. Stages of one
//! path happen one after another, so they **add**; re-entries are
//! alternatives, so only the later one counts (**max**). The horizon is the
//! latest arrival over all paths, which is therefore
//! `max(partner, batch) + client + backlog + queue + dlq + redelivery + failover`.

use crate::schema::{Redrive, ReplaySources, on};

/// The replay horizon and the components that add up to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Horizon {
    /// Latest arrival of another attempt, in seconds after the intent.
    pub total_s: u64,
    /// Each component that adds to the total: a label saying how it was computed, and seconds.
    pub breakdown: Vec<(String, u64)>,
}

/// The horizon, or the `[replay.*]` sections that must be declared first.
///
/// Required: `client`, `queue`, `partner`, `batch`, `failover`; with an
/// enabled queue also `dlq` and `backlog`. Each may be `{ enabled = false }`.
pub fn replay_horizon(sources: Option<&ReplaySources>) -> Result<Horizon, Vec<String>> {
    let Some(r) = sources else {
        return Err(vec!["replay".to_string()]);
    };
    let queue_on = r.queue.as_ref().is_some_and(|q| on(q.enabled));
    let mut missing = Vec::new();
    let required = [
        ("client", r.client.is_some(), true),
        ("queue", r.queue.is_some(), true),
        ("dlq", r.dlq.is_some(), queue_on),
        ("backlog", r.backlog.is_some(), queue_on),
        ("partner", r.partner.is_some(), true),
        ("batch", r.batch.is_some(), true),
        ("failover", r.failover.is_some(), true),
    ];
    for (name, present, needed) in required {
        if needed && !present {
            missing.push(format!("replay.{name}"));
        }
    }
    if !missing.is_empty() {
        return Err(missing);
    }
    let mut breakdown = Vec::new();
    reentry(r, &mut breakdown);
    pipeline(r, &mut breakdown);
    if let Some(f) = r.failover.as_ref().filter(|f| on(f.enabled)) {
        breakdown.push(("failover catch-up".to_string(), f.catch_up_s.unwrap_or(0)));
    }
    let total_s = breakdown.iter().map(|(_, s)| *s).sum();
    Ok(Horizon { total_s, breakdown })
}

/// `3 d 2 h 5 min 7 s`, omitting zero units; `0 s` for zero.
pub fn format_duration(total_s: u64) -> String {
    let units = [(86_400, "d"), (3_600, "h"), (60, "min"), (1, "s")];
    let mut rest = total_s;
    let mut parts = Vec::new();
    for (size, name) in units {
        if rest >= size {
            parts.push(format!("{} {name}", rest / size));
            rest %= size;
        }
    }
    if parts.is_empty() {
        "0 s".to_string()
    } else {
        parts.join(" ")
    }
}

/// The later of the two re-entry windows: only one re-entry starts a path.
fn reentry(r: &ReplaySources, out: &mut Vec<(String, u64)>) {
    let partner = r
        .partner
        .as_ref()
        .filter(|p| on(p.enabled))
        .and_then(|p| p.resubmission_window_s);
    let batch = r
        .batch
        .as_ref()
        .filter(|b| on(b.enabled))
        .and_then(|b| b.reprocessing_window_s);
    let label = match (partner, batch) {
        (Some(p), Some(b)) if p >= b => format!(
            "re-entry: partner resubmission (later than batch reprocessing {})",
            format_duration(b)
        ),
        (Some(p), Some(_)) => format!(
            "re-entry: batch reprocessing (later than partner resubmission {})",
            format_duration(p)
        ),
        (Some(_), None) => "re-entry: partner resubmission window".to_string(),
        (None, Some(_)) => "re-entry: batch reprocessing window".to_string(),
        (None, None) => return,
    };
    out.push((label, partner.unwrap_or(0).max(batch.unwrap_or(0))));
}

/// Client retries, then the queue: stages of one delivery, so they add.
fn pipeline(r: &ReplaySources, out: &mut Vec<(String, u64)>) {
    if let Some(c) = r.client.as_ref().filter(|c| on(c.enabled)) {
        let attempts = u64::from(c.attempts.unwrap_or(1));
        let timeout_ms = c.timeout_ms.unwrap_or(0);
        let backoff_ms = c.backoff_max_ms.unwrap_or(0);
        let ms = attempts.saturating_mul(timeout_ms.saturating_add(backoff_ms));
        let label = format!(
            "client retries: {attempts} attempts x ({} ms timeout + {} ms max backoff)",
            timeout_ms, backoff_ms
        );
        out.push((label, ms.div_ceil(1000)));
    }
    let Some(q) = r.queue.as_ref().filter(|q| on(q.enabled)) else {
        return;
    };
    if let Some(b) = r.backlog.as_ref().filter(|b| on(b.enabled)) {
        out.push((
            "backlog recovery".to_string(),
            b.recovery_max_s.unwrap_or(0),
        ));
    }
    let visibility_s = q.visibility_timeout_s.unwrap_or(0);
    let receives = u64::from(q.max_receives.unwrap_or(1));
    let redelivery_s = visibility_s.saturating_mul(receives);
    let redelivery = format!("{receives} receives x {visibility_s} s visibility timeout");
    out.push((format!("queue redelivery: {redelivery}"), redelivery_s));
    let Some(d) = r.dlq.as_ref().filter(|d| on(d.enabled)) else {
        return;
    };
    let retention_s = d.retention_s.unwrap_or(0);
    let (label, wait_s) = match d.redrive {
        Some(Redrive::Manual) => (
            format!(
                "DLQ redrive: manual, any time within DLQ retention ({})",
                format_duration(retention_s)
            ),
            retention_s,
        ),
        Some(Redrive::Automatic) => {
            let after_s = d.redrive_after_s.unwrap_or(0).min(retention_s);
            ("DLQ redrive: automatic".to_string(), after_s)
        }
        Some(Redrive::Never) | None => return,
    };
    out.push((label, wait_s));
    out.push((
        format!("redriven message redelivery: {redelivery}"),
        redelivery_s,
    ));
}

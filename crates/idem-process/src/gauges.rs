//! The store sampler behind the gauges of `/metrics`: every
//! `gauge_sample_interval_s` (default [`GAUGE_SAMPLE_INTERVAL_S_DEFAULT`])
//! it lists the ambiguous records, reads the failed lookups of each, and
//! reads the suspect window, and keeps what it found in the process's
//! [`Metrics`] (idem-http's `gauges` module renders it).
//!
//! Every read is bounded: the listing asks only for `state = ambiguous`
//! (a partial index on SQLite and PostgreSQL, a sparse index on
//! DynamoDB: no scan of every record), in pages of
//! [`GAUGE_SCAN_PAGE`], at most [`GAUGE_SCAN_RECORDS_MAX`] records; the
//! failed lookups are read for at most [`GAUGE_TRIES_READS_MAX`] of them;
//! the whole sample must finish within [`GAUGE_SAMPLE_TIMEOUT_S`]. A sample
//! cut by a cap says so (`idem_ambiguous_scan_truncated`); one that fails
//! or times out keeps the previous values and says so
//! (`idem_gauge_sample_failed`).

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Clock, ListQuery, Scope, State, Store, StoreError, SystemClock, Timestamp};
use idem_http::{AmbiguousGroup, GaugeSample, METRICS_CONTENT_TYPE, Metrics};
use tokio::sync::watch;

/// Default seconds between two samples of the store.
pub const GAUGE_SAMPLE_INTERVAL_S_DEFAULT: u64 = 15;
/// The longest interval between two samples that a config may set, in
/// seconds.
pub const GAUGE_SAMPLE_INTERVAL_S_MAX: u64 = 3600;
/// Records read per page of the ambiguous listing.
pub const GAUGE_SCAN_PAGE: usize = 1000;
/// Ambiguous records read per sample at most; past it the counts are lower
/// bounds and the oldest age is the oldest of those read.
pub const GAUGE_SCAN_RECORDS_MAX: usize = 10_000;
/// Records whose failed lookups are read per sample at most (one store
/// read each).
pub const GAUGE_TRIES_READS_MAX: usize = 1000;
/// How long one sample may take before it counts as failed, in seconds.
pub const GAUGE_SAMPLE_TIMEOUT_S: u64 = 10;

/// `GET /metrics` of `idem consume`'s probe listener:
/// [`Metrics::render_consumer`]. Like the probes it needs no token: it
/// says how many records are ambiguous and how old, never which.
pub fn consumer_metrics(metrics: Arc<Metrics>) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || async move {
            let content_type = [(http::header::CONTENT_TYPE, METRICS_CONTENT_TYPE)];
            (content_type, metrics.render_consumer())
        }),
    )
}

/// How the ambiguous records are grouped into labelled series.
#[derive(Clone, Debug)]
pub enum GaugeGroups {
    /// One unlabelled series for the whole store (a gateway).
    Whole,
    /// One series per subscription, labelled by its name, holding the
    /// records of its scope (`idem consume`). Records of a scope no
    /// subscription has are not counted.
    ByScope(Vec<(String, Scope)>),
}

/// Samples every `interval` until `stop` turns true (or its sender is
/// gone); the first sample is taken at once.
pub async fn run(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    groups: GaugeGroups,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        let timeout = Duration::from_secs(GAUGE_SAMPLE_TIMEOUT_S);
        let sampled = tokio::time::timeout(timeout, sample_once(&*store, &groups, &SystemClock));
        match sampled.await {
            Ok(Ok(sample)) => metrics.gauges().sampled(sample),
            Ok(Err(e)) => {
                metrics.gauges().sample_failed();
                tracing::warn!(error = %e, "the gauges' store sample failed; the gauges keep older values");
            }
            Err(_) => {
                metrics.gauges().sample_failed();
                tracing::warn!(
                    timeout_s = GAUGE_SAMPLE_TIMEOUT_S,
                    "the gauges' store sample timed out; the gauges keep older values"
                );
            }
        }
    }
}

/// One sample: the ambiguous records by group, and the suspect window.
pub async fn sample_once(
    store: &dyn Store,
    groups: &GaugeGroups,
    clock: &dyn Clock,
) -> Result<GaugeSample, StoreError> {
    let mut found = match groups {
        GaugeGroups::Whole => vec![Found::new(None)],
        GaugeGroups::ByScope(subs) => subs
            .iter()
            .map(|(name, _)| Found::new(Some(name.clone())))
            .collect(),
    };
    let mut query = ListQuery {
        state: Some(State::Ambiguous),
        after: None,
        limit: GAUGE_SCAN_PAGE,
    };
    let (mut read, mut tries_read) = (0usize, 0usize);
    let mut truncated = false;
    let now = clock.now();
    loop {
        let page = store.list(&query).await?;
        for record in &page.records {
            read += 1;
            let Some(group) = group_of(groups, &record.id.scope) else {
                continue;
            };
            let failing = if tries_read < GAUGE_TRIES_READS_MAX {
                tries_read += 1;
                store
                    .lookup_tries(&record.id, record.token)
                    .await?
                    .is_some()
            } else {
                truncated = true;
                false
            };
            found[group].add(record.created_at, failing);
        }
        match page.next {
            Some(next) if read < GAUGE_SCAN_RECORDS_MAX => query.after = Some(next),
            Some(_) => {
                truncated = true;
                break;
            }
            None => break,
        }
    }
    let window = store.suspect_window().await?;
    let window_open = window.as_ref().is_some_and(|w| w.is_open(now));
    let window_remaining_s = window
        .as_ref()
        .filter(|_| window_open)
        .map_or(0.0, |w| seconds_between(now, w.until));
    Ok(GaugeSample {
        groups: found.into_iter().map(|f| f.group(now)).collect(),
        truncated,
        window_open,
        window_remaining_s,
        taken_at_s: now.as_millis() as f64 / 1000.0,
    })
}

/// What the scan found of one group so far.
struct Found {
    label: Option<String>,
    records: u64,
    oldest: Option<Timestamp>,
    lookups_failing: u64,
}

impl Found {
    fn new(label: Option<String>) -> Found {
        Found {
            label,
            records: 0,
            oldest: None,
            lookups_failing: 0,
        }
    }

    fn add(&mut self, created_at: Timestamp, failing: bool) {
        self.records += 1;
        self.lookups_failing += u64::from(failing);
        self.oldest = Some(self.oldest.map_or(created_at, |o| o.min(created_at)));
    }

    fn group(self, now: Timestamp) -> AmbiguousGroup {
        AmbiguousGroup {
            label: self.label,
            records: self.records,
            oldest_age_s: self.oldest.map_or(0.0, |o| seconds_between(o, now)),
            lookups_failing: self.lookups_failing,
        }
    }
}

/// The group a record of `scope` counts in.
fn group_of(groups: &GaugeGroups, scope: &Scope) -> Option<usize> {
    match groups {
        GaugeGroups::Whole => Some(0),
        GaugeGroups::ByScope(subs) => subs.iter().position(|(_, s)| s == scope),
    }
}

/// Seconds from `from` to `to`, 0 when `to` is not later.
fn seconds_between(from: Timestamp, to: Timestamp) -> f64 {
    to.as_millis().saturating_sub(from.as_millis()) as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{
        Claim, ClaimRequest, Fingerprint, IdempotencyKey, LeaseExpiry, ManualClock, MemoryStore,
        Policy, RecordId,
    };

    async fn ambiguous(store: &MemoryStore, scope: &Scope, key: &str, clock: &ManualClock) {
        let policy = Policy::new(1_000, 60, 120, LeaseExpiry::Reconcile).unwrap();
        let req = ClaimRequest {
            id: RecordId {
                scope: scope.clone(),
                key: IdempotencyKey::parse(key).unwrap(),
            },
            fingerprint: Fingerprint::from_bytes([1; 32]),
            legacy_fingerprint: None,
            owner: "test".into(),
            region: None,
            policy,
        };
        let Claim::Acquired { token, .. } = store.claim(&req).await.unwrap() else {
            panic!("not acquired");
        };
        store.mark_ambiguous(&req.id, token).await.unwrap();
        clock.advance_millis(1);
    }

    #[tokio::test]
    async fn counts_ambiguous_records_by_subscription_with_the_oldest_age() {
        let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
        let store = MemoryStore::new(Arc::new(clock.clone()));
        let payouts = Scope::from_parts("payouts", "-", None).unwrap();
        let refunds = Scope::from_parts("refunds", "-", None).unwrap();
        ambiguous(&store, &payouts, "a", &clock).await;
        clock.advance_millis(4_000);
        ambiguous(&store, &payouts, "b", &clock).await;
        ambiguous(&store, &refunds, "c", &clock).await;
        clock.advance_millis(10_000);
        let groups = GaugeGroups::ByScope(vec![
            ("payouts".into(), payouts),
            ("refunds".into(), refunds),
            ("idle".into(), Scope::from_parts("idle", "-", None).unwrap()),
        ]);
        let sample = sample_once(&store, &groups, &clock).await.unwrap();
        let got: Vec<(Option<&str>, u64, f64)> = sample
            .groups
            .iter()
            .map(|g| (g.label.as_deref(), g.records, g.oldest_age_s))
            .collect();
        assert_eq!(
            got,
            [
                (Some("payouts"), 2, 14.003),
                (Some("refunds"), 1, 10.001),
                (Some("idle"), 0, 0.0)
            ]
        );
        let whole = sample_once(&store, &GaugeGroups::Whole, &clock)
            .await
            .unwrap();
        assert_eq!(whole.groups[0].records, 3);
        assert!(!whole.truncated && !whole.window_open);
    }
}

//! Counters and histograms for every decision the contract makes, shared as
//! one `Arc<Metrics>` by the layer, the gateway's admin API, the purge task
//! and the reconciler, and rendered in the Prometheus text format (0.0.4).
//!
//! Lock-free: every series is an `AtomicU64` in a fixed array, so recording
//! on the request path is a handful of relaxed atomic adds and never blocks.
//! The label sets are closed enums, so the series are known up front and
//! rendered even at zero (an alert on `rate(…) > 0` needs the series to exist).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::{Claim, Completion, Outcome, PurgeReport};

use crate::gauges::Gauges;
use crate::problem::ProblemKind;

/// Upper bounds of the latency histograms' buckets, in seconds.
pub const LATENCY_BUCKETS_S: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every counter and histogram of one process. Cheap to record into from
/// many threads at once; see docs/operations.md for what each one means.
#[derive(Debug, Default)]
pub struct Metrics {
    claims: [AtomicU64; ClaimDecision::ALL.len()],
    problems: [AtomicU64; ProblemKind::ALL.len()],
    completions: [AtomicU64; COMPLETIONS.len()],
    marked_ambiguous: AtomicU64,
    late_replays: AtomicU64,
    fenced_writes: AtomicU64,
    store_errors: AtomicU64,
    resolutions: [[AtomicU64; 2]; Resolver::ALL.len()],
    purged: [AtomicU64; 2],
    store_seconds: [Histogram; StoreOp::ALL.len()],
    upstream_seconds: Histogram,
    waits: [AtomicU64; WaitOutcome::ALL.len()],
    window_claims: [AtomicU64; WindowOutcome::ALL.len()],
    gauges: Gauges,
}

/// What became of a fresh claim inside a suspect window, as counted in
/// `idem_window_claims_total{outcome}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WindowOutcome {
    /// The provider had the effect: its answer was stored and replayed.
    Executed,
    /// The provider had no effect: forwarded.
    NotExecuted,
    /// "Not found" while a forgotten attempt might still run: 503.
    NotYet,
    /// The lookup gave no answer: 503, nothing forwarded.
    LookupFailed,
    /// The route has no lookup: forwarded unverified.
    Unverified,
}

impl WindowOutcome {
    /// Every outcome, in the order they are rendered.
    pub const ALL: [WindowOutcome; 5] = [
        WindowOutcome::Executed,
        WindowOutcome::NotExecuted,
        WindowOutcome::NotYet,
        WindowOutcome::LookupFailed,
        WindowOutcome::Unverified,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WindowOutcome::Executed => "executed",
            WindowOutcome::NotExecuted => "not_executed",
            WindowOutcome::NotYet => "not_yet",
            WindowOutcome::LookupFailed => "lookup_failed",
            WindowOutcome::Unverified => "unverified",
        }
    }
}

/// How a request that asked to wait for the original attempt ended, as
/// counted in `idem_waits_total{outcome}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitOutcome {
    /// The store's answer changed while it waited (a replay, an
    /// acquisition after a release, an unknown outcome).
    Answered,
    /// The wait ended with the key still in flight: 409.
    TimedOut,
    /// Over the waiter limits: answered at once without waiting.
    Refused,
    /// The store failed while it waited.
    StoreFailed,
}

impl WaitOutcome {
    /// Every outcome, in the order they are rendered.
    pub const ALL: [WaitOutcome; 4] = [
        WaitOutcome::Answered,
        WaitOutcome::TimedOut,
        WaitOutcome::Refused,
        WaitOutcome::StoreFailed,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitOutcome::Answered => "answered",
            WaitOutcome::TimedOut => "timed_out",
            WaitOutcome::Refused => "refused",
            WaitOutcome::StoreFailed => "store_failed",
        }
    }
}

/// The claim decision, as counted in `idem_claims_total{decision}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClaimDecision {
    /// A new acquisition: the request goes to the upstream.
    Acquired,
    /// The stored result was replayed.
    Replay,
    /// Same key, different request: 422 `key-reused`.
    Mismatch,
    /// Another attempt holds the lease: 409 `request-in-progress`.
    InFlight,
    /// The outcome of an earlier attempt is unknown: 409 `outcome-unknown`.
    OutcomeUnknown,
    /// A late replay after retention: 422 `key-expired`.
    Expired,
    /// An expired lease was taken over (policy `takeover`).
    TakenOver,
}

/// Who resolved an ambiguous record, as counted in
/// `idem_resolutions_total{by}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resolver {
    /// A person, through the admin API or `idem records resolve`.
    Operator,
    /// The reconciler, asking the provider.
    Reconciler,
}

/// A timed store operation, as in `idem_store_seconds{op}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// `Store::claim`.
    Claim,
    /// `Store::complete`.
    Complete,
    /// `Store::release`.
    Release,
    /// `Store::mark_ambiguous`.
    MarkAmbiguous,
}

/// A latency histogram with the fixed [`LATENCY_BUCKETS_S`]. Each slot
/// counts the observations of its own bucket (the last one is `+Inf`);
/// rendering makes them cumulative.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_S.len() + 1],
    count: AtomicU64,
    sum_us: AtomicU64,
}

/// `idem_completions_total{outcome}` label values, indexed like [`Completion`].
const COMPLETIONS: [(Completion, &str); 3] = [
    (Completion::Final, "final"),
    (Completion::Release, "released"),
    (Completion::Unknown, "ambiguous"),
];

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Counts one claim decision. An `Expired` claim is also a late replay;
    /// an `OutcomeUnknown` claim that found the expired lease also counts as
    /// a record marked ambiguous.
    pub fn claim(&self, claim: &Claim) {
        let Some(decision) = ClaimDecision::of(claim) else {
            return;
        };
        bump(&self.claims[decision as usize]);
        match claim {
            Claim::Expired { .. } => bump(&self.late_replays),
            Claim::OutcomeUnknown { newly_marked: true } => bump(&self.marked_ambiguous),
            _ => {}
        }
    }

    /// Counts one problem response.
    pub fn problem(&self, kind: ProblemKind) {
        if let Some(i) = ProblemKind::ALL.iter().position(|k| *k == kind) {
            bump(&self.problems[i]);
        }
    }

    /// Counts one attempt whose record was settled: stored as final,
    /// released, or marked ambiguous (which also counts in
    /// `idem_marked_ambiguous_total`).
    pub fn completion(&self, completion: Completion) {
        if let Some(i) = COMPLETIONS.iter().position(|(c, _)| *c == completion) {
            bump(&self.completions[i]);
        }
        if completion == Completion::Unknown {
            bump(&self.marked_ambiguous);
        }
    }

    /// Counts a complete, release or mark-ambiguous refused with
    /// `StoreError::Fenced`: a newer attempt owns the record.
    pub fn fenced_write(&self) {
        bump(&self.fenced_writes);
    }

    /// Counts a store operation that failed for any reason but fencing.
    pub fn store_error(&self) {
        bump(&self.store_errors);
    }

    /// Counts one resolution of an ambiguous record.
    pub fn resolution(&self, by: Resolver, outcome: &Outcome) {
        self.resolved(by, matches!(outcome, Outcome::Completed { .. }));
    }

    /// Counts one resolution by its kind: completed, or not executed.
    pub fn resolved(&self, by: Resolver, completed: bool) {
        let column = if completed { 0 } else { 1 };
        bump(&self.resolutions[by as usize][column]);
    }

    /// Counts what one purge call did.
    pub fn purged(&self, report: &PurgeReport) {
        self.purged[0].fetch_add(report.tombstoned, Ordering::Relaxed);
        self.purged[1].fetch_add(report.deleted, Ordering::Relaxed);
    }

    /// Counts one request that asked to wait for the original attempt.
    pub fn wait(&self, outcome: WaitOutcome) {
        bump(&self.waits[outcome as usize]);
    }

    /// The current value of `idem_waits_total{outcome}`.
    pub fn waits(&self, outcome: WaitOutcome) -> u64 {
        self.waits[outcome as usize].load(Ordering::Relaxed)
    }

    /// Counts one fresh claim inside a suspect window.
    pub fn window_claim(&self, outcome: WindowOutcome) {
        bump(&self.window_claims[outcome as usize]);
    }

    /// The current value of `idem_window_claims_total{outcome}`.
    pub fn window_claims(&self, outcome: WindowOutcome) -> u64 {
        self.window_claims[outcome as usize].load(Ordering::Relaxed)
    }

    /// Records how long one store operation took.
    pub fn observe_store(&self, op: StoreOp, elapsed: Duration) {
        self.store_seconds[op as usize].observe(elapsed);
    }

    /// Records how long the upstream (the inner service) took to answer.
    pub fn observe_upstream(&self, elapsed: Duration) {
        self.upstream_seconds.observe(elapsed);
    }

    /// The current value of `idem_claims_total{decision}`.
    pub fn claims(&self, decision: ClaimDecision) -> u64 {
        self.claims[decision as usize].load(Ordering::Relaxed)
    }

    /// `idem_claims_total` summed over every decision.
    pub fn claims_total(&self) -> u64 {
        sum(&self.claims)
    }

    /// `idem_problems_total` summed over every type.
    pub fn problems_total(&self) -> u64 {
        sum(&self.problems)
    }

    /// `idem_completions_total` summed over every outcome.
    pub fn completions_total(&self) -> u64 {
        sum(&self.completions)
    }

    /// The current value of `idem_fenced_writes_total`.
    pub fn fenced_writes(&self) -> u64 {
        self.fenced_writes.load(Ordering::Relaxed)
    }

    /// The current value of `idem_late_replays_total`.
    pub fn late_replays(&self) -> u64 {
        self.late_replays.load(Ordering::Relaxed)
    }

    /// Everything, in the Prometheus text exposition format 0.0.4
    /// (serve it with [`METRICS_CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        self.render_decisions(&mut out);
        self.render_singles(&mut out);
        self.render_waits(&mut out);
        self.render_resolutions(&mut out);
        self.render_purge_and_times(&mut out);
        self.gauges.render(&mut out);
        out
    }

    /// What `idem consume` serves: the gauges, the purge's counters and
    /// the store errors; none of the HTTP layer's families, which a
    /// consumer never counts into.
    pub fn render_consumer(&self) -> String {
        let mut out = String::with_capacity(4 * 1024);
        self.gauges.render(&mut out);
        let purged = [
            ("tombstoned", load(&self.purged[0])),
            ("deleted", load(&self.purged[1])),
        ];
        labelled(
            &mut out,
            "idem_purged_total",
            "Records the purge changed: results dropped (tombstoned) or tombstones deleted.",
            "what",
            &purged,
        );
        let name = "idem_store_errors_total";
        family(
            &mut out,
            name,
            "Store operations that failed (unavailable, incompatible, over a limit).",
            "counter",
        );
        let _ = writeln!(out, "{name} {}", load(&self.store_errors));
        out
    }

    /// The gauges: what the store sampler last found, and the waiters.
    pub fn gauges(&self) -> &Gauges {
        &self.gauges
    }

    /// Claims, problems and completions, each by its label.
    fn render_decisions(&self, out: &mut String) {
        let claims = ClaimDecision::ALL.map(|d| (d.as_str(), self.claims(d)));
        labelled(
            out,
            "idem_claims_total",
            "Claim decisions, by decision.",
            "decision",
            &claims,
        );
        let problems: Vec<(&str, u64)> = ProblemKind::ALL
            .iter()
            .zip(&self.problems)
            .map(|(k, n)| (k.slug(), load(n)))
            .collect();
        labelled(
            out,
            "idem_problems_total",
            "Problem responses (RFC 9457) answered, by type (the slug after urn:idem:problem:).",
            "type",
            &problems,
        );
        let completions: Vec<(&str, u64)> = COMPLETIONS
            .iter()
            .zip(&self.completions)
            .map(|((_, name), n)| (*name, load(n)))
            .collect();
        labelled(
            out,
            "idem_completions_total",
            "Attempts whose record was settled after the upstream answered, by outcome.",
            "outcome",
            &completions,
        );
    }

    /// The counters without a label.
    fn render_singles(&self, out: &mut String) {
        let singles = [
            (
                "idem_marked_ambiguous_total",
                "Records this process moved to ambiguous (unknown upstream outcome or expired lease).",
                &self.marked_ambiguous,
            ),
            (
                "idem_late_replays_total",
                "Requests refused because their key is past retention (tombstone).",
                &self.late_replays,
            ),
            (
                "idem_fenced_writes_total",
                "Completions, releases and ambiguous marks refused because a newer attempt owns the record.",
                &self.fenced_writes,
            ),
            (
                "idem_store_errors_total",
                "Store operations that failed (unavailable, incompatible, over a limit).",
                &self.store_errors,
            ),
        ];
        for (name, help, value) in singles {
            family(out, name, help, "counter");
            let _ = writeln!(out, "{name} {}", load(value));
        }
    }

    /// Waits for another attempt, and fresh claims inside a suspect window.
    fn render_waits(&self, out: &mut String) {
        let waits = WaitOutcome::ALL.map(|o| (o.as_str(), self.waits(o)));
        labelled(
            out,
            "idem_waits_total",
            "Requests that waited for the original attempt of their key, by how the wait ended.",
            "outcome",
            &waits,
        );
        let window = WindowOutcome::ALL.map(|o| (o.as_str(), self.window_claims(o)));
        labelled(
            out,
            "idem_window_claims_total",
            "Fresh claims inside a suspect window (the store may have lost records), by what \
             the provider's lookup said; unverified: the route has no lookup.",
            "outcome",
            &window,
        );
    }

    /// The purge's changes, and the store's and the upstream's time histograms.
    fn render_purge_and_times(&self, out: &mut String) {
        let purged = [
            ("tombstoned", load(&self.purged[0])),
            ("deleted", load(&self.purged[1])),
        ];
        labelled(
            out,
            "idem_purged_total",
            "Records the purge changed: results dropped (tombstoned) or tombstones deleted.",
            "what",
            &purged,
        );
        family(
            out,
            "idem_store_seconds",
            "Time spent in store operations, by operation.",
            "histogram",
        );
        for op in StoreOp::ALL {
            let label = format!("op=\"{}\"", op.as_str());
            self.store_seconds[op as usize].render(out, "idem_store_seconds", &label);
        }
        family(
            out,
            "idem_upstream_seconds",
            "Time the upstream took to answer an acquired request.",
            "histogram",
        );
        self.upstream_seconds
            .render(out, "idem_upstream_seconds", "");
    }

    fn render_resolutions(&self, out: &mut String) {
        let name = "idem_resolutions_total";
        family(
            out,
            name,
            "Ambiguous records resolved, by resolver and outcome.",
            "counter",
        );
        for by in Resolver::ALL {
            for (column, outcome) in ["completed", "not_executed"].iter().enumerate() {
                let value = load(&self.resolutions[by as usize][column]);
                let by = by.as_str();
                let _ = writeln!(out, "{name}{{by=\"{by}\",outcome=\"{outcome}\"}} {value}");
            }
        }
    }
}

impl ClaimDecision {
    /// Every decision, in rendering order.
    pub const ALL: [ClaimDecision; 7] = [
        ClaimDecision::Acquired,
        ClaimDecision::Replay,
        ClaimDecision::Mismatch,
        ClaimDecision::InFlight,
        ClaimDecision::OutcomeUnknown,
        ClaimDecision::Expired,
        ClaimDecision::TakenOver,
    ];

    /// The decision a claim answer stands for; `None` for a kind of claim
    /// this version does not know.
    pub fn of(claim: &Claim) -> Option<ClaimDecision> {
        Some(match claim {
            Claim::Acquired {
                took_over: Some(_), ..
            } => ClaimDecision::TakenOver,
            Claim::Acquired { .. } => ClaimDecision::Acquired,
            Claim::Replay { .. } => ClaimDecision::Replay,
            Claim::Mismatch { .. } => ClaimDecision::Mismatch,
            Claim::InFlight { .. } => ClaimDecision::InFlight,
            Claim::OutcomeUnknown { .. } => ClaimDecision::OutcomeUnknown,
            Claim::Expired { .. } => ClaimDecision::Expired,
            _ => return None,
        })
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimDecision::Acquired => "acquired",
            ClaimDecision::Replay => "replay",
            ClaimDecision::Mismatch => "mismatch",
            ClaimDecision::InFlight => "in_flight",
            ClaimDecision::OutcomeUnknown => "outcome_unknown",
            ClaimDecision::Expired => "expired",
            ClaimDecision::TakenOver => "taken_over",
        }
    }
}

impl Resolver {
    /// Both resolvers, in rendering order.
    pub const ALL: [Resolver; 2] = [Resolver::Operator, Resolver::Reconciler];

    /// The resolver named by a resolution's `by` text: `reconciler…` is the
    /// reconciler, anything else a person.
    pub fn of_actor(by: &str) -> Resolver {
        if by.starts_with("reconciler") {
            Resolver::Reconciler
        } else {
            Resolver::Operator
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolver::Operator => "operator",
            Resolver::Reconciler => "reconciler",
        }
    }
}

impl StoreOp {
    /// Every timed operation, in rendering order.
    pub const ALL: [StoreOp; 4] = [
        StoreOp::Claim,
        StoreOp::Complete,
        StoreOp::Release,
        StoreOp::MarkAmbiguous,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::Claim => "claim",
            StoreOp::Complete => "complete",
            StoreOp::Release => "release",
            StoreOp::MarkAmbiguous => "mark_ambiguous",
        }
    }
}

impl Histogram {
    fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let slot = LATENCY_BUCKETS_S
            .iter()
            .position(|le| seconds <= *le)
            .unwrap_or(LATENCY_BUCKETS_S.len());
        bump(&self.buckets[slot]);
        bump(&self.count);
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// `name_bucket`, `name_sum`, `name_count` with `labels` (`k="v"` pairs,
    /// possibly empty) in front of `le`.
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, slot) in self.buckets.iter().enumerate() {
            cumulative += load(slot);
            let le = LATENCY_BUCKETS_S
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |le| le.to_string());
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let braces = |text: &str| {
            if text.is_empty() {
                String::new()
            } else {
                format!("{{{text}}}")
            }
        };
        let sum_s = load(&self.sum_us) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{} {sum_s}", braces(labels));
        // The count is the sum of the buckets, read once above; reading
        // `count` again could disagree with `+Inf` under concurrent writes.
        let _ = writeln!(out, "{name}_count{} {cumulative}", braces(labels));
    }
}

/// The counters of one labelled family, added up.
fn sum(counters: &[AtomicU64]) -> u64 {
    counters
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .fold(0, u64::saturating_add)
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A counter family with one label. The label values are fixed identifiers
/// from this file (no quotes, backslashes or newlines), so they need no
/// escaping.
fn labelled(out: &mut String, name: &str, help: &str, label: &str, values: &[(&str, u64)]) {
    family(out, name, help, "counter");
    for (value, n) in values {
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{StoredResult, Timestamp, Token};

    /// The value of one series line, e.g. `idem_claims_total{decision="replay"}`.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn counts_each_claim_decision_under_its_label() {
        let m = Metrics::new();
        let acquired = |took_over| Claim::Acquired {
            token: Token(1),
            lease_until: Timestamp::from_millis(0),
            lease_ms: 0,
            took_over,
        };
        let cases = [
            (acquired(None), "acquired"),
            (acquired(Some(Token(1))), "taken_over"),
            (
                Claim::Mismatch {
                    stored: idem_core::Fingerprint::from_bytes([0; 32]),
                },
                "mismatch",
            ),
            (
                Claim::InFlight {
                    lease_until: Timestamp::from_millis(0),
                    retry_after_ms: 5,
                },
                "in_flight",
            ),
            (
                Claim::OutcomeUnknown { newly_marked: true },
                "outcome_unknown",
            ),
            (
                Claim::Expired {
                    completed_at: None,
                    tombstone_until: None,
                },
                "expired",
            ),
        ];
        for (claim, label) in &cases {
            m.claim(claim);
            let text = m.render();
            let series = format!("idem_claims_total{{decision=\"{label}\"}}");
            assert_eq!(value(&text, &series), Some(1.0), "{label}");
        }
        let text = m.render();
        assert_eq!(
            value(&text, "idem_claims_total{decision=\"replay\"}"),
            Some(0.0)
        );
        assert_eq!(value(&text, "idem_late_replays_total"), Some(1.0));
        assert_eq!(value(&text, "idem_marked_ambiguous_total"), Some(1.0));
    }

    #[test]
    fn the_totals_are_the_sums_of_the_rendered_families() {
        let m = Metrics::new();
        for claim in [
            Claim::OutcomeUnknown {
                newly_marked: false,
            },
            Claim::OutcomeUnknown { newly_marked: true },
        ] {
            m.claim(&claim);
        }
        for kind in [
            ProblemKind::KeyExpired,
            ProblemKind::KeyReused,
            ProblemKind::KeyExpired,
        ] {
            m.problem(kind);
        }
        // Distinct counts per family, so that no family's total can stand
        // for another's.
        for completion in [
            Completion::Final,
            Completion::Release,
            Completion::Unknown,
            Completion::Final,
        ] {
            m.completion(completion);
        }
        let text = m.render();
        let family = |name: &str| -> u64 {
            text.lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
                .sum()
        };
        assert_eq!((m.claims_total(), family("idem_claims_total")), (2, 2));
        assert_eq!((m.problems_total(), family("idem_problems_total")), (3, 3));
        assert_eq!(
            (m.completions_total(), family("idem_completions_total")),
            (4, 4)
        );
    }

    #[test]
    fn renders_every_family_with_help_and_type() {
        let m = Metrics::new();
        m.problem(ProblemKind::KeyExpired);
        m.completion(Completion::Unknown);
        m.completion(Completion::Final);
        m.fenced_write();
        m.store_error();
        let result = StoredResult::new(200, vec![], vec![]).unwrap();
        m.resolution(Resolver::Reconciler, &Outcome::Completed { result });
        m.resolution(Resolver::of_actor("operator:alice"), &Outcome::NotExecuted);
        m.purged(&PurgeReport {
            tombstoned: 3,
            deleted: 2,
            damaged: 0,
        });
        let text = m.render();
        let expect = [
            ("idem_problems_total{type=\"key-expired\"}", 1.0),
            ("idem_problems_total{type=\"key-reused\"}", 0.0),
            ("idem_completions_total{outcome=\"ambiguous\"}", 1.0),
            ("idem_completions_total{outcome=\"final\"}", 1.0),
            ("idem_completions_total{outcome=\"released\"}", 0.0),
            ("idem_marked_ambiguous_total", 1.0),
            ("idem_fenced_writes_total", 1.0),
            ("idem_store_errors_total", 1.0),
            (
                "idem_resolutions_total{by=\"reconciler\",outcome=\"completed\"}",
                1.0,
            ),
            (
                "idem_resolutions_total{by=\"operator\",outcome=\"not_executed\"}",
                1.0,
            ),
            (
                "idem_resolutions_total{by=\"operator\",outcome=\"completed\"}",
                0.0,
            ),
            ("idem_purged_total{what=\"tombstoned\"}", 3.0),
            ("idem_purged_total{what=\"deleted\"}", 2.0),
        ];
        for (series, want) in expect {
            assert_eq!(value(&text, series), Some(want), "{series}\n{text}");
        }
        let families = [
            ("idem_claims_total", "counter"),
            ("idem_problems_total", "counter"),
            ("idem_completions_total", "counter"),
            ("idem_marked_ambiguous_total", "counter"),
            ("idem_late_replays_total", "counter"),
            ("idem_fenced_writes_total", "counter"),
            ("idem_store_errors_total", "counter"),
            ("idem_resolutions_total", "counter"),
            ("idem_purged_total", "counter"),
            ("idem_store_seconds", "histogram"),
            ("idem_upstream_seconds", "histogram"),
        ];
        for (name, kind) in families {
            let help_then_type = format!("# HELP {name} ");
            let kind_line = format!("\n# TYPE {name} {kind}\n");
            assert!(text.contains(&help_then_type), "{name}");
            assert!(text.contains(&kind_line), "{name}");
        }
        // Every other line is `name{labels} number`.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, number) = line.rsplit_once(' ').unwrap();
            assert!(series.starts_with("idem_"), "{line}");
            assert!(number.parse::<f64>().is_ok(), "{line}");
        }
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_in_inf() {
        let m = Metrics::new();
        let cases = [
            Duration::from_micros(100), // first bucket
            Duration::from_micros(500), // exactly on a bound: le is inclusive
            Duration::from_millis(30),  // 0.05
            Duration::from_secs(60),    // +Inf
        ];
        for d in cases {
            m.observe_store(StoreOp::Claim, d);
        }
        m.observe_upstream(Duration::from_millis(2));
        let text = m.render();
        let expect = [
            ("idem_store_seconds_bucket{op=\"claim\",le=\"0.0005\"}", 2.0),
            ("idem_store_seconds_bucket{op=\"claim\",le=\"0.025\"}", 2.0),
            ("idem_store_seconds_bucket{op=\"claim\",le=\"0.05\"}", 3.0),
            ("idem_store_seconds_bucket{op=\"claim\",le=\"10\"}", 3.0),
            ("idem_store_seconds_bucket{op=\"claim\",le=\"+Inf\"}", 4.0),
            ("idem_store_seconds_count{op=\"claim\"}", 4.0),
            ("idem_store_seconds_sum{op=\"claim\"}", 60.0306),
            ("idem_store_seconds_count{op=\"release\"}", 0.0),
            ("idem_upstream_seconds_bucket{le=\"0.001\"}", 0.0),
            ("idem_upstream_seconds_bucket{le=\"0.0025\"}", 1.0),
            ("idem_upstream_seconds_count", 1.0),
        ];
        for (series, want) in expect {
            let got = value(&text, series).unwrap_or(f64::NAN);
            assert!((got - want).abs() < 1e-9, "{series}: {got} != {want}");
        }
    }
}

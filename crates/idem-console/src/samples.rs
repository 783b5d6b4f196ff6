//! The last hour of the gateway's counters for the overview's charts: one
//! sample of the `idem_http::Metrics` totals per minute, in a ring of
//! [`SAMPLES_MAX`], so a chart is the differences between samples.

use std::collections::VecDeque;
use std::sync::{Mutex, Weak};
use std::time::Duration;

use idem_http::Metrics;

/// Samples kept: one hour of minutes.
pub const SAMPLES_MAX: usize = 60;
/// Time between two samples.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(60);

/// Picks one family's total.
type Pick = fn(&Totals) -> u64;

/// Each chart: its name and its total.
const SERIES: [(&str, Pick); 4] = [
    ("Decisions", |t| t.decisions),
    ("Problems", |t| t.problems),
    ("Completions", |t| t.completions),
    ("Late replays", |t| t.late_replays),
];

/// The counter families the overview charts, as summed totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// `idem_claims_total`, every decision.
    pub decisions: u64,
    /// `idem_problems_total`, every type.
    pub problems: u64,
    /// `idem_completions_total`, every outcome.
    pub completions: u64,
    /// `idem_late_replays_total`.
    pub late_replays: u64,
}

/// One chart's worth: a name and the count per minute, oldest first, the
/// last one being the minute in progress.
pub(crate) struct Series {
    pub name: &'static str,
    pub per_minute: Vec<u64>,
}

/// The ring of samples.
#[derive(Default)]
pub(crate) struct Samples {
    ring: Mutex<VecDeque<Totals>>,
}

impl Totals {
    /// The totals `metrics` holds now.
    pub(crate) fn of(metrics: &Metrics) -> Totals {
        Totals {
            decisions: metrics.claims_total(),
            problems: metrics.problems_total(),
            completions: metrics.completions_total(),
            late_replays: metrics.late_replays(),
        }
    }
}

impl Samples {
    /// Keeps `totals` as the newest sample, dropping the oldest past
    /// [`SAMPLES_MAX`].
    pub(crate) fn push(&self, totals: Totals) {
        let mut ring = self.lock();
        if ring.len() == SAMPLES_MAX {
            ring.pop_front();
        }
        ring.push_back(totals);
    }

    /// Per-minute counts between the samples, then from the newest sample
    /// to `now` (the minute in progress): at most [`SAMPLES_MAX`] values.
    pub(crate) fn series(&self, now: Totals) -> [Series; 4] {
        let ring = self.lock();
        let points: Vec<Totals> = ring.iter().copied().chain([now]).collect();
        SERIES.map(|(name, pick)| Series {
            name,
            per_minute: points
                .windows(2)
                .map(|w| pick(&w[1]).saturating_sub(pick(&w[0])))
                .collect(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Totals>> {
        self.ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Samples `metrics` into `samples` every [`SAMPLE_INTERVAL`] until the
/// console that owns `samples` is dropped.
pub(crate) async fn run(samples: Weak<Samples>, metrics: Weak<Metrics>) {
    let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (Some(samples), Some(metrics)) = (samples.upgrade(), metrics.upgrade()) else {
            return;
        };
        samples.push(Totals::of(&metrics));
    }
}

#[cfg(test)]
mod tests {
    use idem_core::{Claim, Completion};
    use idem_http::ProblemKind;

    use super::*;

    #[test]
    fn totals_sum_every_label_of_a_family() {
        let metrics = Metrics::new();
        metrics.claim(&Claim::OutcomeUnknown {
            newly_marked: false,
        });
        metrics.claim(&Claim::OutcomeUnknown {
            newly_marked: false,
        });
        metrics.problem(ProblemKind::OutcomeUnknown);
        metrics.completion(Completion::Unknown);
        metrics.completion(Completion::Final);
        let want = Totals {
            decisions: 2,
            problems: 1,
            completions: 2,
            late_replays: 0,
        };
        assert_eq!(Totals::of(&metrics), want);
    }

    #[test]
    fn the_series_are_differences_and_the_ring_is_bounded() {
        let samples = Samples::default();
        let at = |n: u64| Totals {
            decisions: n,
            problems: 2 * n,
            completions: 0,
            late_replays: n / 10,
        };
        for minute in 0..100 {
            samples.push(at(minute * minute));
        }
        let series = samples.series(at(100 * 100));
        // 60 samples kept (minutes 40..=99) and the minute in progress.
        assert_eq!(series[0].per_minute.len(), SAMPLES_MAX);
        assert_eq!(series[0].per_minute[0], 41 * 41 - 40 * 40);
        assert_eq!(series[0].per_minute.last(), Some(&(100 * 100 - 99 * 99)));
        assert_eq!(series[1].per_minute[0], 2 * (41 * 41 - 40 * 40));
        assert!(series[2].per_minute.iter().all(|n| *n == 0));
    }
}

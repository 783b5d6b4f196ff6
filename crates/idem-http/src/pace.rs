//! How long a caller should wait before asking again about an attempt in
//! flight: derived from the attempt's age and the upstream's observed
//! latency on its route, not from the whole lease, which is a bound on the
//! worst case and would send every caller of a fast route away for it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The weight of the newest forward in the running mean of a route's
/// forward durations: 1/8, as TCP's smoothed round-trip time (RFC 6298),
/// so one slow call moves the estimate, a run of them replaces it.
pub const LATENCY_EWMA_WEIGHT: u64 = 8;

/// The shortest `Retry-After` advised, in seconds: HTTP counts in whole
/// seconds, and zero would invite a tight loop.
pub const RETRY_AFTER_S_MIN: u64 = 1;

/// A route's running mean of forward durations, in microseconds; 0 until
/// the first forward answers.
#[derive(Debug, Default)]
pub(crate) struct Latency {
    mean_us: AtomicU64,
}

impl Latency {
    /// Adds one forward that took `elapsed`.
    pub(crate) fn observe(&self, elapsed: Duration) {
        let sample = u64::try_from(elapsed.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        // `fetch_update` retries on a race; the closure never refuses.
        let _ = self
            .mean_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| {
                Some(match mean {
                    0 => sample,
                    mean => {
                        let weighted = mean.saturating_mul(LATENCY_EWMA_WEIGHT - 1);
                        weighted.saturating_add(sample) / LATENCY_EWMA_WEIGHT
                    }
                })
            });
    }

    /// The running mean, `None` before any forward answered.
    pub(crate) fn typical(&self) -> Option<Duration> {
        match self.mean_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }
}

/// When to ask again about an attempt that has run for `age` on a route
/// whose forwards typically take `typical`, with `lease_left` of its lease
/// to go: the time it should still need (`typical - age`), at least
/// [`RETRY_AFTER_S_MIN`] and at most `lease_left` (past the lease the
/// attempt has ended one way or another). Before any forward was observed,
/// or once the attempt is older than is typical, the estimate says
/// nothing: at least the minimum then, since an overdue attempt ends any
/// moment or at its lease's end.
pub fn retry_after(age: Duration, typical: Option<Duration>, lease_left: Duration) -> Duration {
    let floor = Duration::from_secs(RETRY_AFTER_S_MIN);
    let estimate = match typical {
        Some(typical) => typical.saturating_sub(age),
        None => lease_left,
    };
    estimate.min(lease_left).max(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn retry_after_is_the_time_still_needed_within_one_second_and_the_lease() {
        let cases = [
            // (age, typical, left) → advised
            ((ms(10), Some(ms(40)), ms(29_990)), ms(1_000)),
            ((ms(100), Some(ms(5_000)), ms(29_900)), ms(4_900)),
            ((ms(100), Some(ms(60_000)), ms(29_900)), ms(29_900)),
            ((ms(9_000), Some(ms(5_000)), ms(21_000)), ms(1_000)),
            ((ms(0), None, ms(30_000)), ms(30_000)),
            ((ms(29_800), None, ms(200)), ms(1_000)),
            ((ms(1_000), Some(ms(3_500)), ms(1_500)), ms(1_500)),
        ];
        for ((age, typical, left), want) in cases {
            assert_eq!(
                retry_after(age, typical, left),
                want,
                "age {age:?}, typical {typical:?}, left {left:?}"
            );
        }
    }

    #[test]
    fn the_running_mean_starts_at_the_first_sample_and_moves_by_an_eighth() {
        let latency = Latency::default();
        assert_eq!(latency.typical(), None);
        latency.observe(ms(80));
        assert_eq!(latency.typical(), Some(ms(80)));
        latency.observe(ms(160));
        assert_eq!(latency.typical(), Some(ms(90)));
        latency.observe(Duration::ZERO);
        assert!(latency.typical().is_some(), "a zero sample keeps a mean");
    }
}

//! Exponential backoff with full jitter, drawn from a small seedable RNG, so
//! that lookups of many failed records spread out instead of arriving at the
//! provider together, and a run can be replayed from its seed.

/// Backoff ceilings: `base_ms` after the first failure, doubling per
/// failure, never above `max_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) base_ms: u64,
    pub(crate) max_ms: u64,
}

/// SplitMix64: one `u64` of state, good enough to spread retries; not for secrets.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(u64);

impl Backoff {
    /// The ceiling after `failures` failures (at least 1).
    pub(crate) fn ceiling_ms(self, failures: u32) -> u64 {
        let doublings = failures.saturating_sub(1).min(63);
        self.base_ms
            .saturating_mul(1u64 << doublings)
            .min(self.max_ms)
    }

    /// The delay after `failures` failures: uniform in `1..=ceiling` ms
    /// ("full jitter"; never 0, so a failed record is never due again at the
    /// instant it failed).
    pub(crate) fn delay_ms(self, failures: u32, rng: &mut SplitMix64) -> u64 {
        1 + rng.below(self.ceiling_ms(failures).max(1))
    }
}

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by multiply-shift; the bias is below 2^-32
    /// for every n a backoff uses.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        let wide = u128::from(self.next_u64()) * u128::from(n);
        u64::try_from(wide >> 64).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_up_to_the_maximum() {
        let b = Backoff {
            base_ms: 1_000,
            max_ms: 60_000,
        };
        let cases = [
            (0, 1_000),
            (1, 1_000),
            (2, 2_000),
            (3, 4_000),
            (6, 32_000),
            (7, 60_000),
            (64, 60_000),
            (u32::MAX, 60_000),
        ];
        for (failures, want) in cases {
            assert_eq!(b.ceiling_ms(failures), want, "after {failures} failures");
        }
    }

    #[test]
    fn delays_stay_within_bounds_and_spread() {
        let b = Backoff {
            base_ms: 100,
            max_ms: 1_000,
        };
        let mut rng = SplitMix64::new(42);
        for failures in 1..=10 {
            let ceiling = b.ceiling_ms(failures);
            let delays: Vec<u64> = (0..2_000).map(|_| b.delay_ms(failures, &mut rng)).collect();
            assert!(
                delays.iter().all(|d| (1..=ceiling).contains(d)),
                "{failures}"
            );
            // Full jitter: both halves of the range are used.
            assert!(delays.iter().any(|d| *d <= ceiling / 4), "{failures}");
            assert!(delays.iter().any(|d| *d > ceiling * 3 / 4), "{failures}");
        }
        let one = Backoff {
            base_ms: 1,
            max_ms: 1,
        };
        assert_eq!(one.delay_ms(5, &mut rng), 1);
    }

    #[test]
    fn the_seed_replays_the_sequence() {
        let draw = |seed| {
            let mut rng = SplitMix64::new(seed);
            (0..8).map(|_| rng.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }
}

//! How much of a granted lease is left for the effect, and whether that is
//! enough to start it: the one rule behind I8 (docs/contract.md: "a forward never
//! outlives the lease the store granted it"), called by the tower layer,
//! the consumer's run-once, and the model checker.
//!
//! The claimant cannot read the store's clock, so it compares durations,
//! never instants: it notes its own monotonic time just *before* it sends
//! the claim (the store's decision happened after that), and the store says
//! how long it leased ([`Claim::Acquired`](crate::Claim::Acquired)'s
//! `lease_ms`, `lease_until` less the store's clock at the decision). The
//! lease therefore ends no earlier than `sent_at + lease_ms` in the
//! claimant's time, however long the answer took to come back; the effect
//! must be over by then, less a margin. A timeout started only when the
//! answer arrived would let a late acknowledgement push the effect past the
//! lease, where a retry or the reconciler may already have judged it.

/// The most time kept back at the end of a lease, in milliseconds.
pub const LEASE_MARGIN_MS_MAX: u64 = 1_000;

/// The least time left on a lease with which an effect is started, in
/// milliseconds. With less, the attempt is released unsent and refused:
/// an effect started with a few milliseconds left would almost surely be
/// cut at the deadline and leave an unknown outcome behind.
pub const FORWARD_MS_MIN: u64 = 50;

/// How often, at most, a claimant waiting for another attempt's outcome
/// asks the claim again when nothing told it the record changed, in
/// milliseconds: the gateway's waiters (one per key) and `idem consume`'s
/// deliveries both poll at this pace.
pub const WAIT_POLL_MS: u64 = 250;

/// What a claimant that acquired a lease may still do with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseLeft {
    /// Start the effect and give it at most `forward_ms` from now (less,
    /// if its own timeout is shorter); past that its outcome is unknown.
    Forward {
        /// Milliseconds from now until the effect's deadline.
        forward_ms: u64,
    },
    /// Too little is left ([`FORWARD_MS_MIN`]): do not start the effect;
    /// release the record with the token (nothing was sent) and refuse.
    TooLittle {
        /// Milliseconds that were left before the deadline (maybe 0).
        left_ms: u64,
    },
}

/// The time kept back at the end of a lease of `lease_ms`: a tenth of it,
/// at most [`LEASE_MARGIN_MS_MAX`]. It covers recording the outcome before
/// the lease ends and the drift between the store's clock and the
/// claimant's.
pub const fn margin_ms(lease_ms: u64) -> u64 {
    let tenth = lease_ms / 10;
    if tenth < LEASE_MARGIN_MS_MAX {
        tenth
    } else {
        LEASE_MARGIN_MS_MAX
    }
}

/// How much of a lease of `lease_ms` (as the store granted it) is left for
/// the effect, `elapsed_ms` after the claim was sent (measured from just
/// before sending it, rounded up), and whether that is enough.
pub const fn lease_left(lease_ms: u64, elapsed_ms: u64) -> LeaseLeft {
    let usable_ms = lease_ms.saturating_sub(margin_ms(lease_ms));
    let left_ms = usable_ms.saturating_sub(elapsed_ms);
    if left_ms < FORWARD_MS_MIN {
        LeaseLeft::TooLittle { left_ms }
    } else {
        LeaseLeft::Forward {
            forward_ms: left_ms,
        }
    }
}

/// The elapsed time `lease_left` takes, from a measured duration: whole
/// milliseconds rounded up, so that the deadline errs early.
pub fn elapsed_ms(elapsed: std::time::Duration) -> u64 {
    let micros = elapsed.as_micros().div_ceil(1000);
    u64::try_from(micros).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn table() {
        let check = |lease_ms, elapsed_ms, expect| {
            assert_eq!(
                lease_left(lease_ms, elapsed_ms),
                expect,
                "lease {lease_ms} ms, {elapsed_ms} ms elapsed"
            );
        };
        check(30_000, 0, LeaseLeft::Forward { forward_ms: 29_000 });
        check(30_000, 8_000, LeaseLeft::Forward { forward_ms: 21_000 });
        check(2_500, 0, LeaseLeft::Forward { forward_ms: 2_250 });
        check(2_500, 2_200, LeaseLeft::Forward { forward_ms: 50 });
        check(2_500, 2_201, LeaseLeft::TooLittle { left_ms: 49 });
        check(2_500, 2_600, LeaseLeft::TooLittle { left_ms: 0 });
        check(100, 0, LeaseLeft::Forward { forward_ms: 90 });
        check(100, 41, LeaseLeft::TooLittle { left_ms: 49 });
    }

    proptest! {
        /// Whatever the lease and however late the answer, the deadline
        /// (elapsed + forward) never passes the lease less its margin, and
        /// an effect is started only with the floor left.
        #[test]
        fn the_deadline_never_passes_the_lease(
            lease_ms in 100u64..=86_400_000,
            elapsed_ms in 0u64..=100_000_000,
        ) {
            match lease_left(lease_ms, elapsed_ms) {
                LeaseLeft::Forward { forward_ms } => {
                    prop_assert!(forward_ms >= FORWARD_MS_MIN);
                    prop_assert!(elapsed_ms + forward_ms + margin_ms(lease_ms) <= lease_ms);
                }
                LeaseLeft::TooLittle { left_ms } => {
                    prop_assert!(left_ms < FORWARD_MS_MIN);
                }
            }
        }

        #[test]
        fn elapsed_rounds_up(micros in 0u64..10_000_000_000) {
            let ms = elapsed_ms(std::time::Duration::from_micros(micros));
            prop_assert!(ms * 1000 >= micros && ms * 1000 < micros + 1000);
        }
    }
}

//! How long a claim is leased, how long results are kept, how long the
//! tombstone outlives them, and what an expired lease means. Retention is a
//! correctness decision, so every duration is validated against its limits.

use std::fmt;

/// What a claim does when it meets an `in_progress` record whose lease expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseExpiry {
    /// The attempt's outcome is unknown: the record becomes `ambiguous` and
    /// waits for reconciliation. The safe default.
    Reconcile,
    /// The next attempt takes the record over with a new fencing token. Only
    /// safe where the upstream deduplicates by the propagated key.
    Takeover,
}

/// A validated retention policy for one route or operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Policy {
    lease_ms: u64,
    retention_s: u64,
    tombstone_s: u64,
    on_lease_expiry: LeaseExpiry,
}

/// The shortest lease accepted, in milliseconds.
pub const LEASE_MS_MIN: u64 = 100;
/// The longest lease accepted, in milliseconds (one day).
pub const LEASE_MS_MAX: u64 = 86_400_000;
/// The longest retention or tombstone horizon accepted, in seconds (ten years).
pub const HORIZON_S_MAX: u64 = 10 * 366 * 86_400;

/// Why a policy was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// `lease_ms` outside [`LEASE_MS_MIN`]..=[`LEASE_MS_MAX`].
    LeaseOutOfRange {
        /// The offered lease.
        lease_ms: u64,
    },
    /// `retention_s` is zero or above [`HORIZON_S_MAX`].
    RetentionOutOfRange {
        /// The offered retention.
        retention_s: u64,
    },
    /// `tombstone_s` is shorter than retention or above [`HORIZON_S_MAX`].
    TombstoneOutOfRange {
        /// The offered tombstone horizon.
        tombstone_s: u64,
        /// The retention it must not undercut.
        retention_s: u64,
    },
}

impl Policy {
    /// Lease 30 s, retention 24 h, tombstone 30 days, expired lease → reconcile.
    pub const DEFAULT: Policy = Policy {
        lease_ms: 30_000,
        retention_s: 86_400,
        tombstone_s: 30 * 86_400,
        on_lease_expiry: LeaseExpiry::Reconcile,
    };

    /// A policy, validated: the tombstone horizon (counted from completion)
    /// must cover at least the retention.
    pub fn new(
        lease_ms: u64,
        retention_s: u64,
        tombstone_s: u64,
        on_lease_expiry: LeaseExpiry,
    ) -> Result<Policy, PolicyError> {
        if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&lease_ms) {
            return Err(PolicyError::LeaseOutOfRange { lease_ms });
        }
        if retention_s == 0 || retention_s > HORIZON_S_MAX {
            return Err(PolicyError::RetentionOutOfRange { retention_s });
        }
        if tombstone_s < retention_s || tombstone_s > HORIZON_S_MAX {
            return Err(PolicyError::TombstoneOutOfRange {
                tombstone_s,
                retention_s,
            });
        }
        Ok(Policy {
            lease_ms,
            retention_s,
            tombstone_s,
            on_lease_expiry,
        })
    }

    /// How long an acquisition is leased, in milliseconds.
    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    /// How long a completed result is kept and replayed, in seconds.
    pub fn retention_s(&self) -> u64 {
        self.retention_s
    }

    /// How long after completion the tombstone is kept, in seconds.
    pub fn tombstone_s(&self) -> u64 {
        self.tombstone_s
    }

    /// What an expired lease means.
    pub fn on_lease_expiry(&self) -> LeaseExpiry {
        self.on_lease_expiry
    }

    /// This policy with its lease cut to `lease_ms_max` when that is
    /// shorter, never below [`LEASE_MS_MIN`]: an attempt that must end by a
    /// deadline (a serverless invocation's) leases no longer than it can
    /// run, so its record never blocks a retry past it.
    pub fn with_lease_at_most(self, lease_ms_max: u64) -> Policy {
        Policy {
            lease_ms: self.lease_ms.min(lease_ms_max.max(LEASE_MS_MIN)),
            ..self
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::DEFAULT
    }
}

impl PolicyError {
    /// The setting that is out of range, as a config file spells it:
    /// `lease_ms`, `retention_s` or `tombstone_s`.
    pub fn field(&self) -> &'static str {
        match self {
            PolicyError::LeaseOutOfRange { .. } => "lease_ms",
            PolicyError::RetentionOutOfRange { .. } => "retention_s",
            PolicyError::TombstoneOutOfRange { .. } => "tombstone_s",
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::LeaseOutOfRange { lease_ms } => write!(
                f,
                "lease_ms = {lease_ms} is out of range ({LEASE_MS_MIN}..={LEASE_MS_MAX})"
            ),
            PolicyError::RetentionOutOfRange { retention_s } => write!(
                f,
                "retention_s = {retention_s} is out of range (1..={HORIZON_S_MAX})"
            ),
            PolicyError::TombstoneOutOfRange {
                tombstone_s,
                retention_s,
            } => write!(
                f,
                "tombstone_s = {tombstone_s} must be at least retention_s ({retention_s}) and at most {HORIZON_S_MAX}"
            ),
        }
    }
}

impl std::error::Error for PolicyError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_every_bound() {
        use LeaseExpiry::Reconcile as R;
        let cases = [
            (Policy::new(30_000, 86_400, 86_400, R).map(|_| ()), Ok(())),
            (
                Policy::new(99, 1, 1, R).map(|_| ()),
                Err(PolicyError::LeaseOutOfRange { lease_ms: 99 }),
            ),
            (
                Policy::new(LEASE_MS_MAX + 1, 1, 1, R).map(|_| ()),
                Err(PolicyError::LeaseOutOfRange {
                    lease_ms: LEASE_MS_MAX + 1,
                }),
            ),
            (
                Policy::new(100, 0, 1, R).map(|_| ()),
                Err(PolicyError::RetentionOutOfRange { retention_s: 0 }),
            ),
            (
                Policy::new(100, 10, 9, R).map(|_| ()),
                Err(PolicyError::TombstoneOutOfRange {
                    tombstone_s: 9,
                    retention_s: 10,
                }),
            ),
            (
                Policy::new(100, 10, HORIZON_S_MAX + 1, R).map(|_| ()),
                Err(PolicyError::TombstoneOutOfRange {
                    tombstone_s: HORIZON_S_MAX + 1,
                    retention_s: 10,
                }),
            ),
        ];
        for (got, expect) in cases {
            assert_eq!(got, expect);
        }
        assert_eq!(Policy::default().lease_ms(), 30_000);
        assert_eq!(Policy::default().retention_s(), 86_400);
    }

    #[test]
    fn a_lease_cap_only_shortens_and_never_below_the_minimum() {
        let policy = Policy::DEFAULT;
        // (cap, lease)
        for (cap, lease) in [
            (u64::MAX, 30_000),
            (30_001, 30_000),
            (2_500, 2_500),
            (LEASE_MS_MIN, LEASE_MS_MIN),
            (0, LEASE_MS_MIN),
        ] {
            let capped = policy.with_lease_at_most(cap);
            assert_eq!(capped.lease_ms(), lease, "{cap}");
            assert_eq!(
                (capped.retention_s(), capped.tombstone_s()),
                (policy.retention_s(), policy.tombstone_s())
            );
        }
    }
}

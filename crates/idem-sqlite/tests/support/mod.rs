//! Fixtures shared by the SQLite store's tests: one scope, and a claim of
//! a key in it.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use idem_core::{ClaimRequest, Fingerprint, IdempotencyKey, LeaseExpiry, Policy, RecordId, Scope};

/// A record id in a fixed scope.
pub fn id(key: &str) -> RecordId {
    RecordId {
        scope: Scope::new("POST /payouts|tenant-a").unwrap(),
        key: IdempotencyKey::parse(key).unwrap(),
    }
}

/// A claim of `key` with a 1 s lease.
pub fn request(key: &str) -> ClaimRequest {
    ClaimRequest {
        id: id(key),
        fingerprint: Fingerprint::from_bytes([9; 32]),
        legacy_fingerprint: None,
        owner: "node-1".to_owned(),
        region: None,
        policy: Policy::new(1_000, 60, 3_600, LeaseExpiry::Reconcile).unwrap(),
    }
}

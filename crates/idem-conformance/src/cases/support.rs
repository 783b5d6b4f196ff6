//! Fixtures shared by the cases: ids, fingerprints, one policy per lease
//! expiry, results worth replaying byte for byte, and the few steps (acquire,
//! complete, mark ambiguous) that most cases start from.

use idem_core::{
    Claim, ClaimRequest, Clock, Fingerprint, IdempotencyKey, LeaseExpiry, ManualClock,
    OWNER_BYTES_MAX, Policy, RESULT_BODY_BYTES_MAX, Record, RecordId, Scope, State, Store,
    StoredResult, Timestamp, Token,
};

/// The lease of every policy in the suite, in milliseconds.
pub(crate) const LEASE_MS: u64 = 1_000;
/// Retention of every policy in the suite, in seconds.
pub(crate) const RETENTION_S: u64 = 60;
/// Tombstone horizon of every policy in the suite, in seconds.
pub(crate) const TOMBSTONE_S: u64 = 3_600;
/// Retention in milliseconds, for moving the clock.
pub(crate) const RETENTION_MS: u64 = RETENTION_S * 1_000;
/// Tombstone horizon in milliseconds, for moving the clock.
pub(crate) const TOMBSTONE_MS: u64 = TOMBSTONE_S * 1_000;
/// The owner label of most claims.
pub(crate) const OWNER: &str = "conformance-node-1";
/// The scope most cases use.
pub(crate) const SCOPE: &str = "POST /payouts|tenant-a";

/// A record id; panics on an invalid scope or key, which is a bug in a case.
pub(crate) fn id(scope: &str, key: &str) -> RecordId {
    RecordId {
        scope: Scope::new(scope).unwrap(),
        key: IdempotencyKey::parse(key).unwrap(),
    }
}

/// A record id in [`SCOPE`].
pub(crate) fn key(key: &str) -> RecordId {
    id(SCOPE, key)
}

/// Fingerprint number `n`: distinct `n`, distinct fingerprints.
pub(crate) fn fp(n: u8) -> Fingerprint {
    Fingerprint::from_bytes([n; 32])
}

/// The suite's policy with the given lease expiry.
pub(crate) fn policy(on_lease_expiry: LeaseExpiry) -> Policy {
    Policy::new(LEASE_MS, RETENTION_S, TOMBSTONE_S, on_lease_expiry).unwrap()
}

/// A claim by [`OWNER`] with the `reconcile` policy.
pub(crate) fn request(id: &RecordId, fingerprint: Fingerprint) -> ClaimRequest {
    request_with(id, fingerprint, LeaseExpiry::Reconcile, OWNER)
}

/// A claim with every field chosen.
pub(crate) fn request_with(
    id: &RecordId,
    fingerprint: Fingerprint,
    on_lease_expiry: LeaseExpiry,
    owner: &str,
) -> ClaimRequest {
    ClaimRequest {
        id: id.clone(),
        fingerprint,
        legacy_fingerprint: None,
        owner: owner.to_owned(),
        region: None,
        policy: policy(on_lease_expiry),
    }
}

/// Result number `n`: repeated and empty headers in a deliberate order, and a
/// body holding every byte value (not UTF-8, with NULs) so that a store that
/// reorders, merges or re-encodes anything is caught.
pub(crate) fn result(n: u8) -> StoredResult {
    let headers = vec![
        ("content-type".to_owned(), "application/json".into()),
        ("x-dup".to_owned(), "second-first".into()),
        ("x-dup".to_owned(), "first-second".into()),
        ("x-empty".to_owned(), "".into()),
        ("X-Case".to_owned(), format!("result-{n}").into()),
        ("x-latin1".to_owned(), b"caf\xe9 \xff".as_slice().into()),
    ];
    let mut body: Vec<u8> = (0..=255u8).collect();
    body.extend_from_slice(&[0, n, 0, 0xff]);
    StoredResult::new(200 + u16::from(n), headers, body).unwrap()
}

/// The largest result the contract lets a store keep: a body of exactly
/// `RESULT_BODY_BYTES_MAX` bytes.
pub(crate) fn largest_result() -> StoredResult {
    let body: Vec<u8> = (0..RESULT_BODY_BYTES_MAX)
        .map(|i| (i % 251) as u8)
        .collect();
    StoredResult::new(201, vec![("x-large".to_owned(), "yes".into())], body).unwrap()
}

/// An owner label of exactly `bytes` bytes.
pub(crate) fn owner_of(bytes: usize) -> String {
    assert!(bytes <= OWNER_BYTES_MAX + 1);
    "o".repeat(bytes)
}

/// Claims and asserts a fresh acquisition: no takeover, a lease of
/// [`LEASE_MS`] from the store's now. Returns the token.
pub(crate) async fn acquire<S: Store>(store: &S, clock: &ManualClock, req: &ClaimRequest) -> Token {
    let lease_until = clock.now().plus_millis(req.policy.lease_ms());
    let claim = store.claim(req).await.unwrap();
    let Claim::Acquired { token, .. } = claim else {
        panic!("claim on {} should acquire, got {claim:?}", req.id);
    };
    assert_eq!(
        claim,
        Claim::Acquired {
            token,
            lease_until,
            lease_ms: req.policy.lease_ms(),
            took_over: None
        },
        "acquisition of {}",
        req.id
    );
    token
}

/// Acquires `id` with fingerprint `fingerprint` and returns the stored record.
pub(crate) async fn in_progress<S: Store>(
    store: &S,
    clock: &ManualClock,
    id: &RecordId,
    fingerprint: Fingerprint,
) -> Record {
    acquire(store, clock, &request(id, fingerprint)).await;
    stored(store, id).await
}

/// Acquires and completes `id` with `result(n)`; returns the stored record.
pub(crate) async fn completed<S: Store>(
    store: &S,
    clock: &ManualClock,
    id: &RecordId,
    fingerprint: Fingerprint,
    n: u8,
) -> Record {
    let token = acquire(store, clock, &request(id, fingerprint)).await;
    let done = store.complete(id, token, result(n)).await.unwrap();
    assert_eq!(done.state, idem_core::State::Completed, "completing {id}");
    done
}

/// Acquires `id` and marks it ambiguous; returns the stored record.
pub(crate) async fn ambiguous<S: Store>(
    store: &S,
    clock: &ManualClock,
    id: &RecordId,
    fingerprint: Fingerprint,
) -> Record {
    let token = acquire(store, clock, &request(id, fingerprint)).await;
    let marked = store.mark_ambiguous(id, token).await.unwrap();
    assert_eq!(marked.state, idem_core::State::Ambiguous, "marking {id}");
    marked
}

/// The stored record, which must exist.
pub(crate) async fn stored<S: Store>(store: &S, id: &RecordId) -> Record {
    match store.get(id).await.unwrap() {
        Some(record) => record,
        None => panic!("{id} should have a record"),
    }
}

/// `at + ms`: a short name for the timelines the cases walk.
pub(crate) fn after(at: Timestamp, ms: u64) -> Timestamp {
    at.plus_millis(ms)
}

/// The record a fresh acquisition with the suite's default policy writes.
pub(crate) fn fresh_record(
    id: &RecordId,
    fingerprint: Fingerprint,
    token: Token,
    now: Timestamp,
) -> Record {
    Record {
        id: id.clone(),
        fingerprint,
        state: State::InProgress,
        token,
        owner: OWNER.to_owned(),
        region: None,
        lease_until: after(now, LEASE_MS),
        created_at: now,
        completed_at: None,
        expires_at: None,
        tombstone_until: None,
        retention_s: RETENTION_S,
        tombstone_s: TOMBSTONE_S,
        result: None,
        resolution: None,
        ambiguity: None,
    }
}

/// Releases the ambiguous `record` as not executed (after its lease), claims
/// the key again and marks that second attempt ambiguous too: two ambiguity
/// episodes of one key. Returns the second attempt's record.
pub(crate) async fn release_reclaim_and_mark<S: Store>(
    store: &S,
    clock: &ManualClock,
    record: &Record,
) -> Record {
    clock.set(record.lease_until);
    let released =
        idem_core::Resolution::new(idem_core::Outcome::NotExecuted, "operator", "no").unwrap();
    let got = store.resolve(&record.id, record.token, released).await;
    assert_eq!(got, Ok(None), "releasing {}", record.id);
    ambiguous(store, clock, &record.id, record.fingerprint).await
}

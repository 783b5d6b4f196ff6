//! Completed records kept in memory, so that a replay is answered without
//! a trip to the store.
//!
//! Why this returns exactly what the store would: a `completed` record is
//! final. No transition changes it except the purge, and the purge acts
//! only on what [`Record::state_at`] already reads from the record's own
//! times (past retention it is a tombstone to every decision, purged or
//! not; past the tombstone horizon it is gone to every decision). So the
//! claim decision on a completed record as it was stored, at the store's
//! clock now, is the decision on the record as the store holds it now,
//! whenever that decision writes nothing ([`decision::answer_without_write`]);
//! when it would write (the key's horizon is over and a new attempt may
//! acquire it) the cache answers nothing and the store decides.
//!
//! The one condition: `now` must be the clock the store decides by. A
//! store whose clock is its own process's (the embedded store) uses
//! [`ReplayCache::answer`]. One that decides by a database server's clock
//! knows that clock only within bounds; it uses
//! [`ReplayCache::answer_while_completed`] with the latest the server's
//! clock can be: a record still completed then was completed at the
//! server's now too (it was completed when it was read, and completion is
//! final until expiry), and on a completed record the decision does not
//! depend on when it is taken. Any other answer (past expiry: a late
//! replay, or a new attempt) is the server's to give.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use crate::decision::{self, Claim, ClaimRequest};
use crate::{Clock, Record, RecordId, State, Timestamp};

/// Bytes a kept record is counted as besides its key, scope, owner, region
/// and result: an estimate of the fixed fields and the map's bookkeeping.
/// The bound is on these counted bytes, not on the process's memory.
const RECORD_OVERHEAD_BYTES: usize = 256;

/// A bounded map from record to its completed record; the oldest kept
/// leaves first when a new one would pass the bound.
#[derive(Debug)]
pub struct ReplayCache {
    bytes_max: usize,
    inner: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    records: HashMap<RecordId, Arc<Record>>,
    /// Keys in the order they were kept, oldest first; a key may appear
    /// after its record left (it is skipped when it comes up).
    order: VecDeque<RecordId>,
    bytes: usize,
}

impl ReplayCache {
    /// A cache holding at most about `bytes_max` bytes of records; 0 keeps
    /// nothing.
    pub fn new(bytes_max: usize) -> ReplayCache {
        ReplayCache {
            bytes_max,
            inner: Mutex::new(Kept::default()),
        }
    }

    /// The claim's answer from a kept completed record, by the decision at
    /// `clock`'s now (read only when a record is kept), when that decision
    /// writes nothing; `None` sends the claim to the store. A record whose
    /// key may be acquired again is dropped.
    pub fn answer(&self, req: &ClaimRequest, clock: &dyn Clock) -> Option<Claim> {
        if self.bytes_max == 0 {
            return None;
        }
        let record = self.lock().records.get(&req.id).cloned()?;
        let answer = decision::answer_without_write(Some(&record), req, clock.now());
        if answer.is_none() {
            self.forget(&req.id);
        }
        answer
    }

    /// The claim's answer from a kept record that is still completed at
    /// `latest`, the latest the store's clock can read now; `None` sends
    /// the claim to the store, and a record past its retention at `latest`
    /// is dropped.
    pub fn answer_while_completed(&self, req: &ClaimRequest, latest: Timestamp) -> Option<Claim> {
        if self.bytes_max == 0 {
            return None;
        }
        let record = self.lock().records.get(&req.id).cloned()?;
        if record.state_at(latest) != State::Completed {
            self.forget(&req.id);
            return None;
        }
        decision::answer_without_write(Some(&record), req, latest)
    }

    /// Keeps `record` if it is completed (anything else is never kept) and
    /// fits the bound.
    pub fn keep(&self, record: &Record) {
        if record.state != State::Completed {
            return;
        }
        let size = size_of(record);
        if size > self.bytes_max {
            return;
        }
        let mut kept = self.lock();
        if kept.records.contains_key(&record.id) {
            return;
        }
        while kept.bytes + size > self.bytes_max {
            let Some(oldest) = kept.order.pop_front() else {
                break;
            };
            if let Some(gone) = kept.records.remove(&oldest) {
                kept.bytes -= size_of(&gone);
            }
        }
        kept.bytes += size;
        kept.order.push_back(record.id.clone());
        kept.records
            .insert(record.id.clone(), Arc::new(record.clone()));
    }

    /// Drops the record of `id`, if kept.
    pub fn forget(&self, id: &RecordId) {
        let mut kept = self.lock();
        if let Some(gone) = kept.records.remove(id) {
            kept.bytes -= size_of(&gone);
        }
        // Its place in `order` is skipped when it comes up; compact when
        // the stale places outnumber the records.
        if kept.order.len() > 2 * kept.records.len() + 64 {
            let Kept { records, order, .. } = &mut *kept;
            order.retain(|id| records.contains_key(id));
        }
    }

    /// Records kept, and the bytes they are counted as.
    pub fn usage(&self) -> (usize, usize) {
        let kept = self.lock();
        (kept.records.len(), kept.bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        // The map is consistent between statements: a panic elsewhere
        // leaves nothing half-done in it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The bytes `record` is counted as.
fn size_of(record: &Record) -> usize {
    let result = record.result.as_ref().map_or(0, |r| {
        r.body().len()
            + r.headers()
                .iter()
                .map(|(n, v)| n.len() + v.len() + 48)
                .sum::<usize>()
    });
    RECORD_OVERHEAD_BYTES
        + record.id.scope.as_str().len()
        + record.id.key.as_str().len()
        + record.owner.len()
        + record.region.as_ref().map_or(0, String::len)
        + result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::test_support::now;
    use crate::{
        Fingerprint, IdempotencyKey, LeaseExpiry, MemoryStore, Policy, Scope, Store, StoredResult,
        Timestamp,
    };

    fn request(key: &str) -> ClaimRequest {
        ClaimRequest {
            id: RecordId {
                scope: Scope::from_parts("POST /p", "t", None).unwrap(),
                key: IdempotencyKey::parse(key).unwrap(),
            },
            fingerprint: Fingerprint::from_bytes([1; 32]),
            legacy_fingerprint: None,
            owner: "o".into(),
            region: None,
            policy: Policy::new(1_000, 1, 2, LeaseExpiry::Reconcile).unwrap(),
        }
    }

    fn completed(store: &MemoryStore, req: &ClaimRequest, body: usize) -> Record {
        let Claim::Acquired { token, .. } = now(store.claim(req)).unwrap() else {
            panic!("acquired");
        };
        let result = StoredResult::new(201, vec![], vec![7; body]).unwrap();
        now(store.complete(&req.id, token, result)).unwrap()
    }

    #[test]
    fn answers_as_the_store_does_until_the_key_may_be_acquired_again() {
        let clock = crate::ManualClock::new(Timestamp::from_millis(1_000_000));
        let store = MemoryStore::new(Arc::new(clock.clone()));
        let cache = ReplayCache::new(1 << 20);
        let req = request("a");
        cache.keep(&completed(&store, &req, 10));
        let mut other = req.clone();
        other.fingerprint = Fingerprint::from_bytes([2; 32]);
        // Before retention, past it, past the tombstone horizon.
        let mut stood_aside = false;
        for step_ms in [0, 500, 600, 1_000] {
            clock.advance_millis(step_ms);
            for r in [&req, &other] {
                let cached = cache.answer(r, &clock);
                let stored = now(store.claim(r)).unwrap();
                match cached {
                    Some(answer) => assert_eq!(answer, stored, "at +{step_ms} ms"),
                    // The first claim the cache leaves to the store is one
                    // that writes: the key is acquired again.
                    None if !stood_aside => {
                        assert!(
                            matches!(stored, Claim::Acquired { .. }),
                            "the cache stands aside only where the store writes: {stored:?}"
                        );
                        stood_aside = true;
                    }
                    None => {}
                }
                now(store.purge(10)).unwrap();
            }
        }
        assert!(stood_aside, "the key's horizon ended within the test");
        assert_eq!(cache.usage().0, 0, "a key acquired again is forgotten");
    }

    #[test]
    fn keeps_only_completed_records_within_its_bound() {
        let store = MemoryStore::new(Arc::new(crate::SystemClock));
        let cache = ReplayCache::new(4 * (RECORD_OVERHEAD_BYTES + 1_000));
        let req = request("in-flight");
        now(store.claim(&req)).unwrap();
        cache.keep(&now(store.get(&req.id)).unwrap().unwrap());
        assert_eq!(cache.usage().0, 0, "an attempt in flight is not final");
        for n in 0..10 {
            cache.keep(&completed(&store, &request(&format!("k{n}")), 900));
        }
        let (records, bytes) = cache.usage();
        assert!(records > 0 && bytes <= 4 * (RECORD_OVERHEAD_BYTES + 1_000));
        assert!(
            cache.answer(&request("k0"), &crate::SystemClock).is_none(),
            "the oldest left first"
        );
        assert!(
            cache.answer(&request("k9"), &crate::SystemClock).is_some(),
            "the newest is kept"
        );
    }
}

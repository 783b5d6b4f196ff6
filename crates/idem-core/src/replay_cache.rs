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
//!
//! The exception to "final until expiry" is an operator's verb (`expire`,
//! `evict`), which may be applied by any process sharing the store. Two
//! things keep a kept record from outliving one:
//!
//! - **The store's count of verbs.** Every store that keeps a cache counts
//!   the verbs it applied, in the verb's own transaction, and reads the
//!   count back now and then ([`ReplayCache::verbs_refresh_due`]). A count
//!   that changed forgets every kept record ([`ReplayCache::note_verbs`]),
//!   and memory answers only while the last reading began less than
//!   [`VERBS_READING_AGE_MS_MAX`] ago. So a verb committed by any process
//!   is honoured by every cache at most that long after it committed.
//! - **Generations.** A record read from the store before a verb committed
//!   may be kept after the cache forgot the key for it. Each forgetting
//!   starts a new generation; a record is kept only if no forgetting
//!   happened since its read began ([`ReplayCache::generation`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::decision::{self, Claim, ClaimRequest};
use crate::{Clock, Record, RecordId, State, Timestamp};

/// Bytes a kept record is counted as besides its key, scope, owner, region
/// and result: an estimate of the fixed fields and the map's bookkeeping.
/// The bound is on these counted bytes, not on the process's memory.
const RECORD_OVERHEAD_BYTES: usize = 256;

/// Memory answers nothing when the last reading of the store's count of
/// verbs began longer ago than this: a verb applied by another process is
/// honoured here at most this long after it committed.
pub const VERBS_READING_AGE_MS_MAX: u64 = 1_000;

/// A reading of the count of verbs older than this is renewed when a claim
/// comes ([`ReplayCache::verbs_refresh_due`]): a quarter of
/// [`VERBS_READING_AGE_MS_MAX`], so that a renewal slower than a round trip
/// still lands before memory stops answering.
pub const VERBS_REFRESH_AGE_MS: u64 = VERBS_READING_AGE_MS_MAX / 4;

/// How many times the cache has forgotten a record, as of one instant:
/// taken before a read of the store, so that what the read returns is kept
/// only if nothing was forgotten meanwhile ([`ReplayCache::keep`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generation(u64);

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
    /// Bumped by every forgetting ([`Generation`]).
    generation: u64,
    /// The last count of verbs read from the store, and when its read
    /// began.
    verbs: Option<(u64, Instant)>,
    /// When the last renewal of that reading was asked for.
    verbs_renewal: Option<Instant>,
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
    /// writes nothing and the count of verbs was read recently enough at
    /// `at` (this process's monotonic now); `None` sends the claim to the
    /// store. A record whose key may be acquired again is dropped.
    pub fn answer(&self, req: &ClaimRequest, clock: &dyn Clock, at: Instant) -> Option<Claim> {
        let record = self.fresh(&req.id, at)?;
        let answer = decision::answer_without_write(Some(&record), req, clock.now());
        if answer.is_none() {
            self.lock().remove(&req.id);
        }
        answer
    }

    /// The claim's answer from a kept record that is still completed at
    /// `latest`, the latest the store's clock can read now; `None` sends
    /// the claim to the store, and a record past its retention at `latest`
    /// is dropped. As [`ReplayCache::answer`], only while the count of
    /// verbs was read recently enough at `at`.
    pub fn answer_while_completed(
        &self,
        req: &ClaimRequest,
        latest: Timestamp,
        at: Instant,
    ) -> Option<Claim> {
        let record = self.fresh(&req.id, at)?;
        if record.state_at(latest) != State::Completed {
            self.lock().remove(&req.id);
            return None;
        }
        decision::answer_without_write(Some(&record), req, latest)
    }

    /// The generation now: take it before reading a record that may be
    /// kept, and pass it to [`ReplayCache::keep`].
    pub fn generation(&self) -> Generation {
        if self.bytes_max == 0 {
            // Nothing is ever kept: no lock on the claim path.
            return Generation(0);
        }
        Generation(self.lock().generation)
    }

    /// Keeps `record` if it is completed (anything else is never kept),
    /// fits the bound, and nothing was forgotten since `since` was taken
    /// (a verb may have changed the record after it was read).
    pub fn keep(&self, record: &Record, since: Generation) {
        if record.state != State::Completed {
            return;
        }
        let size = size_of(record);
        if size > self.bytes_max {
            return;
        }
        let mut kept = self.lock();
        if kept.generation != since.0 || kept.records.contains_key(&record.id) {
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

    /// Drops the record of `id`, if kept, and starts a new generation: a
    /// record read before now is not kept. For a change to the record (a
    /// verb); a kept record past its own expiry is only removed.
    pub fn forget(&self, id: &RecordId) {
        let mut kept = self.lock();
        kept.generation = kept.generation.wrapping_add(1);
        kept.remove(id);
    }

    /// Notes the store's count of verbs, read by a statement that began at
    /// `read_at`. A count other than the last one read (a verb was applied
    /// somewhere, or the store was restored) forgets every kept record and
    /// starts a new generation; so does the first. A reading that began
    /// before the last one noted is ignored: it can say nothing newer, and
    /// its lower count would forget everything for nothing.
    pub fn note_verbs(&self, count: u64, read_at: Instant) {
        let mut kept = self.lock();
        let seen = kept.verbs;
        if seen.is_some_and(|(_, at)| read_at < at) {
            return;
        }
        kept.verbs = Some((count, read_at));
        if seen.is_none_or(|(n, _)| n != count) {
            kept.generation = kept.generation.wrapping_add(1);
            kept.records.clear();
            kept.order.clear();
            kept.bytes = 0;
        }
    }

    /// Whether the caller should read the store's count of verbs now and
    /// [`note`](ReplayCache::note_verbs) it: the last reading began more
    /// than [`VERBS_REFRESH_AGE_MS`] before `at`, and no renewal was asked
    /// for within that time (so a store that does not answer is asked at
    /// most four times a second, however many claims come). Never with
    /// the cache off, nor with nothing kept once a reading was taken.
    pub fn verbs_refresh_due(&self, at: Instant) -> bool {
        if self.bytes_max == 0 {
            return false;
        }
        let refresh = Duration::from_millis(VERBS_REFRESH_AGE_MS);
        let mut kept = self.lock();
        // Nothing kept, nothing to answer: the first record kept asks for
        // a reading, and memory answers once it came. The very first
        // reading is taken all the same, to start from a known count.
        if kept.records.is_empty() && kept.verbs.is_some() {
            return false;
        }
        let young = |since: Option<Instant>| {
            since.is_some_and(|s| at.saturating_duration_since(s) < refresh)
        };
        if young(kept.verbs.map(|(_, read_at)| read_at)) || young(kept.verbs_renewal) {
            return false;
        }
        kept.verbs_renewal = Some(at);
        true
    }

    /// Records kept, and the bytes they are counted as.
    pub fn usage(&self) -> (usize, usize) {
        let kept = self.lock();
        (kept.records.len(), kept.bytes)
    }

    /// The kept record of `id`, if memory may answer at `at`: the cache is
    /// on and the count of verbs was read recently enough.
    fn fresh(&self, id: &RecordId, at: Instant) -> Option<Arc<Record>> {
        if self.bytes_max == 0 {
            return None;
        }
        let kept = self.lock();
        let (_, read_at) = kept.verbs?;
        if at.saturating_duration_since(read_at) >= Duration::from_millis(VERBS_READING_AGE_MS_MAX)
        {
            return None;
        }
        kept.records.get(id).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        // The map is consistent between statements: a panic elsewhere
        // leaves nothing half-done in it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Kept {
    /// Drops the record of `id`, if kept. Its place in `order` is skipped
    /// when it comes up; compact when the stale places outnumber the
    /// records.
    fn remove(&mut self, id: &RecordId) {
        if let Some(gone) = self.records.remove(id) {
            self.bytes -= size_of(&gone);
        }
        if self.order.len() > 2 * self.records.len() + 64 {
            let Kept { records, order, .. } = self;
            order.retain(|id| records.contains_key(id));
        }
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

    /// A cache that has just read the store's count of verbs (none).
    fn fresh_cache(bytes_max: usize) -> ReplayCache {
        let cache = ReplayCache::new(bytes_max);
        cache.note_verbs(0, Instant::now());
        cache
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
        let cache = fresh_cache(1 << 20);
        let req = request("a");
        cache.keep(&completed(&store, &req, 10), cache.generation());
        let mut other = req.clone();
        other.fingerprint = Fingerprint::from_bytes([2; 32]);
        // Before retention, past it, past the tombstone horizon.
        let mut stood_aside = false;
        for step_ms in [0, 500, 600, 1_000] {
            clock.advance_millis(step_ms);
            for r in [&req, &other] {
                let cached = cache.answer(r, &clock, Instant::now());
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
        let cache = fresh_cache(4 * (RECORD_OVERHEAD_BYTES + 1_000));
        let req = request("in-flight");
        now(store.claim(&req)).unwrap();
        cache.keep(
            &now(store.get(&req.id)).unwrap().unwrap(),
            cache.generation(),
        );
        assert_eq!(cache.usage().0, 0, "an attempt in flight is not final");
        for n in 0..10 {
            let record = completed(&store, &request(&format!("k{n}")), 900);
            cache.keep(&record, cache.generation());
        }
        let (records, bytes) = cache.usage();
        assert!(records > 0 && bytes <= 4 * (RECORD_OVERHEAD_BYTES + 1_000));
        assert!(
            cache
                .answer(&request("k0"), &crate::SystemClock, Instant::now())
                .is_none(),
            "the oldest left first"
        );
        assert!(
            cache
                .answer(&request("k9"), &crate::SystemClock, Instant::now())
                .is_some(),
            "the newest is kept"
        );
    }

    /// A completed record read from the store, kept in a cache whose
    /// count of verbs was read at `read_at`.
    fn kept_at(read_at: Instant) -> (ReplayCache, ClaimRequest) {
        let store = MemoryStore::new(Arc::new(crate::SystemClock));
        let cache = ReplayCache::new(1 << 20);
        cache.note_verbs(3, read_at);
        let req = request("k");
        cache.keep(&completed(&store, &req, 10), cache.generation());
        (cache, req)
    }

    #[test]
    fn a_changed_count_of_verbs_forgets_every_record_and_an_older_reading_changes_nothing() {
        let read_at = Instant::now();
        let answers = |cache: &ReplayCache, req: &ClaimRequest| {
            cache.answer(req, &crate::SystemClock, read_at).is_some()
        };
        // (count, how long before the last reading it began, still answers)
        let cases = [
            (3, Duration::ZERO, true),
            (4, Duration::from_millis(5), true),
            (4, Duration::ZERO, false),
            (2, Duration::ZERO, false),
        ];
        for (count, earlier, answered) in cases {
            let (cache, req) = kept_at(read_at);
            assert!(answers(&cache, &req), "kept and fresh");
            cache.note_verbs(count, read_at - earlier);
            assert_eq!(
                answers(&cache, &req),
                answered,
                "count {count} read {earlier:?} before the last reading"
            );
        }
    }

    #[test]
    fn memory_answers_only_while_the_count_of_verbs_is_fresh() {
        let read_at = Instant::now();
        let (cache, req) = kept_at(read_at);
        let age = |ms| read_at + Duration::from_millis(ms);
        let answers = |at| cache.answer(&req, &crate::SystemClock, at).is_some();
        assert!(answers(age(VERBS_READING_AGE_MS_MAX - 1)));
        assert!(!answers(age(VERBS_READING_AGE_MS_MAX)), "too old a reading");
        let unread = ReplayCache::new(1 << 20);
        let store = MemoryStore::new(Arc::new(crate::SystemClock));
        unread.keep(&completed(&store, &req, 10), unread.generation());
        assert_eq!(unread.usage().0, 1);
        let answer = unread.answer(&req, &crate::SystemClock, read_at);
        assert!(answer.is_none(), "never read: no answer from memory");
    }

    #[test]
    fn a_record_read_before_a_forgetting_is_not_kept() {
        let store = MemoryStore::new(Arc::new(crate::SystemClock));
        let cache = fresh_cache(1 << 20);
        let req = request("k");
        let record = completed(&store, &req, 10);
        // A replay's read begins; a verb on another key forgets it.
        let since = cache.generation();
        cache.forget(&request("other").id);
        cache.keep(&record, since);
        assert_eq!(cache.usage().0, 0, "a verb may have changed what was read");
        let since = cache.generation();
        cache.note_verbs(1, Instant::now());
        cache.keep(&record, since);
        assert_eq!(cache.usage().0, 0, "so may a verb of another process");
        cache.keep(&record, cache.generation());
        assert_eq!(cache.usage().0, 1, "read after both: kept");
    }

    #[test]
    fn the_count_of_verbs_is_renewed_at_most_four_times_a_second() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let cache = ReplayCache::new(1 << 20);
        assert!(cache.verbs_refresh_due(at(0)), "never read");
        assert!(!cache.verbs_refresh_due(at(1)), "asked for already");
        assert!(
            cache.verbs_refresh_due(at(VERBS_REFRESH_AGE_MS)),
            "no answer came"
        );
        cache.note_verbs(0, at(300));
        let aged = at(300 + VERBS_REFRESH_AGE_MS);
        assert!(
            !cache.verbs_refresh_due(aged),
            "nothing kept, nothing to renew"
        );
        let store = MemoryStore::new(Arc::new(crate::SystemClock));
        cache.keep(&completed(&store, &request("k"), 1), cache.generation());
        assert!(!cache.verbs_refresh_due(at(400)), "a young reading stands");
        assert!(cache.verbs_refresh_due(aged), "an aged one is renewed");
        assert!(
            !ReplayCache::new(0).verbs_refresh_due(at(0)),
            "the cache off reads nothing"
        );
    }

    /// One step of [`interleavings_never_answer_what_a_seen_verb_changed`].
    #[derive(Clone, Debug)]
    enum Step {
        /// A claim reads the record from the store (taking the generation
        /// first), to keep it later.
        BeginRead,
        /// The oldest read still open keeps what it read.
        FinishRead,
        /// An operator's verb commits: the record becomes a new version,
        /// completed again (evicted and run once more) or not (expired).
        /// `local`: in this process, which forgets the key before and
        /// after.
        Verb { local: bool, rerun: bool },
        /// A reading of the store's count of verbs begins.
        BeginCount,
        /// The oldest reading still open is noted.
        FinishCount,
        /// Time passes.
        Tick(u64),
        /// A replay asks memory.
        Answer,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            Just(Step::BeginRead),
            Just(Step::FinishRead),
            (any::<bool>(), any::<bool>()).prop_map(|(local, rerun)| Step::Verb { local, rerun }),
            Just(Step::BeginCount),
            Just(Step::FinishCount),
            (0u64..600).prop_map(Step::Tick),
            Just(Step::Answer),
            Just(Step::Answer),
        ]
    }

    proptest::proptest! {
        /// Every interleaving of reads, keeps, verbs (here and in another
        /// process), readings of the count and replays: memory never
        /// answers a record that a verb the noted reading saw replaced,
        /// and answers only while that reading began under a second ago.
        /// The version of a record is the number of verbs applied before
        /// it was written, as the count of verbs is.
        #[test]
        fn interleavings_never_answer_what_a_seen_verb_changed(
            steps in proptest::collection::vec(step(), 1..60)
        ) {
            let start = Instant::now();
            let store = MemoryStore::new(Arc::new(crate::SystemClock));
            let req = request("k");
            let base = completed(&store, &req, 1);
            let version_of = |version: u64| {
                let mut record = base.clone();
                let body = version.to_le_bytes().to_vec();
                record.result = Some(StoredResult::new(201, vec![], body).unwrap());
                record
            };
            let cache = ReplayCache::new(1 << 20);
            // The store: its count of verbs (the record's version), and
            // whether the record is completed.
            let (mut count, mut completed_now) = (0u64, true);
            let mut reads: VecDeque<(Generation, Option<Record>)> = VecDeque::new();
            let mut readings: VecDeque<(u64, Instant)> = VecDeque::new();
            let mut now = start;
            for step in steps {
                match step {
                    Step::BeginRead => {
                        let since = cache.generation();
                        reads.push_back((since, completed_now.then(|| version_of(count))));
                    }
                    Step::FinishRead => {
                        if let Some((since, Some(record))) = reads.pop_front() {
                            cache.keep(&record, since);
                        }
                    }
                    Step::Verb { local, rerun } => {
                        if local {
                            cache.forget(&req.id);
                        }
                        count += 1;
                        completed_now = rerun;
                        if local {
                            cache.forget(&req.id);
                        }
                    }
                    Step::BeginCount => readings.push_back((count, now)),
                    Step::FinishCount => {
                        if let Some((seen, read_at)) = readings.pop_front() {
                            cache.note_verbs(seen, read_at);
                        }
                    }
                    Step::Tick(ms) => now += Duration::from_millis(ms),
                    Step::Answer => {
                        let Some(answer) = cache.answer(&req, &crate::SystemClock, now) else {
                            continue;
                        };
                        let Claim::Replay { record } = answer else {
                            panic!("memory answers replays only: {answer:?}");
                        };
                        let body = record.result.as_ref().unwrap().body().to_vec();
                        let version = u64::from_le_bytes(body.try_into().unwrap());
                        let (noted, read_at) = cache.lock().verbs.unwrap();
                        proptest::prop_assert!(
                            version >= noted,
                            "answered version {version}, but a reading saw {noted} verbs"
                        );
                        proptest::prop_assert!(
                            now.duration_since(read_at)
                                < Duration::from_millis(VERBS_READING_AGE_MS_MAX)
                        );
                    }
                }
            }
        }
    }
}

//! A hard failover loses what the failed region wrote but had not shipped:
//! both asynchronous modes pay again for intents whose records were in that
//! tail, synchronous replication has no tail, and the lost writes counted are
//! exactly the ones that were in flight.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use idem_core::{Accepted, Claim, Clock, MemoryStore, RecordId, Store, StoreWrapper, Timestamp};
use idem_sim::{Design, RunReport, Workload, run, run_seeds, run_with_store};

const HOME_REGION: &str = "examples/sim/active-active-home-region.toml";
const ANY_REGION: &str = "examples/contracts/active-active-async.toml";
const SYNC: &str = "examples/sim/active-active-sync.toml";
/// A seed whose failover catches one claim of region 0 in flight (found by
/// running seeds 0..100 of the home-region design; any seed with a non-empty
/// tail whose intent is retried would do).
const TAIL_SEED: u64 = 54;
const SEEDS: u64 = 100;

fn design(file: &str, workload: Workload, lag_ms: Option<u64>) -> Design {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(file);
    let mut loaded = Design::load(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    if let (Some(lag_ms), Some(regions)) = (lag_ms, loaded.contract.regions.as_mut()) {
        regions.replication_lag_ms = Some(lag_ms);
    }
    Design::new(loaded.name, loaded.file, loaded.contract, workload)
        .unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn violated(r: &RunReport, invariant: &str) -> bool {
    r.findings.iter().any(|f| f.invariant == invariant)
}

#[test]
fn the_lost_tail_pays_twice_in_both_async_modes_and_never_in_sync() {
    for file in [HOME_REGION, ANY_REGION] {
        let r = run(&design(file, Workload::default(), None), TAIL_SEED);
        assert!(r.counts.tail_writes_lost > 0, "{file}: {r:?}");
        assert!(r.counts.tail_keys_lost > 0, "{file}: {r:?}");
        assert!(r.counts.duplicates > 0, "{file}: {r:?}");
        assert!(violated(&r, "I1"), "{file}: {r:?}");
        assert_eq!(r.counts.lost, 0, "{file}: {r:?}");
    }
    // Home-region routing promised one region per key: the tail breaks it.
    let home = run(&design(HOME_REGION, Workload::default(), None), TAIL_SEED);
    assert!(violated(&home, "I6"), "{home:?}");

    // The same seed, synchronously replicated: nothing was acknowledged
    // that the other region did not have.
    let sync = run(&design(SYNC, Workload::default(), None), TAIL_SEED);
    assert_eq!(sync.counts.tail_writes_lost, 0, "{sync:?}");
    assert_eq!(sync.counts.duplicates, 0, "{sync:?}");
    assert!(sync.findings.is_empty(), "{sync:?}");
    let all = run_seeds(&design(SYNC, Workload::default(), None), 0, SEEDS);
    assert_eq!(
        (all.counts.tail_writes_lost, all.counts.duplicates),
        (0, 0),
        "{}",
        all.render_table()
    );
}

#[test]
fn a_provider_that_dedups_by_the_forwarded_key_absorbs_the_tail() {
    let workload = Workload {
        bank_dedup: true,
        ..Workload::default()
    };
    let s = run_seeds(&design(HOME_REGION, workload, None), 0, SEEDS);
    assert!(s.counts.tail_writes_lost > 0, "{}", s.render_table());
    assert_eq!(s.counts.duplicates, 0, "{}", s.render_table());
    assert!(s.passed(), "{}", s.render_table());
}

/// The suspect window opened at the failover verifies every fresh claim of
/// the surviving region with the bank's lookup: the tail is still lost,
/// but none of its keys pays again, in either asynchronous mode.
#[test]
fn the_suspect_window_absorbs_the_tail() {
    for file in [HOME_REGION, ANY_REGION] {
        let workload = Workload {
            suspect_window: true,
            ..Workload::default()
        };
        let s = run_seeds(&design(file, workload, None), 0, SEEDS);
        assert!(
            s.counts.tail_writes_lost > 0,
            "{file}: {}",
            s.render_table()
        );
        assert!(s.counts.window_verified > 0, "{file}: {}", s.render_table());
        assert_eq!(s.counts.duplicates, 0, "{file}: {}", s.render_table());
        assert!(s.passed(), "{file}: {}", s.render_table());
        // The same seeds without it pay again for the tail.
        let without = run_seeds(&design(file, Workload::default(), None), 0, SEEDS);
        assert!(
            without.counts.duplicates > 0,
            "{file}: {}",
            without.render_table()
        );
    }
}

#[test]
fn with_a_lag_longer_than_the_failover_every_write_of_the_failed_region_is_lost() {
    // Ten days: nothing region 0 ships arrives before it fails.
    let d = design(HOME_REGION, Workload::default(), Some(864_000_000));
    let mut tails = 0;
    for seed in 0..20 {
        let regions = Regions::default();
        let r = run_with_store(&d, seed, &|clock| regions.make(clock));
        let (written, keys) = regions.written(0);
        assert_eq!(r.counts.tail_writes_lost, written, "seed {seed}: {r:?}");
        assert_eq!(r.counts.tail_keys_lost, keys, "seed {seed}: {r:?}");
        assert_eq!(regions.claims_from_region_0(1), 0, "seed {seed}");
        tails += written;
    }
    assert!(tails > 0, "region 0 wrote nothing before failing");
}

#[test]
fn no_write_of_the_failed_region_arrives_after_the_failover() {
    let d = design(HOME_REGION, Workload::default(), None);
    let failover_ms = d.workload.failover_at_s * 1000;
    let (mut lost, mut shipped) = (0, 0);
    for seed in 0..SEEDS {
        let regions = Regions::default();
        let r = run_with_store(&d, seed, &|clock| regions.make(clock));
        lost += r.counts.tail_writes_lost;
        let latest = regions.latest_claim_from_region_0(1);
        assert!(
            latest.is_none_or(|ms| ms < failover_ms),
            "seed {seed}: a claim of region 0 reached region 1 {latest:?} ms in, after the failover at {failover_ms} ms"
        );
        shipped += regions.claims_from_region_0(1);
    }
    assert!(lost > 0, "no seed had a write in flight at the failover");
    assert!(shipped > 0, "no claim of region 0 ever reached region 1");
}

/// The stores of one run, in region order (the simulator makes region 0's
/// first), each noting the writes it accepted that the simulator ships.
#[derive(Default)]
struct Regions(Mutex<Vec<Arc<Noting>>>);

impl Regions {
    fn make(&self, clock: Arc<dyn Clock>) -> Arc<dyn Store> {
        let store = Arc::new(Noting {
            start: clock.now(),
            inner: MemoryStore::new(clock.clone()),
            clock,
            notes: Mutex::new(Notes::default()),
        });
        lock(&self.0).push(store.clone());
        store
    }

    fn region(&self, r: usize) -> Arc<Noting> {
        lock(&self.0)[r].clone()
    }

    /// Accepted writes of region `r` and the distinct keys they touched.
    fn written(&self, r: usize) -> (u64, u64) {
        let store = self.region(r);
        let notes = lock(&store.notes);
        (notes.writes, notes.keys.len() as u64)
    }

    /// Claims made by region 0's gateway that reached region `r`'s store.
    fn claims_from_region_0(&self, r: usize) -> u64 {
        lock(&self.region(r).notes).region_0_claims_ms.len() as u64
    }

    /// Virtual milliseconds since the start at which the last of them arrived.
    fn latest_claim_from_region_0(&self, r: usize) -> Option<u64> {
        let store = self.region(r);
        lock(&store.notes).region_0_claims_ms.iter().max().copied()
    }
}

/// The memory store, noting every write the simulator ships to the other
/// region once the store accepted it: an acquired claim, a claim that marked
/// an expired lease, a completion, a release, a mark, a resolution.
struct Noting {
    clock: Arc<dyn Clock>,
    start: Timestamp,
    inner: MemoryStore,
    notes: Mutex<Notes>,
}

#[derive(Default)]
struct Notes {
    writes: u64,
    keys: BTreeSet<RecordId>,
    /// When claims owned by region 0's gateway reached this store.
    region_0_claims_ms: Vec<u64>,
}

impl Noting {
    fn note(&self, id: &RecordId) {
        let mut notes = lock(&self.notes);
        notes.writes += 1;
        notes.keys.insert(id.clone());
    }
}

impl StoreWrapper for Noting {
    const WATCHES_WRITES: bool = true;

    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    fn accepted(&self, write: Accepted<'_>) {
        match write {
            Accepted::Claim(req, claim) => {
                if req.owner.starts_with("r0/") {
                    let ms = self.start.millis_until(self.clock.now());
                    lock(&self.notes).region_0_claims_ms.push(ms);
                }
                if matches!(
                    claim,
                    Claim::Acquired { .. }
                        | Claim::OutcomeUnknown {
                            newly_marked: true,
                            ..
                        }
                ) {
                    self.note(&req.id);
                }
            }
            Accepted::Complete(id, _)
            | Accepted::Release(id, _)
            | Accepted::MarkAmbiguous(id, _)
            | Accepted::Resolve(id, _, _)
            | Accepted::Verb(id, _, _) => self.note(id),
            Accepted::NoteFailedLookup(..) | Accepted::NoteAmbiguity(..) => {}
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

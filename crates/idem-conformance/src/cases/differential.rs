//! Every answer is the reference store's: generated sequences of operations
//! over a few keys, applied step by step to the store under test and to a
//! fresh `MemoryStore` (the decision functions under one mutex) on a clock
//! moved in lockstep, must get equal answers. A fast path that answers
//! otherwise than the store would have (a claim answered from a read without
//! a lock, a completion in one statement, a cache of completed records) is
//! caught here, on a sequence that proptest has shrunk.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt::Debug;
use std::hash::{BuildHasher, Hasher};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_core::{
    Claim, ClaimRequest, Clock, JournalEntry, LEASE_MS_MIN, LIST_LIMIT_MAX, LeaseExpiry, ListQuery,
    LookupTries, ManualClock, MemoryStore, Outcome, Policy, PurgeReport, Record, RecordId,
    Resolution, State, Store, StoreError, Timestamp, Token, Verb, VerbRequest,
};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};

use super::support::{
    LEASE_MS, OWNER, RETENTION_MS, RETENTION_S, TOMBSTONE_MS, TOMBSTONE_S, fp, id, result,
};

/// Generated sequences per store. Each step is a round trip or two to a
/// real store: 128 sequences (20 steps on average) took 1.3-1.6 s against
/// PostgreSQL on the same host (up to 3.8 s with both cores busy) and
/// about 1 s against SQLite, debug builds.
/// With 8 sequences the stale claim caches of `tests/teeth.rs` escaped
/// about 1 run in 4; with 128, none did in 1000 runs each.
const CASES: u32 = 128;
/// Shrinking steps after a failure: enough to take a 40-step sequence down
/// to the few steps that matter (proptest's default, 4 per case, stops
/// short). Only a failing run pays for them.
const SHRINK_ITERS_MAX: u32 = 4_096;
/// How many steps a generated sequence has. Shrinking never goes below the
/// least, so it is one: a failure shrinks to the steps it needs.
const STEPS: RangeInclusive<usize> = 1..=40;
/// How far a plain clock step moves, in milliseconds: a tick, the short and
/// the long lease (and a tick short of it), retention, the tombstone horizon.
const ADVANCES_MS: [u64; 6] = [
    1,
    LEASE_MS_MIN,
    LEASE_MS - 1,
    LEASE_MS,
    RETENTION_MS,
    TOMBSTONE_MS,
];
/// A token no store hands out, presented for a key not acquired yet. The
/// pairing maps it to itself.
const UNISSUED: Token = Token(0);

/// Generated sequences of claims (two fingerprints, two leases, both lease
/// expiries), completions, releases, marks, resolutions, operators' verbs
/// and failed lookups with current or stale tokens, reads, purges and clock steps that land
/// before, at and after lease ends, retention and tombstone horizons, over
/// three records in two scopes: the store answers every step as the
/// reference store does. Tokens are compared through the pairing of the
/// two stores' acquisitions, since their values may differ.
///
/// A failure names the step, both answers, the shrunk sequence and the
/// `PROPTEST_RNG_SEED` that generates it again.
pub async fn every_answer_is_the_reference_stores<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let seed = seed();
    let config = Config {
        cases: CASES,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        max_shrink_iters: SHRINK_ITERS_MAX,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let handle = tokio::runtime::Handle::current();
    let runs = AtomicU64::new(0);
    let outcome = tokio::task::block_in_place(|| {
        runner
            .run(&steps(), |steps| {
                let run = runs.fetch_add(1, Ordering::Relaxed);
                handle.block_on(replay(&*store, &clock, run, &steps))
            })
            .map_err(|e| e.to_string())
    });
    if let Err(e) = outcome {
        panic!("the store answers otherwise than the reference (PROPTEST_RNG_SEED={seed}): {e}");
    }
}

/// One operation of a sequence, on both stores.
#[derive(Clone, Debug)]
enum Step {
    /// A claim.
    Claim(ClaimStep),
    /// An operation presenting the token of an acquisition of `slot`:
    /// `attempt` counts back from the newest (0 the newest, wrapping
    /// around); before any acquisition it presents [`UNISSUED`].
    Attempt {
        slot: Slot,
        attempt: u8,
        op: AttemptOp,
    },
    /// Reads the resolution journal of `slot`.
    Resolutions { slot: Slot },
    /// Reads the record of `slot`.
    Get { slot: Slot },
    /// Lists the sequence's records, in one state or all.
    List { state: Option<State> },
    /// Purges at most `limit` records.
    Purge { limit: usize },
    /// Claims and completions on distinct records, sent to the store at
    /// once (a store that batches writes carries them in one statement) and
    /// to the reference one after another: on distinct records their order
    /// changes no answer.
    Together(Vec<Concurrent>),
    /// Moves both clocks forward.
    Advance { ms: u64 },
    /// Moves both clocks to a horizon of the reference's record of `slot`,
    /// `offset_ms` from it; nothing when there is no such horizon or it is
    /// not ahead (the clocks only move forward).
    AdvanceTo {
        slot: Slot,
        horizon: Horizon,
        offset_ms: i64,
    },
}

/// One write of a [`Step::Together`].
#[derive(Clone, Debug)]
enum Concurrent {
    Claim(ClaimStep),
    /// Completes the acquisition `attempt` of `slot` (as in
    /// [`Step::Attempt`]) with `result(n)`.
    Complete {
        slot: Slot,
        attempt: u8,
        n: u8,
    },
}

/// The store's answer to a [`Concurrent`] write.
enum Answered {
    Claim(Result<Claim, StoreError>),
    Complete(Box<Result<Record, StoreError>>),
}

/// What an [`Step::Attempt`] does with the token it presents.
#[derive(Clone, Copy, Debug)]
enum AttemptOp {
    /// Completes with `result(n)`.
    Complete(u8),
    Release,
    MarkAmbiguous,
    Resolve(Verdict),
    /// Counts a failed lookup, the next one due `next_in_ms` from now.
    NoteFailedLookup {
        next_in_ms: u64,
    },
    /// Reads the failed lookups kept for the attempt.
    LookupTries,
    /// Applies an operator's verb (`expire`, `evict`).
    Verb(Verb),
}

/// A generated claim.
#[derive(Clone, Debug)]
struct ClaimStep {
    slot: Slot,
    /// The request's fingerprint: mostly 1, sometimes 2.
    fingerprint: u8,
    /// The request's fingerprint in the previous form, if it has one.
    legacy: Option<u8>,
    lease_ms: u64,
    on_lease_expiry: LeaseExpiry,
    region: Option<&'static str>,
}

/// One of the sequence's three records: two keys in one scope, and the
/// first key again in another scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    A1,
    A2,
    B1,
}

/// A resolution's finding.
#[derive(Clone, Copy, Debug)]
enum Verdict {
    /// Completed with `result(n)`.
    Completed(u8),
    NotExecuted,
}

/// A moment in a record's life that a clock step may land around.
#[derive(Clone, Copy, Debug)]
enum Horizon {
    LeaseEnd,
    Retention,
    Tombstone,
}

/// One sequence in progress: both stores, both clocks, and which
/// acquisitions happened.
struct Run<'a, S> {
    store: &'a S,
    clock: &'a ManualClock,
    reference: MemoryStore,
    reference_clock: ManualClock,
    ids: [RecordId; 3],
    /// The reference's token of every acquisition, per slot, oldest first.
    acquired: [Vec<Token>; 3],
    tokens: Tokens,
}

/// The pairing of the reference's tokens with the store's, one pair per
/// acquisition: a one-to-one map, so a store that hands one token out twice
/// is caught.
struct Tokens {
    to_store: HashMap<Token, Token>,
    to_reference: HashMap<Token, Token>,
}

/// An answer of the store under test, with its tokens put into the
/// reference's terms.
trait Translate: Sized {
    /// `self` with every token the store handed out replaced by the
    /// reference's token of the same acquisition; an error naming a token
    /// that no acquisition handed out.
    fn translate(self, tokens: &Tokens) -> Result<Self, String>;
}

/// The seed of this run: `PROPTEST_RNG_SEED` when set, so that a failure
/// can be generated again, and a fresh one otherwise.
fn seed() -> u64 {
    match Config::default().rng_seed {
        RngSeed::Fixed(seed) => seed,
        RngSeed::Random => RandomState::new().build_hasher().finish(),
    }
}

/// Runs one sequence (the `run`-th of the case) on a fresh reference; `Err`
/// names the first step answered otherwise.
async fn replay<S: Store>(
    store: &S,
    clock: &ManualClock,
    run: u64,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    drain(store, clock).await.map_err(TestCaseError::fail)?;
    let mut run = Run::new(store, clock, run);
    for (n, step) in steps.iter().enumerate() {
        if let Err(why) = run.step(step).await {
            return Err(TestCaseError::fail(format!("step {n}, {step:?}: {why}")));
        }
    }
    run.final_contents()
        .await
        .map_err(|why| TestCaseError::fail(format!("after the last step: {why}")))
}

/// Moves the clock past the tombstone horizon of every record an earlier
/// sequence completed and purges them all. The store is shared by the
/// case's sequences and a purge counts across all its records, so each
/// sequence starts with none a purge would touch; the earlier sequences'
/// unresolved records stay, under keys no later sequence uses.
async fn drain<S: Store>(store: &S, clock: &ManualClock) -> Result<(), String> {
    // A sequence completes at most three records: one purge takes them all
    // and the next finds nothing.
    const ROUNDS_MAX: usize = 3;
    clock.advance_millis(TOMBSTONE_MS);
    for _ in 0..ROUNDS_MAX {
        match store.purge(LIST_LIMIT_MAX).await {
            Ok(report) if report.changed_nothing() => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(format!("purging the earlier sequences' records: {e}")),
        }
    }
    Err(format!(
        "{ROUNDS_MAX} purges did not purge the earlier sequences' records"
    ))
}

impl<'a, S: Store> Run<'a, S> {
    /// A sequence on fresh keys (`run` tells them apart from the earlier
    /// sequences') and a fresh reference whose clock stands where `clock`
    /// does.
    fn new(store: &'a S, clock: &'a ManualClock, run: u64) -> Run<'a, S> {
        let reference_clock = ManualClock::new(clock.now());
        let scope = |tenant: &str| format!("POST /differential-{run}|{tenant}");
        Run {
            store,
            clock,
            reference: MemoryStore::new(Arc::new(reference_clock.clone())),
            reference_clock,
            ids: [
                id(&scope("tenant-a"), "k1"),
                id(&scope("tenant-a"), "k2"),
                id(&scope("tenant-b"), "k1"),
            ],
            acquired: Default::default(),
            tokens: Tokens::new(),
        }
    }

    async fn step(&mut self, step: &Step) -> Result<(), String> {
        match *step {
            Step::Claim(ref claim) => self.claim(claim).await,
            Step::Attempt { slot, attempt, op } => self.attempt_step(slot, attempt, op).await,
            Step::Resolutions { slot } => {
                let id = self.id(slot);
                let expect = self.reference.resolutions(id).await;
                self.same(expect, self.store.resolutions(id).await)
            }
            Step::Get { slot } => {
                let id = self.id(slot);
                self.same(self.reference.get(id).await, self.store.get(id).await)
            }
            Step::List { state } => self.list(state).await,
            Step::Together(ref writes) => self.together(writes).await,
            Step::Purge { limit } => {
                let expect = self.reference.purge(limit).await;
                self.same(expect, self.store.purge(limit).await)
            }
            Step::Advance { ms } => {
                self.advance_to(self.clock.now().plus_millis(ms));
                Ok(())
            }
            Step::AdvanceTo {
                slot,
                horizon,
                offset_ms,
            } => {
                let record = self.reference.get(self.id(slot)).await;
                if let Some(at) = record.ok().flatten().and_then(|r| horizon.of(&r)) {
                    let at = at.as_millis().saturating_add_signed(offset_ms);
                    self.advance_to(Timestamp::from_millis(at));
                }
                Ok(())
            }
        }
    }

    /// A claim; when both acquire, their tokens are paired.
    async fn claim(&mut self, claim: &ClaimStep) -> Result<(), String> {
        let request = claim.request(self.id(claim.slot));
        let expect = self.reference.claim(&request).await;
        let got = self.store.claim(&request).await;
        if let (
            Ok(Claim::Acquired { token: mine, .. }),
            Ok(Claim::Acquired { token: theirs, .. }),
        ) = (&expect, &got)
        {
            self.tokens.pair(*mine, *theirs)?;
            self.acquired[claim.slot.index()].push(*mine);
        }
        self.same(expect, got)
    }

    /// Writes on distinct records: all at once to the store, then one by
    /// one to the reference, each answer compared with its own.
    async fn together(&mut self, writes: &[Concurrent]) -> Result<(), String> {
        let answers = futures_util::future::join_all(writes.iter().map(|write| async {
            match write {
                Concurrent::Claim(claim) => {
                    let request = claim.request(self.id(claim.slot));
                    Answered::Claim(self.store.claim(&request).await)
                }
                Concurrent::Complete { slot, attempt, n } => {
                    let (id, _, theirs) = self.attempt(*slot, *attempt);
                    Answered::Complete(Box::new(self.store.complete(id, theirs, result(*n)).await))
                }
            }
        }))
        .await;
        for (n, (write, got)) in writes.iter().zip(answers).enumerate() {
            let at = |why: String| format!("write {n} of the round, {write:?}: {why}");
            match (write, got) {
                (Concurrent::Claim(claim), Answered::Claim(got)) => {
                    let request = claim.request(self.id(claim.slot));
                    let expect = self.reference.claim(&request).await;
                    if let (
                        Ok(Claim::Acquired { token: mine, .. }),
                        Ok(Claim::Acquired { token: theirs, .. }),
                    ) = (&expect, &got)
                    {
                        self.tokens.pair(*mine, *theirs).map_err(at)?;
                        self.acquired[claim.slot.index()].push(*mine);
                    }
                    self.same(expect, got).map_err(at)?;
                }
                (&Concurrent::Complete { slot, attempt, n }, Answered::Complete(got)) => {
                    let (id, mine, _) = self.attempt(slot, attempt);
                    let expect = self.reference.complete(id, mine, result(n)).await;
                    self.same(expect, *got).map_err(at)?;
                }
                _ => unreachable!("each write is answered in kind"),
            }
        }
        Ok(())
    }

    /// A step presenting the token of an attempt: each store gets its own
    /// token of that acquisition.
    async fn attempt_step(&self, slot: Slot, attempt: u8, op: AttemptOp) -> Result<(), String> {
        let (id, mine, theirs) = self.attempt(slot, attempt);
        let (reference, store) = (&self.reference, self.store);
        match op {
            AttemptOp::Complete(n) => {
                let expect = reference.complete(id, mine, result(n)).await;
                self.same(expect, store.complete(id, theirs, result(n)).await)
            }
            AttemptOp::Release => {
                let expect = reference.release(id, mine).await;
                self.same(expect, store.release(id, theirs).await)
            }
            AttemptOp::MarkAmbiguous => {
                let expect = reference.mark_ambiguous(id, mine).await;
                self.same(expect, store.mark_ambiguous(id, theirs).await)
            }
            AttemptOp::Resolve(verdict) => {
                let expect = reference.resolve(id, mine, verdict.resolution()).await;
                self.same(
                    expect,
                    store.resolve(id, theirs, verdict.resolution()).await,
                )
            }
            AttemptOp::NoteFailedLookup { next_in_ms } => {
                let next_at = self.clock.now().plus_millis(next_in_ms);
                let expect = reference.note_failed_lookup(id, mine, next_at).await;
                self.same(expect, store.note_failed_lookup(id, theirs, next_at).await)
            }
            AttemptOp::LookupTries => {
                let expect = reference.lookup_tries(id, mine).await;
                self.same(expect, store.lookup_tries(id, theirs).await)
            }
            AttemptOp::Verb(verb) => {
                let request = || VerbRequest::new(verb, OWNER, "differential").unwrap();
                let expect = reference.apply_verb(id, mine, request()).await;
                self.same(expect, store.apply_verb(id, theirs, request()).await)
            }
        }
    }

    /// A listing, compared on the sequence's own records: the store also
    /// holds the earlier sequences'.
    async fn list(&self, state: Option<State>) -> Result<(), String> {
        let query = ListQuery {
            state,
            ..ListQuery::default()
        };
        let expect = self.reference.list(&query).await.map(|l| l.records);
        let got = match self.store.list(&query).await {
            Ok(listing) if !listing.damaged.is_empty() => {
                return Err(format!(
                    "the store lists damaged rows: {:?}",
                    listing.damaged
                ));
            }
            Ok(listing) => Ok(listing
                .records
                .into_iter()
                .filter(|r| self.ids.contains(&r.id))
                .collect()),
            Err(e) => Err(e),
        };
        self.same(expect, got)
    }

    /// Every record and journal of the sequence, once its steps are done.
    async fn final_contents(&self) -> Result<(), String> {
        for id in &self.ids {
            self.same(self.reference.get(id).await, self.store.get(id).await)?;
            let expect = self.reference.resolutions(id).await;
            self.same(expect, self.store.resolutions(id).await)?;
        }
        Ok(())
    }

    fn id(&self, slot: Slot) -> &RecordId {
        &self.ids[slot.index()]
    }

    /// The record of `slot` and the reference's and the store's token of
    /// the acquisition `attempt` names.
    fn attempt(&self, slot: Slot, attempt: u8) -> (&RecordId, Token, Token) {
        let acquired = &self.acquired[slot.index()];
        let mine = match acquired.len() {
            0 => UNISSUED,
            n => acquired[n - 1 - usize::from(attempt) % n],
        };
        (self.id(slot), mine, self.tokens.store_token(mine))
    }

    /// Moves both clocks to `at`, if it is ahead.
    fn advance_to(&self, at: Timestamp) {
        if at > self.clock.now() {
            self.clock.set(at);
            self.reference_clock.set(at);
        }
    }

    /// `Ok` when the store's answer, translated, is the reference's.
    fn same<T>(&self, expect: T, got: T) -> Result<(), String>
    where
        T: Translate + PartialEq + Debug + Clone,
    {
        let got = match got.clone().translate(&self.tokens) {
            Ok(translated) => translated,
            Err(why) => {
                return Err(format!(
                    "{why}: the reference answered {expect:?}, the store {got:?}"
                ));
            }
        };
        if got == expect {
            return Ok(());
        }
        Err(format!(
            "the reference answered {expect:?}, the store (its tokens translated) {got:?}"
        ))
    }
}

impl ClaimStep {
    fn request(&self, id: &RecordId) -> ClaimRequest {
        ClaimRequest {
            id: id.clone(),
            fingerprint: fp(self.fingerprint),
            legacy_fingerprint: self.legacy.map(fp),
            owner: OWNER.to_owned(),
            region: self.region.map(str::to_owned),
            policy: Policy::new(
                self.lease_ms,
                RETENTION_S,
                TOMBSTONE_S,
                self.on_lease_expiry,
            )
            .unwrap(),
        }
    }
}

impl Slot {
    fn index(self) -> usize {
        match self {
            Slot::A1 => 0,
            Slot::A2 => 1,
            Slot::B1 => 2,
        }
    }
}

impl Verdict {
    fn resolution(self) -> Resolution {
        let outcome = match self {
            Verdict::Completed(n) => Outcome::Completed { result: result(n) },
            Verdict::NotExecuted => Outcome::NotExecuted,
        };
        Resolution::new(outcome, "operator", "checked the ledger").unwrap()
    }
}

impl Horizon {
    fn of(self, record: &Record) -> Option<Timestamp> {
        match self {
            Horizon::LeaseEnd => Some(record.lease_until),
            Horizon::Retention => record.expires_at,
            Horizon::Tombstone => record.tombstone_until,
        }
    }
}

impl Tokens {
    fn new() -> Tokens {
        Tokens {
            to_store: HashMap::from([(UNISSUED, UNISSUED)]),
            to_reference: HashMap::from([(UNISSUED, UNISSUED)]),
        }
    }

    /// Pairs the tokens both stores handed out for one acquisition.
    fn pair(&mut self, mine: Token, theirs: Token) -> Result<(), String> {
        if let Some(earlier) = self.to_reference.get(&theirs) {
            return Err(format!(
                "the store handed out token {} again (the reference's {} and {})",
                theirs.0, earlier.0, mine.0
            ));
        }
        self.to_store.insert(mine, theirs);
        self.to_reference.insert(theirs, mine);
        Ok(())
    }

    /// The store's token for the reference's `mine`, which is paired: every
    /// token presented is [`UNISSUED`] or was handed out by both stores.
    fn store_token(&self, mine: Token) -> Token {
        self.to_store.get(&mine).copied().unwrap_or(mine)
    }
}

impl Translate for Token {
    fn translate(self, tokens: &Tokens) -> Result<Token, String> {
        match tokens.to_reference.get(&self) {
            Some(mine) => Ok(*mine),
            None => Err(format!(
                "the store answers with token {}, which no acquisition handed out",
                self.0
            )),
        }
    }
}

impl Translate for () {
    fn translate(self, _: &Tokens) -> Result<(), String> {
        Ok(())
    }
}

impl Translate for PurgeReport {
    fn translate(self, _: &Tokens) -> Result<PurgeReport, String> {
        Ok(self)
    }
}

impl Translate for Record {
    fn translate(self, tokens: &Tokens) -> Result<Record, String> {
        let token = self.token.translate(tokens)?;
        Ok(Record { token, ..self })
    }
}

impl Translate for JournalEntry {
    fn translate(self, tokens: &Tokens) -> Result<JournalEntry, String> {
        let token = self.token.translate(tokens)?;
        Ok(JournalEntry { token, ..self })
    }
}

impl Translate for LookupTries {
    fn translate(self, tokens: &Tokens) -> Result<LookupTries, String> {
        let token = self.token.translate(tokens)?;
        Ok(LookupTries { token, ..self })
    }
}

impl Translate for Claim {
    fn translate(self, tokens: &Tokens) -> Result<Claim, String> {
        Ok(match self {
            Claim::Acquired {
                token,
                lease_until,
                lease_ms,
                took_over,
            } => Claim::Acquired {
                token: token.translate(tokens)?,
                lease_until,
                lease_ms,
                took_over: took_over.translate(tokens)?,
            },
            Claim::Replay { record } => Claim::Replay {
                record: Box::new(record.translate(tokens)?),
            },
            other => other,
        })
    }
}

impl Translate for StoreError {
    fn translate(self, tokens: &Tokens) -> Result<StoreError, String> {
        Ok(match self {
            StoreError::Fenced {
                id,
                presented,
                current,
            } => StoreError::Fenced {
                id,
                presented: presented.translate(tokens)?,
                current: match current {
                    Some((token, state)) => Some((token.translate(tokens)?, state)),
                    None => None,
                },
            },
            StoreError::MayStillCommit { id, token, until } => StoreError::MayStillCommit {
                id,
                token: token.translate(tokens)?,
                until,
            },
            other => other,
        })
    }
}

impl<T: Translate> Translate for Option<T> {
    fn translate(self, tokens: &Tokens) -> Result<Option<T>, String> {
        self.map(|value| value.translate(tokens)).transpose()
    }
}

impl<T: Translate> Translate for Vec<T> {
    fn translate(self, tokens: &Tokens) -> Result<Vec<T>, String> {
        self.into_iter()
            .map(|value| value.translate(tokens))
            .collect()
    }
}

impl<T: Translate> Translate for Result<T, StoreError> {
    fn translate(self, tokens: &Tokens) -> Result<Result<T, StoreError>, String> {
        Ok(match self {
            Ok(value) => Ok(value.translate(tokens)?),
            Err(e) => Err(e.translate(tokens)?),
        })
    }
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(step(), STEPS)
}

/// Claims most often, then the steps that change a record, then reads and
/// clock steps; a step aimed at a record in the wrong state is as useful as
/// one that applies, since refusals are answers too.
fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => claim().prop_map(Step::Claim),
        8 => (slot(), attempt(), attempt_op())
            .prop_map(|(slot, attempt, op)| Step::Attempt { slot, attempt, op }),
        1 => slot().prop_map(|slot| Step::Resolutions { slot }),
        1 => slot().prop_map(|slot| Step::Get { slot }),
        1 => proptest::option::of(state()).prop_map(|state| Step::List { state }),
        2 => select(vec![0, 1, 2, 100]).prop_map(|limit| Step::Purge { limit }),
        2 => select(ADVANCES_MS.to_vec()).prop_map(|ms| Step::Advance { ms }),
        3 => together().prop_map(Step::Together),
        4 => (slot(), horizon(), -1..=1i64).prop_map(|(slot, horizon, offset_ms)| {
            Step::AdvanceTo { slot, horizon, offset_ms }
        }),
    ]
}

/// At most one write per record, on two or three of them.
fn together() -> impl Strategy<Value = Vec<Concurrent>> {
    let write = |slot: Slot| {
        prop_oneof![
            claim().prop_map(move |claim| Concurrent::Claim(ClaimStep { slot, ..claim })),
            (attempt(), 1..=2u8).prop_map(move |(attempt, n)| Concurrent::Complete {
                slot,
                attempt,
                n
            }),
        ]
    };
    (
        proptest::option::weighted(0.8, write(Slot::A1)),
        proptest::option::weighted(0.8, write(Slot::A2)),
        proptest::option::weighted(0.8, write(Slot::B1)),
    )
        .prop_map(|(a1, a2, b1)| [a1, a2, b1].into_iter().flatten().collect())
}

/// Completions most often: replays, retention and tombstones need them.
fn attempt_op() -> impl Strategy<Value = AttemptOp> {
    prop_oneof![
        3 => (1..=2u8).prop_map(AttemptOp::Complete),
        1 => Just(AttemptOp::Release),
        1 => Just(AttemptOp::MarkAmbiguous),
        2 => verdict().prop_map(AttemptOp::Resolve),
        1 => select(vec![0, LEASE_MS, RETENTION_MS])
            .prop_map(|next_in_ms| AttemptOp::NoteFailedLookup { next_in_ms }),
        1 => Just(AttemptOp::LookupTries),
        1 => select(vec![Verb::Expire, Verb::Evict]).prop_map(AttemptOp::Verb),
    ]
}

fn claim() -> impl Strategy<Value = ClaimStep> {
    (
        slot(),
        prop_oneof![4 => Just(1u8), 1 => Just(2u8)],
        proptest::option::weighted(0.2, 1..=2u8),
        select(vec![LEASE_MS, LEASE_MS_MIN]),
        prop_oneof![Just(LeaseExpiry::Reconcile), Just(LeaseExpiry::Takeover)],
        proptest::option::of(Just("eu-west-1")),
    )
        .prop_map(
            |(slot, fingerprint, legacy, lease_ms, on_lease_expiry, region)| ClaimStep {
                slot,
                fingerprint,
                legacy,
                lease_ms,
                on_lease_expiry,
                region,
            },
        )
}

/// Mostly one record, so that sequences reach deep into its life (a
/// replay, retention, the tombstone horizon); the others less often, enough
/// to catch answers taken from the wrong key or scope.
fn slot() -> impl Strategy<Value = Slot> {
    prop_oneof![3 => Just(Slot::A1), 1 => Just(Slot::A2), 1 => Just(Slot::B1)]
}

/// Mostly the newest acquisition, sometimes one or two before it.
fn attempt() -> impl Strategy<Value = u8> {
    prop_oneof![3 => Just(0u8), 1 => 1..=2u8]
}

fn verdict() -> impl Strategy<Value = Verdict> {
    prop_oneof![
        (1..=2u8).prop_map(Verdict::Completed),
        Just(Verdict::NotExecuted)
    ]
}

fn horizon() -> impl Strategy<Value = Horizon> {
    prop_oneof![
        Just(Horizon::LeaseEnd),
        Just(Horizon::Retention),
        Just(Horizon::Tombstone)
    ]
}

fn state() -> impl Strategy<Value = State> {
    prop_oneof![
        Just(State::InProgress),
        Just(State::Completed),
        Just(State::Ambiguous),
        Just(State::Tombstone),
    ]
}

//! An exhaustive check of idem's protocol at a small bound: every
//! interleaving of retrying clients, gateways that crash or stall, an
//! upstream that commits before or after it answers, a clock, a reconciler,
//! an operator and the purge, where every step that touches the record calls
//! the production functions of `idem_core::decision`. The explorer is
//! `stateright`'s breadth-first checker, on one thread, and each safety
//! property is reported at the first world found breaking it, so a
//! counterexample is a shortest trace.
//!
//! A claim is either made under the store's lock in one step, or through
//! the stores' fast path: a read that takes no lock, its record and clock
//! possibly from different moments with any steps in between, answered by
//! `decision::answer_without_write` when the claim writes nothing and
//! otherwise claimed under the lock ([`Bound::fast_path_clients`] says
//! which clients may use it).
//!
//! ```
//! use idem_model::{Bound, Protocol, check};
//!
//! let report = check(Protocol::Real, Bound { depth_max: 6, ..Bound::DEFAULT })?;
//! assert!(report.violations.is_empty());
//! # Ok::<(), idem_model::ModelError>(())
//! ```

mod trace;
mod world;

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use idem_core::decision::{self, Claim, ClaimRequest, Write};
use idem_core::{
    Fingerprint, IdempotencyKey, LeaseExpiry, Outcome, Policy, RecordId, Resolution, Scope,
    StoreError, StoredResult, Timestamp, Token,
};
use stateright::{Checker, Model, Property};

pub use world::{
    Action, Answer, Attempt, Client, Effect, Gateway, Kept, Read, ReadFirst, Receipt, Resolver,
    Told, Verdict, World,
};

/// The protocol the model runs: the real one, or a mutant the checker must
/// catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// The decision functions as shipped, on a route with the defaults'
    /// shape (lease expiry reconciled, tombstone outliving the replay
    /// horizon), and resolvers that ask the provider only once the
    /// attempt's lease is over, the rule `decision::resolve` relies on.
    Real,
    /// As `Real`, but a "not found" is trusted whenever it was asked (the
    /// reconciler before `verdict::verdict` took the time of the question):
    /// one asked before the lease ended and resolved after it releases an
    /// attempt that committed in between. The defect this checker found.
    LookupDuringLease,
    /// The reconciler race before the hardening fix: resolvers ask the
    /// provider at any time and a "not executed" verdict is accepted while
    /// the attempt's lease runs (the resolve is judged as if its lease
    /// were over).
    ResolveSkipsLease,
    /// A resolve fenced by the token of whatever attempt holds the record
    /// now instead of the one the verdict is about.
    ResolveIgnoresToken,
    /// A store that claims as if no record existed, so every claim answers
    /// `Acquired`.
    AcquiresTwice,
    /// An expired lease taken over on a route whose upstream does not
    /// deduplicate by the key.
    TakeoverWithoutDedup,
    /// A tombstone horizon shorter than the clients' replay horizon.
    ShortTombstone,
    /// A failed lookup (an error status, a timeout) read as "found", with
    /// whatever the failed answer carried as the result.
    FailureAsFound,
    /// A failed lookup read as "not found".
    FailureAsNotFound,
    /// An unlocked fast path that answers every claim from its read, even
    /// one that must write: a new acquisition or a takeover is answered
    /// `Acquired` and the store's write is never made.
    FastPathAnswersAcquire,
    /// A fast path whose fallback claims under the lock but decides on the
    /// unlocked read instead of reading the record again: a record written
    /// since the read is overwritten.
    LockedClaimOnStaleRead,
    /// A gateway that starts the forward's timeout when the store's answer
    /// arrives, not from the claim's sending: a late answer forwards on a
    /// lease that may be over (the defect of a fixed response timeout).
    ForwardOnStaleLease,
    /// A waiter woken after the attempt it waited for released the key
    /// forwards its request without a claim of its own (it takes the wake
    /// for permission), so nothing stops another client's claim.
    WaiterForwardsUnclaimed,
    /// A waiter whose attempt turned ambiguous while it waited takes the
    /// unknown outcome for "not done" and runs the request itself, without
    /// a claim (it never saw 409 again, so it "retries").
    WaiterRunsUnknown,
    /// A retry's inline lookup trusts a "not found" whenever it was asked,
    /// as if its question came after the lease: the defect
    /// `lookup-during-lease` was for the reconciler, on the new path.
    InlineLookupDuringLease,
    /// After the store lost the key's record (a failover, a restore), a
    /// fresh claim inside the suspect window is forwarded without asking
    /// the provider: the check skipped. Caught only at bounds with
    /// [`Bound::tail_losses`].
    WindowSkipsCheck,
    /// A store that, opening the suspect window again while it is open,
    /// keeps the guard on a "not found" counting from the first loss: an
    /// attempt claimed after the first loss and forgotten by the second
    /// may still commit when a retry's lookup is trusted. Caught only at
    /// bounds where the store may lose its record twice.
    WindowKeepsFirstLoss,
    /// A replay cache that judges a kept completed record's expiry by a
    /// reading of the store's clock that lags behind it (the database's
    /// last reading, not moved on by the time since): past the record's
    /// retention it still answers a replay where the store answers a late
    /// replay.
    CacheClockBehind,
    /// A store that batches commits and answers a batch's claims before
    /// the batch commits: when the commit then never lands (the server
    /// dies, the connection breaks), the gateway forwards on a claim the
    /// store does not hold, and the next claim of the key acquires again.
    BatchAnswersBeforeCommit,
}

impl Protocol {
    /// Every protocol, the real one first.
    pub const ALL: [Protocol; 19] = [
        Protocol::Real,
        Protocol::LookupDuringLease,
        Protocol::ResolveSkipsLease,
        Protocol::ResolveIgnoresToken,
        Protocol::AcquiresTwice,
        Protocol::TakeoverWithoutDedup,
        Protocol::ShortTombstone,
        Protocol::FailureAsFound,
        Protocol::FailureAsNotFound,
        Protocol::FastPathAnswersAcquire,
        Protocol::LockedClaimOnStaleRead,
        Protocol::ForwardOnStaleLease,
        Protocol::WaiterForwardsUnclaimed,
        Protocol::WaiterRunsUnknown,
        Protocol::InlineLookupDuringLease,
        Protocol::WindowSkipsCheck,
        Protocol::WindowKeepsFirstLoss,
        Protocol::CacheClockBehind,
        Protocol::BatchAnswersBeforeCommit,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Real => "real",
            Protocol::LookupDuringLease => "lookup-during-lease",
            Protocol::ResolveSkipsLease => "resolve-skips-lease",
            Protocol::ResolveIgnoresToken => "resolve-ignores-token",
            Protocol::AcquiresTwice => "acquires-twice",
            Protocol::TakeoverWithoutDedup => "takeover-without-dedup",
            Protocol::ShortTombstone => "short-tombstone",
            Protocol::FailureAsFound => "failure-as-found",
            Protocol::FailureAsNotFound => "failure-as-not-found",
            Protocol::FastPathAnswersAcquire => "fast-path-answers-acquire",
            Protocol::LockedClaimOnStaleRead => "locked-claim-on-stale-read",
            Protocol::ForwardOnStaleLease => "forward-on-stale-lease",
            Protocol::WaiterForwardsUnclaimed => "waiter-forwards-unclaimed",
            Protocol::WaiterRunsUnknown => "waiter-runs-unknown",
            Protocol::InlineLookupDuringLease => "inline-lookup-during-lease",
            Protocol::WindowSkipsCheck => "window-skips-check",
            Protocol::WindowKeepsFirstLoss => "window-keeps-first-loss",
            Protocol::CacheClockBehind => "cache-clock-behind",
            Protocol::BatchAnswersBeforeCommit => "batch-answers-before-commit",
        }
    }

    /// The protocol named `name`, if any.
    pub fn from_name(name: &str) -> Option<Protocol> {
        Protocol::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// How far the checker looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// Clients sending the same request under the one key.
    pub clients: usize,
    /// Requests each client sends at most (the first and its retries).
    pub requests_per_client: usize,
    /// Clients that may also claim through the unlocked fast path (the
    /// first ones); every client may claim under the lock. The clients
    /// being alike, one covers every trace in which one client reads
    /// without the lock; two add the traces where both do, at 1.6 times
    /// the states.
    pub fast_path_clients: usize,
    /// Clients whose claims' answers may also reach the gateway late, some
    /// steps after the store's commit (the first ones); every client may
    /// get its answer at once. One client late covers the gap between a
    /// commit and its answer for the attempt a second client then races.
    pub late_answer_clients: usize,
    /// Clients whose request, told another attempt holds the key, may wait
    /// and ask the claim again (the first ones), as `Prefer: wait` does.
    pub waiting_clients: usize,
    /// Clients whose request, told the outcome is unknown, may have the
    /// retry's inline lookup settle it and ask again (the first ones).
    pub settling_clients: usize,
    /// How many times the store may lose its record of the key (a hard
    /// failover to a standby without the last writes, a restore, a
    /// failback), each loss opening or extending the suspect window in
    /// which fresh claims are verified with the provider.
    pub tail_losses: usize,
    /// How deep the checker looks, the start being at depth 1: states
    /// this deep are neither checked nor expanded, so depth 12 checks
    /// every trace of up to 10 steps.
    pub depth_max: usize,
    /// The most states the checker generates before it stops, explored or
    /// not: the bound on its memory (see [`STATES_MAX`]). A check that
    /// stops there says so ([`Report::capped`]) and proves nothing past
    /// the states it reached.
    pub states_max: usize,
}

/// The default [`Bound::states_max`]: 20 million generated states, about
/// 12 GiB of the checker's memory at the default actors (measured: the
/// peak RSS was 0.60–0.65 KiB per generated state for `acquires-twice` at
/// depths 12 and 13), so that a deep run on a 24 GiB machine stops with a
/// message instead of being killed.
pub const STATES_MAX: usize = 20_000_000;

impl Bound {
    /// The bound `cargo test` checks: two clients, two requests each, one
    /// of them on the fast path, and deep enough for the shortest trace of
    /// every mutant.
    pub const DEFAULT: Bound = Bound {
        clients: 2,
        requests_per_client: 2,
        fast_path_clients: 1,
        late_answer_clients: 1,
        waiting_clients: 1,
        settling_clients: 1,
        tail_losses: 0,
        depth_max: 12,
        states_max: STATES_MAX,
    };

    /// The bound of the lost tail: two clients, two requests each, the
    /// store losing its record twice (the second loss inside the window
    /// the first opened); no fast path, late answers, waiters
    /// or inline lookups, which the default bound covers.
    pub const LOST_TAIL: Bound = Bound {
        clients: 2,
        requests_per_client: 2,
        fast_path_clients: 0,
        late_answer_clients: 0,
        waiting_clients: 0,
        settling_clients: 0,
        tail_losses: 2,
        depth_max: 12,
        states_max: STATES_MAX,
    };
}

/// Why a model could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelError {
    /// A fixed input of the model was refused by the core (a key, scope,
    /// policy or result); the message says which.
    Input(String),
    /// The bound allows more effects than the model can name (255).
    BoundTooLarge {
        /// Clients times requests per client.
        requests: usize,
    },
}

/// The names of the properties, as counterexamples report them.
pub mod property {
    /// At most one effect per key.
    pub const ONE_EFFECT: &str = "at most one effect per key";
    /// Every replay carries the one effect's answer.
    pub const REPLAY_IS_THE_EFFECT: &str = "a replay returns the one effect's answer";
    /// Every success a client was told names a committed effect.
    pub const NO_SUCCESS_WITHOUT_EFFECT: &str = "no acknowledged success without an effect";
    /// Every verdict changed the attempt it judged.
    pub const VERDICT_ON_ITS_ATTEMPT: &str = "no verdict lands on another attempt";
    /// Every ambiguous record can still be resolved: a verdict that tells
    /// the truth about the attempt holding it, given by an operator once
    /// its lease is over, is accepted by the store.
    pub const UNKNOWN_CAN_END_RESOLVED: &str = "every unknown outcome can still end resolved";
    /// Wherever the fast path answers a claim without the lock, for the
    /// record and the clock as they are, the locked claim there gives the
    /// same answer and writes nothing: `decision::answer_without_write`'s
    /// contract, in every reachable world.
    pub const FAST_PATH_IS_THE_CLAIM: &str =
        "an unlocked answer is the locked claim's, which writes nothing";
    /// Wherever the store holds the key completed, the replay cache's
    /// answer from it (the production `ReplayCache`), judged at any clock
    /// the cache may judge by (the store's now, or a bound above it), is
    /// the locked claim's there, which writes nothing.
    pub const CACHE_IS_THE_CLAIM: &str =
        "a replay from memory is the locked claim's, which writes nothing";
    /// No effect commits at or after its attempt's lease end (I8, docs/contract.md).
    pub const FORWARD_WITHIN_LEASE: &str = "a forward never outlives the lease the store granted";
    /// Reachability: a claim's answer arrives with too little of its lease
    /// left, and nothing is forwarded.
    pub const LATE_ANSWER_REFUSED: &str = "a late answer is refused";
    /// Reachability: an unknown outcome ends resolved.
    pub const UNKNOWN_ENDS_RESOLVED: &str = "an unknown outcome is resolved";
    /// Reachability: a failed lookup is counted in the store.
    pub const LOOKUP_FAILS: &str = "a failed lookup is counted";
    /// Reachability: a retry is answered by a replay.
    pub const RETRY_REPLAYS: &str = "a retry can be answered by a replay";
    /// Reachability: a waiter asks again and is answered by a replay.
    pub const WAITER_REPLAYED: &str = "a waiter is answered by a replay";
    /// Reachability: a retry's inline lookup resolves the unknown outcome
    /// and the claim after it replays or acquires.
    pub const SETTLED_ON_RETRY: &str = "a retry settles an unknown outcome itself";
    /// Reachability: the fast path answers from a read whose record or
    /// clock is no longer the store's.
    pub const STALE_READ_ANSWERED: &str = "a stale unlocked read can be answered";
    /// Reachability (at bounds with a lost tail): a key the store forgot is
    /// answered with the provider's answer inside the suspect window.
    pub const VERIFIED_REPLAY: &str = "a forgotten key is answered from the provider";
}

/// What one check found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The protocol checked.
    pub protocol: Protocol,
    /// The bound it was checked at.
    pub bound: Bound,
    /// States generated, with repeats.
    pub states: usize,
    /// Distinct states.
    pub unique_states: usize,
    /// The deepest step reached.
    pub depth_reached: usize,
    /// Safety properties violated, each with its shortest trace.
    pub violations: Vec<Violation>,
    /// Reachability properties with no example within the bound: the bound
    /// is too small to say much, whatever the violations.
    pub unreached: Vec<&'static str>,
    /// Wall time of the check.
    pub elapsed: Duration,
    /// Whether the check stopped at [`Bound::states_max`] before it had
    /// explored the whole bound: no violation then means none among the
    /// states reached, not none within the bound.
    pub capped: bool,
}

/// A safety property and the trace that breaks it.
#[derive(Clone, Debug)]
pub struct Violation {
    /// Its name (see [`property`]).
    pub property: &'static str,
    /// Steps from the start to the first world that breaks it.
    pub steps: usize,
    /// The steps from the start, one per line, each with the world after it.
    pub trace: String,
}

/// The model: the fixed inputs every transition passes to the decision
/// functions, and the protocol variant.
pub struct IdemModel {
    protocol: Protocol,
    bound: Bound,
    start: Timestamp,
    id: RecordId,
    pub(crate) request: ClaimRequest,
    /// The upstream's answer for each effect: status 201, body the effect's index.
    results: Vec<StoredResult>,
    not_found: Resolution,
    /// What a failed lookup answered (an error page): effect index 255,
    /// which no bound commits.
    failed_body: StoredResult,
    /// The safety properties already found broken (see
    /// [`IdemModel::first_break`]).
    broken: Mutex<HashSet<&'static str>>,
}

/// The lease every attempt gets, in milliseconds.
pub const LEASE_MS: u64 = 100;
/// How long clients keep retrying, from the start, in milliseconds. A
/// tombstone (2 s from completion) outlives it with no margin for a record
/// completed at the start.
pub const REPLAY_HORIZON_MS: u64 = 2_000;
/// Failed lookups of one attempt before the reconciler leaves it to the
/// operator.
pub const MAX_TRIES: u32 = 2;
/// The reconciler's backoff after a failed lookup, in milliseconds.
pub const BACKOFF_MS: u64 = 50;

impl IdemModel {
    /// The model of `protocol` at `bound`.
    pub fn new(protocol: Protocol, bound: Bound) -> Result<IdemModel, ModelError> {
        let input = |e: &dyn std::fmt::Display| ModelError::Input(e.to_string());
        let requests = bound.clients.saturating_mul(bound.requests_per_client);
        if requests > usize::from(u8::MAX) {
            return Err(ModelError::BoundTooLarge { requests });
        }
        let (tombstone_s, expiry) = match protocol {
            Protocol::ShortTombstone => (1, LeaseExpiry::Reconcile),
            Protocol::TakeoverWithoutDedup => (2, LeaseExpiry::Takeover),
            _ => (2, LeaseExpiry::Reconcile),
        };
        let policy = Policy::new(LEASE_MS, 1, tombstone_s, expiry).map_err(|e| input(&e))?;
        let id = RecordId {
            scope: Scope::from_parts("POST /payouts", "tenant", None).map_err(|e| input(&e))?,
            key: IdempotencyKey::parse("payout-1").map_err(|e| input(&e))?,
        };
        let mut results = Vec::with_capacity(requests);
        for effect in 0..requests {
            let body = vec![u8::try_from(effect).unwrap_or(u8::MAX)];
            results.push(StoredResult::new(201, vec![], body).map_err(|e| input(&e))?);
        }
        let failed_body = StoredResult::new(502, vec![], vec![u8::MAX]).map_err(|e| input(&e))?;
        let not_found = Resolution::new(Outcome::NotExecuted, "resolver", "not found")
            .map_err(|e| input(&e))?;
        Ok(IdemModel {
            protocol,
            bound,
            start: Timestamp::from_millis(1_000_000),
            request: ClaimRequest {
                id: id.clone(),
                fingerprint: Fingerprint::from_bytes([1; 32]),
                legacy_fingerprint: None,
                owner: "gateway".into(),
                region: None,
                policy,
            },
            id,
            results,
            not_found,
            failed_body,
            broken: Mutex::new(HashSet::new()),
        })
    }

    /// The protocol this model runs.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Clients send no request at or after this time, and every request
    /// sent has taken effect at the store before it (its unlocked read and
    /// the claim that ends it included).
    pub fn replay_horizon(&self) -> Timestamp {
        self.start.plus_millis(REPLAY_HORIZON_MS)
    }

    /// Milliseconds from the model's start to `t`, for traces.
    pub fn since_start_ms(&self, t: Timestamp) -> u64 {
        self.start.millis_until(t)
    }

    /// What the provider's answer asks for: the production
    /// `verdict::verdict`, except in the variants that trust a "not found"
    /// whenever it was asked (judged as if asked at the lease end).
    fn verdict(
        &self,
        answer: Answer,
        asked_at: Timestamp,
        lease_until: Timestamp,
        inline: bool,
    ) -> idem_core::verdict::Verdict {
        use idem_core::verdict::{LookupAnswer, verdict};
        let answer = match (answer, self.protocol) {
            (Answer::Found(effect), _) => match self.results.get(effect) {
                Some(result) => LookupAnswer::Found(result.clone()),
                None => LookupAnswer::Failed,
            },
            (Answer::NotFound, _) | (Answer::Failed, Protocol::FailureAsNotFound) => {
                LookupAnswer::NotFound
            }
            (Answer::Failed, Protocol::FailureAsFound) => {
                LookupAnswer::Found(self.failed_body.clone())
            }
            (Answer::Failed, _) => LookupAnswer::Failed,
        };
        let asked_at = match (self.protocol, inline) {
            (Protocol::LookupDuringLease | Protocol::ResolveSkipsLease, _)
            | (Protocol::InlineLookupDuringLease, true) => asked_at.max(lease_until),
            _ => asked_at,
        };
        verdict(answer, asked_at, lease_until)
    }

    /// A "found" verdict carrying `result`.
    fn found_with(&self, result: StoredResult) -> Option<Resolution> {
        Resolution::new(Outcome::Completed { result }, "resolver", "found").ok()
    }

    /// Whether the store accepts the truth about the ambiguous attempt
    /// holding `record`, told by an operator once its lease is over: the
    /// production `decision::resolve`, so no state leaves an unknown
    /// outcome beyond anyone's reach.
    fn resolvable(&self, w: &World, record: &idem_core::Record) -> bool {
        let truth = w
            .effects
            .iter()
            .position(|e| e.token == record.token)
            .and_then(|effect| self.results.get(effect))
            .and_then(|result| self.found_with(result.clone()))
            .unwrap_or_else(|| self.not_found.clone());
        let when = w.now.max(record.lease_until);
        decision::resolve(Some(record), &self.id, record.token, truth, when).is_ok()
    }

    /// The store's claim: the production decision and its write, with a
    /// fresh token from the store's counter.
    fn claim(&self, w: &mut World) -> Claim {
        let existing = match self.protocol {
            Protocol::AcquiresTwice => None,
            _ => w.record(),
        };
        let mut last = w.last_token;
        let (claim, write) = decision::claim(existing, &self.request, w.now, || {
            last = last.saturating_add(1);
            Token(last)
        });
        w.last_token = last;
        w.apply(write);
        claim
    }

    /// How much of the lease the gateway counts as gone when the store's
    /// answer to a claim granted at `claimed_at` arrives at `now`: the
    /// time since (the gateway noted the instant before sending), or, in
    /// the mutant, nothing (a timeout started on arrival).
    fn elapsed_at_ack(&self, claimed_at: Timestamp, now: Timestamp) -> u64 {
        match self.protocol {
            Protocol::ForwardOnStaleLease => 0,
            _ => claimed_at.millis_until(now),
        }
    }

    /// Whether `client`'s request may wait for the attempt holding the key.
    fn may_wait(&self, client: usize) -> bool {
        client < self.bound.waiting_clients
    }

    /// Whether `client`'s request may settle an unknown outcome itself.
    fn may_settle(&self, client: usize) -> bool {
        client < self.bound.settling_clients
    }

    /// Whether `client` may claim through the unlocked fast path.
    fn fast_path(&self, client: usize) -> bool {
        client < self.bound.fast_path_clients
    }

    /// Whether the store's answers to `client`'s claims may arrive late.
    fn late_answers(&self, client: usize) -> bool {
        client < self.bound.late_answer_clients
    }

    /// The fast path's answer from an unlocked read of `record` and `now`:
    /// the production `decision::answer_without_write`, or the mutant's
    /// answer to every claim. A token the mutant hands out comes from the
    /// store's counter, `last_token`.
    fn answer_unlocked(
        &self,
        record: Option<&idem_core::Record>,
        now: Timestamp,
        last_token: &mut u64,
    ) -> Option<Claim> {
        match self.protocol {
            Protocol::FastPathAnswersAcquire => {
                let (claim, _unwritten) = decision::claim(record, &self.request, now, || {
                    *last_token = last_token.saturating_add(1);
                    Token(*last_token)
                });
                Some(claim)
            }
            _ => decision::answer_without_write(record, &self.request, now),
        }
    }

    /// The claim under the lock after the fast path did not answer from
    /// its read of `record` and `now`: the store's claim on the record as
    /// it is, or, in the mutant, on the read.
    fn claim_after_read(
        &self,
        w: &mut World,
        record: Option<&idem_core::Record>,
        now: Timestamp,
    ) -> Claim {
        if self.protocol != Protocol::LockedClaimOnStaleRead {
            return self.claim(w);
        }
        let mut last = w.last_token;
        let (claim, write) = decision::claim(record, &self.request, now, || {
            last = last.saturating_add(1);
            Token(last)
        });
        w.last_token = last;
        w.apply(write);
        claim
    }

    /// Whether the fast path keeps its contract in `w`: where it answers
    /// from the record and clock as they are, the production claim there
    /// answers the same and writes nothing.
    fn fast_path_is_the_claim(&self, w: &World) -> bool {
        self.fast_path_beside_lock(w)
            .is_none_or(|(fast, locked, write)| fast == locked && write == Write::None)
    }

    /// Whether a replay cache keeps its contract in `w`: the completed
    /// record the store holds, kept by the production `ReplayCache` and
    /// judged at each clock the cache may read ([`IdemModel::cache_clocks`]),
    /// answers only what the production claim at the store's now answers,
    /// and only where that writes nothing. A completed record is final
    /// until its expiry, so the record kept is the one the store holds.
    fn cache_is_the_claim(&self, w: &World) -> bool {
        let Some(kept) = w
            .record()
            .filter(|r| r.state == idem_core::State::Completed)
        else {
            return true;
        };
        let next = Token(w.last_token.saturating_add(1));
        let (claim, write) = decision::claim(w.record(), &self.request, w.now, || next);
        let cache = idem_core::ReplayCache::new(1 << 20);
        let read_at = std::time::Instant::now();
        cache.note_verbs(0, read_at);
        cache.keep(kept, cache.generation());
        self.cache_clocks(w.now).into_iter().all(|latest| {
            cache
                .answer_while_completed(&self.request, latest, read_at)
                .is_none_or(|cached| cached == claim && write == Write::None)
        })
    }

    /// The clocks a replay cache may judge by when the store's clock reads
    /// `now`: `now` itself (an injected clock, or the tightest bound) and a
    /// bound above it (the database's clock known within a round trip); in
    /// the mutant, a reading behind it.
    fn cache_clocks(&self, now: Timestamp) -> Vec<Timestamp> {
        match self.protocol {
            Protocol::CacheClockBehind => {
                vec![Timestamp::from_millis(now.as_millis().saturating_sub(1))]
            }
            _ => vec![now, now.plus_millis(1)],
        }
    }

    /// The fast path's answer from the record and clock as they are in
    /// `w`, with the production claim's answer and write there; `None`
    /// where the fast path does not answer.
    fn fast_path_beside_lock(&self, w: &World) -> Option<(Claim, Claim, Write)> {
        let mut last = w.last_token;
        let fast = self.answer_unlocked(w.record(), w.now, &mut last)?;
        let next = Token(w.last_token.saturating_add(1));
        let (locked, write) = decision::claim(w.record(), &self.request, w.now, || next);
        Some((fast, locked, write))
    }

    /// Whether some client's unlocked read, begun and not yet decided, can
    /// be finished with one half no longer the store's (the clock moved,
    /// or the record changed) and the fast path would still answer from it.
    fn stale_read_answered(&self, w: &World) -> bool {
        let answers = |record: Option<&world::Kept>, now: Timestamp| {
            let mut last = w.last_token;
            self.answer_unlocked(record.map(|k| &k.0), now, &mut last)
                .is_some()
        };
        w.clients.iter().flat_map(|c| &c.reading).any(|read| {
            (read.at != w.now && answers(w.record.as_ref(), read.at))
                || (read.record != w.record && answers(read.record.as_ref(), w.now))
        })
    }

    /// Whether the checker may count safety property `name` as holding in
    /// a state where it `holds` or not: false only in the first state found
    /// breaking it. `stateright` 0.31 keeps the last state it finds
    /// breaking a property, which breadth first is one of the deepest; the
    /// first, on one thread, ends a shortest trace.
    fn first_break(&self, name: &'static str, holds: bool) -> bool {
        if holds {
            return true;
        }
        let mut broken = match self.broken.lock() {
            Ok(broken) => broken,
            Err(poisoned) => poisoned.into_inner(),
        };
        !broken.insert(name)
    }

    /// The store's resolve, fenced by the token the resolver read.
    fn resolve(&self, w: &World, token: Token, verdict: Resolution) -> Result<Write, StoreError> {
        world::resolve_in(self.protocol, w, &self.id, token, verdict)
    }
}

impl Model for IdemModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![World::start(self)]
    }

    fn actions(&self, state: &World, actions: &mut Vec<Action>) {
        state.actions(self, actions);
    }

    fn next_state(&self, state: &World, action: Action) -> Option<World> {
        state.after(self, action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(property::ONE_EFFECT, |m: &IdemModel, w: &World| {
                m.first_break(property::ONE_EFFECT, w.effects.len() <= 1)
            }),
            Property::always(
                property::REPLAY_IS_THE_EFFECT,
                |m: &IdemModel, w: &World| {
                    let holds = told_effects(w).all(|(effect, replayed)| !replayed || effect == 0);
                    m.first_break(property::REPLAY_IS_THE_EFFECT, holds)
                },
            ),
            Property::always(
                property::NO_SUCCESS_WITHOUT_EFFECT,
                |m: &IdemModel, w: &World| {
                    let holds = told_effects(w).all(|(effect, _)| effect < w.effects.len());
                    m.first_break(property::NO_SUCCESS_WITHOUT_EFFECT, holds)
                },
            ),
            Property::always(
                property::VERDICT_ON_ITS_ATTEMPT,
                |m: &IdemModel, w: &World| {
                    let holds = w.verdicts.iter().all(|v| v.about == v.landed_on);
                    m.first_break(property::VERDICT_ON_ITS_ATTEMPT, holds)
                },
            ),
            Property::always(
                property::UNKNOWN_CAN_END_RESOLVED,
                |m: &IdemModel, w: &World| {
                    let holds = w
                        .record()
                        .filter(|r| r.state == idem_core::State::Ambiguous)
                        .is_none_or(|r| m.resolvable(w, r));
                    m.first_break(property::UNKNOWN_CAN_END_RESOLVED, holds)
                },
            ),
            Property::always(
                property::FAST_PATH_IS_THE_CLAIM,
                |m: &IdemModel, w: &World| {
                    let holds = m.fast_path_is_the_claim(w);
                    m.first_break(property::FAST_PATH_IS_THE_CLAIM, holds)
                },
            ),
            Property::always(property::CACHE_IS_THE_CLAIM, |m: &IdemModel, w: &World| {
                let holds = m.cache_is_the_claim(w);
                m.first_break(property::CACHE_IS_THE_CLAIM, holds)
            }),
            Property::always(
                property::FORWARD_WITHIN_LEASE,
                |m: &IdemModel, w: &World| {
                    let holds = w.effects.iter().all(|e| !e.after_lease);
                    m.first_break(property::FORWARD_WITHIN_LEASE, holds)
                },
            ),
            Property::sometimes(property::LATE_ANSWER_REFUSED, |_, w: &World| {
                w.clients.iter().any(|c| c.told.contains(&Told::LeaseSpent))
            }),
            Property::sometimes(property::UNKNOWN_ENDS_RESOLVED, |_, w: &World| {
                !w.verdicts.is_empty()
            }),
            Property::sometimes(property::LOOKUP_FAILS, |_, w: &World| w.tries.is_some()),
            Property::sometimes(property::RETRY_REPLAYS, |_, w: &World| {
                told_effects(w).any(|(_, replayed)| replayed)
            }),
            Property::sometimes(property::WAITER_REPLAYED, |_, w: &World| w.waiter_replayed),
            Property::sometimes(property::SETTLED_ON_RETRY, |_, w: &World| {
                w.settled_on_retry
            }),
            Property::sometimes(property::STALE_READ_ANSWERED, |m: &IdemModel, w: &World| {
                m.stale_read_answered(w)
            }),
            // Reached at once where the bound has no lost tail.
            Property::sometimes(property::VERIFIED_REPLAY, |m: &IdemModel, w: &World| {
                m.bound.tail_losses == 0 || w.verified_replay
            }),
        ]
    }
}

fn told_effects(w: &World) -> impl Iterator<Item = (usize, bool)> + '_ {
    w.clients
        .iter()
        .flat_map(|c| &c.told)
        .filter_map(|t| match t {
            Told::Effect { effect, replayed } => Some((*effect, *replayed)),
            _ => None,
        })
}

/// Explores every interleaving of `protocol` within `bound`, breadth first
/// on one thread, and reports each violated property with a shortest trace.
pub fn check(protocol: Protocol, bound: Bound) -> Result<Report, ModelError> {
    let started = Instant::now();
    let model = IdemModel::new(protocol, bound)?;
    let checker = IdemModel::new(protocol, bound)?
        .checker()
        .target_max_depth(bound.depth_max)
        .target_state_count(bound.states_max)
        .spawn_bfs()
        .join();
    let mut violations = Vec::new();
    let mut unreached = Vec::new();
    for p in model.properties() {
        let found = checker.discovery(p.name);
        match (p.expectation, found) {
            (stateright::Expectation::Sometimes, None) => unreached.push(p.name),
            (stateright::Expectation::Sometimes, Some(_)) | (_, None) => {}
            (_, Some(path)) => {
                let (trace, steps) = trace::render(&model, p.name, path);
                violations.push(Violation {
                    property: p.name,
                    steps,
                    trace,
                });
            }
        }
    }
    Ok(Report {
        protocol,
        bound,
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        depth_reached: checker.max_depth(),
        violations,
        unreached,
        elapsed: started.elapsed(),
        // The checker stops at the cap between batches, so it may pass it
        // a little; 0 is no cap.
        capped: bound.states_max > 0 && checker.state_count() >= bound.states_max,
    })
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "protocol {}: {} unique states ({} generated), depth {} of {}, {} clients x {} requests, {} on the fast path, {} with late answers, {} waiting, {} settling on retry, {:.1?}",
            self.protocol.name(),
            self.unique_states,
            self.states,
            self.depth_reached,
            self.bound.depth_max,
            self.bound.clients,
            self.bound.requests_per_client,
            self.bound.fast_path_clients.min(self.bound.clients),
            self.bound.late_answer_clients.min(self.bound.clients),
            self.bound.waiting_clients.min(self.bound.clients),
            self.bound.settling_clients.min(self.bound.clients),
            self.elapsed,
        )?;
        if self.capped {
            writeln!(
                f,
                "  STOPPED at the state cap ({} generated states, --states-max {}): the bound \
                 was not explored in full; lower --depth, or raise --states-max on a machine \
                 with more memory (about 0.6 KiB per state)",
                self.states, self.bound.states_max
            )?;
        }
        for name in &self.unreached {
            writeln!(f, "  not reached within the bound: {name}")?;
        }
        for v in &self.violations {
            writeln!(f, "  VIOLATED: {}\n{}", v.property, v.trace)?;
        }
        Ok(())
    }
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelError::Input(why) => write!(f, "the model's fixed input was refused: {why}"),
            ModelError::BoundTooLarge { requests } => write!(
                f,
                "{requests} requests in the bound; the model names at most 255 effects"
            ),
        }
    }
}

impl std::error::Error for ModelError {}

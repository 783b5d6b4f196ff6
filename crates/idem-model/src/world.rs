//! The model's state and its transitions. Each transition that touches the
//! record calls one production function of `idem_core::decision` and applies
//! the `Write` it returns, as every store does; the only code here is who
//! may act when, and what each actor remembers.
//!
//! A claim is made in one of two ways. `Request` claims under the store's
//! lock in one step. `Snapshot` then `Decide` is the stores' fast path: a
//! read that takes no lock, whose record and clock may be from different
//! moments, answered by `decision::answer_without_write` when the claim
//! writes nothing, and otherwise a claim under the lock made at `Decide`.
//!
//! A request told that another attempt holds the key may wait for it
//! (`Pending::Waiting`) and ask the claim again later (`Wake`), as the
//! gateway's waiters and `idem consume` do; one told the outcome is unknown
//! may have the retry's inline lookup settle it (`Pending::Settling`, the
//! third resolver) and then ask the claim again (`Settle`). Both answer
//! only what a claim answers.
//!
//! A claim's answer reaches the gateway at once or late ([`Receipt`]):
//! the store commits at `Request`, and a late answer arrives at `Ack`, with
//! any steps and any time in between. Only then does the gateway know what
//! is left of the lease (`idem_core::lease::lease_left`), and the upstream
//! may commit a forwarded request only until that deadline.

use idem_core::decision::{self, Claim, Write};
use idem_core::verdict::{self, Triage};
use idem_core::{
    LeaseLeft, LookupTries, Outcome, Record, Resolution, State, StoreError, SuspectWindow,
    Timestamp, Token, lease,
};

use crate::{IdemModel, Protocol};

/// Everything the model checker explores: the one record a store keeps for
/// the key, and what every actor knows or did.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct World {
    /// The store's clock.
    pub now: Timestamp,
    /// The store's record of the key, if any.
    pub record: Option<Kept>,
    /// The store's token counter: the last token handed out.
    pub last_token: u64,
    /// Every acquired attempt, in the order of acquisition.
    pub attempts: Vec<Attempt>,
    /// The clients, each retrying the same request.
    pub clients: Vec<Client>,
    /// The effects the upstream committed, in order.
    pub effects: Vec<Effect>,
    /// The reconciler (0), the operator (1), and the inline lookup of a
    /// retry that met an unknown outcome (2), one per key at a time.
    pub resolvers: [Resolver; 3],
    /// Every verdict the store accepted.
    pub verdicts: Vec<Verdict>,
    /// The failed lookups the store keeps for the record:
    /// `(token, failures, next_at)` of [`LookupTries`], which does not
    /// derive `Hash`.
    pub tries: Option<(Token, u32, Timestamp)>,
    /// Reachability: a waiter asked the claim again and got a replay.
    pub waiter_replayed: bool,
    /// Reachability: a retry's inline lookup resolved the record, and the
    /// claim asked after it replayed or acquired.
    pub settled_on_retry: bool,
    /// The suspect window the store keeps since it lost its record of the
    /// key (a failover to a standby without the last writes, a restore),
    /// as the production `SuspectWindow::opened` made it.
    pub window: Option<SuspectWindow>,
    /// How many times the store has lost its record.
    pub losses: usize,
    /// Reachability: a fresh claim inside the window was answered with the
    /// provider's answer, nothing forwarded.
    pub verified_replay: bool,
}

/// The stored record. A wrapper only because `Record` does not derive
/// `Hash`; equality is the record's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept(pub Record);

/// One attempt that acquired the key: a gateway holding it, and the request
/// it may have forwarded to the upstream.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Attempt {
    /// The client whose request this is.
    pub client: usize,
    /// The fencing token the claim handed out.
    pub token: Token,
    /// The end of its lease (store clock).
    pub lease_until: Timestamp,
    /// The store's clock when it granted the lease: the gateway sent the
    /// claim no later (one clock serves both in the model).
    pub claimed_at: Timestamp,
    /// How long the store leased, in milliseconds.
    pub lease_ms: u64,
    /// The forward's deadline, once the gateway has the store's answer: the
    /// upstream cannot commit the request later (the gateway cuts it there,
    /// and an upstream takes no longer than its caller waits).
    pub deadline: Option<Timestamp>,
    /// Whether the claim found no record while the suspect window was
    /// open: the gateway asks the provider before it forwards.
    pub verify: bool,
    /// Whether the request left the gateway.
    pub sent: bool,
    /// The effect the upstream committed for it, if it did.
    pub effect: Option<usize>,
    /// Where the gateway is.
    pub gateway: Gateway,
}

/// The gateway process handling one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gateway {
    /// The store committed the claim; its answer is still on the way.
    Claimed,
    /// Holds a claim made inside the suspect window and asks the provider
    /// whether the key already executed before it forwards.
    Verifying,
    /// Holds the claim and may still act on it.
    Holding,
    /// Answered its client.
    Answered,
    /// Died without answering.
    Crashed,
}

/// A client retrying one request under one key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Client {
    /// Requests sent so far.
    pub sent: u8,
    /// What each answered request was told, in order.
    pub told: Vec<Told>,
    /// The unlocked read begun for the request in hand, not yet decided.
    pub reading: Option<Read>,
    /// A request in hand whose answer is not given yet.
    pub pending: Pending,
}

/// A request whose claim answered, but whose client is not told yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Pending {
    /// Nothing pending.
    #[default]
    None,
    /// Told another attempt holds the key, it waits to ask again.
    Waiting,
    /// Told the outcome is unknown, it waits for the inline lookup (or
    /// none) and then asks again.
    Settling,
}

/// Which ask of one request a claim's answer is: the first, the waiter's
/// second, or the one after the inline lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ask {
    First,
    Waited,
    Settled,
}

/// Which half of an unlocked read the store took first: that half is as
/// it was at the client's `Snapshot`, the other as it is at `Decide`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadFirst {
    /// The clock; the record is read when the claim is decided.
    Clock,
    /// The record; the clock is read when the claim is decided.
    Record,
}

/// An unlocked read begun: the record and the clock as they were when the
/// client's request arrived. The store reads one of them then and the
/// other later ([`ReadFirst`]): PostgreSQL reads both in one statement,
/// the record from the statement's snapshot, so either may be older than
/// the other; a cache of completed records answers from a record read
/// long before the clock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Read {
    /// The record then (none, if there was none).
    pub record: Option<Kept>,
    /// The clock then.
    pub at: Timestamp,
}

/// What a client was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Told {
    /// Success, carrying the result of `effect`: fresh or replayed.
    Effect {
        /// The effect whose result the answer carries.
        effect: usize,
        /// Whether it was a replay of a stored result.
        replayed: bool,
    },
    /// Another attempt is in flight (409).
    InFlight,
    /// The outcome is unknown (an upstream error, or an ambiguous record).
    Unknown,
    /// The key is past retention (a late replay).
    Expired,
    /// The request was not processed; retry.
    NotProcessed,
    /// The store refused the gateway's write after the effect (5xx).
    Error,
    /// The store's answer came with too little of the lease left; nothing
    /// was forwarded (503 `lease-spent`).
    LeaseSpent,
}

/// One effect the upstream committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Effect {
    /// The attempt whose request it executed.
    pub attempt: usize,
    /// That attempt's token, as the provider's lookup finds it.
    pub token: Token,
    /// Whether it committed at or after its attempt's lease end (I8 in docs/contract.md
    /// forbids it: a retry or the reconciler may have judged the attempt).
    pub after_lease: bool,
}

/// When the store's answer to a claim reaches the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Receipt {
    /// In the same step as the store's commit.
    AtOnce,
    /// Later, at an `Ack` step: the network or the disk stalled after the
    /// commit, and the clock may have moved.
    Late,
    /// In the mutant `batch-answers-before-commit` only: at once, before
    /// the commit, which then never lands; the token drawn stays drawn, as
    /// a database sequence's does.
    Uncommitted,
}

/// A resolver (the reconciler or an operator) between reading an
/// ambiguous record and giving its verdict: what it read can be stale by
/// the time the verdict reaches the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resolver {
    /// Not judging anything.
    Idle,
    /// Read the ambiguous attempt holding `token` and asked the provider.
    Judged {
        /// The attempt the verdict is about.
        token: Token,
        /// What the provider answered.
        answer: Answer,
        /// When the provider was asked.
        asked_at: Timestamp,
        /// The attempt's lease end, as read.
        lease_until: Timestamp,
    },
}

/// What the provider answered a lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// The attempt's effect, found.
    Found(usize),
    /// No effect of the attempt.
    NotFound,
    /// No finding: the lookup failed (an error status, a timeout).
    Failed,
}

/// A verdict the store accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Verdict {
    /// The attempt the resolver judged.
    pub about: Token,
    /// The attempt holding the record when the verdict changed it.
    pub landed_on: Token,
    /// Whether the verdict said the effect happened.
    pub executed: bool,
    /// Whether a retry's inline lookup gave it.
    pub by_retry: bool,
}

/// One step of one actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client sends its request; the gateway claims the key under the
    /// store's lock at once.
    Request {
        /// Which client.
        client: usize,
        /// When the store's answer reaches the gateway.
        receipt: Receipt,
    },
    /// A late answer that acquired reaches the gateway, which forwards
    /// only with enough of the lease left, and otherwise releases.
    Ack {
        /// Which attempt.
        attempt: usize,
    },
    /// A client sends its request; the store starts a read that takes no
    /// lock.
    Snapshot {
        /// Which client.
        client: usize,
    },
    /// The store finishes the client's unlocked read, whose `first` half is
    /// as it was at the `Snapshot`, and answers from it; or it claims under
    /// the lock when the claim would write.
    Decide {
        /// Which client.
        client: usize,
        /// The half read at the `Snapshot`.
        first: ReadFirst,
    },
    /// The gateway forwards an acquired attempt to the upstream.
    Forward {
        /// Which attempt.
        attempt: usize,
    },
    /// The request provably never left: the gateway releases the key.
    NotSent {
        /// Which attempt.
        attempt: usize,
    },
    /// The upstream commits the effect of a forwarded request.
    Commit {
        /// Which attempt.
        attempt: usize,
    },
    /// The gateway gets the upstream's success and completes the record.
    Succeed {
        /// Which attempt.
        attempt: usize,
    },
    /// The gateway gets an error or a timeout: the outcome is unknown.
    Unknown {
        /// Which attempt.
        attempt: usize,
    },
    /// The gateway dies holding the claim.
    Crash {
        /// Which attempt.
        attempt: usize,
    },
    /// The reconciler's lease sweep marks an expired lease ambiguous.
    Sweep,
    /// A resolver reads the ambiguous record and asks the provider.
    Look {
        /// 0: the reconciler, 1: the operator.
        resolver: usize,
        /// The lookup fails (the reconciler's only: it counts failures).
        fails: bool,
    },
    /// A resolver gives its verdict, with the token it read.
    Resolve {
        /// 0: the reconciler, 1: the operator.
        resolver: usize,
    },
    /// A waiting request asks the claim again (woken by a settle or its
    /// poll), under the store's lock.
    Wake {
        /// Which client.
        client: usize,
    },
    /// After the inline lookup (or without one, when none was due), the
    /// retry that met an unknown outcome asks the claim again.
    Settle {
        /// Which client.
        client: usize,
    },
    /// The store loses its record of the key with the last writes (a hard
    /// failover, a restore) and opens the suspect window.
    LoseTail,
    /// The gateway of a claim made inside the window asks the provider.
    Verify {
        /// Which attempt.
        attempt: usize,
        /// The lookup fails.
        fails: bool,
    },
    /// The retention purge passes over the record.
    Purge,
    /// The clock moves to the next deadline (a lease, retention, the
    /// tombstone horizon, the clients' replay horizon).
    Advance,
}

impl std::hash::Hash for Kept {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        // A subset of the fields equality compares, so equal records hash
        // alike; these are the fields the model's transitions change.
        let r = &self.0;
        (r.state, r.token, r.lease_until, r.completed_at).hash(h);
        (r.expires_at, r.tombstone_until).hash(h);
        r.result.as_ref().map(|x| x.body().to_vec()).hash(h);
    }
}

impl World {
    /// The world before anyone acted.
    pub fn start(model: &IdemModel) -> World {
        World {
            now: model.start,
            record: None,
            last_token: 0,
            attempts: Vec::new(),
            clients: vec![Client::default(); model.bound.clients],
            effects: Vec::new(),
            resolvers: [Resolver::Idle; 3],
            verdicts: Vec::new(),
            tries: None,
            waiter_replayed: false,
            settled_on_retry: false,
            window: None,
            losses: 0,
            verified_replay: false,
        }
    }

    /// The failed lookups the store keeps for the record, as the store reads
    /// them for the attempt holding `token` (`decision::tries_of_attempt`).
    pub fn tries_of(&self, token: Token) -> Option<LookupTries> {
        let kept = self.tries.map(|(token, failures, next_at)| LookupTries {
            token,
            failures,
            next_at,
        });
        decision::tries_of_attempt(kept.as_ref(), token)
    }

    /// The stored record, if any.
    pub fn record(&self) -> Option<&Record> {
        self.record.as_ref().map(|k| &k.0)
    }

    /// Every action enabled in this world.
    pub fn actions(&self, model: &IdemModel, out: &mut Vec<Action>) {
        self.client_actions(model, out);
        self.attempt_actions(out);
        self.store_actions(model, out);
    }

    /// What the clients may do: a request (told at once, late or before
    /// its commit), a read on the fast path and its decision, a waiter's
    /// or a settling retry's next step.
    fn client_actions(&self, model: &IdemModel, out: &mut Vec<Action>) {
        for (client, c) in self.clients.iter().enumerate() {
            // A request takes effect at the store before the replay
            // horizon, the read and the claim that ends it alike: that is
            // what the tombstone horizon is measured against.
            if c.reading.is_some() && self.now < model.replay_horizon() {
                for first in [ReadFirst::Clock, ReadFirst::Record] {
                    out.push(Action::Decide { client, first });
                }
            }
            // A request that waits asks the claim again before the replay
            // horizon too: the wait is part of how long a request may take
            // to reach its claim, which the tombstone horizon must cover
            // (a waiter that asked after it would find the key free).
            match c.pending {
                Pending::Waiting if self.now < model.replay_horizon() => {
                    out.push(Action::Wake { client });
                }
                // The inline lookup is single-flight: asked again once it
                // is over, or at once when none is due.
                Pending::Settling
                    if self.resolvers[2] == Resolver::Idle && self.now < model.replay_horizon() =>
                {
                    out.push(Action::Settle { client });
                }
                _ => {}
            }
            if !self.may_request(model, client, c) {
                continue;
            }
            out.push(Action::Request {
                client,
                receipt: Receipt::AtOnce,
            });
            if model.late_answers(client) {
                out.push(Action::Request {
                    client,
                    receipt: Receipt::Late,
                });
            }
            if model.protocol() == Protocol::BatchAnswersBeforeCommit {
                out.push(Action::Request {
                    client,
                    receipt: Receipt::Uncommitted,
                });
            }
            if model.fast_path(client) {
                out.push(Action::Snapshot { client });
            }
        }
    }

    /// What the gateways holding attempts may do: forward, commit, answer,
    /// verify inside the suspect window, crash.
    fn attempt_actions(&self, out: &mut Vec<Action>) {
        for (attempt, a) in self.attempts.iter().enumerate() {
            if a.sent && a.effect.is_none() && a.deadline.is_some_and(|d| self.now < d) {
                out.push(Action::Commit { attempt });
            }
            if a.gateway == Gateway::Claimed {
                out.push(Action::Ack { attempt });
                out.push(Action::Crash { attempt });
            }
            if a.gateway == Gateway::Verifying {
                for fails in [false, true] {
                    out.push(Action::Verify { attempt, fails });
                }
                out.push(Action::Crash { attempt });
            }
            if a.gateway != Gateway::Holding {
                continue;
            }
            out.push(Action::Crash { attempt });
            if a.sent {
                out.push(Action::Unknown { attempt });
                if a.effect.is_some() {
                    out.push(Action::Succeed { attempt });
                }
            } else {
                out.push(Action::Forward { attempt });
                out.push(Action::NotSent { attempt });
            }
        }
    }

    /// What happens at the store and around it: the lease sweep, the
    /// resolvers, the purge, a lost tail, and time passing.
    fn store_actions(&self, model: &IdemModel, out: &mut Vec<Action>) {
        let record = self.record();
        if record.is_some_and(|r| r.state == State::InProgress && self.now >= r.lease_until) {
            out.push(Action::Sweep);
        }
        let settling = self.clients.iter().any(|c| c.pending == Pending::Settling);
        for (resolver, r) in self.resolvers.iter().enumerate() {
            match r {
                // The inline lookup only for a retry that met the unknown outcome.
                Resolver::Idle if resolver == 2 && !settling => {}
                Resolver::Idle if record.is_some_and(|r| self.may_look(resolver, r)) => {
                    out.push(Action::Look {
                        resolver,
                        fails: false,
                    });
                    if resolver != 1 {
                        out.push(Action::Look {
                            resolver,
                            fails: true,
                        });
                    }
                }
                Resolver::Idle => {}
                Resolver::Judged { .. } => out.push(Action::Resolve { resolver }),
            }
        }
        if record.is_some_and(|r| decision::purge(r, self.now) != Write::None) {
            out.push(Action::Purge);
        }
        if self.losses < model.bound.tail_losses && record.is_some() {
            out.push(Action::LoseTail);
        }
        if self.next_deadline(model).is_some() {
            out.push(Action::Advance);
        }
    }

    /// The world after `action`, or `None` if it changes nothing.
    pub fn after(&self, model: &IdemModel, action: Action) -> Option<World> {
        let mut w = self.clone();
        match action {
            Action::Request { client, receipt } => w.request(model, client, receipt)?,
            Action::Ack { attempt } => w.ack(model, attempt)?,
            Action::Snapshot { client } => w.snapshot(client)?,
            Action::Decide { client, first } => w.decide(model, client, first)?,
            Action::Forward { attempt } => w.attempts.get_mut(attempt)?.sent = true,
            Action::NotSent { attempt } => w.not_sent(model, attempt)?,
            Action::Commit { attempt } => w.commit(attempt)?,
            Action::Succeed { attempt } => w.succeed(model, attempt)?,
            Action::Unknown { attempt } => w.unknown(model, attempt)?,
            Action::Crash { attempt } => w.attempts.get_mut(attempt)?.gateway = Gateway::Crashed,
            Action::Sweep => w.sweep(model)?,
            Action::Look { resolver, fails } => w.look(resolver, fails)?,
            Action::Resolve { resolver } => w.resolve(model, resolver)?,
            Action::Wake { client } => w.wake(model, client)?,
            Action::Settle { client } => w.settle(model, client)?,
            Action::Purge => {
                let write = decision::purge(w.record()?, w.now);
                w.apply(write);
            }
            Action::LoseTail => w.lose_tail(model),
            Action::Verify { attempt, fails } => w.verify(model, attempt, fails)?,
            Action::Advance => w.now = w.next_deadline(model)?,
        }
        Some(w)
    }

    /// Whether a resolver may read `record` now and ask the provider: the
    /// operator whenever it is ambiguous; the reconciler and a retry's
    /// inline lookup only as the triage of the tries the store keeps allows
    /// (`verdict::triage`: not during a backoff, not after `MAX_TRIES`
    /// failures).
    fn may_look(&self, resolver: usize, record: &Record) -> bool {
        if record.state != State::Ambiguous {
            return false;
        }
        resolver == 1
            || matches!(
                verdict::triage(
                    self.tries_of(record.token).as_ref(),
                    crate::MAX_TRIES,
                    self.now
                ),
                Triage::Ask { .. }
            )
    }

    fn may_request(&self, model: &IdemModel, client: usize, c: &Client) -> bool {
        let waiting = self
            .attempts
            .iter()
            .any(|a| a.client == client && a.gateway == Gateway::Holding);
        let satisfied = c.told.iter().any(|t| matches!(t, Told::Effect { .. }));
        !waiting
            && !satisfied
            && c.reading.is_none()
            && c.pending == Pending::None
            && usize::from(c.sent) < model.bound.requests_per_client
            && self.now < model.replay_horizon()
    }

    fn request(&mut self, model: &IdemModel, client: usize, receipt: Receipt) -> Option<()> {
        let attempts = self.attempts.len();
        self.send(client)?;
        let before = self.record.clone();
        let claim = model.claim(self);
        if receipt == Receipt::Uncommitted {
            self.record = before;
        }
        self.tell(model, client, claim, Ask::First)?;
        match (receipt, self.attempts.len() > attempts) {
            (Receipt::Late, true) => Some(()),
            // A late answer that acquired nothing tells the same later.
            (Receipt::Late, false) => None,
            (Receipt::AtOnce | Receipt::Uncommitted, true) => self.ack(model, attempts),
            (Receipt::AtOnce | Receipt::Uncommitted, false) => Some(()),
        }
    }

    /// The store's answer reaches the gateway: forward with what is left
    /// of the lease, counted from the claim's sending, or release unsent.
    fn ack(&mut self, model: &IdemModel, attempt: usize) -> Option<()> {
        let a = self.attempts.get(attempt)?.clone();
        if a.gateway != Gateway::Claimed {
            return None;
        }
        let elapsed_ms = model.elapsed_at_ack(a.claimed_at, self.now);
        match lease::lease_left(a.lease_ms, elapsed_ms) {
            LeaseLeft::Forward { forward_ms } => {
                let a = self.attempts.get_mut(attempt)?;
                a.deadline = Some(self.now.plus_millis(forward_ms));
                a.gateway = match a.verify && model.protocol() != Protocol::WindowSkipsCheck {
                    true => Gateway::Verifying,
                    false => Gateway::Holding,
                };
                Some(())
            }
            LeaseLeft::TooLittle { .. } => {
                // Nothing was sent: release; a fenced release leaves the
                // record to whoever judged it.
                if decision::release(self.record(), &model.id, a.token, self.now).is_ok() {
                    self.apply(Write::Delete);
                }
                self.answer(attempt, Told::LeaseSpent)
            }
        }
    }

    /// The store begins an unlocked read for the client's request.
    fn snapshot(&mut self, client: usize) -> Option<()> {
        let read = Read {
            record: self.record.clone(),
            at: self.now,
        };
        self.send(client)?;
        self.clients.get_mut(client)?.reading = Some(read);
        Some(())
    }

    /// The store reads the other half of the client's unlocked read and
    /// answers from the read when the protocol's fast path answers;
    /// otherwise it claims under the lock.
    fn decide(&mut self, model: &IdemModel, client: usize, first: ReadFirst) -> Option<()> {
        let read = self.clients.get_mut(client)?.reading.take()?;
        let (record, now) = match first {
            ReadFirst::Clock => (self.record.clone(), read.at),
            ReadFirst::Record => (read.record, self.now),
        };
        let attempts = self.attempts.len();
        let record = record.map(|k| k.0);
        let mut last = self.last_token;
        let claim = match model.answer_unlocked(record.as_ref(), now, &mut last) {
            Some(answer) => {
                self.last_token = last;
                answer
            }
            None => model.claim_after_read(self, record.as_ref(), now),
        };
        self.tell(model, client, claim, Ask::First)?;
        // The fast path's answer reaches the gateway at once.
        match self.attempts.len() > attempts {
            true => self.ack(model, attempts),
            false => Some(()),
        }
    }

    /// Counts a request the client sends.
    fn send(&mut self, client: usize) -> Option<()> {
        let c = self.clients.get_mut(client)?;
        c.sent = c.sent.saturating_add(1);
        Some(())
    }

    /// A waiting request asks the claim again under the lock; in the
    /// mutant, a waiter that finds the key released forwards without a
    /// claim of its own.
    fn wake(&mut self, model: &IdemModel, client: usize) -> Option<()> {
        if self.clients.get(client)?.pending != Pending::Waiting {
            return None;
        }
        let attempts = self.attempts.len();
        let unclaimed = |w: &mut World| {
            // The claim it skipped, and the write it never made.
            let mut last = w.last_token;
            let (claim, _unwritten) = decision::claim(None, &model.request, w.now, || {
                last = last.saturating_add(1);
                Token(last)
            });
            w.last_token = last;
            claim
        };
        let claim = match model.protocol() {
            Protocol::WaiterForwardsUnclaimed if self.record.is_none() => unclaimed(self),
            Protocol::WaiterRunsUnknown => match model.claim(self) {
                Claim::OutcomeUnknown { .. } => unclaimed(self),
                claim => claim,
            },
            _ => model.claim(self),
        };
        self.tell(model, client, claim, Ask::Waited)?;
        match self.attempts.len() > attempts {
            true => self.ack(model, attempts),
            false => Some(()),
        }
    }

    /// The retry that met an unknown outcome asks the claim again once the
    /// inline lookup is over (or none was due).
    fn settle(&mut self, model: &IdemModel, client: usize) -> Option<()> {
        if self.clients.get(client)?.pending != Pending::Settling {
            return None;
        }
        let attempts = self.attempts.len();
        let claim = model.claim(self);
        self.tell(model, client, claim, Ask::Settled)?;
        match self.attempts.len() > attempts {
            true => self.ack(model, attempts),
            false => Some(()),
        }
    }

    /// Tells the client the claim's answer; an acquisition starts an
    /// attempt, whose gateway answers later. A first "in flight" makes a
    /// client that may wait wait, and an "unknown" makes one that may
    /// settle on retry wait for the inline lookup, instead of telling it.
    fn tell(&mut self, model: &IdemModel, client: usize, claim: Claim, ask: Ask) -> Option<()> {
        self.clients.get_mut(client)?.pending = Pending::None;
        match (&claim, ask) {
            (Claim::InFlight { .. }, Ask::First) if model.may_wait(client) => {
                self.clients.get_mut(client)?.pending = Pending::Waiting;
                return Some(());
            }
            (Claim::OutcomeUnknown { .. }, Ask::First | Ask::Waited)
                if model.may_settle(client) =>
            {
                self.clients.get_mut(client)?.pending = Pending::Settling;
                return Some(());
            }
            (Claim::Replay { .. }, Ask::Waited) => self.waiter_replayed = true,
            (Claim::Replay { .. } | Claim::Acquired { .. }, Ask::Settled)
                if self.verdicts.iter().any(|v| v.by_retry) =>
            {
                self.settled_on_retry = true;
            }
            _ => {}
        }
        let told = match claim {
            Claim::Acquired {
                token,
                lease_until,
                lease_ms,
                took_over,
            } => {
                let verify = took_over.is_none() && self.window.is_some();
                self.attempts.push(Attempt {
                    client,
                    token,
                    lease_until,
                    claimed_at: Timestamp::from_millis(
                        lease_until.as_millis().saturating_sub(lease_ms),
                    ),
                    lease_ms,
                    deadline: None,
                    verify,
                    sent: false,
                    effect: None,
                    gateway: Gateway::Claimed,
                });
                return Some(());
            }
            Claim::Replay { record } => match effect_of(&record) {
                Some(effect) => Told::Effect {
                    effect,
                    replayed: true,
                },
                None => Told::Error,
            },
            Claim::InFlight { .. } | Claim::Mismatch { .. } => Told::InFlight,
            Claim::OutcomeUnknown { .. } => Told::Unknown,
            Claim::Expired { .. } => Told::Expired,
            _ => Told::Error,
        };
        self.clients.get_mut(client)?.told.push(told);
        Some(())
    }

    /// The store forgets the key's record with its last writes and opens
    /// the suspect window, or extends the open one, through the production
    /// `SuspectWindow::opened`; the mutant keeps the first loss's instant.
    fn lose_tail(&mut self, model: &IdemModel) {
        use idem_core::window::{WINDOW_MS_MAX, WindowOpening};
        self.record = None;
        self.tries = None;
        self.losses += 1;
        let opening = WindowOpening {
            length_ms: WINDOW_MS_MAX,
            since: None,
            cause: String::new(),
        };
        let mut opened = SuspectWindow::opened(self.window.as_ref(), &opening, self.now);
        if let (Protocol::WindowKeepsFirstLoss, Some(first)) = (model.protocol(), &self.window) {
            opened.opened_at = first.opened_at;
        }
        self.window = Some(opened);
    }

    /// The gateway of a claim made inside the suspect window asks the
    /// provider by the key, and follows the production verdict
    /// (`idem_core::window::verify_verdict`): found, the record is
    /// completed with the provider's answer and replayed; not found once
    /// every forgotten lease has ended, it may forward; otherwise it
    /// releases the claim, nothing sent.
    fn verify(&mut self, model: &IdemModel, attempt: usize, fails: bool) -> Option<()> {
        use idem_core::verdict::LookupAnswer;
        use idem_core::window::{Verification, verify_verdict};
        let a = self.attempts.get(attempt)?.clone();
        if a.gateway != Gateway::Verifying {
            return None;
        }
        let answer = match (fails, self.effects.first()) {
            (true, _) => LookupAnswer::Failed,
            (false, Some(_)) => LookupAnswer::Found(model.results.first()?.clone()),
            (false, None) => LookupAnswer::NotFound,
        };
        let window = self.window.clone()?;
        match verify_verdict(answer, self.now, &window, crate::LEASE_MS) {
            Verification::NotExecuted => {
                self.attempts.get_mut(attempt)?.gateway = Gateway::Holding;
                Some(())
            }
            Verification::Executed(result) => {
                let done = decision::complete(self.record(), &model.id, a.token, result, self.now);
                let told = match done {
                    Ok(done) => {
                        let effect = effect_of(&done);
                        self.apply(Write::Put(done));
                        self.verified_replay = true;
                        match effect {
                            Some(effect) => Told::Effect {
                                effect,
                                replayed: true,
                            },
                            None => Told::Error,
                        }
                    }
                    Err(_) => Told::Error,
                };
                self.answer(attempt, told)
            }
            Verification::NotYet { .. } | Verification::Failed { .. } => {
                if decision::release(self.record(), &model.id, a.token, self.now).is_ok() {
                    self.apply(Write::Delete);
                }
                self.answer(attempt, Told::NotProcessed)
            }
        }
    }

    fn not_sent(&mut self, model: &IdemModel, attempt: usize) -> Option<()> {
        let a = self.attempts.get(attempt)?.clone();
        let told = match decision::release(self.record(), &model.id, a.token, self.now) {
            Ok(()) => {
                self.apply(Write::Delete);
                Told::NotProcessed
            }
            Err(_) => Told::Error,
        };
        self.answer(attempt, told)
    }

    fn commit(&mut self, attempt: usize) -> Option<()> {
        let a = self.attempts.get(attempt)?;
        let (token, after_lease) = (a.token, self.now >= a.lease_until);
        self.effects.push(Effect {
            attempt,
            token,
            after_lease,
        });
        self.attempts.get_mut(attempt)?.effect = Some(self.effects.len() - 1);
        Some(())
    }

    fn succeed(&mut self, model: &IdemModel, attempt: usize) -> Option<()> {
        let a = self.attempts.get(attempt)?.clone();
        let effect = a.effect?;
        let result = model.results.get(effect)?.clone();
        let done = decision::complete(self.record(), &model.id, a.token, result, self.now);
        let told = match done {
            Ok(done) => {
                self.apply(Write::Put(done));
                Told::Effect {
                    effect,
                    replayed: false,
                }
            }
            Err(_) => Told::Error,
        };
        self.answer(attempt, told)
    }

    fn unknown(&mut self, model: &IdemModel, attempt: usize) -> Option<()> {
        let a = self.attempts.get(attempt)?.clone();
        if let Ok(marked) = decision::mark_ambiguous(self.record(), &model.id, a.token, self.now) {
            self.apply(Write::Put(marked));
        }
        self.answer(attempt, Told::Unknown)
    }

    fn sweep(&mut self, model: &IdemModel) -> Option<()> {
        let token = self.record()?.token;
        let marked = decision::mark_ambiguous(self.record(), &model.id, token, self.now).ok()?;
        self.apply(Write::Put(marked));
        Some(())
    }

    fn look(&mut self, resolver: usize, fails: bool) -> Option<()> {
        let (token, lease_until) = self.record().map(|r| (r.token, r.lease_until))?;
        let answer = match self.effects.iter().position(|e| e.token == token) {
            _ if fails => Answer::Failed,
            Some(effect) => Answer::Found(effect),
            None => Answer::NotFound,
        };
        let asked_at = self.now;
        *self.resolvers.get_mut(resolver)? = Resolver::Judged {
            token,
            answer,
            asked_at,
            lease_until,
        };
        Some(())
    }

    fn resolve(&mut self, model: &IdemModel, resolver: usize) -> Option<()> {
        let Resolver::Judged {
            token,
            answer,
            asked_at,
            lease_until,
        } = *self.resolvers.get(resolver)?
        else {
            return None;
        };
        *self.resolvers.get_mut(resolver)? = Resolver::Idle;
        let inline = resolver == 2;
        let (verdict, executed) = match model.verdict(answer, asked_at, lease_until, inline) {
            verdict::Verdict::Resolve(Outcome::Completed { result }) => {
                (model.found_with(result)?, true)
            }
            verdict::Verdict::Resolve(Outcome::NotExecuted) => (model.not_found.clone(), false),
            verdict::Verdict::CountFailure => return self.count_failure(model, token),
            // Asked while the attempt could still commit: nothing is written,
            // and the resolver may look again.
            verdict::Verdict::AskAgain { .. } => return Some(()),
        };
        let landed_on = self.record().map(|r| r.token);
        if let Ok(write) = model.resolve(self, token, verdict) {
            self.apply(write);
            // The store deletes the record's tries with the resolution.
            self.tries = None;
            self.verdicts.push(Verdict {
                about: token,
                landed_on: landed_on?,
                executed,
                by_retry: resolver == 2,
            });
        }
        Some(())
    }

    /// The store counts a failed lookup of the attempt holding `token`
    /// (`decision::note_failed_lookup`); the next may start after the
    /// backoff.
    fn count_failure(&mut self, model: &IdemModel, token: Token) -> Option<()> {
        let kept = self.tries_of(token);
        let next_at = self.now.plus_millis(crate::BACKOFF_MS);
        let counted = decision::note_failed_lookup(
            self.record(),
            kept.as_ref(),
            &model.id,
            token,
            next_at,
            self.now,
        );
        if let Ok(t) = counted {
            self.tries = Some((t.token, t.failures, t.next_at));
        }
        Some(())
    }

    fn answer(&mut self, attempt: usize, told: Told) -> Option<()> {
        let a = self.attempts.get_mut(attempt)?;
        a.gateway = Gateway::Answered;
        let client = a.client;
        self.clients.get_mut(client)?.told.push(told);
        Some(())
    }

    /// Applies a decision's write to the one record, as a store does.
    pub(crate) fn apply(&mut self, write: Write) {
        match write {
            Write::None => {}
            Write::Put(record) => self.record = Some(Kept(record)),
            Write::Delete => self.record = None,
        }
    }

    /// The earliest deadline after now: where time next changes an answer.
    fn next_deadline(&self, model: &IdemModel) -> Option<Timestamp> {
        let mut deadlines = vec![model.replay_horizon()];
        deadlines.extend(self.attempts.iter().map(|a| a.lease_until));
        deadlines.extend(self.tries.map(|(_, _, next_at)| next_at));
        deadlines.extend(
            self.window
                .as_ref()
                .map(|w| w.opened_at.plus_millis(crate::LEASE_MS)),
        );
        if let Some(r) = self.record() {
            deadlines.push(r.lease_until);
            deadlines.extend(r.expires_at);
            deadlines.extend(r.tombstone_until);
        }
        deadlines.into_iter().filter(|d| *d > self.now).min()
    }
}

/// The effect whose result a record holds: its body is the effect's index.
pub(crate) fn effect_of(record: &Record) -> Option<usize> {
    record
        .result
        .as_ref()
        .and_then(|r| r.body().first())
        .map(|b| usize::from(*b))
}

/// Runs the store's resolve: the production decision, with the mutants'
/// distortions of its inputs.
pub(crate) fn resolve_in(
    protocol: Protocol,
    world: &World,
    id: &idem_core::RecordId,
    token: Token,
    verdict: Resolution,
) -> Result<Write, StoreError> {
    let record = world.record();
    let (token, now) = match (protocol, record) {
        // Before the hardening fix a "not executed" verdict was accepted at
        // once: judged as if the attempt's lease were already over.
        (Protocol::ResolveSkipsLease, Some(r)) if verdict.outcome == Outcome::NotExecuted => {
            (token, world.now.max(r.lease_until))
        }
        (Protocol::ResolveIgnoresToken, Some(r)) => (r.token, world.now),
        _ => (token, world.now),
    };
    decision::resolve(record, id, token, verdict, now).map(|(write, _journal)| write)
}

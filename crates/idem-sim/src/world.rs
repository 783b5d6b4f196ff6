//! The simulated topology and its fault injectors: an at-least-once queue
//! with a DLQ, an orchestrator with retries, a payout API that is slow or
//! crashes, a bank rail, a reconciler, and one or two regions whose stores
//! replicate. Everything happens in virtual time from one event queue; what
//! happened is written to a [`Log`] that only the checker judges.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use idem_core::verdict::LookupAnswer;
use idem_core::window::verify_verdict;
use idem_core::{
    Claim, ClaimRequest, Clock, Completion, CompletionTable, Dedup, Fingerprint, IdempotencyKey,
    LeaseExpiry, ListQuery, ManualClock, Outcome, RecordId, Resolution, Scope, State, Store,
    StoreError, StoreFuture, StoredResult, Timestamp, Token, Verification, WindowOpening,
};
use idem_reconcile::{
    Finding, Provider, ProviderFuture, ReconcileReport, ReconcileSettings, Reconciler,
};

use crate::checker::{AnswerObs, EffectObs, Log};
use crate::design::{RegionMode, Topology, Workload};
use crate::rng::Rng;
use crate::tap::{Bank, Tapped, Write};

/// Virtual time starts here (2026-01-01), so timestamps look like real ones.
const EPOCH_MS: u64 = 1_767_225_600_000;
/// A run that needs more events than this is cut short and reported.
const EVENTS_MAX: u64 = 2_000_000;
/// Network delay of one reply, in milliseconds.
const NET_MS: u64 = 1;
/// The status the payout API answers once it has paid.
const PAID_STATUS: u16 = 201;

/// Runs one seed and returns the log of what happened.
pub(crate) fn simulate(
    topo: &Topology,
    w: &Workload,
    op: &str,
    seed: u64,
    make_store: &dyn Fn(Arc<dyn Clock>) -> Arc<dyn Store>,
) -> Log {
    let clock = ManualClock::new(Timestamp::from_millis(EPOCH_MS));
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let stores: Vec<Arc<dyn Store>> = match topo.mode {
        RegionMode::Single => vec![make_store(shared)],
        RegionMode::Sync => {
            let one = make_store(shared);
            vec![one.clone(), one]
        }
        RegionMode::HomeRegion | RegionMode::AnyRegion => {
            vec![make_store(shared.clone()), make_store(shared)]
        }
    };
    let mut world = World::new(topo, w, clock, stores, op, seed);
    world.populate(op, seed);
    world.run();
    world.into_log()
}

/// Something that happens at a virtual instant.
enum Ev {
    Deliver {
        intent: usize,
    },
    Visibility {
        intent: usize,
        delivery: u32,
    },
    Redrive {
        intent: usize,
    },
    Send {
        handler: usize,
    },
    Timeout {
        attempt: usize,
    },
    Effect {
        attempt: usize,
    },
    Respond {
        attempt: usize,
    },
    Reply {
        attempt: usize,
        reply: Reply,
    },
    // Boxed: the queue moves every event a few times as it sifts, and a
    // write carries a whole claim (measured: memmove 15% of a run).
    Replicate {
        from: usize,
        to: usize,
        op: Box<ReplOp>,
    },
    Reconcile {
        region: usize,
    },
    Resend {
        intent: usize,
    },
    Failover,
    Purge,
}

/// What reaches the caller.
enum Reply {
    Ok { body: String, replay: bool },
    Conflict,
    Rejected,
    Unavailable,
}

/// A write shipped to the other region's store, re-applied through the
/// `Store` API; tokens are translated through the replica's own.
enum ReplOp {
    Claim(ClaimRequest, Token),
    Complete(RecordId, Token, StoredResult),
    Release(RecordId, Token),
    MarkAmbiguous(RecordId, Token),
    Resolve(RecordId, Token, Resolution),
}

impl ReplOp {
    /// The record the write is about.
    fn id(&self) -> &RecordId {
        match self {
            ReplOp::Claim(req, _) => &req.id,
            ReplOp::Complete(id, ..)
            | ReplOp::Release(id, _)
            | ReplOp::MarkAmbiguous(id, _)
            | ReplOp::Resolve(id, ..) => id,
        }
    }
}

struct Item {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Item {
    /// Reversed: `BinaryHeap` pops the earliest (time, sequence) first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct Intent {
    scope: Scope,
    key: IdempotencyKey,
    fp: Fingerprint,
    home: usize,
    poisoned: bool,
    ack_lost: bool,
    resend_planned: bool,
    // Queue message state.
    deliveries: u32,
    receives: u32,
    acked: bool,
    redriven: bool,
}

struct Handler {
    intent: usize,
    resend: bool,
    attempts: u32,
    done: bool,
}

struct Attempt {
    handler: usize,
    region: usize,
    id: RecordId,
    fp: Fingerprint,
    token: Option<Token>,
    settled: bool,
    effect: Option<String>,
}

struct World<'a> {
    topo: &'a Topology,
    w: &'a Workload,
    clock: ManualClock,
    stores: Vec<Arc<dyn Store>>,
    faults: Rng,
    queue: BinaryHeap<Item>,
    seq: u64,
    now: u64,
    events: u64,
    intents: Vec<Intent>,
    handlers: Vec<Handler>,
    attempts: Vec<Attempt>,
    down: Vec<bool>,
    failed_over: bool,
    tokens: BTreeMap<(usize, RecordId, Token), Token>,
    bank: BTreeMap<RecordId, Vec<usize>>,
    crashed_after: BTreeSet<RecordId>,
    /// The bank's lookup API, as the reconcilers ask it.
    bank_api: Arc<Bank>,
    /// Per region, the real reconciler over that region's store (`None`
    /// when the route takes over expired leases instead: no lookup).
    reconcilers: Vec<Option<SimReconciler>>,
    /// Attempts (region, key, token) with a failed lookup not yet resolved.
    failed_lookups: BTreeSet<(usize, RecordId, Token)>,
    /// Per region, when its reconciler's next scan is scheduled.
    scan_at: Vec<Option<u64>>,
    /// What the gateway makes of the API's answer: the core's table, as
    /// `idem serve` uses it for a route without overrides.
    completion: CompletionTable,
    log: Log,
}

impl<'a> World<'a> {
    fn new(
        topo: &'a Topology,
        w: &'a Workload,
        clock: ManualClock,
        stores: Vec<Arc<dyn Store>>,
        op: &str,
        seed: u64,
    ) -> World<'a> {
        // The simulated gateway does not declare `upstream_dedups`; a table
        // without overrides cannot be refused.
        let completion = CompletionTable::new([], Dedup::Idem)
            .unwrap_or_else(|e| unreachable!("an empty table is valid: {e}"));
        let bank_api = Arc::new(Bank::new(seed, w.lookup_failure));
        let mut errors = Vec::new();
        let reconcilers: Vec<Option<SimReconciler>> = (0..stores.len())
            .map(|r| {
                if topo.policy.on_lease_expiry() != LeaseExpiry::Reconcile {
                    return None;
                }
                let made = SimReconciler::new(
                    &stores[r],
                    &bank_api,
                    op,
                    topo,
                    w,
                    Arc::new(clock.clone()),
                    Rng::new(seed, 4 + r as u64).next_u64(),
                );
                made.map_err(|e| errors.push(format!("region {r}: {e}")))
                    .ok()
            })
            .collect();
        let log = Log {
            errors,
            ..Log::default()
        };
        World {
            topo,
            w,
            clock,
            down: vec![false; stores.len()],
            stores,
            faults: Rng::new(seed, 2),
            queue: BinaryHeap::new(),
            seq: 0,
            now: 0,
            events: 0,
            intents: Vec::new(),
            handlers: Vec::new(),
            attempts: Vec::new(),
            failed_over: false,
            tokens: BTreeMap::new(),
            bank: BTreeMap::new(),
            crashed_after: BTreeSet::new(),
            scan_at: vec![None; reconcilers.len()],
            failed_lookups: BTreeSet::new(),
            bank_api,
            reconcilers,
            completion,
            log,
        }
    }

    /// The workload: intents, their arrival, which are poisoned, the failover.
    fn populate(&mut self, op: &str, seed: u64) {
        let mut arrivals = Rng::new(seed, 1);
        // Three tenants: each scope is built once and shared by its intents.
        let tenants: Vec<_> = (0..3)
            .map(|t| Scope::from_parts(op, &format!("tenant-{t}"), None))
            .collect();
        for i in 0..self.w.intents as usize {
            let scope = tenants[i % 3].clone();
            let key = IdempotencyKey::parse(&format!("payout:seller-{i}:2026-W36"));
            let (Ok(scope), Ok(key)) = (scope, key) else {
                self.log
                    .errors
                    .push(format!("intent {i}: invalid scope or key"));
                continue;
            };
            let fp = fingerprint(i as u64, 0);
            self.log.intent_fps.push(fp);
            let at = arrivals.range(0, self.w.arrival_spread_s * 1000);
            let poisoned = arrivals.chance(self.w.post_effect_failure);
            self.intents.push(Intent {
                scope,
                key,
                fp,
                home: i % self.stores.len(),
                poisoned,
                ack_lost: false,
                resend_planned: false,
                deliveries: 0,
                receives: 0,
                acked: false,
                redriven: false,
            });
            self.at(at, Ev::Deliver { intent: i });
        }
        if self.stores.len() > 1 {
            self.at(self.w.failover_at_s * 1000, Ev::Failover);
        }
        self.at(self.w.purge_every_s.max(1) * 1000, Ev::Purge);
    }

    fn run(&mut self) {
        while let Some(item) = self.queue.pop() {
            self.events += 1;
            if self.events > EVENTS_MAX {
                self.log.truncated = true;
                return;
            }
            self.now = item.at;
            self.clock.set(Timestamp::from_millis(EPOCH_MS + item.at));
            self.handle(item.ev);
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { intent } => self.deliver(intent),
            Ev::Visibility { intent, delivery } => {
                let m = &self.intents[intent];
                if !m.acked && m.deliveries == delivery {
                    self.deliver(intent);
                }
            }
            Ev::Redrive { intent } => {
                self.intents[intent].redriven = true;
                self.intents[intent].receives = 0;
                self.deliver(intent);
            }
            Ev::Send { handler } => self.send(handler),
            Ev::Timeout { attempt } => {
                if !self.attempts[attempt].settled {
                    self.attempts[attempt].settled = true;
                    self.retry(self.attempts[attempt].handler);
                }
            }
            Ev::Effect { attempt } => self.effect(attempt),
            Ev::Respond { attempt } => self.respond(attempt),
            Ev::Reply { attempt, reply } => self.reply(attempt, reply),
            Ev::Replicate { to, op, .. } => self.apply_replicated(to, *op),
            Ev::Reconcile { region } => self.reconcile(region),
            Ev::Resend { intent } => {
                let h = self.new_handler(intent, true);
                self.send(h);
            }
            Ev::Failover => self.failover(),
            Ev::Purge => self.purge(),
        }
    }

    /// The queue hands the message to a consumer, or moves it to the DLQ.
    fn deliver(&mut self, i: usize) {
        let m = &mut self.intents[i];
        if m.acked {
            return;
        }
        m.receives += 1;
        m.deliveries += 1;
        let delivery = m.deliveries;
        let (visibility_s, max_receives) = self.topo.queue.unwrap_or((u64::MAX / 4000, 1));
        if m.receives > max_receives {
            // Dead-lettered; redriven once, later, if the contract says so.
            if let (false, Some(after_s)) = (m.redriven, self.topo.redrive_after_s) {
                self.after(after_s * 1000, Ev::Redrive { intent: i });
            }
            return;
        }
        let h = self.new_handler(i, false);
        self.after(0, Ev::Send { handler: h });
        if self.topo.queue.is_some() {
            self.after(
                visibility_s * 1000,
                Ev::Visibility {
                    intent: i,
                    delivery,
                },
            );
        }
    }

    fn new_handler(&mut self, intent: usize, resend: bool) -> usize {
        self.handlers.push(Handler {
            intent,
            resend,
            attempts: 0,
            done: false,
        });
        self.handlers.len() - 1
    }

    /// The orchestrator makes one attempt: the gateway claims, then calls the API.
    fn send(&mut self, h: usize) {
        if self.handlers[h].done {
            return;
        }
        self.handlers[h].attempts += 1;
        self.log.attempts += 1;
        let (i, resend) = (self.handlers[h].intent, self.handlers[h].resend);
        let id = self.attempt_id(i);
        let fp = if resend {
            fingerprint(i as u64, 1)
        } else {
            self.intents[i].fp
        };
        let region = self.route(i);
        let a = self.attempts.len();
        self.attempts.push(Attempt {
            handler: h,
            region,
            id: id.clone(),
            fp,
            token: None,
            settled: false,
            effect: None,
        });
        self.after(self.topo.timeout_ms, Ev::Timeout { attempt: a });
        let r = region;
        if self.down[r] {
            return self.send_reply(a, Reply::Unavailable);
        }
        let req = ClaimRequest {
            id,
            fingerprint: fp,
            legacy_fingerprint: None,
            owner: format!("r{r}/a{a}"),
            region: None,
            policy: self.topo.policy,
        };
        let reply = match now_ready(self.stores[r].claim(&req)) {
            Ok(Claim::Acquired {
                token, took_over, ..
            }) => {
                self.attempts[a].token = Some(token);
                self.replicate(r, ReplOp::Claim(req.clone(), token));
                // The record is in progress: the lease sweep must see it.
                self.wake_reconciler(r);
                if took_over.is_none()
                    && let Some(reply) = self.verify_fresh(r, &req.id, token)
                {
                    return self.send_reply(a, reply);
                }
                return self.start_api(a);
            }
            Ok(Claim::Replay { record }) => {
                if self.failed_over && r == 1 && record.owner.starts_with("r0/") {
                    self.log.coverage.replay_after_failover += 1;
                }
                let body = record.result.map(|res| body_text(res.body()));
                Reply::Ok {
                    body: body.unwrap_or_default(),
                    replay: true,
                }
            }
            Ok(Claim::OutcomeUnknown { newly_marked }) => {
                self.log.coverage.conflict_409 += 1;
                if newly_marked {
                    self.marked(r, &req.id);
                }
                Reply::Conflict
            }
            Ok(Claim::InFlight { .. }) => {
                self.log.coverage.conflict_409 += 1;
                Reply::Conflict
            }
            Ok(Claim::Mismatch { .. }) => {
                self.log.coverage.mismatch_422 += 1;
                Reply::Rejected
            }
            Ok(Claim::Expired { .. }) => {
                self.log.late_replays_rejected += 1;
                Reply::Rejected
            }
            Ok(_) | Err(_) => Reply::Unavailable,
        };
        self.send_reply(a, reply);
    }

    /// Inside the suspect window of region `r`'s store, a fresh claim asks
    /// the bank by the key first, as the gateway does
    /// (`idem_core::window::verify_verdict`): found, the record is
    /// completed with the bank's answer and that is the reply; not yet
    /// provable or no answer, the claim is released and the caller told to
    /// try again; `None`: call the API.
    fn verify_fresh(&mut self, r: usize, id: &RecordId, token: Token) -> Option<Reply> {
        let window = now_ready(self.stores[r].suspect_window()).ok().flatten()?;
        let now = self.clock.now();
        if !window.is_open(now) {
            return None;
        }
        let answer = match now_ready_finding(self.bank_api.ask(id)) {
            Finding::Found { result, .. } => LookupAnswer::Found(result),
            Finding::NotFound { .. } => LookupAnswer::NotFound,
            Finding::Failed { .. } => LookupAnswer::Failed,
        };
        match verify_verdict(answer, now, &window, self.topo.policy.lease_ms()) {
            Verification::NotExecuted => None,
            Verification::Executed(result) => {
                let body = body_text(result.body());
                match now_ready(self.stores[r].complete(id, token, result.clone())) {
                    Ok(_) => {
                        self.replicate(r, ReplOp::Complete(id.clone(), token, result));
                        self.log.window_verified += 1;
                        Some(Reply::Ok { body, replay: true })
                    }
                    Err(_) => Some(Reply::Unavailable),
                }
            }
            Verification::NotYet { .. } | Verification::Failed { .. } => {
                if now_ready(self.stores[r].release(id, token)).is_ok() {
                    self.replicate(r, ReplOp::Release(id.clone(), token));
                }
                Some(Reply::Unavailable)
            }
        }
    }

    /// The key this attempt sends: the intent's, or a fresh one per attempt.
    fn attempt_id(&mut self, i: usize) -> RecordId {
        let intent = &self.intents[i];
        let mut id = RecordId {
            scope: intent.scope.clone(),
            key: intent.key.clone(),
        };
        if self.topo.per_attempt_keys {
            let fresh = format!("{:016x}", self.faults.next_u64());
            if let Ok(key) = IdempotencyKey::parse(&fresh) {
                id.key = key;
            }
        }
        id
    }

    /// Which region serves intent `i` now: its home region, and region 1
    /// once region 0 has failed. In home-region mode that moves region 0's
    /// keys to region 1 as soon as the failover is declared (at once: the
    /// contract names no decision delay); waiting for a catch-up would wait
    /// forever, since a dead region ships nothing more.
    fn route(&self, i: usize) -> usize {
        if self.failed_over {
            1
        } else {
            self.intents[i].home
        }
    }

    /// The payout API after a successful claim: effect, maybe a crash, a reply.
    fn start_api(&mut self, a: usize) {
        let (cb, ca) = (self.w.crash_before_effect, self.w.crash_after_effect);
        let roll = self.faults.range(0, 1_000_000) as f64 / 1_000_000.0;
        if roll < cb {
            return; // crashed before the effect: no effect, no reply
        }
        let effect_ms = self.faults.range(1, self.w.effect_delay_max_ms.max(1));
        self.after(effect_ms, Ev::Effect { attempt: a });
        if roll < cb + ca {
            self.crashed_after.insert(self.attempts[a].id.clone());
            return; // crashed after the effect: no completion, no reply
        }
        let timeout = self.topo.timeout_ms;
        let latency = if self.faults.chance(self.w.slow_tail) {
            self.faults.range(timeout, 4 * timeout)
        } else {
            self.faults.range(20, self.w.latency_max_ms.max(20))
        };
        self.after(latency.max(effect_ms + 1), Ev::Respond { attempt: a });
    }

    /// The bank rail performs the payout (and records it).
    fn effect(&mut self, a: usize) {
        let (region, id, fp) = {
            let at = &self.attempts[a];
            (at.region, at.id.clone(), at.fp)
        };
        if self.down[region] {
            return;
        }
        if let Some(window_s) = self.topo.bank_dedup_window_s {
            let earlier = self.bank.get(&id).and_then(|v| v.last()).copied();
            if let Some(e) = earlier {
                let eff = &self.log.effects[e];
                if self.now.saturating_sub(eff.at_ms) < window_s * 1000 {
                    self.attempts[a].effect = Some(eff.body.clone());
                    return;
                }
            }
        }
        let n = self.log.effects.len();
        let body = format!("payout-{n}");
        let intent = self.handlers[self.attempts[a].handler].intent;
        self.log.effects.push(EffectObs {
            intent,
            id: id.clone(),
            region,
            fp,
            body: body.clone(),
            at_ms: self.now,
            acquired: self.attempts[a].token.is_some(),
        });
        match StoredResult::new(PAID_STATUS, vec![], body.clone().into_bytes()) {
            Ok(result) => self.bank_api.paid(id.clone(), result),
            Err(e) => self.log.errors.push(format!("bank result refused: {e}")),
        }
        self.bank.entry(id).or_default().push(n);
        self.attempts[a].effect = Some(body);
    }

    /// The API finishes: the gateway completes the record, the reply may be lost.
    fn respond(&mut self, a: usize) {
        let at = &self.attempts[a];
        let (Some(body), Some(token), r) = (at.effect.clone(), at.token, at.region) else {
            return;
        };
        if self.down[r] {
            return;
        }
        let id = at.id.clone();
        match self.completion.classify(PAID_STATUS) {
            Completion::Final => {
                match StoredResult::new(PAID_STATUS, vec![], body.clone().into_bytes()) {
                    Ok(result) => {
                        match now_ready(self.stores[r].complete(&id, token, result.clone())) {
                            Ok(_) => self.replicate(r, ReplOp::Complete(id, token, result)),
                            Err(StoreError::Fenced { .. }) => {
                                self.log.coverage.fenced_zombie_write += 1
                            }
                            Err(_) => {}
                        }
                    }
                    Err(e) => self.log.errors.push(format!("result refused: {e}")),
                }
            }
            Completion::Release => {
                if now_ready(self.stores[r].release(&id, token)).is_ok() {
                    self.replicate(r, ReplOp::Release(id, token));
                }
            }
            Completion::Unknown => {
                if now_ready(self.stores[r].mark_ambiguous(&id, token)).is_ok() {
                    self.marked(r, &id);
                }
            }
        }
        if self.faults.chance(self.w.lost_ack) {
            let i = self.handlers[self.attempts[a].handler].intent;
            self.intents[i].ack_lost = true;
            return;
        }
        self.send_reply(
            a,
            Reply::Ok {
                body,
                replay: false,
            },
        );
    }

    fn send_reply(&mut self, a: usize, reply: Reply) {
        self.after(NET_MS, Ev::Reply { attempt: a, reply });
    }

    /// The orchestrator reads a reply (unless it already gave up on the attempt).
    fn reply(&mut self, a: usize, reply: Reply) {
        if self.attempts[a].settled {
            return;
        }
        self.attempts[a].settled = true;
        let h = self.attempts[a].handler;
        match reply {
            Reply::Ok { body, replay } => {
                let i = self.handlers[h].intent;
                self.log.answers.push(AnswerObs {
                    id: self.attempts[a].id.clone(),
                    body,
                    replay,
                    fp: self.attempts[a].fp,
                });
                if replay && !self.handlers[h].resend && self.intents[i].ack_lost {
                    self.intents[i].ack_lost = false;
                    self.log.coverage.lost_ack_then_replay += 1;
                }
                self.succeeded(h);
            }
            Reply::Rejected => self.finish(h, true),
            Reply::Conflict | Reply::Unavailable => self.retry(h),
        }
    }

    fn succeeded(&mut self, h: usize) {
        let i = self.handlers[h].intent;
        if self.handlers[h].resend {
            return self.finish(h, false);
        }
        if !self.intents[i].resend_planned && self.faults.chance(self.w.mismatch_resend) {
            self.intents[i].resend_planned = true;
            let later = self.faults.range(1_000, 600_000);
            self.after(later, Ev::Resend { intent: i });
        }
        // A poisoned message's next step fails until it has been redriven.
        let ack = !self.intents[i].poisoned || self.intents[i].redriven;
        self.finish(h, ack);
    }

    fn finish(&mut self, h: usize, ack: bool) {
        self.handlers[h].done = true;
        if ack && !self.handlers[h].resend {
            self.intents[self.handlers[h].intent].acked = true;
        }
    }

    fn retry(&mut self, h: usize) {
        let n = self.handlers[h].attempts;
        if n >= self.topo.attempts {
            self.handlers[h].done = true; // no ack: the queue redelivers
            return;
        }
        let exp = self.w.backoff_base_ms.saturating_mul(1 << n.min(20));
        let cap = exp.min(self.topo.backoff_max_ms.max(1));
        let delay = self.faults.range(cap / 2, cap);
        self.after(delay, Ev::Send { handler: h });
    }

    /// A gateway marked the record ambiguous: ship the write, and make sure
    /// the reconciler scans.
    fn marked(&mut self, r: usize, id: &RecordId) {
        if let Ok(Some(record)) = now_ready(self.stores[r].get(id)) {
            self.replicate(r, ReplOp::MarkAmbiguous(id.clone(), record.token));
        }
        self.wake_reconciler(r);
    }

    /// Schedules region `r`'s reconciler scan at its next tick, if none is
    /// scheduled. The real reconciler scans every `interval_s` from its
    /// start (time 0 here); ticks at which it would find nothing to do are
    /// not simulated.
    fn wake_reconciler(&mut self, r: usize) {
        if self.scan_at[r].is_some() || self.reconcilers[r].is_none() {
            return;
        }
        let interval = self.topo.reconcile.interval().as_millis();
        let interval = u64::try_from(interval).unwrap_or(u64::MAX).max(1);
        let next = (self.now / interval)
            .saturating_add(1)
            .saturating_mul(interval);
        self.scan_at[r] = Some(next);
        self.at(next, Ev::Reconcile { region: r });
    }

    /// One scan of region `r`'s real reconciler (`Reconciler::run_once`:
    /// the lease sweep, the triage of ambiguous records, the lookups, the
    /// backoff of failed ones); its writes are shipped and counted.
    fn reconcile(&mut self, r: usize) {
        self.scan_at[r] = None;
        if self.down[r] {
            return;
        }
        let Some(rec) = &self.reconcilers[r] else {
            return;
        };
        // The reconciler's log lines are for operators; the simulator
        // reports through its own counters.
        // The dispatch is made once per thread: making one rebuilds every
        // callsite's interest, 2 % of a whole run's samples by itself.
        let scanned = QUIET.with(|quiet| {
            tracing::dispatcher::with_default(quiet, || {
                RUNTIME.with(|rt| match rt {
                    Ok(rt) => Ok(rt.block_on(rec.reconciler.run_once())),
                    Err(e) => Err(format!("cannot start the reconciler's runtime: {e}")),
                })
            })
        });
        let report = match scanned {
            Ok(report) => report,
            Err(e) => {
                self.log.errors.push(e);
                return;
            }
        };
        let writes = rec.store.take();
        for write in writes {
            match write {
                Write::Marked(id, token) => {
                    self.log.coverage.lease_swept += 1;
                    self.replicate(r, ReplOp::MarkAmbiguous(id, token));
                }
                Write::LookupFailed(id, token) => {
                    self.failed_lookups.insert((r, id, token));
                }
                Write::Resolved(id, token, resolution) => {
                    self.log.reconciliations += 1;
                    if self.failed_lookups.remove(&(r, id.clone(), token)) {
                        self.log.coverage.failed_lookup_then_resolved += 1;
                    }
                    let completed = matches!(resolution.outcome, Outcome::Completed { .. });
                    if completed && self.crashed_after.contains(&id) {
                        self.log.coverage.crash_after_effect_then_reconcile += 1;
                    }
                    self.replicate(r, ReplOp::Resolve(id, token, resolution));
                }
            }
        }
        if self.scan_again(r, &report) {
            self.wake_reconciler(r);
        }
    }

    /// Whether the next tick of region `r`'s reconciler has anything to do:
    /// a record in progress (its lease may expire), or an ambiguous record
    /// it is waiting on (a backoff, a lease), tried, resolved or could not
    /// reach the store for. Records left for an operator wake nobody.
    fn scan_again(&self, r: usize, report: &ReconcileReport) -> bool {
        let in_progress = ListQuery {
            state: Some(State::InProgress),
            limit: 1,
            ..ListQuery::default()
        };
        let busy = now_ready(self.stores[r].list(&in_progress))
            .map_or(true, |page| !page.records.is_empty());
        busy || report.waiting
            + report.retried
            + report.errors
            + report.completed
            + report.released
            + report.expired_leases
            > 0
    }

    /// Region 0 fails hard: its API stops, callers waiting on it see a
    /// reset, and its unshipped writes are gone.
    fn failover(&mut self) {
        self.failed_over = true;
        self.down[0] = true;
        self.drop_tail(0);
        if self.w.suspect_window && self.stores.len() > 1 {
            let opening = WindowOpening {
                length_ms: idem_core::window::WINDOW_MS_MAX,
                since: None,
                cause: "region 0 failed hard".into(),
            };
            if let Err(e) = now_ready(self.stores[1].open_suspect_window(&opening)) {
                self.log
                    .errors
                    .push(format!("cannot open the suspect window: {e}"));
            }
        }
        for a in 0..self.attempts.len() {
            if self.attempts[a].region == 0 && !self.attempts[a].settled {
                self.after(
                    0,
                    Ev::Reply {
                        attempt: a,
                        reply: Reply::Unavailable,
                    },
                );
            }
        }
    }

    /// Drops every write region `failed` made that the other region has not
    /// received yet, and counts them: an asynchronous write was acknowledged
    /// before it was shipped, and a dead region never ships its tail.
    /// (Synchronous mode ships nothing: a write is acknowledged only once
    /// both regions have it, so its tail is always empty.)
    fn drop_tail(&mut self, failed: usize) {
        let mut writes = 0u64;
        let mut keys = BTreeSet::new();
        self.queue.retain(|item| match &item.ev {
            Ev::Replicate { from, op, .. } if *from == failed => {
                writes += 1;
                keys.insert(op.id().clone());
                false
            }
            _ => true,
        });
        self.log.tail_writes_lost += writes;
        self.log.tail_keys_lost += keys.len() as u64;
    }

    fn replicate(&mut self, from: usize, op: ReplOp) {
        if self.topo.replicate && self.stores.len() > 1 {
            let to = 1 - from;
            self.after(
                self.topo.lag_ms,
                Ev::Replicate {
                    from,
                    to,
                    op: Box::new(op),
                },
            );
        }
    }

    fn apply_replicated(&mut self, to: usize, op: ReplOp) {
        if self.down[to] {
            return;
        }
        let store = self.stores[to].clone();
        let map = |w: &World, id: &RecordId, t: Token| w.tokens.get(&(to, id.clone(), t)).copied();
        match op {
            ReplOp::Claim(req, src) => match now_ready(store.claim(&req)) {
                Ok(Claim::Acquired { token, .. }) => {
                    self.tokens.insert((to, req.id, src), token);
                    self.wake_reconciler(to);
                }
                _ => self.log.replication_conflicts += 1,
            },
            ReplOp::Complete(id, src, result) => {
                if let Some(t) = map(self, &id, src) {
                    let _ = now_ready(store.complete(&id, t, result));
                }
            }
            ReplOp::Release(id, src) => {
                if let Some(t) = map(self, &id, src) {
                    let _ = now_ready(store.release(&id, t));
                }
            }
            ReplOp::MarkAmbiguous(id, src) => {
                if let Some(t) = map(self, &id, src)
                    && now_ready(store.mark_ambiguous(&id, t)).is_ok()
                {
                    self.wake_reconciler(to);
                }
            }
            ReplOp::Resolve(id, src, resolution) => {
                if let Some(t) = map(self, &id, src) {
                    let _ = now_ready(store.resolve(&id, t, resolution));
                }
            }
        }
    }

    fn purge(&mut self) {
        for r in self.distinct_live_stores() {
            let _ = now_ready(self.stores[r].purge(idem_core::LIST_LIMIT_MAX));
        }
        if !self.queue.is_empty() {
            self.after(self.w.purge_every_s.max(1) * 1000, Ev::Purge);
        }
    }

    fn distinct_live_stores(&self) -> Vec<usize> {
        let n = if self.topo.mode == RegionMode::Sync {
            1
        } else {
            self.stores.len()
        };
        let mut live: Vec<usize> = (0..n).filter(|r| !self.down[*r]).collect();
        if live.is_empty() && self.topo.mode == RegionMode::Sync {
            live.push(1);
        }
        live
    }

    /// The end: records still in progress or ambiguous in a live region are stuck.
    fn into_log(mut self) -> Log {
        for r in self.distinct_live_stores() {
            for state in [State::InProgress, State::Ambiguous] {
                let query = ListQuery {
                    state: Some(state),
                    ..ListQuery::default()
                };
                if let Ok(page) = now_ready(self.stores[r].list(&query)) {
                    self.log.stuck += page.records.len() as u64;
                }
            }
        }
        self.log.end_ms = self.now;
        self.log
    }

    fn after(&mut self, delay_ms: u64, ev: Ev) {
        self.at(self.now.saturating_add(delay_ms), ev);
    }

    fn at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Item {
            at,
            seq: self.seq,
            ev,
        });
    }
}

thread_local! {
    /// Runs the reconciler's scans (its lookups are tasks), one per thread
    /// for every world it simulates; a scan takes no virtual time.
    static RUNTIME: std::io::Result<tokio::runtime::Runtime> =
        tokio::runtime::Builder::new_current_thread().build();
    /// Where the reconciler's log lines go during a scan: nowhere.
    static QUIET: tracing::Dispatch =
        tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
}

/// A region's real reconciler, over its store with the writes noted.
struct SimReconciler {
    store: Arc<Tapped>,
    reconciler: Reconciler,
}

impl SimReconciler {
    /// The reconciler `idem serve` runs for the route, with the workload's
    /// `[reconcile]` settings and the bank as the route's lookup.
    fn new(
        store: &Arc<dyn Store>,
        bank: &Arc<Bank>,
        op: &str,
        topo: &Topology,
        w: &Workload,
        clock: Arc<dyn Clock>,
        seed: u64,
    ) -> Result<SimReconciler, idem_reconcile::ConfigError> {
        let mut spec = w.reconcile.clone();
        spec.seed = Some(spec.seed.unwrap_or(seed));
        let settings = ReconcileSettings::new(&spec)?;
        debug_assert_eq!(settings.interval(), topo.reconcile.interval());
        let tapped = Arc::new(Tapped::new(Arc::clone(store)));
        let provider: Arc<dyn idem_reconcile::Provider> = bank.clone();
        let reconciler = Reconciler::with_providers(
            tapped.clone(),
            vec![(op.to_owned(), provider)],
            settings,
            clock,
        )?
        // The bank answers from memory; spacing lookups would only cost
        // wall-clock time (a scan takes no virtual time).
        .without_rate_limit();
        Ok(SimReconciler {
            store: tapped,
            reconciler,
        })
    }
}

/// Polls a store future once: the simulated stores answer at once.
/// The bank's answer, which it gives at once (an unready one counts as a
/// failed lookup).
fn now_ready_finding(mut f: ProviderFuture<'_>) -> Finding {
    let mut cx = Context::from_waker(Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(finding) => finding,
        Poll::Pending => Finding::Failed {
            reason: "the bank's lookup was not ready at once".into(),
        },
    }
}

pub(crate) fn now_ready<T>(mut f: StoreFuture<'_, T>) -> Result<T, StoreError> {
    let mut cx = Context::from_waker(Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => Err(StoreError::Unavailable {
            store: "simulated".into(),
            reason: "the store future was not ready at once; the simulator needs a store that answers immediately".into(),
        }),
    }
}

/// A request fingerprint standing for (intent, payload variant).
fn fingerprint(intent: u64, variant: u64) -> Fingerprint {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&intent.to_be_bytes());
    b[8..16].copy_from_slice(&variant.to_be_bytes());
    b[31] = 0x5a;
    Fingerprint::from_bytes(b)
}

fn body_text(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}

//! The reconciler: scans the store for ambiguous records, asks each route's
//! provider by key whether the effect happened, and resolves the record —
//! completed with the provider's answer, or released — never by re-executing
//! the request. What it cannot decide it leaves, bounded, for an operator.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use idem_core::SettleOnRetry;
use idem_core::verdict::{self, AfterFailure, AfterResolve, LookupAnswer, Triage, Verdict};
use idem_core::window::{self, SuspectWindow, Verification, VerifyFresh};
use idem_core::{
    Clock, DamagedRow, ListCursor, ListQuery, Listing, LookupTries, Outcome, RecordId, Resolution,
    State, Store, StoreError, Timestamp, Token,
};
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use tokio::time::{Duration, Instant};
use tracing::Instrument;
use tracing::field::Empty;

use crate::backoff::{Backoff, SplitMix64};
use crate::lookup::{Lookup, scope_parts};
use crate::probe::{Finding, Prober, Provider};
use crate::settings::{ConfigError, ReconcileSettings};

/// Who the reconciler's resolutions are recorded as resolved by.
pub const RESOLVED_BY: &str = "reconciler";

/// Who a resolution is journaled by when `asker` (e.g. `operator:ana`)
/// asked the reconciler to settle the record now:
/// `reconciler (asked by operator:ana)`.
pub fn asked_by(asker: &str) -> String {
    format!("{RESOLVED_BY} (asked by {asker})")
}
/// The most records a reconciler remembers hints about at once (see
/// [`Reconciler`]); past it, records are looked at without them.
pub const TRACKED_MAX: usize = 100_000;

/// Called after each resolution the reconciler makes, with who resolved it
/// ([`RESOLVED_BY`]) and the outcome (`completed` or `not_executed`): a
/// place to count resolutions in metrics.
pub type ResolutionHook = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// Resolves ambiguous records by asking each route's provider.
///
/// Failed lookups are counted in the store, per attempt
/// ([`Store::note_failed_lookup`]), with the time the next lookup may
/// start: a restarted gateway, another node and each cron run of `idem
/// reconcile --once` continue the same count and backoff, and give up on a
/// record after `max_tries` failures in all. Only hints live in memory,
/// bounded by [`TRACKED_MAX`]: which warnings were logged, and when an
/// attempt whose "not executed" was refused ends its lease.
pub struct Reconciler {
    store: Arc<dyn Store>,
    probers: HashMap<String, Arc<dyn Provider>>,
    /// Lookups start at most `rate_per_s` a second (off only for providers
    /// that answer from memory).
    rate_limited: bool,
    settings: ReconcileSettings,
    clock: Arc<dyn Clock>,
    on_resolution: Option<ResolutionHook>,
    scan: Mutex<ScanState>,
    inline: Inline,
    /// When [`Reconciler::run`]'s scans ran.
    scans: std::sync::Mutex<ScanTimes>,
}

/// When [`Reconciler::run`]'s scans ran, for a readiness probe to judge.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScanTimes {
    /// When the scan in progress started; `None` between scans.
    pub running_since: Option<Instant>,
    /// When the last scan finished; `None` before the first.
    pub last_finished: Option<Instant>,
}

/// What [`Reconciler::settle_now`] keeps: one lookup per key at a time, and
/// a bound on them all.
struct Inline {
    /// Per key, the lookup being asked (every other caller for the key
    /// waits for its answer and takes it as its own) or the time before
    /// which a lookup would prove nothing (an attempt that may still
    /// commit): one lookup serves a whole retry storm, and a scan asks
    /// nothing about a key a retry is asking about, or the reverse.
    flights: Flights,
    /// At most `concurrency` lookups at once besides the scans'; a caller
    /// that finds none free asks nothing.
    permits: tokio::sync::Semaphore,
    rng: std::sync::Mutex<SplitMix64>,
}

/// Every key's lookup in flight or not-before time, shared with the scans'
/// lookup tasks.
type Flights = Arc<std::sync::Mutex<HashMap<RecordId, Flight>>>;

/// The sending end of a flight: where its asker sends the answer.
type Answer = tokio::sync::watch::Sender<Option<Settled>>;

/// Ends `id`'s flight with what its lookup came to: a "not yet" keeps its
/// time, anything else clears the key; every caller that joined it gets
/// `settled`.
fn land(flights: &Flights, id: &RecordId, step: Option<&Step>, answer: Answer, settled: Settled) {
    {
        let mut flights = flights.lock().unwrap_or_else(|e| e.into_inner());
        match step {
            Some(Step::NotYet { until }) if flights.len() <= FLIGHTS_KEYS_MAX => {
                flights.insert(id.clone(), Flight::NotBefore(*until));
            }
            _ => {
                flights.remove(id);
            }
        }
    }
    answer.send_replace(Some(settled));
}

/// What a lookup's step comes to for a caller that joined it.
fn settled_of(step: Option<&Step>) -> Settled {
    match step {
        Some(Step::Resolved { completed }) => Settled::Resolved {
            completed: *completed,
        },
        Some(Step::Elsewhere) => Settled::Changed,
        _ => Settled::NotNow,
    }
}

/// A key's inline lookup, as [`Inline::flights`] keeps it.
enum Flight {
    /// Being asked; the answer arrives on this channel.
    Asking(tokio::sync::watch::Receiver<Option<Settled>>),
    /// "Not found" while the attempt may still commit: nothing is asked
    /// again before then (store clock).
    NotBefore(Timestamp),
}

/// The most keys [`Inline::flights`] holds. At the bound, the entries whose
/// asker is gone or whose not-before time has passed are dropped; a
/// not-before time that still finds it full is not kept (the next retry
/// asks again, as before it existed). Lookups in flight need no bound of
/// their own: the inline permits and the scans' concurrency bound them.
const FLIGHTS_KEYS_MAX: usize = 4096;

/// What settling one record at once ([`Reconciler::settle_now`]) came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// This call resolved it: completed with the provider's answer (true)
    /// or released as not executed (false).
    Resolved {
        /// Whether the provider found the effect.
        completed: bool,
    },
    /// The record is no longer the ambiguous attempt it was (settled by
    /// another caller, a scan or an operator, released, claimed again, or
    /// gone): whatever it is now, the claim will say.
    Changed,
    /// Nothing decided now: its operation has no lookup, a backoff or the
    /// lease still runs, the lookup failed (counted, as a scan's would be),
    /// the store failed, or every inline lookup slot is taken.
    NotNow,
}

/// A retry that meets an ambiguous record asks the reconciler to settle it
/// at once ([`Reconciler::settle_now`]: the same lookup, verdict, tries and
/// backoff as its scans), in the gateway or beside a service's own layer.
impl SettleOnRetry for Reconciler {
    fn settle<'a>(
        &'a self,
        id: &'a RecordId,
    ) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            matches!(
                self.settle_now(id).await,
                Settled::Resolved { .. } | Settled::Changed
            )
        })
    }
}

/// A fresh claim inside a suspect window asks the operation's lookup, as
/// [`Reconciler::verify_fresh`] does.
impl VerifyFresh for Reconciler {
    fn covers(&self, id: &RecordId) -> bool {
        self.has_lookup(id)
    }

    fn verify<'a>(
        &'a self,
        id: &'a RecordId,
        window: &'a SuspectWindow,
        lease_ms: u64,
    ) -> std::pin::Pin<Box<dyn Future<Output = Verification> + Send + 'a>> {
        Box::pin(self.verify_fresh(id, window, lease_ms))
    }
}

/// What one scan did. Every scanned record is counted in exactly one of the
/// other fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReconcileReport {
    /// `in_progress` records whose lease had expired (their gateway died or
    /// hung), marked ambiguous so they are reconciled rather than forgotten;
    /// only for operations with a lookup.
    pub expired_leases: u64,
    /// Ambiguous records looked at.
    pub scanned: u64,
    /// Found by the provider: completed with its answer.
    pub completed: u64,
    /// Not found by the provider: released, so a retry may run.
    pub released: u64,
    /// The lookup failed (other status, connect error, timeout, body too
    /// large) and was counted; tried again after a backoff.
    pub retried: u64,
    /// Skipped: the backoff of an earlier failed lookup has not elapsed, or
    /// the provider has not seen an attempt whose lease still runs.
    pub waiting: u64,
    /// Left for an operator: `max_tries` lookups of its attempt failed, in
    /// this scan or earlier ones (of any reconciler on the store).
    pub gave_up: u64,
    /// Left for an operator: the record's operation has no lookup configured.
    pub no_lookup: u64,
    /// Resolved or released by someone else meanwhile: nothing to do.
    pub resolved_elsewhere: u64,
    /// The store failed (listing, reading or counting tries, resolving);
    /// tried again on a later scan, no try counted.
    pub errors: u64,
    /// Stored rows that cannot be read (listed, skipped, logged).
    pub damaged: u64,
}

/// What the reconciler remembers between scans.
struct ScanState {
    /// Where the next scan continues, so every ambiguous record gets its turn.
    cursor: Option<ListCursor>,
    /// Where the next sweep of expired leases continues.
    lease_cursor: Option<ListCursor>,
    /// Number of the current pass over all ambiguous records.
    pass: u64,
    /// Hints about records seen in this process, bounded by [`TRACKED_MAX`].
    tracked: HashMap<RecordId, Tracked>,
    rng: SplitMix64,
    /// The earliest instant the next lookup may start (the rate limit).
    next_start: Instant,
}

/// What this process remembers about one ambiguous record: hints only,
/// the try count is in the store.
struct Tracked {
    /// The token of the attempt it was tracked for: a new ambiguity of the
    /// same key (after a release and a new claim) starts afresh.
    token: Token,
    /// The provider has not seen the attempt, whose lease runs until then.
    not_before: Option<Timestamp>,
    /// Why it was left for an operator, once that warning was logged.
    warned: Option<Parked>,
    /// The last pass that saw it; records not seen in a whole pass are forgotten.
    pass: u64,
}

/// Why a record is left for an operator (the warning is logged once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parked {
    GaveUp,
    NoLookup,
}

/// A record whose lookup is due: the attempt it is about, how to ask, and
/// how long to wait before the next lookup should this one fail.
struct Due {
    id: RecordId,
    token: Token,
    /// The attempt's lease end: a "not found" asked before it proves nothing.
    lease_until: Timestamp,
    prober: Arc<dyn Provider>,
    delay_ms: u64,
}

/// What one lookup task came to.
enum Step {
    /// Resolved: completed (true) or released (false).
    Resolved {
        completed: bool,
    },
    Elsewhere,
    /// "Not executed" while the attempt may still commit, until `until`.
    NotYet {
        until: Timestamp,
    },
    StoreFailed(String),
    /// The lookup failed and was counted: the tries now kept.
    LookupFailed {
        reason: String,
        tries: LookupTries,
    },
    /// The lookup failed, was counted, and was the last allowed.
    GaveUp {
        reason: String,
        tries: LookupTries,
    },
}

impl Reconciler {
    /// A reconciler over `store`, with one lookup per operation (the route
    /// name, as in `Scope::from_parts(operation, principal, region)`).
    ///
    /// Fails when an operation is empty, contains `|`, or has two lookups.
    pub fn new(
        store: Arc<dyn Store>,
        lookups: Vec<(String, Lookup)>,
        settings: ReconcileSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Reconciler, ConfigError> {
        let idle_max = settings.concurrency();
        let providers = lookups
            .into_iter()
            .map(|(operation, lookup)| {
                let prober: Arc<dyn Provider> = Arc::new(Prober::new(lookup, idle_max));
                (operation, prober)
            })
            .collect();
        Reconciler::with_providers(store, providers, settings, clock)
    }

    /// A reconciler that asks each operation's [`Provider`]: what the
    /// simulator runs, with a provider answering from its ledger.
    ///
    /// Fails when an operation is empty, contains `|`, or has two providers.
    pub fn with_providers(
        store: Arc<dyn Store>,
        providers: Vec<(String, Arc<dyn Provider>)>,
        settings: ReconcileSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Reconciler, ConfigError> {
        let mut probers = HashMap::with_capacity(providers.len());
        for (operation, prober) in providers {
            if operation.is_empty() || operation.contains('|') {
                return Err(ConfigError::new(
                    "lookup",
                    format!("operation {operation:?} must be non-empty without '|'"),
                ));
            }
            if probers.insert(operation.clone(), prober).is_some() {
                return Err(ConfigError::new(
                    "lookup",
                    format!("operation {operation:?} has two lookups"),
                ));
            }
        }
        let seed = settings
            .seed()
            .unwrap_or_else(|| clock.now().as_millis() ^ (u64::from(std::process::id()) << 32));
        let inline = Inline {
            flights: Flights::default(),
            permits: tokio::sync::Semaphore::new(settings.concurrency()),
            rng: std::sync::Mutex::new(SplitMix64::new(seed.rotate_left(17))),
        };
        Ok(Reconciler {
            store,
            probers,
            settings,
            clock,
            on_resolution: None,
            rate_limited: true,
            scan: Mutex::new(ScanState {
                cursor: None,
                lease_cursor: None,
                pass: 0,
                tracked: HashMap::new(),
                rng: SplitMix64::new(seed),
                next_start: Instant::now(),
            }),
            inline,
            scans: std::sync::Mutex::default(),
        })
    }

    /// When [`Reconciler::run`]'s scans ran.
    pub fn scan_times(&self) -> ScanTimes {
        *self.scans.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn note_scan(&self, running: bool) {
        let mut times = self.scans.lock().unwrap_or_else(|e| e.into_inner());
        if running {
            times.running_since = Some(Instant::now());
        } else {
            times.running_since = None;
            times.last_finished = Some(Instant::now());
        }
    }

    /// The time between two scans of [`Reconciler::run`].
    pub fn interval(&self) -> std::time::Duration {
        self.settings.interval()
    }

    /// Calls `hook` after each resolution this reconciler makes.
    pub fn with_on_resolution(mut self, hook: ResolutionHook) -> Reconciler {
        self.on_resolution = Some(hook);
        self
    }

    /// Starts lookups without the `rate_per_s` spacing (`concurrency` still
    /// bounds them): for providers that answer from memory, such as the
    /// simulator's ledger, where spacing would only cost wall-clock time.
    pub fn without_rate_limit(mut self) -> Reconciler {
        self.rate_limited = false;
        self
    }

    /// The settings in force.
    pub fn settings(&self) -> &ReconcileSettings {
        &self.settings
    }

    /// One bounded scan: at most `batch` ambiguous records, continuing where
    /// the previous scan stopped; each due record is looked up once, with at
    /// most `concurrency` lookups in flight and `rate_per_s` started per second.
    /// Scans never overlap: a second caller waits for the first.
    pub async fn run_once(&self) -> ReconcileReport {
        let mut state = self.scan.lock().await;
        let mut report = ReconcileReport::default();
        self.mark_expired_leases(&mut state, &mut report).await;
        let mut page = match self.list(state.cursor.clone()).await {
            Ok(page) => page,
            Err(e) => return report.store_failed(&e),
        };
        if page.records.is_empty() && page.damaged.is_empty() && state.cursor.is_some() {
            // The previous scan ended exactly at the last record: start over now.
            state.end_pass();
            page = match self.list(None).await {
                Ok(page) => page,
                Err(e) => return report.store_failed(&e),
            };
        }
        report.count_damaged(&page.damaged);
        let pass_ended = page.next.is_none();
        state.cursor = page.next;
        report.scanned = page.records.len() as u64;
        let now = self.clock.now();
        let mut due = Vec::with_capacity(page.records.len());
        for r in page.records {
            if let Some(d) = self
                .triage(&mut state, (r.id, r.token, r.lease_until), now, &mut report)
                .await
            {
                due.push(d);
            }
        }
        self.look_up(&mut state, due, &mut report).await;
        if pass_ended {
            state.end_pass();
        }
        report
    }

    /// Settles the ambiguous record `id` now, if it is due, by the same
    /// lookup, verdict, try count and backoff a scan uses: for a retry
    /// that meets the record, so that it need not wait for the next scan.
    /// One lookup per key at a time, whose answer every caller for the key
    /// that arrives meanwhile takes as its own; after a "not found" while
    /// the attempt may still commit, nothing is asked for the key until
    /// then. At most `concurrency` lookups at once besides the scans'
    /// (none free: nothing is asked). Each lookup is bounded by its own
    /// timeout. A resolution is journaled by [`RESOLVED_BY`].
    pub async fn settle_now(&self, id: &RecordId) -> Settled {
        self.settle_now_asked_by(id, RESOLVED_BY).await
    }

    /// [`Reconciler::settle_now`] on someone's request: a resolution it
    /// makes is journaled by `by` (e.g. `reconciler (asked by
    /// operator:ana)`, see [`asked_by`]) instead of [`RESOLVED_BY`]. A
    /// caller that joins a lookup already being asked for the key takes
    /// its answer, journaled by whoever asked first.
    pub async fn settle_now_asked_by(&self, id: &RecordId, by: &str) -> Settled {
        let (operation, _) = scope_parts(id);
        let Some(prober) = self.probers.get(operation).cloned() else {
            return Settled::NotNow;
        };
        let answer = match self.join_flight(id) {
            Ok(mut asked) => {
                return match asked.wait_for(Option::is_some).await {
                    Ok(settled) => settled.unwrap_or(Settled::NotNow),
                    Err(_) => Settled::NotNow,
                };
            }
            Err(None) => return Settled::NotNow,
            Err(Some(answer)) => answer,
        };
        let step = self.settle_due(id, &*prober, by).await;
        let settled = self.settled(id, step.as_ref());
        land(&self.inline.flights, id, step.as_ref(), answer, settled);
        settled
    }

    /// Joins the lookup being asked for `id` (`Ok`, its answer to come);
    /// or refuses to ask before a not-before time (`Err(None)`); or makes
    /// this caller the one that asks (`Err(Some)`, where to send its
    /// answer).
    #[allow(clippy::type_complexity, reason = "three outcomes of one map lookup")]
    fn join_flight(
        &self,
        id: &RecordId,
    ) -> Result<tokio::sync::watch::Receiver<Option<Settled>>, Option<Answer>> {
        let now = self.clock.now();
        let mut flights = self
            .inline
            .flights
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match flights.get(id) {
            // A sender gone without an answer (its caller was cancelled)
            // asks nothing any more: this caller asks instead.
            Some(Flight::Asking(asked)) if asked.has_changed().is_ok() => {
                return Ok(asked.clone());
            }
            Some(Flight::NotBefore(at)) if now < *at => return Err(None),
            _ => {}
        }
        if flights.len() >= FLIGHTS_KEYS_MAX {
            flights.retain(|_, f| match f {
                Flight::Asking(asked) => asked.has_changed().is_ok(),
                Flight::NotBefore(at) => now < *at,
            });
        }
        let (answer, asked) = tokio::sync::watch::channel(None);
        flights.insert(id.clone(), Flight::Asking(asked));
        Err(Some(answer))
    }

    /// What a step of [`Reconciler::settle_due`] comes to for the caller,
    /// logged and counted.
    fn settled(&self, id: &RecordId, step: Option<&Step>) -> Settled {
        match step {
            Some(Step::Resolved { completed }) => {
                if let Some(hook) = &self.on_resolution {
                    hook(
                        RESOLVED_BY,
                        if *completed {
                            "completed"
                        } else {
                            "not_executed"
                        },
                    );
                }
                Settled::Resolved {
                    completed: *completed,
                }
            }
            Some(Step::LookupFailed { reason, tries }) => {
                tracing::info!(record = %id, tries = tries.failures, %reason, "lookup on retry failed; will try again");
                Settled::NotNow
            }
            Some(Step::GaveUp { reason, tries }) => {
                tracing::warn!(record = %id, tries = tries.failures, %reason, "ambiguous record needs an operator: every lookup failed");
                Settled::NotNow
            }
            Some(Step::StoreFailed(reason)) => {
                tracing::warn!(record = %id, %reason, "cannot record what the lookup on retry learned");
                Settled::NotNow
            }
            step => settled_of(step),
        }
    }

    /// Whether the operation of `id` has a lookup.
    pub fn has_lookup(&self, id: &RecordId) -> bool {
        self.probers.contains_key(scope_parts(id).0)
    }

    /// Asks the provider about `id`, claimed fresh inside the suspect
    /// `window` by a route leasing `lease_ms`, and gives the verdict
    /// ([`idem_core::window::verify_verdict`]): the same lookup a scan
    /// sends, bounded by its timeout. Not counted against `concurrency`:
    /// inside the window every fresh request asks, and the caller's own
    /// bound on requests at once (the gateway's `requests_in_flight_max`,
    /// a subscription's `concurrency`) bounds these lookups. Writes
    /// nothing: the claim holds the record.
    pub async fn verify_fresh(
        &self,
        id: &RecordId,
        window: &SuspectWindow,
        lease_ms: u64,
    ) -> Verification {
        let Some(prober) = self.probers.get(scope_parts(id).0) else {
            return Verification::Failed {
                reason: "the operation has no lookup".into(),
            };
        };
        let span = tracing::info_span!(
            "idem.verify",
            idem.scope = %id.scope,
            idem.key = %id.key,
            idem.finding = Empty,
        );
        let asked_at = self.clock.now();
        let (answer, reason) = match prober.ask(id).instrument(span.clone()).await {
            Finding::Found { result, reason } => (LookupAnswer::Found(result), reason),
            Finding::NotFound { reason } => (LookupAnswer::NotFound, reason),
            Finding::Failed { reason } => (LookupAnswer::Failed, reason),
        };
        span.record("idem.finding", finding_name(&answer));
        match window::verify_verdict(answer, asked_at, window, lease_ms) {
            Verification::Failed { .. } => Verification::Failed { reason },
            verdict => verdict,
        }
    }

    /// The lookup of `id` if it is ambiguous and due (its tries allow it
    /// now); `None` when nothing was asked, [`Step::Elsewhere`] when the
    /// record is not ambiguous any more.
    async fn settle_due(&self, id: &RecordId, prober: &dyn Provider, by: &str) -> Option<Step> {
        let record = match self.store.get(id).await.ok()? {
            Some(record) if record.state == State::Ambiguous => record,
            _ => return Some(Step::Elsewhere),
        };
        // Taken only to ask: retries of a key being looked up wait on the
        // key, not on a slot.
        let _permit = self.inline.permits.try_acquire().ok()?;
        let token = record.token;
        let tries = self.store.lookup_tries(id, token).await.ok()?;
        let tries_max = self.settings.max_tries();
        let Triage::Ask { failures } = verdict::triage(tries.as_ref(), tries_max, self.clock.now())
        else {
            return None;
        };
        let backoff = Backoff {
            base_ms: self.settings.backoff_ms(),
            max_ms: self.settings.backoff_max_ms(),
        };
        let delay_ms = {
            let mut rng = self.inline.rng.lock().unwrap_or_else(|e| e.into_inner());
            backoff.delay_ms(failures.saturating_add(1), &mut rng)
        };
        let attempt = (id, token, record.lease_until);
        let store = &*self.store;
        let limits = (delay_ms, tries_max);
        Some(ask_and_record(store, &*self.clock, prober, attempt, limits, by).await)
    }

    /// Runs [`Reconciler::run`] on a task of its own until `shutdown`
    /// completes: the reconciler beside a service's `IdempotencyLayer`,
    /// settling what nobody retries. Await the handle after `shutdown` to
    /// know it stopped.
    pub fn spawn<F>(self: &Arc<Self>, shutdown: F) -> tokio::task::JoinHandle<()>
    where
        F: Future + Send + 'static,
    {
        let reconciler = Arc::clone(self);
        tokio::spawn(async move { reconciler.run(shutdown).await })
    }

    /// Runs a scan every `interval_s` until `shutdown` completes; a scan in
    /// progress is abandoned (lookups are reads, resolutions atomic).
    pub async fn run<F: Future>(&self, shutdown: F) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                report = async {
                    self.note_scan(true);
                    self.run_once().await
                } => {
                    log_report(&report);
                    self.note_scan(false);
                }
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(self.settings.interval()) => {}
            }
        }
    }

    /// An `in_progress` record whose lease expired stays so until a retry's
    /// claim marks it ambiguous; if no retry ever comes, its outcome would
    /// stay unknown forever. Marks such records (of operations with a lookup;
    /// other routes may take over) ambiguous with their own token, so a
    /// record that moved on meanwhile is refused by fencing and left alone.
    ///
    /// One page of `batch` records per scan, continuing where the previous
    /// scan stopped, so every record in progress gets its turn however many
    /// there are.
    async fn mark_expired_leases(&self, state: &mut ScanState, report: &mut ReconcileReport) {
        let query = ListQuery {
            state: Some(State::InProgress),
            after: state.lease_cursor.take(),
            limit: self.settings.batch(),
        };
        let page = match self.store.list(&query).await {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list records in progress");
                report.errors += 1;
                return;
            }
        };
        report.count_damaged(&page.damaged);
        state.lease_cursor = page.next;
        let now = self.clock.now();
        for r in page.records {
            let (operation, _) = scope_parts(&r.id);
            if r.lease_until > now || !self.probers.contains_key(operation) {
                continue;
            }
            let span = tracing::info_span!(
                "idem.mark_ambiguous",
                idem.scope = %r.id.scope,
                idem.key = %r.id.key,
                idem.cause = "lease_expired",
                idem.outcome = Empty,
            );
            let marked = self.store.mark_ambiguous(&r.id, r.token);
            let marked = marked.instrument(span.clone()).await;
            span.record("idem.outcome", marked_outcome(&marked));
            match marked {
                Ok(_) => {
                    tracing::warn!(scope = %r.id.scope, key = %r.id.key, owner = %r.owner,
                        "lease expired with no answer recorded; marked ambiguous for reconciliation");
                    report.expired_leases += 1;
                }
                Err(StoreError::Fenced { .. }) => {}
                Err(e) => {
                    tracing::warn!(scope = %r.id.scope, key = %r.id.key, error = %e, "cannot mark an expired lease ambiguous");
                    report.errors += 1;
                }
            }
        }
    }

    /// At most `batch` ambiguous records after `after`.
    async fn list(&self, after: Option<ListCursor>) -> Result<Listing, StoreError> {
        let query = ListQuery {
            state: Some(State::Ambiguous),
            after,
            limit: self.settings.batch(),
        };
        self.store.list(&query).await
    }

    /// Decides what to do with one listed record now, from the tries the
    /// store keeps for its attempt; `Some` when a lookup is due.
    async fn triage(
        &self,
        state: &mut ScanState,
        (id, token, lease_until): (RecordId, Token, Timestamp),
        now: Timestamp,
        report: &mut ReconcileReport,
    ) -> Option<Due> {
        let (operation, _) = scope_parts(&id);
        let prober = self.probers.get(operation).cloned();
        let Some(prober) = prober else {
            if state.warn_once(&id, token, Parked::NoLookup) {
                tracing::warn!(record = %id, operation, "ambiguous record needs an operator: no lookup configured for its operation");
            }
            report.no_lookup += 1;
            return None;
        };
        if state
            .not_before(&id, token)
            .is_some_and(|until| until > now)
        {
            report.waiting += 1;
            return None;
        }
        let tries = match self.store.lookup_tries(&id, token).await {
            Ok(tries) => tries,
            Err(e) => {
                tracing::warn!(record = %id, error = %e, "reconciler cannot read the failed lookups of a record; it will look again");
                report.errors += 1;
                return None;
            }
        };
        let failures = match verdict::triage(tries.as_ref(), self.settings.max_tries(), now) {
            Triage::Ask { failures } => failures,
            Triage::Wait { .. } => {
                report.waiting += 1;
                return None;
            }
            Triage::Operator { failures } => {
                if state.warn_once(&id, token, Parked::GaveUp) {
                    tracing::warn!(record = %id, tries = failures, "ambiguous record needs an operator: every lookup failed");
                }
                report.gave_up += 1;
                return None;
            }
        };
        let backoff = Backoff {
            base_ms: self.settings.backoff_ms(),
            max_ms: self.settings.backoff_max_ms(),
        };
        let delay_ms = backoff.delay_ms(failures.saturating_add(1), &mut state.rng);
        Some(Due {
            id,
            token,
            lease_until,
            prober,
            delay_ms,
        })
    }

    /// Looks up the due records, bounded in concurrency and rate, and
    /// settles each answer.
    async fn look_up(&self, state: &mut ScanState, due: Vec<Due>, report: &mut ReconcileReport) {
        let mut tasks = JoinSet::new();
        let spacing = Duration::from_secs(1) / self.settings.rate_per_s();
        for Due {
            id,
            token,
            lease_until,
            prober,
            delay_ms,
        } in due
        {
            while tasks.len() >= self.settings.concurrency() {
                if let Some(done) = tasks.join_next().await {
                    self.settle(state, done, report);
                }
            }
            if self.rate_limited {
                let start = state.next_start.max(Instant::now());
                tokio::time::sleep_until(start).await;
                state.next_start = start + spacing;
            }
            // A retry is asking about this key, or a "not found" proved
            // nothing until later: this scan leaves it.
            let Err(Some(answer)) = self.join_flight(&id) else {
                continue;
            };
            let (store, clock) = (Arc::clone(&self.store), Arc::clone(&self.clock));
            let flights = Arc::clone(&self.inline.flights);
            let tries_max = self.settings.max_tries();
            let task = async move {
                let attempt = (&id, token, lease_until);
                let step = ask_and_record(
                    &*store,
                    &*clock,
                    &*prober,
                    attempt,
                    (delay_ms, tries_max),
                    RESOLVED_BY,
                )
                .await;
                land(&flights, &id, Some(&step), answer, settled_of(Some(&step)));
                (id, token, step)
            };
            tasks.spawn(task);
        }
        while let Some(done) = tasks.join_next().await {
            self.settle(state, done, report);
        }
    }

    /// Counts one finished lookup task and updates what this process
    /// remembers about the record.
    fn settle(
        &self,
        state: &mut ScanState,
        done: Result<(RecordId, Token, Step), tokio::task::JoinError>,
        report: &mut ReconcileReport,
    ) {
        let (id, token, step) = match done {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(error = %e, "a reconciler lookup task failed");
                report.errors += 1;
                return;
            }
        };
        match step {
            Step::Resolved { completed } => {
                state.tracked.remove(&id);
                let outcome = if completed {
                    report.completed += 1;
                    "completed"
                } else {
                    report.released += 1;
                    "not_executed"
                };
                if let Some(hook) = &self.on_resolution {
                    hook(RESOLVED_BY, outcome);
                }
            }
            Step::Elsewhere => {
                state.tracked.remove(&id);
                report.resolved_elsewhere += 1;
            }
            Step::NotYet { until } => {
                // The provider has not seen the request, but the attempt may
                // still reach it: look again once its lease is over.
                if let Some(tracked) = state.track(&id, token) {
                    tracked.not_before = Some(until);
                }
                report.waiting += 1;
            }
            Step::StoreFailed(reason) => {
                tracing::warn!(record = %id, %reason, "reconciler cannot record what it learned; it will look again");
                report.errors += 1;
            }
            Step::GaveUp { reason, tries } => {
                state.warn_once(&id, token, Parked::GaveUp);
                report.gave_up += 1;
                tracing::warn!(record = %id, tries = tries.failures, %reason, "ambiguous record needs an operator: every lookup failed");
            }
            Step::LookupFailed { reason, tries } => {
                report.retried += 1;
                let next_at_ms = tries.next_at.as_millis();
                tracing::info!(record = %id, tries = tries.failures, next_at_ms, %reason, "reconciler lookup failed; will try again");
            }
        }
    }
}

impl ScanState {
    /// What this process remembers about the attempt holding `token` of
    /// `id`, seen in the current pass; a new attempt of the key starts
    /// afresh. `None` when [`TRACKED_MAX`] records are remembered already.
    fn track(&mut self, id: &RecordId, token: Token) -> Option<&mut Tracked> {
        if self.tracked.get(id).is_some_and(|t| t.token != token) {
            self.tracked.remove(id);
        }
        if !self.tracked.contains_key(id) && self.tracked.len() >= TRACKED_MAX {
            return None;
        }
        let tracked = self.tracked.entry(id.clone()).or_insert(Tracked {
            token,
            not_before: None,
            warned: None,
            pass: self.pass,
        });
        tracked.pass = self.pass;
        Some(tracked)
    }

    /// When the provider may next be asked about the attempt, if this
    /// process was told it may still commit until then.
    fn not_before(&mut self, id: &RecordId, token: Token) -> Option<Timestamp> {
        self.track(id, token).and_then(|t| t.not_before)
    }

    /// True the first time the attempt is left for an operator for `why`
    /// in this process (or whenever its memory is full), so that the
    /// warning is logged once per process, not once per scan.
    fn warn_once(&mut self, id: &RecordId, token: Token, why: Parked) -> bool {
        match self.track(id, token) {
            Some(tracked) if tracked.warned == Some(why) => false,
            Some(tracked) => {
                tracked.warned = Some(why);
                true
            }
            None => true,
        }
    }

    /// Forgets the records not seen during the pass that ends (resolved
    /// elsewhere, by an operator or by time), so the map stays bounded.
    fn end_pass(&mut self) {
        let pass = self.pass;
        self.tracked.retain(|_, t| t.pass == pass);
        self.pass += 1;
        self.cursor = None;
    }
}

impl ReconcileReport {
    /// Rows the store cannot read are named in the log and counted; the
    /// scan goes on past them.
    fn count_damaged(&mut self, damaged: &[DamagedRow]) {
        for row in damaged {
            tracing::error!(scope = %row.scope, key = %row.key, reason = %row.reason,
                "a stored record cannot be read; it needs a person");
        }
        self.damaged += damaged.len() as u64;
    }

    /// True when the scan leaves something for a person or a later run: a
    /// lookup failed, a record is left for an operator (after `max_tries`
    /// or without a lookup), the store failed or holds rows it cannot read.
    /// Records resolved, resolved elsewhere or waiting out a backoff or a
    /// lease need nothing. `idem reconcile --once` exits 1 when this holds.
    pub fn needs_attention(&self) -> bool {
        [
            self.retried,
            self.gave_up,
            self.no_lookup,
            self.errors,
            self.damaged,
        ]
        .iter()
        .any(|n| *n > 0)
    }

    fn store_failed(mut self, e: &StoreError) -> ReconcileReport {
        tracing::warn!(error = %e, "reconciler cannot list ambiguous records");
        self.errors += 1;
        self
    }
}

/// Asks `prober` about the attempt holding `token` of `id` (its lease ends
/// at `lease_until`) and records what the one verdict makes of the answer:
/// a resolution, or a failed lookup counted with the next try `delay_ms`
/// away; a resolution is journaled by `by`. The scans and
/// [`Reconciler::settle_now`] both call this. One trace per looked-up
/// record: the lookup, then its resolution.
async fn ask_and_record(
    store: &dyn Store,
    clock: &dyn Clock,
    prober: &dyn Provider,
    (id, token, lease_until): (&RecordId, Token, Timestamp),
    (delay_ms, tries_max): (u64, u32),
    by: &str,
) -> Step {
    let span = tracing::info_span!(
        "idem.lookup",
        idem.scope = %id.scope,
        idem.key = %id.key,
        idem.finding = Empty,
        idem.verdict = Empty,
    );
    let lookup = span.clone();
    let asked = async move {
        // Taken before the question leaves: the answer is about the
        // provider's ledger at some moment after this one.
        let asked_at = clock.now();
        let (answer, reason) = match prober.ask(id).await {
            Finding::Found { result, reason } => (LookupAnswer::Found(result), reason),
            Finding::NotFound { reason } => (LookupAnswer::NotFound, reason),
            Finding::Failed { reason } => (LookupAnswer::Failed, reason),
        };
        lookup.record("idem.finding", finding_name(&answer));
        let verdict = verdict::verdict(answer, asked_at, lease_until);
        lookup.record("idem.verdict", verdict_name(&verdict));
        match verdict {
            Verdict::Resolve(outcome) => resolve(store, (id, token), outcome, &reason, by).await,
            Verdict::AskAgain { at } => Step::NotYet { until: at },
            Verdict::CountFailure => {
                let next_at = clock.now().plus_millis(delay_ms);
                count_failure(store, id, token, next_at, tries_max, reason).await
            }
        }
    };
    asked.instrument(span).await
}

/// Counts a failed lookup of the attempt holding `token` in the store; a
/// record resolved or claimed again meanwhile is not an error.
async fn count_failure(
    store: &dyn Store,
    id: &RecordId,
    token: Token,
    next_at: Timestamp,
    tries_max: u32,
    reason: String,
) -> Step {
    let counted = store.note_failed_lookup(id, token, next_at).await;
    match verdict::after_failed_lookup(counted, tries_max) {
        AfterFailure::Retry { tries } => Step::LookupFailed { reason, tries },
        AfterFailure::Operator { tries } => Step::GaveUp { reason, tries },
        AfterFailure::Elsewhere => Step::Elsewhere,
        AfterFailure::StoreFailed(e) => {
            Step::StoreFailed(format!("the lookup failed ({reason}) and {e}"))
        }
    }
}

/// Records the provider's finding about the attempt holding `token`; a
/// record resolved or claimed again meanwhile is not an error. The
/// resolution is journaled by `by`.
async fn resolve(
    store: &dyn Store,
    (id, token): (&RecordId, Token),
    outcome: Outcome,
    reason: &str,
    by: &str,
) -> Step {
    let completed = matches!(outcome, Outcome::Completed { .. });
    let resolution = match Resolution::new(outcome, by, reason) {
        Ok(resolution) => resolution,
        Err(e) => return Step::StoreFailed(e.to_string()),
    };
    let span = tracing::info_span!(
        "idem.resolve",
        idem.scope = %id.scope,
        idem.key = %id.key,
        idem.resolver = RESOLVED_BY,
        idem.outcome = Empty,
    );
    let resolved = store.resolve(id, token, resolution);
    let after = verdict::after_resolve(resolved.instrument(span.clone()).await);
    span.record("idem.outcome", resolve_outcome(&after, completed));
    match after {
        AfterResolve::Resolved => {
            tracing::info!(record = %id, completed, %reason, "reconciler resolved an ambiguous record");
            Step::Resolved { completed }
        }
        AfterResolve::NotYet { until } => Step::NotYet { until },
        AfterResolve::Elsewhere => Step::Elsewhere,
        AfterResolve::StoreFailed(e) => Step::StoreFailed(e.to_string()),
    }
}

/// What a lookup found, as its span names it.
fn finding_name(answer: &LookupAnswer) -> &'static str {
    match answer {
        LookupAnswer::Found(_) => "found",
        LookupAnswer::NotFound => "not_found",
        LookupAnswer::Failed => "failed",
    }
}

/// What the reconciler makes of a finding, as its span names it.
fn verdict_name(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Resolve(Outcome::Completed { .. }) => "complete",
        Verdict::Resolve(_) => "release",
        Verdict::AskAgain { .. } => "ask_again",
        Verdict::CountFailure => "count_failure",
    }
}

/// What a verdict came to, as its span names it.
fn resolve_outcome(after: &AfterResolve, completed: bool) -> &'static str {
    match after {
        AfterResolve::Resolved if completed => "completed",
        AfterResolve::Resolved => "not_executed",
        AfterResolve::NotYet { .. } => "not_yet",
        AfterResolve::Elsewhere => "elsewhere",
        AfterResolve::StoreFailed(_) => "store_failed",
    }
}

/// What marking an expired lease ambiguous came to, as its span names it.
fn marked_outcome<T>(marked: &Result<T, StoreError>) -> &'static str {
    match marked {
        Ok(_) => "ambiguous",
        Err(StoreError::Fenced { .. }) => "fenced",
        Err(_) => "store_failed",
    }
}

fn log_report(report: &ReconcileReport) {
    if report.scanned == 0 && report.errors == 0 {
        tracing::debug!("reconciler found no ambiguous record");
    } else {
        tracing::info!(%report, "reconciler scan");
    }
}

impl fmt::Display for ReconcileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} expired leases marked ambiguous; scanned {}: {} completed, {} released, \
             {} retried, {} waiting, {} left for an operator after max_tries, \
             {} without a lookup, {} resolved elsewhere, {} errors, {} damaged rows",
            self.expired_leases,
            self.scanned,
            self.completed,
            self.released,
            self.retried,
            self.waiting,
            self.gave_up,
            self.no_lookup,
            self.resolved_elsewhere,
            self.errors,
            self.damaged
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which counts make a scan need attention, one at a time.
    #[test]
    fn needs_attention_names_what_a_person_must_see() {
        type Set = fn(&mut ReconcileReport);
        let cases: [(&str, Set, bool); 12] = [
            ("nothing to do", |_| {}, false),
            ("expired leases marked", |r| r.expired_leases = 1, false),
            ("scanned", |r| r.scanned = 1, false),
            ("completed", |r| r.completed = 1, false),
            ("released", |r| r.released = 1, false),
            ("waiting", |r| r.waiting = 1, false),
            ("resolved elsewhere", |r| r.resolved_elsewhere = 1, false),
            ("a lookup failed", |r| r.retried = 1, true),
            ("left after max_tries", |r| r.gave_up = 1, true),
            ("no lookup", |r| r.no_lookup = 1, true),
            ("store errors", |r| r.errors = 1, true),
            ("damaged rows", |r| r.damaged = 1, true),
        ];
        for (name, set, expect) in cases {
            let mut report = ReconcileReport::default();
            set(&mut report);
            assert_eq!(report.needs_attention(), expect, "{name}");
        }
        let huge = ReconcileReport {
            retried: u64::MAX,
            gave_up: u64::MAX,
            ..ReconcileReport::default()
        };
        assert!(huge.needs_attention(), "huge counts do not overflow to 0");
    }

    #[test]
    fn report_display_names_every_count() {
        let report = ReconcileReport {
            expired_leases: 10,
            scanned: 9,
            completed: 1,
            released: 2,
            retried: 3,
            waiting: 4,
            gave_up: 5,
            no_lookup: 6,
            resolved_elsewhere: 7,
            errors: 8,
            damaged: 11,
        };
        assert_eq!(
            report.to_string(),
            "10 expired leases marked ambiguous; scanned 9: 1 completed, 2 released, \
             3 retried, 4 waiting, 5 left for an operator after max_tries, \
             6 without a lookup, 7 resolved elsewhere, 8 errors, 11 damaged rows"
        );
    }
}

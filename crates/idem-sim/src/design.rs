//! A design: a contract file (the `idem check` format) plus a workload, and
//! the topology the simulator derives from the two.

use std::fmt;
use std::path::Path;

use idem_contract::schema::{self, Claims, KeySource, MintedAt, Redrive, Replication};
use idem_contract::{Contract, ContractError};
use idem_core::{LeaseExpiry, Policy, PolicyError};
use idem_reconcile::{ConfigError, ReconcileSettings, ReconcileSpec};

/// One simulated operation: the contract under test and the traffic and
/// faults thrown at it.
#[derive(Debug, Clone)]
pub struct Design {
    /// Short name shown in reports (the contract file's stem).
    pub name: String,
    /// The file as given on the command line; replay commands name it.
    pub file: String,
    /// The contract, as `idem check` reads it.
    pub contract: Contract,
    /// Traffic and fault rates.
    pub workload: Workload,
}

/// Traffic and fault rates. Probabilities are per attempt unless noted;
/// durations carry their unit in the name.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Workload {
    /// Intents per seed (one queue message each).
    pub intents: u32,
    /// Intents arrive uniformly over this many seconds.
    pub arrival_spread_s: u64,
    /// The payout API crashes after the claim, before the bank effect.
    pub crash_before_effect: f64,
    /// The payout API crashes after the bank effect, before completing.
    pub crash_after_effect: f64,
    /// The response is lost on its way back to the caller.
    pub lost_ack: f64,
    /// The response comes from the slow tail: 1–4 × the caller's timeout.
    pub slow_tail: f64,
    /// Normal response latency upper bound (lower bound 20 ms).
    pub latency_max_ms: u64,
    /// The bank effect happens this long (at most) after the claim.
    pub effect_delay_max_ms: u64,
    /// Per intent: the consumer's step after the payout fails on every
    /// receive until the message is redriven from the DLQ.
    pub post_effect_failure: f64,
    /// Per acknowledged intent: the same key is sent again with a changed
    /// amount, 1–600 s later (a client bug).
    pub mismatch_resend: f64,
    /// DLQ redrive delay when the contract says `redrive = "manual"`
    /// (the incident of `examples/contracts/incident-two-dlq-redrive.toml`:
    /// the next morning, 14 h).
    pub redrive_after_s: u64,
    /// With several regions: when region 0 fails and traffic moves.
    pub failover_at_s: u64,
    /// The reconciler's settings, as `[reconcile]` in the gateway config
    /// (the real `idem_reconcile::Reconciler` runs them); `seed` defaults to
    /// one drawn from the run's seed.
    pub reconcile: ReconcileSpec,
    /// Per lookup: the bank's lookup API fails (no finding), so the
    /// reconciler counts it and tries again after its backoff.
    pub lookup_failure: f64,
    /// The purge job runs this often.
    pub purge_every_s: u64,
    /// Let the bank deduplicate by key for the contract's `dedup_window_s`.
    /// Off by default: the simulator measures what the records alone promise.
    pub bank_dedup: bool,
    /// First retry backoff; doubles per attempt up to the contract's maximum.
    pub backoff_base_ms: u64,
    /// The surviving region's store opens the suspect window at the
    /// failover (as a PostgreSQL store does on a promoted server): a fresh
    /// claim there is verified with the bank's lookup before the API is
    /// called. Off by default, so the tail's cost without it is measured.
    pub suspect_window: bool,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            intents: 30,
            arrival_spread_s: 60,
            crash_before_effect: 0.03,
            crash_after_effect: 0.03,
            lost_ack: 0.05,
            slow_tail: 0.08,
            latency_max_ms: 400,
            effect_delay_max_ms: 300,
            post_effect_failure: 0.05,
            mismatch_resend: 0.1,
            redrive_after_s: 14 * 3600,
            failover_at_s: 30,
            reconcile: ReconcileSpec::default(),
            lookup_failure: 0.1,
            purge_every_s: 3600,
            bank_dedup: false,
            backoff_base_ms: 100,
            suspect_window: false,
        }
    }
}

/// Why a design cannot be simulated.
#[derive(Debug)]
#[non_exhaustive]
pub enum SimError {
    /// The contract file could not be read or is invalid (names file, line, field).
    Contract(ContractError),
    /// The contract's concurrency and retention do not make a valid policy.
    Policy {
        /// The design.
        design: String,
        /// Why.
        error: PolicyError,
    },
    /// The workload's reconciler settings are out of range.
    Reconcile {
        /// The design.
        design: String,
        /// Which field, and why.
        error: ConfigError,
    },
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Contract(e) => e.fmt(f),
            SimError::Policy { design, error } => {
                write!(
                    f,
                    "{design}: lease and retention make no valid policy: {error:?}"
                )
            }
            SimError::Reconcile { design, error } => {
                write!(f, "{design}: the workload's reconciler settings: {error}")
            }
        }
    }
}

impl std::error::Error for SimError {}

impl Design {
    /// Loads a contract file and pairs it with the default [`Workload`].
    pub fn load(path: &Path) -> Result<Design, SimError> {
        let contract = idem_contract::load(path).map_err(SimError::Contract)?;
        let name = path
            .file_stem()
            .map_or_else(|| "design".to_owned(), |s| s.to_string_lossy().into_owned());
        Design::new(
            name,
            path.display().to_string(),
            contract,
            Workload::default(),
        )
    }

    /// A design from parts, checked so that [`crate::run`] cannot fail on it.
    pub fn new(
        name: String,
        file: String,
        contract: Contract,
        workload: Workload,
    ) -> Result<Design, SimError> {
        let design = Design {
            name,
            file,
            contract,
            workload,
        };
        Topology::derive(&design)?;
        Ok(design)
    }

    /// The command that replays `seed` of this design.
    pub fn replay_command(&self, seed: u64) -> String {
        format!("idem sim {} --seed {seed}", self.file)
    }
}

/// How the regions share records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegionMode {
    /// One region.
    Single,
    /// Two regions, one logical store.
    Sync,
    /// Two stores, async replication, each key claimed in its home region;
    /// at failover the survivor takes the failed region's keys at once,
    /// without the writes that region had not shipped.
    HomeRegion,
    /// Two stores, async (or no) replication, any region claims any key.
    AnyRegion,
}

/// What the simulator needs from the contract and workload, resolved once.
#[derive(Debug, Clone)]
pub(crate) struct Topology {
    pub policy: Policy,
    /// The reconciler's settings, validated (seed not yet applied).
    pub reconcile: ReconcileSettings,
    pub per_attempt_keys: bool,
    pub attempts: u32,
    pub timeout_ms: u64,
    pub backoff_max_ms: u64,
    /// `(visibility_timeout_s, max_receives)`, or no queue (one delivery).
    pub queue: Option<(u64, u32)>,
    pub redrive_after_s: Option<u64>,
    pub mode: RegionMode,
    pub replicate: bool,
    pub lag_ms: u64,
    pub bank_dedup_window_s: Option<u64>,
}

impl Topology {
    pub(crate) fn derive(design: &Design) -> Result<Topology, SimError> {
        let c = &design.contract;
        let w = &design.workload;
        let policy = policy_of(c).map_err(|error| SimError::Policy {
            design: design.name.clone(),
            error,
        })?;
        let reconcile =
            ReconcileSettings::new(&w.reconcile).map_err(|error| SimError::Reconcile {
                design: design.name.clone(),
                error,
            })?;
        let per_attempt_keys = c.key.as_ref().is_some_and(|k| {
            k.minted_at == Some(MintedAt::PerAttempt)
                || (k.source == KeySource::Uuid && k.persisted_before_retries != Some(true))
        });
        let upstream_ms = c
            .concurrency
            .as_ref()
            .map_or(20_000, |k| k.upstream_timeout_ms);
        let client = c.replay.as_ref().and_then(|r| r.client.as_ref());
        let client_on = client.is_some_and(|k| schema_on(k.enabled));
        let attempts = if client_on {
            client.and_then(|k| k.attempts).unwrap_or(1).max(1)
        } else {
            1
        };
        let timeout_ms = client
            .and_then(|k| k.timeout_ms)
            .unwrap_or(upstream_ms)
            .max(1);
        let backoff_max_ms = client.and_then(|k| k.backoff_max_ms).unwrap_or(30_000);
        let queue = c
            .replay
            .as_ref()
            .and_then(|r| r.queue.as_ref())
            .filter(|q| schema_on(q.enabled))
            .map(|q| {
                (
                    q.visibility_timeout_s.unwrap_or(60).max(1),
                    q.max_receives.unwrap_or(1).max(1),
                )
            });
        let redrive_after_s = c
            .replay
            .as_ref()
            .and_then(|r| r.dlq.as_ref())
            .filter(|d| schema_on(d.enabled))
            .and_then(|d| match d.redrive {
                Some(Redrive::Manual) => Some(w.redrive_after_s),
                Some(Redrive::Automatic) => Some(d.redrive_after_s.unwrap_or(w.redrive_after_s)),
                Some(Redrive::Never) | None => None,
            });
        let (mode, replicate, lag_ms) = regions_of(c.regions.as_ref());
        let bank_dedup_window_s = if w.bank_dedup {
            c.propagation.as_ref().and_then(|p| {
                p.dependencies
                    .iter()
                    .find(|d| d.performs_effect && d.dedups)
                    .and_then(|d| d.dedup_window_s)
            })
        } else {
            None
        };
        Ok(Topology {
            policy,
            reconcile,
            per_attempt_keys,
            attempts,
            timeout_ms,
            backoff_max_ms,
            queue,
            redrive_after_s,
            mode,
            replicate,
            lag_ms,
            bank_dedup_window_s,
        })
    }

    /// Regions simulated (1 or 2).
    pub(crate) fn regions(&self) -> usize {
        if self.mode == RegionMode::Single {
            1
        } else {
            2
        }
    }
}

fn policy_of(c: &Contract) -> Result<Policy, PolicyError> {
    let lease_ms = c
        .concurrency
        .as_ref()
        .map_or(Policy::DEFAULT.lease_ms(), |k| k.lease_ms);
    let on_expiry = match c.concurrency.as_ref().map(|k| k.on_lease_expiry) {
        Some(schema::LeaseExpiry::Takeover) => LeaseExpiry::Takeover,
        _ => LeaseExpiry::Reconcile,
    };
    let (retention_s, tombstone_s) = c.retention.as_ref().map_or(
        (Policy::DEFAULT.retention_s(), Policy::DEFAULT.tombstone_s()),
        |r| (r.retention_s, r.tombstone_s.max(r.retention_s)),
    );
    Policy::new(lease_ms, retention_s, tombstone_s, on_expiry)
}

fn regions_of(regions: Option<&schema::Regions>) -> (RegionMode, bool, u64) {
    let Some(r) = regions.filter(|r| r.names.len() > 1) else {
        return (RegionMode::Single, false, 0);
    };
    let lag_ms = r.replication_lag_ms.unwrap_or(1000);
    match (r.replication, r.claims) {
        (Replication::Sync, _) => (RegionMode::Sync, false, 0),
        (Replication::Async, Some(Claims::HomeRegion)) => (RegionMode::HomeRegion, true, lag_ms),
        (Replication::Async, _) => (RegionMode::AnyRegion, true, lag_ms),
        (Replication::None, _) => (RegionMode::AnyRegion, false, 0),
    }
}

/// `enabled` defaults to true: a present section describes a real source.
fn schema_on(enabled: Option<bool>) -> bool {
    enabled.unwrap_or(true)
}

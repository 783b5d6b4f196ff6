//! Runs a validated configuration until shutdown: one pump per
//! subscription, the reconciler (when a `[[lookup]]` is declared) and the
//! retention purge; on shutdown every pump stops taking messages, settles
//! the ones it holds, and the process returns what it did. A broker that
//! fails for good stops every pump the same way, and `run` returns the
//! failure, so the process exits non-zero for a supervisor to see.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_broker::{BrokerError, Subscription as BrokerSubscription};
use idem_core::{SettleOnRetry, Store, SystemClock, VerifyFresh, WindowWatch};
use idem_http::Metrics;
use idem_process::probe::{Checked, Probes, ReadyCheck, Status};
use idem_reconcile::Reconciler;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::broker::Broker;
use crate::config::{ConsumeConfig, Subscription};
use crate::handle::Subscriber;
use crate::pump::{Counts, pump};

/// What each subscription did, by name.
pub type Report = Vec<(String, Counts)>;

/// Why [`run`] did not run, or stopped before it was asked to.
#[derive(Debug)]
#[non_exhaustive]
pub enum RunError {
    /// A subscription's handler cannot be built (its owner or region).
    Subscription {
        /// The subscription's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A subscription's broker cannot be opened at start: nothing was
    /// consumed.
    Open {
        /// The subscription's name.
        name: String,
        /// The config field the failure is about, e.g.
        /// `subscription[0].nats.url`, when the broker names one.
        field: Option<String>,
        /// The broker's error.
        error: BrokerError,
    },
    /// The reconciler cannot be built.
    Reconciler(String),
    /// A subscription's broker failed for good while consuming (what idem
    /// declared is gone and could not be declared again): every
    /// subscription stopped taking messages and settled the ones it held.
    Broker {
        /// The subscription's name.
        name: String,
        /// The config field the failure is about, when the broker names one.
        field: Option<String>,
        /// The broker's error.
        error: BrokerError,
    },
}

impl RunError {
    /// The config field the error is about, e.g. `subscription[0].nats.url`.
    pub fn field(&self) -> Option<&str> {
        match self {
            RunError::Open { field, .. } | RunError::Broker { field, .. } => field.as_deref(),
            RunError::Subscription { .. } | RunError::Reconciler(_) => None,
        }
    }

    /// Whether consuming had started (the failure came later).
    pub fn started(&self) -> bool {
        matches!(self, RunError::Broker { .. })
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Subscription { name, reason } => write!(f, "subscription {name:?}: {reason}"),
            RunError::Open { name, error, .. } | RunError::Broker { name, error, .. } => {
                write!(f, "subscription {name:?}: {error}")
            }
            RunError::Reconciler(reason) => write!(f, "the reconciler cannot start: {reason}"),
        }
    }
}

impl std::error::Error for RunError {}

/// Opens every subscription's broker, then runs until `shutdown`
/// completes, or until a broker fails for good. Fails before anything is
/// consumed when a broker cannot be opened or the reconciler cannot be
/// built.
pub async fn run(
    config: &ConsumeConfig,
    store: Arc<dyn Store>,
    probes: Option<tokio::net::TcpListener>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Report, RunError> {
    let reconciler = reconciler(config, &store)?;
    // Fresh claims inside the store's suspect window are verified by the
    // reconciler's lookups before their effect runs.
    let window = idem_reconcile::window::watch(&*store).await;
    // An ambiguous record a delivery meets is settled by the same lookups
    // before the delivery is retried, as the gateway's layer does.
    let pumps = open(config, &store, &window, reconciler.as_ref()).await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let metrics = Arc::new(Metrics::new());
    if let Some(listener) = probes {
        let served = (&store, &metrics, reconciler.clone());
        serve_probes(listener, served, &pumps, &stop_rx);
    }
    let mut tasks = JoinSet::new();
    for (i, sub, broker, handler) in pumps {
        let stop = stop_rx.clone();
        let (name, concurrency, section) = (sub.name.clone(), sub.concurrency, sub.broker.clone());
        tasks.spawn(async move {
            let pumped = pump(Arc::clone(&broker), Arc::new(handler), concurrency, stop).await;
            if let Err(e) = broker.release().await {
                tracing::warn!(subscription = %name, error = %e,
                    "cannot hand back the messages received and not handled");
            }
            (i, name, section, pumped)
        });
    }
    let background = background(&store, config, (reconciler, window, metrics), &stop_rx);
    let (mut report, failure) = supervise(tasks, shutdown, &stop_tx).await;
    let _ = stop_tx.send(true);
    background.await;
    if let Some(failure) = failure {
        return Err(failure);
    }
    report.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(report)
}

/// One subscription ready to pump: its index, its config, its open broker
/// and its handler.
type Pump<'a> = (
    usize,
    &'a Subscription,
    Arc<dyn BrokerSubscription>,
    Subscriber,
);

/// What a pump task returns: its index, name, broker section and counts.
type Pumped = (usize, String, Broker, crate::pump::Pumped);

/// The reconciler, when a `[[lookup]]` is declared.
fn reconciler(
    config: &ConsumeConfig,
    store: &Arc<dyn Store>,
) -> Result<Option<Arc<Reconciler>>, RunError> {
    if config.lookups.is_empty() {
        return Ok(None);
    }
    let reconciler = Reconciler::new(
        Arc::clone(store),
        config.lookups.clone(),
        config.reconcile.clone(),
        Arc::new(SystemClock),
    )
    .map_err(|e| RunError::Reconciler(e.to_string()))?;
    Ok(Some(Arc::new(reconciler)))
}

/// Builds every subscription's handler and opens its broker; nothing is
/// consumed until all are open.
async fn open<'a>(
    config: &'a ConsumeConfig,
    store: &Arc<dyn Store>,
    window: &Arc<WindowWatch>,
    reconciler: Option<&Arc<Reconciler>>,
) -> Result<Vec<Pump<'a>>, RunError> {
    let verifier = reconciler.map(|r| Arc::clone(r) as Arc<dyn VerifyFresh>);
    let settler = reconciler.map(|r| Arc::clone(r) as Arc<dyn SettleOnRetry>);
    let mut pumps = Vec::with_capacity(config.subscriptions.len());
    for (i, sub) in config.subscriptions.iter().enumerate() {
        let hold_max = Duration::from_millis(sub.policy.lease_ms()) + sub.response_timeout;
        let opened = sub
            .broker
            .open(hold_max)
            .await
            .map_err(|error| RunError::Open {
                name: sub.name.clone(),
                field: field_of(i, &sub.broker, &error),
                error,
            })?;
        let broker = opened.subscription;
        // A limit read from the broker (an SQS redrive policy): the bridge
        // dead-letters at that delivery, with its reason, before the broker
        // moves the message on its own.
        let mut limited = sub.clone();
        if let Some(theirs) = opened.max_deliver {
            limited.max_deliveries = Some(sub.max_deliveries.map_or(theirs, |o| o.min(theirs)));
        }
        let handler = Subscriber::new(
            &limited,
            Arc::clone(store),
            (&config.owner, config.region.as_deref()),
            (Arc::clone(window), verifier.clone()),
            settler.clone(),
        )
        .map_err(|reason| RunError::Subscription {
            name: sub.name.clone(),
            reason,
        })?;
        tracing::info!(subscription = %sub.name, broker = %broker.describe(),
            deliver = %sub.deliver, concurrency = sub.concurrency, "consuming");
        pumps.push((i, sub, broker, handler));
    }
    Ok(pumps)
}

/// Serves `/healthz` and `/readyz` on `listener`, with one `broker` check
/// per subscription, and `/metrics` (the gauges, per subscription where
/// the value is), until the stop.
fn serve_probes(
    listener: tokio::net::TcpListener,
    (store, metrics, reconciler): (&Arc<dyn Store>, &Arc<Metrics>, Option<Arc<Reconciler>>),
    pumps: &[Pump<'_>],
    stop: &watch::Receiver<bool>,
) {
    let mut probes = Probes::new(Arc::clone(store), Arc::clone(metrics), reconciler);
    for (_, sub, broker, _) in pumps {
        // Named by the subscription, which the config fixes; the
        // broker's URL, which may hold a password, goes to the log only.
        let check = BrokerConnected {
            broker: Arc::clone(broker),
        };
        probes = probes.with_check(format!("broker:{}", sub.name), Arc::new(check));
    }
    let stop = stopped(stop.clone());
    let app = idem_process::probe::router(Arc::new(probes))
        .merge(idem_process::gauges::consumer_metrics(Arc::clone(metrics)));
    tokio::spawn(async move {
        if let Err(e) = idem_process::probe::serve_app(listener, app, stop).await {
            tracing::error!(error = %e, "the probe listener failed");
        }
    });
}

/// Waits for every pump to end: on `shutdown`, or on the first broker
/// that fails for good, every pump is told to stop. Returns what each did
/// and that failure.
async fn supervise(
    mut tasks: JoinSet<Pumped>,
    shutdown: impl Future<Output = ()> + Send,
    stop_tx: &watch::Sender<bool>,
) -> (Report, Option<RunError>) {
    let mut report = Report::new();
    let mut failure = None;
    let mut shutdown = std::pin::pin!(shutdown);
    let mut stopping = false;
    loop {
        let done = if stopping {
            tasks.join_next().await
        } else {
            tokio::select! {
                () = &mut shutdown => {
                    tracing::info!("stopping: settling the messages in hand");
                    stopping = true;
                    let _ = stop_tx.send(true);
                    continue;
                }
                done = tasks.join_next() => done,
            }
        };
        let Some(done) = done else { break };
        match done {
            Ok((i, name, broker, pumped)) => {
                tracing::info!(subscription = %name, counts = ?pumped.counts, "subscription stopped");
                if let Some(error) = pumped.failed
                    && failure.is_none()
                {
                    tracing::error!(subscription = %name, error = %error,
                        "a broker failed for good: stopping every subscription");
                    let field = field_of(i, &broker, &error);
                    failure = Some(RunError::Broker {
                        name: name.clone(),
                        field,
                        error,
                    });
                    stopping = true;
                    let _ = stop_tx.send(true);
                }
                report.push((name, pumped.counts));
            }
            Err(e) => tracing::error!(error = %e, "a subscription task failed"),
        }
    }
    (report, failure)
}

/// `/readyz`'s check of one subscription's broker connection.
struct BrokerConnected {
    broker: Arc<dyn BrokerSubscription>,
}

impl ReadyCheck for BrokerConnected {
    fn check(&self) -> Checked {
        if self.broker.connected() {
            Checked::status(Status::Connected)
        } else {
            let detail = format!("not connected to {}", self.broker.describe());
            Checked::with_detail(Status::Disconnected, detail)
        }
    }
}

/// The reconciler (when there is one), the retention purge and the
/// gauges' store sampler, until `stop`; the future resolves once all have
/// stopped.
fn background(
    store: &Arc<dyn Store>,
    config: &ConsumeConfig,
    (reconciler, window, metrics): (Option<Arc<Reconciler>>, Arc<WindowWatch>, Arc<Metrics>),
    stop_rx: &watch::Receiver<bool>,
) -> impl Future<Output = ()> + use<> {
    let mut stop = stop_rx.clone();
    let reconciled = reconciler.map(|r| {
        let stop = stop_rx.clone();
        tokio::spawn(async move { r.run(stopped(stop)).await })
    });
    let window_kept = tokio::spawn(idem_reconcile::window::keep_current(
        Arc::clone(store),
        window,
        stopped(stop_rx.clone()),
    ));
    // The gateway's purge: bounded batches per run, damaged rows named.
    let purge = tokio::spawn(idem_process::run_purge(
        Arc::clone(store),
        Arc::clone(&metrics),
        config.purge_interval,
        stop_rx.clone(),
    ));
    // The ambiguous records per subscription: each has a scope of its own.
    let groups = config
        .subscriptions
        .iter()
        .map(|s| (s.name.clone(), s.intent.scope().clone()))
        .collect();
    let sampled = tokio::spawn(idem_process::gauges::run(
        Arc::clone(store),
        metrics,
        idem_process::gauges::GaugeGroups::ByScope(groups),
        config.gauge_sample_interval,
        stop_rx.clone(),
    ));
    async move {
        let _ = stop.wait_for(|s| *s).await;
        if let Some(task) = reconciled
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "the reconciler task failed");
        }
        if let Err(e) = purge.await {
            tracing::error!(error = %e, "the retention purge task failed");
        }
        if let Err(e) = sampled.await {
            tracing::error!(error = %e, "the gauges' store sampler failed");
        }
        if let Err(e) = window_kept.await {
            tracing::error!(error = %e, "the suspect window's refresh task failed");
        }
    }
}

/// Where in the config file a broker's error points: the broker section's
/// field, under its subscription.
fn field_of(i: usize, broker: &Broker, error: &BrokerError) -> Option<String> {
    error
        .field
        .map(|field| format!("subscription[{i}].{}.{field}", broker.section()))
}

/// Resolves once `stop` is true or its sender is gone.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

//! Runs a validated configuration until shutdown: one pump per
//! subscription, the reconciler (when a `[[lookup]]` is declared) and the
//! retention purge; on shutdown every pump stops taking messages, settles
//! the ones it holds, and the process returns what it did.

use std::future::Future;
use std::sync::Arc;

use idem_broker::Subscription as BrokerSubscription;
use idem_core::{Store, SystemClock};
use idem_reconcile::Reconciler;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::ConsumeConfig;
use crate::handle::Subscriber;
use crate::pump::{Counts, pump};

/// What each subscription did, by name.
pub type Report = Vec<(String, Counts)>;

/// Opens every subscription's broker, then runs until `shutdown`
/// completes. Fails before anything is consumed when a broker cannot be
/// opened or the reconciler cannot be built.
pub async fn run(
    config: &ConsumeConfig,
    store: Arc<dyn Store>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Report, String> {
    let mut pumps = Vec::with_capacity(config.subscriptions.len());
    for sub in &config.subscriptions {
        let handler = Subscriber::new(
            sub,
            Arc::clone(&store),
            &config.owner,
            config.region.as_deref(),
        )
        .map_err(|e| format!("subscription {:?}: {e}", sub.name))?;
        let broker: Arc<dyn BrokerSubscription> = sub
            .broker
            .open()
            .await
            .map_err(|e| format!("subscription {:?}: {e}", sub.name))?;
        tracing::info!(subscription = %sub.name, broker = %broker.describe(),
            deliver = %sub.deliver, concurrency = sub.concurrency, "consuming");
        pumps.push((sub.name.clone(), sub.concurrency, broker, handler));
    }
    let reconciler = if config.lookups.is_empty() {
        None
    } else {
        Some(
            Reconciler::new(
                Arc::clone(&store),
                config.lookups.clone(),
                config.reconcile.clone(),
                Arc::new(SystemClock),
            )
            .map_err(|e| format!("the reconciler cannot start: {e}"))?,
        )
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    for (name, concurrency, broker, handler) in pumps {
        let stop = stop_rx.clone();
        tasks.spawn(async move {
            let counts = pump(broker, Arc::new(handler), concurrency, stop).await;
            (name, counts)
        });
    }
    let background = {
        let mut stop = stop_rx.clone();
        let reconciled = reconciler.map(|r| {
            let stop = stop_rx.clone();
            tokio::spawn(r.run(stopped(stop)))
        });
        // The gateway's purge: bounded batches per run, damaged rows named.
        let purge = tokio::spawn(idem_gateway::run_purge(
            Arc::clone(&store),
            Arc::default(),
            config.purge_interval,
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
        }
    };
    shutdown.await;
    tracing::info!("stopping: settling the messages in hand");
    let _ = stop_tx.send(true);
    let mut report = Report::new();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((name, counts)) => {
                tracing::info!(subscription = %name, ?counts, "subscription stopped");
                report.push((name, counts));
            }
            Err(e) => tracing::error!(error = %e, "a subscription task failed"),
        }
    }
    background.await;
    report.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(report)
}

/// Resolves once `stop` is true or its sender is gone.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

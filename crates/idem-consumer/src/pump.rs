//! The loop of one subscription: `concurrency` workers each take the next
//! delivery, decide its settlement and carry it out; on shutdown, or when
//! the broker fails for good, they stop taking deliveries, finish and
//! settle the ones they hold, and return.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem_broker::{BrokerError, Delivery, Message, Reason, Subscription};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What to do with a delivered message, decided from its record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// The record is final (done now, or a replay): acknowledge.
    Ack,
    /// Not final (in flight elsewhere, outcome unknown, store down):
    /// deliver again, not before `after`. Never acknowledged.
    Retry {
        /// How long the broker holds the message back.
        after: Duration,
    },
    /// Never executed and never will be: to the dead-letter destination.
    DeadLetter(Reason),
    /// A late replay, past retention: to the late sink, never delivered.
    Late(Reason),
}

impl Settlement {
    /// The name used in logs and counters.
    pub fn name(&self) -> &'static str {
        match self {
            Settlement::Ack => "ack",
            Settlement::Retry { .. } => "retry",
            Settlement::DeadLetter(_) => "dead_letter",
            Settlement::Late(_) => "late",
        }
    }
}

/// Decides the settlement of one message (claims, delivers, completes).
pub trait Handler: Send + Sync + 'static {
    /// The settlement of `message`; never fails: a failure is a settlement
    /// (`Retry` when it may pass, `DeadLetter` when it cannot).
    fn handle<'a>(
        &'a self,
        message: &'a Message,
    ) -> Pin<Box<dyn Future<Output = Settlement> + Send + 'a>>;
}

/// What a pump did, counted per settlement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Acknowledged.
    pub acked: u64,
    /// Handed back for a later delivery.
    pub retried: u64,
    /// Sent to the dead-letter destination.
    pub dead_lettered: u64,
    /// Sent to the late sink.
    pub late: u64,
    /// Settlements the broker refused (the message stays unacknowledged
    /// and is delivered again).
    pub settle_failed: u64,
    /// Times the broker could not deliver (it was waited out).
    pub broker_errors: u64,
}

/// How a pump ended: what it did, and the broker failure that stopped it
/// before it was asked to stop, if one did.
#[derive(Debug)]
pub struct Pumped {
    /// What the workers did.
    pub counts: Counts,
    /// A permanent broker failure (what idem declared is gone and could
    /// not be made again, a refused login): every worker stopped taking
    /// messages and settled the ones it held.
    pub failed: Option<BrokerError>,
}

/// How long a worker waits after the broker failed to deliver.
const BROKER_PAUSE: Duration = Duration::from_millis(500);

/// How often a pump logs a warning that keeps repeating (a broker that
/// cannot deliver, settlements it refuses); the ones in between are
/// counted in the next line.
const WARN_INTERVAL: Duration = Duration::from_secs(5);

/// Runs `concurrency` workers over `subscription` until `stop` turns true,
/// or until the broker fails for good; returns once every delivery taken
/// has been settled (or its settlement failed, leaving it to the broker).
pub async fn pump(
    subscription: Arc<dyn Subscription>,
    handler: Arc<dyn Handler>,
    concurrency: usize,
    mut stop: watch::Receiver<bool>,
) -> Pumped {
    let (halt_tx, halt) = watch::channel(false);
    let warn = Arc::new(Throttle::default());
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let worker = Worker {
            subscription: Arc::clone(&subscription),
            handler: Arc::clone(&handler),
            warn: Arc::clone(&warn),
        };
        workers.spawn(worker.run(halt.clone()));
    }
    let mut total = Counts::default();
    let mut failed = None;
    loop {
        let done = tokio::select! {
            () = stopped(&mut stop) => {
                let _ = halt_tx.send(true);
                workers.join_next().await
            }
            done = workers.join_next() => done,
        };
        let Some(done) = done else { break };
        match done {
            Ok((counts, error)) => {
                total.add(&counts);
                if let Some(e) = error {
                    // One worker saw it; the others stop taking messages.
                    let _ = halt_tx.send(true);
                    failed.get_or_insert(e);
                }
            }
            Err(e) => tracing::error!(error = %e, "a consumer worker failed"),
        }
    }
    Pumped {
        counts: total,
        failed,
    }
}

/// Resolves once `stop` is true or its sender is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// One of a pump's workers.
struct Worker {
    subscription: Arc<dyn Subscription>,
    handler: Arc<dyn Handler>,
    warn: Arc<Throttle>,
}

impl Worker {
    /// Takes and settles deliveries until `halt`; a permanent broker error
    /// ends it, and is returned.
    async fn run(self, mut halt: watch::Receiver<bool>) -> (Counts, Option<BrokerError>) {
        let mut counts = Counts::default();
        loop {
            if *halt.borrow() {
                return (counts, None);
            }
            let delivery = tokio::select! {
                biased;
                _ = halt.changed() => continue,
                next = self.subscription.next() => next,
            };
            let delivery = match delivery {
                Ok(delivery) => delivery,
                Err(e) if !e.transient => {
                    counts.broker_errors += 1;
                    tracing::error!(subscription = %self.subscription.describe(), error = %e,
                        "the broker cannot deliver, and waiting will not help; stopping");
                    return (counts, Some(e));
                }
                Err(e) => {
                    counts.broker_errors += 1;
                    if let Some(suppressed) = self.warn.allow() {
                        tracing::warn!(subscription = %self.subscription.describe(), error = %e,
                            suppressed, "broker cannot deliver; waiting");
                    }
                    tokio::select! {
                        _ = halt.changed() => {}
                        _ = tokio::time::sleep(BROKER_PAUSE) => {}
                    }
                    continue;
                }
            };
            // Once taken, a delivery is handled and settled even if a halt
            // arrives meanwhile: that is the drain.
            settle(&*self.handler, delivery, &mut counts, &self.warn).await;
        }
    }
}

async fn settle(handler: &dyn Handler, delivery: Delivery, counts: &mut Counts, warn: &Throttle) {
    let Delivery { message, settle } = delivery;
    let settlement = handler.handle(&message).await;
    let name = settlement.name();
    let done = match settlement {
        Settlement::Ack => settle.ack().await.map(|()| counts.acked += 1),
        Settlement::Retry { after } => settle.retry(after).await.map(|()| counts.retried += 1),
        Settlement::DeadLetter(reason) => {
            tracing::warn!(subject = %message.subject, message_id = ?message.message_id,
                code = %reason.code, detail = %reason.detail, "message dead-lettered, not executed");
            settle
                .dead_letter(reason)
                .await
                .map(|()| counts.dead_lettered += 1)
        }
        Settlement::Late(reason) => {
            tracing::warn!(subject = %message.subject, message_id = ?message.message_id,
                code = %reason.code, detail = %reason.detail, "late replay past retention sent to the late sink, not executed");
            settle.late(reason).await.map(|()| counts.late += 1)
        }
    };
    if let Err(e) = done {
        counts.settle_failed += 1;
        if let Some(suppressed) = warn.allow() {
            tracing::warn!(subject = %message.subject, message_id = ?message.message_id,
                settlement = name, error = %e, suppressed,
                "cannot settle the message; the broker will deliver it again");
        }
    }
}

/// Lets one warning through per [`WARN_INTERVAL`], counting the others.
#[derive(Default)]
struct Throttle {
    state: Mutex<Option<(Instant, u64)>>,
}

impl Throttle {
    /// `Some(suppressed since the last one)` when a warning may be logged
    /// now; `None` when it is counted instead.
    fn allow(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *state {
            Some((last, suppressed)) if last.elapsed() < WARN_INTERVAL => {
                *suppressed += 1;
                None
            }
            slot => {
                let suppressed = slot.map_or(0, |(_, n)| n);
                *slot = Some((Instant::now(), 0));
                Some(suppressed)
            }
        }
    }
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.acked += other.acked;
        self.retried += other.retried;
        self.dead_lettered += other.dead_lettered;
        self.late += other.late;
        self.settle_failed += other.settle_failed;
        self.broker_errors += other.broker_errors;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeating_warning_is_let_through_once_and_the_rest_counted() {
        let throttle = Throttle::default();
        assert_eq!(throttle.allow(), Some(0));
        for _ in 0..3 {
            assert_eq!(throttle.allow(), None);
        }
        // As if the interval had passed: the next one says how many were left out.
        if let Some((last, _)) = throttle.state.lock().unwrap().as_mut() {
            *last -= WARN_INTERVAL;
        }
        assert_eq!(throttle.allow(), Some(3));
        assert_eq!(throttle.allow(), None);
    }
}

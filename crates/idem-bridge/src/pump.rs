//! The loop of one subscription: `concurrency` workers each take the next
//! delivery, decide its settlement and carry it out; on shutdown they stop
//! taking deliveries, finish and settle the ones they hold, and return.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use idem_broker::{Delivery, Message, Reason, Subscription};
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

/// How long a worker waits after the broker failed to deliver.
const BROKER_PAUSE: Duration = Duration::from_millis(500);

/// Runs `concurrency` workers over `subscription` until `stop` turns true;
/// returns once every delivery taken has been settled (or its settlement
/// failed, leaving it to the broker).
pub async fn pump(
    subscription: Arc<dyn Subscription>,
    handler: Arc<dyn Handler>,
    concurrency: usize,
    stop: watch::Receiver<bool>,
) -> Counts {
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (subscription, handler, stop) = (
            Arc::clone(&subscription),
            Arc::clone(&handler),
            stop.clone(),
        );
        workers.spawn(worker(subscription, handler, stop));
    }
    let mut total = Counts::default();
    while let Some(done) = workers.join_next().await {
        match done {
            Ok(counts) => total.add(&counts),
            Err(e) => tracing::error!(error = %e, "a consumer worker failed"),
        }
    }
    total
}

async fn worker(
    subscription: Arc<dyn Subscription>,
    handler: Arc<dyn Handler>,
    mut stop: watch::Receiver<bool>,
) -> Counts {
    let mut counts = Counts::default();
    loop {
        if *stop.borrow() {
            return counts;
        }
        let delivery = tokio::select! {
            biased;
            _ = stop.changed() => continue,
            next = subscription.next() => next,
        };
        let delivery = match delivery {
            Ok(delivery) => delivery,
            Err(e) => {
                counts.broker_errors += 1;
                tracing::warn!(subscription = %subscription.describe(), error = %e, "broker cannot deliver; waiting");
                tokio::select! {
                    _ = stop.changed() => {}
                    _ = tokio::time::sleep(BROKER_PAUSE) => {}
                }
                continue;
            }
        };
        // Once taken, a delivery is handled and settled even if a stop
        // arrives meanwhile: that is the drain.
        settle(&*handler, delivery, &mut counts).await;
    }
}

async fn settle(handler: &dyn Handler, delivery: Delivery, counts: &mut Counts) {
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
        tracing::warn!(subject = %message.subject, message_id = ?message.message_id,
            settlement = name, error = %e, "cannot settle the message; the broker will deliver it again");
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

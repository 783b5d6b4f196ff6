//! Group commit from one process: concurrent writes of one kind (claims of
//! new keys, completions) go to the server as one multi-row statement, in
//! autocommit, so that one commit (one WAL flush) makes the lot durable.
//!
//! No write waits to fill a batch. A write that finds a lane free starts
//! one at once with whatever is queued (often only itself); writes that
//! arrive while every lane is busy queue, and the lane that finishes first
//! takes them all as its next batch. An idle gateway sends each write
//! alone, as before; a busy one sends fewer, larger statements, and each
//! caller hears its own answer only after the statement that carried its
//! row committed.
//!
//! A batch never holds two writes for one record (a second waits for the
//! next batch), so each row of a statement answers exactly one caller.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use idem_core::{RecordId, StoreError};
use tokio::sync::oneshot;

/// The most writes one statement carries: bounds the statement's size and
/// how long its rows' locks are held together.
pub(crate) const BATCH_ROWS_MAX: usize = 256;

/// One write that may share a statement with others.
pub(crate) trait Batched: Send + 'static {
    /// What its caller hears.
    type Out: Send + 'static;
    /// The record it writes: one per batch.
    fn id(&self) -> &RecordId;
}

/// Runs one batch: one answer per write, in the order given.
pub(crate) type RunFn<I> = Arc<
    dyn Fn(
            Vec<I>,
        )
            -> Pin<Box<dyn Future<Output = Vec<Result<<I as Batched>::Out, StoreError>>> + Send>>
        + Send
        + Sync,
>;

/// The queue of one kind of write and the lanes draining it.
pub(crate) struct Batcher<I: Batched> {
    queue: Mutex<Queue<I>>,
    lanes: usize,
    run: RunFn<I>,
    store: String,
    /// Statements sent, and the writes they carried.
    batches: AtomicU64,
    writes: AtomicU64,
}

struct Queue<I: Batched> {
    pending: VecDeque<Pending<I>>,
    running: usize,
}

struct Pending<I: Batched> {
    item: I,
    reply: oneshot::Sender<Result<I::Out, StoreError>>,
}

impl<I: Batched> Batcher<I> {
    /// A batcher running at most `lanes` batches at once through `run`.
    pub(crate) fn new(lanes: usize, store: String, run: RunFn<I>) -> Arc<Batcher<I>> {
        Arc::new(Batcher {
            queue: Mutex::new(Queue {
                pending: VecDeque::new(),
                running: 0,
            }),
            lanes: lanes.max(1),
            run,
            store,
            batches: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        })
    }

    /// Batches run so far, and the writes they carried.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.batches.load(Ordering::Relaxed),
            self.writes.load(Ordering::Relaxed),
        )
    }

    /// Queues `item` and waits for its answer, starting a lane if one is
    /// free. The batch runs on a task of its own, so a caller that stops
    /// waiting (its deadline passed) leaves the others' answers intact.
    pub(crate) async fn submit(self: &Arc<Self>, item: I) -> Result<I::Out, StoreError> {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut queue = self.lock();
            queue.pending.push_back(Pending { item, reply });
            if queue.running < self.lanes {
                queue.running += 1;
                Some(take(&mut queue.pending))
            } else {
                None
            }
        };
        if let Some(batch) = start {
            let lane = Lane {
                batcher: Arc::clone(self),
                ended: false,
            };
            tokio::spawn(lane.drain(batch));
        }
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable {
                store: self.store.clone(),
                reason: "the batch carrying this write stopped before it answered; it may or \
                         may not have been applied"
                    .to_owned(),
            })
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue<I>> {
        // The queue is consistent between statements: a panic elsewhere
        // leaves nothing half-done in it.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One running lane: gives its place back when it ends, even by a panic.
struct Lane<I: Batched> {
    batcher: Arc<Batcher<I>>,
    /// Its place was given back, under the same lock that found the queue
    /// empty, so no write can queue unseen in between.
    ended: bool,
}

impl<I: Batched> Lane<I> {
    /// Runs `batch`, answers its callers, and goes on with whatever queued
    /// meanwhile until nothing is left.
    async fn drain(mut self, mut batch: Vec<Pending<I>>) {
        loop {
            let (items, replies): (Vec<I>, Vec<_>) =
                batch.into_iter().map(|p| (p.item, p.reply)).unzip();
            self.batcher.batches.fetch_add(1, Ordering::Relaxed);
            self.batcher
                .writes
                .fetch_add(items.len() as u64, Ordering::Relaxed);
            let answers = (self.batcher.run)(items).await;
            // A runner that answered fewer rows than it was given leaves
            // the rest to hear that their batch stopped.
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(answer);
            }
            let mut queue = self.batcher.lock();
            batch = take(&mut queue.pending);
            if batch.is_empty() {
                queue.running = queue.running.saturating_sub(1);
                self.ended = true;
                return;
            }
        }
    }
}

impl<I: Batched> Drop for Lane<I> {
    fn drop(&mut self) {
        if !self.ended {
            let mut queue = self.batcher.lock();
            queue.running = queue.running.saturating_sub(1);
        }
    }
}

/// The next batch: queued writes in arrival order, up to
/// [`BATCH_ROWS_MAX`], skipping (and leaving queued) any whose record
/// already has a write in the batch.
fn take<I: Batched>(pending: &mut VecDeque<Pending<I>>) -> Vec<Pending<I>> {
    let mut batch = Vec::with_capacity(pending.len().min(BATCH_ROWS_MAX));
    let mut seen: HashSet<RecordId> = HashSet::new();
    let mut held = VecDeque::new();
    while let Some(next) = pending.pop_front() {
        if batch.len() == BATCH_ROWS_MAX {
            held.push_back(next);
            break;
        }
        if seen.insert(next.item.id().clone()) {
            batch.push(next);
        } else {
            held.push_back(next);
        }
    }
    held.append(pending);
    *pending = held;
    batch
}

//! What the writer and the checkpointer count, shared with the store
//! handle that reports it ([`crate::WriterStats`]).

use std::sync::atomic::AtomicU64;

/// Batches and operations the writer has run, and the WAL checkpoints
/// run for it.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) batches: AtomicU64,
    pub(crate) ops: AtomicU64,
    /// WAL checkpoints the checkpointer thread ran.
    pub(crate) checkpoints: AtomicU64,
    /// Checkpoints the writer ran in a commit, the WAL at its bound.
    pub(crate) inline_checkpoints: AtomicU64,
    /// The few pages the checkpointer had left, copied by the writer so
    /// that the WAL restarts.
    pub(crate) catch_ups: AtomicU64,
}

//! Conflicts run again: a serialization failure (SQLSTATE 40001) or a
//! deadlock (40P01) is the server rolling back a transaction so that
//! another can go on, and the same work run again usually passes. Engines
//! that run every transaction serializable (CockroachDB, YugabyteDB) answer
//! this way under any contention; PostgreSQL at `READ COMMITTED` only for
//! a deadlock.
//!
//! Running it again is safe only when nothing of it committed, which these
//! two codes guarantee when the server returns them: from a statement in
//! autocommit, whose own implicit transaction they rolled back; from a
//! statement inside a transaction, which is then aborted and can only roll
//! back; and from `COMMIT`, which they turn into a rollback. Any other
//! failure (a lost connection above all, after which a commit may or may
//! not have landed, or CockroachDB's 40003 "result is ambiguous") is never
//! run again here.
//!
//! Where: every statement the store runs in autocommit on its own
//! connections (the fast-path insert, the read without a lock, the lease
//! restart, every completion, alone or batched), in place; and a claim's
//! locked read-decide-write, as a whole transaction. Each at most
//! [`CONFLICT_RETRIES_MAX`] more times, after a short jittered pause, within
//! the operation's deadline; then the conflict is the caller's as before
//! (`Unavailable`: 503). A caller's own transaction (`claim_in`,
//! `complete_in`) is never run again here: it holds the caller's writes too.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_postgres::error::SqlState;

/// How many more times a statement in autocommit, or a claim's locked
/// transaction, that a serialization failure (40001) or a deadlock
/// (40P01) rolled back is run, after a jittered pause of 5 to 40 ms.
pub const CONFLICT_RETRIES_MAX: u32 = 3;

/// The pause before the first retry, doubled before each next one, and
/// as much again at most of jitter: 5–10 ms, 10–20 ms, 20–40 ms, so
/// three retries add at most 70 ms.
const PAUSE_MS_BASE: u64 = 5;

/// Whether the server rolled back for a conflict with another transaction.
pub(crate) fn conflict(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|code| {
        *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
    })
}

/// Waits before retry `n` (1 for the first), jittered so that the
/// transactions that met do not meet again in step.
pub(crate) async fn pause(n: u32) {
    // A fresh `RandomState` is seeded at random: jitter without a
    // dependency.
    let random = RandomState::new().hash_one(n);
    tokio::time::sleep(Duration::from_millis(pause_ms(n, random))).await;
}

/// The pause before retry `n`, `random` choosing its jitter.
fn pause_ms(n: u32, random: u64) -> u64 {
    let base = PAUSE_MS_BASE << n.clamp(1, 8).saturating_sub(1);
    base + random % base
}

/// Noted by a statement of a transaction that a conflict rolled it back,
/// for the code that runs the transaction to run it again; the error is
/// returned as ever.
#[derive(Debug, Default)]
pub(crate) struct Conflict(AtomicBool);

impl Conflict {
    /// Notes `e` when it is a conflict.
    pub(crate) fn note(&self, e: &tokio_postgres::Error) {
        if conflict(e) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// Whether a conflict was noted.
    pub(crate) fn seen(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_and_stay_within_their_jitter() {
        let cases = [
            (1, 0, 5),
            (1, 4, 9),
            (1, 5, 5),
            (2, 0, 10),
            (2, 19, 19),
            (3, 0, 20),
            (3, u64::MAX, 20 + u64::MAX % 20),
            (0, 7, 7),
            (40, 0, 5 << 7),
        ];
        for (n, random, expect) in cases {
            assert_eq!(pause_ms(n, random), expect, "retry {n}, random {random}");
        }
        let most: u64 = (1..=CONFLICT_RETRIES_MAX)
            .map(|n| pause_ms(n, u64::MAX))
            .sum();
        assert!(most < 70, "{most} ms");
    }
}

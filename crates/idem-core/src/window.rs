//! The suspect window (docs/contract.md, "After a failover or a restore"):
//! a span of time in which the store may have forgotten records it once
//! held, because it was restored from a backup or failed over to a replica
//! that lacked the last writes. A key without a record may then still have
//! executed, so a fresh claim of it is verified with the provider before
//! anything is forwarded ([`verify_verdict`]).
//!
//! The window is kept in the store, so it survives a restart and every
//! process sharing the store sees it. Opening it again while it is open
//! extends it: it never shortens, it covers the earliest restore point
//! either opening named, and it starts the guard on a "not found" again
//! from the latest opening, since every loss may forget an attempt that is
//! still running ([`SuspectWindow::opened`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Timestamp;
use crate::record::{RecordId, StoredResult};
use crate::verdict::LookupAnswer;

/// The longest text kept as a window's cause, in bytes.
pub const WINDOW_CAUSE_BYTES_MAX: usize = 512;

/// The longest a window may be opened for, in milliseconds: the longest
/// horizon a route may have ([`crate::HORIZON_S_MAX`]).
pub const WINDOW_MS_MAX: u64 = crate::HORIZON_S_MAX * 1000;

/// An open (or past) suspect window, as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct SuspectWindow {
    /// When the window was last opened (store clock): the latest loss. An
    /// attempt claimed before a failover or restore may still be running
    /// at the provider until its lease ends, so a "not found" is trusted
    /// only once every lease that began before this instant has ended.
    /// Every opening moves it, an extension too: a second loss inside an
    /// open window (a failback, a second restore, a backup taken while the
    /// window was open) forgets attempts claimed after the first one.
    pub opened_at: Timestamp,
    /// When it closes (store clock).
    pub until: Timestamp,
    /// The earliest point the store may have lost writes after (a restore
    /// point), when known; `None` after a promotion, whose lost tail has no
    /// known start.
    pub since: Option<Timestamp>,
    /// Why it was opened, last opening first (e.g. `promotion: timeline 1
    /// -> 2`, `restored from a backup taken at ...`).
    pub cause: String,
    /// Counts the changes to the store's window (1 for the first opening):
    /// a process that read an older window never takes it over a newer one.
    pub version: u64,
}

/// A request to open (or extend) the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowOpening {
    /// How long from now it stays open, in milliseconds (at most
    /// [`WINDOW_MS_MAX`]).
    pub length_ms: u64,
    /// The restore point, when known.
    pub since: Option<Timestamp>,
    /// Why (truncated to [`WINDOW_CAUSE_BYTES_MAX`]).
    pub cause: String,
}

impl SuspectWindow {
    /// Whether the window is open at `now`.
    pub fn is_open(&self, now: Timestamp) -> bool {
        now < self.until
    }

    /// The window after `opening` at `now`, given the one the store holds:
    /// a closed window is replaced; an open one is extended, never
    /// shortened, keeps the earlier restore point, names both causes and
    /// takes `now` as its opening instant (the guard on a "not found"
    /// counts from the latest loss). Every store applies this atomically.
    pub fn opened(
        held: Option<&SuspectWindow>,
        opening: &WindowOpening,
        now: Timestamp,
    ) -> SuspectWindow {
        let until = now.plus_millis(opening.length_ms.min(WINDOW_MS_MAX));
        let cause = truncate(&opening.cause);
        match held {
            Some(w) if w.is_open(now) => SuspectWindow {
                opened_at: now.max(w.opened_at),
                until: w.until.max(until),
                since: match (w.since, opening.since) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
                cause: truncate(&format!("{cause}; {}", w.cause)),
                version: w.version.saturating_add(1),
            },
            _ => SuspectWindow {
                opened_at: now,
                until,
                since: opening.since,
                cause,
                version: held.map_or(1, |w| w.version.saturating_add(1)),
            },
        }
    }
}

/// Cuts `cause` to [`WINDOW_CAUSE_BYTES_MAX`] bytes on a character boundary.
fn truncate(cause: &str) -> String {
    let mut end = cause.len().min(WINDOW_CAUSE_BYTES_MAX);
    while !cause.is_char_boundary(end) {
        end -= 1;
    }
    cause[..end].to_owned()
}

/// What the provider said about a key claimed fresh inside the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verification {
    /// The effect happened: complete the record with this answer and
    /// replay it; nothing is forwarded.
    Executed(StoredResult),
    /// The effect did not happen: forward as usual.
    NotExecuted,
    /// "Not found", but an attempt lost with the store's memory may still
    /// be running until then (store clock): ask again after it, nothing
    /// forwarded now.
    NotYet {
        /// When a "not found" proves the key did not execute.
        at: Timestamp,
    },
    /// No answer (the provider is down, slow or answered something else):
    /// fail closed, nothing forwarded.
    Failed {
        /// What went wrong.
        reason: String,
    },
}

/// The verdict on a fresh claim inside `window` from the provider's
/// `answer`, asked at `asked_at`: the same rule as for an ambiguous attempt
/// ([`crate::verdict::verdict`]), with the lease of any attempt the store
/// forgot taken to end no later than `lease_ms` after the window opened.
pub fn verify_verdict(
    answer: LookupAnswer,
    asked_at: Timestamp,
    window: &SuspectWindow,
    lease_ms: u64,
) -> Verification {
    let forgotten_lease_until = window.opened_at.plus_millis(lease_ms);
    match answer {
        LookupAnswer::Found(result) => Verification::Executed(result),
        LookupAnswer::NotFound if asked_at < forgotten_lease_until => Verification::NotYet {
            at: forgotten_lease_until,
        },
        LookupAnswer::NotFound => Verification::NotExecuted,
        LookupAnswer::Failed => Verification::Failed {
            reason: "the lookup gave no answer".into(),
        },
    }
}

/// Verifies a fresh claim inside a suspect window: asks the provider by
/// the forwarded key whether the key executed before the store lost its
/// record (the reconciler, with the operation's lookup). Used by the HTTP
/// layer and the queue consumer alike.
pub trait VerifyFresh: Send + Sync {
    /// Whether the record's operation has a lookup to ask.
    fn covers(&self, id: &RecordId) -> bool;

    /// Asks the provider about `id`, claimed fresh inside `window` under a
    /// lease of `lease_ms`, and gives the verdict ([`verify_verdict`]).
    /// Bounded in time by the lookup's own timeout; writes nothing.
    fn verify<'a>(
        &'a self,
        id: &'a RecordId,
        window: &'a SuspectWindow,
        lease_ms: u64,
    ) -> Pin<Box<dyn Future<Output = Verification> + Send + 'a>>;
}

/// A process's view of the store's window, cheap to ask on every claim:
/// set from the store at start, refreshed by the caller, and at once by a
/// store that opens a window itself (a PostgreSQL promotion noticed on a
/// new connection, before that connection is used).
#[derive(Debug, Default)]
pub struct WindowWatch {
    /// `until` in milliseconds (store clock), 0 when none is known.
    until_ms: AtomicU64,
    window: Mutex<Option<SuspectWindow>>,
}

impl WindowWatch {
    /// A watch that knows no window.
    pub fn new() -> WindowWatch {
        WindowWatch::default()
    }

    /// Takes `window` as the store's current one, unless the watch holds a
    /// newer one (a refresh that read the store before a window was opened
    /// or extended never undoes it).
    pub fn set(&self, window: Option<SuspectWindow>) {
        let Some(window) = window else {
            return;
        };
        let mut held = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if held.as_ref().is_some_and(|h| h.version > window.version) {
            return;
        }
        self.until_ms
            .store(window.until.as_millis(), Ordering::SeqCst);
        *held = Some(window);
    }

    /// The window, if it is open at `now`.
    pub fn open_at(&self, now: Timestamp) -> Option<SuspectWindow> {
        if now.as_millis() >= self.until_ms.load(Ordering::SeqCst) {
            return None;
        }
        let held = self.window.lock().unwrap_or_else(|e| e.into_inner());
        held.clone().filter(|w| w.is_open(now))
    }

    /// Takes the window the store was just read to hold
    /// (`Store::suspect_window`) into the watch; returns it when it is open
    /// and newer than the one the watch held (a window opened elsewhere,
    /// for the caller to say so).
    pub fn observe(&self, read: Option<SuspectWindow>, now: Timestamp) -> Option<SuspectWindow> {
        let window = read?;
        let newer = self.last().is_none_or(|held| held.version < window.version);
        let news = (newer && window.is_open(now)).then(|| window.clone());
        self.set(Some(window));
        news
    }

    /// The window last seen, open or not.
    pub fn last(&self) -> Option<SuspectWindow> {
        self.window
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn opening(length_ms: u64, since: Option<u64>, cause: &str) -> WindowOpening {
        WindowOpening {
            length_ms,
            since: since.map(at),
            cause: cause.into(),
        }
    }

    #[test]
    fn an_open_window_is_extended_never_shortened() {
        let first = SuspectWindow::opened(None, &opening(1000, Some(50), "restore"), at(100));
        assert_eq!((first.opened_at, first.until), (at(100), at(1100)));
        let shorter = SuspectWindow::opened(Some(&first), &opening(10, Some(80), "mark"), at(200));
        assert_eq!(shorter.until, at(1100), "never shortened");
        assert_eq!(
            shorter.opened_at,
            at(200),
            "the guard starts at the latest loss"
        );
        assert_eq!(shorter.since, Some(at(50)), "the earlier restore point");
        assert_eq!(shorter.cause, "mark; restore");
        let longer =
            SuspectWindow::opened(Some(&first), &opening(5000, None, "promotion"), at(200));
        assert_eq!((longer.until, longer.since), (at(5200), Some(at(50))));
    }

    #[test]
    fn a_closed_window_is_replaced() {
        let old = SuspectWindow::opened(None, &opening(10, Some(1), "old"), at(0));
        let new = SuspectWindow::opened(Some(&old), &opening(10, None, "new"), at(10));
        assert_eq!(new.opened_at, at(10));
        assert_eq!((new.since, new.cause.as_str()), (None, "new"));
    }

    #[test]
    fn lengths_and_causes_are_bounded() {
        let w = SuspectWindow::opened(None, &opening(u64::MAX, None, &"é".repeat(400)), at(0));
        assert_eq!(w.until, at(WINDOW_MS_MAX));
        assert!(w.cause.len() <= WINDOW_CAUSE_BYTES_MAX);
        assert!(w.cause.chars().all(|c| c == 'é'));
    }

    #[test]
    fn not_found_counts_only_after_every_forgotten_lease() {
        let w = SuspectWindow::opened(None, &opening(60_000, None, "promotion"), at(1000));
        assert_eq!(
            verify_verdict(LookupAnswer::NotFound, at(2999), &w, 2000),
            Verification::NotYet { at: at(3000) }
        );
        assert_eq!(
            verify_verdict(LookupAnswer::NotFound, at(3000), &w, 2000),
            Verification::NotExecuted
        );
        assert!(matches!(
            verify_verdict(LookupAnswer::Failed, at(9000), &w, 2000),
            Verification::Failed { .. }
        ));
    }

    #[test]
    fn a_second_loss_inside_the_window_restarts_the_guard() {
        // Lost at 1000; a fresh claim at 4000 (past the first guard) runs
        // under a 2000 ms lease; a second restore at 4500 forgets it.
        let first = SuspectWindow::opened(None, &opening(60_000, None, "restore"), at(1000));
        let second = SuspectWindow::opened(
            Some(&first),
            &opening(60_000, None, "restore again"),
            at(4500),
        );
        assert_eq!(second.opened_at, at(4500));
        assert_eq!(
            verify_verdict(LookupAnswer::NotFound, at(5000), &second, 2000),
            Verification::NotYet { at: at(6500) },
            "the attempt lost by the second restore may still commit"
        );
        // A store clock that went back (a promoted server's) never moves
        // the guard earlier.
        let back = SuspectWindow::opened(Some(&second), &opening(10, None, "promotion"), at(4000));
        assert_eq!(back.opened_at, at(4500));
    }

    #[test]
    fn a_watch_keeps_the_newer_window() {
        let watch = WindowWatch::new();
        assert_eq!(watch.open_at(at(0)), None);
        let w = SuspectWindow::opened(None, &opening(100, None, "x"), at(0));
        assert_eq!(w.version, 1);
        watch.set(Some(w.clone()));
        assert_eq!(watch.open_at(at(99)), Some(w.clone()));
        assert_eq!(watch.open_at(at(100)), None);
        // A refresh that read the store before the window was extended,
        // or before there was one.
        let extended = SuspectWindow::opened(Some(&w), &opening(500, None, "y"), at(50));
        assert_eq!(extended.version, 2);
        watch.set(Some(extended.clone()));
        watch.set(Some(w.clone()));
        watch.set(None);
        assert_eq!(watch.open_at(at(300)), Some(extended.clone()));
        // A newer window that ends earlier (closed by an operator) wins.
        let closed = SuspectWindow {
            until: at(60),
            version: 3,
            ..extended
        };
        watch.set(Some(closed.clone()));
        assert_eq!((watch.open_at(at(61)), watch.last()), (None, Some(closed)));
    }
}

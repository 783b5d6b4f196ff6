//! What the database's clock can read now, known within bounds from the
//! times the statements already return, so that a replay may be answered
//! from memory only while the record is surely completed by that clock.
//!
//! A statement sent at local instant `sent` and answered at `received`
//! read the server's clock at some instant in between: at any later local
//! instant `at`, the server's clock reads at most its reading plus
//! `at - sent` (this process's monotonic clock, which wall-clock steps here
//! do not move), plus a millisecond for the reading's rounding down and a
//! drift allowance. No bound is given when the last reading is older than
//! [`SAMPLE_AGE_MS_MAX`] or its round trip took longer than
//! [`ROUND_TRIP_MS_MAX`]: then every claim goes to the server.
//!
//! A store answering every replay from memory runs no statement that
//! would read the clock again, so a reading older than
//! [`REFRESH_AGE_MS`] is renewed by a statement of its own, one at a time
//! ([`DbClock::begin_refresh`]), before the bound lapses: otherwise a busy
//! gateway's replays would all fall to the server once a second.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem_core::Timestamp;

/// A reading older than this gives no bound: the server's clock may have
/// been stepped since.
pub(crate) const SAMPLE_AGE_MS_MAX: u64 = 1_000;

/// A reading whose statement took longer than this gives no bound: it is
/// too loose to be worth keeping.
pub(crate) const ROUND_TRIP_MS_MAX: u64 = 50;

/// A reading older than this is renewed when a replay consults it: a
/// quarter of [`SAMPLE_AGE_MS_MAX`], so that a renewal slower than the
/// round trip it may keep still lands before the bound lapses.
pub(crate) const REFRESH_AGE_MS: u64 = SAMPLE_AGE_MS_MAX / 4;

/// How far the two clocks may drift apart per second of a reading's age,
/// in milliseconds: 1,000 ppm, twice the fastest an NTP daemon slews.
const DRIFT_MS_PER_S: u64 = 1;

/// The latest reading of the database's clock.
#[derive(Default)]
pub(crate) struct DbClock {
    latest: Mutex<Option<Reading>>,
    /// A renewal is under way ([`DbClock::begin_refresh`]).
    refreshing: AtomicBool,
    /// When the last renewal started: the next waits [`REFRESH_AGE_MS`]
    /// after it, so that a server that does not answer is asked at most
    /// four times a second, however many claims arrive.
    last_renewal: Mutex<Option<Instant>>,
}

#[derive(Clone, Copy)]
struct Reading {
    sent: Instant,
    received: Instant,
    db: Timestamp,
}

impl DbClock {
    /// Notes that a statement sent at `sent` and answered at `received`
    /// read `db` from the server's clock.
    pub(crate) fn note(&self, sent: Instant, received: Instant, db: Timestamp) {
        if received.saturating_duration_since(sent) > Duration::from_millis(ROUND_TRIP_MS_MAX) {
            return;
        }
        let mut latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        if latest.is_none_or(|kept| kept.received <= received) {
            *latest = Some(Reading { sent, received, db });
        }
    }

    /// Whether the caller should read the server's clock now, because the
    /// latest reading is missing or older than [`REFRESH_AGE_MS`] at `at`,
    /// no other renewal is under way and none started in the last
    /// [`REFRESH_AGE_MS`]; if so, the caller must call
    /// [`DbClock::end_refresh`] when its statement is done, answered or not.
    pub(crate) fn begin_refresh(&self, at: Instant) -> bool {
        let aged = |since: Option<Instant>| {
            since.is_none_or(|since| {
                at.saturating_duration_since(since) >= Duration::from_millis(REFRESH_AGE_MS)
            })
        };
        let received = self
            .latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map(|reading| reading.received);
        if !aged(received) {
            return false;
        }
        let mut last = self
            .last_renewal
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !aged(*last)
            || self
                .refreshing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return false;
        }
        *last = Some(at);
        true
    }

    /// The renewal [`DbClock::begin_refresh`] started is done.
    pub(crate) fn end_refresh(&self) {
        self.refreshing.store(false, Ordering::Release);
    }

    /// The latest the server's clock can read at `at`; `None` when no
    /// recent reading bounds it.
    pub(crate) fn latest_at(&self, at: Instant) -> Option<Timestamp> {
        let reading = (*self.latest.lock().unwrap_or_else(PoisonError::into_inner))?;
        let age = at.saturating_duration_since(reading.received);
        if age > Duration::from_millis(SAMPLE_AGE_MS_MAX) {
            return None;
        }
        let since_sent = u64::try_from(at.saturating_duration_since(reading.sent).as_millis())
            .unwrap_or(u64::MAX);
        let drift = since_sent / 1_000 * DRIFT_MS_PER_S + DRIFT_MS_PER_S;
        // +1 for the reading's rounding down to a millisecond, +1 for the
        // elapsed time's.
        Some(reading.db.plus_millis(since_sent.saturating_add(drift + 2)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_covers_the_round_trip_and_expires() {
        let clock = DbClock::default();
        let sent = Instant::now();
        assert_eq!(clock.latest_at(sent), None, "no reading, no bound");
        let received = sent + Duration::from_millis(4);
        clock.note(sent, received, Timestamp::from_millis(10_000));
        // 4 ms since sent, 1 ms drift allowance, 2 ms rounding.
        assert_eq!(
            clock.latest_at(received),
            Some(Timestamp::from_millis(10_007))
        );
        let later = received + Duration::from_millis(SAMPLE_AGE_MS_MAX + 1);
        assert_eq!(clock.latest_at(later), None, "too old a reading");
        let slow = DbClock::default();
        slow.note(
            sent,
            sent + Duration::from_millis(ROUND_TRIP_MS_MAX + 1),
            Timestamp::from_millis(10_000),
        );
        assert_eq!(slow.latest_at(sent), None, "too slow a statement");
    }

    #[test]
    fn a_reading_is_renewed_once_it_ages_one_renewal_at_a_time() {
        let clock = DbClock::default();
        let sent = Instant::now();
        assert!(clock.begin_refresh(sent), "no reading: renew");
        assert!(!clock.begin_refresh(sent), "one renewal at a time");
        clock.note(sent, sent, Timestamp::from_millis(10_000));
        clock.end_refresh();
        let young = sent + Duration::from_millis(REFRESH_AGE_MS - 1);
        assert!(!clock.begin_refresh(young), "a young reading stands");
        let aged = sent + Duration::from_millis(REFRESH_AGE_MS);
        assert!(clock.begin_refresh(aged), "an aged reading is renewed");
        assert!(
            clock.latest_at(aged).is_some(),
            "and still bounds the clock meanwhile"
        );
        assert!(!clock.begin_refresh(aged), "by one caller");
        clock.end_refresh();
        assert!(
            !clock.begin_refresh(aged),
            "a renewal that read nothing is not retried at once"
        );
        let later = aged + Duration::from_millis(REFRESH_AGE_MS);
        assert!(clock.begin_refresh(later), "but a while after it started");
    }
}

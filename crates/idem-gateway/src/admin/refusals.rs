//! How often a refused admin request is written to the log. The refusal
//! line is the one signal of token guessing, so it must stay readable: a
//! caller without the token may send as many requests as it likes, but it
//! cannot choose how many lines the gateway writes. Past the budget the
//! refusals are counted, and the next line written says how many were not.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most refusal lines written per window.
pub const ADMIN_REFUSAL_LOG_LINES_MAX: u32 = 10;
/// The length of one window of refusal lines.
pub const ADMIN_REFUSAL_LOG_WINDOW: Duration = Duration::from_secs(60);

/// Whether one refusal is written, and how many before it were not.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Logged {
    /// Write the line; `suppressed` refusals since the last line were not.
    Write { suppressed: u64 },
    /// Over the budget: counted, not written.
    Suppressed,
}

/// A budget of [`ADMIN_REFUSAL_LOG_LINES_MAX`] lines per
/// [`ADMIN_REFUSAL_LOG_WINDOW`].
#[derive(Debug, Default)]
pub(crate) struct RefusalLog(Mutex<Window>);

#[derive(Debug, Default)]
struct Window {
    started: Option<Instant>,
    written: u32,
    suppressed: u64,
}

impl RefusalLog {
    /// Decides about one refusal seen at `now`.
    pub(crate) fn admit(&self, now: Instant) -> Logged {
        // A poisoned lock only means another refusal panicked mid-count;
        // the counts are still numbers.
        let mut window = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let expired = window.started.is_none_or(|started| {
            now.saturating_duration_since(started) >= ADMIN_REFUSAL_LOG_WINDOW
        });
        if expired {
            window.started = Some(now);
            window.written = 0;
        }
        if window.written >= ADMIN_REFUSAL_LOG_LINES_MAX {
            window.suppressed += 1;
            return Logged::Suppressed;
        }
        window.written += 1;
        Logged::Write {
            suppressed: std::mem::take(&mut window.suppressed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_the_budget_per_window_and_the_rest_counted() {
        let log = RefusalLog::default();
        let start = Instant::now();
        let mut written = 0;
        for i in 0..1000u64 {
            if let Logged::Write { suppressed } = log.admit(start + Duration::from_millis(i)) {
                assert_eq!(suppressed, 0, "nothing suppressed yet");
                written += 1;
            }
        }
        assert_eq!(written, ADMIN_REFUSAL_LOG_LINES_MAX);
        let next = start + ADMIN_REFUSAL_LOG_WINDOW;
        assert_eq!(
            log.admit(next),
            Logged::Write {
                suppressed: 1000 - u64::from(ADMIN_REFUSAL_LOG_LINES_MAX)
            },
            "the first line of the next window says how many were not written"
        );
        assert_eq!(log.admit(next), Logged::Write { suppressed: 0 });
    }
}

//! How often a warning that a client can trigger is written: a caller may
//! cause as many refusals as it likes, but it cannot choose how many lines
//! the gateway writes. Past the budget the events are counted, and the
//! next line written says how many were not. Budgets bound the refusal
//! lines of the admin listener (one for the admin API's and the console's
//! together) and a listener's connection-cap warning.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Whether one event is written, and how many before it were not.
#[derive(Debug, PartialEq, Eq)]
pub enum Logged {
    /// Write the line.
    Write {
        /// Events since the last line written that were not.
        suppressed: u64,
    },
    /// Over the budget: counted, not written.
    Suppressed,
}

/// A budget of `lines_max` lines per `window`.
#[derive(Debug)]
pub struct LogBudget {
    lines_max: u32,
    window: Duration,
    state: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    started: Option<Instant>,
    written: u32,
    suppressed: u64,
}

impl LogBudget {
    /// At most `lines_max` lines per `window`.
    pub fn new(lines_max: u32, window: Duration) -> LogBudget {
        LogBudget {
            lines_max,
            window,
            state: Mutex::default(),
        }
    }

    /// Decides about one event seen at `now`.
    pub fn admit(&self, now: Instant) -> Logged {
        // A poisoned lock only means another caller panicked mid-count;
        // the counts are still numbers.
        let mut window = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let expired = window
            .started
            .is_none_or(|started| now.saturating_duration_since(started) >= self.window);
        if expired {
            window.started = Some(now);
            window.written = 0;
        }
        if window.written >= self.lines_max {
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
        for lines_max in [1, 10] {
            let window = Duration::from_secs(60);
            let log = LogBudget::new(lines_max, window);
            let start = Instant::now();
            let mut written = 0;
            for i in 0..1000u64 {
                if let Logged::Write { suppressed } = log.admit(start + Duration::from_millis(i)) {
                    assert_eq!(suppressed, 0, "nothing suppressed yet");
                    written += 1;
                }
            }
            assert_eq!(written, lines_max);
            let next = start + window;
            assert_eq!(
                log.admit(next),
                Logged::Write {
                    suppressed: 1000 - u64::from(lines_max)
                },
                "the first line of the next window says how many were not written"
            );
        }
    }
}

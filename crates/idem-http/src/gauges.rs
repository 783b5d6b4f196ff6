//! Gauges an on-call can alert on: the ambiguous backlog and the age of its
//! oldest record, the failing lookups among them, the suspect window, the
//! waiters, and whether the sampler that reads the store keeps up.
//!
//! The store's values are read by a sampler on a fixed interval
//! (`idem_process::gauges`), never on a scrape, so a scrape costs the store
//! nothing and a scraper cannot make a gateway scan it. A sample that fails
//! keeps the previous values and sets `idem_gauge_sample_failed`, and the
//! time of the last good sample is exposed, so a stale gauge is visible.
//! The waiters are counted where they register, on the request path, with
//! one atomic add.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The ambiguous records of one group (all of a gateway's, or one
/// subscription's of `idem consume`), as one sample found them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AmbiguousGroup {
    /// The group's label value (`subscription="…"`); `None`: no label.
    pub label: Option<String>,
    /// Ambiguous records found.
    pub records: u64,
    /// Seconds since the oldest of them was created (its attempt was
    /// claimed); 0 when there is none. An attempt becomes ambiguous after
    /// it was claimed, so this is at least the time it has been ambiguous.
    pub oldest_age_s: f64,
    /// Those whose current attempt has had at least one failed provider
    /// lookup (the count the store keeps for the reconciler).
    pub lookups_failing: u64,
}

/// What one sample of the store found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GaugeSample {
    /// The ambiguous records, by group, in rendering order.
    pub groups: Vec<AmbiguousGroup>,
    /// Whether the scan stopped at its cap before the end: the counts are
    /// then lower bounds.
    pub truncated: bool,
    /// Whether the store's suspect window is open.
    pub window_open: bool,
    /// Seconds until it closes; 0 when closed.
    pub window_remaining_s: f64,
    /// When the sample was taken, in seconds since the Unix epoch.
    pub taken_at_s: f64,
}

/// The gauges of one process. Shared inside [`crate::Metrics`].
#[derive(Debug, Default)]
pub struct Gauges {
    waiting: AtomicU64,
    waiters_max: AtomicU64,
    last: Mutex<Option<GaugeSample>>,
    failed: AtomicBool,
    failures: AtomicU64,
    /// Whether this process has waiters at all (a gateway or a layer; not
    /// `idem consume`): without them the waiter gauges are not rendered.
    serves_waiters: AtomicBool,
}

impl Gauges {
    /// Keeps a sample that succeeded; clears the failure flag.
    pub fn sampled(&self, sample: GaugeSample) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(sample);
        self.failed.store(false, Ordering::Relaxed);
    }

    /// Notes a sample that failed: the previous values stay, flagged.
    pub fn sample_failed(&self) {
        self.failed.store(true, Ordering::Relaxed);
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// The last sample that succeeded, if any.
    pub fn last_sample(&self) -> Option<GaugeSample> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// One more request waits for an original attempt.
    pub(crate) fn waiter_in(&self) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
    }

    /// One request stopped waiting.
    pub(crate) fn waiter_out(&self) {
        // Never below zero, even if a stray decrement came first.
        let _ = self
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    /// Sets the bound on waiters in all (`waiters_max`) and turns the
    /// waiter gauges on.
    pub fn set_waiters_max(&self, total: usize) {
        self.waiters_max
            .store(u64::try_from(total).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.serves_waiters.store(true, Ordering::Relaxed);
    }

    /// Requests waiting for an original attempt now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Renders every gauge in the Prometheus text format.
    pub(crate) fn render(&self, out: &mut String) {
        let sample = self.last_sample();
        let groups = sample
            .as_ref()
            .map(|s| s.groups.clone())
            .filter(|g| !g.is_empty())
            .unwrap_or_else(|| vec![AmbiguousGroup::default()]);
        let per_group: [(&str, &str, GroupValue); 3] = [
            (
                "idem_ambiguous_records",
                "Ambiguous records (outcome unknown) in the store at the last sample.",
                |g| g.records as f64,
            ),
            (
                "idem_ambiguous_oldest_age_seconds",
                "Seconds since the oldest ambiguous record's attempt was claimed (its created_at), \
                 at the last sample; 0 when there is none.",
                |g| g.oldest_age_s,
            ),
            (
                "idem_ambiguous_lookups_failing",
                "Ambiguous records whose provider lookup has failed at least once for their \
                 current attempt, at the last sample.",
                |g| g.lookups_failing as f64,
            ),
        ];
        for (name, help, value) in per_group {
            gauge_family(out, name, help);
            for group in &groups {
                let labels = group
                    .label
                    .as_deref()
                    .map(|l| format!("{{subscription=\"{}\"}}", escape_label(l)))
                    .unwrap_or_default();
                let _ = writeln!(out, "{name}{labels} {}", value(group));
            }
        }
        self.render_store_wide(out, sample.as_ref());
        self.render_waiters(out);
    }

    fn render_store_wide(&self, out: &mut String, sample: Option<&GaugeSample>) {
        let truncated = sample.is_some_and(|s| s.truncated);
        let open = sample.is_some_and(|s| s.window_open);
        let remaining = sample.map_or(0.0, |s| s.window_remaining_s);
        let taken = sample.map_or(0.0, |s| s.taken_at_s);
        let failed = self.failed.load(Ordering::Relaxed);
        let singles = [
            (
                "idem_ambiguous_scan_truncated",
                "1 when the last sample's scan of ambiguous records stopped at its cap: the \
                 ambiguous gauges are then lower bounds.",
                f64::from(u8::from(truncated)),
            ),
            (
                "idem_suspect_window_open",
                "1 while the store's suspect window is open (it may have lost recent records), \
                 at the last sample.",
                f64::from(u8::from(open)),
            ),
            (
                "idem_suspect_window_remaining_seconds",
                "Seconds until the suspect window closes, at the last sample; 0 when closed.",
                remaining,
            ),
            (
                "idem_gauge_sample_failed",
                "1 when the last sample of the store failed: the store gauges keep older values.",
                f64::from(u8::from(failed)),
            ),
            (
                "idem_gauge_last_sample_timestamp_seconds",
                "When the store gauges were last sampled successfully, in Unix seconds; 0: never.",
                taken,
            ),
        ];
        for (name, help, value) in singles {
            gauge_family(out, name, help);
            let _ = writeln!(out, "{name} {value}");
        }
        let name = "idem_gauge_sample_failures_total";
        let _ = writeln!(
            out,
            "# HELP {name} Samples of the store gauges that failed.\n# TYPE {name} counter"
        );
        let _ = writeln!(out, "{name} {}", self.failures.load(Ordering::Relaxed));
    }

    fn render_waiters(&self, out: &mut String) {
        if !self.serves_waiters.load(Ordering::Relaxed) {
            return;
        }
        let singles = [
            (
                "idem_waiters",
                "Requests waiting now for the original attempt of their key (Prefer: wait).",
                self.waiting(),
            ),
            (
                "idem_waiters_max",
                "The bound on waiters in all (waiters_max); past it a request is answered at once.",
                self.waiters_max.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in singles {
            gauge_family(out, name, help);
            let _ = writeln!(out, "{name} {value}");
        }
    }
}

/// How one per-group gauge is read from its group.
type GroupValue = fn(&AmbiguousGroup) -> f64;

fn gauge_family(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
}

/// A label value as the text format requires: `\`, `"` and newlines
/// escaped (a subscription's name is the config's text).
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn a_failed_sample_keeps_the_last_values_and_says_so() {
        let gauges = Gauges::default();
        gauges.sampled(GaugeSample {
            groups: vec![AmbiguousGroup {
                label: None,
                records: 3,
                oldest_age_s: 42.5,
                lookups_failing: 1,
            }],
            truncated: false,
            window_open: true,
            window_remaining_s: 9.0,
            taken_at_s: 1_700_000_000.0,
        });
        gauges.sample_failed();
        let mut text = String::new();
        gauges.render(&mut text);
        let expect = [
            ("idem_ambiguous_records", 3.0),
            ("idem_ambiguous_oldest_age_seconds", 42.5),
            ("idem_ambiguous_lookups_failing", 1.0),
            ("idem_suspect_window_open", 1.0),
            ("idem_suspect_window_remaining_seconds", 9.0),
            ("idem_gauge_sample_failed", 1.0),
            ("idem_gauge_sample_failures_total", 1.0),
            ("idem_gauge_last_sample_timestamp_seconds", 1_700_000_000.0),
        ];
        for (series, want) in expect {
            assert_eq!(value(&text, series), Some(want), "{series}\n{text}");
        }
        gauges.sampled(GaugeSample::default());
        let mut text = String::new();
        gauges.render(&mut text);
        assert_eq!(value(&text, "idem_gauge_sample_failed"), Some(0.0));
        assert_eq!(value(&text, "idem_ambiguous_records"), Some(0.0));
    }

    #[test]
    fn groups_are_labelled_by_subscription_with_escapes() {
        let gauges = Gauges::default();
        let group = |label: &str, records| AmbiguousGroup {
            label: Some(label.into()),
            records,
            ..AmbiguousGroup::default()
        };
        gauges.sampled(GaugeSample {
            groups: vec![group("payouts", 2), group("a\"b\\c", 0)],
            ..GaugeSample::default()
        });
        let mut text = String::new();
        gauges.render(&mut text);
        let payouts = "idem_ambiguous_records{subscription=\"payouts\"}";
        let odd = "idem_ambiguous_records{subscription=\"a\\\"b\\\\c\"}";
        assert_eq!(value(&text, payouts), Some(2.0), "{text}");
        assert_eq!(value(&text, odd), Some(0.0), "{text}");
        assert!(!text.contains("idem_waiters"), "{text}");
    }

    #[test]
    fn waiters_count_in_and_out_and_never_below_zero() {
        let gauges = Gauges::default();
        gauges.set_waiters_max(8);
        gauges.waiter_in();
        gauges.waiter_in();
        gauges.waiter_out();
        let mut text = String::new();
        gauges.render(&mut text);
        assert_eq!(value(&text, "idem_waiters"), Some(1.0));
        assert_eq!(value(&text, "idem_waiters_max"), Some(8.0));
        gauges.waiter_out();
        gauges.waiter_out();
        assert_eq!(gauges.waiting(), 0);
    }
}

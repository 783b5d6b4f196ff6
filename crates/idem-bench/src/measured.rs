//! What a phase measured and how it is reported, shared by the subcommands:
//! good operations, errors and latencies; the time-bounded loop of
//! concurrent callers; a phase's row; the baseline as the mean of two runs;
//! and each phase's ratio against it with its target verdict.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context;

/// How a target is reported.
pub fn verdict(met: bool) -> &'static str {
    if met { "MET" } else { "MISSED" }
}

/// Clock ticks per second in `/proc/PID/stat` (`USER_HZ`, 100 on Linux).
const USER_HZ: f64 = 100.0;

/// User + system CPU time a process has used so far, from
/// `/proc/PID/stat` (Linux; `pid` may be `self`); `None` where that
/// cannot be read.
pub fn process_cpu(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = cpu_ticks(&stat)?;
    Some(Duration::from_secs_f64(ticks as f64 / USER_HZ))
}

/// User + system CPU time, in clock ticks, from the text of
/// `/proc/PID/stat`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    // The fields after the command name, which is in parentheses and may
    // hold spaces and parentheses: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// What one phase measured.
#[derive(Debug, Default)]
pub struct Measured {
    /// Operations that succeeded as expected.
    pub ok: u64,
    /// Operations that failed or were answered otherwise.
    pub errors: u64,
    /// The first error, for the report.
    pub first_error: Option<String>,
    /// From the first operation to the last caller's end.
    pub elapsed: Duration,
    /// Latencies of the good operations in microseconds, sorted by
    /// [`Measured::finish`].
    latencies_us: Vec<u32>,
}

impl Measured {
    /// Good operations per second.
    pub fn per_s(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// The `q` quantile (0..=1) of the latencies, in microseconds, by
    /// nearest rank; 0 when nothing was measured.
    pub fn percentile_us(&self, q: f64) -> u32 {
        percentile(&self.latencies_us, q)
    }

    /// Counts a good operation that started at `started`.
    pub fn ok_since(&mut self, started: Instant) {
        self.ok += 1;
        let us = started.elapsed().as_micros();
        self.latencies_us
            .push(u32::try_from(us).unwrap_or(u32::MAX));
    }

    /// Counts a failed operation; the first one is kept for the report.
    pub fn error(&mut self, e: anyhow::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{e:#}"));
        }
    }

    /// Adds what another caller of the same phase measured.
    pub fn merge(&mut self, other: Measured) {
        self.ok += other.ok;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latencies_us.extend(other.latencies_us);
    }

    /// Ends the phase: its duration, and the latencies sorted for
    /// [`Measured::percentile_us`].
    pub fn finish(&mut self, elapsed: Duration) {
        self.elapsed = elapsed;
        self.latencies_us.sort_unstable();
    }

    /// The phase's row under [`header`]: name, rate, p50, p99, ok, errors.
    pub fn row(&self, name: &str) -> String {
        format!(
            "  {name:<24} {:>9.0} {:>8} {:>8} {:>9} {:>7}",
            self.per_s(),
            self.percentile_us(0.50),
            self.percentile_us(0.99),
            self.ok,
            self.errors,
        )
    }

    /// `name: N of M operations FAILED; first: …`, or `None` without errors.
    pub fn failure(&self, name: &str) -> Option<String> {
        (self.errors > 0).then(|| {
            format!(
                "{name}: {} of {} operations FAILED; first: {}",
                self.errors,
                self.ok + self.errors,
                self.first_error.as_deref().unwrap_or("?")
            )
        })
    }
}

/// The header of the rows [`Measured::row`] prints, `rate` naming the
/// rate's unit (`req/s`, `claims/s`).
pub fn header(rate: &str) -> String {
    format!(
        "  {:<24} {rate:>9} {:>8} {:>8} {:>9} {:>7}",
        "phase", "p50 µs", "p99 µs", "ok", "errors"
    )
}

/// The nearest-rank `q` quantile of sorted `values`; 0 when there are none.
fn percentile(sorted: &[u32], q: f64) -> u32 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return 0;
    };
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.saturating_sub(1).min(last)]
}

/// Runs one task per operation in `callers` until `deadline`, each calling
/// its operation with 0, 1, 2, … and timing every call; a caller stops at
/// its first error or at a call that takes longer than `timeout`, so the
/// phase ends by `deadline + timeout`. Must run inside a tokio runtime.
pub async fn run_callers<F, Fut>(
    callers: Vec<F>,
    deadline: Instant,
    timeout: Duration,
) -> anyhow::Result<Measured>
where
    F: FnMut(u64) -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for op in callers {
        tasks.spawn(repeat(op, deadline, timeout));
    }
    let mut total = Measured::default();
    while let Some(joined) = tasks.join_next().await {
        total.merge(joined.context("a caller panicked")?);
    }
    total.finish(start.elapsed());
    Ok(total)
}

/// One caller's loop: `op(n)` for n = 0, 1, … until `deadline`.
async fn repeat<F, Fut>(mut op: F, deadline: Instant, timeout: Duration) -> Measured
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut out = Measured::default();
    let mut n = 0;
    while Instant::now() < deadline {
        let started = Instant::now();
        match tokio::time::timeout(timeout, op(n)).await {
            Ok(Ok(())) => out.ok_since(started),
            Ok(Err(e)) => {
                out.error(e);
                break;
            }
            Err(_) => {
                out.error(anyhow::anyhow!(
                    "operation {n}: no answer within {} s",
                    timeout.as_secs()
                ));
                break;
            }
        }
        n += 1;
    }
    out
}

/// The baseline: the mean of two runs of the same phase, one before and
/// one after the phases compared with it, so that drift shows and averages
/// out.
pub struct Baseline {
    per_s: f64,
    p50_us: f64,
    p99_us: f64,
    /// What the ratios are "x" of (`direct`, `baseline`).
    against: &'static str,
}

impl Baseline {
    /// The mean of `first` and `second`, printed with the drift between them.
    pub fn print_mean(
        against: &'static str,
        rate: &str,
        (first_name, first): (&str, &Measured),
        (second_name, second): (&str, &Measured),
    ) -> Baseline {
        let mean = |f: &dyn Fn(&Measured) -> f64| (f(first) + f(second)) / 2.0;
        let baseline = Baseline {
            per_s: mean(&|m| m.per_s()),
            p50_us: mean(&|m| f64::from(m.percentile_us(0.50))),
            p99_us: mean(&|m| f64::from(m.percentile_us(0.99))),
            against,
        };
        let drift = (second.per_s() - first.per_s()) / baseline.per_s.max(f64::MIN_POSITIVE);
        println!(
            "  baseline = mean of {first_name} and {second_name}: {:.0} {rate}, p50 {:.0} µs, \
             p99 {:.0} µs ({second_name} vs {first_name}: {:+.1}% {rate})",
            baseline.per_s,
            baseline.p50_us,
            baseline.p99_us,
            drift * 100.0
        );
        baseline
    }

    /// `measured`'s rate as a share of the baseline's.
    pub fn ratio(&self, measured: &Measured) -> f64 {
        measured.per_s() / self.per_s.max(f64::MIN_POSITIVE)
    }

    /// Prints `measured`'s ratio, its verdict against `target` (a share of
    /// the baseline; `None`: reported only) and the latency it adds.
    pub fn print_ratio(&self, name: &str, measured: &Measured, target: Option<f64>) {
        let ratio = self.ratio(measured);
        let verdict = match target {
            Some(target) => format!("target >= {target}x: {:<6}", verdict(ratio >= target)),
            None => format!("{:<20}", "(no target)"),
        };
        println!(
            "  {name:<22} {ratio:>6.3}x {}  {verdict}  added latency: p50 {:+.0} µs, p99 {:+.0} µs",
            self.against,
            f64::from(measured.percentile_us(0.50)) - self.p50_us,
            f64::from(measured.percentile_us(0.99)) - self.p99_us,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_by_nearest_rank() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&v, 1.0), 100);
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[tokio::test]
    async fn callers_stop_at_the_deadline_and_at_their_first_error() {
        let deadline = || Instant::now() + Duration::from_millis(50);
        let good = |_| async { anyhow::Ok(()) };
        let bad = |n| async move {
            if n < 3 {
                Ok(())
            } else {
                anyhow::bail!("boom {n}")
            }
        };
        let measured = run_callers(vec![good], deadline(), Duration::from_secs(1))
            .await
            .unwrap();
        assert!(measured.ok > 0 && measured.errors == 0);
        assert!(measured.failure("x").is_none());
        let measured = run_callers(vec![bad], deadline(), Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!((measured.ok, measured.errors), (3, 1));
        assert_eq!(measured.first_error.as_deref(), Some("boom 3"));
        assert!(measured.failure("x").unwrap().contains("1 of 4"));
    }

    #[test]
    fn cpu_time_is_read_after_the_command_name_whatever_it_holds() {
        let cases = [
            (
                "42 (idem) S 1 42 42 0 -1 4194560 100 0 0 0 250 37 0 0 20 0 3",
                Some(287),
            ),
            ("7 (a b) c)) R 1 7 7 0 -1 0 0 0 0 0 5 6 0 0", Some(11)),
            ("7 (idem) S 1 7", None),
            ("", None),
        ];
        for (stat, expect) in cases {
            assert_eq!(cpu_ticks(stat), expect, "{stat}");
        }
    }
}

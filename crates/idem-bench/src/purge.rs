//! The retention purge under load: a durable SQLite store holding
//! `--records` completed records past retention (one million by default),
//! claims continuing from concurrent callers, and the purge the gateway
//! runs (`purge(PURGE_BATCH)` calls, or `--batch`, until one changes
//! fewer) working through all of them. Claim latency is measured without the purge, during it, and
//! without it again; the ratio of the p99 during the purge to the p99
//! without it (the mean of the two phases around it) is printed against
//! the target. It reports; it never asserts.
//!
//! The expired records are copies of one record the store wrote itself
//! (claimed and completed at a clock set back past retention), made by one
//! SQL statement, so filling a million takes seconds and every copy is a
//! row the store reads as its own.
//!
//! Usage: `cargo run --release -p idem-bench -- purge [--records 1000000]
//! [--batch N] [--callers 32] [--seconds 5] [--dir DIR]`

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use idem_core::{Clock, ManualClock, Policy, PurgeReport, Scope, Store, SystemClock};
use idem_sqlite::{SqliteOptions, SqliteStore};

use idem_gateway::PURGE_BATCH;

use crate::args::Flags;
use crate::fixtures;
use crate::measured::verdict;

/// The p99 during the purge may be at most this many times the p99
/// without it.
const TARGET_P99_RATIO: f64 = 2.0;
/// The key of the record the expired copies are made from.
const TEMPLATE_KEY: &str = "expired-template";

struct Args {
    records: u64,
    batch: usize,
    callers: usize,
    seconds: u64,
    dir: PathBuf,
}

/// Claim latencies of one phase.
struct Phase {
    name: &'static str,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Phase {
    fn quantile(&self, q: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
        self.latencies.get(i).copied().unwrap_or_default()
    }

    fn claims_per_s(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn print(&self) {
        println!(
            "  {:<28} {:>8.0} claims/s  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>8.2} ms",
            self.name,
            self.claims_per_s(),
            ms(self.quantile(0.50)),
            ms(self.quantile(0.99)),
            ms(self.latencies.last().copied().unwrap_or_default())
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs `idem-bench purge` with the flags that follow the subcommand.
pub fn main(args: impl Iterator<Item = String>) -> anyhow::Result<()> {
    let args = parse_args(args)?;
    let dir = args
        .dir
        .join(format!("idem-bench-purge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let outcome = bench(&args, &dir.join("purge.db"));
    let cleanup = std::fs::remove_dir_all(&dir);
    outcome?;
    cleanup.with_context(|| format!("removing {}", dir.display()))
}

fn bench(args: &Args, path: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "idem-bench purge: {} completed records past retention, {} callers claiming and \
         completing fresh keys, {} s per phase without the purge, WAL + synchronous=FULL",
        args.records, args.callers, args.seconds
    );
    let now = SystemClock.now();
    let clock = ManualClock::new(now);
    let store = Arc::new(SqliteStore::open_with_clock(
        path,
        SqliteOptions::default(),
        Arc::new(clock.clone()),
    )?);
    let filled = Instant::now();
    runtime.block_on(template(&store, &clock))?;
    copy_template(path, args.records)?;
    clock.set(now);
    println!(
        "  filled in {:.1} s ({} records)",
        filled.elapsed().as_secs_f64(),
        args.records + 1
    );

    let seconds = Duration::from_secs(args.seconds);
    let callers = args.callers;
    let before = runtime.block_on(claims(
        &store,
        callers,
        ("without purge (before)", "before"),
        seconds,
    ))?;
    let (during, report, purge_took) =
        runtime.block_on(claims_during_purge(&store, callers, args.batch))?;
    let after = runtime.block_on(claims(
        &store,
        callers,
        ("without purge (after)", "after"),
        seconds,
    ))?;
    for phase in [&before, &during, &after] {
        phase.print();
    }
    println!(
        "  purge: {} tombstoned, {} deleted, {} damaged in {:.1} s ({:.0} records/s)",
        report.tombstoned,
        report.deleted,
        report.damaged,
        purge_took.as_secs_f64(),
        (report.tombstoned + report.deleted) as f64 / purge_took.as_secs_f64().max(1e-9)
    );
    let baseline = (ms(before.quantile(0.99)) + ms(after.quantile(0.99))) / 2.0;
    let ratio = ms(during.quantile(0.99)) / baseline.max(f64::MIN_POSITIVE);
    println!(
        "  target: claim p99 during the purge <= {TARGET_P99_RATIO:.0}x without it: {} \
         ({ratio:.2}x: {:.2} ms against {baseline:.2} ms)",
        verdict(ratio <= TARGET_P99_RATIO),
        ms(during.quantile(0.99))
    );
    if report.tombstoned + report.deleted < args.records {
        bail!(
            "the purge changed {} records of {}",
            report.tombstoned + report.deleted,
            args.records
        );
    }
    Ok(())
}

/// One record claimed and completed at a clock set back past its
/// retention, so that at the real now it is a completed record to purge.
async fn template(store: &SqliteStore, clock: &ManualClock) -> anyhow::Result<()> {
    let policy = Policy::default();
    let back_ms = (policy.retention_s() + 3_600) * 1000;
    let now = clock.now();
    clock.set(idem_core::Timestamp::from_millis(
        now.as_millis().saturating_sub(back_ms),
    ));
    let scope = Scope::new(fixtures::SCOPE)?;
    let req = fixtures::request(&scope, TEMPLATE_KEY, 1)?;
    let token = fixtures::acquire(store, &req).await?;
    store
        .complete(&req.id, token, fixtures::payout_result()?)
        .await?;
    Ok(())
}

/// `records` copies of the template under keys of their own, in one
/// statement over a connection of this process's own.
fn copy_template(path: &Path, records: u64) -> anyhow::Result<()> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(30))?;
    let mut columns = Vec::new();
    {
        let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('records')")?;
        let names = stmt.query_map([], |row| row.get::<_, String>(0))?;
        for name in names {
            let name = name?;
            if name != "scope" && name != "key" {
                columns.push(name);
            }
        }
    }
    let others = columns.join(", ");
    let from_template = columns
        .iter()
        .map(|c| format!("t.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {records}) \
         INSERT INTO records (scope, key, {others}) \
         SELECT t.scope, 'expired-' || n.i, {from_template} FROM records t, n \
         WHERE t.key = '{TEMPLATE_KEY}'"
    );
    let copied = conn.execute(&sql, [])?;
    if copied as u64 != records {
        bail!("copied {copied} records, wanted {records}");
    }
    Ok(())
}

/// `callers` tasks claim and complete fresh keys until `stop` turns true;
/// each claim's latency is recorded.
async fn claim_until(
    store: Arc<SqliteStore>,
    callers: usize,
    stop: Arc<AtomicBool>,
    prefix: &'static str,
) -> anyhow::Result<Vec<Duration>> {
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
        tasks.spawn(async move {
            let scope = Scope::new(fixtures::SCOPE)?;
            let result = fixtures::payout_result()?;
            let mut latencies = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let key = format!("{prefix}-c{caller}-{}", latencies.len());
                let req = fixtures::request(&scope, &key, 2)?;
                let started = Instant::now();
                let token = fixtures::acquire(&*store, &req).await?;
                latencies.push(started.elapsed());
                store.complete(&req.id, token, result.clone()).await?;
            }
            anyhow::Ok(latencies)
        });
    }
    let mut all = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        all.extend(joined??);
    }
    all.sort_unstable();
    Ok(all)
}

/// Claims from `callers` tasks (keys starting `prefix`) while `work` runs,
/// then stops them: the claims as phase `name`, and what `work` returned.
async fn claims_while<T>(
    store: &Arc<SqliteStore>,
    callers: usize,
    (name, prefix): (&'static str, &'static str),
    work: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(Phase, T)> {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let claiming = tokio::spawn(claim_until(
        Arc::clone(store),
        callers,
        Arc::clone(&stop),
        prefix,
    ));
    let out = work.await;
    stop.store(true, Ordering::Relaxed);
    let latencies = claiming.await??;
    let phase = Phase {
        name,
        latencies,
        elapsed: started.elapsed(),
    };
    Ok((phase, out?))
}

/// Claims for `seconds`, without the purge.
async fn claims(
    store: &Arc<SqliteStore>,
    callers: usize,
    names: (&'static str, &'static str),
    seconds: Duration,
) -> anyhow::Result<Phase> {
    let wait = async {
        tokio::time::sleep(seconds).await;
        Ok(())
    };
    Ok(claims_while(store, callers, names, wait).await?.0)
}

/// Claims while the purge runs as the gateway's purge task does, until it
/// has nothing left: the claims, what it did, and how long it took.
async fn claims_during_purge(
    store: &Arc<SqliteStore>,
    callers: usize,
    batch: usize,
) -> anyhow::Result<(Phase, PurgeReport, Duration)> {
    let purge = async {
        let started = Instant::now();
        let mut total = PurgeReport::default();
        loop {
            let report = store.purge(batch).await?;
            total.tombstoned += report.tombstoned;
            total.deleted += report.deleted;
            total.damaged += report.damaged;
            if report.tombstoned + report.deleted < batch as u64 {
                break;
            }
        }
        anyhow::Ok((total, started.elapsed()))
    };
    let names = ("during the purge", "during");
    let (phase, (total, took)) = claims_while(store, callers, names, purge).await?;
    Ok((phase, total, took))
}

fn parse_args(args: impl Iterator<Item = String>) -> anyhow::Result<Args> {
    const USAGE: &str =
        "usage: idem-bench purge [--records N] [--batch N] [--callers N] [--seconds S] [--dir DIR]";
    let flags = Flags::parse(
        args,
        &["--records", "--batch", "--callers", "--seconds", "--dir"],
        USAGE,
    )?;
    Ok(Args {
        records: flags.number("--records", 1_000_000, 1..=100_000_000)?,
        batch: flags.number("--batch", PURGE_BATCH, 1..=idem_core::LIST_LIMIT_MAX)?,
        callers: flags.number("--callers", 32, 1..=10_000)?,
        seconds: flags.number("--seconds", 5, 1..=3_600)?,
        dir: flags.path("--dir", std::env::temp_dir()),
    })
}

//! The group-commit benchmark: concurrent callers claim and complete fresh
//! keys on a durable SQLite store (WAL, `synchronous=FULL`, a real file),
//! first with group commit and then with one transaction per operation, in
//! the same run, and the ratio is printed against the targets. Before both,
//! the baseline: the same two writes per key on a plain SQLite connection,
//! batched the same way (`plain_sqlite`). It reports; it never asserts.
//!
//! Usage: `cargo run --release -p idem-bench -- sqlite [--callers 64]
//! [--seconds 5] [--dir DIR]`

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use idem_core::{Scope, Store};
use idem_sqlite::{SqliteOptions, SqliteStore, WriterStats};

use crate::args::Flags;
use crate::fixtures;
use crate::measured::{self, Measured, verdict};
use crate::plain_sqlite;

/// Pairs per second the group-commit mode should reach.
const TARGET_PAIRS_PER_S: f64 = 35_000.0;
/// How many times faster than one transaction per operation it should be.
const TARGET_RATIO: f64 = 5.0;

/// What to run, from the command line.
struct Args {
    callers: usize,
    seconds: u64,
    dir: PathBuf,
}

/// What one mode measured.
struct Run {
    /// Each pair's claim-to-completed latency.
    pairs: Measured,
    stats: WriterStats,
}

impl Run {
    fn pairs_per_s(&self) -> f64 {
        self.pairs.per_s()
    }

    fn ops_per_batch(&self) -> f64 {
        self.stats.ops as f64 / self.stats.batches.max(1) as f64
    }
}

/// Runs `idem-bench sqlite` with the flags that follow the subcommand.
pub fn main(args: impl Iterator<Item = String>) -> anyhow::Result<()> {
    let args = parse_args(args)?;
    let dir = args.dir.join(format!("idem-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let outcome = bench(&args, &dir);
    // Remove the files even when the run failed; report the first error.
    let cleanup = std::fs::remove_dir_all(&dir);
    outcome?;
    cleanup.with_context(|| format!("removing {}", dir.display()))
}

fn bench(args: &Args, dir: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "idem-bench sqlite: {} callers, claim + complete on fresh keys, {} s per mode, \
         WAL + synchronous=FULL, files in {}",
        args.callers,
        args.seconds,
        dir.display()
    );
    let plain = baseline(&runtime, args, dir)?;
    let modes = [
        (
            "group commit (batch_max 256)",
            "group.db",
            SqliteOptions::default(),
        ),
        (
            "one transaction per op (batch_max 1)",
            "single.db",
            SqliteOptions {
                batch_max: 1,
                ..SqliteOptions::default()
            },
        ),
    ];
    let mut runs = Vec::new();
    for (name, file, options) in modes {
        runs.push(mode(&runtime, args, name, &dir.join(file), options)?);
    }
    targets(&runs[0], &runs[1], &plain);
    Ok(())
}

/// The baseline, run first: the same two durable writes per key on a
/// plain SQLite connection, batched the same way, without idem's checks.
fn baseline(
    runtime: &tokio::runtime::Runtime,
    args: &Args,
    dir: &Path,
) -> anyhow::Result<plain_sqlite::Plain> {
    let cpu_before = measured::process_cpu("self");
    let plain = runtime.block_on(plain_sqlite::run(
        &dir.join("plain.db"),
        args.callers,
        args.seconds,
    ))?;
    let p = &plain.pairs;
    println!(
        "  {:<38} {:>9.0} pairs/s  ({} pairs in {:.2} s, {} batches, {:.1} ops/batch, {} CPU per pair)",
        "plain SQLite, same writes (baseline)",
        p.per_s(),
        p.ok,
        p.elapsed.as_secs_f64(),
        plain.batches,
        plain.ops as f64 / plain.batches.max(1) as f64,
        cpu_per_pair(cpu_before, p.ok)
    );
    println!(
        "  {:<38} pair p50 {} µs, p99 {} µs, p99.9 {} µs, max {} µs; SQLite's own \
         checkpoints, in the commit",
        "",
        p.percentile_us(0.50),
        p.percentile_us(0.99),
        p.percentile_us(0.999),
        p.percentile_us(1.0),
    );
    Ok(plain)
}

/// One mode of the store on a fresh `file`, measured and printed.
fn mode(
    runtime: &tokio::runtime::Runtime,
    args: &Args,
    name: &str,
    file: &Path,
    options: SqliteOptions,
) -> anyhow::Result<Run> {
    let store = SqliteStore::open(file, options)?;
    let cpu_before = measured::process_cpu("self");
    let run = runtime.block_on(run(Arc::new(store), args.callers, args.seconds))?;
    let p = &run.pairs;
    println!(
        "  {name:<38} {:>9.0} pairs/s  ({} pairs in {:.2} s, {} batches, {:.1} ops/batch, {} CPU per pair)",
        run.pairs_per_s(),
        p.ok,
        p.elapsed.as_secs_f64(),
        run.stats.batches,
        run.ops_per_batch(),
        cpu_per_pair(cpu_before, p.ok)
    );
    // A pair's tail is the store's own, without HTTP: a stall in the
    // writer (a checkpoint in a commit, a slow fsync) shows here.
    println!(
        "  {:<38} pair p50 {} µs, p99 {} µs, p99.9 {} µs, max {} µs; checkpoints {} \
         off the commit path, {} catch-ups, {} inline",
        "",
        p.percentile_us(0.50),
        p.percentile_us(0.99),
        p.percentile_us(0.999),
        p.percentile_us(1.0),
        run.stats.checkpoints,
        run.stats.catch_ups,
        run.stats.inline_checkpoints
    );
    Ok(run)
}

/// The ratios against the baseline and one transaction per op, and the
/// targets' verdicts.
fn targets(group: &Run, single: &Run, plain: &plain_sqlite::Plain) {
    let ratio = group.pairs_per_s() / single.pairs_per_s().max(f64::MIN_POSITIVE);
    println!("  ratio group / single: {ratio:.1}x");
    println!(
        "  ratio group / plain SQLite: {:.2}x",
        group.pairs_per_s() / plain.pairs.per_s().max(f64::MIN_POSITIVE)
    );
    println!(
        "  target >= {TARGET_PAIRS_PER_S:.0} pairs/s with group commit: {} ({:.0})",
        verdict(group.pairs_per_s() >= TARGET_PAIRS_PER_S),
        group.pairs_per_s()
    );
    println!(
        "  target >= {TARGET_RATIO:.0}x one transaction per op: {} ({ratio:.1}x)",
        verdict(ratio >= TARGET_RATIO)
    );
}

/// The process's CPU time (every thread: callers, writer, checkpointer)
/// since `before`, per pair, in µs; `-` where `/proc` cannot be read.
fn cpu_per_pair(before: Option<Duration>, pairs: u64) -> String {
    match (before, measured::process_cpu("self")) {
        (Some(before), Some(after)) if pairs > 0 => format!(
            "{:.1} µs",
            after.saturating_sub(before).as_secs_f64() * 1e6 / pairs as f64
        ),
        _ => "-".to_owned(),
    }
}

/// `callers` tasks claim and complete fresh keys until `seconds` pass.
async fn run(store: Arc<SqliteStore>, callers: usize, seconds: u64) -> anyhow::Result<Run> {
    let before = store.stats();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        tasks.spawn(caller_loop(Arc::clone(&store), caller, deadline));
    }
    let mut pairs = Measured::default();
    while let Some(joined) = tasks.join_next().await {
        pairs.merge(joined??);
    }
    pairs.finish(start.elapsed());
    let after = store.stats();
    Ok(Run {
        pairs,
        stats: after.since(&before),
    })
}

async fn caller_loop(
    store: Arc<SqliteStore>,
    caller: usize,
    deadline: Instant,
) -> anyhow::Result<Measured> {
    let scope = Scope::new(fixtures::SCOPE)?;
    let result = fixtures::payout_result()?;
    let mut pairs = Measured::default();
    while Instant::now() < deadline {
        let req = fixtures::request(&scope, &format!("c{caller}-{}", pairs.ok), caller as u8)?;
        let started = Instant::now();
        let token = fixtures::acquire(&*store, &req).await?;
        store.complete(&req.id, token, result.clone()).await?;
        pairs.ok_since(started);
    }
    Ok(pairs)
}

fn parse_args(args: impl Iterator<Item = String>) -> anyhow::Result<Args> {
    const USAGE: &str = "usage: idem-bench sqlite [--callers N] [--seconds S] [--dir DIR]";
    let flags = Flags::parse(args, &["--callers", "--seconds", "--dir"], USAGE)?;
    Ok(Args {
        callers: flags.number("--callers", 64, 1..=10_000)?,
        seconds: flags.number("--seconds", 5, 1..=3_600)?,
        dir: flags.path("--dir", std::env::temp_dir()),
    })
}

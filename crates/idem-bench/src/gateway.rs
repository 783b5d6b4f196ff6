//! `idem-bench gateway`: one payout upstream driven three ways in one run —
//! directly, through the gateway with fresh keys (claim + forward + complete
//! on durable SQLite), and through the gateway with keys already completed
//! (claim + replay, the upstream untouched) — with each gateway phase
//! reported as a ratio of the direct baseline measured in the same run.
//! It reports; it never asserts. Answers that are not the expected ones
//! (or upstream hits that do not add up) fail the run with exit status 1.
//!
//! Usage: `cargo run --release -p idem-bench -- gateway [--connections 32]
//! [--seconds 5] [--keys 4096] [--dir DIR]`

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use idem_core::Store;
use idem_gateway::{FileConfig, GatewayConfig, Overrides};
use idem_sqlite::{SqliteOptions, SqliteStore, WriterStats};
use tokio::runtime::Runtime;

use crate::args::Flags;
use crate::load::{self, Expect, Keys};
use crate::measured::{self, Baseline, Measured};
use crate::server::Server;
use crate::upstream::Upstream;

const USAGE: &str =
    "usage: idem-bench gateway [--connections N] [--seconds S] [--keys N] [--dir DIR]";
/// Fresh-key throughput through the gateway, as a share of direct.
const TARGET_FRESH: f64 = 0.5;
/// Replay throughput through the gateway, as a share of direct.
const TARGET_REPLAY: f64 = 0.8;
/// Worker threads of the gateway's runtime.
const GATEWAY_WORKERS: usize = 2;
/// Worker threads of the upstream's runtime.
const UPSTREAM_WORKERS: usize = 1;
/// The most time populating the replay keys may take.
const POPULATE_TIMEOUT: Duration = Duration::from_secs(120);

/// What to run, from the command line.
struct Options {
    connections: usize,
    seconds: u64,
    keys: usize,
    dir: PathBuf,
}

/// One measured phase, as reported.
struct Row {
    name: &'static str,
    measured: Measured,
    upstream_hits: u64,
    /// Group commit in the store during the phase; `None` for direct phases.
    writer: Option<WriterStats>,
}

/// The running pieces and the runtime the load generator uses.
struct Bench<'a> {
    options: &'a Options,
    client: Runtime,
    upstream: &'a Upstream,
    gateway: SocketAddr,
    store: &'a SqliteStore,
    /// Checks that failed; any makes the run fail.
    failures: usize,
}

/// Runs `idem-bench gateway` with the flags that follow the subcommand.
pub fn main(args: impl Iterator<Item = String>) -> anyhow::Result<()> {
    let flags = Flags::parse(
        args,
        &["--connections", "--seconds", "--keys", "--dir"],
        USAGE,
    )?;
    let options = Options {
        connections: flags.number("--connections", 32, 1..=1_024)?,
        seconds: flags.number("--seconds", 5, 1..=600)?,
        keys: flags.number("--keys", 4_096, 1..=1_000_000)?,
        dir: flags.path("--dir", std::env::temp_dir()),
    };
    let dir = tempfile::Builder::new()
        .prefix("idem-bench-gateway-")
        .tempdir_in(&options.dir)
        .with_context(|| format!("creating a directory in {}", options.dir.display()))?;
    let outcome = bench(&options, dir.path());
    // Remove the files even when the run failed; report the first error.
    let cleanup = dir.close();
    let failures = outcome?;
    cleanup.context("removing the benchmark's directory")?;
    if failures > 0 {
        bail!("{failures} check(s) failed (marked !! above): this run's numbers are not valid");
    }
    Ok(())
}

/// Starts the servers, runs the phases, stops the servers; returns how many
/// checks failed.
fn bench(options: &Options, dir: &Path) -> anyhow::Result<usize> {
    let db = dir.join("gateway.db");
    let upstream = Upstream::start().context("starting the upstream")?;
    let store = Arc::new(
        SqliteStore::open(&db, SqliteOptions::default())
            .with_context(|| format!("opening {}", db.display()))?,
    );
    let gateway = start_gateway(upstream.addr(), Arc::clone(&store) as Arc<dyn Store>)?;
    println!(
        "idem-bench gateway: {} connections (keep-alive HTTP/1.1), {} s per phase, \
         POST {} with a {}-byte JSON body, {} CPUs",
        options.connections,
        options.seconds,
        load::PATH,
        load::payout_body(&replay_key(0)).len(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "  upstream: axum on {}, {UPSTREAM_WORKERS} worker thread; gateway: idem_gateway::serve \
         on {}, {GATEWAY_WORKERS} worker threads, SQLite (WAL, synchronous=FULL) at {}; \
         load generator: 1 thread",
        upstream.addr(),
        gateway.addr(),
        db.display()
    );
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the load generator's runtime")?;
    let mut bench = Bench {
        options,
        client,
        upstream: &upstream,
        gateway: gateway.addr(),
        store: &store,
        failures: 0,
    };
    let outcome = bench.run();
    let failures = bench.failures;
    drop(bench);
    // Stop both even if one fails; the gateway first, as it calls the upstream.
    let stopped_gateway = gateway.stop();
    let stopped_upstream = upstream.stop();
    outcome?;
    stopped_gateway?;
    stopped_upstream?;
    // Dropping the last handle closes the store and joins its threads.
    drop(store);
    Ok(failures)
}

/// The real gateway entry point, configured as `idem serve --listen
/// 127.0.0.1:0 --upstream URL` would be, on its own runtime.
fn start_gateway(upstream: SocketAddr, store: Arc<dyn Store>) -> anyhow::Result<Server> {
    let overrides = Overrides {
        upstream: Some(format!("http://{upstream}")),
        listen: Some("127.0.0.1:0".to_owned()),
        ..Overrides::default()
    };
    let config = GatewayConfig::from_parts(FileConfig::default(), None, &overrides)
        .context("configuring the gateway")?;
    Server::start(
        "gateway",
        GATEWAY_WORKERS,
        config.listen,
        move |listener, shutdown| async move {
            idem_gateway::serve(&config, store, listener, shutdown).await
        },
    )
}

impl Bench<'_> {
    /// Direct, fresh, (populate), replay, direct: the gateway phases sit
    /// between two baselines so that drift shows and averages out.
    fn run(&mut self) -> anyhow::Result<()> {
        let (c, n) = (self.options.connections, self.options.keys);
        let (direct, gateway) = (self.upstream.addr(), self.gateway);
        println!(
            "{} {:>10}  sqlite writer",
            measured::header("req/s"),
            "upstream"
        );
        let first = self.phase("direct #1", direct, fresh_keys("d1", c), Expect::Executed)?;
        let fresh = self.phase(
            "gateway, fresh keys",
            gateway,
            fresh_keys("f", c),
            Expect::Executed,
        )?;
        let populate = self.populate(n)?;
        let replay = self.phase(
            "gateway, replays",
            gateway,
            replay_keys(n, c),
            Expect::Replayed,
        )?;
        let second = self.phase("direct #2", direct, fresh_keys("d2", c), Expect::Executed)?;
        for row in [&first, &fresh, &populate, &second] {
            self.check_hits(row, row.measured.ok + row.measured.errors);
        }
        self.check_hits(&replay, 0);
        if populate.measured.ok != n as u64 {
            self.fail(format!(
                "populating: {} of {n} keys completed within {} s",
                populate.measured.ok,
                POPULATE_TIMEOUT.as_secs()
            ));
        }
        summarize(&first, &second, &fresh, &replay);
        Ok(())
    }

    /// Runs one phase for the configured time and prints its row.
    fn phase(
        &mut self,
        name: &'static str,
        addr: SocketAddr,
        keys: Vec<Keys>,
        expect: Expect,
    ) -> anyhow::Result<Row> {
        let seconds = Duration::from_secs(self.options.seconds);
        self.measure(name, addr, keys, expect, seconds)
    }

    /// Completes `n` replay keys through the gateway (bounded in time).
    fn populate(&mut self, n: usize) -> anyhow::Result<Row> {
        let c = self.options.connections;
        let keys = (0..c)
            .map(|w| Box::new((w..n).step_by(c).map(replay_key)) as Keys)
            .collect();
        let name = "populate replay keys";
        self.measure(name, self.gateway, keys, Expect::Executed, POPULATE_TIMEOUT)
    }

    fn measure(
        &mut self,
        name: &'static str,
        addr: SocketAddr,
        keys: Vec<Keys>,
        expect: Expect,
        limit: Duration,
    ) -> anyhow::Result<Row> {
        let via_gateway = addr == self.gateway;
        let (hits_before, writer_before) = (self.upstream.hits(), self.store.stats());
        let deadline = Instant::now() + limit;
        let measured = self
            .client
            .block_on(load::run(addr, keys, expect, deadline))?;
        let writer_after = self.store.stats();
        let row = Row {
            name,
            measured,
            upstream_hits: self.upstream.hits() - hits_before,
            writer: via_gateway.then(|| writer_after.since(&writer_before)),
        };
        print_row(&row);
        if let Some(failure) = row.measured.failure(name) {
            self.fail(failure);
        }
        Ok(row)
    }

    fn check_hits(&mut self, row: &Row, expected: u64) {
        if row.upstream_hits != expected {
            self.fail(format!(
                "{}: the upstream was hit {} times, expected {expected}",
                row.name, row.upstream_hits
            ));
        }
    }

    fn fail(&mut self, what: String) {
        println!("  !! {what}");
        self.failures += 1;
    }
}

/// The fresh, never-used keys of one phase: `PREFIX-WORKER-N`.
fn fresh_keys(prefix: &'static str, connections: usize) -> Vec<Keys> {
    (0..connections)
        .map(|w| Box::new((0u64..).map(move |n| format!("{prefix}-{w}-{n}"))) as Keys)
        .collect()
}

/// Worker `w` walks all `n` populated keys from its own starting point.
fn replay_keys(n: usize, connections: usize) -> Vec<Keys> {
    (0..connections)
        .map(|w| {
            let start = w * n / connections;
            Box::new((0..).map(move |i| replay_key((start + i) % n))) as Keys
        })
        .collect()
}

fn replay_key(i: usize) -> String {
    format!("replay-{i}")
}

fn print_row(row: &Row) {
    let writer = row.writer.map_or(String::new(), |w| {
        format!(
            "{} batches, {:.1} ops/batch",
            w.batches,
            w.ops as f64 / w.batches.max(1) as f64
        )
    });
    println!(
        "{} {:>10}  {writer}",
        row.measured.row(row.name),
        row.upstream_hits
    );
}

/// The baseline (mean of the two direct runs), the ratios against the
/// targets, and the latency the gateway adds.
fn summarize(first: &Row, second: &Row, fresh: &Row, replay: &Row) {
    let baseline = Baseline::print_mean(
        "direct",
        "req/s",
        (first.name, &first.measured),
        (second.name, &second.measured),
    );
    for (row, target) in [(fresh, TARGET_FRESH), (replay, TARGET_REPLAY)] {
        baseline.print_ratio(row.name, &row.measured, Some(target));
    }
}

//! `idem-bench consume`: messages per second through `idem consume` (the
//! release binary, a process of its own started with a config file)
//! against a bare consumer (`idem-bench bare-consume`, a process of its own
//! that reads the same kind of queue through the same broker adapter,
//! POSTs each message to the same service and acks it, with no store and
//! no key), measured as a user would: a fresh queue is filled with N
//! messages of distinct intents, the consumer is started, and the clock
//! stops when the service has answered N requests and the queue is empty.
//! Bare, idem, bare, idem: the ratio per round and overall.
//!
//! It reports; it never asserts. It fails (exit status 1) when the
//! benchmark itself failed: a consumer that exits early or does not drain
//! the queue in time, or a run whose counts do not add up (a message
//! delivered twice or not at all, one left in a queue).
//!
//! Usage: `cargo build --release -p idem && cargo run --release -p
//! idem-bench -- consume [--messages 20000] [--concurrency 8]
//! [--broker rabbitmq|nats|sqs] [--store postgres://…] [--idem PATH] [--dir DIR]`

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use idem_postgres::redact_url;

use crate::args::Flags;
use crate::measured::{self, verdict};
use crate::postgres::{TempSchemas, loopback_config};
use crate::queue::{self, Admin, Broker};
use crate::upstream::Upstream;

const USAGE: &str = "usage: idem-bench consume [--messages N] [--concurrency N] \
     [--broker rabbitmq|nats|sqs] [--store postgres://USER@HOST/DB] [--idem PATH] [--dir DIR]";
/// idem's messages per second, as a share of the bare consumer's.
const TARGET: f64 = 0.5;
/// The subscription's name in idem's config: the records' scope.
const SUBSCRIPTION: &str = "payouts";
/// The key template: the payout's intent, as docs/consumers.md advises.
const KEY: &str = "payout:{/seller_id}:{/settlement_id}";
/// The longest one run may take, from the consumer's start to a drained
/// queue.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a consumer may take to settle what it holds and exit.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long cleaning up waits for a broker that does not answer.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the service's count and the queue are looked at.
const POLL: Duration = Duration::from_millis(5);
/// How much of a failed consumer's log a report quotes.
const LOG_TAIL_BYTES: usize = 2_000;

/// What to run, from the command line.
struct Options {
    messages: usize,
    concurrency: usize,
    prefetch: u16,
    broker: Broker,
    store: StoreChoice,
    idem: PathBuf,
    dir: PathBuf,
}

/// Where `idem consume` keeps its records.
enum StoreChoice {
    /// A fresh SQLite file per run, in the benchmark's directory.
    Sqlite,
    /// A fresh schema per run in this PostgreSQL database.
    Postgres(String),
}

/// The two consumers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Bare,
    Idem,
}

/// What one run measured.
struct Run {
    side: Side,
    round: usize,
    /// From the consumer's start to a drained queue.
    elapsed: Duration,
    /// From the consumer's start to the service's first request.
    startup: Option<Duration>,
    /// CPU time the consumer process used (user + system), when readable.
    cpu: Option<Duration>,
    /// Requests the service received during the run.
    delivered: u64,
}

/// The running pieces shared by the runs.
struct Bench<'a> {
    options: &'a Options,
    dir: &'a Path,
    upstream: &'a Upstream,
    admin: Admin,
    /// Queues declared and not yet deleted (deleted at the end if a run
    /// failed).
    queues: &'a mut Vec<String>,
    /// Schemas made for `--store postgres://…`.
    schemas: Option<&'a mut TempSchemas>,
    /// Checks that failed; any makes the run fail.
    failures: usize,
}

/// A consumer process, killed if it is still running when dropped.
struct Consumer {
    name: String,
    child: Child,
    log: PathBuf,
}

/// Runs `idem-bench consume` with the flags that follow the subcommand.
pub fn main(args: impl Iterator<Item = String>) -> anyhow::Result<()> {
    let options = options(args)?;
    let dir = tempfile::Builder::new()
        .prefix("idem-bench-consume-")
        .tempdir_in(&options.dir)
        .with_context(|| format!("creating a directory in {}", options.dir.display()))?;
    let mut schemas = match &options.store {
        StoreChoice::Postgres(url) => Some(TempSchemas::new(
            loopback_config(url, "--store", USAGE)?,
            url,
        )),
        StoreChoice::Sqlite => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let upstream = Upstream::start().context("starting the service")?;
    let mut queues = Vec::new();
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = bench(&options, dir.path(), &upstream, &mut queues, schemas.as_mut()) => outcome,
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        }
    });
    // Clean up whatever happened; report the first error.
    let queues_deleted = runtime.block_on(delete_queues(options.broker, &queues));
    let schemas_dropped = schemas.as_mut().map_or(Ok(()), TempSchemas::drop_all);
    let stopped = upstream.stop();
    let removed = dir.close();
    let failures = outcome?;
    queues_deleted?;
    schemas_dropped?;
    stopped?;
    removed.context("removing the benchmark's directory")?;
    if failures > 0 {
        bail!("{failures} check(s) failed (marked !! above): this run's numbers are not valid");
    }
    Ok(())
}

fn options(args: impl Iterator<Item = String>) -> anyhow::Result<Options> {
    let flags = Flags::parse(
        args,
        &[
            "--messages",
            "--concurrency",
            "--broker",
            "--store",
            "--idem",
            "--dir",
        ],
        USAGE,
    )?;
    let concurrency: usize = flags.number("--concurrency", 8, 1..=256)?;
    let store = match flags.optional("--store") {
        None => StoreChoice::Sqlite,
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            if url.contains("schema=") {
                bail!("--store: leave out schema=; every run gets a fresh schema of its own");
            }
            StoreChoice::Postgres(url)
        }
        Some(other) => bail!(
            "--store {}: a postgres:// URL (without --store, each run gets a fresh SQLite file)",
            redact_url(&other)
        ),
    };
    let idem = match flags.optional("--idem") {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()
            .context("finding this benchmark's own binary")?
            .with_file_name("idem"),
    };
    if !idem.is_file() {
        bail!(
            "no idem binary at {}: build it first (`cargo build --release -p idem`), \
             or name it with --idem PATH",
            idem.display()
        );
    }
    Ok(Options {
        messages: flags.number("--messages", 20_000, 1..=1_000_000)?,
        concurrency,
        // Two deliveries in hand per worker, as the adapter's default
        // (16) is for the default concurrency (8).
        prefetch: u16::try_from(2 * concurrency).unwrap_or(u16::MAX),
        broker: Broker::parse(&flags.text("--broker", "rabbitmq"))?,
        store,
        idem,
        dir: flags.path("--dir", std::env::temp_dir()),
    })
}

/// Prints the setup, runs bare, idem, bare, idem, and the summary; returns
/// how many checks failed.
async fn bench(
    options: &Options,
    dir: &Path,
    upstream: &Upstream,
    queues: &mut Vec<String>,
    schemas: Option<&mut TempSchemas>,
) -> anyhow::Result<usize> {
    let admin = options.broker.admin().await?;
    print_setup(options, dir, upstream);
    let mut bench = Bench {
        options,
        dir,
        upstream,
        admin,
        queues,
        schemas,
        failures: 0,
    };
    println!(
        "  {:<8} {:>9} {:>10} {:>10} {:>7} {:>10} {:>9}",
        "run", "msgs/s", "elapsed s", "startup ms", "CPU s", "CPU µs/msg", "delivered"
    );
    let mut runs = Vec::new();
    for round in 1..=2 {
        for side in [Side::Bare, Side::Idem] {
            let run = bench.run(side, round).await?;
            print_run(&run);
            runs.push(run);
        }
    }
    summarize(&runs);
    let failures = bench.failures;
    bench.admin.close().await?;
    Ok(failures)
}

fn print_setup(options: &Options, dir: &Path, upstream: &Upstream) {
    let n = options.messages;
    println!(
        "idem-bench consume: {} at {}, a fresh queue per run filled with {n} persistent \
         messages of distinct intents ({}-byte JSON), concurrency {}, prefetch {}, {} CPUs",
        options.broker.name(),
        options.broker.shown(),
        queue::payout(2, n.saturating_sub(1)).len(),
        options.concurrency,
        options.prefetch,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "  service: axum on {}, 1 worker thread in this process, answers 201 to every POST of JSON",
        upstream.addr()
    );
    println!(
        "  bare:    {} bare-consume (the broker adapter, POST, ack; no store, no key)",
        std::env::current_exe().map_or_else(|_| "?".into(), |p| p.display().to_string())
    );
    let store = match &options.store {
        StoreChoice::Sqlite => format!("a fresh SQLite file per run in {}", dir.display()),
        StoreChoice::Postgres(url) => {
            format!("a fresh schema per run in {}", redact_url(url))
        }
    };
    println!(
        "  idem:    {} consume, key {KEY}, store: {store}",
        options.idem.display()
    );
    println!(
        "  each run: from starting the consumer to the service's {n}th request with the queue empty"
    );
    if cfg!(debug_assertions) {
        println!(
            "  !! this is a debug build: build and run with --release for figures that mean anything"
        );
    }
}

impl Bench<'_> {
    /// One run: a fresh queue, filled; the consumer started and timed
    /// until the queue is drained; stopped; checked; the queue deleted.
    async fn run(&mut self, side: Side, round: usize) -> anyhow::Result<Run> {
        let n = self.options.messages;
        let name = format!("{} #{round}", side.name());
        let queue = format!(
            "idem-bench-consume-{}-{}-{round}",
            std::process::id(),
            side.name()
        );
        self.queues.push(queue.clone());
        let payloads = (0..n).map(|i| queue::payout(round, i));
        let filled = self
            .admin
            .fill(&queue, self.options.prefetch, payloads)
            .await?;
        let ready = self.admin.ready(&queue).await?;
        if filled != n as u64 || ready != filled {
            bail!("{name}: {filled} of {n} messages published, {ready} in {queue:?}");
        }
        let command = match side {
            Side::Bare => self.bare_command(&queue)?,
            Side::Idem => self.idem_command(&queue, round)?,
        };
        let before = self.upstream.hits();
        let log = self.dir.join(format!("{}-{round}.log", side.name()));
        let started = Instant::now();
        let mut consumer = Consumer::spawn(&name, command, &log)?;
        let (elapsed, startup) = self.drained(&queue, &mut consumer, before, started).await?;
        let cpu = consumer.cpu();
        let status = consumer.stop().await?;
        let run = Run {
            side,
            round,
            elapsed,
            startup,
            cpu,
            delivered: self.upstream.hits() - before,
        };
        if !status.success() {
            self.fail(format!(
                "{name}: the consumer {status}; {}",
                consumer.tail()
            ));
        }
        self.check(&name, &queue, &run).await?;
        self.admin.delete(&queue).await?;
        self.queues.retain(|q| *q != queue);
        Ok(run)
    }

    /// Waits until the service has answered `messages` requests and the
    /// queue is empty; the time from `started`, and when the first request
    /// came.
    async fn drained(
        &self,
        queue: &str,
        consumer: &mut Consumer,
        before: u64,
        started: Instant,
    ) -> anyhow::Result<(Duration, Option<Duration>)> {
        let n = self.options.messages as u64;
        let mut first = None;
        loop {
            let hits = self.upstream.hits() - before;
            if first.is_none() && hits > 0 {
                first = Some(started.elapsed());
            }
            if hits >= n && self.admin.ready(queue).await? == 0 {
                return Ok((started.elapsed(), first));
            }
            if let Some(status) = consumer.exited()? {
                bail!(
                    "{}: the consumer {status} after {hits} of {n} messages; {}",
                    consumer.name,
                    consumer.tail()
                );
            }
            if started.elapsed() > RUN_TIMEOUT {
                bail!(
                    "{}: {hits} of {n} messages delivered within {} s; {}",
                    consumer.name,
                    RUN_TIMEOUT.as_secs(),
                    consumer.tail()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Every message's effect exactly once through idem, at least once
    /// through the bare consumer, and none left anywhere. A broker may
    /// deliver a message twice (SQS promises no single delivery): the bare
    /// consumer then runs it twice, which is reported, not failed; idem
    /// must run it once.
    async fn check(&mut self, name: &str, queue: &str, run: &Run) -> anyhow::Result<()> {
        let n = self.options.messages as u64;
        match run.side {
            Side::Bare if run.delivered > n => println!(
                "  ({name}: the broker delivered {} message(s) twice, and the bare consumer \
                 ran them twice)",
                run.delivered - n
            ),
            _ if run.delivered != n => self.fail(format!(
                "{name}: the service received {} requests for {n} messages",
                run.delivered
            )),
            _ => {}
        }
        for (q, left) in self.admin.left(queue).await? {
            if left > 0 {
                self.fail(format!("{name}: {left} message(s) left in {q:?}"));
            }
        }
        Ok(())
    }

    fn bare_command(&self, queue: &str) -> anyhow::Result<Command> {
        let exe = std::env::current_exe().context("finding this benchmark's own binary")?;
        let mut command = Command::new(exe);
        command
            .arg("bare-consume")
            .args(["--broker", self.options.broker.name()])
            .args(["--queue", queue])
            .args(["--deliver", &self.deliver()])
            .args(["--concurrency", &self.options.concurrency.to_string()])
            .args(["--prefetch", &self.options.prefetch.to_string()])
            .envs(self.options.broker.env().iter().copied());
        Ok(command)
    }

    /// `idem consume --config FILE --store URL`, with the file written in
    /// the benchmark's directory and a fresh store.
    fn idem_command(&mut self, queue: &str, round: usize) -> anyhow::Result<Command> {
        let section = self
            .options
            .broker
            .config_section(queue, self.options.prefetch);
        let config = idem_config(&self.deliver(), self.options.concurrency, &section);
        let path = self.dir.join(format!("consume-{round}.toml"));
        std::fs::write(&path, config).with_context(|| format!("writing {}", path.display()))?;
        let store = match (&self.options.store, self.schemas.as_deref_mut()) {
            (StoreChoice::Postgres(url), Some(schemas)) => {
                let schema = schemas.add(&format!("consume{round}"));
                let joiner = if url.contains('?') { '&' } else { '?' };
                format!("{url}{joiner}schema={schema}")
            }
            _ => {
                let db = self.dir.join(format!("idem-{round}.db"));
                format!("sqlite://{}", db.display())
            }
        };
        let mut command = Command::new(&self.options.idem);
        command
            .arg("consume")
            .arg("--config")
            .arg(&path)
            .args(["--store", &store])
            .envs(self.options.broker.env().iter().copied());
        Ok(command)
    }

    /// The service's URL.
    fn deliver(&self) -> String {
        format!("http://{}{}", self.upstream.addr(), crate::load::PATH)
    }

    fn fail(&mut self, what: String) {
        println!("  !! {what}");
        self.failures += 1;
    }
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Bare => "bare",
            Side::Idem => "idem",
        }
    }
}

impl Run {
    fn per_s(&self) -> f64 {
        self.delivered as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

impl Consumer {
    /// Starts `command` with its output going to `log`.
    fn spawn(name: &str, mut command: Command, log: &Path) -> anyhow::Result<Consumer> {
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("{name}: starting {command:?}"))?;
        Ok(Consumer {
            name: name.to_owned(),
            child,
            log: log.to_path_buf(),
        })
    }

    /// How it ended, if it has.
    fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// User + system CPU time so far, from `/proc/PID/stat` (Linux); `None`
    /// where that cannot be read.
    fn cpu(&self) -> Option<Duration> {
        measured::process_cpu(&self.child.id().to_string())
    }

    /// SIGTERM, then waits for it to settle what it holds and exit; killed
    /// if it takes longer than [`STOP_TIMEOUT`].
    async fn stop(&mut self) -> anyhow::Result<ExitStatus> {
        let pid = self.child.id().to_string();
        let signalled = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .context("running kill -TERM")?;
        if !signalled.success() {
            bail!("{}: kill -TERM {pid} failed", self.name);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.exited()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                self.child.kill()?;
                bail!(
                    "{}: did not exit within {} s of SIGTERM; killed. {}",
                    self.name,
                    STOP_TIMEOUT.as_secs(),
                    self.tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The end of its log, for an error.
    fn tail(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let from = text.len().saturating_sub(LOG_TAIL_BYTES);
        format!(
            "its log ends:\n{}",
            String::from_utf8_lossy(&text[from..]).trim_end()
        )
    }
}

impl Drop for Consumer {
    /// On an early return or an interruption: no consumer outlives the
    /// benchmark.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `idem consume`'s file: one subscription keyed by the payout's intent,
/// delivering to `deliver`, reading the broker of `broker_section`; the
/// store is given on the command line.
fn idem_config(deliver: &str, concurrency: usize, broker_section: &str) -> String {
    format!(
        "owner = \"idem-bench\"\n\n[[subscription]]\nname = \"{SUBSCRIPTION}\"\n\
         key = \"{KEY}\"\ndeliver = \"{deliver}\"\nconcurrency = {concurrency}\n\n\
         {broker_section}"
    )
}

/// Deletes the queues a failed or interrupted run left behind; waits up
/// to [`CLEANUP_TIMEOUT`] for a broker that is not answering (restarting).
async fn delete_queues(broker: Broker, queues: &[String]) -> anyhow::Result<()> {
    if queues.is_empty() {
        return Ok(());
    }
    let deadline = Instant::now() + CLEANUP_TIMEOUT;
    let admin = loop {
        match broker.admin().await {
            Ok(admin) => break admin,
            Err(e) if Instant::now() > deadline => {
                return Err(e.context(format!("left behind: {}", queues.join(", "))));
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    };
    for q in queues {
        admin.delete(q).await?;
    }
    admin.close().await
}

fn print_run(run: &Run) {
    let startup = run
        .startup
        .map_or("-".to_owned(), |d| format!("{:.0}", d.as_secs_f64() * 1e3));
    let (cpu, cpu_per_msg) = run.cpu.map_or(("-".to_owned(), "-".to_owned()), |d| {
        let per_msg = d.as_secs_f64() * 1e6 / run.delivered.max(1) as f64;
        (format!("{:.2}", d.as_secs_f64()), format!("{per_msg:.0}"))
    });
    println!(
        "  {:<8} {:>9.0} {:>10.2} {:>10} {:>7} {:>10} {:>9}",
        format!("{} #{}", run.side.name(), run.round),
        run.per_s(),
        run.elapsed.as_secs_f64(),
        startup,
        cpu,
        cpu_per_msg,
        run.delivered
    );
}

/// The ratio idem/bare per round, and of the means, against the target.
fn summarize(runs: &[Run]) {
    let rate = |side: Side, round: usize| {
        runs.iter()
            .find(|r| r.side == side && r.round == round)
            .map_or(0.0, Run::per_s)
    };
    let mean = |side: Side| (rate(side, 1) + rate(side, 2)) / 2.0;
    for round in 1..=2 {
        let (idem, bare) = (rate(Side::Idem, round), rate(Side::Bare, round));
        println!(
            "  round {round}: idem/bare {:.3}x ({idem:.0} / {bare:.0} msgs/s)",
            idem / bare.max(f64::MIN_POSITIVE)
        );
    }
    let (idem, bare) = (mean(Side::Idem), mean(Side::Bare));
    let ratio = idem / bare.max(f64::MIN_POSITIVE);
    let drift = (rate(Side::Bare, 2) - rate(Side::Bare, 1)) / bare.max(f64::MIN_POSITIVE);
    println!(
        "  overall: idem {idem:.0} msgs/s / bare {bare:.0} msgs/s (means of two runs; bare #2 vs \
         #1: {:+.1}%) = {ratio:.3}x  target >= {TARGET}x: {}",
        drift * 100.0,
        verdict(ratio >= TARGET)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn the_config_written_for_idem_is_one_idem_consume_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("consume.toml");
        let section = Broker::RabbitMq.config_section("idem-bench-q", 16);
        std::fs::write(
            &path,
            idem_config("http://127.0.0.1:9/payouts", 8, &section),
        )
        .unwrap();
        let config = idem_consumer::config::ConsumeConfig::load(&path).unwrap();
        let [sub] = config.subscriptions.as_slice() else {
            panic!("one subscription, not {}", config.subscriptions.len())
        };
        assert_eq!(sub.name, SUBSCRIPTION);
        assert_eq!(sub.concurrency, 8);
        assert_eq!(sub.deliver.to_string(), "http://127.0.0.1:9/payouts");
        assert_eq!(sub.intent.key().as_str(), KEY);
        let idem_consumer::broker::Broker::RabbitMq(rabbit) = &sub.broker else {
            panic!("not RabbitMQ: {:?}", sub.broker)
        };
        assert_eq!(*rabbit, crate::rabbit::config("idem-bench-q", 16).unwrap());
    }

    #[test]
    fn every_message_of_every_run_names_its_own_intent() {
        let mut keys = HashSet::new();
        for run in 1..=2 {
            for i in 0..1_000 {
                let body: serde_json::Value =
                    serde_json::from_slice(&queue::payout(run, i)).unwrap();
                let key = format!("{}:{}", body["seller_id"], body["settlement_id"]);
                assert!(keys.insert(key.clone()), "{key} twice");
            }
        }
    }
}

//! `idem-bench postgres`: claims per second through [`PgStore`] against a
//! raw baseline on the same server with the same number of concurrent
//! callers, in one run. The baseline is N callers, each on its own
//! tokio-postgres connection, inserting fresh keys with a prepared
//! `INSERT … ON CONFLICT DO NOTHING` in autocommit into a bare table keyed
//! like idem's `records`; idem is N callers claiming fresh keys through a
//! store with a pool of N connections and the database's clock. Baseline,
//! idem, baseline again (the mean of the two is the baseline), then, for
//! the record only, claim + complete pairs. Each side has a temporary
//! schema of its own, dropped at the end whatever happened.
//!
//! It reports; it never asserts. It fails (exit status 1) only when the
//! benchmark itself failed: the server does not answer, or an operation
//! failed or answered otherwise.
//!
//! Usage: `cargo run --release -p idem-bench -- postgres [--connections 16]
//! [--seconds 5] [--url URL]`

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use idem_core::{Policy, Scope, Store};
use idem_postgres::{PgOptions, PgStore, redact_url};
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls, Statement};

use crate::args::Flags;
use crate::fixtures;
use crate::measured::{self, Baseline, Measured};

const USAGE: &str = "usage: idem-bench postgres [--connections N] [--seconds S] [--url URL]";
/// The server the benchmark uses unless told otherwise.
const URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test";
/// idem's claims per second, as a share of the baseline's inserts.
const TARGET: f64 = 0.9;
/// idem's claim + complete pairs per second, as a share of the baseline's
/// inserts (a pair commits twice, so 0.5 is the ceiling).
const TARGET_PAIRS: f64 = 0.4;
/// How long connecting, and any one statement or claim, may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Every key's fingerprint byte, on both sides.
const FINGERPRINT: u8 = 0x5a;
/// Untimed operations before the measured phases, so that every
/// connection is open and every statement prepared.
const WARMUP: Duration = Duration::from_millis(500);
/// The baseline's table: the key and collation of idem's `records`, with
/// payload columns of the same types and widths as a new claim's row.
const BASELINE_TABLE: &str = "CREATE TABLE {s}.claims (
    scope TEXT COLLATE \"C\" NOT NULL,
    key TEXT COLLATE \"C\" NOT NULL,
    fingerprint BYTEA NOT NULL,
    state TEXT NOT NULL,
    token BIGINT NOT NULL,
    owner TEXT NOT NULL,
    lease_until_ms BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    retention_s BIGINT NOT NULL,
    tombstone_s BIGINT NOT NULL,
    PRIMARY KEY (scope, key)
)";
/// The baseline's statement, prepared once per connection.
const BASELINE_INSERT: &str = "INSERT INTO {s}.claims (scope, key, fingerprint, state, token, \
     owner, lease_until_ms, created_at_ms, retention_s, tombstone_s) \
     VALUES ($1, $2, $3, 'in_progress', $4, $5, $6, $7, $8, $9) \
     ON CONFLICT (scope, key) DO NOTHING";

/// What to run, from the command line.
struct Options {
    connections: usize,
    seconds: u64,
    url: String,
}

/// Runs `idem-bench postgres` with the flags that follow the subcommand.
pub fn main(args: impl Iterator<Item = String>) -> anyhow::Result<()> {
    let flags = Flags::parse(args, &["--connections", "--seconds", "--url"], USAGE)?;
    let options = Options {
        connections: flags.number("--connections", 16, 1..=idem_postgres::POOL_SIZE_MAX)?,
        seconds: flags.number("--seconds", 5, 1..=600)?,
        url: flags.text("--url", URL_DEFAULT),
    };
    let config = loopback_config(&options.url, "--url", USAGE)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let mut schemas = TempSchemas::new(config.clone(), &options.url);
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = bench(&options, &config, &mut schemas) => outcome,
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        }
    });
    // The store's and the baseline's connections close with the runtime,
    // before the schemas they used are dropped.
    runtime.shutdown_timeout(TIMEOUT);
    let cleanup = schemas.drop_all();
    let failures = outcome?;
    cleanup?;
    if failures > 0 {
        bail!("{failures} check(s) failed (marked !! above): this run's numbers are not valid");
    }
    Ok(())
}

/// `url` (given as `flag`) parsed, refused unless every host it names is
/// this machine.
pub(crate) fn loopback_config(url: &str, flag: &str, usage: &str) -> anyhow::Result<Config> {
    let mut config: Config = url
        .parse()
        .with_context(|| format!("invalid {flag} {}; {usage}", redact_url(url)))?;
    let loopback = |host: &Host| match host {
        Host::Tcp(name) => {
            name == "localhost" || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        Host::Unix(_) => true,
    };
    let hosts = config.get_hosts();
    if hosts.is_empty()
        || !hosts.iter().all(loopback)
        || !config.get_hostaddrs().iter().all(IpAddr::is_loopback)
    {
        bail!(
            "{flag} {} must name a server on this machine (127.0.0.1, ::1, localhost or a Unix \
             socket): the benchmark only loads a loopback server",
            redact_url(url)
        );
    }
    config.connect_timeout(TIMEOUT);
    if config.get_application_name().is_none() {
        config.application_name("idem-bench");
    }
    Ok(config)
}

/// A new connection; the error says whether the server is not answering
/// or answered with a refusal.
async fn connect(config: &Config, url: &str) -> anyhow::Result<Client> {
    let url = redact_url(url);
    let connected = tokio::time::timeout(TIMEOUT, config.connect(NoTls))
        .await
        .map_err(|_| {
            anyhow!(
                "PostgreSQL at {url} is not answering: no answer within {} s",
                TIMEOUT.as_secs()
            )
        })?;
    let (client, connection) = connected.map_err(|e| match e.as_db_error() {
        Some(db) => anyhow!("PostgreSQL at {url} refused the connection: {db}"),
        None => anyhow!(
            "PostgreSQL at {url} is not answering: {:#}",
            anyhow::Error::new(e)
        ),
    })?;
    // Its errors reach the caller through the client.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Temporary schemas, dropped (with everything in them) by
/// [`TempSchemas::drop_all`] or, on a panic, when this is dropped.
pub(crate) struct TempSchemas {
    config: Config,
    url: String,
    names: Vec<String>,
}

impl TempSchemas {
    pub(crate) fn new(config: Config, url: &str) -> TempSchemas {
        TempSchemas {
            config,
            url: url.to_owned(),
            names: Vec::new(),
        }
    }

    /// A schema name no other run uses, `idem_bench_<role>_<pid>_<ms>`,
    /// registered for dropping before anything creates it.
    pub(crate) fn add(&mut self, role: &str) -> String {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let name = format!("idem_bench_{role}_{}_{ms}", std::process::id());
        self.names.push(name.clone());
        name
    }

    /// Drops every registered schema that exists, on a thread and runtime of
    /// its own (so that it works inside or outside a runtime).
    pub(crate) fn drop_all(&mut self) -> anyhow::Result<()> {
        if self.names.is_empty() {
            return Ok(());
        }
        let drops: Vec<String> = self
            .names
            .iter()
            .map(|s| format!("DROP SCHEMA IF EXISTS {s} CASCADE;"))
            .collect();
        let sql = format!("SET lock_timeout = '10s'; {}", drops.join(" "));
        let (config, url) = (self.config.clone(), self.url.clone());
        let work = move || -> anyhow::Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let client = connect(&config, &url).await?;
                tokio::time::timeout(TIMEOUT, client.batch_execute(&sql))
                    .await
                    .context("no answer")??;
                anyhow::Ok(())
            })
        };
        let dropped = std::thread::spawn(work)
            .join()
            .unwrap_or_else(|_| Err(anyhow!("the cleanup thread panicked")));
        let names = self.names.join(", ");
        dropped.with_context(|| format!("dropping the temporary schemas {names}"))?;
        self.names.clear();
        Ok(())
    }
}

impl Drop for TempSchemas {
    fn drop(&mut self) {
        if let Err(e) = self.drop_all() {
            eprintln!("{e:#}");
        }
    }
}

/// The phases in order; returns how many checks failed.
async fn bench(
    options: &Options,
    config: &Config,
    schemas: &mut TempSchemas,
) -> anyhow::Result<usize> {
    let n = options.connections;
    let admin = connect(config, &options.url).await?;
    let server = admin
        .query_one(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'), \
             current_setting('max_connections')::int",
            &[],
        )
        .await
        .context("reading the server's settings")?;
    let (version, sync, max): (String, String, i32) = (server.get(0), server.get(1), server.get(2));
    // N baseline connections and N pooled ones stay open, with this one.
    if 2 * n + 1 > usize::try_from(max).unwrap_or(0) {
        bail!(
            "--connections {n} needs {} connections; the server allows {max}",
            2 * n + 1
        );
    }
    let base = schemas.add("base");
    let idem = schemas.add("idem");
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {base}; {}",
            BASELINE_TABLE.replace("{s}", &base)
        ))
        .await
        .with_context(|| format!("creating the baseline's table in schema {base}"))?;
    let baseline = BaselineCallers::open(config, &options.url, &base, n).await?;
    let store = PgStore::connect(
        &options.url,
        PgOptions {
            pool_size: n,
            schema: idem.clone(),
            clock: None,
            ..PgOptions::default()
        },
    )
    .await
    .context("connecting the idem store")?;
    let store = Arc::new(store);
    println!(
        "idem-bench postgres: {n} concurrent callers, fresh keys, {} s per phase, PostgreSQL \
         {version} at {} (synchronous_commit={sync}), {} CPUs",
        options.seconds,
        redact_url(&options.url),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "  baseline: prepared INSERT … ON CONFLICT DO NOTHING in autocommit, one tokio-postgres \
         connection per caller, table {base}.claims"
    );
    println!(
        "  idem:     PgStore::claim, pool_size {n}, schema {idem}, database clock \
         (claim + complete pairs: two commits each)"
    );
    let mut bench = Phases {
        seconds: options.seconds,
        failures: 0,
    };
    bench
        .warm_up(baseline.inserts("wb"), idem_claims(&store, n, "wi")?)
        .await?;
    println!("{}", measured::header("claims/s"));
    let first = bench.phase("baseline #1", baseline.inserts("b1")).await?;
    let claims = bench
        .phase("idem claim", idem_claims(&store, n, "i")?)
        .await?;
    let second = bench.phase("baseline #2", baseline.inserts("b2")).await?;
    let pairs = bench
        .phase("idem claim+complete", idem_pairs(&store, n, "p")?)
        .await?;
    let baseline = Baseline::print_mean(
        "baseline",
        "claims/s",
        ("baseline #1", &first),
        ("baseline #2", &second),
    );
    baseline.print_ratio("idem claim", &claims, Some(TARGET));
    baseline.print_ratio("idem claim+complete", &pairs, Some(TARGET_PAIRS));
    Ok(bench.failures)
}

/// Runs the phases and counts the checks that failed.
struct Phases {
    seconds: u64,
    failures: usize,
}

impl Phases {
    /// Untimed, unprinted runs of both sides; only their failures count.
    async fn warm_up(&mut self, baseline: Vec<Caller>, idem: Vec<Caller>) -> anyhow::Result<()> {
        for (name, callers) in [("warm-up baseline", baseline), ("warm-up idem", idem)] {
            let warmed = measured::run_callers(callers, Instant::now() + WARMUP, TIMEOUT).await?;
            self.check(name, &warmed);
        }
        Ok(())
    }

    /// One measured phase, its row printed.
    async fn phase(&mut self, name: &str, callers: Vec<Caller>) -> anyhow::Result<Measured> {
        let deadline = Instant::now() + Duration::from_secs(self.seconds);
        let measured = measured::run_callers(callers, deadline, TIMEOUT).await?;
        println!("{}", measured.row(name));
        self.check(name, &measured);
        Ok(measured)
    }

    fn check(&mut self, name: &str, measured: &Measured) {
        if let Some(failure) = measured.failure(name) {
            println!("  !! {failure}");
            self.failures += 1;
        }
    }
}

/// The baseline's connections, each with its statement prepared.
struct BaselineCallers {
    connections: Vec<(Arc<Client>, Statement)>,
}

impl BaselineCallers {
    async fn open(
        config: &Config,
        url: &str,
        schema: &str,
        n: usize,
    ) -> anyhow::Result<BaselineCallers> {
        let sql = BASELINE_INSERT.replace("{s}", schema);
        let mut connections = Vec::with_capacity(n);
        for _ in 0..n {
            let client = connect(config, url).await?;
            let statement = client
                .prepare(&sql)
                .await
                .context("preparing the baseline's insert")?;
            connections.push((Arc::new(client), statement));
        }
        Ok(BaselineCallers { connections })
    }

    /// One caller per connection, inserting `PREFIX-CALLER-N`; a key that
    /// inserts no row is an error.
    fn inserts(&self, prefix: &'static str) -> Vec<Caller> {
        let fingerprint = Arc::new(vec![FINGERPRINT; 32]);
        self.connections
            .iter()
            .enumerate()
            .map(|(caller, (client, statement))| {
                let (client, statement) = (Arc::clone(client), statement.clone());
                let fingerprint = Arc::clone(&fingerprint);
                Box::new(move |n: u64| -> BoxedOp {
                    let (client, statement) = (Arc::clone(&client), statement.clone());
                    let fingerprint = Arc::clone(&fingerprint);
                    let key = format!("{prefix}-{caller}-{n}");
                    Box::pin(async move {
                        let policy = Policy::default();
                        let now = unix_ms();
                        let token = int(n + 1);
                        let lease_until = now + int(policy.lease_ms());
                        let (retention, tombstone) =
                            (int(policy.retention_s()), int(policy.tombstone_s()));
                        let fingerprint: &[u8] = &fingerprint;
                        let inserted = client
                            .execute(
                                &statement,
                                &[
                                    &fixtures::SCOPE,
                                    &key,
                                    &fingerprint,
                                    &token,
                                    &fixtures::OWNER,
                                    &lease_until,
                                    &now,
                                    &retention,
                                    &tombstone,
                                ],
                            )
                            .await
                            .with_context(|| format!("inserting key {key}"))?;
                        if inserted != 1 {
                            bail!("fresh key {key} inserted {inserted} rows, not 1");
                        }
                        Ok(())
                    })
                }) as Caller
            })
            .collect()
    }
}

/// One operation of a caller, boxed as [`Store`]'s futures are.
type BoxedOp = std::pin::Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// A caller: its `n`th operation, for n = 0, 1, …
type Caller = Box<dyn FnMut(u64) -> BoxedOp + Send>;

/// `n` callers claiming fresh keys `PREFIX-CALLER-N`; anything but
/// `Acquired` is an error.
fn idem_claims(
    store: &Arc<PgStore>,
    n: usize,
    prefix: &'static str,
) -> anyhow::Result<Vec<Caller>> {
    let scope = Scope::new(fixtures::SCOPE)?;
    Ok((0..n)
        .map(|caller| {
            let (store, scope) = (Arc::clone(store), scope.clone());
            Box::new(move |i: u64| -> BoxedOp {
                let store = Arc::clone(&store);
                let req = fixtures::request(&scope, &format!("{prefix}-{caller}-{i}"), FINGERPRINT);
                Box::pin(async move {
                    fixtures::acquire(&*store, &req?).await?;
                    Ok(())
                })
            }) as Caller
        })
        .collect())
}

/// `n` callers claiming fresh keys and completing each with a small result.
fn idem_pairs(store: &Arc<PgStore>, n: usize, prefix: &'static str) -> anyhow::Result<Vec<Caller>> {
    let scope = Scope::new(fixtures::SCOPE)?;
    let result = fixtures::payout_result()?;
    Ok((0..n)
        .map(|caller| {
            let (store, scope, result) = (Arc::clone(store), scope.clone(), result.clone());
            Box::new(move |i: u64| -> BoxedOp {
                let (store, result) = (Arc::clone(&store), result.clone());
                let req = fixtures::request(&scope, &format!("{prefix}-{caller}-{i}"), FINGERPRINT);
                Box::pin(async move {
                    let req = req?;
                    let token = fixtures::acquire(&*store, &req).await?;
                    store
                        .complete(&req.id, token, result)
                        .await
                        .with_context(|| format!("completing {}", req.id))?;
                    Ok(())
                })
            }) as Caller
        })
        .collect())
}

/// This machine's clock in milliseconds since 1970.
fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| int(d.as_millis() as u64))
}

/// A `u64` as PostgreSQL's `bigint`, saturating.
fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

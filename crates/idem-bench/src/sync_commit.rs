//! `idem-bench sync-commit`: what a synchronous standby costs a commit.
//! Builds a throwaway primary and streaming standby of the machine's
//! PostgreSQL (`idem_testkit::pg_cluster`, spare loopback ports, removed at
//! the end) and times, one after another on one session, single-row
//! commits and claim + complete pairs through [`PgStore`], with
//! `synchronous_commit = local` (the baseline: durable on the primary
//! only) and `remote_apply` (applied on the standby before the commit
//! returns). Baseline, remote_apply, baseline again; the ratio is against
//! the mean of the two baselines.
//!
//! Both nodes share one machine, so the figure is the cost of the
//! protocol (a round trip to the standby and its replay), not of a
//! network: add the real round trip between the two sites.
//!
//! Usage: `cargo run --release -p idem-bench -- sync-commit [--commits 500]`

use std::time::Instant;

use anyhow::{Context, anyhow};
use idem_core::{Scope, Store};
use idem_postgres::{PgOptions, PgStore};
use idem_testkit::pg_cluster::{PgCluster, Replication, Role};
use tokio_postgres::NoTls;

use crate::args::Flags;
use crate::fixtures;
use crate::measured::{self, Measured};

const USAGE: &str = "usage: idem-bench sync-commit [--commits N]";

/// The two settings compared, as `synchronous_commit` spells them.
#[derive(Clone, Copy)]
enum Mode {
    Local,
    RemoteApply,
}

impl Mode {
    fn setting(self) -> &'static str {
        match self {
            Mode::Local => "local",
            Mode::RemoteApply => "remote_apply",
        }
    }
}

pub fn main(args: impl Iterator<Item = String>) -> anyhow::Result<()> {
    let flags = Flags::parse(args, &["--commits"], USAGE)?;
    let commits: u32 = flags.number("--commits", 500, 10..=100_000)?;
    let mut cluster = PgCluster::start_primary(Replication::Synchronous)
        .map_err(|e| anyhow!("building the primary: {e}"))?;
    let primary = cluster.primary_addr();
    cluster
        .add_standby(primary)
        .map_err(|e| anyhow!("building the standby: {e}"))?;
    let url = cluster.url(Role::Primary);
    println!(
        "sync-commit: {commits} sequential commits per phase on a primary and a synchronous \
         standby on this machine ({url}, standby {})",
        cluster
            .standby_addr()
            .map_or_else(|| "?".to_owned(), |a| a.to_string())
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(compare(&url, commits))
}

async fn compare(url: &str, commits: u32) -> anyhow::Result<()> {
    let phases = [Mode::Local, Mode::RemoteApply, Mode::Local];
    let mut rows = Vec::new();
    for (i, mode) in phases.into_iter().enumerate() {
        let rows_measured = single_row_commits(url, mode, commits, i).await?;
        let pairs_measured = claim_complete_pairs(url, mode, commits, i).await?;
        rows.push((mode, rows_measured, pairs_measured));
    }
    println!("{}", measured::header("ops/s"));
    for (mode, single, pairs) in &rows {
        println!("{}", single.row(&format!("insert, {}", mode.setting())));
        println!(
            "{}",
            pairs.row(&format!("claim+complete, {}", mode.setting()))
        );
    }
    let p50 = |m: &Measured| f64::from(m.percentile_us(0.5));
    let p99 = |m: &Measured| f64::from(m.percentile_us(0.99));
    let (base_a, sync, base_b) = (&rows[0], &rows[1], &rows[2]);
    let single = |row: &(Mode, Measured, Measured)| (p50(&row.1), p99(&row.1));
    let pairs = |row: &(Mode, Measured, Measured)| (p50(&row.2), p99(&row.2));
    for (name, (a, s, b)) in [
        ("insert", (single(base_a), single(sync), single(base_b))),
        (
            "claim+complete",
            (pairs(base_a), pairs(sync), pairs(base_b)),
        ),
    ] {
        println!(
            "  {name}: remote_apply / local = {:.2}× at p50, {:.2}× at p99",
            s.0 / ((a.0 + b.0) / 2.0).max(1.0),
            s.1 / ((a.1 + b.1) / 2.0).max(1.0),
        );
    }
    Ok(())
}

/// `commits` autocommit inserts of one row, one after another.
async fn single_row_commits(
    url: &str,
    mode: Mode,
    commits: u32,
    phase: usize,
) -> anyhow::Result<Measured> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .context("connecting")?;
    let connection = tokio::spawn(connection);
    let table = format!("bench_rows_{phase}");
    client
        .batch_execute(&format!(
            "SET synchronous_commit = {}; CREATE TABLE {table} (n int PRIMARY KEY, body text)",
            mode.setting()
        ))
        .await?;
    let insert = client
        .prepare(&format!("INSERT INTO {table} VALUES ($1, 'x')"))
        .await?;
    let mut measured = Measured::default();
    let start = Instant::now();
    for n in 0..commits {
        let t = Instant::now();
        let key = i32::try_from(n)?;
        match client.execute(&insert, &[&key]).await {
            Ok(_) => measured.ok_since(t),
            Err(e) => measured.error(e.into()),
        }
    }
    measured.finish(start.elapsed());
    drop(client);
    connection.abort();
    Ok(measured)
}

/// `commits` fresh keys claimed and completed through a one-connection
/// [`PgStore`] whose sessions use `mode`.
async fn claim_complete_pairs(
    url: &str,
    mode: Mode,
    commits: u32,
    phase: usize,
) -> anyhow::Result<Measured> {
    let store_url = format!(
        "{url}?options=-c%20synchronous_commit%3D{}&schema=bench_pairs_{phase}&pool_size=1",
        mode.setting()
    );
    let store = PgStore::connect(&store_url, PgOptions::default()).await?;
    let scope = Scope::new(fixtures::SCOPE)?;
    let result = fixtures::payout_result()?;
    let mut measured = Measured::default();
    let start = Instant::now();
    for n in 0..commits {
        let req = fixtures::request(&scope, &format!("k-{n}"), 0x5a)?;
        let t = Instant::now();
        let pair = async {
            let token = fixtures::acquire(&store, &req).await?;
            store.complete(&req.id, token, result.clone()).await?;
            anyhow::Ok(())
        };
        match pair.await {
            Ok(()) => measured.ok_since(t),
            Err(e) => measured.error(e),
        }
    }
    measured.finish(start.elapsed());
    Ok(measured)
}

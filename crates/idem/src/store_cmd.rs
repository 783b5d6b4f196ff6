//! `idem store backup`: a consistent copy of an SQLite store while the
//! gateway serves from it (docs/stores.md, "Backups"). A PostgreSQL store
//! is backed up with the database that holds it, together with the
//! business data, not by idem.
//!
//! `idem store restore` puts such a copy back, and `idem store
//! mark-restored` tells any store that it was restored by other means:
//! both open the suspect window (docs/contract.md, "After a failover or a
//! restore"), in which fresh claims on routes with a lookup are verified
//! with the provider before they run.

use std::path::PathBuf;

use anyhow::{Context, bail};
use idem_core::{Clock, SystemClock, Timestamp, WindowOpening};

use crate::store_url::{OpenStore, StoreArgs, StoreUrl};

/// `idem store backup`.
#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// The store to copy (an SQLite store).
    #[command(flatten)]
    store: StoreArgs,
    /// The file to write; it must not exist.
    #[arg(long)]
    to: PathBuf,
}

/// Copies the store to `--to` through SQLite's online backup and checks the
/// copy; prints what it wrote.
pub fn backup(args: BackupArgs) -> anyhow::Result<()> {
    let url = args.store.url()?;
    let path = match &url {
        StoreUrl::Sqlite(path) => path,
        StoreUrl::Postgres(_) => bail!(
            "{}: {url} is a PostgreSQL store: back it up with the database that holds it \
             (pg_basebackup and WAL archiving, for a restore to a point in time together with \
             the business data), not with idem; docs/stores.md, \"Backups\"",
            args.store.field()
        ),
        StoreUrl::Dynamodb(_) => bail!(
            "{}: {url} is a DynamoDB store: back it up with DynamoDB (point-in-time recovery, \
             or on-demand backups), not with idem; docs/stores.md, \"Backups\"",
            args.store.field()
        ),
    };
    if !path.exists() {
        return Err(args.store.no_store(&url));
    }
    let report = idem_sqlite::backup(path, &args.to)
        .map_err(|e| anyhow::anyhow!("cannot back up {url} to {}: {e}", args.to.display()))?;
    println!(
        "backed up {url} to {}: {} records, {} bytes, checked (integrity, schema version {})",
        args.to.display(),
        report.records,
        report.bytes,
        idem_sqlite::SCHEMA_VERSION
    );
    Ok(())
}

/// The default length of a suspect window opened from the command line:
/// the default retention of a route (24 h), after which the records a
/// restore lost would have been forgotten anyway.
pub const WINDOW_S_DEFAULT: u64 = 86_400;

/// `idem store restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The store to replace (an SQLite store; it need not exist). No
    /// process may have it open: stop the gateway first.
    #[command(flatten)]
    store: StoreArgs,
    /// The backup to restore (a file `idem store backup` wrote).
    #[arg(long)]
    from: PathBuf,
    /// How long the suspect window stays open, in seconds: the longest
    /// retention of your routes.
    #[arg(long, default_value_t = WINDOW_S_DEFAULT)]
    window_s: u64,
}

/// Restores the backup in place of the store, with the suspect window
/// open; prints what it did.
pub fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let url = args.store.url()?;
    let path = match &url {
        StoreUrl::Sqlite(path) => path,
        StoreUrl::Postgres(_) => bail!(
            "{}: {url} is a PostgreSQL store: restore it with the database that holds it \
             (point-in-time recovery), then run `idem store mark-restored --since TIME`; \
             docs/stores.md, \"Backups\"",
            args.store.field()
        ),
        StoreUrl::Dynamodb(_) => bail!(
            "{}: {url} is a DynamoDB store: restore it with DynamoDB (point-in-time recovery \
             restores to a new table: point the store's URL at it), then run \
             `idem store mark-restored --since TIME`; docs/stores.md, \"Backups\"",
            args.store.field()
        ),
    };
    let window_ms = window_ms(args.window_s)?;
    let report = idem_sqlite::restore(&args.from, path, (window_ms, SystemClock.now()))
        .map_err(|e| anyhow::anyhow!("cannot restore {} into {url}: {e}", args.from.display()))?;
    println!(
        "restored {} into {url}: {} records{}",
        args.from.display(),
        report.records,
        report.replaced.map_or(String::new(), |p| format!(
            "; the store it replaced is kept as {}",
            p.display()
        ))
    );
    print_window(&report.window);
    Ok(())
}

/// `idem store init`.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// The store to create.
    #[command(flatten)]
    store: StoreArgs,
    /// Print what would be created instead of creating it: `cloudformation`
    /// (a DynamoDB table's AWS::DynamoDB::Table resource, as JSON).
    #[arg(long, value_name = "FORMAT", value_parser = ["cloudformation"])]
    print: Option<String>,
}

/// Creates the store, or prints its DynamoDB table as CloudFormation.
pub async fn init(args: InitArgs) -> anyhow::Result<()> {
    let url = args.store.url()?;
    match (&url, args.print.as_deref()) {
        (StoreUrl::Dynamodb(table), Some(_)) => {
            println!("{}", idem_dynamodb::setup::cloudformation(table));
            eprintln!(
                "once the stack has made the table, run `idem store init --store {url}`: it \
                 finds the table and writes the item that names idem's layout"
            );
            Ok(())
        }
        (_, Some(format)) => bail!(
            "{}: {url} is not a DynamoDB store: --print {format} describes a DynamoDB table",
            args.store.field()
        ),
        (StoreUrl::Dynamodb(table), None) => {
            let client = idem_dynamodb::connect(table).await;
            let done = idem_dynamodb::create_table(&client, table)
                .await
                .with_context(|| format!("cannot create store {url}"))?;
            println!("{url}: {}", done.join("; "));
            let found = idem_dynamodb::describe(&client, table).await?;
            print_clock(table, found.clock_offset_ms)
        }
        (StoreUrl::Sqlite(_) | StoreUrl::Postgres(_), None) => {
            url.open()?;
            println!("{url}: ready");
            Ok(())
        }
    }
}

/// Says how far this machine's clock is from DynamoDB's against the skew
/// the URL tolerates; fails when it is further.
fn print_clock(table: &idem_dynamodb::DynamoUrl, offset: Option<i64>) -> anyhow::Result<()> {
    let Some(offset) = offset else {
        println!("clock: DynamoDB's answer had no Date to compare with");
        return Ok(());
    };
    let bound = i64::try_from(table.clock_skew_ms)
        .unwrap_or(i64::MAX)
        .saturating_add(1_000);
    println!(
        "clock: {offset:+} ms from DynamoDB's (to about half a second); the store tolerates \
         clock_skew_ms = {}",
        table.clock_skew_ms
    );
    if offset.abs() > bound {
        bail!(
            "this machine's clock is {offset:+} ms from DynamoDB's, more than clock_skew_ms = {} \
             plus the second the measure may be off: synchronise it (Amazon Time Sync, chrony) \
             or raise clock_skew_ms in the store URL",
            table.clock_skew_ms
        );
    }
    Ok(())
}

/// `idem store mark-restored`.
#[derive(Debug, clap::Args)]
pub struct MarkRestoredArgs {
    /// The store that was restored.
    #[command(flatten)]
    store: StoreArgs,
    /// The point it was restored to: an RFC 3339 instant
    /// (2026-12-01T09:30:00Z). Records written after it may be gone.
    #[arg(long)]
    since: String,
    /// How long the suspect window stays open, in seconds: the longest
    /// retention of your routes.
    #[arg(long, default_value_t = WINDOW_S_DEFAULT)]
    window_s: u64,
}

/// Opens the suspect window on the store from `--since`; gateways already
/// running see it within a second.
pub async fn mark_restored(args: MarkRestoredArgs) -> anyhow::Result<()> {
    let since = parse_instant(&args.since).context("--since")?;
    let opening = WindowOpening {
        length_ms: window_ms(args.window_s)?,
        since: Some(since),
        cause: format!("marked restored to {} by an operator", args.since.trim()),
    };
    let (url, store) = args.store.open_existing()?;
    let window = store
        .open_suspect_window(&opening)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the suspect window on {url}: {e}"))?;
    println!("marked {url} restored to {}", args.since.trim());
    print_window(&window);
    Ok(())
}

fn window_ms(window_s: u64) -> anyhow::Result<u64> {
    match window_s {
        0 => bail!("--window-s: 0 would open no window; give the longest retention of your routes"),
        s if s > idem_core::HORIZON_S_MAX => bail!(
            "--window-s: {s} is out of range (1..={})",
            idem_core::HORIZON_S_MAX
        ),
        s => Ok(s * 1000),
    }
}

/// An RFC 3339 instant as milliseconds since the epoch; refused before the
/// epoch or in the future.
fn parse_instant(text: &str) -> anyhow::Result<Timestamp> {
    let at =
        time::OffsetDateTime::parse(text.trim(), &time::format_description::well_known::Rfc3339)
            .map_err(|e| {
                anyhow::anyhow!(
                    "{text:?} is not an RFC 3339 instant (e.g. 2026-12-01T09:30:00Z): {e}"
                )
            })?;
    let ms = at.unix_timestamp_nanos() / 1_000_000;
    let ms = u64::try_from(ms).map_err(|_| anyhow::anyhow!("{text:?} is before 1970"))?;
    let at = Timestamp::from_millis(ms);
    if at > SystemClock.now() {
        bail!("{text:?} is in the future; give the point the store was restored to");
    }
    Ok(at)
}

fn print_window(w: &idem_core::SuspectWindow) {
    println!(
        "suspect window open until {} ({}): fresh claims on routes with a lookup are verified \
         with the provider before they run; routes without one are counted as unverified",
        idem_gateway::rfc3339(w.until),
        w.cause
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_are_rfc3339_in_the_past() {
        assert_eq!(
            parse_instant("2026-01-02T03:04:05.678Z").unwrap(),
            Timestamp::from_millis(1_767_323_045_678)
        );
        assert_eq!(
            parse_instant(" 2026-01-02T04:04:05.678+01:00 ").unwrap(),
            Timestamp::from_millis(1_767_323_045_678)
        );
        for bad in [
            "yesterday",
            "2026-01-02",
            "1969-12-31T23:59:59Z",
            "2999-01-01T00:00:00Z",
        ] {
            assert!(parse_instant(bad).is_err(), "{bad}");
        }
    }
}

//! `idem store backup`: a consistent copy of an SQLite store while the
//! gateway serves from it (docs/stores.md, "Backups"). A PostgreSQL store
//! is backed up with the database that holds it, together with the
//! business data, not by idem.

use std::path::PathBuf;

use anyhow::bail;

use crate::store_url::{self, STORE_DEFAULT, StoreUrl};

/// `idem store backup`.
#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// The store to copy, as a URL (an SQLite store).
    #[arg(long, default_value = STORE_DEFAULT)]
    store: String,
    /// The file to write; it must not exist.
    #[arg(long)]
    to: PathBuf,
}

/// Copies the store to `--to` through SQLite's online backup and checks the
/// copy; prints what it wrote.
pub fn backup(args: BackupArgs) -> anyhow::Result<()> {
    let url = store_url::from_flag(&args.store)?;
    let path = match &url {
        StoreUrl::Sqlite(path) => path,
        StoreUrl::Postgres(_) => bail!(
            "--store: {url} is a PostgreSQL store: back it up with the database that holds it \
             (pg_basebackup and WAL archiving, for a restore to a point in time together with \
             the business data), not with idem; docs/stores.md, \"Backups\""
        ),
    };
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

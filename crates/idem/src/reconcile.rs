//! `idem reconcile --once`: one reconciliation pass over the store's
//! ambiguous records, with the lookups of a gateway config file, for cron
//! jobs and for an operator who does not want to wait for the next scan.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use idem_gateway::{GatewayConfig, Overrides};
use idem_http::Metrics;

use crate::records::Format;
use crate::store_url::StoreUrl;

/// `idem reconcile`.
#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Run one pass and exit (the only mode; `idem serve` runs it continuously).
    #[arg(long, required = true)]
    once: bool,
    /// The gateway config file that declares the routes and their [[lookup]]s.
    #[arg(long)]
    config: PathBuf,
    /// Store URL; default: the config file's, else sqlite://idem.db.
    #[arg(long)]
    store: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// Runs one pass; exits 1 when a lookup or the store failed.
pub async fn run(args: ReconcileArgs) -> anyhow::Result<()> {
    let overrides = Overrides {
        store: args.store,
        ..Overrides::default()
    };
    // The reconciler talks to the lookup URLs, never to the upstream.
    let config = GatewayConfig::load_offline(&args.config, &overrides)?;
    let url = StoreUrl::parse(&config.store)?;
    let store = url.open()?;
    let Some(reconciler) = idem_gateway::reconciler(&config, store, Arc::new(Metrics::default()))
    else {
        bail!(
            "{} declares no [[lookup]]; nothing can be reconciled automatically \
             (resolve by hand with `idem records resolve`)",
            args.config.display()
        );
    };
    let report = reconciler.run_once().await;
    match args.format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report).context("report")?
        ),
        Format::Table => println!("{report}"),
    }
    if report.errors > 0 {
        bail!(
            "{} lookups or store operations failed; see the log",
            report.errors
        );
    }
    Ok(())
}

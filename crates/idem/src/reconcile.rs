//! `idem reconcile --once`: one reconciliation pass over the store's
//! ambiguous records, with the lookups of a gateway config file, for cron
//! jobs and for an operator who does not want to wait for the next scan.
//! Its exit code is what a cron job alerts on.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use idem_gateway::{GatewayConfig, Overrides};
use idem_http::Metrics;
use idem_reconcile::{ReconcileReport, Reconciler};

use crate::records::Format;
use crate::store_url::OpenStore;

/// `idem reconcile`.
#[derive(Debug, Args)]
#[command(
    after_help = "Exit status: 0 when every due record was resolved or there was \
nothing to do; 1 when something needs attention (a lookup failed, a record is left for an \
operator after max_tries or for lack of a lookup, the store failed during the pass, or holds \
rows it cannot read); 2 when the pass could not run (config, store URL, no such store)."
)]
pub struct ReconcileArgs {
    /// Run one pass and exit (the only mode; `idem serve` runs it continuously).
    #[arg(long, required = true)]
    once: bool,
    /// The gateway config file that declares the routes and their [[lookup]]s.
    #[arg(long)]
    config: PathBuf,
    /// Store URL of an existing store; default: the config file's `store`
    /// (a relative sqlite://PATH there is read against the file's
    /// directory), else sqlite://idem.db. A relative path given here is
    /// read against the working directory.
    #[arg(long)]
    store: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// The pass could not run at all: nothing was asked or changed.
const CANNOT_RUN: u8 = 2;
/// The pass ran and left something for a person (see
/// [`ReconcileReport::needs_attention`]).
const NEEDS_ATTENTION: u8 = 1;

/// Runs one pass, prints its report and returns the exit status: 0 nothing
/// needs attention, 1 something does, 2 the pass could not run.
pub async fn run(args: ReconcileArgs) -> ExitCode {
    let reconciler = match prepare(&args) {
        Ok(reconciler) => reconciler,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(CANNOT_RUN);
        }
    };
    let report = reconciler.run_once().await;
    if let Err(e) = print(&report, args.format) {
        eprintln!("error: {e:#}");
        return ExitCode::from(NEEDS_ATTENTION);
    }
    if report.needs_attention() {
        eprintln!(
            "needs attention: {} lookups failed, {} records left for an operator, \
             {} store errors, {} damaged rows; see the log",
            report.retried,
            report.gave_up.saturating_add(report.no_lookup),
            report.errors,
            report.damaged
        );
        return ExitCode::from(NEEDS_ATTENTION);
    }
    ExitCode::SUCCESS
}

/// The reconciler the config declares, over the existing store.
fn prepare(args: &ReconcileArgs) -> anyhow::Result<Reconciler> {
    let overrides = Overrides {
        store: args.store.clone(),
        ..Overrides::default()
    };
    // The reconciler talks to the lookup URLs, never to the upstream.
    let config = GatewayConfig::load_offline(&args.config, &overrides)?;
    let url = &config.store;
    // A mistyped store must not look like a store with nothing to do.
    let Some(store) = url.open_existing()? else {
        let (flag, file) = (args.store.as_deref(), Some(args.config.as_path()));
        return Err(url.no_store(flag, file).into());
    };
    url.log_opened();
    let Some(reconciler) = idem_gateway::reconciler(&config, store, Arc::new(Metrics::default()))
    else {
        bail!(
            "{} declares no [[lookup]]; nothing can be reconciled automatically \
             (resolve by hand with `idem records resolve`)",
            args.config.display()
        );
    };
    Ok(reconciler)
}

fn print(report: &ReconcileReport, format: Format) -> anyhow::Result<()> {
    match format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(report).context("report")?
        ),
        Format::Table => println!("{report}"),
    }
    Ok(())
}

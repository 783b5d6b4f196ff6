//! `idem consume`: loads the consumer config, judges each subscription's
//! contract, opens the store and the brokers, and consumes until SIGTERM
//! (or a broker that fails for good), then settles the messages in hand
//! and exits.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use idem_consumer::config::ConsumeConfig;

use crate::store_url::{self, Checked, OpenStore};

/// `idem consume`.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// TOML file declaring the store, the subscriptions (broker, key
    /// template, endpoint, policy), [[lookup]] and [reconcile]; see
    /// docs/consumers.md.
    #[arg(long)]
    config: PathBuf,
    /// Store URL; wins over the file's `store`. A relative
    /// sqlite://PATH here is read against the working directory, one in
    /// the file against the file's directory.
    #[arg(long)]
    store: Option<String>,
    /// Start even when a subscription fails `idem check --consumer`: its
    /// contract, the cross-checks against what it enforces, or a key built
    /// from the message id (each failure is logged as an error).
    #[arg(long)]
    allow_unsafe_contract: bool,
    /// Load and check the whole configuration (every field, the
    /// subscriptions' contracts and key sources, the store's SQLite file),
    /// print what would be consumed and what was not checked, and exit: 0
    /// when `idem consume` would start with it, 1 when not. Creates no
    /// store, binds no address, connects to no broker or server.
    #[arg(long)]
    check: bool,
}

/// Runs the consumer.
pub async fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let mut config = ConsumeConfig::load(&args.config)?;
    if let Some(store) = &args.store {
        config.store = store_url::from_flag(store)?;
    }
    judge_contracts(&config, args.allow_unsafe_contract)?;
    // The same check with --check or without, so that a check that passes
    // leaves a start only what needs an address or a server.
    let checked = config
        .store
        .check_local()
        .with_context(|| store_url::field(args.store.as_deref(), Some(&args.config)))?;
    if args.check {
        print_plan(&config, checked);
        print_unchecked(&config, checked);
        return Ok(());
    }
    // A PostgreSQL store found on a promoted server opens the suspect
    // window for the longest retention of the subscriptions, as a
    // gateway's does by default.
    let suspect_window_ms = config
        .subscriptions
        .iter()
        .map(|s| s.policy.retention_s().saturating_mul(1000))
        .max()
        .unwrap_or(0);
    let store = config.store.open_serving(&[], suspect_window_ms)?;
    config.store.log_opened();
    tracing::info!(store = %config.store, subscriptions = config.subscriptions.len(), "idem consume starting");
    let probes = match config.probe_listen {
        None => None,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (probe_listen)"))?;
            let probe_addr = listener
                .local_addr()
                .context("cannot read the probes' address")?;
            tracing::info!(%probe_addr, "probes listening: GET /healthz, GET /readyz");
            Some(listener)
        }
    };
    let report = idem_consumer::run::run(&config, store, probes, idem_gateway::shutdown_signal())
        .await
        .map_err(|e| {
            // A broker error about a field of the file names both, as a
            // config error does.
            let message = match e.field() {
                Some(field) => format!("{}: {field}: {e}", args.config.display()),
                None => e.to_string(),
            };
            let when = if e.started() {
                "idem consume stopped: a broker failed for good"
            } else {
                "idem consume cannot start"
            };
            anyhow::Error::msg(message).context(when)
        })?;
    for (name, counts) in report {
        tracing::info!(subscription = %name, acked = counts.acked, retried = counts.retried,
            dead_lettered = counts.dead_lettered, late = counts.late,
            settle_failed = counts.settle_failed, "stopped; every message in hand was settled");
    }
    Ok(())
}

/// What `idem consume --check` prints: the store (password masked) and
/// what is there, and each subscription: what it reads, its key, where it
/// delivers.
fn print_plan(config: &ConsumeConfig, checked: Checked) {
    println!("idem consume would start with this configuration:");
    println!("  store          {} ({checked})", config.store);
    println!("  subscriptions  {}", config.subscriptions.len());
    for sub in &config.subscriptions {
        println!(
            "    {:?}: {}, key {:?}, delivered to {}, {} at once, lease {} ms, retention {} s",
            sub.name,
            sub.broker.describe(),
            sub.intent.key().as_str(),
            sub.deliver,
            sub.concurrency,
            sub.policy.lease_ms(),
            sub.policy.retention_s(),
        );
    }
    println!("  lookups        {}", config.lookups.len());
}

/// What `idem consume --check` prints of what it did not check: what only
/// binding an address or reaching a server tells.
fn print_unchecked(config: &ConsumeConfig, checked: Checked) {
    println!("not checked:");
    if let Some(addr) = config.probe_listen {
        println!("  bind       probe_listen {addr} (a start binds it)");
    }
    store_url::print_unchecked(checked);
    for sub in &config.subscriptions {
        println!(
            "  connect    subscription {:?}: {} (a start connects, and finds or declares \
             what it names)",
            sub.name,
            sub.broker.describe()
        );
    }
    println!(
        "  reach      the endpoints, {} lookups (asked first by a message or a scan, not at start)",
        config.lookups.len()
    );
}

/// Refuses to start when a subscription's contract fails `idem check` or
/// its cross-checks, or its key names the message rather than the intent,
/// unless told otherwise; then every failure is logged as an error.
fn judge_contracts(config: &ConsumeConfig, allow_unsafe: bool) -> anyhow::Result<()> {
    let mut lines = Vec::new();
    for sub in &config.subscriptions {
        let key = idem_consumer::contracts::key_source(sub);
        if !key.verdict.passed() {
            lines.push(format!(
                "subscription {:?}: {} {}: {}",
                sub.name,
                key.verdict.as_str(),
                key.topic,
                key.why
            ));
        }
    }
    for c in idem_consumer::contracts::evaluate(config) {
        if !c.passed() {
            lines.push(format!(
                "subscription {:?}: contract {} fails:",
                c.subscription,
                c.path.display()
            ));
            lines.extend(c.failures().into_iter().map(|f| format!("  {f}")));
        }
    }
    if lines.is_empty() {
        return Ok(());
    }
    if !allow_unsafe {
        anyhow::bail!(
            "refusing to start: {}\n(run `idem check --consumer CONFIG` for the full report; \
             --allow-unsafe-contract starts anyway)",
            lines.join("\n")
        );
    }
    for line in &lines {
        tracing::error!("{line}");
    }
    Ok(())
}

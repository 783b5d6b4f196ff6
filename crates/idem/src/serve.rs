//! `idem serve`: loads the configuration, opens the store, binds, and runs
//! the gateway until SIGTERM.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use idem_gateway::{GatewayConfig, Overrides};

use crate::store_url::StoreUrl;

/// `idem serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long)]
    listen: Option<String>,
    /// Base URL of the upstream API, e.g. http://127.0.0.1:9000.
    #[arg(long)]
    upstream: Option<String>,
    /// Store URL [default: sqlite://idem.db].
    #[arg(long)]
    store: Option<String>,
    /// TOML file declaring routes and settings; command-line values win.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Runs the gateway.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let overrides = Overrides {
        listen: args.listen,
        upstream: args.upstream,
        store: args.store,
    };
    let config = GatewayConfig::load(args.config.as_deref(), &overrides)?;
    let url = StoreUrl::parse(&config.store)?;
    let store = url.open()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let local_addr = listener
        .local_addr()
        .context("cannot read the bound address")?;
    tracing::info!(
        %local_addr,
        upstream = %config.upstream,
        store = %url,
        routes = config.routes.len(),
        "idem gateway listening"
    );
    idem_gateway::serve(&config, store, listener, idem_gateway::shutdown_signal())
        .await
        .context("the gateway stopped with an error")?;
    tracing::info!("stopped; every in-flight request finished");
    Ok(())
}

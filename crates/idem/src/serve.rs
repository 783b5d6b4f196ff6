//! `idem serve`: loads the configuration, opens the store, binds the proxy
//! and (when configured) the admin API, and runs the gateway until SIGTERM.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use idem_gateway::regions::RegionMode;
use idem_gateway::{AdminListener, GatewayConfig, Overrides, ServeOptions};
use idem_http::PrincipalKind;

use crate::store_url::{self, Checked, OpenStore};

/// `idem serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long)]
    listen: Option<String>,
    /// Base URL of the upstream API, e.g. http://127.0.0.1:9000 or
    /// https://payouts.internal (its certificate is verified against the
    /// system's roots and --upstream-ca-file's).
    #[arg(long)]
    upstream: Option<String>,
    /// PEM file of CA certificates an https:// upstream's certificate may
    /// chain to, besides the system's (a private CA) [config:
    /// upstream_ca_file].
    #[arg(long, value_name = "PEM")]
    upstream_ca_file: Option<PathBuf>,
    /// Store URL [default: sqlite://idem.db], or
    /// postgres://USER@HOST:PORT/DB?schema=NAME&operation_timeout_ms=N&…
    /// (idem's PostgreSQL parameters: schema, pool_size, connect_timeout_ms,
    /// statement_timeout_ms, operation_timeout_ms), or
    /// dynamodb://TABLE?region=REGION[&endpoint=URL][&clock_skew_ms=N] (a
    /// table made by `idem store init`; AWS's standard credential chain). A relative
    /// sqlite://PATH here, and the default, are read against the working
    /// directory; the config file's `store` against the file's directory.
    #[arg(long)]
    store: Option<String>,
    /// TOML file declaring routes and settings; command-line values win.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address of the admin API, e.g. 127.0.0.1:9090 [default: off], and of
    /// its browser console at /ui. Its bearer token (the console's sign-in)
    /// is read from $IDEM_ADMIN_TOKEN (or admin_token_env) as operator
    /// "admin"; [[admin.operator]] names more operators, one token each.
    #[arg(long)]
    admin_listen: Option<String>,
    /// PEM certificate chain (leaf first) the admin API serves HTTPS with;
    /// needs --admin-tls-key-file [config: admin_tls_cert_file; default:
    /// plain HTTP].
    #[arg(long, value_name = "PEM")]
    admin_tls_cert_file: Option<PathBuf>,
    /// PEM private key of --admin-tls-cert-file [config: admin_tls_key_file].
    #[arg(long, value_name = "PEM")]
    admin_tls_key_file: Option<PathBuf>,
    /// Start even when a route's contract file fails `idem check` (each
    /// failure is logged as an error). Without it such a gateway refuses to start.
    #[arg(long)]
    allow_unsafe_contract: bool,
    /// Load and check the whole configuration (every field, the routes'
    /// contracts, the TLS files, the admin token's variable, the store's
    /// SQLite file and whether routes in `synchronous` mode have a
    /// replicated store), print what would be served and what was not
    /// checked, and exit: 0 when `idem serve` would start with it, 1 when
    /// not. Creates no store, binds no address, reaches no server.
    #[arg(long)]
    check: bool,
}

/// Runs the gateway.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let overrides = Overrides {
        listen: args.listen,
        upstream: args.upstream,
        store: args.store,
        upstream_ca_file: args.upstream_ca_file,
        admin_tls_cert_file: args.admin_tls_cert_file,
        admin_tls_key_file: args.admin_tls_key_file,
    };
    let mut config = GatewayConfig::load(args.config.as_deref(), &overrides)?;
    if let Some(addr) = &args.admin_listen {
        config.set_admin_listen(addr)?;
    }
    // The token is checked before anything is opened or bound: a gateway
    // whose admin API cannot start does not start at all.
    let admin_token = match config.admin_listen {
        Some(_) => Some(config.operators(|name| std::env::var(name).ok())?),
        None if config.admin_tls.is_some() => anyhow::bail!(
            "admin_tls_cert_file: the admin API is off, so its certificate would serve \
             nothing; set admin_listen (or --admin-listen), or remove the admin TLS files"
        ),
        None => None,
    };
    raise_descriptor_limit(&config);
    judge_contracts(&config, args.allow_unsafe_contract)?;
    warn_fragile_principals(&config);
    let url = &config.store;
    // The same checks with --check or without, so that a check that
    // passes leaves a start only what needs an address or a server.
    let store_field = store_url::field(overrides.store.as_deref(), args.config.as_deref());
    let (synchronous, checked) = check_store(&config, args.config.as_deref(), &store_field)?;
    if args.check {
        print_plan(&config, checked);
        print_unchecked(&config, checked);
        return Ok(());
    }
    let suspect_window_ms = u64::try_from(config.suspect_window.as_millis()).unwrap_or(u64::MAX);
    let store = url.open_serving(&synchronous, suspect_window_ms)?;
    url.log_opened();
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let local_addr = listener
        .local_addr()
        .context("cannot read the bound address")?;
    let admin = match (config.admin_listen, admin_token) {
        (Some(addr), Some(token)) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (admin_listen)"))?;
            Some(AdminListener {
                listener,
                operators: token,
                tls: config.admin_tls.clone(),
                mount: Some(idem_console::mount(config.console_sessions)),
            })
        }
        _ => None,
    };
    tracing::info!(
        %local_addr,
        tls = config.listen_tls.is_some(),
        probe_paths = config.probe_paths,
        upstream = %config.upstream,
        store = %url,
        routes = config.routes.len(),
        purge_interval_s = config.purge_interval.as_secs(),
        "idem gateway listening"
    );
    if let Some(admin) = &admin {
        let admin_addr = admin
            .listener
            .local_addr()
            .context("cannot read the admin API's bound address")?;
        tracing::info!(
            %admin_addr,
            transport = ?admin.transport(),
            operators = ?admin.operators.names().map(|n| n.as_str()).collect::<Vec<_>>(),
            operator_header = ?admin.operators.header(),
            "admin API listening"
        );
    }
    let options = ServeOptions {
        metrics: Some(Arc::default()),
        admin,
    };
    idem_gateway::serve_with(
        &config,
        store,
        listener,
        options,
        idem_gateway::shutdown_signal(),
    )
    .await
    .context("the gateway stopped with an error")?;
    tracing::info!("stopped; every in-flight request finished");
    Ok(())
}

/// What a start checks of the store before it opens it, and `--check`
/// too: `synchronous` routes on one SQLite file, then the file itself
/// ([`OpenStore::check_local`]); each error names the file and the field,
/// as the config's do. Returns the names of the `synchronous` routes, whose
/// PostgreSQL server opening checks, and what was found.
fn check_store(
    config: &GatewayConfig,
    file: Option<&Path>,
    store_field: &str,
) -> anyhow::Result<(Vec<String>, Checked)> {
    let synchronous: Vec<(usize, String)> = config
        .routes
        .iter()
        .zip(&config.route_regions)
        .enumerate()
        .filter(|(_, (_, mode))| **mode == RegionMode::Synchronous)
        .map(|(i, (route, _))| {
            (
                i,
                format!("{:?}", idem_gateway::contracts::route_name(route)),
            )
        })
        .collect();
    let names: Vec<String> = synchronous.iter().map(|(_, name)| name.clone()).collect();
    if let Some((first, _)) = synchronous.first() {
        // Routes come from a file only.
        let file = file.map_or_else(String::new, |path| format!("{}: ", path.display()));
        config
            .store
            .check_replicated(&names)
            .with_context(|| format!("{file}route[{first}].regions.mode"))?;
    }
    let checked = config
        .store
        .check_local()
        .with_context(|| store_field.to_owned())?;
    Ok((names, checked))
}

/// What `idem serve --check` prints: the listeners, the upstream, the
/// store (password masked) and what is there, and each route as it will
/// be enforced.
fn print_plan(config: &GatewayConfig, checked: Checked) {
    println!("idem serve would start with this configuration:");
    let scheme = if config.listen_tls.is_some() {
        "https"
    } else {
        "http"
    };
    println!("  listen     {scheme}://{}", config.listen);
    let ca = match &config.upstream_tls {
        Some(_) => " (TLS: the system's roots and upstream_ca_file's)",
        None => "",
    };
    println!("  upstream   {}{ca}", config.upstream);
    println!("  store      {} ({checked})", config.store);
    match config.admin_listen {
        Some(addr) => {
            let scheme = if config.admin_tls.is_some() {
                "https"
            } else {
                "http"
            };
            let ops = &config.admin_operators;
            let mut who: Vec<String> = Vec::new();
            if ops.single {
                who.push(format!("admin from ${}", config.admin_token_env));
            }
            who.extend(
                ops.named
                    .iter()
                    .map(|(name, env)| format!("{name} from ${env}")),
            );
            if let Some(header) = &ops.header {
                who.push(format!("named by the proxy in {header}"));
            }
            println!(
                "  admin      {scheme}://{addr} (operators: {}; console at /ui)",
                who.join(", ")
            );
        }
        None => println!("  admin      off"),
    }
    println!("  routes     {}", config.routes.len());
    for (route, mode) in config.routes.iter().zip(&config.route_regions) {
        let methods: Vec<&str> = route.methods().iter().map(|m| m.as_str()).collect();
        let policy = route.policy();
        println!(
            "    {:?}: {} {}, key from {}, principal {:?}, lease {} ms, retention {} s, regions {mode:?}{}",
            idem_gateway::contracts::route_name(route),
            methods.join(","),
            route.pattern().as_str(),
            route.key_header(),
            route.principal_kind(),
            policy.lease_ms(),
            policy.retention_s(),
            route
                .contract()
                .map(|c| format!(", contract {}", c.display()))
                .unwrap_or_default(),
        );
    }
    println!("  lookups    {}", config.lookups.len());
}

/// What `idem serve --check` prints of what it did not check: what only
/// binding an address or reaching a server tells.
fn print_unchecked(config: &GatewayConfig, checked: Checked) {
    println!("not checked:");
    println!("  bind       listen {} (a start binds it)", config.listen);
    if let Some(addr) = config.admin_listen {
        println!("  bind       admin_listen {addr} (a start binds it)");
    }
    store_url::print_unchecked(checked);
    println!(
        "  reach      upstream {}, {} lookups, {} peers (asked first by a request or a scan, \
         not at start)",
        config.upstream,
        config.lookups.len(),
        config.peers.len()
    );
}

/// One warning per route whose declared principal is a digest of raw
/// credentials: there a refreshed token executes the same intent again.
/// (A route that declares none is named by the layer itself.)
fn warn_fragile_principals(config: &GatewayConfig) {
    for route in &config.routes {
        if route.principal_kind() == PrincipalKind::CredentialDigest {
            tracing::warn!(
                route = idem_gateway::contracts::route_name(route),
                "principal is a digest of raw credential headers (fragile: a refreshed token \
                 is a new scope and executes again); declare principal = {{ header = ... }} \
                 or {{ jwt = ... }}"
            );
        }
    }
}

/// Refuses to start when a route's contract fails, unless told otherwise;
/// then every failure is logged as an error, loudly, at each start.
fn judge_contracts(config: &GatewayConfig, allow_unsafe: bool) -> anyhow::Result<()> {
    let failing: Vec<_> = idem_gateway::contracts::evaluate(config)
        .into_iter()
        .filter(|c| !c.passed())
        .collect();
    if failing.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = failing
        .iter()
        .flat_map(|c| {
            let head = format!("route {:?}: contract {} fails:", c.route, c.path.display());
            std::iter::once(head).chain(c.failures().into_iter().map(|f| format!("  {f}")))
        })
        .collect();
    if !allow_unsafe {
        anyhow::bail!(
            "refusing to start: {}\n(run `idem check --gateway CONFIG` for the full report; \
             --allow-unsafe-contract starts anyway)",
            lines.join("\n")
        );
    }
    for line in &lines {
        tracing::error!("UNSAFE CONTRACT, started anyway with --allow-unsafe-contract: {line}");
    }
    Ok(())
}

/// Raises the soft limit on open descriptors to the hard one: every
/// connection costs one, and the listeners' caps (`connections_max`,
/// `admin_connections_max`), not a low soft limit, are meant to bound them.
/// Logs the limit in force, and warns when it is below what the caps need.
fn raise_descriptor_limit(config: &GatewayConfig) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let before = getrlimit(Resource::Nofile);
    let wanted = Rlimit {
        current: before.maximum,
        maximum: before.maximum,
    };
    let raised = before.current != before.maximum && setrlimit(Resource::Nofile, wanted).is_ok();
    let now = getrlimit(Resource::Nofile);
    let show = |limit: Option<u64>| limit.map_or("unlimited".to_owned(), |n| n.to_string());
    tracing::info!(
        soft = %show(now.current),
        hard = %show(now.maximum),
        raised,
        "open file descriptor limit (RLIMIT_NOFILE)"
    );
    let needed = config.connections.connections_max
        + config
            .admin_listen
            .map_or(0, |_| config.admin_connections.connections_max);
    if now.current.is_some_and(|soft| soft < needed as u64) {
        tracing::warn!(
            soft = %show(now.current),
            connections = needed,
            "the descriptor limit is below connections_max + admin_connections_max: \
             accepting may fail before the caps are reached; raise the hard limit \
             (ulimit -Hn, LimitNOFILE=) or lower the caps"
        );
    }
}

//! Runs the gateway: serves the layered proxy, the admin API and the
//! routes its caller mounts beside it (when configured, over TLS when it
//! has a certificate) on their own listeners (`listen`: every phase of a connection bounded, each
//! listener's connections capped) and the retention purge, and on SIGTERM
//! or SIGINT stops accepting and lets in-flight requests finish and be
//! recorded. A request takes one of `requests_in_flight_max` slots only
//! once its body is in (`admission`), and gives it back while it waits
//! for another attempt (`in_flight`); beyond them it is shed at once,
//! nothing claimed or forwarded, so a burst of large bodies cannot exhaust
//! memory and a slow buffered body holds no slot (a body that streams to
//! the upstream holds one, within `response_timeout_ms`). A store that stopped for good
//! (`StoreError::Stopped`) stops the gateway the same way, with an error,
//! so that its process exits and a supervisor restarts it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use idem_core::{Store, SystemClock, WindowWatch};
use idem_http::{IdempotencyLayer, Metrics, Resolver, Route, VerifyFresh};
use idem_reconcile::Reconciler;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::{Layer, ServiceBuilder};

use crate::admin::{self, Operators, RefusalLog};
use crate::admission::Admission;
use crate::config::PROBE_PATHS;
use crate::in_flight::InFlight;
use crate::regions::{self, HomeSource, RegionGate, RegionMode};
use crate::tls::AdminTransport;
use crate::{GatewayConfig, HopByHop, Proxy};
use idem_process::ServerTls;
use idem_process::listen::{self, Transport};
use idem_process::probe::{self, Probes};
use idem_process::{Watched, run_purge};

/// What runs next to the proxy: shared metrics and the admin API.
#[derive(Debug, Default)]
pub struct ServeOptions {
    /// The metrics every part counts into; fresh ones if `None`.
    pub metrics: Option<Arc<Metrics>>,
    /// The admin API's listener and operators; no admin API if `None`.
    pub admin: Option<AdminListener>,
}

/// The admin API's own listener and the operators it lets in.
pub struct AdminListener {
    /// Bound by the caller, so that it can report the address.
    pub listener: TcpListener,
    /// Who may use it: named bearer tokens, a trusted proxy's header
    /// (`Operators::from(token)` for the single token of old configs).
    pub operators: Operators,
    /// The certificate it serves TLS with; `None`: plain HTTP.
    pub tls: Option<ServerTls>,
    /// Routes served beside the admin API (the binary's console). They
    /// authenticate by themselves and bring no fallback of their own (see
    /// [`admin::router`]); `None`: the admin API alone.
    pub mount: Option<AdminMount>,
}

/// Makes the routes served beside the admin API, once, when the gateway
/// starts serving.
pub type AdminMount = Box<dyn FnOnce(AdminParts) -> axum::Router + Send>;

/// What routes mounted beside the admin API work with: the same store,
/// metrics and operators as the admin API, the config's routes, how the
/// listener speaks, and the admin API's refusal log.
#[derive(Clone)]
#[non_exhaustive]
pub struct AdminParts {
    /// The store the admin API reads and resolves.
    pub store: Arc<dyn Store>,
    /// The metrics every part counts into.
    pub metrics: Arc<Metrics>,
    /// The admin API's operators.
    pub operators: Operators,
    /// The config's routes.
    pub routes: Vec<Route>,
    /// Whether the listener speaks TLS.
    pub transport: AdminTransport,
    /// Shared with the admin API: refusals logged through it spend one
    /// budget.
    pub refusals: RefusalLog,
    /// The gateway's reconciler, when a route has a lookup: an operator
    /// may ask it to settle one record now.
    pub reconciler: Option<Arc<Reconciler>>,
}

impl std::fmt::Debug for AdminListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminListener")
            .field("listener", &self.listener)
            .field("operators", &self.operators)
            .field("tls", &self.tls)
            .field("mount", &self.mount.is_some())
            .finish()
    }
}

impl AdminListener {
    /// Whether the admin API is served over TLS.
    pub fn transport(&self) -> AdminTransport {
        AdminTransport::of(self.tls.as_ref())
    }
}

/// Serves `config` on `listener` until `shutdown` resolves, then drains;
/// the retention purge runs alongside. No admin API.
pub async fn serve(
    config: &GatewayConfig,
    store: Arc<dyn Store>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(config, store, listener, ServeOptions::default(), shutdown).await
}

/// [`serve`], plus the admin API and shared metrics of `options`. On
/// `shutdown` the proxy drains its in-flight requests, the admin API
/// finishes its own, and the purge stops between two batches.
///
/// The same happens when the store answers any operation with
/// [`idem_core::StoreError::Stopped`] (it cannot work again in this
/// process); the error is logged at once and returned after the drain.
pub async fn serve_with(
    config: &GatewayConfig,
    store: Arc<dyn Store>,
    listener: TcpListener,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let metrics = options.metrics.unwrap_or_default();
    let (store, store_seen) = Watched::new(store);
    let store: Arc<dyn Store> = Arc::new(store);
    let (layer, reconciler, window) = protect(config, &store, &metrics).await?;
    // Dropping the sender stops everything as surely as sending `true`:
    // the proxy's shutdown future owns it.
    let (stop_tx, stop_rx) = watch::channel(false);
    let probes = Arc::new(Probes::new(
        store.clone(),
        metrics.clone(),
        reconciler.clone(),
    ));
    let background = Background::start(
        config,
        &store,
        &metrics,
        reconciler.clone(),
        window,
        &stop_rx,
    );
    // A request in flight has its whole exchange, and then the grace.
    let drain = config.response_timeout + Duration::from_millis(listen::DRAIN_GRACE_MS);
    let admin = options.admin.map(|admin| {
        let shared = (store.clone(), metrics.clone(), probes.clone());
        let ask = reconciler.clone();
        serve_admin(
            config,
            (admin, ask),
            shared,
            drain,
            stopped(stop_rx.clone()),
        )
    });
    let attempts = layer.attempts();
    let admitted = proxy_service(config, layer, &store, metrics);
    let shutdown = stop_on(shutdown, idem_process::stopped(store_seen.clone()), stop_tx);
    let served = serve_proxy(config, listener, admitted, probes, drain, shutdown).await;
    finish_attempts(config, &attempts).await;
    background.finish().await;
    let admin_served = match admin {
        Some(task) => task.await.unwrap_or_else(|e| Err(std::io::Error::other(e))),
        None => Ok(()),
    };
    if let Some(e) = store_seen.borrow().clone() {
        return Err(std::io::Error::other(e));
    }
    served.and(admin_served)
}

/// Waits, once the proxy has drained its connections, for the attempts
/// that went on without their client (`Prefer: respond-async`, or a client
/// that hung up): stopping now would cut each mid-forward and leave its
/// key with an unknown outcome. Each ends by its lease, so the wait is
/// bounded by the longest lease of the routes, plus the drain's grace.
async fn finish_attempts(config: &GatewayConfig, attempts: &idem_http::Attempts) {
    let running = attempts.running();
    if running == 0 {
        return;
    }
    let lease_ms = config
        .routes
        .iter()
        .map(|route| route.policy().lease_ms())
        .max()
        .unwrap_or(0);
    let bound = Duration::from_millis(lease_ms.saturating_add(listen::DRAIN_GRACE_MS));
    tracing::info!(
        running,
        bound_ms = bound.as_millis() as u64,
        "waiting for attempts that go on without their client (respond-async, or a client \
         that hung up); each ends by its lease"
    );
    if tokio::time::timeout(bound, attempts.finished())
        .await
        .is_err()
    {
        tracing::warn!(
            running = attempts.running(),
            "attempts still running at exit: their keys turn ambiguous when their leases end"
        );
    }
}

/// The layer every proxied request goes through, with its region, gate,
/// reconciler and suspect window; built before anything starts, so that
/// a region the config check missed (a hand-built config) stops nothing
/// half-started.
async fn protect(
    config: &GatewayConfig,
    store: &Arc<dyn Store>,
    metrics: &Arc<Metrics>,
) -> std::io::Result<(IdempotencyLayer, Option<Arc<Reconciler>>, Arc<WindowWatch>)> {
    let mut layer = IdempotencyLayer::new(store.clone(), config.routes.clone())
        .with_owner(config.owner.clone())
        .with_metrics(metrics.clone())
        .with_wait_limits(config.wait_limits);
    if let Some(base) = &config.problem_type_base {
        layer = layer.with_problem_type_base(base.clone());
    }
    if let Some(region) = &config.region {
        layer = layer.with_region(region.clone()).map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("region: {e}"))
        })?;
    }
    if let Some(gate) = RegionGate::new(
        &config.regions(),
        &config.route_regions,
        config.connect_timeout,
        config.response_timeout,
    ) {
        layer = layer.with_gate(gate);
    }
    // One reconciler: its scans, and the lookups of retries that meet an
    // ambiguous record of a route with a lookup.
    let reconciler = reconciler(config, store.clone(), metrics.clone()).map(Arc::new);
    if let Some(reconciler) = &reconciler {
        layer = layer.with_settle_on_retry(reconciler.clone());
    }
    // The suspect window, as the store keeps it: read now, refreshed every
    // second, and at once when the store opens one itself.
    let window = idem_reconcile::window::watch(&**store).await;
    let verifier = reconciler.clone().map(|r| r as Arc<dyn VerifyFresh>);
    layer = layer.with_suspect_window(window.clone(), verifier);
    Ok((layer, reconciler, window))
}

/// The tasks beside the listeners: the purge, the gauges' store sampler,
/// the reconciler's scans and the suspect window's refresh, each stopped with the proxy.
struct Background {
    purge: JoinHandle<()>,
    gauges: JoinHandle<()>,
    reconciler: Option<JoinHandle<()>>,
    window_refresh: JoinHandle<()>,
}

impl Background {
    fn start(
        config: &GatewayConfig,
        store: &Arc<dyn Store>,
        metrics: &Arc<Metrics>,
        reconciler: Option<Arc<Reconciler>>,
        window: Arc<WindowWatch>,
        stop: &watch::Receiver<bool>,
    ) -> Background {
        let purge = tokio::spawn(run_purge(
            store.clone(),
            metrics.clone(),
            config.purge_interval,
            stop.clone(),
        ));
        let gauges = tokio::spawn(idem_process::gauges::run(
            store.clone(),
            metrics.clone(),
            idem_process::gauges::GaugeGroups::Whole,
            config.gauge_sample_interval,
            stop.clone(),
        ));
        let reconciler = reconciler.map(|reconciler| {
            let stop = stopped(stop.clone());
            tokio::spawn(async move { reconciler.run(stop).await })
        });
        let window_refresh = tokio::spawn(idem_reconcile::window::keep_current(
            store.clone(),
            window,
            stopped(stop.clone()),
        ));
        Background {
            purge,
            gauges,
            reconciler,
            window_refresh,
        }
    }

    /// Waits for each task to end, logging one that failed.
    async fn finish(self) {
        if let Err(e) = self.purge.await {
            tracing::error!(error = %e, "the retention purge task failed");
        }
        if let Err(e) = self.gauges.await {
            tracing::error!(error = %e, "the gauges' store sampler failed");
        }
        if let Err(e) = self.window_refresh.await {
            tracing::error!(error = %e, "the suspect window's refresh task failed");
        }
        if let Some(Err(e)) = match self.reconciler {
            Some(task) => Some(task.await),
            None => None,
        } {
            tracing::error!(error = %e, "the reconciler task failed");
        }
    }
}

/// Serves the admin API, the probes and what the caller mounts on the
/// admin listener, until `stop`.
fn serve_admin(
    config: &GatewayConfig,
    (admin, reconciler): (AdminListener, Option<Arc<Reconciler>>),
    (store, metrics, probes): (Arc<dyn Store>, Arc<Metrics>, Arc<Probes>),
    drain: Duration,
    stop: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<std::io::Result<()>> {
    let parts = AdminParts {
        store: store.clone(),
        metrics: metrics.clone(),
        operators: admin.operators.clone(),
        routes: config.routes.clone(),
        transport: admin.transport(),
        refusals: RefusalLog::default(),
        reconciler,
    };
    let api = admin::router(store, metrics, admin.operators, parts.refusals.clone());
    // Mounted routes authenticate by themselves; the admin API's
    // fallback answers every path they do not serve.
    let api = api.merge(probe::router(probes));
    let app = match admin.mount {
        Some(mount) => mount(parts).merge(api),
        None => api,
    };
    let transport = match &admin.tls {
        Some(tls) => Transport::Tls(tls.acceptor()),
        None => Transport::Plain,
    };
    tokio::spawn(listen::serve(
        "admin",
        admin.listener,
        transport,
        app,
        (config.admin_connections, drain),
        stop,
    ))
}

/// The proxy behind its edges: hop-by-hop headers stripped, the layer,
/// the in-flight limit and admission.
fn proxy_service(
    config: &GatewayConfig,
    layer: IdempotencyLayer,
    store: &Arc<dyn Store>,
    metrics: Arc<Metrics>,
) -> impl listen::App + Sync {
    let proxy = match &config.upstream_tls {
        Some(tls) => Proxy::with_tls(
            config.upstream.clone(),
            config.connect_timeout,
            config.response_timeout,
            tls,
        ),
        None => Proxy::new(
            config.upstream.clone(),
            config.connect_timeout,
            config.response_timeout,
        ),
    };
    // Hop-by-hop headers go before the layer reads the request: removed
    // after it, they could take the key the layer forwards with them.
    let edge = HopByHop::keeping(&config.routes, &home_headers(&config.route_regions));
    // Completions on other gateways sharing the store wake this one's
    // waiters (PostgreSQL notifies the keys someone waits on).
    let waker = layer.clone();
    store.on_completed(Arc::new(move |id| waker.wake(id)));
    let admission_metrics = metrics.clone();
    let layered = ServiceBuilder::new()
        .map_request(move |mut req: Request<axum::body::Body>| {
            edge.strip_request(req.headers_mut());
            let (mut parts, body) = req.into_parts();
            regions::take_forwarded_from(&mut parts.headers, &mut parts.extensions);
            Request::from_parts(parts, body)
        })
        .service(layer.layer(proxy));
    // A request over the limit is answered at once, not queued behind it;
    // one that waits for another attempt gives its slot back meanwhile.
    let limited = InFlight::new(layered, config.requests_in_flight_max, metrics);
    Admission::new(
        limited,
        &config.routes,
        (config.body_read_timeout, config.body_buffer_bytes_max),
        admission_metrics,
    )
}

/// `shutdown`, or the store stopping for good, whichever comes first;
/// then every part is told to stop.
async fn stop_on(
    shutdown: impl Future<Output = ()>,
    store_stopped: impl Future<Output = idem_core::StoreError>,
    stop_tx: watch::Sender<bool>,
) {
    tokio::select! {
        () = shutdown => {}
        e = store_stopped => tracing::error!(
            error = %e,
            "the store stopped for good: finishing in-flight requests, then exiting \
             so that a supervisor restarts the gateway"
        ),
    }
    let _ = stop_tx.send(true);
}

/// Serves the proxy until `shutdown`, with the probes' GETs answered on
/// the proxy listener when `probe_paths` asks for it.
async fn serve_proxy(
    config: &GatewayConfig,
    listener: TcpListener,
    admitted: impl listen::App + Sync,
    probes: Arc<Probes>,
    drain: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let transport = match &config.listen_tls {
        Some(tls) => Transport::Tls(tls.acceptor()),
        None => Transport::Plain,
    };
    let limits = (config.connections, drain);
    if !config.probe_paths {
        return listen::serve("proxy", listener, transport, admitted, limits, shutdown).await;
    }
    // GET on the probe paths is answered here; every other request on
    // them (and every other path) goes to the upstream as before.
    let app = axum::Router::new()
        .route(
            PROBE_PATHS[0],
            axum::routing::get(probe::healthz).fallback_service(admitted.clone()),
        )
        .route(
            PROBE_PATHS[1],
            axum::routing::get(probe::readyz).fallback_service(admitted.clone()),
        )
        .with_state(probes)
        .fallback_service(admitted);
    listen::serve("proxy", listener, transport, app, limits, shutdown).await
}

/// The headers `home-region` routes read a key's home from: end-to-end,
/// whatever a client's `Connection` names.
fn home_headers(modes: &[RegionMode]) -> Vec<http::HeaderName> {
    modes
        .iter()
        .filter_map(|mode| match mode {
            RegionMode::HomeRegion(routing) => match &routing.home {
                HomeSource::Header(name) => Some(name.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// The reconciler for `config`'s lookups, counting into `metrics`; `None`
/// when no route has a lookup.
pub fn reconciler(
    config: &GatewayConfig,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
) -> Option<Reconciler> {
    if config.lookups.is_empty() {
        return None;
    }
    let hook: idem_reconcile::ResolutionHook = Arc::new(move |_by: &str, outcome: &str| {
        metrics.resolved(Resolver::Reconciler, outcome == "completed");
    });
    // The lookups were validated with the config; operation names come from
    // routes, so they are non-empty and have no '|'.
    match Reconciler::new(
        store,
        config.lookups.clone(),
        config.reconcile.clone(),
        Arc::new(SystemClock),
    ) {
        Ok(r) => Some(r.with_on_resolution(hook)),
        Err(e) => {
            tracing::error!(error = %e, "the reconciler cannot start");
            None
        }
    }
}

/// Resolves once `stop` is true or its sender is gone.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// Resolves on the first SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = terminate => tracing::info!("SIGTERM: finishing in-flight requests"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: finishing in-flight requests"),
    }
}

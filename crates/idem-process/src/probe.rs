//! The admin listener's probes, for a load balancer, Kubernetes or a
//! service manager: `GET /healthz` (the process serves) and `GET /readyz`
//! (each thing serving depends on, checked and named). Both answer without
//! the admin token, so `/readyz`'s body is made of check names and a
//! [`Status`] each, a fixed vocabulary: no record's data, and no error
//! text, store URL, file path or window cause, whatever a check ran into.
//! That detail goes to the log, and the window's to the admin API.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use idem_core::{Clock, Store, SystemClock, Watch, Watching};
use idem_http::Metrics;
use idem_reconcile::Reconciler;
use serde::Serialize;

use crate::log_budget::{LogBudget, Logged};

/// How long each store check may take before the gateway is not ready.
pub const PROBE_STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// Scans the reconciler may miss before the gateway is not ready: its last
/// one must have finished within this many intervals (and the timeout).
pub const PROBE_SCANS_MISSED_MAX: u32 = 3;

/// How long one `/readyz` answer is reused: however many callers ask (a
/// probe on the public proxy port included), the store is checked at most
/// once in this time, and callers arriving meanwhile wait for that check.
pub const PROBE_ANSWER_REUSE: Duration = Duration::from_secs(1);

/// The most lines a minute that give the detail of failed checks: a probe
/// asked every second of a store that is down says why, without a line a
/// second for as long as the outage lasts.
pub const PROBE_LOG_LINES_MAX: u32 = 10;
/// The window of [`PROBE_LOG_LINES_MAX`], in seconds.
pub const PROBE_LOG_WINDOW_S: u64 = 60;

/// What one check found, the whole of what `/readyz` says about it. The
/// vocabulary is fixed, so an answer to an unauthenticated caller cannot
/// carry anything a check ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// It passed.
    Ok,
    /// The store answered with an error.
    Failed,
    /// No answer within [`PROBE_STORE_TIMEOUT`].
    Timeout,
    /// No suspect window is open.
    Closed,
    /// A suspect window is open. It passes: nothing is blocked in it.
    Open,
    /// The suspect window cannot be known: the store did not answer.
    Unknown,
    /// No reconciler runs: nothing has a lookup.
    Off,
    /// The reconciler runs no scan and finished none lately.
    Stalled,
    /// The broker connection is live.
    Connected,
    /// The broker connection is down.
    Disconnected,
}

impl Status {
    /// The word `/readyz` and the log say.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "failed",
            Status::Timeout => "timeout",
            Status::Closed => "closed",
            Status::Open => "open",
            Status::Unknown => "unknown",
            Status::Off => "off",
            Status::Stalled => "stalled",
            Status::Connected => "connected",
            Status::Disconnected => "disconnected",
        }
    }

    /// Whether a check with this status leaves the process ready.
    pub fn passes(self) -> bool {
        match self {
            Status::Ok | Status::Closed | Status::Open | Status::Off | Status::Connected => true,
            Status::Failed
            | Status::Timeout
            | Status::Unknown
            | Status::Stalled
            | Status::Disconnected => false,
        }
    }
}

impl Serialize for Status {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// What a check found: the status the probe answers with, and the detail
/// (an error's text, the URL it was about) that only the log gets, when
/// the check fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    /// What `/readyz` says.
    pub status: Status,
    /// What the log says beside it.
    pub detail: String,
}

impl Checked {
    /// `status`, with nothing more to say.
    pub fn status(status: Status) -> Checked {
        Checked {
            status,
            detail: String::new(),
        }
    }

    /// `status`, with `detail` for the log.
    pub fn with_detail(status: Status, detail: impl Into<String>) -> Checked {
        Checked {
            status,
            detail: detail.into(),
        }
    }
}

/// A check `/readyz` runs besides the store's and the reconciler's (the
/// broker connections of `idem consume`).
pub trait ReadyCheck: Send + Sync {
    /// What it finds now, without blocking.
    fn check(&self) -> Checked;
}

/// What `/readyz` checks.
pub struct Probes {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    reconciler: Option<Arc<Reconciler>>,
    /// When the process started, for a reconciler yet to finish a scan.
    started: Instant,
    extra: Vec<(Cow<'static, str>, Arc<dyn ReadyCheck>)>,
    /// The last answer and when it was made.
    last: tokio::sync::Mutex<Option<(Instant, bool, Vec<u8>)>>,
    /// The lines that give failed checks' detail.
    log: LogBudget,
}

impl Probes {
    /// The probes of a process on `store` (the write check's purge counted
    /// into `metrics`), with its `reconciler` if it runs one.
    pub fn new(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        reconciler: Option<Arc<Reconciler>>,
    ) -> Probes {
        Probes {
            store,
            metrics,
            reconciler,
            started: Instant::now(),
            extra: Vec::new(),
            last: tokio::sync::Mutex::default(),
            log: LogBudget::new(PROBE_LOG_LINES_MAX, Duration::from_secs(PROBE_LOG_WINDOW_S)),
        }
    }

    /// Also runs `check`, named `name` in the answer. The name is said to
    /// every caller: give one fixed in the program or the config, never
    /// one made of what the check is about (a URL).
    pub fn with_check(
        mut self,
        name: impl Into<Cow<'static, str>>,
        check: Arc<dyn ReadyCheck>,
    ) -> Probes {
        self.extra.push((name.into(), check));
        self
    }
}

/// Serves the probes alone on `listener` until `shutdown` (`idem
/// consume`'s probe listener): plain HTTP, a few connections at once, every
/// head within 10 s.
pub async fn serve(
    listener: tokio::net::TcpListener,
    probes: Arc<Probes>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    serve_app(listener, router(probes), shutdown).await
}

/// Serves `app` (the probes' [`router`] and what is merged beside it, such
/// as `idem consume`'s `/metrics`) on `listener` until `shutdown`, with
/// the bounds of [`serve`].
pub async fn serve_app(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let limits = crate::listen::ConnectionLimits {
        connections_max: PROBE_CONNECTIONS_MAX,
        header_read_timeout: Duration::from_secs(10),
        tls_handshake_timeout: Duration::from_secs(10),
    };
    let drain = Duration::from_secs(1);
    let transport = crate::listen::Transport::Plain;
    crate::listen::serve(
        "probes",
        listener,
        transport,
        app,
        (limits, drain),
        shutdown,
    )
    .await
}

/// Connections a probe listener of its own serves at once.
pub const PROBE_CONNECTIONS_MAX: usize = 64;

/// `/healthz` and `/readyz`, to merge beside the admin API, outside its
/// token.
pub fn router(probes: Arc<Probes>) -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(probes)
}

/// `/readyz`'s body: whether ready, and each check's status by its name,
/// in the order they ran. Nothing else can be written into it.
#[derive(Debug, Serialize)]
struct Readiness<'a> {
    ready: bool,
    #[serde(serialize_with = "by_name")]
    checks: &'a [(Cow<'static, str>, Status)],
}

fn by_name<S: serde::Serializer>(
    checks: &&[(Cow<'static, str>, Status)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(checks.iter().map(|(name, status)| (name, status)))
}

/// `GET /healthz`: the process serves.
pub async fn healthz() -> Response {
    (StatusCode::OK, "ok\n").into_response()
}

/// `GET /readyz`: each check named with its [`Status`]; 503 unless all pass.
pub async fn readyz(State(p): State<Arc<Probes>>) -> Response {
    let mut last = p.last.lock().await;
    let (ready, body) = match &*last {
        Some((at, ready, body)) if at.elapsed() < PROBE_ANSWER_REUSE => (*ready, body.clone()),
        _ => {
            let (ready, body) = check(&p).await;
            *last = Some((Instant::now(), ready, body.clone()));
            (ready, body)
        }
    };
    drop(last);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Runs every check: whether all passed, and the JSON body naming each.
/// The detail of each failed one goes to the log, within the budget.
async fn check(p: &Probes) -> (bool, Vec<u8>) {
    // The read and the write run at once: a store that stops answering
    // costs one bound (2 s), not two.
    let ((read, window), write) = tokio::join!(store_read(&*p.store), store_write(p));
    let mut found: Vec<(Cow<'static, str>, Checked)> = vec![
        ("store_read".into(), read),
        ("store_write".into(), write),
        ("suspect_window".into(), window),
        ("reconciler".into(), reconciler(p)),
    ];
    found.extend(p.store.watches().into_iter().map(watched));
    for (name, extra) in &p.extra {
        found.push((name.clone(), extra.check()));
    }
    for (name, checked) in found.iter().filter(|(_, c)| !c.status.passes()) {
        log_failed(p, name, checked);
    }
    let checks: Vec<_> = found
        .into_iter()
        .map(|(name, checked)| (name, checked.status))
        .collect();
    let ready = checks.iter().all(|(_, status)| status.passes());
    let body = serde_json::to_vec_pretty(&Readiness {
        ready,
        checks: &checks,
    })
    .unwrap_or_default();
    (ready, body)
}

/// What the store watches for by itself (a PostgreSQL store: a promotion,
/// completions elsewhere): `ok`, or `off` where the server refused it,
/// which leaves the gateway ready; the store logged why when it found out.
fn watched((watch, watching): (Watch, Watching)) -> (Cow<'static, str>, Checked) {
    let checked = match watching {
        Watching::Off { reason } => Checked::with_detail(Status::Off, reason),
        _ => Checked::status(Status::Ok),
    };
    (watch.as_str().into(), checked)
}

/// Logs why one check failed, within [`PROBE_LOG_LINES_MAX`] a minute.
fn log_failed(p: &Probes, name: &str, checked: &Checked) {
    if let Logged::Write { suppressed } = p.log.admit(Instant::now()) {
        tracing::warn!(
            check = name,
            status = checked.status.as_str(),
            detail = %checked.detail,
            not_logged_before = suppressed,
            "not ready: a probe check failed"
        );
    }
}

/// The store answers a read (its suspect window) within the bound; and
/// whether that window is open.
async fn store_read(store: &dyn Store) -> (Checked, Checked) {
    let answer = tokio::time::timeout(PROBE_STORE_TIMEOUT, store.suspect_window()).await;
    let unknown = || Checked::with_detail(Status::Unknown, "the store did not answer");
    match answer {
        Ok(Ok(held)) => {
            // An open window is the window's own business, not readiness:
            // a fresh claim is verified with the provider on a route with
            // a lookup, forwarded unverified on the others, and every
            // retry replays as ever. Failing readiness here would take
            // every gateway of the store out of rotation at once. Its
            // cause (a backup's path) is logged when the window is seen
            // open and shown by the admin API's `GET /window`.
            let open = held.is_some_and(|w| w.is_open(SystemClock.now()));
            let window = Checked::status(if open { Status::Open } else { Status::Closed });
            (Checked::status(Status::Ok), window)
        }
        Ok(Err(e)) => (
            Checked::with_detail(Status::Failed, format!("the read failed: {e}")),
            unknown(),
        ),
        Err(_) => (timed_out("read"), unknown()),
    }
}

/// The store takes a write within the bound: one step of the retention
/// purge (at most one record, which the purge would change anyway),
/// through the same path as every claim's write.
async fn store_write(p: &Probes) -> Checked {
    let answer = tokio::time::timeout(PROBE_STORE_TIMEOUT, p.store.purge(1)).await;
    match answer {
        Ok(Ok(report)) => {
            p.metrics.purged(&report);
            Checked::status(Status::Ok)
        }
        Ok(Err(e)) => Checked::with_detail(Status::Failed, format!("the write failed: {e}")),
        Err(_) => timed_out("write"),
    }
}

fn timed_out(what: &str) -> Checked {
    Checked::with_detail(
        Status::Timeout,
        format!(
            "the store's {what} had no answer within {} ms",
            PROBE_STORE_TIMEOUT.as_millis()
        ),
    )
}

/// The reconciler, when there is one, is alive: a scan is running (each
/// lookup bounded by its timeout, so a long one is a busy reconciler, not
/// a dead one), or the last one finished recently.
fn reconciler(p: &Probes) -> Checked {
    let Some(reconciler) = &p.reconciler else {
        return Checked::status(Status::Off);
    };
    let times = reconciler.scan_times();
    scans(
        times.running_since.map(|at| at.into_std().elapsed()),
        times.last_finished.map(|at| at.into_std().elapsed()),
        p.started.elapsed(),
        reconciler.interval(),
    )
}

/// The reconciler's verdict from how long its scan has been running, how
/// long ago its last one finished, how long the process has been up and
/// its interval.
fn scans(
    running_for: Option<Duration>,
    finished_ago: Option<Duration>,
    up_for: Duration,
    interval: Duration,
) -> Checked {
    if running_for.is_some() {
        return Checked::status(Status::Ok);
    }
    let allowed = interval * PROBE_SCANS_MISSED_MAX + PROBE_STORE_TIMEOUT;
    let (since, what) = match finished_ago {
        Some(ago) => (ago, "the reconciler's last scan finished"),
        None => (up_for, "no reconciler scan finished since the start,"),
    };
    if since <= allowed {
        return Checked::status(Status::Ok);
    }
    Checked::with_detail(
        Status::Stalled,
        format!(
            "{what} {} ms ago (allowed {} ms)",
            since.as_millis(),
            allowed.as_millis()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{MemoryStore, StoreError, StoreFuture, StoreWrapper, WindowOpening};

    const URL: &str = "postgres://payer:pw-93kq@db.internal:5432/idem";
    const BACKUP: &str = "/srv/backups/idem-2026-12-01.db";

    /// A store that fails every operation, its error naming where it is.
    struct Down(MemoryStore);

    impl StoreWrapper for Down {
        fn inner(&self) -> &dyn Store {
            &self.0
        }

        fn around<'a, T: 'a>(&'a self, _op: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
            Box::pin(async {
                Err(StoreError::Unavailable {
                    store: URL.into(),
                    reason: format!("cannot connect to {URL}"),
                })
            })
        }
    }

    /// A store whose server refused its promotion check, the refusal
    /// naming where it is.
    struct Refusing(MemoryStore);

    impl StoreWrapper for Refusing {
        fn inner(&self) -> &dyn Store {
            &self.0
        }

        fn watches(&self) -> Vec<(Watch, Watching)> {
            let reason = format!("{URL} refused pg_control_system()");
            vec![
                (Watch::Promotion, Watching::Off { reason }),
                (Watch::Completions, Watching::Active),
            ]
        }
    }

    fn memory() -> MemoryStore {
        MemoryStore::new(Arc::new(SystemClock))
    }

    #[tokio::test]
    async fn the_body_holds_check_names_and_statuses_never_what_a_check_ran_into() {
        let restored = memory();
        let opening = WindowOpening {
            length_ms: 60_000,
            since: None,
            cause: format!("restored from the backup {BACKUP}"),
        };
        restored.open_suspect_window(&opening).await.unwrap();
        let cases: [(Arc<dyn Store>, &str); 3] = [
            (
                Arc::new(Down(memory())),
                r#"{"ready":false,"checks":{"store_read":"failed","store_write":"failed","suspect_window":"unknown","reconciler":"off"}}"#,
            ),
            (
                Arc::new(restored),
                r#"{"ready":true,"checks":{"store_read":"ok","store_write":"ok","suspect_window":"open","reconciler":"off"}}"#,
            ),
            (
                Arc::new(Refusing(memory())),
                r#"{"ready":true,"checks":{"store_read":"ok","store_write":"ok","suspect_window":"closed","reconciler":"off","promotion_check":"off","completion_notices":"ok"}}"#,
            ),
        ];
        for (store, expect) in cases {
            let probes = Probes::new(store, Arc::default(), None);
            let (_, body) = check(&probes).await;
            let said: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let expect: serde_json::Value = serde_json::from_str(expect).unwrap();
            assert_eq!(said, expect);
            let text = String::from_utf8_lossy(&body);
            assert!(
                !text.contains("pw-93kq") && !text.contains("backups"),
                "{text}"
            );
        }
    }

    #[test]
    fn a_reconciler_is_not_ready_only_when_no_scan_runs_and_none_finished_lately() {
        let interval = Duration::from_secs(10);
        let allowed = interval * PROBE_SCANS_MISSED_MAX + PROBE_STORE_TIMEOUT;
        let past = allowed + Duration::from_millis(1);
        let hour = Duration::from_secs(3600);
        // (running for, finished ago, up for, ready)
        let cases = [
            // A long scan is a busy reconciler, however long.
            (Some(hour), None, hour, true),
            (Some(hour), Some(hour), hour, true),
            // Finished lately, or just started.
            (None, Some(allowed), hour, true),
            (None, None, allowed, true),
            // Stuck between scans, or never finished one.
            (None, Some(past), hour, false),
            (None, None, past, false),
        ];
        for (running, finished, up, ready) in cases {
            let check = scans(running, finished, up, interval);
            let expected = if ready { Status::Ok } else { Status::Stalled };
            assert_eq!(
                check.status, expected,
                "{running:?} {finished:?} {up:?}: {}",
                check.detail
            );
            assert_eq!(check.status.passes(), ready);
        }
        let stuck = scans(None, Some(past), hour, interval);
        assert!(
            stuck
                .detail
                .contains(&format!("allowed {} ms", allowed.as_millis())),
            "{}",
            stuck.detail
        );
    }
}

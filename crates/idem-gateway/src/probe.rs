//! The admin listener's probes, for a load balancer, Kubernetes or a
//! service manager: `GET /healthz` (the process serves) and `GET /readyz`
//! (each thing serving depends on, checked and named). Both answer without
//! the admin token and tell nothing of any record.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use idem_core::{Clock, Store, SystemClock};
use idem_http::Metrics;
use idem_reconcile::Reconciler;
use serde::Serialize;

/// How long each store check may take before the gateway is not ready.
pub const PROBE_STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// Scans the reconciler may miss before the gateway is not ready: its last
/// one must have finished within this many intervals (and the timeout).
pub const PROBE_SCANS_MISSED_MAX: u32 = 3;

/// How long one `/readyz` answer is reused: however many callers ask (a
/// probe on the public proxy port included), the store is checked at most
/// once in this time, and callers arriving meanwhile wait for that check.
pub const PROBE_ANSWER_REUSE: Duration = Duration::from_secs(1);

/// A check `/readyz` runs besides the store's and the reconciler's (the
/// broker connections of `idem consume`).
pub trait ReadyCheck: Send + Sync {
    /// Whether it passes now, and what it found; without blocking.
    fn check(&self) -> (bool, String);
}

/// What `/readyz` checks.
pub struct Probes {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    reconciler: Option<Arc<Reconciler>>,
    /// When the process started, for a reconciler yet to finish a scan.
    started: Instant,
    extra: Vec<(&'static str, Arc<dyn ReadyCheck>)>,
    /// The last answer and when it was made.
    last: tokio::sync::Mutex<Option<(Instant, bool, Vec<u8>)>>,
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
        }
    }

    /// Also runs `check`, named `name` in the answer.
    pub fn with_check(mut self, name: &'static str, check: Arc<dyn ReadyCheck>) -> Probes {
        self.extra.push((name, check));
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
    let limits = crate::ConnectionLimits {
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
        router(probes),
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

/// One check of `/readyz`.
#[derive(Debug, Serialize)]
struct Check {
    check: &'static str,
    ok: bool,
    detail: String,
}

#[derive(Debug, Serialize)]
struct Readiness {
    ready: bool,
    checks: Vec<Check>,
}

pub(crate) async fn healthz() -> Response {
    (StatusCode::OK, "ok\n").into_response()
}

pub(crate) async fn readyz(State(p): State<Arc<Probes>>) -> Response {
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
async fn check(p: &Probes) -> (bool, Vec<u8>) {
    // The read and the write run at once: a store that stops answering
    // costs one bound (2 s), not two.
    let ((read, window), write) = tokio::join!(store_read(&*p.store), store_write(p));
    let mut checks = vec![read, write, window, reconciler(p)];
    for (name, extra) in &p.extra {
        let (ok, detail) = extra.check();
        checks.push(Check {
            check: name,
            ok,
            detail,
        });
    }
    let ready = checks.iter().all(|c| c.ok);
    let body = serde_json::to_vec_pretty(&Readiness { ready, checks }).unwrap_or_default();
    (ready, body)
}

/// The store answers a read (its suspect window) within the bound; and
/// whether that window blocks claims.
async fn store_read(store: &dyn Store) -> (Check, Check) {
    let began = Instant::now();
    let answer = tokio::time::timeout(PROBE_STORE_TIMEOUT, store.suspect_window()).await;
    let took = began.elapsed();
    let window = |ok, detail: String| Check {
        check: "suspect_window",
        ok,
        detail,
    };
    match answer {
        Ok(Ok(held)) => {
            let read = Check {
                check: "store_read",
                ok: true,
                detail: format!("answered in {} ms", took.as_millis()),
            };
            let open = held.filter(|w| w.is_open(SystemClock.now()));
            let window = match open {
                None => window(true, "closed".into()),
                // Nothing is blocked: a fresh claim is verified with the
                // provider on a route with a lookup, forwarded unverified
                // on the others, and every retry replays as ever. Failing
                // readiness here would take every gateway of the store out
                // of rotation at once, replays and all.
                Some(w) => window(
                    true,
                    format!(
                        "open until {} ({}): fresh claims are verified with the provider where                          a route has a lookup, forwarded unverified elsewhere; none is blocked",
                        crate::rfc3339(w.until),
                        w.cause
                    ),
                ),
            };
            (read, window)
        }
        Ok(Err(e)) => (
            Check {
                check: "store_read",
                ok: false,
                detail: format!("failed: {e}"),
            },
            window(false, "unknown: the store did not answer".into()),
        ),
        Err(_) => (
            Check {
                check: "store_read",
                ok: false,
                detail: format!("no answer within {} ms", PROBE_STORE_TIMEOUT.as_millis()),
            },
            window(false, "unknown: the store did not answer".into()),
        ),
    }
}

/// The store takes a write within the bound: one step of the retention
/// purge (at most one record, which the purge would change anyway),
/// through the same path as every claim's write.
async fn store_write(p: &Probes) -> Check {
    let began = Instant::now();
    let answer = tokio::time::timeout(PROBE_STORE_TIMEOUT, p.store.purge(1)).await;
    let took = began.elapsed();
    let (ok, detail) = match answer {
        Ok(Ok(report)) => {
            p.metrics.purged(&report);
            (true, format!("answered in {} ms", took.as_millis()))
        }
        Ok(Err(e)) => (false, format!("failed: {e}")),
        Err(_) => (
            false,
            format!("no answer within {} ms", PROBE_STORE_TIMEOUT.as_millis()),
        ),
    };
    Check {
        check: "store_write",
        ok,
        detail,
    }
}

/// The reconciler, when there is one, is alive: a scan is running (each
/// lookup bounded by its timeout, so a long one is a busy reconciler, not
/// a dead one), or the last one finished recently.
fn reconciler(p: &Probes) -> Check {
    let Some(reconciler) = &p.reconciler else {
        return Check {
            check: "reconciler",
            ok: true,
            detail: "off: nothing has a lookup".into(),
        };
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
) -> Check {
    if let Some(running_for) = running_for {
        return Check {
            check: "reconciler",
            ok: true,
            detail: format!("a scan has been running for {} ms", running_for.as_millis()),
        };
    }
    let allowed = interval * PROBE_SCANS_MISSED_MAX + PROBE_STORE_TIMEOUT;
    let (since, what) = match finished_ago {
        Some(ago) => (ago, "last scan finished"),
        None => (up_for, "no scan finished since the start,"),
    };
    Check {
        check: "reconciler",
        ok: since <= allowed,
        detail: format!(
            "{what} {} ms ago (allowed {} ms)",
            since.as_millis(),
            allowed.as_millis()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(
                check.ok, ready,
                "{running:?} {finished:?} {up:?}: {}",
                check.detail
            );
            assert_eq!(check.check, "reconciler");
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

//! Black-box harness: a payout API that records every effect it performs
//! (served in the test process on loopback), the real `idem` binary started
//! as a separate process in front of it, and a plain HTTP client.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test harness: a failure here is a failed test

pub mod bed;
pub mod broker;
pub mod consume_suite;
pub mod dynamo;
pub mod nats;
pub mod nodes;
pub mod rabbit;
pub mod sqs;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::Uri;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The value of `field` in a log line, text (`field=value`) or JSON
/// (`"field":"value"`).
pub fn logged_field(line: &str, field: &str) -> Option<String> {
    if let Some(rest) = line.split(&format!("{field}=")).nth(1) {
        return rest.split_whitespace().next().map(str::to_owned);
    }
    let rest = line.split(&format!("\"{field}\":\"")).nth(1)?;
    rest.split('"').next().map(str::to_owned)
}

/// One effect the upstream performed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effect {
    pub path: String,
    pub key: Option<String>,
    /// `X-Upstream-Key`, for routes that forward the key under another name.
    pub upstream_key: Option<String>,
    /// `Idem-Forwarded-From`, which a gateway must never pass upstream.
    pub forwarded_from: Option<String>,
    /// `Content-Type`, as the request carried it.
    pub content_type: Option<String>,
    pub body: String,
}

#[derive(Default)]
pub struct Ledger {
    pub effects: Vec<Effect>,
    pub hits: usize,
    /// When set, the lookup endpoint answers 503: the provider cannot say.
    pub lookup_down: bool,
    pub lookups: usize,
    busy_seen: HashMap<String, bool>,
}

/// The payout API. Paths choose behaviour:
/// - `POST /payouts`: pays, 201 + JSON + Location;
/// - `POST /slow?ms=N`: pays at once, answers 201 after N ms;
/// - `POST /exposing`: pays, 201 with `Access-Control-Expose-Headers:
///   X-Request-Id, location`;
/// - `POST /fail`: pays, then answers 500;
/// - `POST /busy-once`: first call per key 503 without paying, then pays;
/// - `POST /reject`: 400 (final), no payment;
/// - `POST /big?bytes=N`: pays, 200 with an N-byte body (default 2 MiB);
/// - `POST /transfers`: pays, 200 + JSON; its lookup
///   `GET /transfers/by-key/{key}` answers exactly what the first payment
///   with that key answered, so a record the reconciler completes replays
///   the client's first answer;
/// - `GET /missing/by-key/{key}?ms=N`: a lookup that answers 404 after
///   N ms, counted;
/// - `POST /transfers/slow?ms=N`: a transfer whose payment lands N ms
///   after the request arrived (default 500), whether or not the caller
///   is still connected — the provider's lookup says "not found" until
///   then; answers like `/transfers` once it has landed.
pub struct Upstream {
    pub addr: SocketAddr,
    pub ledger: Arc<Mutex<Ledger>>,
    task: tokio::task::JoinHandle<()>,
}

type Shared = Arc<Mutex<Ledger>>;

impl Upstream {
    pub async fn start() -> Upstream {
        let ledger: Shared = Arc::default();
        let app = axum::Router::new()
            .route("/payouts", axum::routing::post(pay))
            .route("/exposing", axum::routing::post(exposing))
            .route("/slow", axum::routing::post(slow))
            .route("/fail", axum::routing::post(fail))
            .route("/busy-once", axum::routing::post(busy_once))
            .route("/reject", axum::routing::post(reject))
            .route("/big", axum::routing::post(big))
            .route("/slow-before", axum::routing::post(slow_before))
            .route("/payouts/by-key/{key}", axum::routing::get(lookup))
            .route("/transfers", axum::routing::post(transfer))
            .route("/transfers/slow", axum::routing::post(transfer_slow))
            .route("/missing/by-key/{key}", axum::routing::get(slow_not_found))
            .route(
                "/transfers/by-key/{key}",
                axum::routing::get(transfer_lookup),
            )
            .with_state(ledger.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Upstream { addr, ledger, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn effects(&self) -> Vec<Effect> {
        self.ledger.lock().unwrap().effects.clone()
    }

    pub fn hits(&self) -> usize {
        self.ledger.lock().unwrap().hits
    }

    pub fn lookups(&self) -> usize {
        self.ledger.lock().unwrap().lookups
    }

    pub fn set_lookup_down(&self, down: bool) {
        self.ledger.lock().unwrap().lookup_down = down;
    }

    /// As if `/busy-once` had already refused `key` once: its next call
    /// there pays.
    pub fn busy_answered(&self, key: &str) {
        self.ledger
            .lock()
            .unwrap()
            .busy_seen
            .insert(key.to_owned(), true);
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn key_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned())
}

fn record(ledger: &Shared, path: &str, headers: &HeaderMap, body: &Bytes) -> usize {
    let mut l = ledger.lock().unwrap();
    l.effects.push(Effect {
        path: path.to_owned(),
        key: key_of(headers),
        upstream_key: headers
            .get("x-upstream-key")
            .map(|v| v.to_str().unwrap().to_owned()),
        forwarded_from: headers
            .get("idem-forwarded-from")
            .map(|v| v.to_str().unwrap_or("(not text)").to_owned()),
        content_type: headers
            .get("content-type")
            .map(|v| v.to_str().unwrap_or("(not text)").to_owned()),
        body: String::from_utf8_lossy(body).into_owned(),
    });
    l.effects.len()
}

fn paid(n: usize) -> Response {
    (
        StatusCode::CREATED,
        [
            ("content-type", "application/json"),
            ("location", &format!("/payouts/{n}")),
            ("x-not-replayed", "1"),
        ],
        format!("{{\"payout\":{n}}}"),
    )
        .into_response()
}

async fn pay(State(l): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    l.lock().unwrap().hits += 1;
    paid(record(&l, "/payouts", &headers, &body))
}

async fn exposing(State(l): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    l.lock().unwrap().hits += 1;
    let mut response = paid(record(&l, "/exposing", &headers, &body));
    response.headers_mut().insert(
        "access-control-expose-headers",
        axum::http::HeaderValue::from_static("X-Request-Id, location"),
    );
    response
}

async fn slow(State(l): State<Shared>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    l.lock().unwrap().hits += 1;
    let n = record(&l, "/slow", &headers, &body);
    let ms = query_ms(&uri);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    paid(n)
}

/// Waits first and pays after: a gateway killed during the wait drops the
/// connection, the handler is cancelled, and no payment happens.
async fn slow_before(
    State(l): State<Shared>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    l.lock().unwrap().hits += 1;
    let ms = query_ms(&uri);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    paid(record(&l, "/slow-before", &headers, &body))
}

/// The provider's lookup by the stable reference (the key): 200 with what
/// the payment answered, 404 when no payment has this key.
async fn lookup(
    State(l): State<Shared>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> Response {
    match look_up(&l, &key, None) {
        Err(down) => down.into_response(),
        Ok(Some(i)) => (
            StatusCode::OK,
            [("content-type", "application/json")],
            format!("{{\"payout\":{},\"found_by\":\"lookup\"}}", i + 1),
        )
            .into_response(),
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The provider's lookup API is down (`Ledger::lookup_down`).
struct LookupDown;

impl IntoResponse for LookupDown {
    fn into_response(self) -> Response {
        (StatusCode::SERVICE_UNAVAILABLE, "lookup unavailable").into_response()
    }
}

/// A lookup at the provider, counted: the position of the first effect
/// with `key` (on `path`, when given).
fn look_up(l: &Shared, key: &str, path: Option<&str>) -> Result<Option<usize>, LookupDown> {
    let mut ledger = l.lock().unwrap();
    ledger.lookups += 1;
    if ledger.lookup_down {
        return Err(LookupDown);
    }
    Ok(ledger
        .effects
        .iter()
        .position(|e| e.key.as_deref() == Some(key) && path.is_none_or(|p| e.path == p)))
}

fn transferred(n: usize) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        format!("{{\"transfer\":{n}}}"),
    )
        .into_response()
}

async fn transfer(State(l): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    l.lock().unwrap().hits += 1;
    transferred(record(&l, "/transfers", &headers, &body))
}

async fn transfer_slow(
    State(l): State<Shared>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    l.lock().unwrap().hits += 1;
    let ms = query_ms(&uri);
    // The payment is the provider's own work: a caller that hangs up
    // does not stop it.
    let landed = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        record(&l, "/transfers", &headers, &body)
    });
    match landed.await {
        Ok(n) => transferred(n),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// A lookup that finds nothing, slowly (`?ms=N`), counted.
async fn slow_not_found(State(l): State<Shared>, uri: Uri) -> Response {
    l.lock().unwrap().lookups += 1;
    tokio::time::sleep(Duration::from_millis(query_ms(&uri))).await;
    StatusCode::NOT_FOUND.into_response()
}

/// The `?ms=N` of a slow path, 500 by default.
fn query_ms(uri: &Uri) -> u64 {
    uri.query()
        .and_then(|q| q.strip_prefix("ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

/// What the first transfer with this key answered, or 404.
async fn transfer_lookup(
    State(l): State<Shared>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> Response {
    match look_up(&l, &key, Some("/transfers")) {
        Err(down) => down.into_response(),
        Ok(Some(i)) => transferred(i + 1),
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn fail(State(l): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    l.lock().unwrap().hits += 1;
    record(&l, "/fail", &headers, &body);
    (StatusCode::INTERNAL_SERVER_ERROR, "ledger write timed out").into_response()
}

/// Pays, then answers 200 with a body of `bytes` bytes (`?bytes=N`,
/// default 2 MiB: over what a record keeps).
async fn big(State(l): State<Shared>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    l.lock().unwrap().hits += 1;
    record(&l, "/big", &headers, &body);
    let bytes = uri
        .query()
        .and_then(|q| q.strip_prefix("bytes="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(2 << 20);
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        vec![b' '; bytes],
    )
        .into_response()
}

async fn busy_once(State(l): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let key = key_of(&headers).unwrap_or_default();
    let first = {
        let mut guard = l.lock().unwrap();
        guard.hits += 1;
        guard.busy_seen.insert(key, true).is_none()
    };
    if first {
        return (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response();
    }
    paid(record(&l, "/busy-once", &headers, &body))
}

async fn reject(State(l): State<Shared>) -> Response {
    l.lock().unwrap().hits += 1;
    (
        StatusCode::BAD_REQUEST,
        [("content-type", "application/json")],
        "{\"error\":\"insufficient funds\"}",
    )
        .into_response()
}

/// The `idem serve` process.
pub struct Gateway {
    pub addr: SocketAddr,
    child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Gateway {
    /// Starts `idem serve` on an SQLite file.
    pub fn start(upstream: &str, store: &Path, config: Option<&Path>) -> Gateway {
        Gateway::start_url(upstream, &format!("sqlite://{}", store.display()), config)
    }

    /// [`Gateway::start`] with extra arguments.
    pub fn start_args(
        upstream: &str,
        store: &Path,
        config: Option<&Path>,
        extra: &[&str],
    ) -> Gateway {
        let store = format!("sqlite://{}", store.display());
        Gateway::spawn(upstream, &store, config, extra, (None, &[])).0
    }

    /// [`Gateway::start`] with environment variables (a preload library
    /// that stalls the disk).
    pub fn start_env(
        upstream: &str,
        store: &Path,
        config: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Gateway {
        let store = format!("sqlite://{}", store.display());
        Gateway::spawn(upstream, &store, config, &[], (None, env)).0
    }

    /// Starts `idem serve` on `listen` (a port named in advance, to start
    /// it again there after a kill) with the store URL and config file.
    pub fn start_listen(upstream: &str, store_url: &str, config: &Path, listen: &str) -> Gateway {
        let extra = ["--listen", listen];
        Gateway::spawn(upstream, store_url, Some(config), &extra, (None, &[])).0
    }

    /// Starts `idem serve` on an ephemeral port and waits until it listens.
    pub fn start_url(upstream: &str, store_url: &str, config: Option<&Path>) -> Gateway {
        Gateway::spawn(upstream, store_url, config, &[], (None, &[])).0
    }

    /// Starts `idem serve` with the admin API on an ephemeral port, its
    /// token in `IDEM_ADMIN_TOKEN`; returns the gateway and the admin address.
    pub fn start_admin(
        upstream: &str,
        store: &Path,
        config: Option<&Path>,
        token: &str,
    ) -> (Gateway, SocketAddr) {
        Gateway::start_admin_env(upstream, store, config, token, &[])
    }

    /// [`Gateway::start_admin`] with environment variables (the `OTEL_*`
    /// of a gateway that exports traces).
    pub fn start_admin_env(
        upstream: &str,
        store: &Path,
        config: Option<&Path>,
        token: &str,
        env: &[(&str, &str)],
    ) -> (Gateway, SocketAddr) {
        let store = format!("sqlite://{}", store.display());
        let extra = ["--admin-listen", "127.0.0.1:0"];
        let (gateway, admin) = Gateway::spawn(upstream, &store, config, &extra, (Some(token), env));
        (gateway, admin.unwrap())
    }

    /// [`Gateway::start_admin`] on the store at `store_url`.
    pub fn start_admin_url(
        upstream: &str,
        store_url: &str,
        config: Option<&Path>,
        token: &str,
    ) -> (Gateway, SocketAddr) {
        let extra = ["--admin-listen", "127.0.0.1:0"];
        let (gateway, admin) =
            Gateway::spawn(upstream, store_url, config, &extra, (Some(token), &[]));
        (gateway, admin.unwrap())
    }

    /// Starts `idem serve --config CONFIG` in the working directory `cwd`,
    /// with no --store: the store is the file's.
    pub fn start_in(cwd: &Path, upstream: &str, config: &Path) -> Gateway {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
        cmd.current_dir(cwd)
            .args(["serve", "--listen", "127.0.0.1:0", "--upstream", upstream])
            .arg("--config")
            .arg(config)
            .env("IDEM_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Gateway::wait_listening(cmd, None).0
    }

    /// Spawns `idem serve` with `env` set and waits (30 s at most) until
    /// its log names the bound address, and the admin address when
    /// `admin_token` is given.
    fn spawn(
        upstream: &str,
        store_url: &str,
        config: Option<&Path>,
        extra: &[&str],
        (admin_token, env): (Option<&str>, &[(&str, &str)]),
    ) -> (Gateway, Option<SocketAddr>) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
        cmd.arg("serve");
        // A caller that must know the port before the start (two gateways
        // naming each other as peers) passes its own --listen.
        if !extra.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        cmd.args(["--upstream", upstream])
            .args(extra)
            .arg("--store")
            .arg(dynamo::gateway_store(store_url))
            .env("IDEM_LOG", "info")
            .envs(dynamo::AWS_ENV.iter().copied())
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(token) = admin_token {
            cmd.env("IDEM_ADMIN_TOKEN", token);
        }
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        Gateway::wait_listening(cmd, admin_token)
    }

    /// Spawns `cmd` (an `idem serve`) and waits (30 s at most) until its
    /// log names the bound address, and the admin address when
    /// `admin_token` is given.
    fn wait_listening(
        mut cmd: Command,
        admin_token: Option<&str>,
    ) -> (Gateway, Option<SocketAddr>) {
        let mut child = cmd.spawn().expect("spawn idem serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let found: Vec<_> = ["local_addr", "admin_addr"]
                    .into_iter()
                    .filter_map(|field| Some((field, logged_field(&line, field)?)))
                    .collect();
                // Kept before the start is announced: a test that reads the
                // log once the gateway listens finds the listening line.
                sink.lock().unwrap().push(line);
                for found in found {
                    let _ = tx.send(found);
                }
            }
        });
        let (mut addr, mut admin) = (None, None);
        while addr.is_none() || (admin_token.is_some() && admin.is_none()) {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(("local_addr", a)) => addr = Some(a.parse().unwrap()),
                Ok((_, a)) => admin = Some(a.parse().unwrap()),
                Err(_) => {
                    let _ = child.kill();
                    panic!("idem serve did not start: {:#?}", log.lock().unwrap());
                }
            }
        }
        let gateway = Gateway {
            addr: addr.unwrap(),
            child,
            log,
        };
        (gateway, admin)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The process's resident memory, in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// SIGSTOP or SIGCONT: freeze or thaw the process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args([signal, &pid])
                .status()
                .unwrap()
                .success()
        );
    }

    /// SIGKILL: no cleanup, no goodbye.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then wait for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("idem serve did not stop within 15 s of SIGTERM");
    }

    pub fn logs(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `idem consume` process.
pub struct Consumer {
    child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// How an `idem consume` process ended, and everything it logged.
pub struct Stopped {
    pub status: std::process::ExitStatus,
    /// From the SIGTERM to the exit.
    pub took: Duration,
    pub log: String,
}

impl Consumer {
    /// Starts `idem consume --config CONFIG` and waits (30 s at most) until
    /// it logs that it is consuming each of its `subscriptions`.
    pub fn start(config: &Path, subscriptions: usize) -> Consumer {
        Consumer::start_in(Path::new("."), config, subscriptions)
    }

    /// [`Consumer::start`] in the working directory `cwd`.
    pub fn start_in(cwd: &Path, config: &Path, subscriptions: usize) -> Consumer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
            .current_dir(cwd)
            .arg("consume")
            .arg("--config")
            .arg(config)
            .env("IDEM_LOG", "info")
            .envs(dynamo::AWS_ENV.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn idem consume");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let consuming = line.contains("consuming");
                // Kept before the start is announced, as for the gateway.
                sink.lock().unwrap().push(line);
                if consuming {
                    let _ = tx.send(());
                }
            }
        });
        for _ in 0..subscriptions {
            if rx.recv_timeout(Duration::from_secs(30)).is_err() {
                let _ = child.kill();
                let _ = child.wait();
                panic!("idem consume did not start: {:#?}", log.lock().unwrap());
            }
        }
        Consumer {
            child,
            log,
            reader: Some(reader),
        }
    }

    /// SIGTERM, then wait (30 s at most) for the exit and for the last
    /// lines of its log.
    pub fn stop(mut self) -> Stopped {
        let pid = self.child.id().to_string();
        let asked = std::time::Instant::now();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                asked.elapsed() < Duration::from_secs(30),
                "idem consume did not stop within 30 s of SIGTERM: {}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = asked.elapsed();
        // The pipe is closed once the process is gone: the reader ends.
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        Stopped {
            status,
            took,
            log: self.logs(),
        }
    }

    /// Polls the log every 20 ms, for up to `limit`, for a line containing
    /// `text`.
    pub async fn logged(&self, text: &str, limit: Duration) -> bool {
        eventually(limit, || {
            self.log.lock().unwrap().iter().any(|l| l.contains(text))
        })
        .await
    }

    /// Waits (up to `limit`) for the process to exit on its own; its
    /// status, or `None` if it is still running.
    pub fn exited_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL: no cleanup, nothing settled.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then wait (30 s at most) for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "idem consume did not stop within 30 s of SIGTERM: {}",
            self.logs()
        );
    }

    pub fn logs(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response as the tests look at it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Asserts this is a replay of `first`: same status and body, marked
    /// `Idempotent-Replayed: true`.
    #[track_caller]
    pub fn assert_replay_of(&self, first: &Reply) {
        assert_eq!(
            (self.status, self.body.as_str()),
            (first.status, first.body.as_str())
        );
        assert_eq!(self.header("idempotent-replayed"), Some("true"), "{self:?}");
    }

    /// The problem `type`, if this is a problem response.
    pub fn problem(&self) -> Option<String> {
        let doc: serde_json::Value = serde_json::from_str(&self.body).ok()?;
        doc.get("type")?.as_str().map(str::to_owned)
    }
}

pub fn client() -> Client<HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// Sends one request and reads the whole answer (minus `Date`).
pub async fn exchange(req: axum::http::Request<Body>) -> Reply {
    let response = client().request(req).await.unwrap();
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .filter(|(n, _)| n.as_str() != "date")
        .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap().to_owned()))
        .collect();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// POSTs `body` as JSON with the given extra headers.
pub async fn post(url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut req = axum::http::Request::post(url).header("content-type", "application/json");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    exchange(req.body(Body::from(body.to_owned())).unwrap()).await
}

pub fn key(k: &str) -> (&'static str, &str) {
    ("idempotency-key", k)
}

/// A temp dir with the store path and an optional config file.
pub struct Site {
    pub dir: tempfile::TempDir,
}

impl Site {
    pub fn new() -> Site {
        Site {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn store(&self) -> PathBuf {
        self.dir.path().join("idem.db")
    }

    pub fn config(&self, text: &str) -> PathBuf {
        let path = self.dir.path().join("idem.toml");
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// Polls `check` every 20 ms for up to `limit`.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

/// A PostgreSQL schema of its own for one test, dropped afterwards.
pub struct PgSchema {
    pub url: String,
    pub name: String,
}

impl PgSchema {
    /// `IDEM_TEST_POSTGRES_URL` or the local server, with a fresh schema name.
    pub fn new(tag: &str) -> PgSchema {
        let url = idem_testkit::stores::pg_url();
        let name = format!("idem_gw_{tag}_{}", std::process::id());
        PgSchema { url, name }
    }

    /// The store URL a gateway is started with.
    pub fn store_url(&self) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}schema={}", self.url, self.name)
    }

    /// A relay in front of the server and the store URL that reaches the
    /// schema through it (with a query, so a caller may append `&name=value`),
    /// to freeze or delay this one client's server.
    pub async fn through_relay(&self) -> (idem_testkit::relay::Relay, String) {
        let server: tokio_postgres::Config = self.url.parse().unwrap();
        let port = server.get_ports().first().copied().unwrap_or(5432);
        let relay = idem_testkit::relay::Relay::start(format!("127.0.0.1:{port}").parse().unwrap())
            .await
            .unwrap();
        let (user, rest) = self
            .store_url()
            .split_once('@')
            .map(|(u, r)| (u.to_owned(), r.to_owned()))
            .unwrap();
        let (_, path) = rest.split_once('/').unwrap();
        let url = format!("{user}@{}/{path}", relay.addr());
        (relay, url)
    }

    /// Runs one statement on a connection of its own.
    pub fn execute(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        let (url, sql) = (self.url.clone(), sql.to_owned());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
                tokio::spawn(conn);
                client.batch_execute(&sql).await
            })
        })
        .join()
        .unwrap()
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let _ = self.execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
    }
}

// ---- Operations: the admin API, the CLI, metrics ----

/// Any request; `body` is sent as JSON when it is not empty.
pub async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut req = axum::http::Request::builder().method(method).uri(url);
    if !body.is_empty() {
        req = req.header("content-type", "application/json");
    }
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    exchange(req.body(Body::from(body.to_owned())).unwrap()).await
}

/// Percent-encodes everything but RFC 3986's unreserved characters: one
/// path segment of the admin API.
pub fn segment(text: &str) -> String {
    const ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(text, ESCAPED).to_string()
}

/// Runs the `idem` command to completion.
/// Bytes a process wrote, as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the `idem` binary to completion.
/// An SQLite store named in `args` is the table standing for it when
/// `IDEM_TEST_GATEWAY_STORE` names an emulator ([`dynamo::gateway_store`]).
pub fn idem(args: &[&str]) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|a| dynamo::gateway_store(a)).collect();
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .envs(dynamo::AWS_ENV.iter().copied())
        .output()
        .unwrap()
}

/// Runs the `idem` binary to completion in the working directory `cwd`.
pub fn idem_in(cwd: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .current_dir(cwd)
        .args(args)
        .output()
        .unwrap()
}

/// The value of one series in a Prometheus text page, e.g.
/// `idem_claims_total{decision="replay"}`.
pub fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

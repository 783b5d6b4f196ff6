//! `idem demo`: the first command a new user runs. It starts a small payout
//! API and the real gateway in front of it, in this process on loopback,
//! and walks through the contract step by step (a replay, a retry while the
//! first attempt is in flight, a key reused for another payout, an unknown
//! outcome that an operator resolves), printing what happens and checking
//! it against the contract, so that a broken build cannot pass for a
//! working one.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_gateway::{AdminListener, AdminToken, GatewayConfig, Overrides, ServeOptions, random_hex};
use idem_http::{PROBLEM_TYPE_PREFIX, ProblemKind, REPLAYED_HEADER};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

use crate::store_url::OpenStore;

/// `println!` that carries on when stdout is closed (`idem demo | head`):
/// the steps still run, the gateway still stops, and the exit code still
/// tells whether every step behaved.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `idem demo`.
#[derive(Debug, Args)]
#[command(after_long_help = AFTER_HELP)]
pub struct DemoArgs {
    /// Store URL to run on, e.g. postgres://postgres@127.0.0.1:5432/test
    /// [default: an SQLite file in a temporary directory, removed at the
    /// end]. The demo's records stay in a store named here.
    #[arg(long)]
    store: Option<String>,
}

/// Runs the walk-through; an error names the step that misbehaved.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let out = Out::new();
    let stage = Stage::start(args.store).await?;
    out.intro(&stage);
    // Interrupted, it still stops the gateway and removes the temporary store.
    let walked = tokio::select! {
        walked = walk(&stage, &out) => walked,
        Ok(()) = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
    };
    let stopped = stage.stop().await;
    let tally = walked?;
    stopped?;
    out.summary(&tally);
    Ok(())
}

const AFTER_HELP: &str = "\
Steps, each checked (exit 0 only if every one behaves as described):
  1. a payout with an Idempotency-Key: 201, executed once
  2. the same request again: the stored answer, Idempotent-Replayed: true, not executed again
  3. a retry while the first attempt is still running: 409 request-in-progress
  4. the same key with another body: 422 key-reused, no effect
  5. the API answers 503 after paying: the outcome is unknown, a retry gets
     409 outcome-unknown; an operator resolves the record through the admin
     API and the retry gets the resolved answer

Everything runs in this process on loopback (ephemeral ports) and stops at
the end. The gateway's own log is off unless IDEM_LOG is set (e.g. IDEM_LOG=info).";

/// The longest one exchange may take before the demo gives up on it.
const REQUEST_TIMEOUT_MS: u64 = 5_000;
/// The longest the payout API holds a slow answer, should the walk never
/// let it go.
const HOLD_MS_MAX: u64 = 10_000;
/// The largest response body the demo reads, in bytes.
const REPLY_BYTES_MAX: usize = 64 * 1024;
/// How long the gateway may take to drain and stop.
const STOP_TIMEOUT_MS: u64 = 10_000;

/// What the demo payout API does for one key; the walk sets it before it
/// sends the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behaviour {
    /// Pays and answers 201 at once.
    Pay,
    /// Pays, then holds its answer until the walk lets it go: a slow API.
    PayThenHold,
    /// Pays, then answers 503, as a proxy in front of a busy API may after
    /// the API committed: the caller cannot tell whether it paid.
    PayThenUnavailable,
}

/// The demo payout API: pays, and counts every payout it really executes.
#[derive(Default)]
struct PayoutApi {
    ledger: Mutex<Ledger>,
    /// Signalled once a held payout has been executed.
    held: Notify,
    /// Signalled by the walk to let the held answer go.
    release: Notify,
}

#[derive(Default)]
struct Ledger {
    behaviour: HashMap<String, Behaviour>,
    /// The Idempotency-Key of every payout executed, in order.
    executed: Vec<String>,
}

/// The payout API, the gateway in front of it and its admin API, running.
struct Stage {
    api: Arc<PayoutApi>,
    http: Client<HttpConnector, Full<Bytes>>,
    upstream: SocketAddr,
    gateway: SocketAddr,
    admin: SocketAddr,
    admin_token: String,
    /// The store, as shown to the user.
    store: String,
    /// The temporary directory of the default store; removed at the end.
    dir: Option<tempfile::TempDir>,
    /// Requests sent through the gateway.
    sent: AtomicUsize,
    stop: oneshot::Sender<()>,
    served: JoinHandle<std::io::Result<()>>,
    upstream_task: JoinHandle<()>,
}

/// One answer, read whole.
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

/// What a step expects of one answer.
struct Expect {
    status: u16,
    problem: Option<ProblemKind>,
    replay: Replay,
}

/// Whether an answer is the stored one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replay {
    /// The upstream's own answer, or the gateway's refusal.
    Fresh,
    /// The stored answer, marked `Idempotent-Replayed: true`.
    Replayed,
}

/// What the walk did, for the summary.
struct Tally {
    sent: usize,
    executed: usize,
    keys: Vec<String>,
}

/// The terminal: colour only when stdout is one (and `NO_COLOR` is unset).
struct Out {
    colour: bool,
}

impl PayoutApi {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // A handler that panicked leaves the ledger as it was: keep counting.
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, key: &str, behaviour: Behaviour) {
        self.ledger().behaviour.insert(key.to_owned(), behaviour);
    }

    fn executed(&self) -> usize {
        self.ledger().executed.len()
    }

    fn executed_for(&self, key: &str) -> usize {
        self.ledger().executed.iter().filter(|k| *k == key).count()
    }

    fn router(self: &Arc<Self>) -> axum::Router {
        axum::Router::new()
            .route("/payouts", axum::routing::post(pay))
            .route("/payouts/by-key/{key}", axum::routing::get(look_up))
            .with_state(self.clone())
    }
}

impl Stage {
    /// Binds three loopback listeners, opens the store and starts the
    /// payout API and the gateway (with its admin API) on them.
    async fn start(store: Option<String>) -> anyhow::Result<Stage> {
        let api = Arc::new(PayoutApi::default());
        let (upstream_listener, upstream) = bind("the demo payout API").await?;
        let (listener, gateway) = bind("the gateway").await?;
        let (admin_listener, admin) = bind("the admin API").await?;
        let (dir, store) = match store {
            Some(url) => (None, url),
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("idem-demo-")
                    .tempdir()
                    .context("cannot create a temporary directory for the store")?;
                let url = format!("sqlite://{}", dir.path().join("idem.db").display());
                (Some(dir), url)
            }
        };
        let overrides = Overrides {
            listen: Some(gateway.to_string()),
            upstream: Some(format!("http://{upstream}")),
            store: Some(store),
            ..Overrides::default()
        };
        let config = GatewayConfig::load(None, &overrides)
            .map_err(|e| anyhow!("the demo's gateway configuration is refused: {e}"))?;
        let opened = config.store.open()?;
        let store_shown = config.store.to_string();
        let admin_token = random_hex().context("the system's random generator failed")?;
        let token = AdminToken::new(&admin_token).map_err(|e| anyhow!("admin token: {e}"))?;
        let router = api.router();
        let upstream_task = tokio::spawn(async move {
            // Stopped by an abort at the end; an error here shows up as a
            // failed step.
            let _ = axum::serve(upstream_listener, router).await;
        });
        let (stop, stopped) = oneshot::channel();
        let options = ServeOptions {
            metrics: None,
            admin: Some(AdminListener {
                listener: admin_listener,
                operators: token.into(),
                tls: None,
                mount: Some(idem_console::mount(config.console_sessions)),
            }),
        };
        let served = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            idem_gateway::serve_with(&config, opened, listener, options, shutdown).await
        });
        Ok(Stage {
            api,
            http: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
            upstream,
            gateway,
            admin,
            admin_token,
            store: store_shown,
            dir,
            sent: AtomicUsize::new(0),
            stop,
            served,
            upstream_task,
        })
    }

    /// Stops the gateway (it drains), then the payout API, and removes the
    /// temporary directory.
    async fn stop(self) -> anyhow::Result<()> {
        let Stage {
            api,
            http,
            stop,
            served,
            upstream_task,
            dir,
            ..
        } = self;
        // Idle keep-alive connections would otherwise hold the drain.
        drop(http);
        api.release.notify_waiters();
        let _ = stop.send(());
        let drained = tokio::time::timeout(Duration::from_millis(STOP_TIMEOUT_MS), served).await;
        upstream_task.abort();
        let removed = match dir {
            Some(dir) => dir
                .close()
                .context("cannot remove the demo's temporary directory"),
            None => Ok(()),
        };
        match drained {
            Ok(Ok(Ok(()))) => removed,
            Ok(Ok(Err(e))) => Err(anyhow!(e).context("the gateway stopped with an error")),
            Ok(Err(e)) => Err(anyhow!(e).context("the gateway task failed")),
            Err(_) => bail!("the gateway did not stop within {STOP_TIMEOUT_MS} ms"),
        }
    }

    /// `POST /payouts` through the gateway, counted.
    async fn payout(&self, key: &str, body: &str) -> anyhow::Result<Reply> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        let url = format!("http://{}/payouts", self.gateway);
        let headers = [
            ("idempotency-key", key),
            ("content-type", "application/json"),
        ];
        self.send(Method::POST, &url, &headers, body).await
    }

    /// A request to the admin API, with the token.
    async fn admin(&self, method: Method, path: &str, body: &str) -> anyhow::Result<Reply> {
        let url = format!("http://{}{path}", self.admin);
        let bearer = format!("Bearer {}", self.admin_token);
        let headers = [
            ("authorization", bearer.as_str()),
            ("content-type", "application/json"),
        ];
        self.send(method, &url, &headers, body).await
    }

    /// One exchange, bounded in time and in the size of the answer.
    async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> anyhow::Result<Reply> {
        let mut request = axum::http::Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(Bytes::from(body.to_owned())))?;
        let exchange = async {
            let response = self.http.request(request).await?;
            let (parts, body) = response.into_parts();
            let bytes = Limited::new(body, REPLY_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| anyhow!("cannot read the answer: {e}"))?
                .to_bytes();
            Ok::<_, anyhow::Error>(Reply {
                status: parts.status,
                headers: parts.headers,
                body: String::from_utf8_lossy(&bytes).into_owned(),
            })
        };
        tokio::time::timeout(Duration::from_millis(REQUEST_TIMEOUT_MS), exchange)
            .await
            .map_err(|_| anyhow!("{url} did not answer within {REQUEST_TIMEOUT_MS} ms"))?
            .with_context(|| format!("request to {url} failed"))
    }
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn replay(&self) -> Replay {
        match self.header(REPLAYED_HEADER) {
            Some("true") => Replay::Replayed,
            _ => Replay::Fresh,
        }
    }

    /// The problem `type`, if this is a problem document.
    fn problem(&self) -> Option<String> {
        let doc: serde_json::Value = serde_json::from_str(&self.body).ok()?;
        doc.get("type")?.as_str().map(str::to_owned)
    }

    fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("the answer is not JSON: {}", self.body))
    }
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.body)
    }
}

impl Expect {
    const fn fresh(status: u16) -> Expect {
        Expect {
            status,
            problem: None,
            replay: Replay::Fresh,
        }
    }

    const fn replayed(status: u16) -> Expect {
        Expect {
            status,
            problem: None,
            replay: Replay::Replayed,
        }
    }

    const fn problem(status: u16, kind: ProblemKind) -> Expect {
        Expect {
            status,
            problem: Some(kind),
            replay: Replay::Fresh,
        }
    }

    /// Whether `reply` is what this expects; the error says both.
    fn check(&self, step: &str, reply: &Reply) -> anyhow::Result<()> {
        let problem = self
            .problem
            .map(|kind| format!("{PROBLEM_TYPE_PREFIX}{}", kind.slug()));
        let got = (reply.status.as_u16(), reply.problem(), reply.replay());
        if got == (self.status, problem.clone(), self.replay) {
            return Ok(());
        }
        let describe = |status: u16, problem: Option<String>, replay: Replay| {
            let problem = problem.map_or(String::new(), |p| format!(" type {p}"));
            let replay = match replay {
                Replay::Replayed => format!(" {REPLAYED_HEADER}: true"),
                Replay::Fresh => String::new(),
            };
            format!("{status}{problem}{replay}")
        };
        bail!(
            "step {step}: expected {}, got {} ({})",
            describe(self.status, problem, self.replay),
            describe(got.0, got.1, got.2),
            reply.body
        )
    }
}

impl Out {
    fn new() -> Out {
        Out {
            colour: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    fn intro(&self, stage: &Stage) {
        say!(
            "{}",
            self.paint("1", "idem demo: a payout API behind the idem gateway")
        );
        say!(
            "  payout API   http://{}   counts every payout it really executes",
            stage.upstream
        );
        let temporary = match stage.dir {
            Some(_) => " (temporary, removed at the end)",
            None => "",
        };
        say!(
            "  gateway      http://{}   store {}{temporary}",
            stage.gateway,
            stage.store
        );
        say!(
            "  admin API    http://{}   behind a bearer token",
            stage.admin
        );
    }

    fn step(&self, number: u8, title: &str) {
        say!();
        say!("{}", self.paint("1", &format!("{number}. {title}")));
    }

    fn request(&self, key: &str, body: &str, note: &str) {
        say!("   → POST /payouts  Idempotency-Key: {key}  {body}{note}");
    }

    fn reply(&self, reply: &Reply) {
        let mut line = format!("   ← {}", reply.status);
        if reply.replay() == Replay::Replayed {
            line.push_str(&format!(
                "  {}",
                self.paint("36", "Idempotent-Replayed: true")
            ));
        }
        if let Some(after) = reply.header("retry-after") {
            line.push_str(&format!("  Retry-After: {after}"));
        }
        match reply.problem() {
            Some(problem) => line.push_str(&format!("  type {}", self.paint("33", &problem))),
            None => line.push_str(&format!("  {}", reply.body.trim())),
        }
        say!("{line}");
    }

    fn note(&self, text: &str) {
        say!("   {text}");
    }

    fn executed(&self, api: &PayoutApi) {
        say!("   payouts the API executed so far: {}", api.executed());
    }

    fn ok(&self, text: &str) {
        say!("   {} {text}", self.paint("32", "ok:"));
    }

    fn summary(&self, tally: &Tally) {
        say!();
        say!(
            "{}",
            self.paint(
                "1;32",
                &format!(
                    "Done: {} requests sent through the gateway, {} payouts executed by the \
                     API, each effect once.",
                    tally.sent, tally.executed
                )
            )
        );
        for key in &tally.keys {
            say!("  {key}: executed once");
        }
        say!();
        say!("Next:");
        say!(
            "  idem serve --upstream http://127.0.0.1:9000   the gateway in front of your own API"
        );
        say!(
            "  docs/operations.md                            the admin API, metrics, and the \
             runbook for an unknown outcome"
        );
    }
}

/// The five steps, in order; the first that misbehaves ends the walk.
async fn walk(stage: &Stage, out: &Out) -> anyhow::Result<Tally> {
    let run = random_hex().context("the system's random generator failed")?;
    let run = &run[..8];
    let keys = [
        format!("payout-847-{run}"),
        format!("payout-848-{run}"),
        format!("payout-849-{run}"),
    ];
    let [first, slow, unknown] = &keys;
    replay(stage, out, first).await?;
    in_flight(stage, out, slow).await?;
    reused(stage, out, first).await?;
    unknown_outcome(stage, out, unknown).await?;
    let executed = stage.api.executed();
    for key in &keys {
        let n = stage.api.executed_for(key);
        if n != 1 {
            bail!("summary: the payout with key {key} was executed {n} times, not once");
        }
    }
    if executed != keys.len() {
        bail!(
            "summary: the API executed {executed} payouts for {} intents",
            keys.len()
        );
    }
    Ok(Tally {
        sent: stage.sent.load(Ordering::Relaxed),
        executed,
        keys: keys.to_vec(),
    })
}

const BODY_847: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;
const BODY_847_OTHER: &str = r#"{"seller":847,"amount":9900,"currency":"EUR"}"#;
const BODY_848: &str = r#"{"seller":848,"amount":300,"currency":"EUR"}"#;
const BODY_849: &str = r#"{"seller":849,"amount":4500,"currency":"EUR"}"#;

/// Steps 1 and 2: executed once, then replayed.
async fn replay(stage: &Stage, out: &Out, key: &str) -> anyhow::Result<()> {
    stage.api.set(key, Behaviour::Pay);
    out.step(1, "A payout with an Idempotency-Key");
    let step = "1 (a payout with a key)";
    let first = checked(stage, out, step, (key, BODY_847), Expect::fresh(201), 1).await?;
    out.ok("executed once; the gateway stored the answer under the key");

    out.step(
        2,
        "The same request again (a client retrying after a timeout)",
    );
    let step = "2 (the same request again)";
    let again = checked(stage, out, step, (key, BODY_847), Expect::replayed(201), 1).await?;
    if again.body != first.body {
        bail!(
            "step {step}: the replay is {:?}, the first answer was {:?}",
            again.body,
            first.body
        );
    }
    out.ok("the stored answer, replayed; the API did not pay again");
    Ok(())
}

/// Step 3: a retry while the first attempt is still at the API.
async fn in_flight(stage: &Stage, out: &Out, key: &str) -> anyhow::Result<()> {
    let step = "3 (a retry while the first attempt is in flight)";
    stage.api.set(key, Behaviour::PayThenHold);
    out.step(3, "A retry while the first attempt is still in flight");
    out.request(key, BODY_848, "   (the API pays, then holds its answer)");
    let first = stage.payout(key, BODY_848);
    tokio::pin!(first);
    let held = tokio::time::timeout(
        Duration::from_millis(REQUEST_TIMEOUT_MS),
        stage.api.held.notified(),
    );
    tokio::select! {
        reply = &mut first => {
            let reply = reply?;
            bail!("step {step}: the first attempt was answered before the API held it: {}", reply.status);
        }
        held = held => held.map_err(|_| anyhow!("step {step}: the first attempt never reached the API"))?,
    }
    out.note("the client gives up waiting and retries:");
    let in_progress = Expect::problem(409, ProblemKind::RequestInProgress);
    let retry = checked(stage, out, step, (key, BODY_848), in_progress, 2).await?;
    if retry.header("retry-after").is_none() {
        bail!("step {step}: the 409 has no Retry-After");
    }
    out.note("the API lets the first attempt's answer go:");
    stage.api.release.notify_one();
    let first = first.await?;
    out.reply(&first);
    out.executed(&stage.api);
    Expect::fresh(201).check(step, &first)?;
    expect_executed(step, stage, 2)?;
    out.ok("the retry was refused while the first attempt ran; the payout executed once");
    Ok(())
}

/// Step 4: the first key, another payout.
async fn reused(stage: &Stage, out: &Out, key: &str) -> anyhow::Result<()> {
    let step = "4 (the same key with a different body)";
    out.step(4, "The same key with a different body (a client bug)");
    let key_reused = Expect::problem(422, ProblemKind::KeyReused);
    checked(stage, out, step, (key, BODY_847_OTHER), key_reused, 2).await?;
    out.ok("refused: a key names one intent; nothing was executed");
    Ok(())
}

/// Step 5: an unknown outcome, held until an operator resolves it.
async fn unknown_outcome(stage: &Stage, out: &Out, key: &str) -> anyhow::Result<()> {
    let step = "5 (an unknown outcome)";
    let payout = (key, BODY_849);
    stage.api.set(key, Behaviour::PayThenUnavailable);
    out.step(
        5,
        "The API answers 503 after paying: the outcome is unknown",
    );
    out.note("this time the API pays, then answers 503:");
    checked(stage, out, step, payout, Expect::fresh(503), 3).await?;
    out.note("the client cannot tell whether it was paid, and retries:");
    let unknown = Expect::problem(409, ProblemKind::OutcomeUnknown);
    checked(stage, out, step, payout, unknown, 3).await?;
    out.ok("not executed blindly again: the record is ambiguous until it is resolved");
    resolve(stage, out, key).await?;
    out.note("the client retries once more:");
    checked(stage, out, step, payout, Expect::replayed(201), 3).await?;
    out.ok("the retry gets the resolved answer; the payout executed once");
    Ok(())
}

/// One payout through the gateway, printed, then checked: the answer
/// against `expect`, and the payouts the API executed so far against
/// `executed`.
async fn checked(
    stage: &Stage,
    out: &Out,
    step: &str,
    (key, body): (&str, &str),
    expect: Expect,
    executed: usize,
) -> anyhow::Result<Reply> {
    out.request(key, body, "");
    let reply = stage.payout(key, body).await?;
    out.reply(&reply);
    out.executed(&stage.api);
    expect.check(step, &reply)?;
    expect_executed(step, stage, executed)?;
    Ok(reply)
}

/// What an operator does: finds the ambiguous record, asks the payout API's
/// ledger, and resolves the record through the admin API.
async fn resolve(stage: &Stage, out: &Out, key: &str) -> anyhow::Result<()> {
    let step = "5 (resolving through the admin API)";
    let listed = stage
        .admin(Method::GET, "/records?state=ambiguous&limit=1000", "")
        .await?;
    let page = listed.json()?;
    let record = page["records"]
        .as_array()
        .and_then(|records| records.iter().find(|r| r["key"] == key))
        .ok_or_else(|| anyhow!("step {step}: no ambiguous record with key {key}: {page}"))?;
    let scope = record["scope"].as_str().unwrap_or_default().to_owned();
    let token = record["token"]
        .as_u64()
        .ok_or_else(|| anyhow!("step {step}: the record has no token: {record}"))?;
    out.note(&format!(
        "operator: GET /records?state=ambiguous → scope {scope:?}, key {key}, token {token}"
    ));
    let url = format!("http://{}/payouts/by-key/{key}", stage.upstream);
    let ledger = stage.send(Method::GET, &url, &[], "").await?;
    if ledger.status != StatusCode::OK {
        bail!("step {step}: the API's ledger has no payout for {key}: {ledger:?}");
    }
    out.note(&format!(
        "operator: the payout API's ledger has {}",
        ledger.body
    ));
    let path = format!("/records/{}/{}/resolve", segment(&scope), segment(key));
    let body = serde_json::json!({
        "token": token,
        "outcome": "completed",
        "status": 201,
        "headers": [["content-type", "application/json"]],
        "body": ledger.body,
        "reason": "the payout API's ledger shows this payout for the key",
    });
    let answer = stage.admin(Method::POST, &path, &body.to_string()).await?;
    let answer_json = answer.json()?;
    if answer.status != StatusCode::OK || answer_json["outcome"] != "completed" {
        bail!(
            "step {step}: the admin API refused the resolution: {} {}",
            answer.status,
            answer.body
        );
    }
    out.note(&format!(
        "operator: POST /records/…/resolve → {} {}, by {}, reason {}",
        answer.status, answer_json["outcome"], answer_json["by"], answer_json["reason"]
    ));
    Ok(())
}

/// The demo payout API's `POST /payouts`: executes the payout (counts it),
/// then answers as the key's [`Behaviour`] says.
async fn pay(State(api): State<Arc<PayoutApi>>, headers: HeaderMap) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (number, behaviour) = {
        let mut ledger = api.ledger();
        ledger.executed.push(key.clone());
        let behaviour = ledger.behaviour.get(&key).copied();
        (ledger.executed.len(), behaviour.unwrap_or(Behaviour::Pay))
    };
    match behaviour {
        Behaviour::Pay => paid(number),
        Behaviour::PayThenHold => {
            api.held.notify_one();
            let hold = Duration::from_millis(HOLD_MS_MAX);
            let _ = tokio::time::timeout(hold, api.release.notified()).await;
            paid(number)
        }
        Behaviour::PayThenUnavailable => {
            (StatusCode::SERVICE_UNAVAILABLE, "upstream busy, try later").into_response()
        }
    }
}

/// `GET /payouts/by-key/{key}`: the ledger, as an operator asks it.
async fn look_up(State(api): State<Arc<PayoutApi>>, Path(key): Path<String>) -> Response {
    let position = api.ledger().executed.iter().position(|k| *k == key);
    match position {
        Some(i) => paid_body(i + 1, StatusCode::OK),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

fn paid(number: usize) -> Response {
    paid_body(number, StatusCode::CREATED)
}

fn paid_body(number: usize, status: StatusCode) -> Response {
    (
        status,
        [("content-type", "application/json")],
        format!("{{\"payout\":{number}}}"),
    )
        .into_response()
}

fn expect_executed(step: &str, stage: &Stage, expected: usize) -> anyhow::Result<()> {
    let executed = stage.api.executed();
    if executed != expected {
        bail!("step {step}: the API executed {executed} payouts so far, expected {expected}");
    }
    Ok(())
}

async fn bind(what: &str) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .with_context(|| format!("cannot listen on loopback for {what}"))?;
    let addr = listener
        .local_addr()
        .with_context(|| format!("cannot read the address of {what}"))?;
    Ok((listener, addr))
}

/// One path segment of the admin API (a scope holds spaces, `/` and `|`).
fn segment(text: &str) -> String {
    utf8_percent_encode(text, NON_ALPHANUMERIC).to_string()
}

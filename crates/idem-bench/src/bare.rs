//! `idem-bench bare-consume`: the consumer benchmark's baseline, a process
//! of its own that `idem-bench consume` starts. It reads a queue through
//! the same broker adapter as `idem consume`, POSTs each message to the
//! service and acknowledges it once the service answered 2xx — no store,
//! no key, no fingerprint: what a consumer without idempotency does. Like
//! `idem consume` it runs `--concurrency` workers on a multi-threaded
//! runtime with one worker thread per CPU, and on SIGTERM or SIGINT stops
//! taking messages, settles the ones it holds, and exits.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Uri, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_broker::{Message, Subscription};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::args::Flags;
use crate::queue::Broker;

const USAGE: &str = "usage: idem-bench bare-consume --broker rabbitmq|nats|sqs --queue Q \
     --deliver URL [--concurrency N] [--prefetch N]";
/// The longest one POST may take; past it the message is handed back.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a message the service did not take waits before it comes back.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long a worker waits after the broker failed to deliver.
const BROKER_PAUSE: Duration = Duration::from_millis(500);

/// What to run, from the command line.
struct Options {
    broker: Broker,
    queue: String,
    deliver: Uri,
    concurrency: usize,
    prefetch: u16,
}

/// What the workers did.
#[derive(Debug, Default)]
struct Tally {
    acked: u64,
    retried: u64,
    settle_failed: u64,
    broker_errors: u64,
}

/// The HTTP client every worker shares, as `idem consume`'s: pooled
/// keep-alive HTTP/1.1 connections, Nagle off.
type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Runs `idem-bench bare-consume` with the flags that follow the subcommand.
pub fn main(args: impl Iterator<Item = String>) -> anyhow::Result<()> {
    let flags = Flags::parse(
        args,
        &[
            "--broker",
            "--queue",
            "--deliver",
            "--concurrency",
            "--prefetch",
        ],
        USAGE,
    )?;
    let deliver = flags.required("--deliver")?;
    let options = Options {
        broker: Broker::parse(&flags.required("--broker")?)?,
        queue: flags.required("--queue")?,
        deliver: deliver
            .parse()
            .with_context(|| format!("--deliver {deliver:?}"))?,
        concurrency: flags.number("--concurrency", 8, 1..=256)?,
        prefetch: flags.number("--prefetch", 16, 1..=u16::MAX)?,
    };
    if options.deliver.scheme_str() != Some("http") {
        bail!("--deliver {deliver:?}: an http:// URL");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let tally = runtime.block_on(run(&options))?;
    println!(
        "bare-consume: {} acked, {} retried, {} settlements failed, {} broker errors",
        tally.acked, tally.retried, tally.settle_failed, tally.broker_errors
    );
    Ok(())
}

/// Consumes until SIGTERM or SIGINT, then settles what the workers hold.
async fn run(options: &Options) -> anyhow::Result<Tally> {
    let subscription = options
        .broker
        .subscribe(&options.queue, options.prefetch)
        .await?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector);
    let (stop, stopped) = watch::channel(false);
    let mut workers = JoinSet::new();
    for _ in 0..options.concurrency {
        workers.spawn(worker(
            Arc::clone(&subscription),
            client.clone(),
            options.deliver.clone(),
            stopped.clone(),
        ));
    }
    idem_gateway::shutdown_signal().await;
    let _ = stop.send(true);
    let mut total = Tally::default();
    while let Some(done) = workers.join_next().await {
        let t = done.context("a worker panicked")?;
        total.acked += t.acked;
        total.retried += t.retried;
        total.settle_failed += t.settle_failed;
        total.broker_errors += t.broker_errors;
    }
    Ok(total)
}

/// One worker: the next delivery, its POST, its settlement.
async fn worker(
    subscription: Arc<dyn Subscription>,
    client: HttpClient,
    deliver: Uri,
    mut stop: watch::Receiver<bool>,
) -> Tally {
    let mut tally = Tally::default();
    loop {
        if *stop.borrow() {
            return tally;
        }
        let next = tokio::select! {
            biased;
            _ = stop.changed() => continue,
            next = subscription.next() => next,
        };
        let Ok(delivery) = next else {
            tally.broker_errors += 1;
            tokio::time::sleep(BROKER_PAUSE).await;
            continue;
        };
        let posted = post(&client, &deliver, &delivery.message).await;
        let settled = if posted {
            delivery.settle.ack().await.map(|()| tally.acked += 1)
        } else {
            let retried = delivery.settle.retry(RETRY_AFTER).await;
            retried.map(|()| tally.retried += 1)
        };
        if settled.is_err() {
            tally.settle_failed += 1;
        }
    }
}

/// POSTs the message's payload; true when the service answered 2xx.
async fn post(client: &HttpClient, deliver: &Uri, message: &Message) -> bool {
    let content_type = message.header("content-type").unwrap_or("application/json");
    let request = Request::builder()
        .method(Method::POST)
        .uri(deliver.clone())
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(message.payload.clone()));
    let Ok(request) = request else { return false };
    let exchange = async {
        let response = client.request(request).await.ok()?;
        let status = response.status();
        response.into_body().collect().await.ok()?;
        Some(status.is_success())
    };
    matches!(
        tokio::time::timeout(POST_TIMEOUT, exchange).await,
        Ok(Some(true))
    )
}

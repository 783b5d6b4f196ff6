//! `idem`: the command-line entry point. Thin glue: parse arguments, open the
//! store named by a URL, and call the library crates.

mod check;
mod consume;
mod demo;
mod reconcile;
mod records;
mod serve;
mod sim;
mod store_cmd;
mod store_url;
mod telemetry;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::records::{ListArgs, ResolveArgs, ShowArgs, VerbArgs};
use crate::telemetry::{LogFormat, Telemetry, Traces};
use idem_core::Verb;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// idem makes "this business effect happens once" a contract that can be
/// stated, enforced, inspected and tested.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway: a reverse proxy enforcing the Idempotency-Key
    /// contract. Each route also answers a caller's status URL
    /// (`GET {path}/.idem/{key}`) and publishes its policy (`GET
    /// {path}/.idem`); see docs/http.md.
    Serve(serve::ServeArgs),
    /// Consume a queue (NATS JetStream, RabbitMQ or Amazon SQS): deliver
    /// each message once to an HTTP endpoint through the contract, and
    /// settle it on the broker from the record. Exits 0 after SIGTERM or
    /// SIGINT, 1 when it cannot start or a broker fails for good (what it
    /// declared is gone and cannot be made again, an SQS queue deleted).
    /// `probe_listen` serves /healthz, /readyz and /metrics (the ambiguous
    /// backlog per subscription, the suspect window; docs/operations.md,
    /// "Alerts").
    Consume(consume::ConsumeArgs),
    /// Judge idempotency contract files by the twelve design-review questions.
    Check(check::CheckArgs),
    /// Replay designs under injected faults, deterministically, and count
    /// duplicate and lost effects.
    Sim(sim::SimArgs),
    /// Resolve ambiguous records by asking the provider (one pass).
    Reconcile(reconcile::ReconcileArgs),
    /// Inspect idempotency records in a store, resolve ambiguous ones, and
    /// expire or evict a key deliberately (a store that is not there is an
    /// error, never created).
    #[command(subcommand)]
    Records(RecordsCommand),
    /// Back up and restore a store (`idem store backup`, `restore`,
    /// `mark-restored`).
    #[command(subcommand)]
    Store(StoreCommand),
    /// Walk through the contract in a few seconds: a demo payout API behind
    /// the gateway, on loopback, every step checked.
    Demo(demo::DemoArgs),
}

#[derive(Debug, Subcommand)]
enum StoreCommand {
    /// Create the store where its URL points: an SQLite file or a
    /// PostgreSQL schema, or a DynamoDB table with its indexes and TTL
    /// attribute (on-demand billing); `--print cloudformation` prints the
    /// table's CloudFormation instead. A store that exists is left as it is.
    Init(store_cmd::InitArgs),
    /// Write a consistent copy of an SQLite store to a new file, while the
    /// gateway serves from it (SQLite's online backup), and check the copy.
    Backup(store_cmd::BackupArgs),
    /// Put a backup back in place of an SQLite store (stopped), with the
    /// suspect window open: keys the backup lacks are verified with the
    /// provider before they run again.
    Restore(store_cmd::RestoreArgs),
    /// Tell a store (SQLite or PostgreSQL) it was restored to a point in
    /// time by other means: opens the suspect window from that point.
    MarkRestored(store_cmd::MarkRestoredArgs),
}

#[derive(Debug, Subcommand)]
enum RecordsCommand {
    /// List records in (scope, key) order, optionally only those in one state.
    List(ListArgs),
    /// Show one record in full; an ambiguous one says why (status, error, excerpt, node, summary).
    Show(ShowArgs),
    /// Resolve an ambiguous record by hand: completed (store its result) or
    /// not executed (remove it so a retry runs).
    Resolve(ResolveArgs),
    /// Expire a completed record now: its answer is dropped and it becomes
    /// a tombstone, so a late retry with the key is refused (422
    /// key-expired), never run. Journaled with --by and --reason. Cannot be
    /// undone; `evict` removes the tombstone if the intent must run again.
    Expire(VerbArgs),
    /// Evict a record, tombstone or not, so that the intent may run again:
    /// the next request with the key runs the effect. Refused while an
    /// attempt may still commit (in progress or ambiguous within its lease).
    /// Journaled with --by and --reason. Cannot be undone.
    Evict(VerbArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Only the commands that serve, consume or reconcile make spans.
    let traces = match &cli.command {
        Command::Serve(_) | Command::Consume(_) | Command::Reconcile(_) => {
            Traces::from_env(|name| std::env::var(name).ok())
        }
        _ => Ok(Traces::Off),
    };
    // The demo's own output tells the story; the gateway's log only on request.
    let quiet = matches!(cli.command, Command::Demo(_)) && std::env::var_os("IDEM_LOG").is_none();
    let format = LogFormat::from_env(|name| std::env::var(name).ok());
    let telemetry = match traces.and_then(|traces| {
        if quiet {
            Ok(None)
        } else {
            Telemetry::init(traces, format?).map(Some)
        }
    }) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("error: {e:#}");
            return match cli.command {
                Command::Reconcile(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            };
        }
    };
    let code = match cli.command {
        // Pure commands with their own exit codes (0 pass, 1 fail, 2 invalid).
        Command::Check(args) => check::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Serve(args) => block_on(serve::run(args)),
        Command::Consume(args) => block_on(consume::run(args)),
        // Its own exit codes: 0 nothing to do, 1 needs attention, 2 cannot run.
        Command::Reconcile(args) => match runtime() {
            Ok(rt) => rt.block_on(reconcile::run(args)),
            Err(e) => {
                eprintln!("error: cannot start the async runtime: {e}");
                ExitCode::from(2)
            }
        },
        Command::Records(RecordsCommand::List(args)) => block_on(records::list(args)),
        Command::Records(RecordsCommand::Show(args)) => block_on(records::show(args)),
        Command::Records(RecordsCommand::Resolve(args)) => block_on(records::resolve(args)),
        Command::Records(RecordsCommand::Expire(args)) => {
            block_on(records::apply_verb(Verb::Expire, args))
        }
        Command::Records(RecordsCommand::Evict(args)) => {
            block_on(records::apply_verb(Verb::Evict, args))
        }
        Command::Demo(args) => block_on(demo::run(args)),
        Command::Store(StoreCommand::Init(args)) => block_on(store_cmd::init(args)),
        Command::Store(StoreCommand::Backup(args)) => finish(store_cmd::backup(args)),
        Command::Store(StoreCommand::Restore(args)) => finish(store_cmd::restore(args)),
        Command::Store(StoreCommand::MarkRestored(args)) => {
            block_on(store_cmd::mark_restored(args))
        }
    };
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    code
}

/// Runs one command on a multi-threaded runtime: 0 on success, 1 with the
/// error and its causes on stderr.
/// The exit code of a command that needs no runtime: 0, or 1 with the
/// error on stderr.
fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn block_on(command: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The multi-threaded runtime every async command runs on.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

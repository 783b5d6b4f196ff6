//! `idem check`: judges contract files by the twelve design-review questions
//! and, with `--gateway`, the contracts a gateway config's routes name
//! against what those routes enforce. Exit 0 all pass, 1 a failure, 2 a file
//! that cannot be read or is invalid.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use idem_gateway::GatewayConfig;

use crate::records::Format;

/// `idem check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Contract files to judge.
    files: Vec<PathBuf>,
    /// A gateway config: judge every route's principal, whether its
    /// [[lookup]] can tell tenants apart (gateway.lookup_tenancy), and the
    /// contract each route names, cross-checked against the route's
    /// retention, lease and policies.
    #[arg(long)]
    gateway: Option<PathBuf>,
    /// An `idem consume` config: judge every subscription's key source
    /// (consumer.key_source) and the contract each names, cross-checked
    /// against the subscription's retention, tombstone, lease and lookup.
    #[arg(long)]
    consumer: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// Runs the check; the exit code carries the verdict.
pub fn run(args: CheckArgs) -> ExitCode {
    if args.files.is_empty() && args.gateway.is_none() && args.consumer.is_none() {
        eprintln!(
            "error: name contract files, a gateway config with --gateway, or a consumer \
             config with --consumer"
        );
        return ExitCode::from(2);
    }
    let colour = args.format == Format::Table && std::io::stdout().is_terminal();
    let mut invalid = false;
    let mut failed = false;
    let mut json = Vec::new();
    for file in &args.files {
        match idem_contract::load(file) {
            Ok(contract) => {
                let report = idem_contract::check(&contract);
                failed |= !report.passed();
                match args.format {
                    Format::Table => {
                        println!("{}", file.display());
                        print!("{}", report.render_text(colour));
                        println!();
                    }
                    Format::Json => json.push(serde_json::json!({
                        "file": file.display().to_string(),
                        "report": report.to_json(),
                    })),
                }
            }
            Err(e) => {
                invalid = true;
                eprintln!("error: {e}");
            }
        }
    }
    if let Some(config) = &args.gateway {
        match gateway(config, args.format, colour, &mut json) {
            Ok(passed) => failed |= !passed,
            Err(e) => {
                invalid = true;
                eprintln!("error: {e}");
            }
        }
    }
    if let Some(config) = &args.consumer {
        match consumer(config, args.format, colour, &mut json) {
            Ok(passed) => failed |= !passed,
            Err(e) => {
                invalid = true;
                eprintln!("error: {e}");
            }
        }
    }
    if args.format == Format::Json {
        println!("{}", serde_json::Value::Array(json));
    }
    match (invalid, failed) {
        (true, _) => ExitCode::from(2),
        (false, true) => ExitCode::from(1),
        (false, false) => ExitCode::SUCCESS,
    }
}

/// The contracts of a gateway config's routes, every route's principal, and
/// every looked-up route's tenancy; `Ok(false)` when one fails, `Err` when
/// the config or a contract file is unreadable or invalid.
fn gateway(
    config: &std::path::Path,
    format: Format,
    colour: bool,
    json: &mut Vec<serde_json::Value>,
) -> anyhow::Result<bool> {
    // A lookup that cannot tell tenants apart is a finding here, not an error.
    let config = GatewayConfig::load_for_review(config)?;
    let mut contracts = idem_gateway::contracts::evaluate(&config).into_iter();
    let mut passed = true;
    for route in &config.routes {
        let principal = idem_gateway::contracts::principal(route);
        // evaluate() keeps the routes that name a contract, in order.
        let contract = match route.contract() {
            Some(_) => contracts.next(),
            None => None,
        };
        let (report, mut cross, file) = match contract {
            Some(rc) => {
                let (report, cross) = rc.outcome.map_err(anyhow::Error::from)?;
                (Some(report), cross, Some(rc.path))
            }
            None => (None, Vec::new(), None),
        };
        cross.push(principal);
        let has_lookup = idem_gateway::contracts::has_lookup(&config, route);
        if has_lookup {
            cross.push(idem_gateway::contracts::lookup_tenancy(route));
        }
        cross.push(idem_contract::lost_tail_finding(
            has_lookup,
            config.suspect_window.as_secs(),
        ));
        let ok =
            report.as_ref().is_none_or(|r| r.passed()) && cross.iter().all(|f| f.verdict.passed());
        passed &= ok;
        let name = idem_gateway::contracts::route_name(route);
        match format {
            Format::Table => {
                match &file {
                    Some(path) => println!("route {name:?} ({})", path.display()),
                    None => println!("route {name:?} (no contract: route field `contract`)"),
                }
                if let Some(report) = &report {
                    print!("{}", report.render_text(colour));
                }
                print!("{}", idem_contract::render_findings(&cross, colour));
            }
            Format::Json => json.push(serde_json::json!({
                "route": name,
                "file": file.map(|p| p.display().to_string()),
                "report": report.map(|r| r.to_json()),
                "gateway": cross.iter().map(|f| f.to_json()).collect::<Vec<_>>(),
                "passed": ok,
            })),
        }
    }
    Ok(passed)
}

/// Every subscription's key source and the contract it names, with the
/// cross-checks; `Ok(false)` when one fails, `Err` when the config or a
/// contract file is unreadable or invalid.
fn consumer(
    config: &std::path::Path,
    format: Format,
    colour: bool,
    json: &mut Vec<serde_json::Value>,
) -> anyhow::Result<bool> {
    let config = idem_consumer::config::ConsumeConfig::load(config)?;
    let mut contracts = idem_consumer::contracts::evaluate(&config).into_iter();
    let mut passed = true;
    for sub in &config.subscriptions {
        // evaluate() keeps the subscriptions that name a contract, in order.
        let contract = match &sub.contract {
            Some(_) => contracts.next(),
            None => None,
        };
        let (report, mut cross, file) = match contract {
            Some(c) => {
                let (report, cross) = c.outcome.map_err(anyhow::Error::from)?;
                (Some(report), cross, Some(c.path))
            }
            None => (None, Vec::new(), None),
        };
        cross.push(idem_consumer::contracts::key_source(sub));
        let notes = broker_notes(sub);
        let ok =
            report.as_ref().is_none_or(|r| r.passed()) && cross.iter().all(|f| f.verdict.passed());
        passed &= ok;
        match format {
            Format::Table => {
                match &file {
                    Some(path) => println!("subscription {:?} ({})", sub.name, path.display()),
                    None => println!(
                        "subscription {:?} (no contract: subscription field `contract`)",
                        sub.name
                    ),
                }
                if let Some(report) = &report {
                    print!("{}", report.render_text(colour));
                }
                print!("{}", idem_contract::render_findings(&cross, colour));
                for note in &notes {
                    println!("  {} {}: {}", note.level, note.topic, note.text);
                }
            }
            Format::Json => json.push(serde_json::json!({
                "subscription": sub.name,
                "file": file.map(|p| p.display().to_string()),
                "report": report.map(|r| r.to_json()),
                "consumer": cross.iter().map(|f| f.to_json()).collect::<Vec<_>>(),
                "broker": notes.iter().map(|n| serde_json::json!({
                    "level": n.level, "topic": n.topic, "text": n.text,
                })).collect::<Vec<_>>(),
                "passed": ok,
            })),
        }
    }
    Ok(passed)
}

/// What the subscription's broker says of itself (an SQS queue's redrive
/// policy), read on a runtime of its own: notes, never a failure.
fn broker_notes(
    sub: &idem_consumer::config::Subscription,
) -> Vec<idem_consumer::contracts::BrokerNote> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(idem_consumer::contracts::broker_notes(sub)),
        Err(e) => vec![idem_consumer::contracts::BrokerNote {
            level: "WARN",
            topic: "broker",
            text: format!("cannot read the broker: {e}"),
        }],
    }
}

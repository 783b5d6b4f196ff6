//! `idem check`: judges contract files by the twelve design-review questions
//! and, with `--gateway`, the contracts a gateway config's routes name
//! against what those routes enforce. Exit 0 all pass, 1 a failure, 2 a file
//! that cannot be read or is invalid.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use idem_gateway::{GatewayConfig, Overrides};

use crate::records::Format;

/// `idem check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Contract files to judge.
    files: Vec<PathBuf>,
    /// A gateway config: judge the contract every route names, and
    /// cross-check it against the route's retention, lease and policies.
    #[arg(long)]
    gateway: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// Runs the check; the exit code carries the verdict.
pub fn run(args: CheckArgs) -> ExitCode {
    if args.files.is_empty() && args.gateway.is_none() {
        eprintln!("error: name contract files, or a gateway config with --gateway");
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
    if args.format == Format::Json {
        println!("{}", serde_json::Value::Array(json));
    }
    match (invalid, failed) {
        (true, _) => ExitCode::from(2),
        (false, true) => ExitCode::from(1),
        (false, false) => ExitCode::SUCCESS,
    }
}

/// The contracts of a gateway config's routes; `Ok(false)` when one fails,
/// `Err` when the config or a contract file is unreadable or invalid.
fn gateway(
    config: &std::path::Path,
    format: Format,
    colour: bool,
    json: &mut Vec<serde_json::Value>,
) -> anyhow::Result<bool> {
    let config = GatewayConfig::load_offline(config, &Overrides::default())?;
    let contracts = idem_gateway::contracts::evaluate(&config);
    if contracts.is_empty() {
        eprintln!("note: no route in the config names a contract file (route field `contract`)");
    }
    let mut passed = true;
    for rc in contracts {
        let (report, cross) = rc.outcome.map_err(anyhow::Error::from)?;
        let ok = report.passed() && cross.iter().all(|f| f.verdict.passed());
        passed &= ok;
        match format {
            Format::Table => {
                println!("route {:?} ({})", rc.route, rc.path.display());
                print!("{}", report.render_text(colour));
                print!("{}", idem_contract::render_findings(&cross, colour));
            }
            Format::Json => json.push(serde_json::json!({
                "route": rc.route,
                "file": rc.path.display().to_string(),
                "report": report.to_json(),
                "gateway": cross.iter().map(|f| f.to_json()).collect::<Vec<_>>(),
                "passed": ok,
            })),
        }
    }
    Ok(passed)
}

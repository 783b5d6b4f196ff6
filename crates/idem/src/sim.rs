//! `idem sim`: runs designs (contract files) through the deterministic
//! simulator over many seeds and prints duplicates, lost intents and the
//! coverage of each fault; every violation comes with the command that
//! replays its seed.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use idem_sim::Design;

use crate::records::Format;

/// `idem sim`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Contract files (the `idem check` format) describing the designs.
    #[arg(required_unless_present = "consumer")]
    files: Vec<PathBuf>,
    /// An `idem consume` config: simulate each subscription's contract
    /// with the lease, retention and tombstone the subscription enforces.
    #[arg(long)]
    consumer: Option<PathBuf>,
    /// How many seeds to run, from --seed on [default: 100, or 1 with --seed].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    seeds: Option<u64>,
    /// The first seed; alone, it replays exactly that run [default: 0].
    #[arg(long)]
    seed: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Also measure simulated intents per second.
    #[arg(long)]
    bench: bool,
    /// Open the suspect window on the surviving region's store at a hard
    /// failover: fresh claims there are verified with the bank's lookup
    /// before the API is called (docs/regions.md, "The suspect window").
    #[arg(long)]
    suspect_window: bool,
}

/// Runs the designs; exit 0 when no seed violated an invariant, 1 when one
/// did, 2 when a file cannot be loaded.
pub fn run(args: SimArgs) -> ExitCode {
    let mut designs = Vec::new();
    for file in &args.files {
        match Design::load(file) {
            Ok(design) => designs.push(design),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(config) = &args.consumer {
        match consumer_designs(config) {
            Ok(mut more) => designs.append(&mut more),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if args.suspect_window {
        for design in &mut designs {
            design.workload.suspect_window = true;
        }
    }
    let first = args.seed.unwrap_or(0);
    let seeds = args
        .seeds
        .unwrap_or(if args.seed.is_some() { 1 } else { 100 });
    let summaries: Vec<_> = designs
        .iter()
        .map(|d| idem_sim::run_seeds(d, first, seeds))
        .collect();
    match args.format {
        Format::Table => print!("{}", idem_sim::render_table(&summaries)),
        Format::Json => {
            let docs: Vec<String> = summaries.iter().map(|s| s.to_json()).collect();
            println!("[{}]", docs.join(",\n"));
        }
    }
    if args.bench {
        for design in &designs {
            let (intents, seconds) = idem_sim::bench(design, seeds);
            let rate = if seconds > 0.0 {
                intents as f64 / seconds
            } else {
                0.0
            };
            eprintln!(
                "bench {}: {intents} simulated intents in {seconds:.3} s = {rate:.0} intents/s",
                design.name
            );
        }
    }
    if summaries.iter().all(|s| s.passed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// One design per subscription of a consumer config: its contract, with
/// the contract's lease, retention and tombstone replaced by what the
/// subscription enforces, so the simulation judges the running consumer.
fn consumer_designs(config: &std::path::Path) -> anyhow::Result<Vec<Design>> {
    let consume = idem_consumer::config::ConsumeConfig::load(config)?;
    let mut designs = Vec::new();
    for sub in &consume.subscriptions {
        let Some(path) = &sub.contract else {
            anyhow::bail!(
                "{}: subscription {:?} names no contract; idem sim reads its replay sources \
                 (queue redelivery, DLQ redrive) from it",
                config.display(),
                sub.name
            );
        };
        let mut contract = idem_contract::load(path)?;
        let policy = &sub.policy;
        if let Some(c) = contract.concurrency.as_mut() {
            c.lease_ms = policy.lease_ms();
        }
        contract.retention = Some(idem_contract::schema::Retention {
            retention_s: policy.retention_s(),
            tombstone_s: policy.tombstone_s(),
        });
        let file = format!("--consumer {}", config.display());
        designs.push(Design::new(
            sub.name.clone(),
            file,
            contract,
            idem_sim::Workload::default(),
        )?);
    }
    Ok(designs)
}

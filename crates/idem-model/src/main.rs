//! The model check at a bound of your choosing, one command away:
//! `cargo run --release -p idem-model -- --depth 16`.

use std::process::ExitCode;

use clap::Parser;
use idem_model::{Bound, Protocol, check};

/// Checks idem's protocol (or a mutant) exhaustively up to a bound and
/// prints state counts, time and any counterexample trace. Exits 1 when the
/// real protocol violates a property or a mutant escapes, 2 on bad usage.
#[derive(Parser)]
#[command(name = "idem-model")]
struct Args {
    /// Steps explored from the start.
    #[arg(long, default_value_t = Bound::DEFAULT.depth_max)]
    depth: usize,
    /// Clients sending the same request under the one key.
    #[arg(long, default_value_t = Bound::DEFAULT.clients)]
    clients: usize,
    /// Requests each client sends at most (the first and its retries).
    #[arg(long, default_value_t = Bound::DEFAULT.requests_per_client)]
    requests: usize,
    /// Clients that may also claim through the unlocked fast path.
    #[arg(long, default_value_t = Bound::DEFAULT.fast_path_clients)]
    fast_path_clients: usize,
    /// Clients whose claims' answers may also arrive late, after the commit.
    #[arg(long, default_value_t = Bound::DEFAULT.late_answer_clients)]
    late_answer_clients: usize,
    /// Clients whose request may wait for the attempt holding the key.
    #[arg(long, default_value_t = Bound::DEFAULT.waiting_clients)]
    waiting_clients: usize,
    /// Clients whose retry may settle an unknown outcome with a lookup.
    #[arg(long, default_value_t = Bound::DEFAULT.settling_clients)]
    settling_clients: usize,
    /// How many times the store may lose its record of the key (a hard
    /// failover, a restore, a failback), each loss opening or extending
    /// the suspect window.
    #[arg(long, default_value_t = Bound::DEFAULT.tail_losses)]
    tail_losses: usize,
    /// The most states generated before the check stops, so that a deep
    /// run stops with a message instead of exhausting the memory (about
    /// 0.6 KiB each); 0 is no cap.
    #[arg(long, default_value_t = Bound::DEFAULT.states_max)]
    states_max: usize,
    /// Which protocol: real, a mutant's name, or all.
    #[arg(long, default_value = "all", value_parser = parse_protocols)]
    protocol: Protocols,
}

#[derive(Clone)]
struct Protocols(Vec<Protocol>);

fn parse_protocols(name: &str) -> Result<Protocols, String> {
    if name == "all" {
        return Ok(Protocols(Protocol::ALL.to_vec()));
    }
    let names: Vec<&str> = Protocol::ALL.iter().map(|p| p.name()).collect();
    Protocol::from_name(name)
        .map(|p| Protocols(vec![p]))
        .ok_or_else(|| format!("unknown protocol; expected all, {}", names.join(", ")))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let bound = Bound {
        clients: args.clients,
        requests_per_client: args.requests,
        fast_path_clients: args.fast_path_clients,
        late_answer_clients: args.late_answer_clients,
        waiting_clients: args.waiting_clients,
        settling_clients: args.settling_clients,
        tail_losses: args.tail_losses,
        depth_max: args.depth,
        states_max: args.states_max,
    };
    let mut failed = false;
    for protocol in args.protocol.0 {
        let report = match check(protocol, bound) {
            Ok(report) => report,
            Err(e) => {
                eprintln!("idem-model: {e}");
                return ExitCode::from(2);
            }
        };
        print!("{report}");
        let caught = !report.violations.is_empty();
        match (protocol, caught, report.capped) {
            (Protocol::Real, true, _) => failed = true,
            (Protocol::Real, false, false) => println!("  no violation"),
            (Protocol::Real, false, true) => {
                println!("  no violation among the states reached; the bound is not proved");
                failed = true;
            }
            (_, false, capped) => {
                let within = if capped {
                    "among the states reached"
                } else {
                    "within the bound"
                };
                println!("  MUTANT ESCAPED {within}");
                failed = true;
            }
            (_, true, _) => {}
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

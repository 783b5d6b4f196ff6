//! idem-bench: benchmarks that print ratios against a baseline measured in
//! the same run, one subcommand each. They report; they never assert.
//!
//! Usage:
//! - `cargo run --release -p idem-bench -- sqlite [--callers 64] [--seconds 5] [--dir DIR]`
//! - `cargo run --release -p idem-bench -- gateway [--connections 32] [--seconds 5] [--keys 4096] [--dir DIR]`

mod args;
mod gateway;
mod load;
mod server;
mod sqlite;
mod upstream;

use anyhow::bail;

const USAGE: &str = "usage: idem-bench sqlite [--callers N] [--seconds S] [--dir DIR]\n       \
     idem-bench gateway [--connections N] [--seconds S] [--keys N] [--dir DIR]";

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("sqlite") => sqlite::main(args),
        Some("gateway") => gateway::main(args),
        _ => bail!(USAGE),
    }
}

/// How a target is reported.
fn verdict(met: bool) -> &'static str {
    if met { "MET" } else { "MISSED" }
}

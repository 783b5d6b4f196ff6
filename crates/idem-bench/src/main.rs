//! idem-bench: benchmarks that print ratios against a baseline measured in
//! the same run, one subcommand each. They report; they never assert.
//!
//! Usage:
//! - `cargo run --release -p idem-bench -- sqlite [--callers 64] [--seconds 5] [--dir DIR]`
//! - `cargo run --release -p idem-bench -- gateway [--connections 32] [--seconds 5] [--keys 4096] [--dir DIR]`
//! - `cargo run --release -p idem-bench -- postgres [--connections 16] [--seconds 5] [--url URL]`
//! - `cargo run --release -p idem-bench -- purge [--records 1000000] [--callers 32] [--seconds 5]
//!   [--dir DIR]`
//! - `cargo build --release -p idem && cargo run --release -p idem-bench -- consume
//!   [--messages 20000] [--concurrency 8] [--broker rabbitmq|nats] [--store postgres://…]
//!   [--idem PATH] [--dir DIR]`
//!
//! - `cargo run --release -p idem-bench -- dynamodb [--endpoint URL] [--keys 200] [--body 1024]`
//!   (requests and capacity per key on the DynamoDB store, beside Powertools' pattern)
//!
//! - `cargo run --release -p idem-bench -- sync-commit [--commits 500]` (builds a throwaway
//!   primary and synchronous standby from the machine's PostgreSQL binaries)
//!
//! `bare-consume` is not for people: `consume` starts it as its baseline.

mod args;
mod bare;
mod consume;
mod dynamodb;
mod fixtures;
mod gateway;
mod load;
mod measured;
mod nats;
mod plain_sqlite;
mod postgres;
mod purge;
mod queue;
mod rabbit;
mod server;
mod sqlite;
mod sqs;
mod sync_commit;
mod upstream;

use anyhow::bail;

const USAGE: &str = "usage: idem-bench sqlite [--callers N] [--seconds S] [--dir DIR]\n       \
     idem-bench gateway [--connections N] [--seconds S] [--keys N] [--dir DIR]\n       \
     idem-bench postgres [--connections N] [--seconds S] [--url URL]\n       \
     idem-bench purge [--records N] [--callers N] [--seconds S] [--dir DIR]\n       \
     idem-bench consume [--messages N] [--concurrency N] [--broker rabbitmq|nats] [--store URL] \
     [--idem PATH] [--dir DIR]\n       \
     idem-bench dynamodb [--endpoint URL] [--keys N] [--body BYTES]\n       \
     idem-bench sync-commit [--commits N]";

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("sqlite") => sqlite::main(args),
        Some("gateway") => gateway::main(args),
        Some("postgres") => postgres::main(args),
        Some("purge") => purge::main(args),
        Some("consume") => consume::main(args),
        Some("sync-commit") => sync_commit::main(args),
        Some("dynamodb") => dynamodb::main(args),
        Some("bare-consume") => bare::main(args),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown benchmark '{other}'\n{USAGE}"),
        None => bail!("no benchmark named\n{USAGE}"),
    }
}

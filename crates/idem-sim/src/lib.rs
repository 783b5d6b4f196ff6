//! `idem sim`: a deterministic fault-injection simulator that runs an
//! operation's topology in virtual time against the real idem-core decision
//! and stores, and counts duplicate and lost effects — from one `u64` seed.
//!
//! - [`Design`]: a contract file (the `idem check` format) plus a [`Workload`].
//! - [`run`] / [`run_with_store`]: one seed → [`RunReport`]; pure and deterministic.
//! - [`run_seeds`]: many seeds → [`Summary`], with the replay command of every violation.
//! - [`bench`]: simulated intents per second.
//!
//! The world (queue, orchestrator, payout API, bank rail, reconciler,
//! regions) injects faults and writes what happened to a log; a separate
//! checker judges the log against the invariants I1–I6 (docs/contract.md).
//! See docs/simulation.md.
//!
//! ```
//! let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/payouts.toml");
//! let design = idem_sim::Design::load(&path).map_err(|e| e.to_string())?;
//! let summary = idem_sim::run_seeds(&design, 1, 5);
//! assert_eq!(summary.counts.duplicates, 0);
//! assert!(summary.passed(), "{}", summary.render_table());
//! # Ok::<(), String>(())
//! ```

mod checker;
mod design;
mod report;
mod rng;
mod tap;
mod world;

use std::sync::Arc;
use std::time::Instant;

use idem_core::{Clock, MemoryStore, Store};

pub use design::{Design, SimError, Workload};
pub use report::{
    Counts, Coverage, Finding, RunReport, Summary, VIOLATIONS_KEPT_MAX, Violation, render_table,
};
pub use rng::Rng;

/// Runs one seed of `design` against the memory store.
pub fn run(design: &Design, seed: u64) -> RunReport {
    run_with_store(design, seed, &memory_store)
}

/// Runs one seed with the store under test made by `make_store` (called
/// once per region, given the simulated clock). Tests pass broken stores here.
pub fn run_with_store(
    design: &Design,
    seed: u64,
    make_store: &dyn Fn(Arc<dyn Clock>) -> Arc<dyn Store>,
) -> RunReport {
    let topo = match design::Topology::derive(design) {
        Ok(t) => t,
        Err(e) => {
            return RunReport {
                seed,
                counts: Counts::default(),
                coverage: Coverage::default(),
                findings: vec![Finding::new("sim", e.to_string())],
            };
        }
    };
    let op = &design.contract.operation.name;
    let log = world::simulate(&topo, &design.workload, op, seed, make_store);
    let (counts, findings) = checker::check(&log, &topo);
    RunReport {
        seed,
        counts,
        coverage: log.coverage,
        findings,
    }
}

/// Runs seeds `first_seed .. first_seed + n` against the memory store.
pub fn run_seeds(design: &Design, first_seed: u64, n: u64) -> Summary {
    run_seeds_with_store(design, first_seed, n, &memory_store)
}

/// [`run_seeds`] with the store under test made by `make_store`.
///
/// Seeds are independent worlds, so they run on every core the machine
/// offers; the reports are added in seed order, so the summary is the same
/// as one thread's.
pub fn run_seeds_with_store(
    design: &Design,
    first_seed: u64,
    n: u64,
    make_store: &(dyn Fn(Arc<dyn Clock>) -> Arc<dyn Store> + Sync),
) -> Summary {
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get() as u64);
    run_seeds_on(threads, design, first_seed, n, make_store)
}

/// [`run_seeds_with_store`] on `threads` threads, each a contiguous run of seeds.
fn run_seeds_on(
    threads: u64,
    design: &Design,
    first_seed: u64,
    n: u64,
    make_store: &(dyn Fn(Arc<dyn Clock>) -> Arc<dyn Store> + Sync),
) -> Summary {
    let end = first_seed.saturating_add(n);
    let threads = threads.max(1);
    let chunk = (end - first_seed).div_ceil(threads).max(1);
    let reports: Vec<Vec<RunReport>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| first_seed.saturating_add(t.saturating_mul(chunk)))
            .take_while(|&from| from < end)
            .map(|from| {
                let seeds = from..from.saturating_add(chunk).min(end);
                s.spawn(move || {
                    seeds
                        .map(|seed| run_with_store(design, seed, make_store))
                        .collect()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    summarize(design, first_seed, reports.iter().flatten())
}

/// The summary of `reports`, added in the order given.
fn summarize<'r>(
    design: &Design,
    first_seed: u64,
    reports: impl IntoIterator<Item = &'r RunReport>,
) -> Summary {
    let mut summary = Summary::new(&design.name, &design.file, first_seed);
    for report in reports {
        summary.add(report);
    }
    let failover = design::Topology::derive(design).is_ok_and(|t| t.regions() > 1);
    summary.close(failover);
    summary
}

/// Runs `seeds` seeds and returns (intents simulated, wall-clock seconds).
pub fn bench(design: &Design, seeds: u64) -> (u64, f64) {
    let started = Instant::now();
    let summary = run_seeds(design, 0, seeds);
    (summary.counts.intents, started.elapsed().as_secs_f64())
}

/// The reference store: the memory store on the simulated clock.
pub fn memory_store(clock: Arc<dyn Clock>) -> Arc<dyn Store> {
    Arc::new(MemoryStore::new(clock))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds run on several threads; the summary must be the one a
    /// single thread adding them in order would give, byte for byte (the
    /// design has violations, kept in seed order).
    #[test]
    fn seeds_on_many_threads_sum_as_on_one() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/contracts/incident-two-dlq-redrive.toml");
        let design = Design::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let (first, n) = (3, 37);
        let reports: Vec<RunReport> = (first..first + n).map(|seed| run(&design, seed)).collect();
        let one = summarize(&design, first, &reports);
        // Four threads whatever the machine has: 37 seeds in runs of 10.
        let many = run_seeds_on(4, &design, first, n, &memory_store);
        assert_eq!(many.to_json(), one.to_json());
        assert_eq!(many.render_table(), one.render_table());
    }
}

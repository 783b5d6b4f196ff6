//! Prints simulated intents per second for each built-in design.
fn main() -> Result<(), idem_sim::SimError> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut summaries = Vec::new();
    for file in [
        "examples/contracts/incident-one-key-per-attempt.toml",
        "examples/contracts/incident-two-dlq-redrive.toml",
        "examples/contracts/payouts.toml",
        "examples/contracts/active-active-async.toml",
        "examples/sim/active-active-home-region.toml",
        "examples/sim/active-active-sync.toml",
    ] {
        let design = idem_sim::Design::load(&root.join(file))?;
        let (intents, seconds) = idem_sim::bench(&design, 1000);
        println!(
            "{:<30} {intents} intents in {seconds:.3} s = {:.0} intents/s",
            design.name,
            intents as f64 / seconds
        );
        summaries.push(idem_sim::run_seeds(&design, 0, 1000));
    }
    print!("{}", idem_sim::render_table(&summaries));
    Ok(())
}

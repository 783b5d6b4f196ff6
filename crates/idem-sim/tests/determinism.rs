//! One seed decides a run: the same seed gives the same bytes, another seed
//! gives another run.

use std::path::Path;

use idem_sim::{Design, run, run_seeds};

fn design(file: &str) -> Design {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(file);
    Design::load(&path).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn same_seed_same_bytes() {
    for file in [
        "examples/contracts/payouts.toml",
        "examples/contracts/active-active-async.toml",
        "examples/contracts/incident-two-dlq-redrive.toml",
    ] {
        let d = design(file);
        let a = run_seeds(&d, 40, 50);
        let b = run_seeds(&d, 40, 50);
        assert_eq!(a.to_json().into_bytes(), b.to_json().into_bytes(), "{file}");
        assert_eq!(a.render_table().into_bytes(), b.render_table().into_bytes());
        assert_eq!(run(&d, 7), run(&d, 7));
    }
}

#[test]
fn different_seeds_differ() {
    let d = design("examples/contracts/payouts.toml");
    assert_ne!(run(&d, 1).counts, run(&d, 2).counts);
}

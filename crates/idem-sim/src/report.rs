//! What a run and a batch of seeds report: counts, coverage counters, the
//! violated invariants with the command that replays each, as a table or JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// Violations kept in a [`Summary`] with their replay command; the rest are counted.
pub const VIOLATIONS_KEPT_MAX: usize = 20;

/// What one run (or the sum over seeds) counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Intents (business decisions) offered.
    pub intents: u64,
    /// Attempts the orchestrator made (claims sent).
    pub attempts: u64,
    /// Effects the bank rail performed.
    pub effects: u64,
    /// Effects beyond the first per intent.
    pub duplicates: u64,
    /// Intents that ended without any effect.
    pub lost: u64,
    /// Replays whose result is not the one effect's, or that answered a changed payload.
    pub wrong_replays: u64,
    /// Records still in progress or ambiguous in a live region at the end.
    pub stuck: u64,
    /// Ambiguous records the reconciler resolved.
    pub reconciliations: u64,
    /// Late replays past retention rejected (422 key-expired).
    pub late_replays_rejected: u64,
    /// Keys with effects in two regions.
    pub cross_region_keys: u64,
    /// Replicated writes the failed region had made (and acknowledged) but
    /// not yet shipped when it failed: lost for good. Always 0 under
    /// synchronous replication.
    pub tail_writes_lost: u64,
    /// Distinct keys those lost writes were about.
    pub tail_keys_lost: u64,
    /// Claims of keys the surviving store had no record of, inside the
    /// suspect window, answered with the bank's answer instead of paying
    /// again (0 without `suspect_window`).
    pub window_verified: u64,
    /// Virtual seconds simulated.
    pub virtual_s: u64,
}

/// How often each dangerous path was exercised; zero means the run could
/// not have caught a bug on that path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Coverage {
    /// A reply was lost, and a later attempt got the stored result replayed.
    pub lost_ack_then_replay: u64,
    /// The API crashed after the effect and the reconciler found and completed it.
    pub crash_after_effect_then_reconcile: u64,
    /// Claims answered 409 (in flight or outcome unknown).
    pub conflict_409: u64,
    /// Claims answered 422 (same key, different payload).
    pub mismatch_422: u64,
    /// Completions refused by the fencing token (a zombie's late write).
    pub fenced_zombie_write: u64,
    /// Replays served by the surviving region of a record made in the failed one.
    pub replay_after_failover: u64,
    /// The reconciler's lease sweep marked an attempt whose lease expired
    /// with no answer (its API crashed) ambiguous.
    pub lease_swept: u64,
    /// A lookup of an ambiguous attempt failed, and after the reconciler's
    /// backoff a later lookup resolved it.
    pub failed_lookup_then_resolved: u64,
}

/// One violated invariant in one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// `I1`…`I6` (docs/contract.md), or `sim` for a simulator error.
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
}

impl Finding {
    pub(crate) fn new(invariant: &'static str, detail: String) -> Finding {
        Finding { invariant, detail }
    }
}

/// The result of one seed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// Counts.
    pub counts: Counts,
    /// Coverage counters.
    pub coverage: Coverage,
    /// Violated invariants; empty when the run passed.
    pub findings: Vec<Finding>,
}

/// A violation with the command that replays it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The seed.
    pub seed: u64,
    /// `I1`…`I6`.
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
    /// `idem sim FILE --seed S`.
    pub replay: String,
}

/// Seeds `first_seed .. first_seed + seeds` of one design, summed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Design name.
    pub design: String,
    /// The contract file.
    pub file: String,
    /// First seed run.
    pub first_seed: u64,
    /// Seeds run.
    pub seeds: u64,
    /// Counts summed over seeds.
    pub counts: Counts,
    /// Coverage summed over seeds.
    pub coverage: Coverage,
    /// Seeds with at least one violation.
    pub seeds_violating: u64,
    /// Seeds violating each invariant.
    pub by_invariant: BTreeMap<&'static str, u64>,
    /// The first [`VIOLATIONS_KEPT_MAX`] violations, each with its replay command.
    pub violations: Vec<Violation>,
    /// Applicable coverage counters that stayed at zero: the run is vacuous on those paths.
    pub vacuous: Vec<&'static str>,
}

impl Summary {
    pub(crate) fn new(design: &str, file: &str, first_seed: u64) -> Summary {
        Summary {
            design: design.to_owned(),
            file: file.to_owned(),
            first_seed,
            seeds: 0,
            counts: Counts::default(),
            coverage: Coverage::default(),
            seeds_violating: 0,
            by_invariant: BTreeMap::new(),
            violations: Vec::new(),
            vacuous: Vec::new(),
        }
    }

    pub(crate) fn add(&mut self, run: &RunReport) {
        self.seeds += 1;
        add_counts(&mut self.counts, &run.counts);
        add_coverage(&mut self.coverage, &run.coverage);
        if !run.findings.is_empty() {
            self.seeds_violating += 1;
        }
        for f in &run.findings {
            *self.by_invariant.entry(f.invariant).or_default() += 1;
            if self.violations.len() < VIOLATIONS_KEPT_MAX {
                self.violations.push(Violation {
                    seed: run.seed,
                    invariant: f.invariant,
                    detail: f.detail.clone(),
                    replay: format!("idem sim {} --seed {}", self.file, run.seed),
                });
            }
        }
    }

    pub(crate) fn close(&mut self, failover_applies: bool) {
        let c = &self.coverage;
        let mut counters = vec![
            ("lost_ack_then_replay", c.lost_ack_then_replay),
            (
                "crash_after_effect_then_reconcile",
                c.crash_after_effect_then_reconcile,
            ),
            ("conflict_409", c.conflict_409),
            ("mismatch_422", c.mismatch_422),
            ("fenced_zombie_write", c.fenced_zombie_write),
            ("lease_swept", c.lease_swept),
            ("failed_lookup_then_resolved", c.failed_lookup_then_resolved),
        ];
        if failover_applies {
            counters.push(("replay_after_failover", c.replay_after_failover));
        }
        self.vacuous = counters
            .into_iter()
            .filter(|(_, n)| *n == 0)
            .map(|(name, _)| name)
            .collect();
    }

    /// True when no seed violated an invariant.
    pub fn passed(&self) -> bool {
        self.seeds_violating == 0
    }

    /// This summary as a table (header, one row, then violations).
    pub fn render_table(&self) -> String {
        render_table(std::slice::from_ref(self))
    }

    /// This summary as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Several designs as one aligned table, then each design's violations
/// (with replay commands) and vacuous coverage.
pub fn render_table(summaries: &[Summary]) -> String {
    let header = [
        "design",
        "seeds",
        "intents",
        "effects",
        "dup",
        "lost",
        "tail-lost",
        "tail-keys",
        "window-verified",
        "reconciled",
        "stuck",
        "wrong-replay",
        "ack-lost>replay",
        "crash>reconcile",
        "409",
        "422",
        "fenced",
        "failover-replay",
        "swept",
        "lookup-fail>resolve",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for s in summaries {
        let (k, c) = (&s.counts, &s.coverage);
        let cells = [
            s.seeds,
            k.intents,
            k.effects,
            k.duplicates,
            k.lost,
            k.tail_writes_lost,
            k.tail_keys_lost,
            k.window_verified,
            k.reconciliations,
            k.stuck,
            k.wrong_replays,
            c.lost_ack_then_replay,
            c.crash_after_effect_then_reconcile,
            c.conflict_409,
            c.mismatch_422,
            c.fenced_zombie_write,
            c.replay_after_failover,
            c.lease_swept,
            c.failed_lookup_then_resolved,
        ];
        let mut row = vec![s.design.clone()];
        row.extend(cells.iter().map(u64::to_string));
        rows.push(row);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|col| rows.iter().map(|r| r[col].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| match i {
                0 => format!("{cell:<w$}", w = widths[i]),
                _ => format!("{cell:>w$}", w = widths[i]),
            })
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    for s in summaries {
        render_notes(&mut out, s);
    }
    out
}

fn render_notes(out: &mut String, s: &Summary) {
    if !s.passed() {
        let by: Vec<String> = s
            .by_invariant
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        let _ = writeln!(
            out,
            "\n{}: {} of {} seeds violate an invariant ({})",
            s.design,
            s.seeds_violating,
            s.seeds,
            by.join(", ")
        );
        for v in &s.violations {
            let _ = writeln!(
                out,
                "  seed {} {}: {}\n    replay: {}",
                v.seed, v.invariant, v.detail, v.replay
            );
        }
    }
    if !s.vacuous.is_empty() {
        let _ = writeln!(
            out,
            "\n{}: VACUOUS on {} (never exercised)",
            s.design,
            s.vacuous.join(", ")
        );
    }
}

/// Adds `$c`'s listed fields into `$sum`'s.
macro_rules! add_fields {
    ($sum:expr, $c:expr; $($field:ident),+) => { $( $sum.$field += $c.$field; )+ };
}

fn add_counts(sum: &mut Counts, c: &Counts) {
    add_fields!(sum, c; intents, attempts, effects, duplicates, lost, wrong_replays, stuck,
        reconciliations, late_replays_rejected, cross_region_keys, tail_writes_lost, tail_keys_lost,
        window_verified, virtual_s);
}

fn add_coverage(sum: &mut Coverage, c: &Coverage) {
    add_fields!(sum, c; lost_ack_then_replay, crash_after_effect_then_reconcile, conflict_409,
        mismatch_422, fenced_zombie_write, replay_after_failover, lease_swept,
        failed_lookup_then_resolved);
}

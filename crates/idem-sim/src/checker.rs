//! The checker: judges a run's log against the invariants I1–I6
//! (docs/contract.md, "Invariants I1–I8"). It
//! never injects anything and never looks inside the world, only at what the
//! world wrote down (effects at the bank, answers the callers accepted, the
//! stores' final states).

use std::collections::BTreeMap;

use idem_core::{Fingerprint, RecordId};

use crate::design::{RegionMode, Topology};
use crate::report::{Counts, Coverage, Finding};

/// One payout the bank rail performed.
#[derive(Debug, Clone)]
pub(crate) struct EffectObs {
    pub intent: usize,
    pub id: RecordId,
    pub region: usize,
    pub fp: Fingerprint,
    pub body: String,
    pub at_ms: u64,
    /// The attempt that performed it held an acquired claim.
    pub acquired: bool,
}

/// A success answer a caller accepted (fresh or replayed).
#[derive(Debug, Clone)]
pub(crate) struct AnswerObs {
    pub id: RecordId,
    pub body: String,
    pub replay: bool,
    /// Fingerprint of the request that received the answer.
    pub fp: Fingerprint,
}

/// Everything the world recorded during one run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Log {
    pub intent_fps: Vec<Fingerprint>,
    pub effects: Vec<EffectObs>,
    pub answers: Vec<AnswerObs>,
    pub attempts: u64,
    pub reconciliations: u64,
    pub late_replays_rejected: u64,
    pub replication_conflicts: u64,
    /// Writes region 0 had made but not yet shipped when it failed.
    pub tail_writes_lost: u64,
    /// Distinct keys those writes were about.
    pub tail_keys_lost: u64,
    /// Fresh claims inside the suspect window the bank's lookup answered.
    pub window_verified: u64,
    pub stuck: u64,
    pub coverage: Coverage,
    pub truncated: bool,
    pub errors: Vec<String>,
    pub end_ms: u64,
}

/// Counts and violated invariants of one run.
pub(crate) fn check(log: &Log, topo: &Topology) -> (Counts, Vec<Finding>) {
    let mut findings = Vec::new();
    let mut per_intent = vec![0u64; log.intent_fps.len()];
    let mut by_key: BTreeMap<&RecordId, Vec<&EffectObs>> = BTreeMap::new();
    let (mut foreign, mut unclaimed) = (0u64, 0u64);
    for e in &log.effects {
        match per_intent.get_mut(e.intent) {
            Some(n) => *n += 1,
            None => unclaimed += 1,
        }
        if log.intent_fps.get(e.intent) != Some(&e.fp) {
            foreign += 1;
        }
        if !e.acquired {
            unclaimed += 1;
        }
        by_key.entry(&e.id).or_default().push(e);
    }
    let duplicates: u64 = per_intent.iter().map(|n| n.saturating_sub(1)).sum();
    let lost = per_intent.iter().filter(|n| **n == 0).count() as u64;
    let (mut wrong_body, mut wrong_payload) = (0u64, 0u64);
    for a in log.answers.iter().filter(|a| a.replay) {
        let effects = by_key.get(&a.id).map_or(&[][..], |v| v.as_slice());
        match effects.iter().find(|e| e.body == a.body) {
            None => wrong_body += 1,
            Some(e) if e.fp != a.fp => wrong_payload += 1,
            Some(_) => {}
        }
    }
    let cross_region_keys = by_key
        .values()
        .filter(|v| v.iter().any(|e| e.region != v[0].region))
        .count() as u64;

    if duplicates > 0 {
        let worst = per_intent.iter().enumerate().max_by_key(|(_, n)| **n);
        let (i, n) = worst.map_or((0, 0), |(i, n)| (i, *n));
        findings.push(Finding::new(
            "I1",
            format!("{duplicates} duplicate effects; intent {i} was paid {n} times"),
        ));
    }
    if lost > 0 || log.stuck > 0 || log.truncated {
        findings.push(Finding::new(
            "I2",
            format!(
                "{lost} intents without an effect, {} records stuck in progress or ambiguous{}",
                log.stuck,
                if log.truncated { ", run cut short" } else { "" }
            ),
        ));
    }
    if wrong_body > 0 {
        findings.push(Finding::new(
            "I3",
            format!("{wrong_body} replays returned a result no effect of that key produced"),
        ));
    }
    if foreign > 0 || wrong_payload > 0 {
        findings.push(Finding::new(
            "I4",
            format!(
                "{foreign} effects executed a changed payload; {wrong_payload} changed payloads were answered with another request's result"
            ),
        ));
    }
    if unclaimed > 0 {
        findings.push(Finding::new(
            "I5",
            format!("{unclaimed} effects without an acquired claim for an intent"),
        ));
    }
    let prevents_split = matches!(topo.mode, RegionMode::Sync | RegionMode::HomeRegion);
    if prevents_split && cross_region_keys > 0 {
        findings.push(Finding::new(
            "I6",
            format!("{cross_region_keys} keys have effects in two regions"),
        ));
    }
    for e in &log.errors {
        findings.push(Finding::new("sim", e.clone()));
    }
    let counts = Counts {
        intents: log.intent_fps.len() as u64,
        attempts: log.attempts,
        effects: log.effects.len() as u64,
        duplicates,
        lost,
        wrong_replays: wrong_body + wrong_payload,
        stuck: log.stuck,
        reconciliations: log.reconciliations,
        late_replays_rejected: log.late_replays_rejected,
        cross_region_keys,
        tail_writes_lost: log.tail_writes_lost,
        tail_keys_lost: log.tail_keys_lost,
        window_verified: log.window_verified,
        virtual_s: log.end_ms / 1000,
    };
    (counts, findings)
}

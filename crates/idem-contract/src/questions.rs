//! The twelve review questions as pure functions of a contract.
//!
//! Each returns one [`Finding`]: PASS with why (and the trade-off, if any),
//! FAIL with why and what to change, or UNANSWERED when the section it needs
//! is missing. Nothing here does I/O.

use crate::horizon::{Horizon, format_duration, replay_horizon};
use crate::report::{Finding, Question, Report};
use crate::schema::*;
use crate::validate::placeholders;

/// Judges `contract` against the twelve questions and computes its replay horizon.
pub fn check(contract: &Contract) -> Report {
    let horizon = replay_horizon(contract.replay.as_ref());
    let c = contract;
    let findings = Question::ALL
        .iter()
        .map(|q| match q {
            Question::Intent => intent(c),
            Question::Generation => generation(c),
            Question::Propagation => propagation(c),
            Question::Fingerprint => fingerprint(c),
            Question::Concurrency => concurrency(c),
            Question::Completion => completion(c),
            Question::Ambiguity => ambiguity(c),
            Question::Retention => retention(c, &horizon),
            Question::Scope => scope(c),
            Question::Failover => failover(c),
            Question::Recovery => recovery(c),
            Question::Testing => testing(c),
        })
        .collect();
    Report {
        operation: contract.operation.name.clone(),
        findings,
        horizon: horizon.ok(),
    }
}

fn missing(q: Question, section: &str) -> Finding {
    Finding::unanswered(
        q.as_str(),
        format!("no [{section}] section: the answer is an assumption"),
        format!("add [{section}] (see docs/contracts.md)"),
    )
}

fn intent(c: &Contract) -> Finding {
    let t = Question::Intent.as_str();
    let Some(i) = &c.intent else {
        return missing(Question::Intent, "intent");
    };
    if i.fields.is_empty() {
        return Finding::fail(
            t,
            "the intent names no identifying fields, so nothing tells two decisions apart",
            "list the business fields that identify one decision in intent.fields",
        );
    }
    Finding::pass(
        t,
        format!(
            "\"{}\", identified by {}",
            i.description,
            i.fields.join(", ")
        ),
    )
}

fn generation(c: &Contract) -> Finding {
    let t = Question::Generation.as_str();
    let Some(k) = &c.key else {
        return missing(Question::Generation, "key");
    };
    match k.source {
        KeySource::Business => business_key(c, k),
        KeySource::ContentHash => Finding::pass(
            t,
            "the key is a hash of the content: the same content always gets the same key \
             (whether two intents can share content is the fingerprint question)",
        ),
        KeySource::Uuid => match (k.minted_at, k.persisted_before_retries) {
            (None, _) => Finding::unanswered(
                t,
                "a UUID key, but key.minted_at does not say where it is minted",
                "set key.minted_at = \"boundary\" and persist the key before the first attempt",
            ),
            (Some(MintedAt::PerAttempt), _) => Finding::fail(
                t,
                "a fresh UUID per attempt names the attempt, not the intent: every retry is a new \
                 operation (incident one: sellers paid twice)",
                "mint the key once where the intent becomes stable and persist it before retrying, \
                 or derive it from the business fields (source = \"business\")",
            ),
            (Some(MintedAt::Boundary), None) => Finding::unanswered(
                t,
                "a UUID minted at the boundary, but not said whether it is persisted before retries",
                "set key.persisted_before_retries (it must be true)",
            ),
            (Some(MintedAt::Boundary), Some(false)) => Finding::fail(
                t,
                "the UUID is not persisted before retries: a crash or restart mints a new key for \
                 the same intent",
                "store the key with the intent before the first attempt",
            ),
            (Some(MintedAt::Boundary), Some(true)) => Finding::pass(
                t,
                "a UUID minted once at the boundary and persisted before any retry",
            ),
        },
    }
}

fn business_key(c: &Contract, k: &KeySpec) -> Finding {
    let t = Question::Generation.as_str();
    let template = k.template.as_deref().unwrap_or_default();
    let used = placeholders(template).unwrap_or_default();
    let Some(i) = &c.intent else {
        return Finding::unanswered(
            t,
            format!("template \"{template}\", but no [intent] to check its fields against"),
            "add [intent] with the identifying fields",
        );
    };
    let extra: Vec<&str> = used
        .iter()
        .filter(|u| !i.fields.contains(u))
        .map(String::as_str)
        .collect();
    if !extra.is_empty() {
        return Finding::fail(
            t,
            format!(
                "the template uses {} which are not intent fields: the key changes between attempts \
                 of one intent",
                extra.join(", ")
            ),
            "build the key only from intent.fields",
        );
    }
    let absent: Vec<&str> = i
        .fields
        .iter()
        .filter(|f| !used.contains(f))
        .map(String::as_str)
        .collect();
    if !absent.is_empty() {
        return Finding::fail(
            t,
            format!(
                "the template omits {}: two different intents share one key and the second is lost",
                absent.join(", ")
            ),
            format!("add {{{}}} to key.template", absent.join("}, {")),
        );
    }
    Finding::pass(
        t,
        format!("business key \"{template}\": every attempt of the intent computes the same key"),
    )
}

fn propagation(c: &Contract) -> Finding {
    let t = Question::Propagation.as_str();
    let Some(p) = &c.propagation else {
        return missing(Question::Propagation, "propagation");
    };
    let blind: Vec<&str> = p
        .dependencies
        .iter()
        .filter(|d| d.performs_effect && !d.receives_key)
        .map(|d| d.name.as_str())
        .collect();
    if !blind.is_empty() {
        return Finding::fail(
            t,
            format!(
                "{} performs the effect without receiving the key: an ambiguous attempt cannot be \
                 deduplicated or looked up there",
                blind.join(", ")
            ),
            "pass the key (or a value derived from it) to every dependency that performs the effect",
        );
    }
    if p.dependencies.is_empty() {
        return Finding::pass(
            t,
            "no downstream dependency: the effect is local to the operation",
        );
    }
    let names: Vec<&str> = p
        .dependencies
        .iter()
        .filter(|d| d.receives_key)
        .map(|d| d.name.as_str())
        .collect();
    Finding::pass(t, format!("the key reaches {}", names.join(", ")))
}

fn fingerprint(c: &Contract) -> Finding {
    let t = Question::Fingerprint.as_str();
    let Some(f) = &c.fingerprint else {
        return missing(Question::Fingerprint, "fingerprint");
    };
    let covered = |input: &str| {
        f.hashes.iter().any(|h| covers(h, input)) && !f.excluded.iter().any(|e| covers(e, input))
    };
    let outside: Vec<&str> = f
        .effect_inputs
        .iter()
        .filter(|i| !covered(i))
        .map(String::as_str)
        .collect();
    if !outside.is_empty() {
        return Finding::fail(
            t,
            format!(
                "effect inputs outside the fingerprint: {}; two intents that differ only there are \
                 treated as one, and the second is silently dropped",
                outside.join(", ")
            ),
            format!(
                "add {} to fingerprint.hashes (or carry it in the body)",
                outside.join(", ")
            ),
        );
    }
    match f.on_mismatch {
        OnMismatch::Reject => Finding::pass(
            t,
            format!(
                "hashes {}, covering every effect input; a reused key with another payload is rejected",
                f.hashes.join(", ")
            ),
        ),
        OnMismatch::Replay => Finding::fail(
            t,
            "a reused key with a different payload gets the first request's result: the second \
             intent is lost while its caller sees success",
            "set fingerprint.on_mismatch = \"reject\" (422 key-reused)",
        ),
        OnMismatch::Execute => Finding::fail(
            t,
            "a reused key with a different payload is executed: the fingerprint binds nothing",
            "set fingerprint.on_mismatch = \"reject\" (422 key-reused)",
        ),
    }
}

/// Does dotted path `outer` cover `inner` (equal, or a parent of it)?
fn covers(outer: &str, inner: &str) -> bool {
    inner == outer
        || inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with('.'))
}

fn concurrency(c: &Contract) -> Finding {
    let t = Question::Concurrency.as_str();
    let Some(cc) = &c.concurrency else {
        return missing(Question::Concurrency, "concurrency");
    };
    if cc.in_flight == InFlight::Execute {
        return Finding::fail(
            t,
            "a second attempt runs while the first is in flight: two effects",
            "set concurrency.in_flight = \"reject\" (409 with Retry-After) or \"wait\"",
        );
    }
    if cc.lease_ms < cc.upstream_timeout_ms {
        return Finding::fail(
            t,
            format!(
                "lease {} ms is shorter than the upstream timeout {} ms: the lease expires while \
                 the first attempt may still be running",
                cc.lease_ms, cc.upstream_timeout_ms
            ),
            format!(
                "raise concurrency.lease_ms to at least {}",
                cc.upstream_timeout_ms
            ),
        );
    }
    if cc.on_lease_expiry == LeaseExpiry::Takeover && !upstream_dedups(c) {
        return Finding::fail(
            t,
            "takeover after lease expiry re-runs the effect, and no effect-performing dependency \
             dedups by the key",
            "use on_lease_expiry = \"reconcile\", or have the provider dedup by the propagated key",
        );
    }
    Finding::pass(
        t,
        format!(
            "concurrent attempts are {}; lease {} ms covers the upstream timeout; expiry → {}",
            if cc.in_flight == InFlight::Reject {
                "rejected (409)"
            } else {
                "held until the first finishes"
            },
            cc.lease_ms,
            if cc.on_lease_expiry == LeaseExpiry::Reconcile {
                "reconcile"
            } else {
                "takeover (upstream dedups)"
            },
        ),
    )
}

/// Every dependency that performs the effect dedups by the key (and there is one).
pub(crate) fn upstream_dedups(c: &Contract) -> bool {
    let Some(p) = &c.propagation else {
        return false;
    };
    let effect: Vec<&Dependency> = p
        .dependencies
        .iter()
        .filter(|d| d.performs_effect)
        .collect();
    !effect.is_empty() && effect.iter().all(|d| d.dedups)
}

fn completion(c: &Contract) -> Finding {
    let t = Question::Completion.as_str();
    let Some(cp) = &c.completion else {
        return missing(Question::Completion, "completion");
    };
    match (cp.results_stored, cp.caller_reads_result) {
        (true, _) => Finding::pass(t, "the final result is stored and replayed byte for byte"),
        (false, false) => Finding::pass(
            t,
            "no caller reads the result (acknowledgement only), so a duplicate is simply acknowledged",
        ),
        (false, true) => Finding::fail(
            t,
            "the caller reads the result but it is not stored: a retry gets a different answer than \
             the first attempt",
            "set completion.results_stored = true and replay the stored result",
        ),
    }
}

fn ambiguity(c: &Contract) -> Finding {
    let t = Question::Ambiguity.as_str();
    let Some(a) = &c.ambiguity else {
        return missing(Question::Ambiguity, "ambiguity");
    };
    match a.reconcile {
        Reconcile::ProviderLookup => Finding::pass(
            t,
            format!(
                "an unknown outcome is looked up at the provider: {}",
                a.lookup.as_deref().unwrap_or("")
            ),
        ),
        Reconcile::SameTransaction => Finding::pass(
            t,
            "the effect and its record commit in one transaction: there is no unknown outcome",
        ),
        Reconcile::Outbox => Finding::pass(
            t,
            "the effect is written to an outbox with the record and relayed with the key",
        ),
        Reconcile::Manual => Finding::pass(
            t,
            "an operator resolves each ambiguous record; trade-off: every one waits for a person",
        ),
        Reconcile::Retry => Finding::fail(
            t,
            "an unknown outcome is retried blindly: if the first attempt succeeded, the effect happens twice",
            "reconcile by provider lookup, same transaction or outbox; never re-execute an unknown outcome",
        ),
        Reconcile::None => Finding::fail(
            t,
            "nothing resolves an unknown outcome: the intent is either lost or duplicated",
            "set ambiguity.reconcile to provider_lookup, same_transaction, outbox or manual",
        ),
    }
}

fn retention(c: &Contract, horizon: &Result<Horizon, Vec<String>>) -> Finding {
    let t = Question::Retention.as_str();
    let h = match horizon {
        Ok(h) => h,
        Err(m) => {
            return Finding::unanswered(
                t,
                format!("replay horizon unknown: {} not declared", m.join(", ")),
                "declare every replay source; write `{ enabled = false }` for one that does not exist",
            );
        }
    };
    let Some(r) = &c.retention else {
        return missing(Question::Retention, "retention");
    };
    let hz = format!("the replay horizon {}", format_duration(h.total_s));
    let mut short = Vec::new();
    if r.retention_s < h.total_s {
        short.push(format!("retention {}", format_duration(r.retention_s)));
    }
    if r.tombstone_s < h.total_s {
        short.push(format!("tombstone {}", format_duration(r.tombstone_s)));
    }
    for d in c.propagation.iter().flat_map(|p| &p.dependencies) {
        if let Some(w) = d.dedup_window_s.filter(|w| *w < h.total_s) {
            short.push(format!("{}'s dedup window {}", d.name, format_duration(w)));
        }
    }
    if short.is_empty() {
        return Finding::pass(
            t,
            format!(
                "retention {}, tombstone {} and every dedup window cover {hz}",
                format_duration(r.retention_s),
                format_duration(r.tombstone_s)
            ),
        );
    }
    let redrive = dlq_redriven(c);
    let incident = if redrive && r.retention_s < h.total_s {
        " (incident two: a DLQ redrive arrives after the records expired)"
    } else {
        ""
    };
    Finding::fail(
        t,
        format!(
            "shorter than {hz}: {}; a late attempt is executed again{incident}",
            short.join(", ")
        ),
        format!(
            "keep records and dedup windows at least {} ({} s), or shorten the replay sources",
            format_duration(h.total_s),
            h.total_s
        ),
    )
}

fn scope(c: &Contract) -> Finding {
    let t = Question::Scope.as_str();
    let Some(s) = &c.scope else {
        return missing(Question::Scope, "scope");
    };
    let regions = c.regions.as_ref().map_or(1, |r| r.names.len());
    let other_paths = c.replay.as_ref().is_some_and(|r| {
        r.client.as_ref().is_some_and(|x| on(x.enabled))
            || r.partner.as_ref().is_some_and(|x| on(x.enabled))
    });
    match s.level {
        ScopeLevel::Process => Finding::fail(
            t,
            "records live in one process: a retry on another instance or after a restart is not seen",
            "keep records in a shared store scoped by tenant (scope.level = \"tenant\")",
        ),
        ScopeLevel::Region if regions > 1 => Finding::fail(
            t,
            format!(
                "records are per region but {regions} regions serve the operation: a retry routed to another region is not seen"
            ),
            "scope keys by tenant or globally, and make the store's consistency span the regions",
        ),
        ScopeLevel::Queue if other_paths => Finding::fail(
            t,
            "records are per queue, but client retries or partner resubmissions reach the operation by other paths",
            "deduplicate in a shared store scoped by tenant, not in the queue alone",
        ),
        level => Finding::pass(
            t,
            format!(
                "keys are unique per {}, and every attempt is checked there",
                scope_name(level)
            ),
        ),
    }
}

fn scope_name(level: ScopeLevel) -> &'static str {
    match level {
        ScopeLevel::Process => "process",
        ScopeLevel::Tenant => "tenant",
        ScopeLevel::Queue => "queue",
        ScopeLevel::Region => "region",
        ScopeLevel::Global => "global key space",
    }
}

fn failover(c: &Contract) -> Finding {
    let t = Question::Failover.as_str();
    let Some(r) = &c.regions else {
        return missing(Question::Failover, "regions");
    };
    if r.names.len() <= 1 {
        return Finding::pass(
            t,
            "single region: one store decides every claim; trade-off: a regional outage stops the operation",
        );
    }
    let lag = r
        .replication_lag_ms
        .map(|ms| format!(" (about {ms} ms)"))
        .unwrap_or_default();
    match (r.replication, r.claims) {
        (Replication::Sync, _) => Finding::pass(
            t,
            "synchronous replication: a claim is acknowledged only once every region has it; \
             trade-off: each claim pays a cross-region round trip and stalls during a partition",
        ),
        // A hard failover loses the tail of claims and results that had not
        // reached the standby; idem alone cannot reconcile records it never
        // received, so the provider's dedup by the forwarded key is the
        // last line against running those effects twice.
        (Replication::Async, Some(Claims::HomeRegion)) if upstream_dedups(c) => Finding::pass(
            t,
            format!(
                "home-region routing: only a key's home region accepts its claim; after a hard \
                 failover the new home lacks the claims and results of the replication lag{lag}, \
                 which idem cannot reconcile alone, and the provider's dedup by the forwarded key \
                 is the last line; trade-off: a planned failover must wait for catch-up"
            ),
        ),
        (Replication::Async, Some(Claims::HomeRegion)) => Finding::fail(
            t,
            format!(
                "home-region routing, but after a hard failover the new home lacks the claims and \
                 results of the replication lag{lag}: a retry of such a key is claimed again and, \
                 since no provider is declared to dedup by the forwarded key, runs the effect twice"
            ),
            "have every provider that performs the effect dedup by the forwarded key (and \
             declare it in [[propagation.dependency]]), or replicate synchronously",
        ),
        (Replication::Async, _) => Finding::fail(
            t,
            format!(
                "asynchronous replication with claims accepted in {} regions: two regions can both \
                 accept the first claim within the replication lag{lag}",
                r.names.len()
            ),
            "route each key to a home region (claims = \"home_region\") or replicate synchronously",
        ),
        (Replication::None, _) => Finding::fail(
            t,
            "records are not replicated: after failover the other region has never seen the keys",
            "replicate the record store (synchronously, or asynchronously with home-region routing)",
        ),
    }
}

fn recovery(c: &Contract) -> Finding {
    let t = Question::Recovery.as_str();
    let Some(r) = &c.recovery else {
        return missing(Question::Recovery, "recovery");
    };
    // What a restore can lose, in hours, as the findings name it.
    let gap = match r.backup_interval_h {
        Some(h) => format!("up to {h} h"),
        None => "an unknown span (declare backup_interval_h)".to_owned(),
    };
    let back_up_together =
        "back up records with the business data (same database, or one consistent point in time)";
    match r.restore {
        Restore::Together => Finding::pass(
            t,
            match r.backup_interval_h {
                Some(h) => format!(
                    "records and business data are restored from the same point in time; \
                     trade-off: a restore loses up to {h} h of both"
                ),
                None => "records and business data are restored from the same point in time".into(),
            },
        ),
        Restore::NoBackups => Finding::pass(
            t,
            "nothing is restored, so records and data cannot diverge; trade-off: a lost store loses both",
        ),
        Restore::RecordsWithoutData if r.suspect_window => Finding::pass(
            t,
            format!(
                "a restore rolls records back by {gap} but not the data; the suspect window it \
                 opens verifies every fresh key with the provider before it runs; trade-off: \
                 routes without a lookup stay exposed (idem check --gateway names them)"
            ),
        ),
        Restore::RecordsWithoutData => Finding::fail(
            t,
            format!(
                "a restore rolls records back by {gap} but not the data: effects of that span lose \
                 their records and a retry executes them again"
            ),
            format!(
                "{back_up_together}, or restore with `idem store restore` / `idem store \
                 mark-restored` (suspect_window = true) and give each route a lookup"
            ),
        ),
        Restore::DataWithoutRecords => Finding::fail(
            t,
            format!(
                "a restore rolls the data back by {gap} but not the records: completed records \
                 replay success for effects the data no longer has"
            ),
            back_up_together,
        ),
    }
}

fn testing(c: &Contract) -> Finding {
    let t = Question::Testing.as_str();
    let Some(tc) = &c.testing else {
        return missing(Question::Testing, "testing");
    };
    let mut needed = vec![
        TestCase::Duplicate,
        TestCase::Concurrent,
        TestCase::Ambiguous,
        TestCase::FingerprintMismatch,
        TestCase::LateReplay,
    ];
    let dlq = dlq_redriven(c);
    if dlq {
        needed.push(TestCase::Redrive);
    }
    if c.regions.as_ref().is_some_and(|r| r.names.len() > 1) {
        needed.push(TestCase::Failover);
    }
    let absent: Vec<&str> = needed
        .iter()
        .filter(|n| !tc.covers.contains(n))
        .map(|n| n.as_str())
        .collect();
    if absent.is_empty() {
        let all: Vec<&str> = needed.iter().map(|n| n.as_str()).collect();
        return Finding::pass(t, format!("tests cover {}", all.join(", ")));
    }
    Finding::fail(
        t,
        format!("untested: {}", absent.join(", ")),
        format!(
            "add tests for {} and list them in testing.covers",
            absent.join(", ")
        ),
    )
}

/// A DLQ exists and its messages come back (manual or automatic redrive).
fn dlq_redriven(c: &Contract) -> bool {
    c.replay
        .as_ref()
        .and_then(|s| s.dlq.as_ref())
        .is_some_and(|d| {
            on(d.enabled) && matches!(d.redrive, Some(Redrive::Manual | Redrive::Automatic))
        })
}

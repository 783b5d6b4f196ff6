//! Counterexamples as a reader follows them: one numbered line per step, in
//! words, with the world after it (clock, record, effects, answers).

use std::fmt::Write as _;

use idem_core::Record;
use idem_core::decision::{Claim, Write};
use stateright::Path;

use crate::world::{Action, Answer, Gateway, ReadFirst, Receipt, Resolver, Told, World};
use crate::{IdemModel, world};

const ACTORS: [&str; 3] = ["reconciler", "operator", "the retry's inline lookup"];

/// The steps of `path`, each followed by the world it led to, and how
/// many there are. A trace that breaks `property` ends with what it was
/// about, where the world alone does not say.
pub(crate) fn render(
    model: &IdemModel,
    property: &str,
    path: Path<World, Action>,
) -> (String, usize) {
    let mut out = String::new();
    let steps = path.into_vec();
    if let Some((start, _)) = steps.first() {
        let _ = writeln!(out, "   0. start\n      -> {}", summary(model, start));
    }
    // A path pairs each state with the action leaving it (the last state
    // with none), so each action is printed with the world it produces.
    let actions = steps.iter().filter_map(|(w, a)| a.map(|a| (w, a)));
    for (step, (world, action)) in actions.enumerate() {
        let _ = writeln!(out, "  {:>2}. {}", step + 1, describe(model, world, action));
        if let Some(next) = world.after(model, action) {
            let _ = writeln!(out, "      -> {}", summary(model, &next));
        }
    }
    let last = steps.last().map(|(w, _)| w);
    if let Some(w) = last.filter(|_| property == crate::property::FAST_PATH_IS_THE_CLAIM) {
        let _ = writeln!(out, "      {}", fast_path_text(model, w));
    }
    (out, steps.len().saturating_sub(1))
}

fn describe(model: &IdemModel, w: &World, action: Action) -> String {
    let attempt_of = |i: usize| {
        w.attempts.get(i).map_or_else(String::new, |a| {
            format!("client {}'s attempt (token {})", a.client, a.token)
        })
    };
    match action {
        Action::Request {
            client,
            receipt: Receipt::AtOnce,
        } => {
            format!("client {client} sends the request; the gateway claims")
        }
        Action::Request {
            client,
            receipt: Receipt::Late,
        } => format!(
            "client {client} sends the request; the gateway claims, and the store's answer is delayed"
        ),
        Action::Request {
            client,
            receipt: Receipt::Uncommitted,
        } => format!(
            "client {client} sends the request; the store answers the claim before its batch \
             commits, and the commit never lands"
        ),
        Action::Ack { attempt } => format!(
            "the store's answer for {} reaches the gateway",
            attempt_of(attempt)
        ),
        Action::Snapshot { client } => {
            format!("client {client} sends the request; the store begins a read without the lock")
        }
        Action::Decide { client, first } => decide_text(model, w, client, first),
        Action::Forward { attempt } => format!("gateway forwards {}", attempt_of(attempt)),
        Action::NotSent { attempt } => {
            format!("gateway: {} never left; release", attempt_of(attempt))
        }
        Action::Commit { attempt } => {
            format!("upstream commits the effect of {}", attempt_of(attempt))
        }
        Action::Succeed { attempt } => {
            format!(
                "gateway gets the upstream's 201 for {}; complete",
                attempt_of(attempt)
            )
        }
        Action::Unknown { attempt } => format!(
            "gateway gets a timeout or 5xx for {}; mark ambiguous",
            attempt_of(attempt)
        ),
        Action::Crash { attempt } => format!("gateway crashes holding {}", attempt_of(attempt)),
        Action::Sweep => "reconciler's lease sweep marks the expired lease ambiguous".into(),
        Action::LoseTail => {
            "the store loses the key's record with its last writes; the suspect window opens".into()
        }
        Action::Verify { attempt, fails } => format!(
            "gateway asks the provider about {} before it forwards{}",
            attempt_of(attempt),
            if fails { " (the lookup fails)" } else { "" }
        ),
        Action::Look { resolver, fails } => format!(
            "{} reads the ambiguous record and asks the provider{}",
            ACTORS.get(resolver).unwrap_or(&"?"),
            if fails { " (the lookup fails)" } else { "" }
        ),
        Action::Resolve { resolver } => {
            let actor = ACTORS.get(resolver).unwrap_or(&"?");
            match w.resolvers.get(resolver) {
                Some(Resolver::Judged {
                    token,
                    answer,
                    asked_at,
                    lease_until,
                }) => format!(
                    "{actor} gives its verdict on token {token}: {} (asked {} the lease end)",
                    match answer {
                        Answer::Found(e) => format!("found, effect {e}"),
                        Answer::NotFound => "not found".into(),
                        Answer::Failed => "the lookup failed".into(),
                    },
                    if asked_at < lease_until {
                        "before"
                    } else {
                        "at or after"
                    }
                ),
                _ => format!("{actor} resolves"),
            }
        }
        Action::Wake { client } => {
            format!("client {client}'s waiting request asks the claim again")
        }
        Action::Settle { client } => {
            format!("client {client}'s retry asks the claim again after its inline lookup")
        }
        Action::Purge => "retention purge".into(),
        Action::Advance => "clock advances to the next deadline".into(),
    }
}

/// What the store does with a client's unlocked read: which half is as it
/// was at the snapshot, and whether the fast path answers or the claim
/// takes the lock.
fn decide_text(model: &IdemModel, w: &World, client: usize, first: ReadFirst) -> String {
    let Some(read) = w.clients.get(client).and_then(|c| c.reading.as_ref()) else {
        return format!("client {client}'s claim is decided");
    };
    let (record, now, half) = match first {
        ReadFirst::Clock => (
            w.record(),
            read.at,
            format!(
                "the clock as at the snapshot (+{}ms)",
                model.since_start_ms(read.at)
            ),
        ),
        ReadFirst::Record => (
            read.record.as_ref().map(|k| &k.0),
            w.now,
            format!(
                "the record as at the snapshot ({})",
                read.record
                    .as_ref()
                    .map_or("none".into(), |k| record_text(model, &k.0))
            ),
        ),
    };
    let mut last = w.last_token;
    let how = match model.answer_unlocked(record, now, &mut last) {
        Some(answer) => format!("the fast path answers {}", claim_text(&answer)),
        None => "the claim would write: the gateway claims under the lock".into(),
    };
    format!("the store's read for client {client} ends with {half}; {how}")
}

/// The fast path's answer in `w` beside the locked claim's, and its write.
fn fast_path_text(model: &IdemModel, w: &World) -> String {
    let Some((fast, locked, write)) = model.fast_path_beside_lock(w) else {
        return "the fast path does not answer here".into();
    };
    let write = match write {
        Write::None => "writes nothing",
        Write::Put(_) => "writes the record",
        Write::Delete => "deletes the record",
    };
    format!(
        "the fast path answers {}; the locked claim answers {} and {write}",
        claim_text(&fast),
        claim_text(&locked)
    )
}

fn claim_text(claim: &Claim) -> String {
    match claim {
        Claim::Acquired { token, .. } => format!("acquired (token {token})"),
        Claim::Replay { .. } => "a replay".into(),
        Claim::Mismatch { .. } => "422".into(),
        Claim::InFlight { .. } => "409".into(),
        Claim::OutcomeUnknown { .. } => "outcome unknown".into(),
        Claim::Expired { .. } => "expired".into(),
        _ => "another answer".into(),
    }
}

fn summary(model: &IdemModel, w: &World) -> String {
    let record = w.record().map_or("none".into(), |r| record_text(model, r));
    let effects: Vec<String> = w
        .effects
        .iter()
        .map(|e| format!("token {}", e.token))
        .collect();
    let told: Vec<String> = w
        .clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let answers: Vec<String> = c.told.iter().map(told_text).collect();
            let reading = c.reading.as_ref().map_or(String::new(), |read| {
                let record = read
                    .record
                    .as_ref()
                    .map_or("none".into(), |k| record_text(model, &k.0));
                format!(
                    " (reading: record {record} at +{}ms)",
                    model.since_start_ms(read.at)
                )
            });
            format!("c{i}: [{}]{reading}", answers.join(", "))
        })
        .collect();
    let gateways: Vec<String> = w
        .attempts
        .iter()
        .map(|a| {
            let g = match a.gateway {
                Gateway::Claimed => "awaiting the store's answer",
                Gateway::Verifying => "asking the provider",
                Gateway::Holding if a.sent => "forwarded",
                Gateway::Holding => "holding",
                Gateway::Answered => "answered",
                Gateway::Crashed => "crashed",
            };
            format!("{}:{g}", a.token)
        })
        .collect();
    let tries = w.tries.map_or(String::new(), |(token, failures, next_at)| {
        format!(
            " tries={failures} failed lookups of token {token}, next at +{}ms",
            model.since_start_ms(next_at)
        )
    });
    format!(
        "t=+{}ms record={record}{tries} effects=[{}] attempts=[{}] told {}",
        model.since_start_ms(w.now),
        effects.join(", "),
        gateways.join(" "),
        told.join(" "),
    )
}

fn record_text(model: &IdemModel, r: &Record) -> String {
    let mut text = format!(
        "{} token {} lease +{}ms",
        r.state,
        r.token,
        model.since_start_ms(r.lease_until)
    );
    if let Some(effect) = world::effect_of(r) {
        let _ = write!(text, " result effect {effect}");
    }
    text
}

fn told_text(t: &Told) -> String {
    match t {
        Told::Effect {
            effect,
            replayed: false,
        } => format!("201 effect {effect}"),
        Told::Effect {
            effect,
            replayed: true,
        } => format!("replay effect {effect}"),
        Told::InFlight => "409".into(),
        Told::Unknown => "unknown".into(),
        Told::Expired => "expired".into(),
        Told::NotProcessed => "not processed".into(),
        Told::Error => "5xx".into(),
        Told::LeaseSpent => "503 lease spent".into(),
    }
}

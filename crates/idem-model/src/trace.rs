//! Counterexamples as a reader follows them: one numbered line per step, in
//! words, with the world after it (clock, record, effects, answers).

use std::fmt::Write as _;

use idem_core::Record;
use stateright::Path;

use crate::world::{Action, Answer, Gateway, Resolver, Told, World};
use crate::{IdemModel, world};

const ACTORS: [&str; 2] = ["reconciler", "operator"];

/// The steps of `path`, each followed by the world it led to.
pub(crate) fn render(model: &IdemModel, path: Path<World, Action>) -> String {
    let mut out = String::new();
    let steps = path.into_vec();
    if let Some((start, _)) = steps.first() {
        let _ = writeln!(out, "   0. start\n      -> {}", summary(model, start));
    }
    // A path pairs each state with the action leaving it (the last state
    // with none), so each action is printed with the world it produces.
    let actions = steps.iter().filter_map(|(w, a)| a.map(|a| (w, a)));
    for (step, (world, action)) in actions.enumerate() {
        let _ = writeln!(out, "  {:>2}. {}", step + 1, describe(world, action));
        if let Some(next) = world.after(model, action) {
            let _ = writeln!(out, "      -> {}", summary(model, &next));
        }
    }
    out
}

fn describe(w: &World, action: Action) -> String {
    let attempt_of = |i: usize| {
        w.attempts.get(i).map_or_else(String::new, |a| {
            format!("client {}'s attempt (token {})", a.client, a.token)
        })
    };
    match action {
        Action::Request { client } => {
            format!("client {client} sends the request; the gateway claims")
        }
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
        Action::Purge => "retention purge".into(),
        Action::Advance => "clock advances to the next deadline".into(),
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
            format!("c{i}: [{}]", answers.join(", "))
        })
        .collect();
    let gateways: Vec<String> = w
        .attempts
        .iter()
        .map(|a| {
            let g = match a.gateway {
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
    }
}

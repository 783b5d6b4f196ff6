//! The console's HTML, written with `maud`: every value is escaped when it
//! is interpolated, so a stored body or a key full of markup shows as text.
//! The pages need no script; every control is a link, a button or a
//! labelled field, reachable with the keyboard.

use idem_core::{
    AMBIGUITY_EXCERPT_BYTES_MAX, JournalEntry, Record, RecordId, Resolved, State, Timestamp, Verb,
};
use idem_gateway::{OperatorName, RecordView, WindowView, rfc3339};
use maud::{DOCTYPE, Markup, html};

use super::records::{self, Backlog, Detail, Page, SCAN_ROWS_MAX, ScopeParts};
use super::samples::Series;
use super::search::{STATE_DEFAULT, STATES, Search, SearchParams};

/// What every signed-in page needs: the session's CSRF token for the
/// sign-out button, and who is signed in.
#[derive(Clone, Copy)]
pub(crate) struct Chrome<'a> {
    pub csrf: &'a str,
    pub operator: &'a str,
}

impl<'a> Chrome<'a> {
    /// The chrome of `live`'s pages.
    pub(crate) fn of(live: &'a super::session::Live) -> Chrome<'a> {
        Chrome {
            csrf: &live.csrf,
            operator: live.operator.as_str(),
        }
    }
}

/// The values of the resolve form, kept when it is shown again with an
/// error.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(crate) struct ResolveForm {
    pub scope: String,
    pub key: String,
    pub token: String,
    pub csrf: String,
    pub outcome: String,
    pub status: String,
    pub content_type: String,
    pub body: String,
    pub reason: String,
    pub confirm: String,
}

/// An operator's verb (expire, evict) on one attempt of a record.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(crate) struct VerbForm {
    pub scope: String,
    pub key: String,
    /// The record's token as the page showed it.
    pub token: String,
    pub csrf: String,
    /// Why: required, journaled.
    pub reason: String,
    /// Evict only: the record's key typed again, to confirm.
    pub confirm_key: String,
}

/// The sign-in page, with what went wrong last time, and a one-click
/// sign-in as the operator the trusted proxy named, if any.
pub(crate) fn sign_in(message: Option<&str>, proxied: Option<&OperatorName>) -> Markup {
    let body = html! {
        h1 { "Sign in" }
        p { "Sign in with your operator token (the value of its token_env variable, or of admin_token_env)." }
        @if let Some(message) = message {
            p.error role="alert" { (message) }
        }
        @if let Some(name) = proxied {
            form method="post" action="/ui/sign-in" {
                input type="hidden" name="token" value="";
                button #proxied type="submit" { "Continue as " (name.as_str()) }
            }
            p.hint { "Named by the proxy in front of this console." }
        }
        form method="post" action="/ui/sign-in" {
            label for="token" { "Operator token" }
            input #token type="password" name="token" autocomplete="current-password" required autofocus;
            button type="submit" { "Sign in" }
        }
    };
    layout("Sign in", None, body)
}

/// The overview: the backlog and the last hour's charts.
pub(crate) fn overview(
    chrome: Chrome,
    (backlog, window): (&Backlog, Option<&WindowView>),
    series: &[Series],
    now: Timestamp,
) -> Markup {
    let count = if backlog.more {
        format!("more than {}", backlog.count)
    } else {
        backlog.count.to_string()
    };
    let body = html! {
        h1 { "Overview" }
        @if let Some(w) = window.filter(|w| w.open) {
            section #suspect-window.warning role="alert" aria-labelledby="window" {
                h2 #window { "Suspect window open" }
                p {
                    "The store may have lost records (" (w.cause) "). Until " (w.until)
                    ", fresh claims on routes with a lookup are verified with the provider \
                     before they run; routes without one run unverified."
                }
                dl.facts {
                    dt { "Closes in" }
                    dd #window-closes { (w.closes_in_s) " s" }
                    dt { "Records may be lost after" }
                    dd { (w.since.as_deref().unwrap_or("unknown (a promotion)")) }
                }
            }
        }
        section aria-labelledby="backlog" {
            h2 #backlog { "Ambiguous backlog" }
            dl.facts {
                dt { "Records awaiting resolution" }
                dd #backlog-count { (count) }
                dt { "Oldest" }
                dd {
                    @match backlog.oldest {
                        Some(at) => { (age(at, now)) " old (acquired " (rfc3339(at)) ")" }
                        None => "none",
                    }
                }
            }
            p { a href="/ui/records" { "Review the ambiguous records" } }
        }
        section aria-labelledby="charts" {
            h2 #charts { "The last hour, per minute" }
            p.hint { "Counted by this gateway process since it started; the last bar is the minute in progress." }
            div.charts {
                @for s in series { (chart(s)) }
            }
        }
    };
    layout("Overview", Some(chrome), body)
}

/// A page of the record search with its form.
pub(crate) fn records(
    chrome: Chrome,
    search: &Search,
    page: &Page,
    next_link: Option<String>,
) -> Markup {
    let f = &search.filter;
    let body = html! {
        h1 { "Records" }
        (search_form(&f.key, &f.route, &f.tenant, &f.principal, &search.state, &search.older))
        @for note in &search.unsearchable {
            p.hint.unsearchable { "Not searched by tenant: " (note) "." }
        }
        p.hint {
            "Each page reads at most " (SCAN_ROWS_MAX) " records from the store and keeps those that match; "
            "a route (and a tenant) narrow what is read to their own records. "
            "A search that matches few may show a short page with a link to read on."
        }
        p #list-summary {
            (page.records.len()) " shown of " (page.scanned) " read"
            @if page.damaged > 0 { "; " (page.damaged) " unreadable (see idem records list)" }
            @if page.scan_bounded { "; the scan stopped at its bound" }
            "."
        }
        @if page.records.is_empty() {
            p #no-match { "No record matches on this page." }
        } @else {
            ul.records {
                @for r in &page.records { (record_item(r, f.tenant_of(r), page.now)) }
            }
        }
        nav aria-label="Pages" {
            @if let Some(link) = next_link { a href=(link) { "Next page" } }
        }
    };
    layout("Records", Some(chrome), body)
}

/// The search form again, with why the search could not run.
pub(crate) fn records_refused(chrome: Chrome, p: &SearchParams, why: &str) -> Markup {
    let body = html! {
        h1 { "Records" }
        (search_form(&p.key, &p.route, &p.tenant, &p.principal, &p.state, &p.older_than_min))
        p.error role="alert" #refused { (why) }
    };
    layout("Records", Some(chrome), body)
}

fn search_form(
    key: &str,
    route: &str,
    tenant: &str,
    principal: &str,
    state: &str,
    older: &str,
) -> Markup {
    let state = if state.is_empty() {
        STATE_DEFAULT
    } else {
        state
    };
    html! {
        form.filter #search method="get" action="/ui/records" role="search" {
            div {
                label for="key" { "Key (end with * for a prefix)" }
                input #key name="key" value=(key) placeholder="payout-2026-W36-*";
            }
            div {
                label for="route" { "Route (operation)" }
                input #route name="route" value=(route) placeholder="payouts";
            }
            div {
                label for="tenant" { "Tenant (header value or token claim)" }
                input #tenant name="tenant" value=(tenant) placeholder="acme";
            }
            div {
                label for="principal" { "Principal digest starts with" }
                input #principal name="principal" value=(principal);
            }
            div {
                label for="state" { "State" }
                select #state name="state" {
                    @for (value, label) in STATES {
                        option value=(value) selected[value == state] { (label) }
                    }
                }
            }
            div {
                label for="older" { "Older than (minutes)" }
                input #older name="older_than_min" inputmode="numeric" pattern="[0-9]*" value=(older);
            }
            button type="submit" { "Search" }
        }
    }
}

/// One record: its timeline, stored answer and forwarded key.
pub(crate) fn record(
    chrome: Chrome,
    (id, tenant): (&RecordId, Option<&str>),
    detail: &Detail,
    now: Timestamp,
    notice: Option<&str>,
) -> Markup {
    let body = html! {
        h1 { "Record" }
        @if let Some(notice) = notice { p.notice role="status" { (notice) } }
        (identity(id, tenant))
        @match &detail.record {
            Some(r) => {
                @let view = RecordView::new(r, now);
                p { "State: " strong #state { (state_name(view.state)) } " · token " (r.token.0) }
                @if view.state == State::Ambiguous {
                    p { a.button href=(link("/ui/resolve", id)) { "Resolve this record" } }
                    @if detail.lookup { (ask_form(chrome, r)) }
                }
                (verbs(chrome, r, view.state, now))
                (timeline(r, detail, now))
                (why_ambiguous(r))
                (request_summary(r))
                (answer(&view))
            }
            None => p #state { "No record is stored for this scope and key (never acquired, released as not executed, or purged)." },
        }
        (journal(&detail.journal))
    };
    layout("Record", Some(chrome), body)
}

/// The resolve form for `r`, with `form`'s values and an error, if any.
pub(crate) fn resolve(
    chrome: Chrome,
    r: &Record,
    form: &ResolveForm,
    error: Option<&str>,
) -> Markup {
    let completed = form.outcome == "completed";
    let not_executed = form.outcome == "not_executed";
    let body = html! {
        h1 { "Resolve" }
        (identity(&r.id, None))
        p { "Token " (r.token.0) ": the verdict is refused if the record has moved on to another attempt since." }
        @if let Some(error) = error { p.error role="alert" { (error) } }
        form method="post" action="/ui/resolve" {
            input type="hidden" name="csrf" value=(chrome.csrf);
            input type="hidden" name="scope" value=(r.id.scope.as_str());
            input type="hidden" name="key" value=(r.id.key.as_str());
            input type="hidden" name="token" value=(r.token.0);
            fieldset {
                legend { "What happened at the provider?" }
                div.choice {
                    input #completed type="radio" name="outcome" value="completed" checked[completed];
                    label for="completed" { "Completed: the effect happened; store this answer and replay it" }
                }
                div.choice {
                    input #not_executed type="radio" name="outcome" value="not_executed" checked[not_executed];
                    label for="not_executed" { "Not executed: the effect did not happen; release the key so a retry runs" }
                }
            }
            fieldset {
                legend { "The answer to store (completed only)" }
                label for="status" { "Status (what the provider says the request got, e.g. 200)" }
                input #status name="status" inputmode="numeric" value=(form.status);
                label for="content_type" { "Content type" }
                input #content_type name="content_type" value=(form.content_type);
                label for="body" { "Body" }
                textarea #body name="body" rows="6" { (form.body) }
            }
            label for="reason" { "Reason (required: what you checked, e.g. the provider's reference)" }
            textarea #reason name="reason" rows="3" required { (form.reason) }
            div.choice {
                input #confirm type="checkbox" name="confirm" value="yes" required;
                label for="confirm" { "I checked the provider and confirm this resolution" }
            }
            button type="submit" { "Resolve" }
        }
        p { a href=(link("/ui/record", &r.id)) { "Back to the record" } }
    };
    layout("Resolve", Some(chrome), body)
}

/// "Ask the provider now": one lookup of `r`'s attempt, by the route's
/// `[[lookup]]`, with the same verdict, fencing and try count as the
/// reconciler's.
fn ask_form(chrome: Chrome, r: &Record) -> Markup {
    html! {
        form #ask method="post" action="/ui/ask" {
            input type="hidden" name="csrf" value=(chrome.csrf);
            input type="hidden" name="scope" value=(r.id.scope.as_str());
            input type="hidden" name="key" value=(r.id.key.as_str());
            input type="hidden" name="token" value=(r.token.0);
            button type="submit" { "Ask the provider now" }
            span.hint { " Runs this route's lookup once for token " (r.token.0) "; the verdict lands only on this attempt." }
        }
    }
}

/// The operator's verbs this record takes now: expire a completed one;
/// evict a completed one, a tombstone, or an attempt whose lease has
/// ended (while it runs, why not). Evict asks for the key typed again.
fn verbs(chrome: Chrome, r: &Record, state: State, now: Timestamp) -> Markup {
    let lease_runs = r.may_still_commit(now);
    let hidden = html! {
        input type="hidden" name="csrf" value=(chrome.csrf);
        input type="hidden" name="scope" value=(r.id.scope.as_str());
        input type="hidden" name="key" value=(r.id.key.as_str());
        input type="hidden" name="token" value=(r.token.0);
    };
    html! {
        section #verbs aria-labelledby="verbs-title" {
            h2 #verbs-title { "Expire or evict" }
            @if state == State::Completed {
                form #expire method="post" action="/ui/expire" {
                    (hidden)
                    p.hint { "Expire: the stored answer is dropped now and the key becomes a tombstone; a late retry is refused as key-expired, never run." }
                    label for="expire-reason" { "Why expire it (required, journaled with your name)" }
                    textarea #expire-reason name="reason" rows="2" required {}
                    button type="submit" { "Expire" }
                }
            }
            @if lease_runs {
                p #evict-not-offered {
                    "Evict is not offered: an attempt may still commit until " (rfc3339(r.lease_until)) "."
                }
            } @else {
                form #evict method="post" action="/ui/evict" {
                    (hidden)
                    p.hint.warning { "Evict: the record is removed and the next request with this key runs again: a second effect if the first one happened." }
                    label for="evict-reason" { "Why evict it (required, journaled with your name)" }
                    textarea #evict-reason name="reason" rows="2" required {}
                    label for="evict-key" { "Type the key to confirm the eviction" }
                    input #evict-key name="confirm_key" required autocomplete="off";
                    button type="submit" { "Evict" }
                }
            }
        }
    }
}

/// A verb refused: why, in plain words; nothing was changed.
pub(crate) fn verb_refused(chrome: Chrome, id: &RecordId, verb: Verb, message: &str) -> Markup {
    let title = match verb {
        Verb::Expire => "Not expired",
        Verb::Evict => "Not evicted",
    };
    let body = html! {
        h1 { (title) }
        p.error role="alert" #conflict { (message) }
        p { "Nothing was changed. Look at the record as it is now before deciding again." }
        (identity(id, None))
        p { a href=(link("/ui/record", id)) { "Show the record as it is now" } }
    };
    layout(title, Some(chrome), body)
}

/// The record moved on (another attempt, resolved meanwhile) or the store
/// refused the verdict: nothing was written.
pub(crate) fn conflict(chrome: Chrome, id: &RecordId, message: &str) -> Markup {
    let body = html! {
        h1 { "Not resolved" }
        p.error role="alert" #conflict { (message) }
        p { "Nothing was overwritten. Look at the record as it is now before deciding again." }
        (identity(id, None))
        p { a href=(link("/ui/record", id)) { "Show the record as it is now" } }
    };
    layout("Not resolved", Some(chrome), body)
}

/// A refusal: a cross-site or stale form (no session shown), a bad
/// link, a store failure.
pub(crate) fn refused(chrome: Option<Chrome>, title: &str, message: &str) -> Markup {
    let body = html! {
        h1 { (title) }
        p.error role="alert" #refused { (message) }
        p { a href="/ui" { "Go to the console" } }
    };
    layout(title, chrome, body)
}

/// A link to a console page about one record.
pub(crate) fn link(path: &str, id: &RecordId) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("scope", id.scope.as_str())
        .append_pair("key", id.key.as_str())
        .finish();
    format!("{path}?{query}")
}

/// "3 min", "2 h 5 min": how long ago `at` was.
pub(crate) fn age(at: Timestamp, now: Timestamp) -> String {
    let s = at.millis_until(now) / 1000;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 => format!("{} h {} min", s / 3600, s / 60 % 60),
        _ => format!("{} d {} h", s / 86_400, s / 3600 % 24),
    }
}

fn layout(title: &str, chrome: Option<Chrome>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · idem console" }
                link rel="stylesheet" href="/ui/style.css";
                link rel="icon" type="image/svg+xml" href="/ui/favicon.svg";
            }
            body {
                header {
                    a.brand href="/ui" { "idem console" }
                    @if let Some(chrome) = chrome {
                        nav aria-label="Console" {
                            a href="/ui" { "Overview" }
                            a href="/ui/records" { "Records" }
                            span #operator { "Signed in as " strong { (chrome.operator) } }
                            form.inline method="post" action="/ui/sign-out" {
                                input type="hidden" name="csrf" value=(chrome.csrf);
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

fn record_item(r: &Record, tenant: Option<&str>, now: Timestamp) -> Markup {
    let parts = ScopeParts::of(&r.id.scope);
    let mut href = link("/ui/record", &r.id);
    if let Some(tenant) = tenant {
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("tenant", tenant)
            .finish();
        href = format!("{href}&{query}");
    }
    html! {
        li {
            a href=(href) { "Key " code { (r.id.key.as_str()) } }
            dl.facts {
                dt { "Route" } dd { (parts.operation) }
                dt { "State" } dd { (state_name(r.state_at(now))) }
                dt { "Principal" } dd {
                    @if let Some(tenant) = tenant { "tenant " strong.tenant { (tenant) } " · " }
                    code { (parts.principal) }
                }
                dt { "Acquired" } dd { (rfc3339(r.created_at)) }
                dt { "Token" } dd { (r.token.0) }
            }
        }
    }
}

fn identity(id: &RecordId, tenant: Option<&str>) -> Markup {
    let parts = ScopeParts::of(&id.scope);
    html! {
        dl.facts {
            dt { "Key" } dd #record-key { code { (id.key.as_str()) } }
            dt { "Route" } dd { (parts.operation) }
            @if let Some(tenant) = tenant { dt { "Tenant" } dd #tenant-value { (tenant) } }
            dt { "Principal digest" } dd { code { (parts.principal) } }
            dt { "Scope" } dd { code { (id.scope.as_str()) } }
        }
    }
}

fn timeline(r: &Record, detail: &Detail, now: Timestamp) -> Markup {
    html! {
        h2 { "Timeline" }
        ol.timeline {
            li { (rfc3339(r.created_at)) " — claimed by " code { (r.owner) }
                @if let Some(region) = &r.region { " in region " (region) }
                ", token " (r.token.0) " (" (age(r.created_at, now)) " ago)" }
            li { "Lease until " (rfc3339(r.lease_until)) }
            li { "Forwarded to the upstream "
                @match &detail.route {
                    Some(route) => {
                        @let (header, value) = records::forwarded(route, &r.id);
                        "with " code { (header) ": " (value) }
                        " (route " (idem_gateway::contracts::route_name(route)) "'s forward-key template): ask the provider by this reference"
                    }
                    None => "(no route of this gateway names this operation, so the forwarded key cannot be rendered)",
                }
            }
            @match (r.state, r.completed_at) {
                (State::Ambiguous, _) => li { "Marked ambiguous: the upstream's answer did not prove the outcome, or the lease ran out" },
                (_, Some(at)) => li { (rfc3339(at)) " — completed" },
                (State::InProgress, None) if now < r.lease_until => li { "In flight: the attempt holds its lease" },
                (State::InProgress, None) => li { "Lease ran out: the next claim or the reconciler marks the outcome unknown (or, under takeover, a retry runs)" },
                _ => {}
            }
            @match &detail.tries {
                Some(t) => li { (t.failures) " provider lookup(s) failed; next try not before " (rfc3339(t.next_at)) },
                None => li { "No failed provider lookup kept for this attempt" },
            }
            @if let Some(res) = &r.resolution {
                li { (res.at.map(rfc3339).unwrap_or_default()) " — resolved by " code { (res.by) } ": " (res.reason) }
            }
            @for e in detail.journal.iter().filter(|e| e.token == r.token) {
                @if let Some(verb) = e.verb {
                    li.verb { (rfc3339(e.at)) " — " (verb.past()) " by " code { (e.by) } ": " (e.reason) }
                }
            }
        }
    }
}

fn answer(view: &RecordView) -> Markup {
    html! {
        h2 { "Stored answer" }
        @match &view.result {
            None => p { "None stored." },
            Some(result) => {
                dl.facts {
                    dt { "Status" } dd #stored-status { (result.status) }
                    @for (name, value) in &result.headers { dt { (name) } dd { (value) } }
                    dt { "Body" } dd { (result.body_bytes) " bytes" }
                }
                @if let Some(text) = &result.body { pre #stored-body { (text) } }
                @if let Some(hex) = &result.body_hex { p { "Not UTF-8; hex:" } pre { (hex) } }
            }
        }
    }
}

/// Why the outcome is unknown: the upstream's status, the kind of error,
/// a bounded excerpt of its body, the node and the time, as the store
/// keeps them. Records written before the store kept a cause show "not
/// recorded"; the node's log of that time has it.
fn why_ambiguous(r: &Record) -> Markup {
    html! {
        section #why aria-labelledby="why-title" {
            h2 #why-title { "Why it is ambiguous" }
            @match &r.ambiguity {
                Some(note) => {
                    dl #why-cause {
                        dt { "What happened" } dd { (note.error) }
                        dt { "Upstream status" }
                        dd { @match note.status { Some(status) => (status), None => "none: no answer came" } }
                        dt { "Node" } dd { code { (note.node) } }
                        dt { "When" } dd { (rfc3339(note.at)) }
                    }
                    @match &note.excerpt {
                        Some(excerpt) => {
                            p { "The start of the upstream's answer (at most " (AMBIGUITY_EXCERPT_BYTES_MAX) " bytes):" }
                            pre #why-excerpt { (excerpt) }
                        }
                        None => p #why-excerpt { "No body was kept: none came, or its length was not known in advance." }
                    }
                }
                None if r.state == State::Ambiguous => p #why-cause {
                    "Not recorded: the attempt of " code { (r.owner) } " stopped before it could say why "
                    "(its lease ended " (rfc3339(r.lease_until)) "), or the record predates notes. "
                    "That node's log of that time has the cause."
                },
                None => p #why-cause { "Not ambiguous: nothing to explain." },
            }
        }
    }
}

/// What the request was: the fields its route declares safe to show
/// (`summary_fields`); nothing by default.
fn request_summary(r: &Record) -> Markup {
    let fields = r
        .ambiguity
        .as_ref()
        .map(|n| n.summary.as_slice())
        .unwrap_or_default();
    html! {
        section #summary aria-labelledby="summary-title" {
            h2 #summary-title { "Request summary" }
            @if fields.is_empty() {
                p #summary-fields { "Not recorded: the route declares no summary fields, the request had none of them, or the record is not ambiguous." }
            } @else {
                dl #summary-fields {
                    @for (pointer, value) in fields { dt { code { (pointer) } } dd { code { (value) } } }
                }
            }
        }
    }
}

fn journal(entries: &[JournalEntry]) -> Markup {
    html! {
        h2 { "Journal" }
        @if entries.is_empty() {
            p { "No resolution, expiry or eviction recorded for this key." }
        } @else {
            ol.timeline #journal {
                @for e in entries {
                    li {
                        (rfc3339(e.at)) " — token " (e.token.0) " "
                        @match e.verb {
                            Some(verb) => {
                                (verb.past()) " by " code { (e.by) } ": " (e.reason)
                                " (the key was "
                                (match e.outcome { Resolved::Completed => "completed", Resolved::NotExecuted => "without an outcome", })
                                @if let Some(status) = e.status { ", " (status) }
                                ")"
                            }
                            None => {
                                (match e.outcome { Resolved::Completed => "completed", Resolved::NotExecuted => "not executed", })
                                @if let Some(status) = e.status { " (" (status) ")" }
                                " by " code { (e.by) } ": " (e.reason)
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A bar chart of `s`, one bar per minute, drawn on the server.
fn chart(s: &Series) -> Markup {
    let (width, height) = (600u64, 100u64);
    let max = s.per_minute.iter().copied().max().unwrap_or(0);
    // The bars' scale; an empty hour draws no bar at all.
    let scale = max.max(1);
    let total: u64 = s.per_minute.iter().sum();
    let slot = width / super::samples::SAMPLES_MAX as u64;
    let offset = super::samples::SAMPLES_MAX.saturating_sub(s.per_minute.len()) as u64;
    let label = format!(
        "{}: {total} in the last hour, at most {max} in one minute",
        s.name
    );
    html! {
        figure.chart {
            figcaption { (s.name) ": " strong { (total) } }
            svg viewBox=(format!("0 0 {width} {height}")) role="img" aria-label=(label) {
                line.axis x1="0" y1=(height) x2=(width) y2=(height) {}
                @for (i, n) in s.per_minute.iter().enumerate() {
                    @let h = n * (height - 4) / scale;
                    rect x=((offset + i as u64) * slot + 1) y=(height - h) width=(slot - 2) height=(h) {
                        title { (n) }
                    }
                }
            }
        }
    }
}

fn state_name(state: State) -> &'static str {
    match state {
        State::InProgress => "in progress",
        State::Completed => "completed",
        State::Ambiguous => "ambiguous",
        State::Tombstone => "tombstone",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The label says what was counted: an empty hour is "at most 0", never
    /// the 1 the bars divide by.
    #[test]
    fn a_chart_labels_the_counted_maximum() {
        let cases: [(Vec<u64>, &str); 3] = [
            (vec![], "0 in the last hour, at most 0 in one minute"),
            (vec![0, 0], "0 in the last hour, at most 0 in one minute"),
            (vec![2, 5, 1], "8 in the last hour, at most 5 in one minute"),
        ];
        for (per_minute, said) in cases {
            let page = chart(&Series {
                name: "Decisions",
                per_minute,
            })
            .into_string();
            assert!(page.contains(said), "{said}: {page}");
        }
    }

    /// An attempt in flight is said to hold its lease only while it does.
    #[test]
    fn the_timeline_says_when_a_lease_ran_out() {
        use idem_core::{Fingerprint, IdempotencyKey, Scope, Token};
        let lease_until = Timestamp::from_millis(10_000);
        let record = Record {
            id: RecordId {
                scope: Scope::new("payouts|aa11").unwrap(),
                key: IdempotencyKey::new("k-1").unwrap(),
            },
            fingerprint: Fingerprint::from_bytes([7; 32]),
            state: State::InProgress,
            token: Token(3),
            owner: "gw-1".into(),
            region: None,
            lease_until,
            created_at: Timestamp::from_millis(0),
            completed_at: None,
            expires_at: None,
            tombstone_until: None,
            retention_s: 60,
            tombstone_s: 600,
            result: None,
            resolution: None,
            ambiguity: None,
        };
        let detail = super::super::records::Detail {
            record: Some(record.clone()),
            tries: None,
            journal: Vec::new(),
            route: None,
            lookup: false,
        };
        let cases = [
            (Timestamp::from_millis(9_999), "holds its lease"),
            (lease_until, "Lease ran out"),
        ];
        for (now, said) in cases {
            let page = timeline(&record, &detail, now).into_string();
            assert!(page.contains(said), "{said}: {page}");
        }
    }
}

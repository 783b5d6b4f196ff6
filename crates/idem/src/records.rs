//! `idem records …`: what an operator sees of the records in a store, as a
//! table for people or JSON for machines, the resolution of an ambiguous
//! record by hand, and the deliberate verbs `expire` and `evict`.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use clap::{ArgGroup, Args, ValueEnum};
use idem_core::{
    Clock, IdempotencyKey, JournalEntry, ListQuery, Outcome, RecordId, Resolution, Scope, State,
    StoreError, StoredResult, SystemClock, Token, Verb, VerbRequest,
};
use idem_gateway::{AmbiguityView, RecordView, outcome_name, rfc3339};

use crate::store_url::StoreArgs;

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    Table,
    /// One JSON document for machines.
    Json,
}

/// `idem records list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only records in this state (as of now): in_progress, completed,
    /// ambiguous or tombstone.
    #[arg(long, value_parser = parse_state)]
    state: Option<State>,
    #[command(flatten)]
    store: StoreArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// At most this many records (1-10000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    limit: u32,
}

/// `idem records show SCOPE KEY`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The scope, exactly as `records list` prints it.
    scope: String,
    /// The idempotency key.
    key: String,
    #[command(flatten)]
    store: StoreArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// `idem records resolve SCOPE KEY --token N (--completed … | --not-executed) --reason TEXT`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("outcome").required(true).args(["completed", "not_executed"])))]
pub struct ResolveArgs {
    /// The scope, exactly as `records list` prints it.
    scope: String,
    /// The idempotency key.
    key: String,
    /// The token of the attempt you resolve, as `records show` prints it. The
    /// resolution is refused if the record has moved on to another attempt.
    #[arg(long)]
    token: u64,
    /// The effect happened: store the result given by --status, --header and
    /// --body, and replay it to every retry.
    #[arg(long)]
    completed: bool,
    /// The effect did not happen: remove the record so that the next retry
    /// runs the request.
    #[arg(long)]
    not_executed: bool,
    /// Status of the stored result (with --completed).
    #[arg(long, conflicts_with = "not_executed", default_value_t = 200,
          value_parser = clap::value_parser!(u16).range(100..=599))]
    status: u16,
    /// File holding the stored body (with --completed); `-` reads stdin.
    #[arg(long, conflicts_with = "not_executed", value_name = "FILE")]
    body: Option<PathBuf>,
    /// A stored header, NAME:VALUE (with --completed); repeat for more.
    #[arg(long = "header", conflicts_with = "not_executed", value_name = "NAME:VALUE",
          value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// Why you resolve it this way; kept on a completed record.
    #[arg(long)]
    reason: String,
    /// Who resolves it [default: operator:$USER].
    #[arg(long)]
    by: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
}

/// `idem records expire|evict SCOPE KEY --token N --reason TEXT [--by NAME]`.
#[derive(Debug, Args)]
pub struct VerbArgs {
    /// The scope, exactly as `records list` prints it.
    scope: String,
    /// The idempotency key.
    key: String,
    /// The record's token, as `records show` prints it. Refused if the record
    /// has moved on to another attempt since.
    #[arg(long)]
    token: u64,
    /// Why (required, kept in the record's journal).
    #[arg(long)]
    reason: String,
    /// Who does it [default: operator:$USER].
    #[arg(long)]
    by: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
}

/// Lists records.
pub async fn list(args: ListArgs) -> anyhow::Result<()> {
    let (url, store) = args.store.open_existing()?;
    let query = ListQuery {
        state: args.state,
        after: None,
        limit: args.limit as usize,
    };
    let page = store
        .list(&query)
        .await
        .with_context(|| format!("cannot list records in {url}"))?;
    // A row this version cannot read is named, never silently skipped, and
    // never stops the listing of the others.
    for row in &page.damaged {
        eprintln!(
            "warning: the record at scope {:?} key {:?} cannot be read: {}",
            row.scope, row.key, row.reason
        );
    }
    if page.next.is_some() {
        eprintln!("note: more records follow; raise --limit to see them");
    }
    let now = SystemClock.now();
    let views: Vec<RecordView> = page
        .records
        .iter()
        .map(|r| RecordView::new(r, now))
        .collect();
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&views)?)?,
        Format::Table => write_table(&mut out, &views)?,
    }
    Ok(())
}

/// Shows one record.
pub async fn show(args: ShowArgs) -> anyhow::Result<()> {
    let id = record_id(&args.scope, &args.key)?;
    let (url, store) = args.store.open_existing()?;
    let record = store
        .get(&id)
        .await
        .with_context(|| format!("cannot read {url}"))?;
    let history = store
        .resolutions(&id)
        .await
        .with_context(|| format!("cannot read the resolution journal of {url}"))?;
    if record.is_none() && history.is_empty() {
        bail!(
            "no record for scope {:?} key {:?} in {url}",
            args.scope,
            args.key
        );
    }
    let now = SystemClock.now();
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => {
            // The record's view, or just its id when it was released, plus
            // every resolution it went through.
            let mut doc = match &record {
                Some(r) => serde_json::to_value(RecordView::new(r, now))?,
                None => serde_json::json!({ "scope": args.scope, "key": args.key, "state": null }),
            };
            if let Some(fields) = doc.as_object_mut() {
                fields.insert("resolutions".into(), serde_json::to_value(&history)?);
            }
            writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        }
        Format::Table => {
            match &record {
                Some(r) => write_details(&mut out, &RecordView::new(r, now))?,
                None => writeln!(out, "no record now (released or evicted); its journal:")?,
            }
            for entry in &history {
                writeln!(out, "{}", journal_line(entry))?;
            }
        }
    }
    Ok(())
}

/// Resolves an ambiguous record by hand, and says what it did.
pub async fn resolve(args: ResolveArgs) -> anyhow::Result<()> {
    let id = record_id(&args.scope, &args.key)?;
    let (scope, key) = (&args.scope, &args.key);
    let by = operator(args.by.as_deref(), &args.reason, "resolve it this way")?;
    let outcome = if args.completed {
        let body = match &args.body {
            Some(path) => read_body(path)?,
            None => Vec::new(),
        };
        let result = StoredResult::new(
            args.status,
            args.headers
                .iter()
                .map(|(n, v)| (n.clone(), v.as_str().into()))
                .collect(),
            body,
        )
        .context("the result cannot be stored")?;
        Outcome::Completed { result }
    } else {
        Outcome::NotExecuted
    };
    let resolution =
        Resolution::new(outcome, &by, &args.reason).context("the resolution is refused")?;
    let (url, store) = args.store.open_existing()?;
    let outcome = outcome_name(&resolution.outcome);
    match store.resolve(&id, Token(args.token), resolution).await {
        Ok(Some(record)) => {
            let (status, bytes) = record
                .result
                .as_ref()
                .map_or((0, 0), |r| (r.status(), r.body().len()));
            println!(
                "resolved scope {scope:?} key {key:?} as {outcome} by {by}: \
                 retries now get the stored result (status {status}, {bytes} body bytes)"
            );
        }
        Ok(None) => println!(
            "resolved scope {scope:?} key {key:?} as {outcome} by {by}: \
             the record is removed; the next retry runs the request"
        ),
        Err(e) => {
            return Err(refused(
                e,
                (scope, key, &url),
                ("resolve", "resolved"),
                "ambiguous",
            ));
        }
    }
    Ok(())
}

/// Applies `verb` to a record by hand, and says what it did.
pub async fn apply_verb(verb: Verb, args: VerbArgs) -> anyhow::Result<()> {
    let id = record_id(&args.scope, &args.key)?;
    let (scope, key) = (&args.scope, &args.key);
    let by = operator(
        args.by.as_deref(),
        &args.reason,
        &format!("{} it", verb.as_str()),
    )?;
    let request = VerbRequest::new(verb, &by, &args.reason)
        .with_context(|| format!("the {} is refused", verb.as_str()))?;
    let (url, store) = args.store.open_existing()?;
    match store.apply_verb(&id, Token(args.token), request).await {
        Ok(_) if verb == Verb::Expire => println!(
            "expired scope {scope:?} key {key:?} by {by}: its answer is dropped; \
             a retry with this key is refused as key-expired, never run"
        ),
        Ok(_) => println!(
            "evicted scope {scope:?} key {key:?} by {by}: the record is removed; \
             the next request with this key runs"
        ),
        Err(e) => {
            let verb = (verb.as_str(), verb.past());
            return Err(refused(e, (scope, key, &url), verb, "completed"));
        }
    }
    Ok(())
}

/// The operator a by-hand change is journaled under (`--by`, else this
/// machine's user), refused when it or the `reason` is empty; `what` says
/// what the reason explains ("expire it").
fn operator(by: Option<&str>, reason: &str, what: &str) -> anyhow::Result<String> {
    if reason.trim().is_empty() {
        bail!("--reason must not be empty: say why you {what}");
    }
    let by = by.map_or_else(default_actor, str::to_owned);
    if by.trim().is_empty() {
        bail!("--by must not be empty");
    }
    Ok(by)
}

/// Why the store refused to apply `verb` (and its past tense) to the
/// record of (scope, key) in `url`, in words that say nothing changed;
/// `needed` is the state the change needs ("completed").
fn refused(
    e: StoreError,
    (scope, key, url): (&str, &str, &dyn std::fmt::Display),
    (verb, done): (&str, &str),
    needed: &str,
) -> anyhow::Error {
    match e {
        StoreError::NotFound { .. } => {
            anyhow!("no record for scope {scope:?} key {key:?} in {url}; nothing was {done}")
        }
        e @ (StoreError::Fenced { .. } | StoreError::MayStillCommit { .. }) => {
            anyhow!("{e}; nothing was {done}")
        }
        StoreError::WrongState { state, .. } => anyhow!(
            "the record for scope {scope:?} key {key:?} is {state}, not {needed}, so it \
             cannot be {done}; nothing was changed"
        ),
        e => anyhow::Error::new(e).context(format!("cannot {verb} in {url}")),
    }
}

/// One journal entry as `records show` prints it: `resolved`, `expired` or
/// `evicted`, when, what, by whom and why.
fn journal_line(entry: &JournalEntry) -> String {
    let status = entry.status.map(|s| format!(" {s}")).unwrap_or_default();
    let label = entry.verb.map_or("resolved", Verb::past);
    format!(
        "{label:<16} {} {}{status} by {} (token {}): {}",
        rfc3339(entry.at),
        entry.outcome.as_str(),
        entry.by,
        entry.token,
        entry.reason
    )
}

fn record_id(scope: &str, key: &str) -> anyhow::Result<RecordId> {
    Ok(RecordId {
        scope: Scope::new(scope.to_owned()).with_context(|| format!("invalid scope {scope:?}"))?,
        key: IdempotencyKey::new(key).with_context(|| format!("invalid key {key:?}"))?,
    })
}

/// `operator:$USER`, or `operator` when `USER` is unset.
fn default_actor() -> String {
    match std::env::var("USER") {
        Ok(user) if !user.trim().is_empty() => format!("operator:{user}"),
        _ => "operator".to_owned(),
    }
}

/// The body for `--body FILE` (`-`: stdin), read no further than one byte
/// past what can be stored, so that a wrong file is refused quickly.
fn read_body(path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    use std::io::Read as _;
    let limit = idem_core::RESULT_BODY_BYTES_MAX as u64 + 1;
    let mut body = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .take(limit)
            .read_to_end(&mut body)
            .context("cannot read the body from stdin")?;
    } else {
        std::fs::File::open(path)
            .and_then(|f| f.take(limit).read_to_end(&mut body))
            .with_context(|| format!("cannot read --body {}", path.display()))?;
    }
    Ok(body)
}

fn parse_header(raw: &str) -> Result<(String, String), String> {
    let Some((name, value)) = raw.split_once(':') else {
        return Err(format!("{raw:?} is not NAME:VALUE"));
    };
    idem_gateway::result_header(name, value)
}

fn parse_state(raw: &str) -> Result<State, String> {
    raw.parse()
}

fn write_table(out: &mut impl std::io::Write, views: &[RecordView]) -> anyhow::Result<()> {
    if views.is_empty() {
        eprintln!("no records");
        return Ok(());
    }
    let rows: Vec<[String; 7]> = views
        .iter()
        .map(|v| {
            [
                v.scope.clone(),
                v.key.clone(),
                v.state.to_string(),
                v.token.to_string(),
                v.created_at.clone(),
                v.result
                    .as_ref()
                    .map_or("-".into(), |r| r.status.to_string()),
                v.region.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let header = [
        "SCOPE", "KEY", "STATE", "TOKEN", "CREATED", "STATUS", "REGION",
    ]
    .map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        writeln!(out, "{}", cells.join("  ").trim_end())?;
    }
    Ok(())
}

fn write_details(out: &mut impl std::io::Write, v: &RecordView) -> anyhow::Result<()> {
    let none = || "-".to_string();
    let lines = [
        ("scope", v.scope.clone()),
        ("key", v.key.clone()),
        ("state", v.state.to_string()),
        ("token", v.token.to_string()),
        ("owner", v.owner.clone()),
        ("region", v.region.clone().unwrap_or_else(none)),
        ("fingerprint", v.fingerprint.clone()),
        ("created_at", v.created_at.clone()),
        ("lease_until", v.lease_until.clone()),
        ("completed_at", v.completed_at.clone().unwrap_or_else(none)),
        ("expires_at", v.expires_at.clone().unwrap_or_else(none)),
        (
            "tombstone_until",
            v.tombstone_until.clone().unwrap_or_else(none),
        ),
    ];
    for (name, value) in lines {
        writeln!(out, "{name:<16} {value}")?;
    }
    if let Some(r) = &v.result {
        writeln!(out, "{:<16} {}", "status", r.status)?;
        for (name, value) in &r.headers {
            writeln!(out, "{:<16} {name}: {value}", "header")?;
        }
        match (&r.body, &r.body_hex) {
            (Some(text), _) => writeln!(out, "{:<16} {text}", "body")?,
            (None, Some(hex)) => writeln!(out, "{:<16} {hex}", "body (hex)")?,
            (None, None) => {}
        }
    }
    if let Some(res) = &v.resolution {
        let at = res.at.clone().unwrap_or_else(none);
        writeln!(
            out,
            "{:<16} {} by {} at {at}: {}",
            "resolution", res.outcome, res.by, res.reason
        )?;
    }
    if let Some(why) = &v.ambiguity {
        write_ambiguity(out, why)?;
    }
    Ok(())
}

/// Why the record is ambiguous, one line per part; the excerpt is the
/// upstream's text, so its line breaks are shown escaped.
fn write_ambiguity(out: &mut impl std::io::Write, why: &AmbiguityView) -> anyhow::Result<()> {
    let status = why
        .status
        .map(|s| format!(" (status {s})"))
        .unwrap_or_default();
    writeln!(out, "{:<16} {}{status}", "ambiguous_why", why.error)?;
    writeln!(out, "{:<16} {} at {}", "noted_by", why.node, why.at)?;
    if let Some(excerpt) = &why.excerpt {
        writeln!(out, "{:<16} {}", "excerpt", excerpt.escape_debug())?;
    }
    for field in &why.summary {
        writeln!(out, "{:<16} {} = {}", "summary", field.pointer, field.value)?;
    }
    Ok(())
}

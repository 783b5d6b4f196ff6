//! `idem records …`: what an operator sees of the records in a store, as a
//! table for people or JSON for machines.

use std::io::Write as _;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use idem_core::{
    Clock, IdempotencyKey, ListQuery, Record, RecordId, Scope, State, SystemClock, Timestamp,
};
use serde::Serialize;

use crate::store_url::{DEFAULT_STORE, StoreUrl};

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
    /// The store, as a URL.
    #[arg(long, default_value = DEFAULT_STORE)]
    store: String,
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
    /// The store, as a URL.
    #[arg(long, default_value = DEFAULT_STORE)]
    store: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// Lists records.
pub async fn list(args: ListArgs) -> anyhow::Result<()> {
    let url = StoreUrl::parse(&args.store)?;
    let records = match url.open_existing()? {
        Some(store) => {
            let query = ListQuery {
                state: args.state,
                after: None,
                limit: args.limit as usize,
            };
            store
                .list(&query)
                .await
                .with_context(|| format!("cannot list records in {url}"))?
        }
        None => {
            eprintln!("note: {url} does not exist yet; no records");
            Vec::new()
        }
    };
    let now = SystemClock.now();
    let views: Vec<RecordView> = records.iter().map(|r| RecordView::new(r, now)).collect();
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&views)?)?,
        Format::Table => write_table(&mut out, &views)?,
    }
    Ok(())
}

/// Shows one record.
pub async fn show(args: ShowArgs) -> anyhow::Result<()> {
    let url = StoreUrl::parse(&args.store)?;
    let id = RecordId {
        scope: Scope::new(args.scope.clone())
            .with_context(|| format!("invalid scope {:?}", args.scope))?,
        key: IdempotencyKey::parse(&args.key)
            .with_context(|| format!("invalid key {:?}", args.key))?,
    };
    let Some(store) = url.open_existing()? else {
        bail!(
            "{url} does not exist; no record for scope {:?} key {:?}",
            args.scope,
            args.key
        );
    };
    let Some(record) = store
        .get(&id)
        .await
        .with_context(|| format!("cannot read {url}"))?
    else {
        bail!(
            "no record for scope {:?} key {:?} in {url}",
            args.scope,
            args.key
        );
    };
    let view = RecordView::new(&record, SystemClock.now());
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&view)?)?,
        Format::Table => write_details(&mut out, &view)?,
    }
    Ok(())
}

fn parse_state(raw: &str) -> Result<State, String> {
    raw.parse()
}

/// A record as shown: the state as of now, times in RFC 3339, bodies as text.
#[derive(Debug, Serialize)]
struct RecordView {
    scope: String,
    key: String,
    state: State,
    token: u64,
    owner: String,
    fingerprint: String,
    created_at: String,
    lease_until: String,
    completed_at: Option<String>,
    expires_at: Option<String>,
    tombstone_until: Option<String>,
    result: Option<ResultView>,
    resolution: Option<ResolutionView>,
}

#[derive(Debug, Serialize)]
struct ResultView {
    status: u16,
    headers: Vec<(String, String)>,
    /// The body as UTF-8 text when it is text, otherwise absent.
    body: Option<String>,
    /// The body as lowercase hex when it is not UTF-8.
    body_hex: Option<String>,
    body_bytes: usize,
}

#[derive(Debug, Serialize)]
struct ResolutionView {
    outcome: &'static str,
    by: String,
    reason: String,
    at: Option<String>,
}

impl RecordView {
    fn new(r: &Record, now: Timestamp) -> RecordView {
        RecordView {
            scope: r.id.scope.to_string(),
            key: r.id.key.to_string(),
            state: r.state_at(now),
            token: r.token.0,
            owner: r.owner.clone(),
            fingerprint: r.fingerprint.to_hex(),
            created_at: rfc3339(r.created_at),
            lease_until: rfc3339(r.lease_until),
            completed_at: r.completed_at.map(rfc3339),
            expires_at: r.expires_at.map(rfc3339),
            tombstone_until: r.tombstone_until.map(rfc3339),
            result: r.result.as_ref().map(|res| {
                let text = std::str::from_utf8(res.body()).ok().map(str::to_owned);
                ResultView {
                    status: res.status(),
                    headers: res.headers().to_vec(),
                    body_hex: text.is_none().then(|| hex(res.body())),
                    body: text,
                    body_bytes: res.body().len(),
                }
            }),
            resolution: r.resolution.as_ref().map(|res| ResolutionView {
                outcome: match res.outcome {
                    idem_core::Outcome::Completed { .. } => "completed",
                    idem_core::Outcome::NotExecuted => "not_executed",
                },
                by: res.by.clone(),
                reason: res.reason.clone(),
                at: res.at.map(rfc3339),
            }),
        }
    }
}

fn write_table(out: &mut impl std::io::Write, views: &[RecordView]) -> anyhow::Result<()> {
    if views.is_empty() {
        eprintln!("no records");
        return Ok(());
    }
    let rows: Vec<[String; 6]> = views
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
            ]
        })
        .collect();
    let header = ["SCOPE", "KEY", "STATE", "TOKEN", "CREATED", "STATUS"].map(String::from);
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
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `2026-11-29T09:00:00.123Z` from milliseconds since the epoch (UTC; the
/// civil-from-days algorithm of H. Hinnant, so no date crate is needed).
fn rfc3339(t: Timestamp) -> String {
    let ms = t.as_millis();
    let (days, ms_of_day) = ((ms / 86_400_000) as i64, ms % 86_400_000);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1000 % 60,
        ms_of_day % 1000,
    );
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_timestamps_as_rfc3339() {
        let cases = [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (1_796_029_200_123, "2026-11-30T09:00:00.123Z"),
            (4_102_444_799_999, "2099-12-31T23:59:59.999Z"),
        ];
        for (ms, want) in cases {
            assert_eq!(rfc3339(Timestamp::from_millis(ms)), want);
        }
    }
}

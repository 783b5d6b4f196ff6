//! `dynamodb://TABLE?region=REGION&endpoint=URL&clock_skew_ms=N`: the one
//! string that names a DynamoDB store, checked before anything connects.

use std::fmt;

/// The clock skew a store tolerates unless its URL says otherwise, in
/// milliseconds: see [`DynamoUrl::clock_skew_ms`].
pub const CLOCK_SKEW_MS_DEFAULT: u64 = 1_000;
/// The largest clock skew a URL may declare, in milliseconds: past a
/// minute, a clock is broken, not skewed.
pub const CLOCK_SKEW_MS_MAX: u64 = 60_000;
/// The parameters a `dynamodb://` URL takes.
pub const URL_PARAMETERS: &[&str] = &["region", "endpoint", "clock_skew_ms"];

/// A checked `dynamodb://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamoUrl {
    /// The table's name.
    pub table: String,
    /// The AWS region; `None` takes the standard chain's (`AWS_REGION`,
    /// the profile).
    pub region: Option<String>,
    /// Another endpoint than AWS's, for a local emulator (`http://…`).
    pub endpoint: Option<String>,
    /// How far apart the clocks of the processes sharing the table may be,
    /// in milliseconds. DynamoDB has no server clock a condition can read,
    /// so each process decides against its own: a lease is judged over
    /// only this long after it ends by the judge's clock, and a "not
    /// executed" verdict waits as long past the attempt's lease.
    pub clock_skew_ms: u64,
}

impl DynamoUrl {
    /// Parses `dynamodb://TABLE[?region=…][&endpoint=…][&clock_skew_ms=…]`.
    pub fn parse(raw: &str) -> Result<DynamoUrl, String> {
        let rest = raw
            .strip_prefix("dynamodb://")
            .ok_or_else(|| format!("{raw:?} is not a dynamodb:// URL"))?;
        let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
        check_table(table)?;
        let mut url = DynamoUrl {
            table: table.to_owned(),
            region: None,
            endpoint: None,
            clock_skew_ms: CLOCK_SKEW_MS_DEFAULT,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("parameter {pair:?} has no value; write {pair}=…"))?;
            match name {
                "region" => url.region = Some(check_region(value)?),
                "endpoint" => url.endpoint = Some(check_endpoint(value)?),
                "clock_skew_ms" => url.clock_skew_ms = check_skew(value)?,
                other => {
                    return Err(format!(
                        "unknown parameter {other:?}; a dynamodb:// URL takes {}",
                        URL_PARAMETERS.join(", ")
                    ));
                }
            }
        }
        Ok(url)
    }
}

impl fmt::Display for DynamoUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dynamodb://{}", self.table)?;
        let mut sep = '?';
        let mut param = |f: &mut fmt::Formatter<'_>, name: &str, value: &str| {
            let r = write!(f, "{sep}{name}={value}");
            sep = '&';
            r
        };
        if let Some(region) = &self.region {
            param(f, "region", region)?;
        }
        if let Some(endpoint) = &self.endpoint {
            param(f, "endpoint", endpoint)?;
        }
        if self.clock_skew_ms != CLOCK_SKEW_MS_DEFAULT {
            param(f, "clock_skew_ms", &self.clock_skew_ms.to_string())?;
        }
        Ok(())
    }
}

/// DynamoDB's rule for table names: 3 to 255 of `a-z A-Z 0-9 _ - .`.
fn check_table(table: &str) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.');
    if !(3..=255).contains(&table.len()) || !table.bytes().all(allowed) {
        return Err(format!(
            "{table:?} is not a DynamoDB table name: use 3 to 255 letters, digits, '_', '-' or \
             '.', e.g. dynamodb://idem-records?region=eu-west-1"
        ));
    }
    Ok(())
}

fn check_region(region: &str) -> Result<String, String> {
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-';
    if region.is_empty() || !region.bytes().all(allowed) {
        return Err(format!(
            "region {region:?} is not an AWS region name, e.g. region=eu-west-1"
        ));
    }
    Ok(region.to_owned())
}

fn check_endpoint(endpoint: &str) -> Result<String, String> {
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        || endpoint.len() <= "https://".len()
    {
        return Err(format!(
            "endpoint {endpoint:?} is not an http:// or https:// URL, e.g. \
             endpoint=http://127.0.0.1:8000"
        ));
    }
    Ok(endpoint.to_owned())
}

fn check_skew(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(ms) if ms <= CLOCK_SKEW_MS_MAX => Ok(ms),
        _ => Err(format!(
            "clock_skew_ms={value:?} is not a whole number of milliseconds from 0 to \
             {CLOCK_SKEW_MS_MAX}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_url_reads_back_as_written() {
        let raw = "dynamodb://idem-records?region=eu-west-1&endpoint=http://127.0.0.1:8000&clock_skew_ms=250";
        let url = DynamoUrl::parse(raw).unwrap();
        assert_eq!(url.table, "idem-records");
        assert_eq!(url.region.as_deref(), Some("eu-west-1"));
        assert_eq!(url.endpoint.as_deref(), Some("http://127.0.0.1:8000"));
        assert_eq!(url.clock_skew_ms, 250);
        assert_eq!(url.to_string(), raw);
    }

    #[test]
    fn a_bare_table_takes_the_defaults() {
        let url = DynamoUrl::parse("dynamodb://t_1.x").unwrap();
        assert_eq!((url.region, url.endpoint), (None, None));
        assert_eq!(url.clock_skew_ms, CLOCK_SKEW_MS_DEFAULT);
    }

    #[test]
    fn each_mistake_is_named() {
        for (raw, said) in [
            ("dynamodb://", "not a DynamoDB table name"),
            ("dynamodb://ab", "not a DynamoDB table name"),
            ("dynamodb://a/b", "not a DynamoDB table name"),
            (
                "dynamodb://tbl?regoin=eu-west-1",
                "unknown parameter \"regoin\"",
            ),
            ("dynamodb://tbl?region", "has no value"),
            ("dynamodb://tbl?region=EU West", "not an AWS region"),
            (
                "dynamodb://tbl?endpoint=localhost:8000",
                "not an http:// or https://",
            ),
            ("dynamodb://tbl?clock_skew_ms=-1", "clock_skew_ms"),
            ("dynamodb://tbl?clock_skew_ms=1.5", "clock_skew_ms"),
            ("dynamodb://tbl?clock_skew_ms=60001", "clock_skew_ms"),
        ] {
            let e = DynamoUrl::parse(raw).unwrap_err();
            assert!(e.contains(said), "{raw}: {e}");
        }
    }
}

//! How hard and how often the reconciler works: declared as plain data
//! ([`ReconcileSpec`], a `[reconcile]` table) and validated once into
//! [`ReconcileSettings`], with a limit on everything.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The most lookups per record a config may ask for.
pub const MAX_TRIES_LIMIT: u32 = 100;
/// The largest backoff a config may ask for, in milliseconds (one day).
pub const BACKOFF_MS_LIMIT: u64 = 86_400_000;
/// The most lookups in flight at once a config may ask for.
pub const CONCURRENCY_LIMIT: usize = 64;
/// The most lookups started per second a config may ask for.
pub const RATE_PER_S_LIMIT: u32 = 1_000;
/// The longest pause between scans a config may ask for, in seconds (one day).
pub const INTERVAL_S_LIMIT: u64 = 86_400;
/// The most records per scan (the store's list limit).
pub const BATCH_LIMIT: usize = idem_core::LIST_LIMIT_MAX;

/// The reconciler's settings as declared; defaults applied by [`ReconcileSettings::new`].
///
/// ```toml
/// [reconcile]
/// max_tries = 5
/// backoff_ms = 1000
/// backoff_max_ms = 60000
/// concurrency = 4
/// rate_per_s = 10
/// interval_s = 5
/// batch = 100
/// ```
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ReconcileSpec {
    /// Failed lookups per record before it is left for an operator; default 5 (1–100).
    pub max_tries: Option<u32>,
    /// Backoff ceiling after the first failure, doubling per failure, in
    /// milliseconds; default 1000.
    pub backoff_ms: Option<u64>,
    /// The largest backoff ceiling, in milliseconds; default 60 000.
    pub backoff_max_ms: Option<u64>,
    /// Lookups in flight at once; default 4 (1–64).
    pub concurrency: Option<usize>,
    /// Lookups started per second, over all routes; default 10 (1–1000).
    pub rate_per_s: Option<u32>,
    /// Pause between scans, in seconds; default 5.
    pub interval_s: Option<u64>,
    /// Ambiguous records looked at per scan; default 100 (1–10 000).
    pub batch: Option<usize>,
    /// Seed of the backoff jitter, for reproducible runs; default: from the clock.
    pub seed: Option<u64>,
}

/// Validated reconciler settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcileSettings {
    max_tries: u32,
    backoff_ms: u64,
    backoff_max_ms: u64,
    concurrency: usize,
    rate_per_s: u32,
    interval: Duration,
    batch: usize,
    seed: Option<u64>,
}

/// A setting that is invalid: which field, as named in the config file, and
/// why; the one field refusal every config and broker section shares.
pub use idem_core::FieldError as ConfigError;

impl ReconcileSettings {
    /// The defaults: 5 tries; backoff ceilings from 1 s doubling up to 60 s;
    /// 4 lookups in flight, 10 started per second; a scan of at most 100
    /// records every 5 s; jitter seeded from the clock.
    pub const DEFAULT: ReconcileSettings = ReconcileSettings {
        max_tries: 5,
        backoff_ms: 1_000,
        backoff_max_ms: 60_000,
        concurrency: 4,
        rate_per_s: 10,
        interval: Duration::from_secs(5),
        batch: 100,
        seed: None,
    };

    /// Validates declared settings, applying defaults. Errors name the field.
    pub fn new(spec: &ReconcileSpec) -> Result<ReconcileSettings, ConfigError> {
        let d = ReconcileSettings::DEFAULT;
        let backoff_ms = check_range(
            "backoff_ms",
            spec.backoff_ms.unwrap_or(d.backoff_ms),
            1,
            BACKOFF_MS_LIMIT,
        )?;
        let backoff_max_ms = check_range(
            "backoff_max_ms",
            spec.backoff_max_ms
                .unwrap_or(d.backoff_max_ms.max(backoff_ms)),
            backoff_ms,
            BACKOFF_MS_LIMIT,
        )?;
        let max_tries = spec.max_tries.unwrap_or(d.max_tries);
        let concurrency = spec.concurrency.unwrap_or(d.concurrency);
        let rate_per_s = spec.rate_per_s.unwrap_or(d.rate_per_s);
        let batch = spec.batch.unwrap_or(d.batch);
        let interval_s = spec.interval_s.unwrap_or(d.interval.as_secs());
        Ok(ReconcileSettings {
            max_tries: narrow(check_range(
                "max_tries",
                max_tries.into(),
                1,
                MAX_TRIES_LIMIT.into(),
            )?),
            backoff_ms,
            backoff_max_ms,
            concurrency: narrow(check_range(
                "concurrency",
                widen(concurrency),
                1,
                widen(CONCURRENCY_LIMIT),
            )?),
            rate_per_s: narrow(check_range(
                "rate_per_s",
                rate_per_s.into(),
                1,
                RATE_PER_S_LIMIT.into(),
            )?),
            interval: Duration::from_secs(check_range(
                "interval_s",
                interval_s,
                1,
                INTERVAL_S_LIMIT,
            )?),
            batch: narrow(check_range("batch", widen(batch), 1, widen(BATCH_LIMIT))?),
            seed: spec.seed,
        })
    }

    /// Failed lookups per record before it is left for an operator.
    pub fn max_tries(&self) -> u32 {
        self.max_tries
    }

    /// Backoff ceiling after the first failure, in milliseconds.
    pub fn backoff_ms(&self) -> u64 {
        self.backoff_ms
    }

    /// The largest backoff ceiling, in milliseconds.
    pub fn backoff_max_ms(&self) -> u64 {
        self.backoff_max_ms
    }

    /// Lookups in flight at once.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// Lookups started per second.
    pub fn rate_per_s(&self) -> u32 {
        self.rate_per_s
    }

    /// Pause between scans.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Ambiguous records looked at per scan.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Seed of the backoff jitter, if one was given.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }
}

impl Default for ReconcileSettings {
    fn default() -> Self {
        ReconcileSettings::DEFAULT
    }
}

/// `value` if it lies in `min..=max`, else an error naming `field`.
pub(crate) fn check_range(
    field: &'static str,
    value: u64,
    min: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ConfigError::new(
            field,
            format!("{value} is outside {min}..={max}"),
        ))
    }
}

fn widen(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// A value already checked against a limit that fits `T`.
fn narrow<T: TryFrom<u64> + Default>(n: u64) -> T {
    T::try_from(n).unwrap_or_default()
}

/// Table-driven checks of config validation, shared by the config types.
#[cfg(test)]
pub(crate) fn check_field_errors<S, T>(
    cases: &[(&str, &str)],
    validate: impl Fn(&S) -> Result<T, ConfigError>,
) where
    S: serde::de::DeserializeOwned + std::fmt::Debug,
    T: std::fmt::Debug,
{
    for (declared, field) in cases {
        let spec: S = toml::from_str(declared).unwrap_or_else(|e| panic!("{declared}: {e}"));
        match validate(&spec) {
            Ok(valid) => panic!("{declared} was accepted: {valid:?}"),
            Err(err) => {
                assert_eq!(err.field, *field, "{declared}: {err}");
                assert!(err.to_string().starts_with(&format!("{field}: ")), "{err}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_named_in_its_error() {
        check_field_errors(
            &[
                ("max_tries = 0", "max_tries"),
                ("max_tries = 101", "max_tries"),
                ("backoff_ms = 0", "backoff_ms"),
                ("backoff_ms = 86400001", "backoff_ms"),
                ("backoff_ms = 10\nbackoff_max_ms = 5", "backoff_max_ms"),
                ("backoff_max_ms = 86400001", "backoff_max_ms"),
                ("concurrency = 0", "concurrency"),
                ("concurrency = 65", "concurrency"),
                ("rate_per_s = 0", "rate_per_s"),
                ("rate_per_s = 1001", "rate_per_s"),
                ("interval_s = 0", "interval_s"),
                ("interval_s = 86401", "interval_s"),
                ("batch = 0", "batch"),
                ("batch = 10001", "batch"),
            ],
            |spec: &ReconcileSpec| ReconcileSettings::new(spec),
        );
    }

    #[test]
    fn defaults_and_bounds_apply() {
        let settings = ReconcileSettings::new(&ReconcileSpec::default()).unwrap();
        assert_eq!(settings, ReconcileSettings::default());
        assert_eq!(settings.max_tries(), 5);
        assert_eq!(settings.interval(), Duration::from_secs(5));
        let edges = ReconcileSpec {
            max_tries: Some(100),
            concurrency: Some(64),
            rate_per_s: Some(1_000),
            batch: Some(10_000),
            // A first backoff above the default maximum raises the default maximum.
            backoff_ms: Some(120_000),
            ..Default::default()
        };
        let settings = ReconcileSettings::new(&edges).unwrap();
        assert_eq!(
            (
                settings.max_tries(),
                settings.concurrency(),
                settings.rate_per_s(),
                settings.batch()
            ),
            (100, 64, 1_000, 10_000)
        );
        assert_eq!(settings.backoff_max_ms(), 120_000);
    }

    #[test]
    fn parses_the_documented_toml() {
        let spec: ReconcileSpec = toml::from_str(
            "max_tries = 3\nbackoff_ms = 500\nbackoff_max_ms = 8000\nconcurrency = 2\n\
             rate_per_s = 5\ninterval_s = 10\nbatch = 50\n",
        )
        .unwrap();
        let settings = ReconcileSettings::new(&spec).unwrap();
        assert_eq!(settings.batch(), 50);
        assert_eq!(settings.interval(), Duration::from_secs(10));
        assert!(toml::from_str::<ReconcileSpec>("retries = 3").is_err());
    }
}

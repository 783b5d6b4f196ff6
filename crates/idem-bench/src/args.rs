//! Command-line flags shared by the subcommands: `--flag value` pairs, checked
//! against the flags a subcommand knows, then read with a default and a range.

use std::fmt::Display;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{Context, bail};

/// The flags given after a subcommand.
pub struct Flags {
    values: Vec<(String, String)>,
    usage: &'static str,
}

impl Flags {
    /// Reads `--flag value` pairs; a flag not in `known` is an error.
    /// `-h` or `--help` anywhere prints `usage` and exits the process.
    pub fn parse(
        mut args: impl Iterator<Item = String>,
        known: &[&str],
        usage: &'static str,
    ) -> anyhow::Result<Flags> {
        let mut values = Vec::new();
        while let Some(flag) = args.next() {
            if flag == "-h" || flag == "--help" {
                println!("{usage}");
                std::process::exit(0);
            }
            let value = args
                .next()
                .with_context(|| format!("{flag} needs a value; {usage}"))?;
            if !known.contains(&flag.as_str()) {
                bail!("unknown flag {flag}; {usage}");
            }
            values.push((flag, value));
        }
        Ok(Flags { values, usage })
    }

    /// The last value given for `flag`.
    fn get(&self, flag: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(f, _)| f == flag)
            .map(|(_, v)| v.as_str())
    }

    /// `flag` as a number in `range`, or `default` when it is not given.
    pub fn number<T>(&self, flag: &str, default: T, range: RangeInclusive<T>) -> anyhow::Result<T>
    where
        T: FromStr + PartialOrd + Display,
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        let value = match self.get(flag) {
            Some(raw) => raw
                .parse()
                .with_context(|| format!("{flag} {raw:?}; {}", self.usage))?,
            None => default,
        };
        if !range.contains(&value) {
            bail!(
                "{flag} must be {}..={}, not {value}",
                range.start(),
                range.end()
            );
        }
        Ok(value)
    }

    /// `flag` as text, or `default`.
    pub fn text(&self, flag: &str, default: &str) -> String {
        self.get(flag).unwrap_or(default).to_owned()
    }

    /// `flag` as text; an error when it is not given.
    pub fn required(&self, flag: &str) -> anyhow::Result<String> {
        match self.get(flag) {
            Some(value) => Ok(value.to_owned()),
            None => bail!("{flag} is required; {}", self.usage),
        }
    }

    /// `flag` as text, or `None` when it is not given.
    pub fn optional(&self, flag: &str) -> Option<String> {
        self.get(flag).map(str::to_owned)
    }

    /// `flag` as a path, or `default`.
    pub fn path(&self, flag: &str, default: PathBuf) -> PathBuf {
        self.get(flag).map_or(default, PathBuf::from)
    }
}

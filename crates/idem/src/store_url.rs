//! The command line's side of a store URL: `--store` or `--config`
//! (`StoreArgs`), and the flag named in errors. Parsing and opening are
//! `idem_process::store_url`'s, shared with `idem serve` and `idem consume`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use idem_core::Store;
use idem_gateway::{GatewayConfig, Overrides};
pub use idem_process::store_url::{Checked, OpenStore, STORE_DEFAULT, StoreUrl};

/// Which store a command that reads or changes records opens: `--store
/// URL`, or the `store` of the gateway's config file (`--config FILE`), as
/// `idem serve --config FILE` reads it, never both.
#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    /// The store, as a URL [default: sqlite://idem.db]: sqlite://PATH,
    /// postgres://USER@HOST/DB or dynamodb://TABLE?region=REGION. A relative
    /// sqlite://PATH here, and the default, are read against the working
    /// directory.
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// The gateway's config file: open the store it names (a relative
    /// sqlite://PATH there is read against the file's directory), the one
    /// `idem serve --config FILE` serves from.
    #[arg(long, value_name = "FILE", conflicts_with = "store")]
    config: Option<PathBuf>,
}

impl StoreArgs {
    /// The store's URL, checked: `--store`'s, the config file's, or the
    /// default.
    pub fn url(&self) -> anyhow::Result<StoreUrl> {
        match (&self.store, &self.config) {
            (Some(raw), _) => from_flag(raw),
            (None, Some(file)) => {
                // Loaded as `idem reconcile` loads it: the store's URL is
                // the one `idem serve` would open.
                let config = GatewayConfig::load_offline(file, &Overrides::default())?;
                Ok(config.store)
            }
            (None, None) => from_flag(STORE_DEFAULT),
        }
    }

    /// Opens the store for reading and changing records; one that is not
    /// there is an error ([`StoreArgs::no_store`]), and is never created.
    pub fn open_existing(&self) -> anyhow::Result<(StoreUrl, Arc<dyn Store>)> {
        let url = self.url()?;
        match url.open_existing()? {
            Some(store) => Ok((url, store)),
            None => Err(self.no_store(&url)),
        }
    }

    /// The field the URL came from, for errors: `--store`, or the config
    /// file's `store`.
    pub fn field(&self) -> String {
        field(self.store.as_deref(), self.config.as_deref())
    }

    /// The error for a store that is not at `url` ([`StoreUrl::no_store`]).
    pub fn no_store(&self, url: &StoreUrl) -> anyhow::Error {
        url.no_store(self.store.as_deref(), self.config.as_deref())
            .into()
    }
}

/// `--store URL`, checked; the error names the flag.
pub fn from_flag(raw: &str) -> anyhow::Result<StoreUrl> {
    StoreUrl::parse(raw).map_err(|e| anyhow::anyhow!("--store: {e}"))
}

/// The field a store URL came from, as a config error names it: `--store`
/// when the flag gave it, else the config file's `store` (or the default
/// the file leaves in place).
pub fn field(flag: Option<&str>, config: Option<&Path>) -> String {
    match (flag, config) {
        (None, Some(file)) => format!("{}: store", file.display()),
        _ => "--store".to_owned(),
    }
}

/// The line `--check` prints for what it left unchecked of the store: a
/// server is not reached.
pub fn print_unchecked(checked: Checked) {
    if let Some(unchecked) = checked.unchecked() {
        println!("  connect    {unchecked}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_is_named_and_no_password_shown() {
        let cases = [
            (
                "mysql://app:s3cret@h/db",
                "--store: \"mysql://app:***@h/db\" has scheme",
            ),
            (
                "postgres://app:s3cret@h/db?bogus=1",
                "--store: invalid PostgreSQL URL postgres://app:***@h/db?bogus=1",
            ),
            (
                "sqlite:idem.db",
                "--store: the URL lacks the // after \"sqlite:\"; write sqlite://idem.db",
            ),
        ];
        for (raw, expect) in cases {
            let Err(e) = from_flag(raw) else {
                panic!("{raw} is refused");
            };
            let text = e.to_string();
            assert!(text.starts_with(expect), "{raw}: {text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
        assert!(from_flag(STORE_DEFAULT).is_ok());
    }
}

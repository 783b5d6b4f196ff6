//! Store URLs (`sqlite://PATH`) parsed once into a validated type, and opened.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use idem_core::Store;
use idem_sqlite::{SqliteOptions, SqliteStore};

/// The default store: an SQLite file in the working directory.
pub const DEFAULT_STORE: &str = "sqlite://idem.db";

/// A parsed store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite://PATH`: relative paths as given, `sqlite:///abs/path` absolute.
    Sqlite(PathBuf),
}

impl StoreUrl {
    /// Parses `sqlite://PATH`.
    pub fn parse(raw: &str) -> anyhow::Result<StoreUrl> {
        if let Some(path) = raw.strip_prefix("sqlite://") {
            if path.is_empty() {
                bail!("store URL {raw:?} names no file; write e.g. sqlite://idem.db");
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        match raw.split_once("://") {
            Some((scheme, _)) => {
                bail!("store URL {raw:?} has scheme {scheme:?}; supported: sqlite://PATH")
            }
            None => bail!("store URL {raw:?} has no scheme; write e.g. sqlite://{raw}"),
        }
    }

    /// Opens the store, creating an empty one if there is none.
    pub fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        match self {
            StoreUrl::Sqlite(path) => {
                let store = SqliteStore::open(path, SqliteOptions::default())
                    .with_context(|| format!("cannot open store {self}"))?;
                Ok(Arc::new(store))
            }
        }
    }

    /// Opens an existing store for inspection, or `None` if there is none yet
    /// (inspecting must not create a database as a side effect).
    pub fn open_existing(&self) -> anyhow::Result<Option<Arc<dyn Store>>> {
        match self {
            StoreUrl::Sqlite(path) => {
                if !path.exists() {
                    return Ok(None);
                }
                let options = SqliteOptions {
                    create: false,
                    ..SqliteOptions::default()
                };
                let store = SqliteStore::open(path, options)
                    .with_context(|| format!("cannot open store {self}"))?;
                Ok(Some(Arc::new(store)))
            }
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_store_urls() {
        let cases = [
            ("sqlite://idem.db", Ok(StoreUrl::Sqlite("idem.db".into()))),
            (
                "sqlite:///var/lib/idem.db",
                Ok(StoreUrl::Sqlite("/var/lib/idem.db".into())),
            ),
            ("sqlite://", Err("names no file")),
            ("postgres://h/db", Err("has scheme \"postgres\"")),
            ("idem.db", Err("has no scheme")),
        ];
        for (raw, expect) in cases {
            match (StoreUrl::parse(raw), expect) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{raw}"),
                (Err(e), Err(part)) => assert!(e.to_string().contains(part), "{raw}: {e}"),
                (got, want) => panic!("{raw}: got {got:?}, want {want:?}"),
            }
        }
    }
}

//! Store URLs (`sqlite://PATH`, `postgres://…`, `dynamodb://TABLE…`)
//! parsed and checked once, with the rest of a configuration, so that a
//! wrong `store` is refused before anything starts, naming the file and
//! field (or the flag) it came from; and opened (`open`), in the same
//! room, so that what a URL may name and how it is opened change together.

mod open;

use std::fmt;
use std::path::{Path, PathBuf};

use idem_core::redact_url;

pub use open::{Checked, OpenError, OpenStore};

/// The store a process uses when nothing names one.
pub const STORE_DEFAULT: &str = "sqlite://idem.db";

/// A checked store URL.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite://PATH`: `sqlite:///abs/path` absolute; a relative path as
    /// given, which the process reads against its working directory unless
    /// [`StoreUrl::relative_to`] placed it.
    Sqlite(PathBuf),
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?…]` (or `postgresql://`),
    /// as given, and as the store would accept it (driver parameters and
    /// idem's own, [`idem_postgres::URL_PARAMETERS`], included). It may
    /// hold a password, so `Display` and `Debug` mask it.
    Postgres(String),
    /// `dynamodb://TABLE[?region=…][&endpoint=…][&clock_skew_ms=…]`
    /// ([`idem_dynamodb::DynamoUrl`]).
    #[cfg(feature = "dynamodb")]
    Dynamodb(idem_dynamodb::DynamoUrl),
}

/// Why a store URL is refused. Every message masks passwords and says what
/// to write.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrlError {
    /// `sqlite://` with no path.
    NoFile,
    /// `sqlite:PATH` or `postgres:…` without the `//`.
    MissingSlashes {
        /// The scheme.
        scheme: String,
        /// What the URL should read, password masked.
        instead: String,
    },
    /// No scheme at all, e.g. a bare file name.
    NoScheme {
        /// The URL, password masked.
        url: String,
    },
    /// A scheme idem has no store for.
    UnknownScheme {
        /// The URL, password masked.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// A PostgreSQL URL the store would refuse.
    Postgres {
        /// Why, and what to write (password masked).
        reason: String,
    },
    /// A `dynamodb://` URL the store would refuse.
    Dynamodb {
        /// Why, and what to write.
        reason: String,
    },
    /// A store this build was made without (its cargo feature off).
    NotBuilt {
        /// The URL's scheme.
        scheme: String,
    },
}

impl StoreUrl {
    /// Parses and checks `sqlite://PATH`, `postgres://…` or
    /// `postgresql://…`; a PostgreSQL URL is checked as the store checks it
    /// when it connects, without connecting.
    pub fn parse(raw: &str) -> Result<StoreUrl, StoreUrlError> {
        if let Some(path) = raw.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(StoreUrlError::NoFile);
            }
            return built("sqlite", cfg!(feature = "sqlite"))
                .map(|()| StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
            return parse_postgres(raw);
        }
        if raw.starts_with("dynamodb://") {
            return parse_dynamodb(raw);
        }
        if let Some((scheme, rest)) = raw.split_once(':')
            && ["sqlite", "postgres", "postgresql", "dynamodb"].contains(&scheme)
            && !rest.starts_with("//")
        {
            return Err(StoreUrlError::MissingSlashes {
                scheme: scheme.to_owned(),
                instead: redact_url(&format!("{scheme}://{rest}")),
            });
        }
        match raw.split_once("://") {
            Some((scheme, _)) => Err(StoreUrlError::UnknownScheme {
                scheme: scheme.to_owned(),
                url: redact_url(raw),
            }),
            // Masked as the authority of a URL, which a bare `USER:PASSWORD@HOST`
            // would be.
            None => Err(StoreUrlError::NoScheme {
                url: redact_url(&format!("x://{raw}"))
                    .trim_start_matches("x://")
                    .to_owned(),
            }),
        }
    }
}

/// Refuses a store whose feature this build lacks.
fn built(scheme: &str, feature: bool) -> Result<(), StoreUrlError> {
    match feature {
        true => Ok(()),
        false => Err(StoreUrlError::NotBuilt {
            scheme: scheme.to_owned(),
        }),
    }
}

/// A PostgreSQL URL, checked as the store checks it when it connects.
#[cfg(feature = "postgres")]
fn parse_postgres(raw: &str) -> Result<StoreUrl, StoreUrlError> {
    match idem_postgres::check_url(raw) {
        Ok(()) => Ok(StoreUrl::Postgres(raw.to_owned())),
        Err(idem_core::StoreError::Incompatible { reason, .. }) => {
            Err(StoreUrlError::Postgres { reason })
        }
        Err(e) => Err(StoreUrlError::Postgres {
            reason: e.to_string(),
        }),
    }
}

#[cfg(not(feature = "postgres"))]
fn parse_postgres(_raw: &str) -> Result<StoreUrl, StoreUrlError> {
    Err(StoreUrlError::NotBuilt {
        scheme: "postgres".to_owned(),
    })
}

/// A `dynamodb://` URL, checked as the store reads it.
#[cfg(feature = "dynamodb")]
fn parse_dynamodb(raw: &str) -> Result<StoreUrl, StoreUrlError> {
    idem_dynamodb::DynamoUrl::parse(raw)
        .map(StoreUrl::Dynamodb)
        .map_err(|reason| StoreUrlError::Dynamodb { reason })
}

#[cfg(not(feature = "dynamodb"))]
fn parse_dynamodb(_raw: &str) -> Result<StoreUrl, StoreUrlError> {
    Err(StoreUrlError::NotBuilt {
        scheme: "dynamodb".to_owned(),
    })
}

impl StoreUrl {
    /// The URL as written in a file in `dir`: a relative SQLite path names
    /// the file's neighbour, whatever directory the process starts in, as
    /// every other path in a config file does. Absolute paths and
    /// PostgreSQL URLs are unchanged.
    pub fn relative_to(self, dir: &Path) -> StoreUrl {
        match self {
            StoreUrl::Sqlite(path) if path.is_relative() => StoreUrl::Sqlite(dir.join(path)),
            other => other,
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            StoreUrl::Postgres(url) => f.write_str(&redact_url(url)),
            #[cfg(feature = "dynamodb")]
            StoreUrl::Dynamodb(url) => url.fmt(f),
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            StoreUrl::Postgres(url) => f.debug_tuple("Postgres").field(&redact_url(url)).finish(),
            #[cfg(feature = "dynamodb")]
            StoreUrl::Dynamodb(url) => f.debug_tuple("Dynamodb").field(url).finish(),
        }
    }
}

impl fmt::Display for StoreUrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrlError::NoFile => {
                f.write_str("sqlite:// names no file; write e.g. sqlite://idem.db")
            }
            StoreUrlError::MissingSlashes { scheme, instead } => {
                write!(
                    f,
                    "the URL lacks the // after \"{scheme}:\"; write {instead}"
                )
            }
            StoreUrlError::NoScheme { url } => {
                write!(f, "{url:?} has no scheme; write e.g. sqlite://{url}")
            }
            StoreUrlError::UnknownScheme { url, scheme } => write!(
                f,
                "{url:?} has scheme {scheme:?}; supported: sqlite://PATH, \
                 postgres://USER@HOST/DB, dynamodb://TABLE?region=REGION"
            ),
            StoreUrlError::Postgres { reason } | StoreUrlError::Dynamodb { reason } => {
                f.write_str(reason)
            }
            StoreUrlError::NotBuilt { scheme } => write!(
                f,
                "this build of idem has no {scheme}:// store (built without the \"{scheme}\" \
                 feature)"
            ),
        }
    }
}

impl std::error::Error for StoreUrlError {}

#[cfg(all(test, feature = "sqlite", feature = "postgres", feature = "dynamodb"))]
mod tests {
    use super::*;

    #[test]
    fn parses_and_checks_store_urls() {
        let pg = |url: &str| Ok(StoreUrl::Postgres(url.to_owned()));
        let cases = [
            ("sqlite://idem.db", Ok(StoreUrl::Sqlite("idem.db".into()))),
            (
                "sqlite:///var/lib/idem.db",
                Ok(StoreUrl::Sqlite("/var/lib/idem.db".into())),
            ),
            ("sqlite://", Err("names no file")),
            (
                "sqlite:/x",
                Err("lacks the // after \"sqlite:\"; write sqlite:///x"),
            ),
            ("sqlite:idem.db", Err("write sqlite://idem.db")),
            ("postgres:app:pw@h/db", Err("write postgres://app:***@h/db")),
            ("postgres://app@h/db", pg("postgres://app@h/db")),
            (
                "postgresql://app:pw@h:5433/db?sslmode=disable&schema=pay&operation_timeout_ms=900",
                pg(
                    "postgresql://app:pw@h:5433/db?sslmode=disable&schema=pay&operation_timeout_ms=900",
                ),
            ),
            ("postgres://h/db", Err("names no user")),
            (
                "postgres://app:pw@h/db?bogus=1",
                Err("idem's own parameters are schema, pool_size"),
            ),
            (
                "postgres://app:pw@h/db?operation_timeout_ms=0",
                Err("operation_timeout_ms=\"0\" is not a whole number"),
            ),
            ("postgres://app:pw@h/db?schema=Bad-Name", Err("schema")),
            (
                "postgres://app:pw@h:notaport/db",
                Err("invalid PostgreSQL URL"),
            ),
            ("mysql://app:pw@h/db", Err("has scheme \"mysql\"")),
            (
                "dynamodb://idem?region=eu-west-1",
                Ok(StoreUrl::Dynamodb(
                    idem_dynamodb::DynamoUrl::parse("dynamodb://idem?region=eu-west-1").unwrap(),
                )),
            ),
            (
                "dynamodb://idem?regoin=eu-west-1",
                Err("unknown parameter \"regoin\""),
            ),
            ("dynamodb:idem", Err("write dynamodb://idem")),
            ("idem.db", Err("has no scheme")),
            ("app:pw@h/db", Err("\"app:***@h/db\" has no scheme")),
        ];
        for (raw, expect) in cases {
            match (StoreUrl::parse(raw), expect) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{raw}"),
                (Err(e), Err(part)) => {
                    let text = e.to_string();
                    assert!(text.contains(part), "{raw}: {text}");
                    assert!(!text.contains("pw"), "{raw} leaks: {text}");
                }
                (got, want) => panic!("{raw}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_relative_sqlite_path_is_placed_in_the_file_s_directory() {
        let dir = Path::new("/etc/idem");
        let cases = [
            ("sqlite://idem.db", "sqlite:///etc/idem/idem.db"),
            ("sqlite://data/idem.db", "sqlite:///etc/idem/data/idem.db"),
            ("sqlite://../idem.db", "sqlite:///etc/idem/../idem.db"),
            ("sqlite:///var/lib/idem.db", "sqlite:///var/lib/idem.db"),
            ("postgres://app@h/db", "postgres://app@h/db"),
        ];
        for (raw, placed) in cases {
            let Ok(url) = StoreUrl::parse(raw) else {
                panic!("{raw} parses");
            };
            assert_eq!(url.relative_to(dir).to_string(), placed, "{raw}");
        }
    }

    #[test]
    fn never_shows_a_password() {
        let cases = [
            ("sqlite://idem.db", "sqlite://idem.db"),
            (
                "postgres://app:s3cret@db:5432/payments",
                "postgres://app:***@db:5432/payments",
            ),
            (
                "postgresql://app@db/payments?password=s3cret",
                "postgresql://app@db/payments?password=***",
            ),
        ];
        for (raw, shown) in cases {
            let Ok(url) = StoreUrl::parse(raw) else {
                panic!("{raw} parses");
            };
            assert_eq!(url.to_string(), shown, "{raw}");
            assert!(!format!("{url:?}").contains("s3cret"), "{url:?}");
        }
    }
}

//! The one refusal of a configuration value: which file (when there is
//! one), which field, and why. The brokers' sections, the reconciler's
//! settings, the gateway's and the consumer's config files all refuse with
//! it, so that every message reads `FILE: FIELD: REASON` alike.

use std::fmt;
use std::path::{Path, PathBuf};

/// A configuration value that cannot work: where it is and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FieldError {
    /// The file, or `None` for a value that came from no file (a flag, a
    /// section not yet placed in its file).
    pub file: Option<PathBuf>,
    /// The field, as named in the file, e.g. `route[1].lease_ms`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FieldError {
    /// `field` is refused for `reason`, in no file yet.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
        FieldError {
            file: None,
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The same refusal, in `file`.
    pub fn in_file(self, file: &Path) -> FieldError {
        FieldError {
            file: Some(file.to_path_buf()),
            ..self
        }
    }

    /// The same refusal, its field placed under `section` (`subscription[0]`
    /// and `url` make `subscription[0].url`).
    pub fn under(self, section: &str) -> FieldError {
        FieldError {
            field: format!("{section}.{}", self.field),
            ..self
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(file) => write!(f, "{}: {}: {}", file.display(), self.field, self.reason),
            None => write!(f, "{}: {}", self.field, self.reason),
        }
    }
}

impl std::error::Error for FieldError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_file_and_the_field() {
        let cases = [
            (FieldError::new("url", "no host"), "url: no host"),
            (
                FieldError::new("url", "no host").in_file(Path::new("c.toml")),
                "c.toml: url: no host",
            ),
            (
                FieldError::new("url", "no host")
                    .under("subscription[0].nats")
                    .in_file(Path::new("c.toml")),
                "c.toml: subscription[0].nats.url: no host",
            ),
        ];
        for (error, expect) in cases {
            assert_eq!(error.to_string(), expect);
        }
    }
}

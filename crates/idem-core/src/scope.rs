//! The scope a key is unique in: operation (route) plus principal, optionally
//! region. Two scopes never share records, whatever keys they carry.

use std::fmt;
use std::sync::Arc;

/// The longest scope accepted, in bytes.
pub const SCOPE_BYTES_MAX: usize = 1024;

/// A validated scope: 1–1024 bytes of printable UTF-8 (no control characters).
///
/// Build one from its parts with [`Scope::from_parts`], which joins them as
/// `operation|principal[|region]`; a part may not contain `|`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
// The text is shared, not owned: ids are cloned into every claim, record,
// map and queued write, and a clone here is a count, not a copy.
pub struct Scope(Arc<str>);

/// Why a string is not a valid scope.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScopeError {
    /// The scope, or one of its parts, is empty.
    Empty,
    /// The scope is longer than [`SCOPE_BYTES_MAX`].
    TooLong {
        /// Length of the offered scope in bytes.
        bytes: usize,
    },
    /// A control character at this byte offset.
    ControlCharacter {
        /// Byte offset of the character.
        offset: usize,
    },
    /// A part given to [`Scope::from_parts`] contains the separator `|`.
    SeparatorInPart {
        /// The offending part.
        part: String,
    },
}

impl Scope {
    /// Validates a scope given as one string (as stored, or typed by an operator).
    pub fn new(raw: impl Into<String>) -> Result<Scope, ScopeError> {
        let raw = raw.into();
        if raw.is_empty() {
            return Err(ScopeError::Empty);
        }
        if raw.len() > SCOPE_BYTES_MAX {
            return Err(ScopeError::TooLong { bytes: raw.len() });
        }
        if let Some((offset, _)) = raw.char_indices().find(|(_, c)| c.is_control()) {
            return Err(ScopeError::ControlCharacter { offset });
        }
        Ok(Scope(Arc::from(raw)))
    }

    /// Joins operation, principal and an optional region into one scope.
    pub fn from_parts(
        operation: &str,
        principal: &str,
        region: Option<&str>,
    ) -> Result<Scope, ScopeError> {
        let parts = [Some(operation), Some(principal), region];
        for part in parts.iter().flatten() {
            if part.is_empty() {
                return Err(ScopeError::Empty);
            }
            if part.contains('|') {
                return Err(ScopeError::SeparatorInPart {
                    part: (*part).to_owned(),
                });
            }
        }
        let joined: Vec<&str> = parts.into_iter().flatten().collect();
        Scope::new(joined.join("|"))
    }

    /// The scope as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({:?})", self.0)
    }
}

impl std::str::FromStr for Scope {
    type Err = ScopeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scope::new(s)
    }
}

impl serde::Serialize for Scope {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Scope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Scope::new(raw).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for ScopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeError::Empty => f.write_str("the scope (or one of its parts) is empty"),
            ScopeError::TooLong { bytes } => write!(
                f,
                "the scope is {bytes} bytes long; at most {SCOPE_BYTES_MAX} are allowed"
            ),
            ScopeError::ControlCharacter { offset } => {
                write!(f, "the scope has a control character at byte {offset}")
            }
            ScopeError::SeparatorInPart { part } => {
                write!(f, "scope part {part:?} contains the separator '|'")
            }
        }
    }
}

impl std::error::Error for ScopeError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_and_joins() {
        type Case<'a> = (Result<Scope, ScopeError>, Result<&'a str, ScopeError>);
        let cases: Vec<Case> = vec![
            (Scope::new("POST /payouts|anon"), Ok("POST /payouts|anon")),
            (Scope::new(""), Err(ScopeError::Empty)),
            (
                Scope::new("a\nb"),
                Err(ScopeError::ControlCharacter { offset: 1 }),
            ),
            (
                Scope::new("s".repeat(1025)),
                Err(ScopeError::TooLong { bytes: 1025 }),
            ),
            (Scope::from_parts("POST /p", "t1", None), Ok("POST /p|t1")),
            (
                Scope::from_parts("POST /p", "t1", Some("eu")),
                Ok("POST /p|t1|eu"),
            ),
            (
                Scope::from_parts("POST /p", "", None),
                Err(ScopeError::Empty),
            ),
            (
                Scope::from_parts("a|b", "t", None),
                Err(ScopeError::SeparatorInPart { part: "a|b".into() }),
            ),
        ];
        for (got, expect) in cases {
            assert_eq!(
                got.as_ref().map(|s| s.as_str()),
                expect.as_ref().map(|s| *s)
            );
        }
    }
}

//! The idempotency key: the name of one intent, validated once at the edge so
//! that nothing downstream has to wonder whether a key is well formed.

use std::fmt;
use std::sync::Arc;

/// The longest key accepted, in bytes (docs/contract.md, "Policy and limits").
pub const KEY_BYTES_MAX: usize = 255;

/// A validated idempotency key: 1–255 bytes of visible ASCII (`0x21..=0x7e`).
///
/// A key has two spellings, and each has its own constructor:
/// - [`IdempotencyKey::parse`] reads a **header value**. The draft
///   `Idempotency-Key` header carries the key as a structured-field string
///   (`"abc"`); a bare token (`abc`) is accepted too and both parse to the
///   same key. The quotes are syntax, not part of the key.
/// - [`IdempotencyKey::new`] takes the key's **own text**, byte for byte, as
///   stores, the admin API, the CLI and serde hold it. A key may itself
///   contain quotes and backslashes (the header `"\"a\""` names the key `"a"`),
///   so stored text must never be read as a header value again: `"a"` would
///   turn into `a`, another intent's key.
///
/// ```
/// use idem_core::IdempotencyKey;
/// let quoted = IdempotencyKey::parse("\"payout-847-2026-W36\"").unwrap();
/// let bare = IdempotencyKey::parse("payout-847-2026-W36").unwrap();
/// assert_eq!(quoted, bare);
/// assert!(IdempotencyKey::parse("").is_err());
///
/// // A key whose own text is `"a"`: sent quoted and escaped, stored as is.
/// let odd = IdempotencyKey::parse(r#""\"a\"""#).unwrap();
/// assert_eq!(odd.as_str(), "\"a\"");
/// assert_eq!(IdempotencyKey::new(odd.as_str()).unwrap(), odd);
/// assert_ne!(odd, IdempotencyKey::parse("a").unwrap());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
// The text is shared, not owned: ids are cloned into every claim, record,
// map and queued write, and a clone here is a count, not a copy.
pub struct IdempotencyKey(Arc<str>);

/// Why a string is not a valid idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The key (after removing the quotes of the string form) is empty.
    Empty,
    /// The key is longer than [`KEY_BYTES_MAX`].
    TooLong {
        /// Length of the offered key in bytes.
        bytes: usize,
    },
    /// A byte outside visible ASCII, at this offset of the key.
    InvalidByte {
        /// Offset of the offending byte within the key.
        offset: usize,
        /// The offending byte.
        byte: u8,
    },
    /// A quoted key that is not a well-formed structured-field string.
    BadQuoting {
        /// What is wrong with the quoting.
        reason: &'static str,
    },
}

impl IdempotencyKey {
    /// Parses a header value: a bare token or a quoted structured-field string.
    pub fn parse(raw: &str) -> Result<IdempotencyKey, KeyError> {
        match raw.strip_prefix('"') {
            Some(rest) => IdempotencyKey::new(unquote(rest)?),
            None => IdempotencyKey::new(raw),
        }
    }

    /// The key whose own text is `text`, byte for byte (no header syntax):
    /// how stores, the admin API, the CLI and serde spell a key.
    pub fn new(text: impl Into<String>) -> Result<IdempotencyKey, KeyError> {
        let value = text.into();
        if value.is_empty() {
            return Err(KeyError::Empty);
        }
        if value.len() > KEY_BYTES_MAX {
            return Err(KeyError::TooLong { bytes: value.len() });
        }
        if let Some((offset, &byte)) = value
            .as_bytes()
            .iter()
            .enumerate()
            .find(|(_, b)| !(0x21..=0x7e).contains(*b))
        {
            return Err(KeyError::InvalidByte { offset, byte });
        }
        Ok(IdempotencyKey(Arc::from(value)))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Undoes the sf-string form: `rest` is everything after the opening quote.
fn unquote(rest: &str) -> Result<String, KeyError> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                return if chars.as_str().is_empty() {
                    Ok(out)
                } else {
                    Err(KeyError::BadQuoting {
                        reason: "text after the closing quote",
                    })
                };
            }
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => {
                    return Err(KeyError::BadQuoting {
                        reason: "only \\\" and \\\\ may be escaped",
                    });
                }
            },
            other => out.push(other),
        }
    }
    Err(KeyError::BadQuoting {
        reason: "missing closing quote",
    })
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({:?})", self.0)
    }
}

impl serde::Serialize for IdempotencyKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for IdempotencyKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        IdempotencyKey::new(text).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Empty => f.write_str("the key is empty"),
            KeyError::TooLong { bytes } => {
                write!(
                    f,
                    "the key is {bytes} bytes long; at most {KEY_BYTES_MAX} are allowed"
                )
            }
            KeyError::InvalidByte { offset, byte } => write!(
                f,
                "byte {offset} of the key is 0x{byte:02x}; only visible ASCII (0x21-0x7e) is allowed"
            ),
            KeyError::BadQuoting { reason } => write!(f, "malformed quoted key: {reason}"),
        }
    }
}

impl std::error::Error for KeyError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(raw: &str, expect: Result<&str, KeyError>) {
        let got = IdempotencyKey::parse(raw);
        assert_eq!(
            got.as_ref().map(|k| k.as_str()),
            expect.as_ref().map(|s| *s),
            "{raw:?}"
        );
    }

    #[test]
    fn parses_bare_and_quoted_forms() {
        let long = "k".repeat(KEY_BYTES_MAX);
        let too_long = "k".repeat(KEY_BYTES_MAX + 1);
        let cases: Vec<(&str, Result<&str, KeyError>)> = vec![
            ("abc", Ok("abc")),
            ("\"abc\"", Ok("abc")),
            ("\"a\\\"b\"", Ok("a\"b")),
            ("\"a\\\\b\"", Ok("a\\b")),
            ("a\"b", Ok("a\"b")),
            (
                "8e03978e-40d5-43e8-bc93-6894a57f9324",
                Ok("8e03978e-40d5-43e8-bc93-6894a57f9324"),
            ),
            (&long, Ok(&long)),
            ("", Err(KeyError::Empty)),
            ("\"\"", Err(KeyError::Empty)),
            (&too_long, Err(KeyError::TooLong { bytes: 256 })),
            (
                "a b",
                Err(KeyError::InvalidByte {
                    offset: 1,
                    byte: b' ',
                }),
            ),
            (
                "\"a b\"",
                Err(KeyError::InvalidByte {
                    offset: 1,
                    byte: b' ',
                }),
            ),
            (
                "ab\t",
                Err(KeyError::InvalidByte {
                    offset: 2,
                    byte: b'\t',
                }),
            ),
            (
                "é",
                Err(KeyError::InvalidByte {
                    offset: 0,
                    byte: 0xc3,
                }),
            ),
            (
                "\"abc",
                Err(KeyError::BadQuoting {
                    reason: "missing closing quote",
                }),
            ),
            (
                "\"abc\"x",
                Err(KeyError::BadQuoting {
                    reason: "text after the closing quote",
                }),
            ),
            (
                "\"a\\nb\"",
                Err(KeyError::BadQuoting {
                    reason: "only \\\" and \\\\ may be escaped",
                }),
            ),
        ];
        for (raw, expect) in cases {
            check(raw, expect);
        }
    }
}

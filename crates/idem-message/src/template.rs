//! Keys that name the intent: a template over the payload's business fields
//! (RFC 6901 JSON pointers), a header the producer sets, or, only when a
//! template asks for it, the broker's message id, which a republish or a
//! redrive can change. A message whose key cannot be derived is refused
//! with the place and what was found there; it is never run without a key.
//!
//! The syntax is literal text with placeholders in braces:
//!
//! | placeholder | value |
//! | --- | --- |
//! | `{/seller_id}`, `{/a~1b/0}` | the payload's value at that JSON pointer (`~1` is `/`, `~0` is `~`) |
//! | `{header:x-intent}` | the one message header of that name (ASCII case-insensitive) |
//! | `{message_id}` | the broker's message id |
//!
//! `{{` and `}}` are literal braces. A pointer cannot name a member whose
//! name holds `{` or `}`. Literal text is visible ASCII, as keys are; a
//! template has at least one placeholder (else every message would share
//! one key), and two placeholders never touch (`{/a}{/b}` would give
//! `a=1, b=23` and `a=12, b=3` the same key).
//!
//! A value becomes key text only when its spelling is exact and unique: a
//! string is used as it is (it must be non-empty visible ASCII, so that the
//! key passes [`IdempotencyKey::new`]); an integer of at most 64 bits is
//! written in decimal, every digit kept (serde_json reads those exactly,
//! well past 2^53). Everything else is refused: `null` and booleans do not
//! name an intent; objects and arrays have no single spelling; a fraction,
//! an exponent or an integer beyond 64 bits would have to be rounded or
//! respelled (send such identifiers as strings). Values are not escaped: a
//! template whose fields may hold its own separators (`a:{/x}:{/y}` with
//! `x = "1:2"`) can give two intents one key. That never runs an effect
//! twice: the second intent's payload has another fingerprint, so it is
//! rejected as a reused key; choose separators the fields cannot contain.
//!
//! The payload is read as I-JSON with the same reader the fingerprint uses
//! ([`idem_core::jcs`]): duplicate member names, lone surrogates and
//! excessive nesting are refused, so a key never depends on which duplicate
//! a parser keeps.

use std::borrow::Cow;
use std::fmt;

use idem_core::jcs::{self, JcsError, JsonPointer, Numbers};
use idem_core::{IdempotencyKey, KEY_BYTES_MAX, KeyError};
use serde_json::Value;

use crate::message::Message;

/// The longest template text accepted, in bytes.
pub const TEMPLATE_BYTES_MAX: usize = 1024;

/// A parsed key template; see the module documentation for its syntax.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyTemplate {
    text: String,
    parts: Vec<Part>,
}

/// Where one placeholder of a template takes its value.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// The payload's value at this JSON pointer.
    Pointer(JsonPointer),
    /// The message header of this name.
    Header(String),
    /// The broker's message id.
    MessageId,
}

/// A key template that cannot be used: a configuration error, naming the
/// template and the byte where the problem is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateError {
    /// The template text as given.
    pub template: String,
    /// Byte offset of the problem in the template.
    pub at: usize,
    /// What is wrong.
    pub fault: TemplateFault,
}

/// What is wrong with a key template.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TemplateFault {
    /// Longer than [`TEMPLATE_BYTES_MAX`].
    TooLong {
        /// Its length in bytes.
        bytes: usize,
    },
    /// A `{` with no `}` after it.
    Unclosed,
    /// A `{` inside a placeholder.
    NestedOpen,
    /// A `}` that closes nothing and is not doubled.
    StrayClose,
    /// `{}`.
    EmptyPlaceholder,
    /// A placeholder that is not a pointer, `header:NAME` or `message_id`.
    UnknownSource {
        /// The placeholder's text.
        found: String,
    },
    /// A placeholder that is not a valid RFC 6901 pointer.
    BadPointer(JcsError),
    /// `{header:}`, or a header name that is not visible ASCII.
    BadHeaderName {
        /// The name as written.
        name: String,
    },
    /// A character of the literal text that cannot be part of a key.
    BadLiteral {
        /// The character.
        found: char,
    },
    /// The literal text alone is longer than a key may be.
    LiteralTooLong {
        /// Its length in bytes.
        bytes: usize,
    },
    /// Two placeholders with nothing between them.
    Adjacent,
    /// No placeholder: every message would get the same key.
    NoPlaceholder,
}

/// Why a message's key cannot be derived. The message is rejected, never
/// run without a key.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRefusal {
    /// The template reads the payload's fields and the payload is not
    /// I-JSON; the detail says where.
    NotJson {
        /// What the reader found, with its position.
        detail: String,
    },
    /// Nothing at the source: no such field, no such header, no message id.
    Missing {
        /// Where the template looked.
        source: Source,
    },
    /// A header the template reads was sent more than once.
    Repeated {
        /// The header.
        source: Source,
        /// How many times.
        count: usize,
    },
    /// A value that is neither a string nor an integer.
    WrongType {
        /// Where it was.
        source: Source,
        /// What it is (`null`, `a boolean`, `an object`, `an array`).
        found: &'static str,
    },
    /// A number that is not an integer of at most 64 bits.
    InexactNumber {
        /// Where it was.
        source: Source,
    },
    /// An empty string.
    Empty {
        /// Where it was.
        source: Source,
    },
    /// A character a key cannot hold (keys are visible ASCII).
    BadCharacter {
        /// Where it was.
        source: Source,
        /// Byte offset of the character in the value.
        offset: usize,
        /// The character.
        found: char,
    },
    /// The rendered key is longer than [`KEY_BYTES_MAX`].
    TooLong {
        /// Its length in bytes.
        bytes: usize,
    },
    /// The rendered key breaks another rule of [`IdempotencyKey::new`].
    Invalid(KeyError),
}

impl KeyTemplate {
    /// Parses a template such as `payout:{/seller_id}:{/settlement_id}`.
    pub fn parse(text: &str) -> Result<KeyTemplate, TemplateError> {
        let fail = |at: usize, fault: TemplateFault| TemplateError {
            template: text.to_owned(),
            at,
            fault,
        };
        if text.len() > TEMPLATE_BYTES_MAX {
            let fault = TemplateFault::TooLong { bytes: text.len() };
            return Err(fail(TEMPLATE_BYTES_MAX, fault));
        }
        let bytes = text.as_bytes();
        let mut parts: Vec<Part> = Vec::new();
        let mut literal = String::new();
        let mut i = 0;
        while let Some(&b) = bytes.get(i) {
            let doubled = bytes.get(i + 1) == Some(&b);
            match b {
                b'{' | b'}' if doubled => {
                    literal.push(char::from(b));
                    i += 2;
                }
                b'{' => {
                    let (source, end) = placeholder(text, i).map_err(|(at, f)| fail(at, f))?;
                    if literal.is_empty() && matches!(parts.last(), Some(Part::Field(_))) {
                        return Err(fail(i, TemplateFault::Adjacent));
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field(source));
                    i = end;
                }
                b'}' => return Err(fail(i, TemplateFault::StrayClose)),
                0x21..=0x7e => {
                    literal.push(char::from(b));
                    i += 1;
                }
                _ => {
                    // `i` is at a character boundary: only ASCII was consumed.
                    let found = text[i..].chars().next().unwrap_or('\u{fffd}');
                    return Err(fail(i, TemplateFault::BadLiteral { found }));
                }
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        check_parts(&parts).map_err(|f| fail(0, f))?;
        Ok(KeyTemplate {
            text: text.to_owned(),
            parts,
        })
    }

    /// The template that takes the whole key from the header `name`.
    pub fn header(name: &str) -> Result<KeyTemplate, TemplateError> {
        KeyTemplate::parse(&format!("{{header:{name}}}"))
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Every source the template reads, in order.
    pub fn sources(&self) -> impl Iterator<Item = &Source> {
        self.parts.iter().filter_map(|p| match p {
            Part::Field(source) => Some(source),
            Part::Literal(_) => None,
        })
    }

    /// True when the key depends on the broker's message id: a republish
    /// or a redrive may mint a new one, and then the key names an attempt,
    /// not the intent. Worth a warning wherever such a template is loaded.
    pub fn uses_message_id(&self) -> bool {
        self.sources().any(|s| *s == Source::MessageId)
    }

    /// True when the template reads the payload's fields.
    pub fn reads_payload(&self) -> bool {
        self.sources().any(|s| matches!(s, Source::Pointer(_)))
    }

    /// The key of `message`, or why it has none.
    pub fn render(&self, message: &Message<'_>) -> Result<IdempotencyKey, KeyRefusal> {
        let payload = match self.reads_payload() {
            true => Some(read_json(message.payload)?),
            false => None,
        };
        let mut key = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => key.push_str(text),
                Part::Field(source) => {
                    let value = value_of(source, message, payload.as_ref())?;
                    check_value(source, &value)?;
                    key.push_str(&value);
                }
            }
        }
        if key.len() > KEY_BYTES_MAX {
            return Err(KeyRefusal::TooLong { bytes: key.len() });
        }
        // Every part was checked above; this restates the key's own rules.
        IdempotencyKey::new(key).map_err(KeyRefusal::Invalid)
    }
}

impl std::str::FromStr for KeyTemplate {
    type Err = TemplateError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KeyTemplate::parse(s)
    }
}

impl fmt::Display for KeyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Pointer(pointer) => write!(f, "pointer {pointer}"),
            Source::Header(name) => write!(f, "header {name:?}"),
            Source::MessageId => f.write_str("the message id"),
        }
    }
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "key template {:?}, at byte {}: {}",
            self.template, self.at, self.fault
        )
    }
}

impl std::error::Error for TemplateError {}

impl fmt::Display for TemplateFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateFault::TooLong { bytes } => write!(
                f,
                "the template is {bytes} bytes long; at most {TEMPLATE_BYTES_MAX} are allowed"
            ),
            TemplateFault::Unclosed => f.write_str("this '{' is never closed by '}'"),
            TemplateFault::NestedOpen => {
                f.write_str("'{' inside a placeholder (write '{{' outside placeholders for a literal brace)")
            }
            TemplateFault::StrayClose => {
                f.write_str("'}' closes nothing (write '}}' for a literal brace)")
            }
            TemplateFault::EmptyPlaceholder => f.write_str(
                "empty placeholder '{}'; write a JSON pointer such as {/id}, {header:NAME} or {message_id}",
            ),
            TemplateFault::UnknownSource { found } => write!(
                f,
                "unknown placeholder {{{found}}}; expected a JSON pointer starting with '/', header:NAME or message_id"
            ),
            TemplateFault::BadPointer(e) => e.fmt(f),
            TemplateFault::BadHeaderName { name } => write!(
                f,
                "header name {name:?} is empty or not visible ASCII"
            ),
            TemplateFault::BadLiteral { found } => write!(
                f,
                "character {found:?} (U+{:04X}) cannot be part of a key; keys are visible ASCII (0x21-0x7e)",
                u32::from(*found)
            ),
            TemplateFault::LiteralTooLong { bytes } => write!(
                f,
                "the literal text is {bytes} bytes long; a key is at most {KEY_BYTES_MAX}"
            ),
            TemplateFault::Adjacent => f.write_str(
                "two placeholders with nothing between them; put a separator between them so that values cannot shift from one to the other",
            ),
            TemplateFault::NoPlaceholder => f.write_str(
                "the template has no placeholder, so every message would get the same key",
            ),
        }
    }
}

impl fmt::Display for KeyRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyRefusal::NotJson { detail } => write!(
                f,
                "the key template reads the payload's fields, but the payload is not JSON: {detail}"
            ),
            KeyRefusal::Missing { source } => match source {
                Source::Pointer(_) => write!(f, "{source}: the payload has no value there"),
                Source::Header(_) => write!(f, "{source}: the message has no such header"),
                Source::MessageId => f.write_str("the message has no id"),
            },
            KeyRefusal::Repeated { source, count } => {
                write!(
                    f,
                    "{source}: sent {count} times; a key part needs exactly one"
                )
            }
            KeyRefusal::WrongType { source, found } => write!(
                f,
                "{source}: found {found}; a key part is a non-empty string or an integer"
            ),
            KeyRefusal::InexactNumber { source } => write!(
                f,
                "{source}: found a number that is not an integer of at most 64 bits (a fraction, an exponent or a larger integer); send it as a string to use it in a key"
            ),
            KeyRefusal::Empty { source } => write!(f, "{source}: found an empty string"),
            KeyRefusal::BadCharacter {
                source,
                offset,
                found,
            } => write!(
                f,
                "{source}: character {found:?} (U+{:04X}) at byte {offset} of the value; a key is visible ASCII (0x21-0x7e)",
                u32::from(*found)
            ),
            KeyRefusal::TooLong { bytes } => write!(
                f,
                "the key would be {bytes} bytes long; at most {KEY_BYTES_MAX} are allowed"
            ),
            KeyRefusal::Invalid(e) => write!(f, "the rendered key is refused: {e}"),
        }
    }
}

impl std::error::Error for KeyRefusal {}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    Field(Source),
}

/// The placeholder opening at `open`: its source and the offset after its
/// `}`, or the offset and fault of what is wrong with it.
fn placeholder(text: &str, open: usize) -> Result<(Source, usize), (usize, TemplateFault)> {
    let start = open + 1;
    let Some(len) = text[start..].find('}') else {
        return Err((open, TemplateFault::Unclosed));
    };
    let body = &text[start..start + len];
    if let Some(nested) = body.find('{') {
        return Err((start + nested, TemplateFault::NestedOpen));
    }
    let source = if body.is_empty() {
        return Err((open, TemplateFault::EmptyPlaceholder));
    } else if body.starts_with('/') {
        Source::Pointer(
            JsonPointer::parse(body).map_err(|e| (start, TemplateFault::BadPointer(e)))?,
        )
    } else if body == "message_id" {
        Source::MessageId
    } else if let Some(name) = body.strip_prefix("header:") {
        if name.is_empty() || !name.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            let fault = TemplateFault::BadHeaderName { name: name.into() };
            return Err((start + "header:".len(), fault));
        }
        Source::Header(name.to_owned())
    } else {
        let fault = TemplateFault::UnknownSource { found: body.into() };
        return Err((start, fault));
    };
    Ok((source, start + len + 1))
}

fn check_parts(parts: &[Part]) -> Result<(), TemplateFault> {
    if !parts.iter().any(|p| matches!(p, Part::Field(_))) {
        return Err(TemplateFault::NoPlaceholder);
    }
    let literal: usize = parts
        .iter()
        .map(|p| match p {
            Part::Literal(text) => text.len(),
            Part::Field(_) => 0,
        })
        .sum();
    if literal > KEY_BYTES_MAX {
        return Err(TemplateFault::LiteralTooLong { bytes: literal });
    }
    Ok(())
}

/// The payload as JSON, first read by the fingerprint's own I-JSON reader
/// so that what it refuses (duplicate names, lone surrogates) never names
/// a key.
fn read_json(payload: &[u8]) -> Result<Value, KeyRefusal> {
    jcs::canonicalize(payload, &[], Numbers::Exact).map_err(|e| KeyRefusal::NotJson {
        detail: e.to_string(),
    })?;
    serde_json::from_slice(payload).map_err(|e| KeyRefusal::NotJson {
        detail: e.to_string(),
    })
}

fn value_of<'a>(
    source: &Source,
    message: &Message<'a>,
    payload: Option<&'a Value>,
) -> Result<Cow<'a, str>, KeyRefusal> {
    let missing = || KeyRefusal::Missing {
        source: source.clone(),
    };
    match source {
        Source::Pointer(pointer) => {
            let value = payload.and_then(|p| p.pointer(pointer.as_str()));
            json_text(source, value.ok_or_else(missing)?)
        }
        Source::Header(name) => {
            let mut found = message
                .headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name));
            let (_, value) = found.next().ok_or_else(missing)?;
            match found.count() {
                0 => Ok(Cow::Borrowed(*value)),
                more => Err(KeyRefusal::Repeated {
                    source: source.clone(),
                    count: more + 1,
                }),
            }
        }
        Source::MessageId => message.message_id.map(Cow::Borrowed).ok_or_else(missing),
    }
}

/// A JSON value's text in a key: strings as they are, 64-bit integers in
/// decimal, everything else refused (see the module documentation).
fn json_text<'v>(source: &Source, value: &'v Value) -> Result<Cow<'v, str>, KeyRefusal> {
    let wrong = |found| KeyRefusal::WrongType {
        source: source.clone(),
        found,
    };
    match value {
        Value::String(s) => Ok(Cow::Borrowed(s)),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Ok(Cow::Owned(u.to_string())),
            (None, Some(i)) => Ok(Cow::Owned(i.to_string())),
            // Without serde_json's `arbitrary_precision` the literal of a
            // fraction or a larger integer is gone: refuse, never round.
            (None, None) => Err(KeyRefusal::InexactNumber {
                source: source.clone(),
            }),
        },
        Value::Null => Err(wrong("null")),
        Value::Bool(_) => Err(wrong("a boolean")),
        Value::Array(_) => Err(wrong("an array")),
        Value::Object(_) => Err(wrong("an object")),
    }
}

fn check_value(source: &Source, value: &str) -> Result<(), KeyRefusal> {
    if value.is_empty() {
        return Err(KeyRefusal::Empty {
            source: source.clone(),
        });
    }
    match value.char_indices().find(|(_, c)| !('!'..='~').contains(c)) {
        Some((offset, found)) => Err(KeyRefusal::BadCharacter {
            source: source.clone(),
            offset,
            found,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(template, Ok(()))` or `(template, Err((byte, message)))`.
    type ParseCase<'a> = (&'a str, Result<(), (usize, &'a str)>);

    fn check_parse(cases: &[ParseCase<'_>]) {
        for (text, expect) in cases {
            let got = KeyTemplate::parse(text)
                .map(|_| ())
                .map_err(|e| (e.at, e.fault.to_string()));
            let expect = expect.map_err(|(at, m)| (at, m.to_owned()));
            assert_eq!(got, expect, "{text:?}");
        }
    }

    #[test]
    fn template_syntax_errors_name_the_place() {
        check_parse(&[
            ("payout:{/seller_id}:{/settlement_id}", Ok(())),
            ("{/a}", Ok(())),
            ("{header:Idempotency-Key}", Ok(())),
            ("m:{message_id}", Ok(())),
            ("{{lit}}:{/a~0b~1c}", Ok(())),
            ("a\"b\\c:{/x}", Ok(())),
            ("{/}", Ok(())),
            ("{/prénom}", Ok(())),
            (
                "payout:{/seller",
                Err((7, "this '{' is never closed by '}'")),
            ),
            (
                "a:{/x{y}",
                Err((
                    5,
                    "'{' inside a placeholder (write '{{' outside placeholders for a literal brace)",
                )),
            ),
            (
                "a}:{/x}",
                Err((1, "'}' closes nothing (write '}}' for a literal brace)")),
            ),
            (
                "a:{}",
                Err((
                    2,
                    "empty placeholder '{}'; write a JSON pointer such as {/id}, {header:NAME} or {message_id}",
                )),
            ),
            (
                "a:{seller_id}",
                Err((
                    3,
                    "unknown placeholder {seller_id}; expected a JSON pointer starting with '/', header:NAME or message_id",
                )),
            ),
            (
                "a:{/x~2}",
                Err((
                    3,
                    "invalid JSON pointer \"/x~2\": '~' must be followed by '0' or '1'",
                )),
            ),
            (
                "a:{header:}",
                Err((10, "header name \"\" is empty or not visible ASCII")),
            ),
            (
                "a:{header:a b}",
                Err((10, "header name \"a b\" is empty or not visible ASCII")),
            ),
            (
                "a b:{/x}",
                Err((
                    1,
                    "character ' ' (U+0020) cannot be part of a key; keys are visible ASCII (0x21-0x7e)",
                )),
            ),
            (
                "é:{/x}",
                Err((
                    0,
                    "character 'é' (U+00E9) cannot be part of a key; keys are visible ASCII (0x21-0x7e)",
                )),
            ),
            (
                "{/a}{/b}",
                Err((
                    4,
                    "two placeholders with nothing between them; put a separator between them so that values cannot shift from one to the other",
                )),
            ),
            (
                "payouts",
                Err((
                    0,
                    "the template has no placeholder, so every message would get the same key",
                )),
            ),
            (
                "{{/a}}",
                Err((
                    0,
                    "the template has no placeholder, so every message would get the same key",
                )),
            ),
            (
                "",
                Err((
                    0,
                    "the template has no placeholder, so every message would get the same key",
                )),
            ),
        ]);
        let long_literal = format!("{}{{/a}}", "k".repeat(KEY_BYTES_MAX + 1));
        let too_long = format!("{{/{}}}", "a".repeat(TEMPLATE_BYTES_MAX));
        check_parse(&[
            (
                &long_literal,
                Err((
                    0,
                    "the literal text is 256 bytes long; a key is at most 255",
                )),
            ),
            (
                &too_long,
                Err((
                    1024,
                    "the template is 1027 bytes long; at most 1024 are allowed",
                )),
            ),
        ]);
        let e = KeyTemplate::parse("payout:{/seller").unwrap_err();
        assert_eq!(
            e.to_string(),
            "key template \"payout:{/seller\", at byte 7: this '{' is never closed by '}'"
        );
    }

    #[test]
    fn sources_and_the_message_id() {
        let t = KeyTemplate::parse("{header:X-Tenant}:{/id}:{message_id}").unwrap();
        let sources: Vec<String> = t.sources().map(|s| s.to_string()).collect();
        assert_eq!(
            sources,
            ["header \"X-Tenant\"", "pointer /id", "the message id"]
        );
        assert!(t.uses_message_id() && t.reads_payload());
        let by_header = KeyTemplate::header("Idempotency-Key").unwrap();
        assert_eq!(by_header.as_str(), "{header:Idempotency-Key}");
        assert!(!by_header.uses_message_id() && !by_header.reads_payload());
        assert!(KeyTemplate::header("").is_err());
    }

    /// `(template, payload, expect)`: the key, or the refusal's message.
    fn check_render(cases: &[(&str, &str, Result<&str, &str>)]) {
        let headers = [("X-Intent", "intent-7"), ("x-twice", "a"), ("X-Twice", "b")];
        for (template, payload, expect) in cases {
            let message = Message {
                payload: payload.as_bytes(),
                headers: &headers,
                message_id: Some("msg-1"),
            };
            let got = KeyTemplate::parse(template).unwrap().render(&message);
            let got = got.as_ref().map(|k| k.as_str()).map_err(|e| e.to_string());
            let expect = expect.map_err(str::to_owned);
            assert_eq!(got, expect, "{template} over {payload}");
        }
    }

    #[test]
    fn rendering_keeps_strings_and_integers_exactly() {
        check_render(&[
            (
                "payout:{/seller_id}:{/settlement_id}",
                r#"{"seller_id": 847, "settlement_id": "2026-W36"}"#,
                Ok("payout:847:2026-W36"),
            ),
            (
                "p:{/n}",
                r#"{"n": 9007199254740993}"#,
                Ok("p:9007199254740993"),
            ),
            (
                "p:{/n}",
                r#"{"n": 18446744073709551615}"#,
                Ok("p:18446744073709551615"),
            ),
            (
                "p:{/n}",
                r#"{"n": -9223372036854775808}"#,
                Ok("p:-9223372036854775808"),
            ),
            ("p:{/n}", r#"{"n": 0}"#, Ok("p:0")),
            ("p:{/q}", r#"{"q": "say\"hi\"\\"}"#, Ok(r#"p:say"hi"\"#)),
            (
                "p:{/a~1b}:{/c~0d}",
                r#"{"a/b": "x", "c~d": "y"}"#,
                Ok("p:x:y"),
            ),
            (
                "p:{/items/1/id}",
                r#"{"items": [{"id": "a"}, {"id": "b"}]}"#,
                Ok("p:b"),
            ),
            ("p:{/}", r#"{"": "empty-name"}"#, Ok("p:empty-name")),
            ("p:{/esc}", r#"{"esc": "\u0041\u007e"}"#, Ok("p:A~")),
            ("{{p}}:{/a}", r#"{"a": "1"}"#, Ok("{p}:1")),
            ("h:{header:x-intent}", "not json at all", Ok("h:intent-7")),
            ("m:{message_id}", "", Ok("m:msg-1")),
        ]);
    }

    #[test]
    fn a_key_that_cannot_be_derived_says_where_and_what() {
        check_render(&[
            (
                "p:{/id}",
                "<id/>",
                Err(
                    "the key template reads the payload's fields, but the payload is not JSON: expected a JSON value at byte 0, found '<'",
                ),
            ),
            (
                "p:{/id}",
                "",
                Err(
                    "the key template reads the payload's fields, but the payload is not JSON: expected a JSON value at byte 0, but the input ended",
                ),
            ),
            (
                "p:{/id}",
                r#"{"id": "a", "id": "b"}"#,
                Err(
                    "the key template reads the payload's fields, but the payload is not JSON: duplicate object member name \"id\" at byte 12 (I-JSON forbids duplicate names)",
                ),
            ),
            (
                "p:{/id}",
                r#"{"other": 1}"#,
                Err("pointer /id: the payload has no value there"),
            ),
            (
                "p:{/items/2}",
                r#"{"items": [1, 2]}"#,
                Err("pointer /items/2: the payload has no value there"),
            ),
            (
                "p:{/items/01}",
                r#"{"items": [1, 2]}"#,
                Err("pointer /items/01: the payload has no value there"),
            ),
            (
                "p:{/id}",
                r#"{"id": null}"#,
                Err("pointer /id: found null; a key part is a non-empty string or an integer"),
            ),
            (
                "p:{/id}",
                r#"{"id": true}"#,
                Err("pointer /id: found a boolean; a key part is a non-empty string or an integer"),
            ),
            (
                "p:{/id}",
                r#"{"id": {"a": 1}}"#,
                Err("pointer /id: found an object; a key part is a non-empty string or an integer"),
            ),
            (
                "p:{/id}",
                r#"{"id": [1]}"#,
                Err("pointer /id: found an array; a key part is a non-empty string or an integer"),
            ),
            (
                "p:{/id}",
                r#"{"id": 1.5}"#,
                Err(
                    "pointer /id: found a number that is not an integer of at most 64 bits (a fraction, an exponent or a larger integer); send it as a string to use it in a key",
                ),
            ),
            (
                "p:{/id}",
                r#"{"id": 1e3}"#,
                Err(
                    "pointer /id: found a number that is not an integer of at most 64 bits (a fraction, an exponent or a larger integer); send it as a string to use it in a key",
                ),
            ),
            (
                "p:{/id}",
                r#"{"id": 18446744073709551616}"#,
                Err(
                    "pointer /id: found a number that is not an integer of at most 64 bits (a fraction, an exponent or a larger integer); send it as a string to use it in a key",
                ),
            ),
            (
                "p:{/id}",
                r#"{"id": -0}"#,
                Err(
                    "pointer /id: found a number that is not an integer of at most 64 bits (a fraction, an exponent or a larger integer); send it as a string to use it in a key",
                ),
            ),
            (
                "p:{/id}",
                r#"{"id": ""}"#,
                Err("pointer /id: found an empty string"),
            ),
            (
                "p:{/id}",
                r#"{"id": "a b"}"#,
                Err(
                    "pointer /id: character ' ' (U+0020) at byte 1 of the value; a key is visible ASCII (0x21-0x7e)",
                ),
            ),
            (
                "p:{/id}",
                r#"{"id": "ab\u00e9"}"#,
                Err(
                    "pointer /id: character 'é' (U+00E9) at byte 2 of the value; a key is visible ASCII (0x21-0x7e)",
                ),
            ),
            (
                "p:{/id}",
                r#"{"id": "tab\there"}"#,
                Err(
                    "pointer /id: character '\\t' (U+0009) at byte 3 of the value; a key is visible ASCII (0x21-0x7e)",
                ),
            ),
            (
                "h:{header:x-missing}",
                "{}",
                Err("header \"x-missing\": the message has no such header"),
            ),
            (
                "h:{header:x-twice}",
                "{}",
                Err("header \"x-twice\": sent 2 times; a key part needs exactly one"),
            ),
        ]);
        let long = format!(r#"{{"id": "{}"}}"#, "k".repeat(KEY_BYTES_MAX));
        check_render(&[(
            "p:{/id}",
            &long,
            Err("the key would be 257 bytes long; at most 255 are allowed"),
        )]);
        let none = Message::default();
        let refused = KeyTemplate::parse("m:{message_id}").unwrap().render(&none);
        assert_eq!(refused.unwrap_err().to_string(), "the message has no id");
    }
}

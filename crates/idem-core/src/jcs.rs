//! RFC 8785 JSON Canonicalization Scheme (JCS), so that two JSON request bodies
//! that mean the same thing (member order, whitespace, number spelling, string
//! escapes) produce the same bytes, and therefore the same fingerprint.
//!
//! Canonicalisation needs guarantees a lenient parser does not give:
//!
//! * the input is one RFC 8259 JSON text in UTF-8 with only JSON whitespace
//!   around it: no byte order mark, nothing after the value;
//! * duplicate member names, compared after unescaping, are rejected
//!   (I-JSON, RFC 7493), since "which duplicate wins" differs between
//!   consumers;
//! * lone surrogates in `\u` escapes are rejected, since they cannot be
//!   represented in UTF-8 output;
//! * numbers are never read into a double unless [`Numbers`] asks for
//!   RFC 8785's ECMAScript form; the default form for fingerprints,
//!   [`Numbers::Exact`], compares them as exact decimals of any size;
//! * nesting depth is bounded ([`MAX_DEPTH`]) and checked before it is
//!   recursed into, so hostile input cannot overflow the stack;
//! * every refusal is a [`JcsError`] that names the rule and the byte offset.
//!
//! Numbers in [`Numbers::Exact`] form are written as `[-]DIGITS[eEXP]`: the
//! significant digits with leading and trailing zeros removed, and the
//! power of ten they are multiplied by, omitted when it is zero. So `10`,
//! `10.0`, `1e1` and `0.1e2` are all `1e1`, `1.50` and `15e-1` are `15e-1`,
//! `10.0000000000000001` is `100000000000000001e-16`, and every zero
//! (`0`, `-0`, `0.0e5`) is `0`: minus zero and zero are the same number. The
//! only limit is the exponent: one beyond ±9223372036854775807 (an i64) is
//! refused with [`JcsError::ExponentOutOfRange`]; no body needs it, and
//! computing with it exactly would cost time a hostile client chooses.
//!
//! Before canonicalising, members or array elements addressed by
//! [`JsonPointer`]s (RFC 6901) can be removed, for fields such as client
//! timestamps or nonces that must not take part in the fingerprint.
//!
//! # What crates do, and what is written here
//!
//! * Numbers in ECMAScript form are written by `ryu-js`
//!   (`Number.prototype.toString`, ties between two shortest spellings to
//!   the even one included). `tests/data/jcs/ecmascript-numbers.txt` pins
//!   its output, ties among them, to what the formatter it replaced wrote.
//! * Strings are escaped by `serde_json`, whose escaping is RFC 8785's.
//! * [`JsonPointer`]s are decoded, and array indexes read, by `jsonptr`;
//!   what an exclusion removes (every pointer resolved against the document
//!   as it was before any removal) is written here.
//! * The parser is written here. `serde_json` driven by a custom `Visitor`
//!   sees duplicate names and, with its own limit disabled, lets the visitor
//!   bound the depth, but it cannot keep the other rules. Without its
//!   `arbitrary_precision` feature it hands numbers over as u64, i64 or
//!   f64: `10.0000000000000001` arrives as the same double as `10`,
//!   `18446744073709551616` as the same as `18446744073709551617`, and
//!   `1e400` is refused. With that feature (which would change
//!   `serde_json::Number` for every crate in the workspace) numbers arrive
//!   as text inside a private marker object, so the document
//!   `{"$serde_json::private::Number":"1"}` arrives as the number `1`.
//!   Reading every value as a `RawValue` (its `raw_value` feature) gives
//!   numbers as written, but scans each level's contents again, so its
//!   time grows with the square of the depth (timed once, outside this
//!   repository, at about 25 times this parser's for 22 kB nested 127
//!   deep). In every way, its
//!   errors carry a line, a column and a message rather than the rule
//!   broken (`"\ud83d"` is "unexpected end of hex escape", `"\ude00"`
//!   "lone leading surrogate", `-` "EOF while parsing a value"), so
//!   [`JcsError`] could not be built from them; and its own nesting limit
//!   is 127 levels, one short of [`MAX_DEPTH`].
//! * Exact decimals are written here. `bigdecimal` reads the same values
//!   but refuses `-1e-9223372036854775808`, which this form accepts, and
//!   its normalisation grows faster than linearly with the digits (timed
//!   once, outside this repository: about 9 s in a release build for one
//!   literal of a million digits, which fits the default 1 MiB body limit,
//!   against 2 ms here): the form only strips zeros and adds two small
//!   integers.
//!
//! Nothing here does I/O.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

/// The deepest nesting of arrays and objects that [`canonicalize`] accepts.
///
/// A document nested deeper is rejected with [`JcsError::TooDeep`].
pub const MAX_DEPTH: usize = 128;

/// The largest integer magnitude, 2^53, that an integer literal (one without
/// fraction or exponent) may have; every integer up to it is exactly
/// representable as an IEEE-754 double.
pub const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// The decimal spelling of [`MAX_EXACT_INTEGER`], used to compare literals
/// without converting them.
const MAX_EXACT_INTEGER_DIGITS: &str = "9007199254740992";

/// How [`canonicalize`] writes numbers. Each form is a different canonical
/// form: fingerprints computed with one never match those of another.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numbers {
    /// Exact decimals of any size (see the module documentation); used by
    /// fingerprint version 2. No number is ever rounded.
    Exact,
    /// RFC 8785 as published: each number read as an IEEE-754 double and
    /// written as ECMAScript does. Integers above 2^53 and numbers outside a
    /// double's range are refused; other numbers may be rounded, so two
    /// different numbers can be written alike. Used by fingerprint version 1.
    Ecmascript,
    /// [`Numbers::Ecmascript`], but a number whose ECMAScript spelling has
    /// another value than its literal is refused with
    /// [`JcsError::RoundedNumber`]: the documents this form accepts are told
    /// apart exactly. Used to recognise version 1 fingerprints safely.
    EcmascriptExactOnly,
}

/// Longest literal or member name quoted verbatim in an error message.
const MAX_QUOTED_CHARS: usize = 64;

/// An RFC 6901 JSON Pointer that addresses one location in a document, used to
/// exclude that location from canonicalisation.
///
/// The empty pointer `""`, which addresses the whole document, is rejected:
/// excluding the whole body is never what a route means.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JsonPointer {
    text: String,
    segments: Vec<String>,
}

impl JsonPointer {
    /// Parses a pointer such as `/payment/nonce` or `/items/0`.
    ///
    /// The text must start with `/`; within a segment `~1` stands for `/` and
    /// `~0` for `~`, and any other use of `~` is an error.
    pub fn parse(s: &str) -> Result<JsonPointer, JcsError> {
        let invalid = |reason: &'static str| JcsError::InvalidPointer {
            pointer: abbreviate(s),
            reason,
        };
        if s.is_empty() {
            return Err(invalid(
                "cannot exclude the whole body (the empty pointer addresses the entire document)",
            ));
        }
        let pointer = jsonptr::Pointer::parse(s).map_err(|e| {
            invalid(match e {
                jsonptr::ParseError::NoLeadingSlash => "a JSON pointer must start with '/'",
                jsonptr::ParseError::InvalidEncoding { .. } => "'~' must be followed by '0' or '1'",
            })
        })?;
        let segments = pointer
            .tokens()
            .map(|token| token.decoded().into_owned())
            .collect();
        Ok(JsonPointer {
            text: s.to_owned(),
            segments,
        })
    }

    /// The pointer as it was written, e.g. `/a~1b/0`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The unescaped reference tokens, e.g. `["a/b", "0"]` for `/a~1b/0`.
    pub fn segments(&self) -> &[String] {
        &self.segments
    }
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for JsonPointer {
    type Err = JcsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JsonPointer::parse(s)
    }
}

/// Why a document (or an exclusion pointer) could not be canonicalised.
///
/// Every parse error carries the byte offset into the input where the problem
/// was found.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JcsError {
    /// The input is not valid UTF-8.
    InvalidUtf8 {
        /// Offset of the first byte that is not part of valid UTF-8.
        offset: usize,
    },
    /// The input ended where more JSON was required.
    UnexpectedEnd {
        /// What was required, e.g. `"':' after object member name"`.
        expected: &'static str,
        /// Offset of the end of the input.
        offset: usize,
    },
    /// A character appeared where the grammar does not allow it.
    UnexpectedChar {
        /// The offending character.
        found: char,
        /// What was required instead.
        expected: &'static str,
        /// Offset of the offending character.
        offset: usize,
    },
    /// More than whitespace follows the top-level value.
    TrailingData {
        /// The first character after the value.
        found: char,
        /// Offset of that character.
        offset: usize,
    },
    /// An object has two members with the same name (compared after
    /// unescaping), which I-JSON (RFC 7493) forbids.
    DuplicateMember {
        /// The repeated name (abbreviated if very long).
        name: String,
        /// Offset of the second occurrence of the name.
        offset: usize,
    },
    /// A string contains an unescaped control character (U+0000 to U+001F).
    ControlCharacter {
        /// The control character's byte value.
        byte: u8,
        /// Offset of the control character.
        offset: usize,
    },
    /// A backslash in a string is followed by a character that does not start
    /// a JSON escape.
    InvalidEscape {
        /// The character after the backslash.
        found: char,
        /// Offset of the backslash.
        offset: usize,
    },
    /// A `\u` escape is not followed by four hexadecimal digits.
    InvalidUnicodeEscape {
        /// Offset of the backslash.
        offset: usize,
    },
    /// A `\u` escape names a surrogate that is not part of a high/low pair.
    LoneSurrogate {
        /// The unpaired UTF-16 code unit.
        code_unit: u16,
        /// Offset of the backslash of its escape.
        offset: usize,
    },
    /// A number literal does not follow the RFC 8259 grammar.
    InvalidNumber {
        /// What is wrong with it, e.g. "leading zeros are not allowed".
        reason: &'static str,
        /// Offset of the problem.
        offset: usize,
    },
    /// A number literal is outside the finite range of an IEEE-754 double.
    NumberOutOfRange {
        /// The literal (abbreviated if very long).
        literal: String,
        /// Offset of the literal.
        offset: usize,
    },
    /// An integer literal (no fraction, no exponent) has a magnitude above 2^53
    /// and would be silently rounded when read as an IEEE-754 double, so two
    /// different values could canonicalise to the same bytes.
    ImpreciseInteger {
        /// The literal (abbreviated if very long).
        literal: String,
        /// Offset of the literal.
        offset: usize,
    },
    /// A number's exponent (after normalisation) is beyond an i64.
    ExponentOutOfRange {
        /// The literal (abbreviated if very long).
        literal: String,
        /// Offset of the literal.
        offset: usize,
    },
    /// In [`Numbers::EcmascriptExactOnly`] form: the number's ECMAScript
    /// spelling has another value than its literal.
    RoundedNumber {
        /// The literal (abbreviated if very long).
        literal: String,
        /// Offset of the literal.
        offset: usize,
    },
    /// Arrays and objects are nested deeper than the limit.
    TooDeep {
        /// The nesting limit, [`MAX_DEPTH`].
        limit: usize,
        /// Offset of the bracket that went past the limit.
        offset: usize,
    },
    /// An exclusion pointer is not a valid RFC 6901 JSON Pointer, or is the
    /// empty pointer.
    InvalidPointer {
        /// The pointer text (abbreviated if very long).
        pointer: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl fmt::Display for JcsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JcsError::InvalidUtf8 { offset } => {
                write!(f, "input is not valid UTF-8 at byte {offset}")
            }
            JcsError::UnexpectedEnd { expected, offset } => {
                write!(
                    f,
                    "expected {expected} at byte {offset}, but the input ended"
                )
            }
            JcsError::UnexpectedChar {
                found,
                expected,
                offset,
            } => write!(f, "expected {expected} at byte {offset}, found {found:?}"),
            JcsError::TrailingData { found, offset } => write!(
                f,
                "unexpected {found:?} at byte {offset} after the end of the JSON value"
            ),
            JcsError::DuplicateMember { name, offset } => write!(
                f,
                "duplicate object member name {name:?} at byte {offset} \
                 (I-JSON forbids duplicate names)"
            ),
            JcsError::ControlCharacter { byte, offset } => write!(
                f,
                "unescaped control character U+{byte:04X} in string at byte {offset}"
            ),
            JcsError::InvalidEscape { found, offset } => write!(
                f,
                "invalid escape sequence at byte {offset}: '\\' followed by {found:?}"
            ),
            JcsError::InvalidUnicodeEscape { offset } => write!(
                f,
                "invalid \\u escape at byte {offset}: expected four hexadecimal digits"
            ),
            JcsError::LoneSurrogate { code_unit, offset } => write!(
                f,
                "lone surrogate \\u{code_unit:04x} at byte {offset}: \
                 a surrogate escape must be a high/low pair"
            ),
            JcsError::InvalidNumber { reason, offset } => {
                write!(f, "invalid number at byte {offset}: {reason}")
            }
            JcsError::NumberOutOfRange { literal, offset } => write!(
                f,
                "number {literal} at byte {offset} is outside the finite range \
                 of an IEEE-754 double"
            ),
            JcsError::ImpreciseInteger { literal, offset } => write!(
                f,
                "integer {literal} at byte {offset} exceeds 2^53 (9007199254740992) in \
                 magnitude: as an IEEE-754 double it would be silently rounded, so \
                 different values could canonicalise the same; send it as a string"
            ),
            JcsError::ExponentOutOfRange { literal, offset } => write!(
                f,
                "number {literal} at byte {offset} has an exponent beyond \
                 ±9223372036854775807, which is not supported"
            ),
            JcsError::RoundedNumber { literal, offset } => write!(
                f,
                "number {literal} at byte {offset} is not exactly a double in \
                 ECMAScript form"
            ),
            JcsError::TooDeep { limit, offset } => write!(
                f,
                "arrays and objects nested deeper than {limit} levels at byte {offset}"
            ),
            JcsError::InvalidPointer { pointer, reason } => {
                write!(f, "invalid JSON pointer {pointer:?}: {reason}")
            }
        }
    }
}

impl std::error::Error for JcsError {}

/// Canonicalise a JSON document per RFC 8785, first removing the members addressed by `exclude`.
///
/// The input must be one complete RFC 8259 JSON text in UTF-8 (surrounding
/// whitespace allowed, no byte order mark). Each pointer in `exclude` is
/// resolved against the parsed document as it was before any removal: an
/// object member it addresses is removed, an array element it addresses is
/// removed (later elements shift down), and a pointer that addresses nothing
/// is ignored.
///
/// The output has no whitespace, members sorted by their names as UTF-16 code
/// unit sequences, numbers in the form `numbers` names and strings with the
/// minimal escaping of RFC 8785 §3.2.2.2.
pub fn canonicalize(
    input: &[u8],
    exclude: &[JsonPointer],
    numbers: Numbers,
) -> Result<Vec<u8>, JcsError> {
    let text = std::str::from_utf8(input).map_err(|e| JcsError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    let mut parser = Parser {
        text,
        bytes: input,
        pos: 0,
        numbers,
        literals: false,
    };
    let mut value = parser.parse_value(0)?;
    parser.skip_whitespace();
    if parser.pos < input.len() {
        return Err(JcsError::TrailingData {
            found: parser.char_at(parser.pos),
            offset: parser.pos,
        });
    }
    let paths: Vec<&[String]> = exclude.iter().map(|p| p.segments.as_slice()).collect();
    remove_excluded(&mut value, &paths);
    let mut out = Vec::with_capacity(input.len());
    write_value(&value, &mut out);
    Ok(out)
}

/// The values `pointers` address in the JSON document `input`, each as
/// `(pointer, JSON text)` in the order of `pointers`: numbers exactly as the
/// document spells them (so integers beyond 2^53 and long decimals survive),
/// strings, arrays and objects written as [`canonicalize`] writes them. A
/// document that is not one valid JSON text gives nothing, and a pointer
/// that addresses nothing gives no entry: never an error, since the caller
/// describes a request whose body it does not own.
pub fn extract(input: &[u8], pointers: &[JsonPointer]) -> Vec<(String, String)> {
    let Ok(text) = std::str::from_utf8(input) else {
        return Vec::new();
    };
    let mut parser = Parser {
        text,
        bytes: input,
        pos: 0,
        numbers: Numbers::Exact,
        literals: true,
    };
    let Ok(value) = parser.parse_value(0) else {
        return Vec::new();
    };
    parser.skip_whitespace();
    if parser.pos < input.len() {
        return Vec::new();
    }
    pointers
        .iter()
        .filter_map(|pointer| {
            let found = pointer
                .segments
                .iter()
                .try_fold(&value, |at, segment| match at {
                    Value::Object(members) => members
                        .iter()
                        .find(|(name, _)| name == segment)
                        .map(|(_, child)| child),
                    Value::Array(items) => array_index(segment).and_then(|i| items.get(i)),
                    _ => None,
                })?;
            let mut out = Vec::new();
            write_value(found, &mut out);
            Some((
                pointer.text.clone(),
                String::from_utf8_lossy(&out).into_owned(),
            ))
        })
        .collect()
}

/// A parsed JSON value.
#[derive(Debug)]
enum Value {
    Null,
    True,
    False,
    /// Already in its canonical spelling.
    Number(String),
    String(String),
    Array(Vec<Value>),
    /// Members in document order; names are unique.
    Object(Vec<(String, Value)>),
}

/// Recursive-descent RFC 8259 parser over already-validated UTF-8.
struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    numbers: Numbers,
    /// Keep every number as its literal text ([`extract`]), not canonical.
    literals: bool,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// The character starting at `pos` (always a character boundary when
    /// called), for error messages.
    fn char_at(&self, pos: usize) -> char {
        self.text
            .get(pos..)
            .and_then(|s| s.chars().next())
            .unwrap_or(char::REPLACEMENT_CHARACTER)
    }

    /// The error for "`expected` was required at the current position".
    fn unexpected(&self, expected: &'static str) -> JcsError {
        if self.pos >= self.bytes.len() {
            JcsError::UnexpectedEnd {
                expected,
                offset: self.bytes.len(),
            }
        } else {
            JcsError::UnexpectedChar {
                found: self.char_at(self.pos),
                expected,
                offset: self.pos,
            }
        }
    }

    /// Parses one value; `depth` is the number of arrays/objects around it.
    fn parse_value(&mut self, depth: usize) -> Result<Value, JcsError> {
        self.skip_whitespace();
        match self.peek() {
            Some(b'{') => self.parse_object(depth + 1),
            Some(b'[') => self.parse_array(depth + 1),
            Some(b'"') => Ok(Value::String(self.parse_string()?)),
            Some(b't') => self.parse_literal("true", Value::True),
            Some(b'f') => self.parse_literal("false", Value::False),
            Some(b'n') => self.parse_literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.parse_number(),
            _ => Err(self.unexpected("a JSON value")),
        }
    }

    fn check_depth(&self, depth: usize) -> Result<(), JcsError> {
        if depth > MAX_DEPTH {
            Err(JcsError::TooDeep {
                limit: MAX_DEPTH,
                offset: self.pos,
            })
        } else {
            Ok(())
        }
    }

    fn parse_literal(&mut self, word: &'static str, value: Value) -> Result<Value, JcsError> {
        let expected = match word {
            "true" => "the literal 'true'",
            "false" => "the literal 'false'",
            _ => "the literal 'null'",
        };
        for &want in word.as_bytes() {
            if self.peek() != Some(want) {
                return Err(self.unexpected(expected));
            }
            self.pos += 1;
        }
        Ok(value)
    }

    fn parse_object(&mut self, depth: usize) -> Result<Value, JcsError> {
        self.check_depth(depth)?;
        self.pos += 1; // '{'
        let mut members: Vec<(String, Value)> = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(members));
        }
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.unexpected("'\"' to start an object member name"));
            }
            let name_offset = self.pos;
            let name = self.parse_string()?;
            if !seen.insert(name.clone()) {
                return Err(JcsError::DuplicateMember {
                    name: abbreviate(&name),
                    offset: name_offset,
                });
            }
            self.skip_whitespace();
            if self.peek() != Some(b':') {
                return Err(self.unexpected("':' after object member name"));
            }
            self.pos += 1;
            let value = self.parse_value(depth)?;
            members.push((name, value));
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(members));
                }
                _ => return Err(self.unexpected("',' or '}' after object member value")),
            }
        }
    }

    fn parse_array(&mut self, depth: usize) -> Result<Value, JcsError> {
        self.check_depth(depth)?;
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.parse_value(depth)?);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.unexpected("',' or ']' after array element")),
            }
        }
    }

    /// Parses a string starting at its opening quote and returns its
    /// unescaped contents.
    fn parse_string(&mut self) -> Result<String, JcsError> {
        self.pos += 1; // '"'
        let mut out = String::new();
        let mut run_start = self.pos;
        loop {
            match self.peek() {
                None => return Err(self.unexpected("closing '\"' of string")),
                Some(b'"') => {
                    out.push_str(&self.text[run_start..self.pos]);
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    out.push_str(&self.text[run_start..self.pos]);
                    out.push(self.parse_escape()?);
                    run_start = self.pos;
                }
                Some(byte @ 0x00..=0x1f) => {
                    return Err(JcsError::ControlCharacter {
                        byte,
                        offset: self.pos,
                    });
                }
                // Other bytes, including those of multi-byte UTF-8 sequences,
                // are copied through; runs end only at ASCII bytes, which are
                // always character boundaries.
                Some(_) => self.pos += 1,
            }
        }
    }

    /// Parses an escape starting at its backslash.
    fn parse_escape(&mut self) -> Result<char, JcsError> {
        let start = self.pos;
        self.pos += 1; // '\'
        let c = match self.peek() {
            None => return Err(self.unexpected("an escape character after '\\'")),
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => return self.parse_unicode_escape(start),
            Some(_) => {
                return Err(JcsError::InvalidEscape {
                    found: self.char_at(self.pos),
                    offset: start,
                });
            }
        };
        self.pos += 1;
        Ok(c)
    }

    /// Parses `\uXXXX` (and a following low surrogate escape if the first is a
    /// high surrogate); `start` is the offset of the backslash and `pos` is at
    /// the `u`.
    fn parse_unicode_escape(&mut self, start: usize) -> Result<char, JcsError> {
        self.pos += 1; // 'u'
        let unit = self.hex4(start)?;
        let lone = JcsError::LoneSurrogate {
            code_unit: unit,
            offset: start,
        };
        match unit {
            0xD800..=0xDBFF => {
                let low_start = self.pos;
                if self.bytes.get(self.pos..self.pos + 2) != Some(b"\\u") {
                    return Err(lone);
                }
                self.pos += 2;
                let low = self.hex4(low_start)?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return Err(lone);
                }
                let code = 0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                char::from_u32(code).ok_or(lone)
            }
            0xDC00..=0xDFFF => Err(lone),
            _ => char::from_u32(u32::from(unit)).ok_or(lone),
        }
    }

    /// Reads four hexadecimal digits at `pos`; `start` is the offset of the
    /// escape's backslash, for the error.
    fn hex4(&mut self, start: usize) -> Result<u16, JcsError> {
        let mut unit: u16 = 0;
        for _ in 0..4 {
            let digit = self
                .peek()
                .and_then(|b| char::from(b).to_digit(16))
                .ok_or(JcsError::InvalidUnicodeEscape { offset: start })?;
            // `digit` < 16, so the cast is lossless.
            unit = (unit << 4) | digit as u16;
            self.pos += 1;
        }
        Ok(unit)
    }

    fn consume_digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    fn require_digit(&self, reason: &'static str) -> Result<(), JcsError> {
        match self.peek() {
            Some(b'0'..=b'9') => Ok(()),
            _ => Err(JcsError::InvalidNumber {
                reason,
                offset: self.pos,
            }),
        }
    }

    fn parse_number(&mut self) -> Result<Value, JcsError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        self.require_digit("expected a digit after '-'")?;
        if self.peek() == Some(b'0') {
            self.pos += 1;
            if let Some(b'0'..=b'9') = self.peek() {
                return Err(JcsError::InvalidNumber {
                    reason: "leading zeros are not allowed",
                    offset: start,
                });
            }
        } else {
            self.consume_digits();
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.pos += 1;
            self.require_digit("expected a digit after the decimal point")?;
            self.consume_digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            integer = false;
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.require_digit("expected a digit in the exponent")?;
            self.consume_digits();
        }
        let literal = &self.text[start..self.pos];
        if self.literals {
            return Ok(Value::Number(literal.to_owned()));
        }
        let refused = |make: fn(String, usize) -> JcsError| make(abbreviate(literal), start);
        let exact = || {
            exact_decimal(literal).ok_or_else(|| {
                refused(|literal, offset| JcsError::ExponentOutOfRange { literal, offset })
            })
        };
        let ecmascript = match self.numbers {
            Numbers::Exact => return exact().map(Value::Number),
            Numbers::Ecmascript | Numbers::EcmascriptExactOnly => {
                ecmascript_number(literal, integer).map_err(refused)?
            }
        };
        if self.numbers == Numbers::EcmascriptExactOnly
            && exact_decimal(&ecmascript) != Some(exact()?)
        {
            return Err(refused(|literal, offset| JcsError::RoundedNumber {
                literal,
                offset,
            }));
        }
        Ok(Value::Number(ecmascript))
    }
}

/// A JSON number literal (already checked against the grammar) in ECMAScript
/// form via a double; on refusal, which error to build from the literal and
/// its offset.
fn ecmascript_number(
    literal: &str,
    integer: bool,
) -> Result<String, fn(String, usize) -> JcsError> {
    if integer {
        let digits = literal.trim_start_matches('-');
        let too_long = digits.len() > MAX_EXACT_INTEGER_DIGITS.len();
        let same_length = digits.len() == MAX_EXACT_INTEGER_DIGITS.len();
        // Without leading zeros, equal-length decimal strings compare like
        // the numbers they spell.
        if too_long || (same_length && digits > MAX_EXACT_INTEGER_DIGITS) {
            return Err(|literal, offset| JcsError::ImpreciseInteger { literal, offset });
        }
    }
    // The literal follows the JSON grammar, which Rust's float syntax accepts;
    // the result is correctly rounded. `None` only for the infinities that
    // out-of-range literals round to.
    literal
        .parse::<f64>()
        .ok()
        .and_then(format_number)
        .ok_or(|literal, offset| JcsError::NumberOutOfRange { literal, offset })
}

/// The exact canonical decimal of a JSON number literal (already checked
/// against the grammar): `[-]DIGITS[eEXP]`, see the module documentation.
/// `None` if the exponent does not fit an i64.
fn exact_decimal(literal: &str) -> Option<String> {
    let (negative, unsigned) = match literal.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, literal),
    };
    let (mantissa, exponent) = unsigned.split_once(['e', 'E']).unwrap_or((unsigned, "0"));
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let exponent = exponent.strip_prefix('+').unwrap_or(exponent);
    // Rust's integer parsing takes leading zeros and a '-' and fails on
    // overflow, never wraps.
    let exponent: i64 = exponent.parse().ok()?;
    let joined;
    let digits = if frac_part.is_empty() {
        int_part
    } else {
        joined = [int_part, frac_part].concat();
        &joined
    };
    let significant = digits.trim_start_matches('0');
    let kept = significant.trim_end_matches('0');
    if kept.is_empty() {
        return Some("0".to_owned());
    }
    // Both lengths are below the body size, so the i128 sum cannot overflow.
    let trailing = significant.len() - kept.len();
    let power = i128::from(exponent) - frac_part.len() as i128 + trailing as i128;
    let power = i64::try_from(power).ok()?;
    // Built by pushes, not `format!`: a number of every JSON body passes
    // here on every request.
    // The sign, the digits, then `e` and at most 20 characters of an i64.
    let mut exact = String::with_capacity(1 + kept.len() + 21);
    if negative {
        exact.push('-');
    }
    exact.push_str(kept);
    if power != 0 {
        exact.push('e');
        exact.push_str(&power.to_string());
    }
    Some(exact)
}

/// Shortens `s` for quoting in an error message.
fn abbreviate(s: &str) -> String {
    match s.char_indices().nth(MAX_QUOTED_CHARS) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

/// The array index a pointer segment denotes, per RFC 6901 (`0` or a decimal
/// without leading zeros); `None` for anything else, including `-`.
fn array_index(segment: &str) -> Option<usize> {
    match segment.parse() {
        Ok(jsonptr::index::Index::Num(index)) => Some(index),
        Ok(jsonptr::index::Index::Next) | Err(_) => None,
    }
}

/// Removes the locations addressed by `paths` (remaining pointer segments,
/// relative to `value`); every path is resolved against `value` as it was
/// before any removal.
fn remove_excluded(value: &mut Value, paths: &[&[String]]) {
    if paths.is_empty() {
        return;
    }
    // Whether to keep `child`, the member or element that `matches` selects:
    // not if a path ends at it; otherwise the longer paths are applied inside.
    fn visit(child: &mut Value, paths: &[&[String]], matches: impl Fn(&str) -> bool) -> bool {
        let mut deeper: Vec<&[String]> = Vec::new();
        for path in paths {
            if let Some((first, rest)) = path.split_first()
                && matches(first)
            {
                if rest.is_empty() {
                    return false;
                }
                deeper.push(rest);
            }
        }
        remove_excluded(child, &deeper);
        true
    }
    match value {
        Value::Object(members) => {
            members.retain_mut(|(name, child)| visit(child, paths, |s| s == name.as_str()));
        }
        Value::Array(items) => {
            let mut index = 0;
            items.retain_mut(|child| {
                let here = index;
                index += 1;
                visit(child, paths, |s| array_index(s) == Some(here))
            });
        }
        Value::Null | Value::True | Value::False | Value::Number(_) | Value::String(_) => {}
    }
}

fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::True => out.extend_from_slice(b"true"),
        Value::False => out.extend_from_slice(b"false"),
        Value::Number(s) => out.extend_from_slice(s.as_bytes()),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<&(String, Value)> = members.iter().collect();
            sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push(b'{');
            for (i, (name, item)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(name, out);
                out.push(b':');
                write_value(item, out);
            }
            out.push(b'}');
        }
    }
}

/// Writes `s` as a JSON string per RFC 8785 §3.2.2.2, which is how
/// `serde_json` escapes (ECMAScript's `JSON.stringify`): `"` and `\\`, and
/// U+0000 to U+001F as `\b \t \n \f \r` or lowercase `\u00xx`; nothing else.
fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json fails only when its writer does, and a Vec never does.
    let written = serde_json::to_writer(&mut *out, s);
    debug_assert!(written.is_ok(), "{written:?}");
}

/// Formats a double as ECMAScript's `Number.prototype.toString` does
/// (RFC 8785 §3.2.2.3), ties between two shortest spellings to the even one
/// included; `None` for NaN and the infinities, which JSON cannot represent.
fn format_number(x: f64) -> Option<String> {
    x.is_finite()
        .then(|| ryu_js::Buffer::new().format_finite(x).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn canon(input: &str) -> Result<String, JcsError> {
        canonicalize(input.as_bytes(), &[], Numbers::Ecmascript)
            .map(|b| String::from_utf8(b).unwrap())
    }

    #[track_caller]
    fn check(input: &str, expected: &str) {
        assert_eq!(canon(input).as_deref(), Ok(expected), "input: {input:?}");
    }

    #[track_caller]
    fn check_err(input: &str, expected: JcsError) {
        assert_eq!(canon(input), Err(expected), "input: {input:?}");
    }

    fn pointers(list: &[&str]) -> Vec<JsonPointer> {
        list.iter()
            .map(|p| JsonPointer::parse(p).unwrap())
            .collect()
    }

    #[test]
    fn extract_keeps_numbers_as_spelled_and_gives_nothing_for_what_is_not_there() {
        let body = br#"{"seller_id":"s-1","amount":12345678901234567890.25,"n":1.50e3,
            "items":[{"sku":"a\u0041"}],"obj":{"b":1,"a":[2]},"nil":null}"#;
        let asked = pointers(&[
            "/amount",
            "/seller_id",
            "/missing",
            "/n",
            "/items/0/sku",
            "/items/1",
            "/obj",
            "/nil",
            "/amount/x",
        ]);
        let found: Vec<(String, String)> = extract(body, &asked);
        let expect = [
            ("/amount", "12345678901234567890.25"),
            ("/seller_id", r#""s-1""#),
            ("/n", "1.50e3"),
            ("/items/0/sku", r#""aA""#),
            ("/obj", r#"{"a":[2],"b":1}"#),
            ("/nil", "null"),
        ];
        let expect: Vec<(String, String)> = expect
            .iter()
            .map(|(p, v)| ((*p).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(found, expect);
        for not_json in [&b"amount=1"[..], b"{\"amount\":1} x", b"\xff", b""] {
            assert_eq!(extract(not_json, &asked), vec![], "{not_json:?}");
        }
    }

    #[track_caller]
    fn check_excluding(input: &str, exclude: &[&str], expected: &str) {
        let out = canonicalize(input.as_bytes(), &pointers(exclude), Numbers::Ecmascript).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            expected,
            "input {input:?} excluding {exclude:?}"
        );
    }

    #[test]
    fn literals_and_whitespace() {
        for (input, expected) in [
            ("true", "true"),
            ("false", "false"),
            ("null", "null"),
            (" \t\r\n null \t\r\n", "null"),
            ("[ true , false , null ]", "[true,false,null]"),
            ("{ \"a\" : [ ] , \"b\" : { } }", "{\"a\":[],\"b\":{}}"),
            ("[[[]]]", "[[[]]]"),
            ("\"\"", "\"\""),
            ("[1,[2,[3]],{\"x\":[4]}]", "[1,[2,[3]],{\"x\":[4]}]"),
        ] {
            check(input, expected);
        }
    }

    /// RFC 8785 §3.2.2 sample input and §3.2.3 / §3.2.4 output.
    #[test]
    fn rfc_8785_sample() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50,
                      2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let expected = "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,\
                        1e+30,4.5,0.002,1e-27],\"string\":\"€$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}";
        check(input, expected);
        // §3.2.4 gives the UTF-8 bytes of the same output.
        let hex = "7b 22 6c 69 74 65 72 61 6c 73 22 3a 5b 6e 75 6c 6c 2c 74 72 \
                   75 65 2c 66 61 6c 73 65 5d 2c 22 6e 75 6d 62 65 72 73 22 3a \
                   5b 33 33 33 33 33 33 33 33 33 2e 33 33 33 33 33 33 33 2c 31 \
                   65 2b 33 30 2c 34 2e 35 2c 30 2e 30 30 32 2c 31 65 2d 32 37 \
                   5d 2c 22 73 74 72 69 6e 67 22 3a 22 e2 82 ac 24 5c 75 30 30 \
                   30 66 5c 6e 41 27 42 5c 22 5c 5c 5c 5c 5c 22 2f 22 7d";
        let bytes: Vec<u8> = hex
            .split_whitespace()
            .map(|h| u8::from_str_radix(h, 16).unwrap())
            .collect();
        assert_eq!(
            canonicalize(input.as_bytes(), &[], Numbers::Ecmascript).unwrap(),
            bytes
        );
    }

    /// RFC 8785 §3.2.3: names sort as UTF-16 code unit sequences, so the
    /// surrogate pair of U+1F600 sorts before U+FB33 (whereas by code point or
    /// UTF-8 it would sort after).
    #[test]
    fn member_order_is_utf16_code_units() {
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let expected = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
                        \"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\
                        \"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        check(input, expected);
    }

    #[test]
    fn member_order_more_cases() {
        for (input, expected) in [
            (r#"{"b":1,"a":2}"#, r#"{"a":2,"b":1}"#),
            (r#"{"aa":1,"a":2,"":3}"#, r#"{"":3,"a":2,"aa":1}"#),
            (
                r#"{"a":1,"B":2,"b":3,"A":4}"#,
                r#"{"A":4,"B":2,"a":1,"b":3}"#,
            ),
            (r#"{"10":1,"9":2,"1":3}"#, r#"{"1":3,"10":1,"9":2}"#),
            // Sorting applies at every level; arrays keep their order.
            (
                r#"[{"z":{"y":1,"x":2}},{"b":0,"a":0}]"#,
                r#"[{"z":{"x":2,"y":1}},{"a":0,"b":0}]"#,
            ),
            // U+FFFF (one unit) sorts after U+10000 (surrogates D800 DC00).
            (
                "{\"\u{ffff}\":1,\"\u{10000}\":2}",
                "{\"\u{10000}\":2,\"\u{ffff}\":1}",
            ),
        ] {
            check(input, expected);
        }
    }

    #[test]
    fn string_escaping() {
        for (input, expected) in [
            (r#""\u0000""#, r#""\u0000""#),
            (r#""\u0001\u001f""#, r#""\u0001\u001f""#),
            (r#""\u000B\u000e""#, r#""\u000b\u000e""#),
            (r#""\b\t\n\f\r""#, r#""\b\t\n\f\r""#),
            (r#""\u0008\u0009\u000a\u000c\u000d""#, r#""\b\t\n\f\r""#),
            (r#""\"\\\/""#, r#""\"\\/""#),
            (r#""\u0022\u005C\u002f""#, r#""\"\\/""#),
            (r#""\u007f""#, "\"\u{7f}\""),
            (r#""\u0080\u00e9\u20AC""#, "\"\u{80}é€\""),
            (r#""\ud83d\ude00""#, "\"😀\""),
            (r#""\uD83D\uDE00""#, "\"😀\""),
            (r#""\udbff\udfff""#, "\"\u{10ffff}\""),
            ("\"é€😀 raw\"", "\"é€😀 raw\""),
            ("\"\u{7f}\"", "\"\u{7f}\""),
            ("\"'<>&\"", "\"'<>&\""),
            (r#""\ufeff""#, "\"\u{feff}\""),
        ] {
            check(input, expected);
        }
    }

    /// RFC 8785 Appendix B, every row.
    #[test]
    fn number_formatting_appendix_b() {
        let table: &[(u64, Option<&str>)] = &[
            (0x0000000000000000, Some("0")),
            (0x8000000000000000, Some("0")),
            (0x0000000000000001, Some("5e-324")),
            (0x8000000000000001, Some("-5e-324")),
            (0x7fefffffffffffff, Some("1.7976931348623157e+308")),
            (0xffefffffffffffff, Some("-1.7976931348623157e+308")),
            (0x4340000000000000, Some("9007199254740992")),
            (0xc340000000000000, Some("-9007199254740992")),
            (0x4430000000000000, Some("295147905179352830000")),
            (0x7fffffffffffffff, None),
            (0x7ff0000000000000, None),
            (0x44b52d02c7e14af5, Some("9.999999999999997e+22")),
            (0x44b52d02c7e14af6, Some("1e+23")),
            (0x44b52d02c7e14af7, Some("1.0000000000000001e+23")),
            (0x444b1ae4d6e2ef4e, Some("999999999999999700000")),
            (0x444b1ae4d6e2ef4f, Some("999999999999999900000")),
            (0x444b1ae4d6e2ef50, Some("1e+21")),
            (0x3eb0c6f7a0b5ed8c, Some("9.999999999999997e-7")),
            (0x3eb0c6f7a0b5ed8d, Some("0.000001")),
            (0x41b3de4355555553, Some("333333333.3333332")),
            (0x41b3de4355555554, Some("333333333.33333325")),
            (0x41b3de4355555555, Some("333333333.3333333")),
            (0x41b3de4355555556, Some("333333333.3333334")),
            (0x41b3de4355555557, Some("333333333.33333343")),
            (0xbecbf647612f3696, Some("-0.0000033333333333333333")),
            (0x43143ff3c1cb0959, Some("1424953923781206.2")),
        ];
        for &(bits, expected) in table {
            let x = f64::from_bits(bits);
            assert_eq!(
                format_number(x).as_deref(),
                expected,
                "bits {bits:#018x} ({x:?})"
            );
        }
    }

    #[test]
    fn number_formatting_more() {
        for (x, expected) in [
            (1.0, "1"),
            (-1.0, "-1"),
            (0.5, "0.5"),
            (123.456, "123.456"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (1.5e21, "1.5e+21"),
            (1e-6, "0.000001"),
            (1.5e-6, "0.0000015"),
            (1e-7, "1e-7"),
            (1.25e-7, "1.25e-7"),
            (f64::MIN_POSITIVE, "2.2250738585072014e-308"),
            // Ties between two shortest candidates go to the even one, as in
            // ECMAScript (Rust's own shortest formatting would end in 3).
            (1125899906842624.0 + 0.25, "1125899906842624.2"),
            (1453720677523242.0 + 0.25, "1453720677523242.2"),
            (-175333674162137.0 - 0.625, "-175333674162137.62"),
            (27518789548969.0 + 0.3125, "27518789548969.312"),
            // Not ties: the nearest candidate wins.
            (1125899906842624.0 + 0.75, "1125899906842624.8"),
            (1125899906842625.5, "1125899906842625.5"),
            (f64::NEG_INFINITY, ""),
        ] {
            let got = format_number(x).unwrap_or_default();
            assert_eq!(got, expected, "{x:?}");
        }
    }

    #[test]
    fn number_literals() {
        for (input, expected) in [
            ("0", "0"),
            ("-0", "0"),
            ("0.0", "0"),
            ("-0.0e5", "0"),
            ("1.0", "1"),
            ("4.50", "4.5"),
            ("1E30", "1e+30"),
            ("1e+30", "1e+30"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("2e-3", "0.002"),
            ("1e-7", "1e-7"),
            ("0.000001", "0.000001"),
            ("123.456e2", "12345.6"),
            ("-12.5E-1", "-1.25"),
            ("333333333.33333329", "333333333.3333333"),
            ("1e-400", "0"),
            ("9007199254740992", "9007199254740992"),
            ("-9007199254740992", "-9007199254740992"),
            ("9007199254740991", "9007199254740991"),
            ("1000000000000000", "1000000000000000"),
            // Not an integer literal, so the 2^53 rule does not apply.
            ("9007199254740993.0", "9007199254740992"),
            ("9007199254740993e0", "9007199254740992"),
            ("[1,-2,3.5]", "[1,-2,3.5]"),
        ] {
            check(input, expected);
        }
    }

    /// The exact form's spelling goes into fingerprints kept in stores:
    /// it must not change from one release to the next.
    #[test]
    fn exact_decimals_are_spelt_as_committed() {
        for (literal, expected) in [
            ("0", Some("0")),
            ("-0", Some("0")),
            ("0.000", Some("0")),
            ("007", Some("7")),
            ("-7", Some("-7")),
            ("1000", Some("1e3")),
            ("12.50", Some("125e-1")),
            ("-0.5e-3", Some("-5e-4")),
            ("4.5E+2", Some("45e1")),
            (
                "123456789012345678901234567890",
                Some("12345678901234567890123456789e1"),
            ),
            ("1e9223372036854775807", Some("1e9223372036854775807")),
            ("10e9223372036854775807", None),
            ("1e99999999999999999999", None),
        ] {
            assert_eq!(exact_decimal(literal).as_deref(), expected, "{literal}");
        }
    }

    #[test]
    fn integers_beyond_2_pow_53_are_rejected() {
        for (input, literal, offset) in [
            ("9007199254740993", "9007199254740993", 0),
            ("-9007199254740993", "-9007199254740993", 0),
            ("9999999999999999", "9999999999999999", 0),
            ("[1, 12345678901234567890]", "12345678901234567890", 4),
            (
                "{\"amount\":18446744073709551616}",
                "18446744073709551616",
                10,
            ),
        ] {
            check_err(
                input,
                JcsError::ImpreciseInteger {
                    literal: literal.to_owned(),
                    offset,
                },
            );
        }
        let message = canon("9007199254740993").unwrap_err().to_string();
        assert!(message.contains("2^53"), "{message}");
        assert!(message.contains("silently rounded"), "{message}");
    }

    #[test]
    fn error_kinds() {
        use JcsError::*;
        let end = |expected, offset| UnexpectedEnd { expected, offset };
        let chr = |found, expected, offset| UnexpectedChar {
            found,
            expected,
            offset,
        };
        let trailing = |found, offset| TrailingData { found, offset };
        let dup = |name: &str, offset| DuplicateMember {
            name: name.to_owned(),
            offset,
        };
        let ctrl = |byte, offset| ControlCharacter { byte, offset };
        let esc = |found, offset| InvalidEscape { found, offset };
        let lone = |code_unit, offset| LoneSurrogate { code_unit, offset };
        let num = |reason, offset| InvalidNumber { reason, offset };
        let range = |literal: &str, offset| NumberOutOfRange {
            literal: literal.to_owned(),
            offset,
        };
        const VALUE: &str = "a JSON value";
        const NAME: &str = "'\"' to start an object member name";
        const COLON: &str = "':' after object member name";
        const AFTER_MEMBER: &str = "',' or '}' after object member value";
        const AFTER_ELEMENT: &str = "',' or ']' after array element";
        const LEADING_ZERO: &str = "leading zeros are not allowed";
        const AFTER_MINUS: &str = "expected a digit after '-'";
        const AFTER_POINT: &str = "expected a digit after the decimal point";
        const EXPONENT: &str = "expected a digit in the exponent";
        let cases: Vec<(&[u8], JcsError)> = vec![
            (b"[1,\xff]", InvalidUtf8 { offset: 3 }),
            (b"\"\xc3\"", InvalidUtf8 { offset: 1 }),
            (b"", end(VALUE, 0)),
            (b"   ", end(VALUE, 3)),
            (b"[1,", end(VALUE, 3)),
            (b"[1", end(AFTER_ELEMENT, 2)),
            (b"{\"a\"", end(COLON, 4)),
            (b"{\"a\":1", end(AFTER_MEMBER, 6)),
            (b"\"abc", end("closing '\"' of string", 4)),
            (b"\"\\", end("an escape character after '\\'", 2)),
            (b"tru", end("the literal 'true'", 3)),
            (b"nul", end("the literal 'null'", 3)),
            (b"{\"a\" 1}", chr('1', COLON, 5)),
            (b"{a:1}", chr('a', NAME, 1)),
            (b"{\"a\":1,}", chr('}', NAME, 7)),
            (b"{\"a\":1 \"b\":2}", chr('"', AFTER_MEMBER, 7)),
            (b"[1,]", chr(']', VALUE, 3)),
            (b"[1 2]", chr('2', AFTER_ELEMENT, 3)),
            (b"[,]", chr(',', VALUE, 1)),
            (b"'a'", chr('\'', VALUE, 0)),
            (b"+1", chr('+', VALUE, 0)),
            (b".5", chr('.', VALUE, 0)),
            (b"NaN", chr('N', VALUE, 0)),
            (b"trUe", chr('U', "the literal 'true'", 2)),
            (b"fals3", chr('3', "the literal 'false'", 4)),
            ("\u{feff}{}".as_bytes(), chr('\u{feff}', VALUE, 0)),
            ("[é]".as_bytes(), chr('é', VALUE, 1)),
            (b"{} {}", trailing('{', 3)),
            (b"truex", trailing('x', 4)),
            (b"1 2", trailing('2', 2)),
            (b"[]]", trailing(']', 2)),
            (b"null\0", trailing('\0', 4)),
            (b"{\"a\":1,\"a\":2}", dup("a", 7)),
            (b"{\"a\":1,\"b\":2,\"\\u0061\":3}", dup("a", 13)),
            (b"[{\"x\":{\"y\":1,\"y\":1}}]", dup("y", 13)),
            (b"\"a\nb\"", ctrl(0x0a, 2)),
            (b"\"\t\"", ctrl(0x09, 1)),
            (b"\"\x00\"", ctrl(0x00, 1)),
            (b"{\"\x1f\":1}", ctrl(0x1f, 2)),
            (b"\"\\x41\"", esc('x', 1)),
            (b"\"\\'\"", esc('\'', 1)),
            (b"\"ab\\U0041\"", esc('U', 3)),
            ("\"\\é\"".as_bytes(), esc('é', 1)),
            (b"\"\\u12\"", InvalidUnicodeEscape { offset: 1 }),
            (b"\"\\u12G4\"", InvalidUnicodeEscape { offset: 1 }),
            (b"\"\\u", InvalidUnicodeEscape { offset: 1 }),
            (b"\"\\ud83d\\u12\"", InvalidUnicodeEscape { offset: 7 }),
            (b"\"\\ud83d\"", lone(0xd83d, 1)),
            (b"\"\\ud83dx\"", lone(0xd83d, 1)),
            (b"\"\\ud83d\\n\"", lone(0xd83d, 1)),
            (b"\"\\ud83d\\ud83d\"", lone(0xd83d, 1)),
            (b"\"\\ud83d\\u0041\"", lone(0xd83d, 1)),
            (b"\"x\\ude00\"", lone(0xde00, 2)),
            (b"\"\\uDFFF\\uD800\"", lone(0xdfff, 1)),
            (b"01", num(LEADING_ZERO, 0)),
            (b"[-007]", num(LEADING_ZERO, 1)),
            (b"-", num(AFTER_MINUS, 1)),
            (b"-a", num(AFTER_MINUS, 1)),
            (b"1.", num(AFTER_POINT, 2)),
            (b"1.e5", num(AFTER_POINT, 2)),
            (b"1e", num(EXPONENT, 2)),
            (b"1e+", num(EXPONENT, 3)),
            (b"[1E-x]", num(EXPONENT, 4)),
            (b"1e400", range("1e400", 0)),
            (b"[0, -1.8e308]", range("-1.8e308", 4)),
            (
                b"9007199254740993",
                ImpreciseInteger {
                    literal: "9007199254740993".into(),
                    offset: 0,
                },
            ),
            // TooDeep: see depth_limit; InvalidPointer: see pointer_errors.
        ];
        for (input, expected) in cases {
            let got = canonicalize(input, &[], Numbers::Ecmascript);
            let input = String::from_utf8_lossy(input);
            assert_eq!(got, Err(expected), "input: {input:?}");
        }
    }

    #[test]
    fn error_messages() {
        for (input, message) in [
            (
                &b"{\"name\" 17}"[..],
                "expected ':' after object member name at byte 8, found '1'",
            ),
            (
                b"[1,",
                "expected a JSON value at byte 3, but the input ended",
            ),
            (
                b"[1]x",
                "unexpected 'x' at byte 3 after the end of the JSON value",
            ),
            (
                b"{\"id\":1,\"id\":2}",
                "duplicate object member name \"id\" at byte 8 (I-JSON forbids duplicate names)",
            ),
            (
                b"\"\\ude00\"",
                "lone surrogate \\ude00 at byte 1: a surrogate escape must be a high/low pair",
            ),
            (
                b"\"\x01\"",
                "unescaped control character U+0001 in string at byte 1",
            ),
            (
                b"\"\\q\"",
                "invalid escape sequence at byte 1: '\\' followed by 'q'",
            ),
            (
                b"\"\\u00\"",
                "invalid \\u escape at byte 1: expected four hexadecimal digits",
            ),
            (
                b"00",
                "invalid number at byte 0: leading zeros are not allowed",
            ),
            (
                b"1e999",
                "number 1e999 at byte 0 is outside the finite range of an IEEE-754 double",
            ),
            (b"[\xff]", "input is not valid UTF-8 at byte 1"),
        ] {
            let err = canonicalize(input, &[], Numbers::Ecmascript).unwrap_err();
            assert_eq!(err.to_string(), message);
        }
    }

    #[test]
    fn long_literals_are_abbreviated_in_errors() {
        let literal = "1".repeat(1000);
        let err = canon(&literal).unwrap_err();
        let JcsError::ImpreciseInteger {
            literal: quoted,
            offset: 0,
        } = &err
        else {
            panic!("unexpected error {err:?}");
        };
        assert_eq!(quoted.chars().count(), MAX_QUOTED_CHARS + 1);
        assert!(quoted.ends_with('…'));
        let name = "é".repeat(100);
        let err = canon(&format!("{{\"{name}\":1,\"{name}\":2}}")).unwrap_err();
        let JcsError::DuplicateMember { name: quoted, .. } = &err else {
            panic!("unexpected error {err:?}");
        };
        assert_eq!(quoted.chars().count(), MAX_QUOTED_CHARS + 1);
    }

    #[test]
    fn same_name_in_different_objects_is_fine() {
        check(
            r#"{"a":{"a":1},"b":[{"a":2},{"a":3}]}"#,
            r#"{"a":{"a":1},"b":[{"a":2},{"a":3}]}"#,
        );
    }

    #[test]
    fn depth_limit() {
        let nested = |depth: usize, open: &str, close: &str| {
            format!("{}{}", open.repeat(depth), close.repeat(depth))
        };
        let ok = nested(MAX_DEPTH, "[", "]");
        check(&ok, &ok);
        check_err(
            &nested(MAX_DEPTH + 1, "[", "]"),
            JcsError::TooDeep {
                limit: MAX_DEPTH,
                offset: MAX_DEPTH,
            },
        );
        let objects = format!(
            "{}1{}",
            "{\"a\":".repeat(MAX_DEPTH + 1),
            "}".repeat(MAX_DEPTH + 1)
        );
        check_err(
            &objects,
            JcsError::TooDeep {
                limit: MAX_DEPTH,
                offset: MAX_DEPTH * 5,
            },
        );
        // Hostile input: far deeper than any stack could recurse.
        let hostile = "[".repeat(1_000_000);
        assert!(matches!(canon(&hostile), Err(JcsError::TooDeep { .. })));
        let mixed = "{\"a\":[".repeat(500_000);
        assert!(matches!(canon(&mixed), Err(JcsError::TooDeep { .. })));
    }

    #[test]
    fn exclusions() {
        let doc = r#"{"a":1,"b":{"c":2,"d":[10,20,30]},"e/f":3,"g~h":4,"":5,"n":null}"#;
        for (exclude, expected) in [
            (
                &[][..],
                r#"{"":5,"a":1,"b":{"c":2,"d":[10,20,30]},"e/f":3,"g~h":4,"n":null}"#,
            ),
            (
                &["/a"][..],
                r#"{"":5,"b":{"c":2,"d":[10,20,30]},"e/f":3,"g~h":4,"n":null}"#,
            ),
            (&["/b"], r#"{"":5,"a":1,"e/f":3,"g~h":4,"n":null}"#),
            (
                &["/b/c"],
                r#"{"":5,"a":1,"b":{"d":[10,20,30]},"e/f":3,"g~h":4,"n":null}"#,
            ),
            (
                &["/b/d/0"],
                r#"{"":5,"a":1,"b":{"c":2,"d":[20,30]},"e/f":3,"g~h":4,"n":null}"#,
            ),
            (
                &["/b/d/2"],
                r#"{"":5,"a":1,"b":{"c":2,"d":[10,20]},"e/f":3,"g~h":4,"n":null}"#,
            ),
            // Several elements of one array: resolved against the original.
            (
                &["/b/d/0", "/b/d/1"],
                r#"{"":5,"a":1,"b":{"c":2,"d":[30]},"e/f":3,"g~h":4,"n":null}"#,
            ),
            (
                &["/e~1f"],
                r#"{"":5,"a":1,"b":{"c":2,"d":[10,20,30]},"g~h":4,"n":null}"#,
            ),
            (
                &["/g~0h"],
                r#"{"":5,"a":1,"b":{"c":2,"d":[10,20,30]},"e/f":3,"n":null}"#,
            ),
            (
                &["/"],
                r#"{"a":1,"b":{"c":2,"d":[10,20,30]},"e/f":3,"g~h":4,"n":null}"#,
            ),
            (
                &["/n"],
                r#"{"":5,"a":1,"b":{"c":2,"d":[10,20,30]},"e/f":3,"g~h":4}"#,
            ),
            (
                &["/a", "/b/d", "/a"],
                r#"{"":5,"b":{"c":2},"e/f":3,"g~h":4,"n":null}"#,
            ),
            // A parent and a child of it: the parent goes.
            (&["/b/c", "/b"], r#"{"":5,"a":1,"e/f":3,"g~h":4,"n":null}"#),
        ] {
            check_excluding(doc, exclude, expected);
        }
    }

    #[test]
    fn exclusions_that_match_nothing_are_ignored() {
        let doc = r#"{"a":1,"b":{"c":2,"d":[10,20,30]},"s":"x"}"#;
        let canonical = r#"{"a":1,"b":{"c":2,"d":[10,20,30]},"s":"x"}"#;
        for exclude in [
            "/z",
            "/A",
            "/b/z",
            "/b/d/3",
            "/b/d/-",
            "/b/d/01",
            "/b/d/+1",
            "/b/d/x",
            "/b/d/99999999999999999999999",
            "/a/0",
            "/s/0",
            "/b/c/d/e",
            "/b~1c",
            "//a",
        ] {
            check_excluding(doc, &[exclude], canonical);
        }
        // Array-index pointers do not match object members and vice versa,
        // except that an object member may be named "0".
        check_excluding(r#"{"0":1,"1":2}"#, &["/0"], r#"{"1":2}"#);
        check_excluding(r#"[[1,2],[3,4]]"#, &["/1/0"], r#"[[1,2],[4]]"#);
        check_excluding(r#"[{"a":1,"b":2}]"#, &["/0/a"], r#"[{"b":2}]"#);
        check_excluding("7", &["/a"], "7");
    }

    #[test]
    fn pointer_parsing() {
        for (text, segments) in [
            ("/a", &["a"][..]),
            ("/", &[""]),
            ("//", &["", ""]),
            ("/a/b/0", &["a", "b", "0"]),
            ("/a~1b", &["a/b"]),
            ("/m~0n", &["m~n"]),
            ("/~01", &["~1"]),
            ("/~10", &["/0"]),
            ("/é/😀", &["é", "😀"]),
            ("/a b/%25", &["a b", "%25"]),
        ] {
            let pointer = JsonPointer::parse(text).unwrap();
            assert_eq!(pointer.segments(), segments, "{text:?}");
            assert_eq!(pointer.as_str(), text);
            assert_eq!(pointer.to_string(), text);
            assert_eq!(text.parse::<JsonPointer>().unwrap(), pointer);
        }
    }

    #[test]
    fn pointer_errors() {
        for (text, reason) in [
            (
                "",
                "cannot exclude the whole body (the empty pointer addresses the entire document)",
            ),
            ("a", "a JSON pointer must start with '/'"),
            ("#/a", "a JSON pointer must start with '/'"),
            ("/a~", "'~' must be followed by '0' or '1'"),
            ("/a~2", "'~' must be followed by '0' or '1'"),
            ("/~~0", "'~' must be followed by '0' or '1'"),
        ] {
            let err = JsonPointer::parse(text).unwrap_err();
            assert_eq!(
                err,
                JcsError::InvalidPointer {
                    pointer: text.to_owned(),
                    reason
                }
            );
            assert_eq!(text.parse::<JsonPointer>(), Err(err.clone()));
            assert!(err.to_string().contains(reason), "{err}");
        }
        assert!(
            JsonPointer::parse("")
                .unwrap_err()
                .to_string()
                .contains("cannot exclude the whole body")
        );
    }

    #[test]
    fn output_is_a_fixed_point() {
        for input in [
            r#"{"b":[1.50,{"d":"\u00e9","c":null}],"a":"\n"}"#,
            r#"[1e-7,1e21,-0,"\u001f\u007f"]"#,
        ] {
            let once = canon(input).unwrap();
            assert_eq!(canon(&once).unwrap(), once);
        }
    }

    #[test]
    fn equivalent_documents_canonicalise_equally() {
        let a = canon(r#"{"amount": 1.50, "currency": "EUR", "note": "caf\u00e9"}"#).unwrap();
        let b = canon("{\"note\":\"café\",\"currency\":\"\\u0045UR\",\"amount\":15e-1}").unwrap();
        assert_eq!(a, b);
        let c = canon(r#"{"amount": 1.51, "currency": "EUR", "note": "café"}"#).unwrap();
        assert_ne!(a, c);
    }

    /// Input a hostile client chooses, in every number form: what is
    /// accepted and how it is written, what is refused and with which error.
    #[test]
    fn hostile_inputs() {
        use JcsError::*;
        use Numbers::*;
        let deep =
            |open: &str, close: &str| format!("{}1{}", open.repeat(100_000), close.repeat(100_000));
        let ten_k = |digit: &str| format!("1{}", digit.repeat(9_999));
        let tiny = format!("0.{}1", "0".repeat(9_998));
        let huge = format!("{}.5", ten_k("0"));
        let too_deep = |offset| {
            Err(TooDeep {
                limit: MAX_DEPTH,
                offset,
            })
        };
        // Errors about a number that is the whole input.
        let whole =
            |make: fn(String, usize) -> JcsError, input: &str| Err(make(abbreviate(input), 0));
        let imprecise = |literal, offset| ImpreciseInteger { literal, offset };
        let out_of_range = |literal, offset| NumberOutOfRange { literal, offset };
        let exponent = |literal, offset| ExponentOutOfRange { literal, offset };
        let rounded = |literal, offset| RoundedNumber { literal, offset };
        let dup = |name: &str, offset| {
            Err(DuplicateMember {
                name: name.into(),
                offset,
            })
        };
        let lone = |code_unit, offset| Err(LoneSurrogate { code_unit, offset });
        let trailing = |found, offset| Err(TrailingData { found, offset });
        let ok = |out: &str| Ok(out.to_owned());
        let cases: Vec<(String, Numbers, Result<String, JcsError>)> = vec![
            // Nesting: refused at the limit, never recursed into.
            (deep("[", "]"), Exact, too_deep(MAX_DEPTH)),
            (deep("{\"a\":", "}"), Exact, too_deep(MAX_DEPTH * 5)),
            (
                deep("[{\"\":", "}]"),
                Ecmascript,
                too_deep(MAX_DEPTH / 2 * 5),
            ),
            // Ten thousand digits: exact in the fingerprint form.
            (ten_k("0"), Exact, ok("1e9999")),
            (ten_k("7"), Exact, Ok(ten_k("7"))),
            (ten_k("7"), Ecmascript, whole(imprecise, &ten_k("7"))),
            (huge.clone(), Ecmascript, whole(out_of_range, &huge)),
            (tiny.clone(), Exact, ok("1e-9999")),
            (tiny.clone(), Ecmascript, ok("0")),
            (tiny.clone(), EcmascriptExactOnly, whole(rounded, &tiny)),
            // Exponents: any i64.
            ("1e999999999".into(), Exact, ok("1e999999999")),
            (
                "-1e-9223372036854775808".into(),
                Exact,
                ok("-1e-9223372036854775808"),
            ),
            (
                "1e999999999".into(),
                Ecmascript,
                whole(out_of_range, "1e999999999"),
            ),
            (
                "10e9223372036854775807".into(),
                Exact,
                whole(exponent, "10e9223372036854775807"),
            ),
            (
                "1e9223372036854775808".into(),
                Exact,
                whole(exponent, "1e9223372036854775808"),
            ),
            // Minus zero is zero.
            ("[-0,-0.0,-0e-7,0E+3]".into(), Exact, ok("[0,0,0,0]")),
            (
                "[-0,-0.0,-0e-7,0E+3]".into(),
                EcmascriptExactOnly,
                ok("[0,0,0,0]"),
            ),
            // Names compared after unescaping.
            ("{\"a\":1,\"\\u0061\":1}".into(), Exact, dup("a", 7)),
            (
                "{\"\\ud83d\\ude00\":1,\"😀\":1}".into(),
                Exact,
                dup("😀", 18),
            ),
            // Surrogates, byte order mark, trailing bytes.
            ("\"\\ud800\"".into(), Exact, lone(0xd800, 1)),
            ("[\"\\udc00\\ud800\"]".into(), Exact, lone(0xdc00, 2)),
            (
                "\u{feff}{}".into(),
                Exact,
                Err(UnexpectedChar {
                    found: '\u{feff}',
                    expected: "a JSON value",
                    offset: 0,
                }),
            ),
            ("{}\u{feff}".into(), Exact, trailing('\u{feff}', 2)),
            ("{} x".into(), Exact, trailing('x', 3)),
            ("[1]]".into(), Exact, trailing(']', 3)),
        ];
        for (input, numbers, expected) in cases {
            let got = canonicalize(input.as_bytes(), &[], numbers)
                .map(|out| String::from_utf8(out).unwrap());
            let shown: String = input.chars().take(40).collect();
            assert_eq!(got, expected, "{shown:?}… in {numbers:?}");
        }
        // A megabyte of digits, the default body limit, is read exactly.
        let megabyte = format!("[{}]", "9".repeat(1 << 20));
        let out = canonicalize(megabyte.as_bytes(), &[], Exact).unwrap();
        assert_eq!(out, megabyte.as_bytes());
    }

    /// Doubles and their ECMAScript spelling as the hand-written formatter
    /// gave them before `ryu-js` took over: the boundaries of the plain and
    /// exponent notations, ties between two shortest spellings (where the
    /// even one wins), and random bit patterns.
    #[test]
    fn numbers_format_as_committed() {
        let vectors = include_str!("../tests/data/jcs/ecmascript-numbers.txt");
        let mut count = 0;
        for line in vectors.lines() {
            let (bits, expected) = line.split_once(' ').unwrap();
            let x = f64::from_bits(u64::from_str_radix(bits, 16).unwrap());
            assert_eq!(format_number(x).as_deref(), Some(expected), "{line}");
            // The same through the parser, from Rust's (shortest) spelling.
            let parsed = canonicalize(format!("{x:e}").as_bytes(), &[], Numbers::Ecmascript);
            assert_eq!(parsed.as_deref(), Ok(expected.as_bytes()), "{line}");
            count += 1;
        }
        assert!(count > 1000, "only {count} vectors");
    }

    /// A JSON value to be spelt in many ways.
    #[derive(Debug, Clone)]
    enum Doc {
        Null,
        Bool(bool),
        /// `digits × 10^exponent`, digits possibly with leading zeros.
        Number {
            negative: bool,
            digits: String,
            exponent: i32,
        },
        String(String),
        Array(Vec<Doc>),
        Object(std::collections::BTreeMap<String, Doc>),
    }

    fn doc() -> impl Strategy<Value = Doc> {
        let leaf = prop_oneof![
            Just(Doc::Null),
            any::<bool>().prop_map(Doc::Bool),
            (any::<bool>(), "[0-9]{1,30}", -30i32..30).prop_map(|(negative, digits, exponent)| {
                Doc::Number {
                    negative,
                    digits,
                    exponent,
                }
            }),
            any::<String>().prop_map(Doc::String),
        ];
        leaf.prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Doc::Array),
                prop::collection::btree_map(any::<String>(), inner, 0..8).prop_map(Doc::Object),
            ]
        })
    }

    /// Choices for spelling a document, drawn from a seed (xorshift).
    struct Speller(u64);

    impl Speller {
        fn next(&mut self, below: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % below
        }

        fn space(&mut self) -> &'static str {
            ["", "", " ", "\n\t", "\r\n  "][self.next(5) as usize]
        }

        fn spell(&mut self, doc: &Doc, out: &mut String) {
            out.push_str(self.space());
            match doc {
                Doc::Null => out.push_str("null"),
                Doc::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
                Doc::Number {
                    negative,
                    digits,
                    exponent,
                } => self.number(*negative, digits, *exponent, out),
                Doc::String(s) => self.string(s, out),
                Doc::Array(items) => {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        self.spell(item, out);
                    }
                    out.push_str(self.space());
                    out.push(']');
                }
                Doc::Object(members) => {
                    let mut members: Vec<_> = members.iter().collect();
                    let len = members.len().max(1) as u64;
                    members.rotate_left(self.next(len) as usize);
                    if self.next(2) == 0 {
                        members.reverse();
                    }
                    out.push('{');
                    for (i, (name, value)) in members.into_iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(self.space());
                        self.string(name, out);
                        out.push_str(self.space());
                        out.push(':');
                        self.spell(value, out);
                    }
                    out.push_str(self.space());
                    out.push('}');
                }
            }
            out.push_str(self.space());
        }

        /// `digits × 10^exponent` with zeros added on either side, the
        /// point anywhere and the exponent written in any legal way.
        fn number(&mut self, negative: bool, digits: &str, exponent: i32, out: &mut String) {
            let trailing = self.next(3) as i32;
            let digits = format!("{digits}{}", "0".repeat(trailing as usize));
            let point = self.next(digits.len() as u64 + 1) as usize;
            let (int, frac) = digits.split_at(point);
            let int = int.trim_start_matches('0');
            let power = exponent - trailing + frac.len() as i32;
            if negative {
                out.push('-');
            }
            out.push_str(if int.is_empty() { "0" } else { int });
            if !frac.is_empty() {
                out.push('.');
                out.push_str(frac);
            }
            if power != 0 || self.next(2) == 0 {
                out.push(if self.next(2) == 0 { 'e' } else { 'E' });
                if power >= 0 && self.next(2) == 0 {
                    out.push('+');
                }
                out.push_str(&power.to_string());
            }
        }

        /// `s` as a JSON string, each character raw or escaped.
        fn string(&mut self, s: &str, out: &mut String) {
            out.push('"');
            for c in s.chars() {
                let escape = self.next(3) == 0;
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str(if escape { "\\u005C" } else { "\\\\" }),
                    '/' if escape => out.push_str("\\/"),
                    '\n' if !escape => out.push_str("\\n"),
                    c if escape || u32::from(c) < 0x20 => {
                        let mut units = [0u16; 2];
                        for unit in c.encode_utf16(&mut units) {
                            out.push_str(&format!("\\u{unit:04X}"));
                        }
                    }
                    c => out.push(c),
                }
            }
            out.push('"');
        }
    }

    /// The escapes RFC 8785 §3.2.2.2 asks for are the only ones in `out`,
    /// and it holds no raw control character.
    fn only_required_escapes(out: &[u8]) -> bool {
        let mut rest = out;
        while let Some((&b, tail)) = rest.split_first() {
            rest = tail;
            match b {
                0x00..=0x1f => return false,
                b'\\' => match rest {
                    [b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't', tail @ ..] => rest = tail,
                    [b'u', b'0', b'0', hi @ (b'0' | b'1'), lo, tail @ ..]
                        if lo.is_ascii_digit() || (b'a'..=b'f').contains(lo) =>
                    {
                        let code = (hi - b'0') * 16 + (*lo as char).to_digit(16).unwrap() as u8;
                        if matches!(code, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d) {
                            return false;
                        }
                        rest = tail;
                    }
                    _ => return false,
                },
                _ => {}
            }
        }
        true
    }

    /// `value` (parsed back by serde_json) holds what `doc` holds: the same
    /// strings, names and nesting; numbers are checked elsewhere.
    fn same_shape(doc: &Doc, value: &serde_json::Value) -> bool {
        use serde_json::Value as V;
        match (doc, value) {
            (Doc::Null, V::Null) => true,
            (Doc::Bool(a), V::Bool(b)) => a == b,
            (Doc::Number { .. }, V::Number(_)) => true,
            (Doc::String(a), V::String(b)) => a == b,
            (Doc::Array(a), V::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_shape(a, b))
            }
            (Doc::Object(a), V::Object(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .all(|(name, a)| b.get(name).is_some_and(|b| same_shape(a, b)))
            }
            _ => false,
        }
    }

    /// Member names of every object in `out`, in order, are sorted as UTF-16
    /// code units.
    fn members_sorted(out: &str) -> bool {
        // serde_json's map does not keep the order: visit the names as read.
        struct Names;
        impl<'de> serde::de::Visitor<'de> for Names {
            type Value = bool;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("JSON")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
                let mut sorted = true;
                let mut last: Option<String> = None;
                while let Some(name) = map.next_key::<String>()? {
                    sorted &= map.next_value::<NamesSorted>()?.0;
                    if let Some(last) = &last {
                        sorted &= last.encode_utf16().lt(name.encode_utf16());
                    }
                    last = Some(name);
                }
                Ok(sorted)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
                let mut sorted = true;
                while let Some(item) = seq.next_element::<NamesSorted>()? {
                    sorted &= item.0;
                }
                Ok(sorted)
            }
            fn visit_unit<E>(self) -> Result<bool, E> {
                Ok(true)
            }
            fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
                Ok(true)
            }
            fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
                Ok(true)
            }
            fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
                Ok(true)
            }
            fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
                Ok(true)
            }
            fn visit_str<E>(self, _: &str) -> Result<bool, E> {
                Ok(true)
            }
        }
        struct NamesSorted(bool);
        impl<'de> serde::Deserialize<'de> for NamesSorted {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(Names).map(NamesSorted)
            }
        }
        serde_json::from_str::<NamesSorted>(out).is_ok_and(|n| n.0)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Every JSON number literal, of any size, is extracted exactly as
        /// written, and a string value comes back as its JSON text.
        #[test]
        fn extract_keeps_any_number_literal_and_string_exactly(
            number in "-?(0|[1-9][0-9]{0,40})(\\.[0-9]{1,30})?([eE][+-]?[0-9]{1,5})?",
            text in "\\PC{0,40}",
        ) {
            let quoted = serde_json::to_string(&text).unwrap();
            let body = format!(r#"{{"a":{{"n":{number}}},"s":{quoted}}}"#);
            let asked = pointers(&["/a/n", "/s"]);
            let found = extract(body.as_bytes(), &asked);
            let back: String = serde_json::from_str(&found[1].1).unwrap();
            prop_assert_eq!(&found[0], &("/a/n".to_owned(), number));
            prop_assert_eq!(back, text);
        }

        /// Two spellings of one document canonicalise to the same bytes,
        /// which are their own canonical form, hold the document's strings,
        /// names and nesting, sort names as UTF-16 code units and escape
        /// only what RFC 8785 asks.
        #[test]
        fn spellings_of_one_document_canonicalise_alike(
            doc in doc(),
            seeds in (1u64.., 1u64..),
        ) {
            let spell = |seed| {
                let mut out = String::new();
                Speller(seed).spell(&doc, &mut out);
                out
            };
            let (a, b) = (spell(seeds.0), spell(seeds.1));
            for numbers in [Numbers::Exact, Numbers::Ecmascript] {
                let (ca, cb) = (
                    canonicalize(a.as_bytes(), &[], numbers),
                    canonicalize(b.as_bytes(), &[], numbers),
                );
                // As doubles, an integer literal above 2^53 is refused where
                // the same number spelt with a point or exponent is not.
                let refused = |c: &Result<Vec<u8>, JcsError>| {
                    matches!(c, Err(JcsError::ImpreciseInteger { .. } | JcsError::NumberOutOfRange { .. }))
                };
                if numbers == Numbers::Ecmascript && (refused(&ca) || refused(&cb)) {
                    continue;
                }
                let out = ca.unwrap();
                prop_assert_eq!(&out, &cb.unwrap(), "{:?} against {:?}", a, b);
                if numbers == Numbers::Exact {
                    // Not so as doubles: `2.5e18` is written `2500000000000000000`,
                    // an integer literal above 2^53, refused when read back.
                    prop_assert_eq!(canonicalize(&out, &[], numbers).unwrap(), out.clone());
                }
                prop_assert!(only_required_escapes(&out), "{:?}", String::from_utf8_lossy(&out));
                let text = String::from_utf8(out).unwrap();
                let value: serde_json::Value = serde_json::from_str(&text).unwrap();
                prop_assert!(same_shape(&doc, &value), "{:?} from {:?}", text, doc);
                prop_assert!(members_sorted(&text), "{:?}", text);
            }
        }
    }
}

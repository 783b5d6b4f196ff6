//! The canonicaliser as it was before numbers and strings were written by
//! crates, kept while the two are compared.

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
        let Some(rest) = s.strip_prefix('/') else {
            return Err(invalid("a JSON pointer must start with '/'"));
        };
        let mut segments = Vec::new();
        for raw in rest.split('/') {
            let mut segment = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => segment.push('~'),
                        Some('1') => segment.push('/'),
                        _ => return Err(invalid("'~' must be followed by '0' or '1'")),
                    }
                } else {
                    segment.push(c);
                }
            }
            segments.push(segment);
        }
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
    let digits = format!("{int_part}{frac_part}");
    let significant = digits.trim_start_matches('0');
    let kept = significant.trim_end_matches('0');
    if kept.is_empty() {
        return Some("0".to_owned());
    }
    // Both lengths are below the body size, so the i128 sum cannot overflow.
    let trailing = significant.len() - kept.len();
    let power = i128::from(exponent) - frac_part.len() as i128 + trailing as i128;
    let power = i64::try_from(power).ok()?;
    let sign = if negative { "-" } else { "" };
    Some(match power {
        0 => format!("{sign}{kept}"),
        _ => format!("{sign}{kept}e{power}"),
    })
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
    let bytes = segment.as_bytes();
    let canonical = match bytes {
        [b'0'] => true,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if canonical {
        segment.parse().ok()
    } else {
        None
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

/// Writes `s` as a JSON string per RFC 8785 §3.2.2.2.
fn write_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x0a => out.extend_from_slice(b"\\n"),
            0x0c => out.extend_from_slice(b"\\f"),
            0x0d => out.extend_from_slice(b"\\r"),
            0x00..=0x1f => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// Formats a double as ECMAScript's `Number.prototype.toString` does
/// (RFC 8785 §3.2.2.3); `None` for NaN and the infinities, which JSON cannot
/// represent.
pub(crate) fn format_number(x: f64) -> Option<String> {
    if !x.is_finite() {
        return None;
    }
    if x == 0.0 {
        // Both zeros.
        return Some("0".to_owned());
    }
    let mut out = String::new();
    if x < 0.0 {
        out.push('-');
    }
    // Rust's `{:e}` gives the shortest digit string that round-trips, as
    // ECMAScript requires, e.g. "1.2345e-7" or "5e-324".
    let sci = format!("{:e}", x.abs());
    let (mantissa, exponent) = sci.split_once('e')?;
    let exponent: i32 = exponent.parse().ok()?;
    let digits: String = mantissa.chars().filter(|&c| c != '.').collect();
    let digits = round_tie_to_even(x.abs(), digits, exponent);
    // ECMAScript's k (number of digits) and n (decimal point position).
    let k = i32::try_from(digits.len()).ok()?;
    let n = exponent + 1;
    let zeros = |count: i32| "0".repeat(usize::try_from(count).unwrap_or(0));
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.push_str(&zeros(n - k));
    } else if 0 < n && n <= 21 {
        let (int_part, frac_part) = digits.split_at(usize::try_from(n).ok()?);
        out.push_str(int_part);
        out.push('.');
        out.push_str(frac_part);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.push_str(&zeros(-n));
        out.push_str(&digits);
    } else {
        let (first, rest) = digits.split_at(1);
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        out.push('e');
        out.push(if n > 0 { '+' } else { '-' });
        out.push_str(&(n - 1).abs().to_string());
    }
    Some(out)
}

/// ECMAScript picks, among the shortest digit strings that round-trip, the
/// one closest to the value and, between two equally close ones, the even
/// one; Rust's shortest formatting breaks that tie upwards. Given Rust's
/// `digits` (significand digits) and decimal `exponent` for the positive
/// finite `x`, returns the digits ECMAScript would choose.
fn round_tie_to_even(x: f64, digits: String, exponent: i32) -> String {
    let k = digits.len();
    // ASCII digits have the parity of their value.
    if digits.as_bytes().last().is_none_or(|d| d % 2 == 0) {
        return digits;
    }
    // A tie needs the exact value of `x` to be a k-digit decimal plus half a
    // unit in the last place: k + 1 significant digits ending in 5. Rounded
    // to k + 2 digits that ends in "50"; check that cheaply first.
    let probe = format!("{:.*e}", k + 1, x);
    if !probe
        .split_once('e')
        .is_some_and(|(m, _)| m.ends_with("50"))
    {
        return digits;
    }
    // Every double has an exact decimal expansion of at most 767 significant
    // digits, which fixed-precision formatting produces exactly.
    let exact = format!("{x:.767e}");
    let Some((mantissa, exact_exponent)) = exact.split_once('e') else {
        return digits;
    };
    if exact_exponent.parse::<i32>().ok() != Some(exponent) {
        return digits;
    }
    let exact_digits: String = mantissa.chars().filter(|&c| c != '.').collect();
    let exact_digits = exact_digits.trim_end_matches('0');
    if exact_digits.len() != k + 1 || !exact_digits.ends_with('5') {
        return digits;
    }
    let (lower, _) = exact_digits.split_at(k);
    let other = if digits == lower {
        match increment_decimal(lower) {
            Some(upper) => upper,
            None => return digits,
        }
    } else {
        lower.to_owned()
    };
    if other.len() != k || other.as_bytes().last().is_none_or(|d| d % 2 == 1) {
        return digits;
    }
    let (first, rest) = other.split_at(1);
    if format!("{first}.{rest}0e{exponent}").parse::<f64>() == Ok(x) {
        other
    } else {
        digits
    }
}

/// Adds one to a string of ASCII decimal digits; `None` if it would need an
/// extra digit.
fn increment_decimal(digits: &str) -> Option<String> {
    let mut bytes = digits.as_bytes().to_vec();
    for b in bytes.iter_mut().rev() {
        if *b == b'9' {
            *b = b'0';
        } else {
            *b += 1;
            return String::from_utf8(bytes).ok();
        }
    }
    None
}

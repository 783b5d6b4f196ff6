//! A stored header value as the bytes the upstream sent: HTTP allows field
//! values that are not UTF-8 (obs-text, 0x80–0xFF), and a replay must carry
//! them unchanged (I3, docs/contract.md).

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

/// The bytes of one stored header value.
///
/// Serialised (and so kept by every store, which writes the headers and the
/// resolution as JSON text) as a plain string when the bytes are UTF-8, and
/// as `{"base64": "…"}` only when they are not. Every record written before
/// values were bytes holds strings only, so it reads back unchanged, and the
/// common UTF-8 value costs no byte more than it did; a reader older than
/// this encoding refuses the object form as damaged rather than guessing.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeaderBytes(Vec<u8>);

impl HeaderBytes {
    /// The value's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The value as text, when it is UTF-8.
    pub fn to_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// The number of bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value as text to show a person: UTF-8 runs as they are, every
    /// byte that is not part of one as `\xNN` (lowercase hex). Nothing is
    /// dropped; a value that is UTF-8 shows exactly as it is.
    pub fn escaped(&self) -> String {
        let mut out = String::with_capacity(self.0.len());
        for chunk in self.0.utf8_chunks() {
            out.push_str(chunk.valid());
            for byte in chunk.invalid() {
                out.push_str(&format!("\\x{byte:02x}"));
            }
        }
        out
    }
}

impl From<Vec<u8>> for HeaderBytes {
    fn from(bytes: Vec<u8>) -> Self {
        HeaderBytes(bytes)
    }
}

impl From<&[u8]> for HeaderBytes {
    fn from(bytes: &[u8]) -> Self {
        HeaderBytes(bytes.to_vec())
    }
}

impl From<String> for HeaderBytes {
    fn from(text: String) -> Self {
        HeaderBytes(text.into_bytes())
    }
}

impl From<&str> for HeaderBytes {
    fn from(text: &str) -> Self {
        HeaderBytes(text.as_bytes().to_vec())
    }
}

impl From<HeaderBytes> for Vec<u8> {
    fn from(value: HeaderBytes) -> Self {
        value.0
    }
}

impl fmt::Debug for HeaderBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.escaped())
    }
}

impl serde::Serialize for HeaderBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        match self.to_str() {
            Some(text) => s.serialize_str(text),
            None => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry(BASE64_FIELD, &BASE64.encode(&self.0))?;
                map.end()
            }
        }
    }
}

impl<'de> serde::Deserialize<'de> for HeaderBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Visitor)
    }
}

/// The one field of the form a value that is not UTF-8 is kept in.
const BASE64_FIELD: &str = "base64";

struct Visitor;

impl<'de> serde::de::Visitor<'de> for Visitor {
    type Value = HeaderBytes;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a header value: a string, or {{\"{BASE64_FIELD}\": \"…\"}} for bytes that are not UTF-8"
        )
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<HeaderBytes, E> {
        Ok(HeaderBytes::from(text))
    }

    fn visit_string<E: serde::de::Error>(self, text: String) -> Result<HeaderBytes, E> {
        Ok(HeaderBytes::from(text))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<HeaderBytes, A::Error> {
        use serde::de::Error as _;
        let mut bytes = None;
        while let Some(field) = map.next_key::<String>()? {
            if field != BASE64_FIELD || bytes.is_some() {
                return Err(A::Error::custom(format!(
                    "header value: unexpected field {field:?}; expected one \"{BASE64_FIELD}\""
                )));
            }
            let encoded = map.next_value::<String>()?;
            let decoded = BASE64.decode(encoded.as_bytes()).map_err(|e| {
                A::Error::custom(format!(
                    "header value: \"{BASE64_FIELD}\" is not base64: {e}"
                ))
            })?;
            bytes = Some(decoded);
        }
        match bytes {
            Some(bytes) => Ok(HeaderBytes(bytes)),
            None => Err(A::Error::missing_field(BASE64_FIELD)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn utf8_values_keep_the_string_form_records_were_written_in() {
        let headers = vec![("x-note".to_owned(), HeaderBytes::from("naïve \"q\" \\"))];
        let json = serde_json::to_string(&headers).unwrap();
        assert_eq!(json, r#"[["x-note","naïve \"q\" \\"]]"#);
    }

    #[test]
    fn headers_written_as_text_read_as_their_utf8_bytes() {
        let old = r#"[["content-type","application/json"],["x-note","naïve \"q\" \\"]]"#;
        let headers: Vec<(String, HeaderBytes)> = serde_json::from_str(old).unwrap();
        let bytes: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
            .collect();
        assert_eq!(
            bytes,
            [
                ("content-type", b"application/json".as_slice()),
                ("x-note", "naïve \"q\" \\".as_bytes()),
            ]
        );
    }

    #[test]
    fn other_bytes_take_the_base64_form() {
        let value = HeaderBytes::from(b"caf\xe9".as_slice());
        assert_eq!(
            serde_json::to_string(&value).unwrap(),
            r#"{"base64":"Y2Fm6Q=="}"#
        );
        assert_eq!(value.escaped(), "caf\\xe9");
    }

    #[test]
    fn malformed_forms_are_refused() {
        for json in [
            r#"{"base64":"!!"}"#,
            r#"{"hex":"00"}"#,
            r#"{}"#,
            r#"{"base64":"AA==","base64":"AA=="}"#,
            "12",
        ] {
            assert!(serde_json::from_str::<HeaderBytes>(json).is_err(), "{json}");
        }
    }

    proptest! {
        #[test]
        fn any_bytes_survive_json(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let value = HeaderBytes::from(bytes.clone());
            let json = serde_json::to_string(&value).unwrap();
            let back: HeaderBytes = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(back.as_bytes(), &bytes[..]);
            prop_assert_eq!(json.starts_with('"'), std::str::from_utf8(&bytes).is_ok());
        }
    }
}

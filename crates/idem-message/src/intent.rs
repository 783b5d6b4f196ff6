//! How the intent of a message is read from it: the scope it belongs to,
//! the key its template renders, and the fingerprint of its payload in the
//! HTTP layer's version 2 canonical form ([`Fingerprint::of_request`]), so
//! that exclusions and exact numbers mean the same on both edges.

use idem_core::{Fingerprint, FingerprintError, JsonPointer, RecordId, RequestParts, Scope};

use crate::message::Message;
use crate::run::{Intent, RejectReason};
use crate::template::KeyTemplate;

/// The method written into a message's canonical form. Its scope already
/// keeps a consumer's records apart from any HTTP route's; this keeps the
/// canonical forms apart too.
const METHOD: &str = "MESSAGE";

/// How a payload is read into its fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadFormat {
    /// JSON: canonical form (RFC 8785 ordering, numbers compared exactly),
    /// declared locations excluded. A payload that is not JSON cannot be
    /// fingerprinted and is rejected.
    Json,
    /// Any bytes: two payloads match only if they are byte for byte equal.
    Bytes,
}

/// How a subscription fingerprints its messages: the payload's format,
/// the JSON locations left out (a producer's timestamp or nonce), and the
/// headers that take part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadFingerprint {
    format: PayloadFormat,
    exclude: Vec<JsonPointer>,
    headers: Vec<String>,
}

/// How a subscription reads the intent of a message: the scope its
/// records live in, the template of its key, and its fingerprint.
#[derive(Clone, Debug)]
pub struct IntentSpec {
    scope: Scope,
    key: KeyTemplate,
    fingerprint: PayloadFingerprint,
}

impl PayloadFingerprint {
    /// JSON payloads, with the locations `exclude` addresses left out (the
    /// same pointers as an HTTP route's `fingerprint_exclude`).
    pub fn json(exclude: Vec<JsonPointer>) -> PayloadFingerprint {
        PayloadFingerprint {
            format: PayloadFormat::Json,
            exclude,
            headers: Vec::new(),
        }
    }

    /// Payloads compared byte for byte.
    pub fn bytes() -> PayloadFingerprint {
        PayloadFingerprint {
            format: PayloadFormat::Bytes,
            exclude: Vec::new(),
            headers: Vec::new(),
        }
    }

    /// The headers, by name (ASCII case-insensitive), that take part too.
    pub fn with_headers(mut self, names: Vec<String>) -> PayloadFingerprint {
        self.headers = names;
        self
    }

    /// The payload's format.
    pub fn format(&self) -> PayloadFormat {
        self.format
    }

    /// The fingerprint of `message`: fails only when a JSON payload is not
    /// JSON (the error says where).
    pub fn of(&self, message: &Message<'_>) -> Result<Fingerprint, FingerprintError> {
        let content_types: &[&[u8]] = match self.format {
            PayloadFormat::Json => &[b"application/json"],
            PayloadFormat::Bytes => &[],
        };
        let headers: Vec<(&str, &[u8])> = message
            .headers
            .iter()
            .filter(|(name, _)| self.headers.iter().any(|h| h.eq_ignore_ascii_case(name)))
            .map(|(name, value)| (*name, value.as_bytes()))
            .collect();
        Fingerprint::of_request(&RequestParts {
            method: METHOD,
            route: "",
            path: "",
            query: "",
            content_types,
            headers: &headers,
            body: message.payload,
            exclude: &self.exclude,
        })
    }
}

impl IntentSpec {
    /// Messages in `scope`, keyed by `key`, fingerprinted by `fingerprint`.
    pub fn new(scope: Scope, key: KeyTemplate, fingerprint: PayloadFingerprint) -> IntentSpec {
        IntentSpec {
            scope,
            key,
            fingerprint,
        }
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The key template.
    pub fn key(&self) -> &KeyTemplate {
        &self.key
    }

    /// The intent of `message`, or why it has none: then it must be
    /// rejected, never run.
    pub fn intent(&self, message: &Message<'_>) -> Result<Intent, RejectReason> {
        let key = self.key.render(message).map_err(RejectReason::NoKey)?;
        let fingerprint = self
            .fingerprint
            .of(message)
            .map_err(RejectReason::BadPayload)?;
        Ok(Intent {
            id: RecordId {
                scope: self.scope.clone(),
                key,
            },
            fingerprint,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::Sink;

    fn fp(spec: &PayloadFingerprint, payload: &str, headers: &[(&str, &str)]) -> Fingerprint {
        let message = Message {
            payload: payload.as_bytes(),
            headers,
            message_id: None,
        };
        spec.of(&message).unwrap()
    }

    /// `(a, b, same)`: whether two payloads share a fingerprint.
    fn check(spec: &PayloadFingerprint, cases: &[(&str, &str, bool)]) {
        for (a, b, same) in cases {
            assert_eq!(fp(spec, a, &[]) == fp(spec, b, &[]), *same, "{a} vs {b}");
        }
    }

    #[test]
    fn json_payloads_compare_by_meaning_and_exactly() {
        let spec = PayloadFingerprint::json(vec![JsonPointer::parse("/sent_at").unwrap()]);
        check(
            &spec,
            &[
                (r#"{"a":1,"b":"x"}"#, r#"{ "b": "x", "a": 1 }"#, true),
                (r#"{"a":1,"sent_at":1}"#, r#"{"a":1,"sent_at":2}"#, true),
                (r#"{"a":1}"#, r#"{"a":1,"sent_at":"now"}"#, true),
                (r#"{"a":1}"#, r#"{"a":2}"#, false),
                (r#"{"a":1.0}"#, r#"{"a":1}"#, true),
                (r#"{"a":10}"#, r#"{"a":1e1}"#, true),
                (
                    r#"{"a":9007199254740993}"#,
                    r#"{"a":9007199254740992}"#,
                    false,
                ),
                (r#"{"a":"\u0041"}"#, r#"{"a":"A"}"#, true),
                (r#"{"a":[1,2]}"#, r#"{"a":[2,1]}"#, false),
            ],
        );
        let bad = Message {
            payload: b"{\"a\":",
            ..Message::default()
        };
        let e = spec.of(&bad).unwrap_err();
        assert!(e.to_string().contains("at byte 5"), "{e}");
    }

    #[test]
    fn byte_payloads_compare_byte_for_byte() {
        check(
            &PayloadFingerprint::bytes(),
            &[
                (r#"{"a":1,"b":2}"#, r#"{"a":1,"b":2}"#, true),
                (r#"{"a":1,"b":2}"#, r#"{"b":2,"a":1}"#, false),
                ("not json", "not json", true),
            ],
        );
        // The same bytes read as JSON or as bytes are different canonical forms.
        let json = PayloadFingerprint::json(Vec::new());
        assert_ne!(
            fp(&json, "{}", &[]),
            fp(&PayloadFingerprint::bytes(), "{}", &[])
        );
    }

    #[test]
    fn declared_headers_take_part_and_others_do_not() {
        let spec = PayloadFingerprint::json(Vec::new()).with_headers(vec!["X-Currency".into()]);
        let eur = fp(&spec, "{}", &[("x-currency", "EUR"), ("x-trace", "1")]);
        assert_eq!(
            eur,
            fp(&spec, "{}", &[("X-CURRENCY", "EUR"), ("x-trace", "2")])
        );
        assert_ne!(eur, fp(&spec, "{}", &[("x-currency", "USD")]));
        assert_ne!(eur, fp(&spec, "{}", &[]));
    }

    #[test]
    fn a_message_without_a_key_or_a_readable_payload_is_rejected() {
        let spec = IntentSpec::new(
            Scope::from_parts("payouts", "ledger", None).unwrap(),
            KeyTemplate::parse("pay:{header:x-intent}").unwrap(),
            PayloadFingerprint::json(Vec::new()),
        );
        let headers = [("x-intent", "i-1")];
        let cases = [
            (&b"{}"[..], &headers[..], Ok("pay:i-1")),
            (
                b"{}",
                &[],
                Err(
                    "no key can be derived (header \"x-intent\": the message has no such header); nothing was run",
                ),
            ),
            (
                b"<xml/>",
                &headers,
                Err(
                    "the payload cannot be fingerprinted (JSON body cannot be canonicalised: expected a JSON value at byte 0, found '<'); nothing was run",
                ),
            ),
        ];
        for (payload, headers, expect) in cases {
            let message = Message {
                payload,
                headers,
                message_id: Some("m-1"),
            };
            let got = spec.intent(&message);
            if let Err(reason) = &got {
                assert_eq!(reason.sink(), Sink::DeadLetter);
            }
            let got = got
                .map(|i| i.id.key.as_str().to_owned())
                .map_err(|e| e.to_string());
            assert_eq!(got, expect.map(str::to_owned).map_err(str::to_owned));
        }
    }
}

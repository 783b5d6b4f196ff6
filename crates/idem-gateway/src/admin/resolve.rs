//! The body of `POST /records/{scope}/{key}/resolve`, checked field by field
//! so that every refusal names the field and says what it should be.

use idem_core::{HeaderBytes, LimitError, Outcome, Resolution, StoredResult, Token};
use serde_json::{Map, Value};

/// A body's JSON object, with every field named in `known`; `example` is
/// shown when the body is not an object.
pub(super) fn object_of(
    body: &[u8],
    example: &str,
    known: &[&str],
) -> Result<Map<String, Value>, String> {
    let doc: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let Value::Object(fields) = doc else {
        return Err(format!("the body must be a JSON object, e.g. {example}"));
    };
    if let Some(name) = fields.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!(
            "field `{name}` is unknown; expected {}",
            known.join(", ")
        ));
    }
    Ok(fields)
}

/// Field `token`: the record's token, a whole number; `missing` says what
/// it is when it is absent.
pub(super) fn token_field(
    fields: &Map<String, Value>,
    missing: impl FnOnce() -> String,
) -> Result<Token, String> {
    match fields.get("token") {
        Some(Value::Number(n)) => n.as_u64().map(Token).ok_or_else(|| {
            format!("field `token` is {n}; expected the record's token, a whole number")
        }),
        Some(other) => Err(format!(
            "field `token` is {other}; expected the record's token, a whole number"
        )),
        None => Err(format!("field `token` is required: {}", missing())),
    }
}

/// Field `reason`: a string that is not blank; `missing` says what it is
/// when it is absent.
pub(super) fn reason_field(
    fields: &Map<String, Value>,
    missing: impl FnOnce() -> String,
) -> Result<&str, String> {
    match fields.get("reason") {
        Some(Value::String(r)) if !r.trim().is_empty() => Ok(r.as_str()),
        Some(Value::String(_)) => Err("field `reason` must not be empty".into()),
        Some(_) => Err("field `reason` must be a string".into()),
        None => Err(format!("field `reason` is required: {}", missing())),
    }
}

/// The fields a resolve body may have.
const FIELDS: [&str; 6] = ["token", "outcome", "reason", "status", "headers", "body"];
/// The fields that only apply to `"outcome": "completed"`.
const RESULT_FIELDS: [&str; 3] = ["status", "headers", "body"];

/// Parses a resolve body into the attempt it is about and a resolution by
/// `by` (the operator, `operator:NAME`):
/// `{"token":7,"outcome":"completed","status":200,"headers":[["content-type","application/json"]],"body":"…","reason":"…"}`
/// or `{"token":7,"outcome":"not_executed","reason":"…"}`. The token is the
/// record's as the operator saw it (`GET /records/{scope}/{key}`): the
/// verdict is refused if the record has moved on to another attempt since.
/// The error names the field.
pub fn parse_resolution(body: &[u8], by: &str) -> Result<(Token, Resolution), String> {
    let fields = object_of(
        body,
        "{\"outcome\":\"not_executed\",\"reason\":\"…\"}",
        &FIELDS,
    )?;
    let token = token_field(&fields, || {
        "the token of the attempt you resolve, as GET /records/{scope}/{key} shows it".into()
    })?;
    let reason = reason_field(&fields, || "say why you resolve it this way".into())?;
    let outcome = match fields.get("outcome").map(|o| (o, o.as_str())) {
        Some((_, Some("completed"))) => Outcome::Completed {
            result: completed_result(&fields)?,
        },
        Some((_, Some("not_executed"))) => {
            if let Some(name) = RESULT_FIELDS.iter().find(|f| fields.contains_key(**f)) {
                return Err(format!(
                    "field `{name}` applies only to \"outcome\": \"completed\""
                ));
            }
            Outcome::NotExecuted
        }
        Some((other, _)) => {
            return Err(format!(
                "field `outcome` is {other}; expected \"completed\" or \"not_executed\""
            ));
        }
        None => {
            return Err("field `outcome` is required: \"completed\" or \"not_executed\"".into());
        }
    };
    let resolution =
        Resolution::new(outcome, by, reason).map_err(|e| format!("field `reason`: {e}"))?;
    Ok((token, resolution))
}

/// One stored header as an operator gives it: a valid header name
/// (lowercased, as the layer stores them) and a value of visible ASCII,
/// spaces and tabs, so it can be replayed as given.
pub fn result_header(name: &str, value: &str) -> Result<(String, String), String> {
    let name = http::HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{name:?} is not a valid header name"))?;
    let value = value.trim();
    http::HeaderValue::from_str(value)
        .map_err(|_| format!("the value of {name} is not a valid header value"))?;
    Ok((name.as_str().to_owned(), value.to_owned()))
}

/// The result of a `"completed"` body: `status` (default 200), `headers`
/// (a list of `[name, value]`), `body` (text, default empty).
fn completed_result(fields: &Map<String, Value>) -> Result<StoredResult, String> {
    let status = match fields.get("status") {
        None => 200,
        Some(v) => v
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| (100..=599).contains(n))
            .ok_or_else(|| format!("field `status` is {v}; expected an HTTP status 100-599"))?,
    };
    let headers = match fields.get("headers") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| header_pair(i, item))
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(
                "field `headers` must be a list of [name, value] pairs, e.g. [[\"content-type\",\"application/json\"]]"
                    .into(),
            );
        }
    };
    let body = match fields.get("body") {
        None => Vec::new(),
        Some(Value::String(text)) => text.clone().into_bytes(),
        Some(_) => return Err("field `body` must be a string (the response body as text)".into()),
    };
    StoredResult::new(status, headers, body).map_err(|e| {
        let field = match e {
            LimitError::BadStatus { .. } => "status",
            LimitError::BodyTooLarge { .. } => "body",
            _ => "headers",
        };
        format!("field `{field}`: {e}")
    })
}

fn header_pair(i: usize, item: &Value) -> Result<(String, HeaderBytes), String> {
    match item.as_array().map(Vec::as_slice) {
        Some([Value::String(name), Value::String(value)]) => result_header(name, value)
            .map(|(name, value)| (name, value.into()))
            .map_err(|e| format!("field `headers[{i}]`: {e}")),
        _ => Err(format!(
            "field `headers[{i}]` is {item}; expected a [name, value] pair of strings"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reason and, for a completed outcome, the stored status and body.
    type Expect<'a> = Result<(&'a str, Option<(u16, &'a str)>), &'a str>;

    fn check(body: &str, expect: Expect) {
        let got = parse_resolution(body.as_bytes(), "operator:ana");
        match (got, expect) {
            (Ok((token, r)), Ok((reason, result))) => {
                assert_eq!(token, Token(7), "{body}");
                assert_eq!((r.by.as_str(), r.reason.as_str()), ("operator:ana", reason));
                let got = match &r.outcome {
                    Outcome::Completed { result } => Some((
                        result.status(),
                        std::str::from_utf8(result.body()).unwrap_or("").to_owned(),
                    )),
                    Outcome::NotExecuted => None,
                };
                assert_eq!(got, result.map(|(s, b)| (s, b.to_owned())), "{body}");
            }
            (Err(e), Err(part)) => assert!(e.contains(part), "{body}: {e}"),
            (got, want) => panic!("{body}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn accepts_both_outcomes() {
        check(
            r#"{"token":7,"outcome":"completed","status":201,"headers":[["Content-Type","application/json"]],"body":"{\"payout\":1}","reason":"paid per provider"}"#,
            Ok(("paid per provider", Some((201, "{\"payout\":1}")))),
        );
        check(
            r#"{"token":7,"outcome":"completed","reason":"r"}"#,
            Ok(("r", Some((200, "")))),
        );
        check(
            r#"{"token":7,"outcome":"not_executed","reason":"not in the ledger"}"#,
            Ok(("not in the ledger", None)),
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            ("{", "the body is not valid JSON"),
            ("[]", "must be a JSON object"),
            (
                r#"{"outcome":"not_executed","reason":"r"}"#,
                "field `token` is required",
            ),
            (
                r#"{"token":"7","outcome":"not_executed","reason":"r"}"#,
                "field `token` is \"7\"",
            ),
            (
                r#"{"token":-1,"outcome":"not_executed","reason":"r"}"#,
                "field `token` is -1",
            ),
            (
                r#"{"token":1.5,"outcome":"not_executed","reason":"r"}"#,
                "field `token` is 1.5",
            ),
            (
                r#"{"token":7,"outcome":"completed"}"#,
                "field `reason` is required",
            ),
            (
                r#"{"token":7,"outcome":"completed","reason":"  "}"#,
                "field `reason` must not be empty",
            ),
            (
                r#"{"token":7,"outcome":"completed","reason":7}"#,
                "field `reason` must be a string",
            ),
            (r#"{"token":7,"reason":"r"}"#, "field `outcome` is required"),
            (
                r#"{"token":7,"outcome":"done","reason":"r"}"#,
                "field `outcome` is \"done\"",
            ),
            (
                r#"{"token":7,"outcome":"completed","reason":"r","statuss":1}"#,
                "field `statuss` is unknown",
            ),
            (
                r#"{"token":7,"outcome":"completed","reason":"r","status":"200"}"#,
                "field `status` is \"200\"",
            ),
            (
                r#"{"token":7,"outcome":"completed","reason":"r","status":700}"#,
                "field `status` is 700",
            ),
            (
                r#"{"token":7,"outcome":"completed","reason":"r","headers":{"a":"b"}}"#,
                "field `headers` must be a list",
            ),
            (
                r#"{"token":7,"outcome":"completed","reason":"r","headers":[["a"]]}"#,
                "field `headers[0]` is [\"a\"]",
            ),
            (
                r#"{"token":7,"outcome":"completed","reason":"r","headers":[["a b","c"]]}"#,
                "field `headers[0]`: \"a b\" is not a valid header name",
            ),
            (
                r#"{"token":7,"outcome":"completed","reason":"r","body":{}}"#,
                "field `body` must be a string",
            ),
            (
                r#"{"token":7,"outcome":"not_executed","reason":"r","status":200}"#,
                "field `status` applies only to",
            ),
        ];
        for (body, part) in cases {
            check(body, Err(part));
        }
        let long = format!(
            r#"{{"token":7,"outcome":"not_executed","reason":"{}"}}"#,
            "x".repeat(5000)
        );
        check(&long, Err("field `reason`: reason is 5000 bytes"));
        let big = format!(
            r#"{{"token":7,"outcome":"completed","reason":"r","body":"{}"}}"#,
            "x".repeat(idem_core::RESULT_BODY_BYTES_MAX + 1)
        );
        check(&big, Err("field `body`: result body is"));
    }
}

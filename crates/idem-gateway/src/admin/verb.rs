//! The body of `POST /records/{scope}/{key}/expire` and `…/evict`, checked
//! field by field so that every refusal names the field and says what it
//! should be.

use super::resolve::{object_of, reason_field, token_field};
use idem_core::{Token, Verb, VerbRequest};

/// The fields a verb's body may have.
const FIELDS: [&str; 2] = ["token", "reason"];

/// Parses a verb's body, `{"token":7,"reason":"…"}`, into the attempt it is
/// about and the verb by `by` (the operator). The token is the record's as
/// the operator saw it (`GET /records/{scope}/{key}`): the verb is refused
/// if the record has moved on to another attempt since. The error names
/// the field.
pub fn parse_verb(verb: Verb, body: &[u8], by: &str) -> Result<(Token, VerbRequest), String> {
    let fields = object_of(body, "{\"token\":7,\"reason\":\"…\"}", &FIELDS)?;
    let token = token_field(&fields, || {
        format!(
            "the record's token, as GET /records/{{scope}}/{{key}} shows it, so that you {} \
             the record you saw",
            verb.as_str()
        )
    })?;
    let reason = reason_field(&fields, || format!("say why you {} it", verb.as_str()))?;
    let request = VerbRequest::new(verb, by, reason).map_err(|e| format!("field `reason`: {e}"))?;
    Ok((token, request))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: &str, expect: Result<&str, &str>) {
        for verb in [Verb::Expire, Verb::Evict] {
            match (parse_verb(verb, body.as_bytes(), "operator:ana"), expect) {
                (Ok((token, request)), Ok(reason)) => {
                    assert_eq!(token, Token(7), "{body}");
                    assert_eq!(
                        (request.verb, request.by.as_str(), request.reason.as_str()),
                        (verb, "operator:ana", reason),
                        "{body}"
                    );
                }
                (Err(e), Err(part)) => assert!(e.contains(part), "{body}: {e}"),
                (got, want) => panic!("{body}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn accepts_a_token_and_a_reason() {
        check(
            r#"{"token":7,"reason":"customer asked"}"#,
            Ok("customer asked"),
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            ("{", "the body is not valid JSON"),
            ("[]", "must be a JSON object"),
            (r#"{"reason":"r"}"#, "field `token` is required"),
            (r#"{"token":"7","reason":"r"}"#, "field `token` is \"7\""),
            (r#"{"token":-1,"reason":"r"}"#, "field `token` is -1"),
            (r#"{"token":7}"#, "field `reason` is required"),
            (
                r#"{"token":7,"reason":" "}"#,
                "field `reason` must not be empty",
            ),
            (
                r#"{"token":7,"reason":1}"#,
                "field `reason` must be a string",
            ),
            (
                r#"{"token":7,"reason":"r","outcome":"completed"}"#,
                "field `outcome` is unknown",
            ),
        ];
        for (body, part) in cases {
            check(body, Err(part));
        }
        let long = format!(r#"{{"token":7,"reason":"{}"}}"#, "x".repeat(5000));
        check(&long, Err("field `reason`: reason is 5000 bytes"));
    }
}

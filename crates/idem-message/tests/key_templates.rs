//! Properties of key templates over generated payloads: every string of
//! key characters (quotes, backslashes and braces included) and every
//! 64-bit integer renders exactly, under member names with `~`, `/`,
//! spaces and unicode (escaped `~0`/`~1` in the pointer); anything else is
//! refused with the place and what was found; and no text or payload makes
//! the parser or the renderer panic.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use idem_message::{KeyRefusal, KeyTemplate, Message, Source};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// A member name: anything but braces (a placeholder cannot hold them).
fn member() -> impl Strategy<Value = String> {
    "[!-z|~ é✓/~\"\\\\]{0,12}"
}

/// RFC 6901: `~` as `~0`, then `/` as `~1`.
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// The payload holding `value` at the path `names`, and its pointer.
fn nest(names: &[String], value: Value) -> (Value, String) {
    let pointer: String = names.iter().map(|n| format!("/{}", escape(n))).collect();
    let payload = names.iter().rev().fold(value, |inner, name| {
        let mut object = Map::new();
        object.insert(name.clone(), inner);
        Value::Object(object)
    });
    (payload, pointer)
}

fn render(template: &str, payload: &Value) -> Result<String, KeyRefusal> {
    let payload = serde_json::to_vec(payload).unwrap();
    let message = Message {
        payload: &payload,
        ..Message::default()
    };
    let key = KeyTemplate::parse(template).unwrap().render(&message)?;
    Ok(key.as_str().to_owned())
}

/// `{` and `}` doubled, as the template syntax spells literal braces.
fn literal(text: &str) -> String {
    text.replace('{', "{{").replace('}', "}}")
}

proptest! {
    #[test]
    fn key_characters_render_as_they_are(
        names in proptest::collection::vec(member(), 1..4),
        value in "[!-~]{1,60}",
        prefix in "[!-~]{0,20}",
    ) {
        let (payload, pointer) = nest(&names, json!(value));
        let template = format!("{}{{{pointer}}}", literal(&prefix));
        prop_assert_eq!(render(&template, &payload).unwrap(), format!("{prefix}{value}"));
    }

    #[test]
    fn every_64_bit_integer_renders_every_digit(signed: i64, unsigned: u64) {
        for (n, text) in [(json!(signed), signed.to_string()), (json!(unsigned), unsigned.to_string())] {
            let payload = json!({"seller": {"id": n}});
            prop_assert_eq!(render("s:{/seller/id}", &payload).unwrap(), format!("s:{text}"));
        }
    }

    #[test]
    fn integers_beyond_64_bits_are_refused_not_rounded(n in (u64::MAX as u128 + 1)..=u128::MAX) {
        let payload = format!(r#"{{"id": {n}}}"#);
        let message = Message { payload: payload.as_bytes(), ..Message::default() };
        let refused = KeyTemplate::parse("p:{/id}").unwrap().render(&message).unwrap_err();
        let pointer = Source::Pointer("/id".parse().unwrap());
        prop_assert_eq!(refused, KeyRefusal::InexactNumber { source: pointer });
    }

    #[test]
    fn a_character_outside_keys_is_refused_where_it_is(
        name in member(),
        before in "[!-~]{0,10}",
        bad in "[\\x00-\\x20\\x7f-\\u{10ffff}]",
        after in "\\PC{0,10}",
    ) {
        let value = format!("{before}{bad}{after}");
        let (payload, pointer) = nest(std::slice::from_ref(&name), json!(value));
        let refused = render(&format!("k:{{{pointer}}}"), &payload).unwrap_err();
        let expect = KeyRefusal::BadCharacter {
            source: Source::Pointer(pointer.parse().unwrap()),
            offset: before.len(),
            found: bad.chars().next().unwrap(),
        };
        prop_assert_eq!(refused, expect);
    }

    #[test]
    fn values_that_name_no_intent_are_refused(name in member(), pick in 0usize..6) {
        let values = [json!(null), json!(true), json!({"a": 1}), json!([1]), json!(1.5), json!("")];
        let (payload, pointer) = nest(std::slice::from_ref(&name), values[pick].clone());
        let refused = render(&format!("k:{{{pointer}}}"), &payload).unwrap_err();
        let ok = matches!(
            refused,
            KeyRefusal::WrongType { .. } | KeyRefusal::InexactNumber { .. } | KeyRefusal::Empty { .. }
        );
        prop_assert!(ok, "{}", refused);
        prop_assert!(refused.to_string().starts_with(&format!("pointer {pointer}: found")), "{}", refused);
    }

    /// Any text parses or is refused at a place inside it; what parses
    /// renders any payload to a valid key or a refusal.
    #[test]
    fn nothing_panics(text in "\\PC{0,40}", payload in "\\PC{0,40}") {
        match KeyTemplate::parse(&text) {
            Ok(template) => {
                let message = Message { payload: payload.as_bytes(), ..Message::default() };
                let _ = template.render(&message);
            }
            Err(e) => prop_assert!(e.at <= text.len(), "{}", e),
        }
    }
}

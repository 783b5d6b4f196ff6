//! Who may use the admin listener, by name: each operator's own bearer
//! token, and optionally a header a trusted proxy in front sets to the
//! name of the person it authenticated. Every resolution is journaled
//! under the name found here, so two people on call are never one
//! shared actor.

use http::{HeaderMap, HeaderName};

use super::AdminToken;

/// The name of the operator of the single `admin_token_env` token.
pub const ADMIN_OPERATOR: &str = "admin";
/// The most named operators (`[[admin.operator]]`) a gateway accepts.
pub const OPERATORS_MAX: usize = 64;
/// The longest operator name, in bytes (an e-mail address fits).
pub const OPERATOR_NAME_BYTES_MAX: usize = 128;

/// The prefix of every operator's `by` in the resolution journal.
const BY_PREFIX: &str = "operator:";

/// A validated operator name: 1..=[`OPERATOR_NAME_BYTES_MAX`] bytes of
/// letters, digits and `.-_@+`, so it reads the same in a log line, a
/// page and the journal.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OperatorName(String);

impl OperatorName {
    /// The name, or what is wrong with it.
    pub fn new(name: &str) -> Result<OperatorName, String> {
        let len = name.len();
        if len == 0 || len > OPERATOR_NAME_BYTES_MAX {
            return Err(format!(
                "{name:?} is {len} bytes; an operator name is 1-{OPERATOR_NAME_BYTES_MAX}"
            ));
        }
        let allowed = |b: u8| b.is_ascii_alphanumeric() || b".-_@+".contains(&b);
        if !name.bytes().all(allowed) {
            return Err(format!(
                "{name:?} holds a character other than letters, digits and .-_@+"
            ));
        }
        Ok(OperatorName(name.to_owned()))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `by` of a resolution this operator makes: `operator:NAME`.
    pub fn by(&self) -> String {
        format!("{BY_PREFIX}{}", self.0)
    }
}

impl std::fmt::Display for OperatorName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The operators of an admin listener: named tokens, and the header a
/// trusted proxy names the operator in, if configured. Its `Debug` shows
/// no token.
#[derive(Clone, Debug)]
pub struct Operators {
    tokens: Vec<(OperatorName, AdminToken)>,
    header: Option<HeaderName>,
}

impl Operators {
    /// Operators with these tokens and, when `header` is given, anyone a
    /// request names in it (see [`Operators::identify`]). Refused: no way
    /// in at all, more than [`OPERATORS_MAX`] tokens, two operators of
    /// one name or two of one token (a token must say who used it).
    pub fn new(
        tokens: Vec<(OperatorName, AdminToken)>,
        header: Option<HeaderName>,
    ) -> Result<Operators, String> {
        if tokens.is_empty() && header.is_none() {
            return Err("no operator token and no operator header: nobody could sign in".into());
        }
        if tokens.len() > OPERATORS_MAX {
            return Err(format!(
                "{} operators; at most {OPERATORS_MAX}",
                tokens.len()
            ));
        }
        for (i, (name, token)) in tokens.iter().enumerate() {
            for (other, other_token) in &tokens[..i] {
                if other == name {
                    return Err(format!(
                        "the operator name {:?} is given twice",
                        name.as_str()
                    ));
                }
                if other_token.matches(&token.0) {
                    return Err(format!(
                        "operators {:?} and {:?} have the same token; each needs its own",
                        other.as_str(),
                        name.as_str()
                    ));
                }
            }
        }
        Ok(Operators { tokens, header })
    }

    /// The single token of earlier configs, as operator [`ADMIN_OPERATOR`].
    pub fn single(token: AdminToken) -> Operators {
        Operators {
            tokens: vec![(OperatorName(ADMIN_OPERATOR.to_owned()), token)],
            header: None,
        }
    }

    /// The operator whose token `presented` is. Every token is compared,
    /// each in time that depends only on its length, so the time taken
    /// tells nothing about which one is closest.
    pub fn by_token(&self, presented: &[u8]) -> Option<&OperatorName> {
        let mut found = None;
        for (name, token) in &self.tokens {
            if token.matches(presented) {
                found = Some(name);
            }
        }
        found
    }

    /// The operator a trusted proxy names in the configured header: only
    /// when one is configured, the header is there once and its value is
    /// a valid operator name.
    pub fn by_header(&self, headers: &HeaderMap) -> Option<OperatorName> {
        let name = self.header.as_ref()?;
        let mut values = headers.get_all(name).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        OperatorName::new(value.to_str().ok()?).ok()
    }

    /// The header a trusted proxy names the operator in, if configured.
    pub fn header(&self) -> Option<&HeaderName> {
        self.header.as_ref()
    }

    /// The names of the operators with a token, in config order.
    pub fn names(&self) -> impl Iterator<Item = &OperatorName> {
        self.tokens.iter().map(|(name, _)| name)
    }
}

impl From<AdminToken> for Operators {
    fn from(token: AdminToken) -> Operators {
        Operators::single(token)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn token(s: &str) -> AdminToken {
        AdminToken::new(s).unwrap()
    }

    fn name(s: &str) -> OperatorName {
        OperatorName::new(s).unwrap()
    }

    #[test]
    fn each_token_names_its_operator() {
        let ops = Operators::new(
            vec![
                (name("ana"), token("ana-token-0123456789")),
                (name("bo"), token("bo-token-0123456789a")),
            ],
            None,
        )
        .unwrap();
        let cases: [(&[u8], Option<&str>); 4] = [
            (b"ana-token-0123456789", Some("ana")),
            (b"bo-token-0123456789a", Some("bo")),
            (b"bo-token-0123456789", None),
            (b"", None),
        ];
        for (presented, want) in cases {
            let got = ops.by_token(presented).map(OperatorName::as_str);
            assert_eq!(got, want, "{}", String::from_utf8_lossy(presented));
        }
    }

    type Named = Vec<(OperatorName, AdminToken)>;

    #[test]
    fn refused_sets_say_why() {
        let cases: [(Named, bool, &str); 3] = [
            (vec![], false, "nobody could sign in"),
            (
                vec![
                    (name("ana"), token("ana-token-0123456789")),
                    (name("ana"), token("bo-token-0123456789a")),
                ],
                false,
                "given twice",
            ),
            (
                vec![
                    (name("ana"), token("same-token-0123456789")),
                    (name("bo"), token("same-token-0123456789")),
                ],
                false,
                "the same token",
            ),
        ];
        for (tokens, header, said) in cases {
            let header = header.then(|| HeaderName::from_static("x-forwarded-user"));
            let err = Operators::new(tokens, header).unwrap_err();
            assert!(err.contains(said), "{said}: {err}");
        }
    }

    #[test]
    fn a_header_names_an_operator_only_when_configured_and_valid() {
        let header = HeaderName::from_static("x-forwarded-user");
        let with = Operators::new(vec![], Some(header.clone())).unwrap();
        let without = Operators::single(token("admin-token-0123456789"));
        let mut one = HeaderMap::new();
        one.insert(&header, "ana@example.com".parse().unwrap());
        let mut two = one.clone();
        two.append(&header, "bo".parse().unwrap());
        let mut bad = HeaderMap::new();
        bad.insert(&header, "ana smith".parse().unwrap());
        assert_eq!(with.by_header(&one), Some(name("ana@example.com")));
        assert_eq!(with.by_header(&two), None);
        assert_eq!(with.by_header(&bad), None);
        assert_eq!(without.by_header(&one), None);
        assert_eq!(name("ana").by(), "operator:ana");
        assert!(OperatorName::new("").is_err());
        assert!(OperatorName::new(&"a".repeat(OPERATOR_NAME_BYTES_MAX + 1)).is_err());
    }
}

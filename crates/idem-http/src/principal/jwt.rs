//! A principal from a bearer JWT verified here (the `jwt` feature): keys
//! read once at start, signature, issuer, audience and expiry checked on
//! every request, and the named claim digested into the scope.

use std::path::Path;

use http::HeaderMap;
use jsonwebtoken::jwk::{JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation};

use super::{
    JwtSpec, KEYS_FILE_BYTES_MAX, PRINCIPAL_BYTES_MAX, TOKEN_BYTES_MAX, TOKEN_LEEWAY_S, digest,
    err, unauthenticated,
};
use crate::problem::Problem;
use crate::setting::RouteError;

/// A JWT verifier: keys read once at start.
pub(crate) struct JwtVerifier {
    claim: String,
    issuer: String,
    audience: String,
    algorithms: Vec<Algorithm>,
    keys: Vec<VerifyingKey>,
}

struct VerifyingKey {
    kid: Option<String>,
    /// The algorithm the key set pins this key to, if any.
    algorithm: Option<Algorithm>,
    key: DecodingKey,
}

impl JwtVerifier {
    pub(super) fn new(spec: &JwtSpec) -> Result<JwtVerifier, RouteError> {
        let claim = spec.claim.clone().unwrap_or_else(|| "sub".to_owned());
        if claim.is_empty() {
            return Err(err("principal.jwt.claim", "names no claim".into()));
        }
        for (field, value) in [
            ("principal.jwt.issuer", &spec.issuer),
            ("principal.jwt.audience", &spec.audience),
        ] {
            if value.is_empty() {
                return Err(err(field, "must not be empty".into()));
            }
        }
        let algorithms = algorithms(&spec.algorithms)?;
        let keys = read_keys(Path::new(&spec.keys), &algorithms)
            .map_err(|reason| err("principal.jwt.keys", format!("{}: {reason}", spec.keys)))?;
        Ok(JwtVerifier {
            claim,
            issuer: spec.issuer.clone(),
            audience: spec.audience.clone(),
            algorithms,
            keys,
        })
    }

    /// The digests a claim whose text is `text` may have in a scope: as
    /// a string, and, when `text` is an integer, as a number too (the
    /// operator cannot tell which the tokens carry).
    pub(super) fn digests_of(&self, text: &str) -> Vec<String> {
        let mut tags: Vec<&[u8]> = vec![b"s"];
        if text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok() {
            tags.push(b"n");
        }
        tags.into_iter()
            .map(|tag| {
                digest(&[
                    b"jwt",
                    self.issuer.as_bytes(),
                    self.claim.as_bytes(),
                    tag,
                    text.as_bytes(),
                ])
            })
            .collect()
    }

    /// The digest of the verified claim, and the claim's text.
    pub(super) fn principal(&self, headers: &HeaderMap) -> Result<(String, String), Problem> {
        let token = bearer_token(headers)?;
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| unauthenticated(format!("the bearer token is not a JWT ({e})")))?;
        if !self.algorithms.contains(&header.alg) {
            return Err(unauthenticated(format!(
                "the token's algorithm {:?} is not accepted on this route",
                header.alg
            )));
        }
        let key = self.key_for(header.kid.as_deref(), header.alg)?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = TOKEN_LEEWAY_S;
        let claims = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            key,
            &validation,
        )
        .map_err(|e| unauthenticated(format!("the token is refused: {e}")))?
        .claims;
        let value = claims
            .get(&self.claim)
            .ok_or_else(|| unauthenticated(format!("the token has no claim {:?}", self.claim)))?;
        // A string and a number are kept apart, and only integers that are
        // exact are accepted: two different large numbers never collapse
        // into one tenant through a float.
        let (tag, text): (&[u8], String) = match value {
            serde_json::Value::String(s) => (b"s", s.clone()),
            serde_json::Value::Number(n) if n.is_u64() || n.is_i64() => (b"n", n.to_string()),
            _ => {
                return Err(unauthenticated(format!(
                    "the token's claim {:?} is not a string or an integer",
                    self.claim
                )));
            }
        };
        if text.is_empty() || text.len() > PRINCIPAL_BYTES_MAX {
            return Err(unauthenticated(format!(
                "the token's claim {:?} must be 1-{PRINCIPAL_BYTES_MAX} bytes",
                self.claim
            )));
        }
        let digest = digest(&[
            b"jwt",
            self.issuer.as_bytes(),
            self.claim.as_bytes(),
            tag,
            text.as_bytes(),
        ]);
        Ok((digest, text))
    }

    /// The key named by `kid`, or the one key that fits `alg` when the
    /// token names none.
    fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Result<&DecodingKey, Problem> {
        let fits = |k: &&VerifyingKey| {
            k.key.family() == family(alg) && k.algorithm.is_none_or(|a| a == alg)
        };
        let mut candidates = self
            .keys
            .iter()
            .filter(|k| kid.is_none() || k.kid.as_deref() == kid)
            .filter(fits);
        match (candidates.next(), candidates.next(), kid) {
            (Some(k), None, _) | (Some(k), Some(_), Some(_)) => Ok(&k.key),
            (Some(_), Some(_), None) => Err(unauthenticated(
                "the token names no key (kid) and several keys could verify it".into(),
            )),
            (None, _, Some(kid)) => Err(unauthenticated(format!(
                "no key {kid:?} for {alg:?} in the route's key set"
            ))),
            (None, _, None) => Err(unauthenticated(format!(
                "no key for {alg:?} in the route's key set"
            ))),
        }
    }
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("claim", &self.claim)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("algorithms", &self.algorithms)
            .field("keys", &self.keys.len())
            .finish()
    }
}

/// The bearer token of the one `Authorization` header (scheme matched
/// without regard to case, as RFC 9110 says).
fn bearer_token(headers: &HeaderMap) -> Result<&str, Problem> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(unauthenticated(
            "this route needs a bearer token in Authorization".into(),
        ));
    };
    if values.next().is_some() {
        return Err(unauthenticated(
            "Authorization was sent more than once".into(),
        ));
    }
    let text = value
        .to_str()
        .map_err(|_| unauthenticated("Authorization is not visible ASCII".into()))?;
    let token = match text.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim_start(),
        _ => {
            return Err(unauthenticated(
                "Authorization is not a bearer token".into(),
            ));
        }
    };
    if token.is_empty() || token.len() > TOKEN_BYTES_MAX {
        return Err(unauthenticated(format!(
            "the bearer token must be 1-{TOKEN_BYTES_MAX} bytes"
        )));
    }
    Ok(token)
}

fn algorithms(names: &[String]) -> Result<Vec<Algorithm>, RouteError> {
    let field = "principal.jwt.algorithms";
    if names.is_empty() {
        return Err(err(field, "must name at least one algorithm".into()));
    }
    names
        .iter()
        .map(|name| {
            let alg: Algorithm = name.parse().map_err(|_| {
                err(
                    field,
                    format!(
                        "{name:?} is not a signature algorithm (RS256, PS256, ES256, EdDSA, …)"
                    ),
                )
            })?;
            if matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) {
                return Err(err(
                    field,
                    format!(
                        "{name:?} is a shared-secret algorithm: whoever verifies could also mint \
                         tokens for any tenant; use a public-key algorithm"
                    ),
                ));
            }
            Ok(alg)
        })
        .collect()
}

/// The key family an algorithm needs (jsonwebtoken keeps its own private).
fn family(alg: Algorithm) -> AlgorithmFamily {
    match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => AlgorithmFamily::Hmac,
        Algorithm::ES256 | Algorithm::ES384 => AlgorithmFamily::Ec,
        Algorithm::EdDSA => AlgorithmFamily::Ed,
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => AlgorithmFamily::Rsa,
    }
}

/// Reads a JWKS (JSON) or a PEM public key. A PEM key's type comes from the
/// declared algorithms, which must then share one family.
fn read_keys(path: &Path, algorithms: &[Algorithm]) -> Result<Vec<VerifyingKey>, String> {
    let bytes = read_bounded(path)?;
    if bytes.trim_ascii_start().starts_with(b"{") {
        return jwks(&bytes);
    }
    let families: Vec<AlgorithmFamily> = algorithms.iter().map(|a| family(*a)).collect();
    let Some(first) = families.first().copied() else {
        return Err("no algorithm is declared".into());
    };
    if families.iter().any(|f| *f != first) {
        return Err("a PEM file holds one key; declare algorithms of one family".into());
    }
    let key = match first {
        AlgorithmFamily::Rsa => DecodingKey::from_rsa_pem(&bytes),
        AlgorithmFamily::Ec => DecodingKey::from_ec_pem(&bytes),
        AlgorithmFamily::Ed => DecodingKey::from_ed_pem(&bytes),
        AlgorithmFamily::Hmac => {
            return Err("shared secrets are not accepted".into());
        }
    }
    .map_err(|e| format!("not a {first:?} public key in PEM ({e})"))?;
    Ok(vec![VerifyingKey {
        kid: None,
        algorithm: None,
        key,
    }])
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot be read ({e})"))?;
    let mut bytes = Vec::new();
    file.take(KEYS_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read ({e})"))?;
    if bytes.len() as u64 > KEYS_FILE_BYTES_MAX {
        return Err(format!("is over {KEYS_FILE_BYTES_MAX} bytes"));
    }
    Ok(bytes)
}

/// The signing keys of a JWKS; encryption keys are skipped, and a set with
/// no usable key or a shared secret is refused.
fn jwks(bytes: &[u8]) -> Result<Vec<VerifyingKey>, String> {
    let set: JwkSet =
        serde_json::from_slice(bytes).map_err(|e| format!("not a JWKS document ({e})"))?;
    let mut keys = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
            continue;
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key {i}: {e}"))?;
        if key.family() == AlgorithmFamily::Hmac {
            return Err(format!(
                "key {i} is a shared secret; only public keys are accepted"
            ));
        }
        let algorithm = match jwk.common.key_algorithm {
            Some(a) => Some(
                a.to_string()
                    .parse::<Algorithm>()
                    .map_err(|_| format!("key {i}: algorithm {a} cannot sign a JWT"))?,
            ),
            None => None,
        };
        keys.push(VerifyingKey {
            kid: jwk.common.key_id.clone(),
            algorithm,
            key,
        });
    }
    if keys.is_empty() {
        return Err("holds no signing key".into());
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::{Value, json};

    use super::*;
    use crate::principal::tests::{JWKS_CD, PUB_C, headers};
    use crate::principal::{PRINCIPAL_DIGEST_BYTES, Principal, PrincipalSpec};
    use crate::problem::ProblemKind;

    /// The issuer's private keys: kid `c` (whose public half is `PUB_C`) and `d`.
    const KEY_C: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIFT95aEjmXzUPayoJW5PMDXif+QYStS5KM7xrVzXI8Jy\n-----END PRIVATE KEY-----\n";
    const KEY_D: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTOtqcalCVsWkZUJ256UBm5nj0T1lB+ATYrIRYgqPIQ\n-----END PRIVATE KEY-----\n";

    fn now() -> i64 {
        jsonwebtoken::get_current_timestamp() as i64
    }

    fn sign(pem: &str, kid: Option<&str>, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = kid.map(str::to_owned);
        let key = EncodingKey::from_ed_pem(pem.as_bytes()).unwrap();
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }

    fn claims(edit: impl FnOnce(&mut Value)) -> Value {
        let mut c = json!({"iss": "https://auth.example", "aud": "payouts", "sub": "tenant-a",
            "iat": now(), "exp": now() + 600});
        edit(&mut c);
        c
    }

    fn verifier(keys_text: &str, claim: Option<&str>) -> (Principal, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, keys_text).unwrap();
        let spec = PrincipalSpec::Jwt(JwtSpec {
            claim: claim.map(str::to_owned),
            keys: "keys".into(),
            issuer: "https://auth.example".into(),
            audience: "payouts".into(),
            algorithms: vec!["EdDSA".into()],
        });
        (
            Principal::new(Some(&spec.relative_to(dir.path())), None).unwrap(),
            dir,
        )
    }

    fn with_token(scheme: &str, token: &str) -> HeaderMap {
        headers(&[("authorization", format!("{scheme} {token}").as_bytes())])
    }

    #[derive(Debug)]
    enum Want {
        Same,
        Other,
        Refused,
    }

    fn judge(what: &str, got: Result<String, Problem>, base: &str, want: &Want) {
        match (want, got) {
            (Want::Same, Ok(p)) => assert_eq!(p, base, "{what}"),
            (Want::Other, Ok(p)) => assert_ne!(p, base, "{what}"),
            (Want::Refused, Err(problem)) => {
                assert_eq!(problem.kind, ProblemKind::Unauthenticated, "{what}")
            }
            (_, got) => panic!("{what}: want {want:?}, got {got:?}"),
        }
    }

    /// The digests the console computes from a claim's text hold the
    /// one a token with that claim gets, as a string or an integer.
    #[test]
    fn a_claim_text_digests_as_its_tokens_do() {
        let (principal, _dir) = verifier(JWKS_CD, None);
        let Principal::Jwt(v) = &principal else {
            panic!("a JWT principal");
        };
        let cases = [
            (json!("tenant-a"), "tenant-a", 1),
            (json!("42"), "42", 2),
            (json!(42), "42", 2),
        ];
        for (sub, text, count) in cases {
            let token = sign(KEY_C, Some("c"), &claims(|c| c["sub"] = sub.clone()));
            let request = principal.of(&with_token("Bearer", &token)).unwrap();
            let digests = v.digests_of(text);
            assert_eq!(digests.len(), count, "{sub}");
            assert!(digests.contains(&request), "{sub}");
        }
        assert!(
            !v.digests_of("tenant-b").contains(
                &principal
                    .of(&with_token(
                        "Bearer",
                        &sign(KEY_C, Some("c"), &claims(|_| {}))
                    ))
                    .unwrap()
            )
        );
    }

    #[test]
    fn a_jwt_principal_is_the_verified_claim_and_nothing_else() {
        let (jwks, _d1) = verifier(JWKS_CD, None);
        let (pem, _d2) = verifier(PUB_C, None);
        let bearer =
            |key: &str, kid: Option<&str>| with_token("Bearer", &sign(key, kid, &claims(|_| {})));
        let base = jwks.of(&bearer(KEY_C, Some("c"))).unwrap();
        assert_eq!(base.len(), PRINCIPAL_DIGEST_BYTES);
        assert!(!base.contains("tenant"));
        // Which key signs, which key set verifies, how the header reads.
        let lower = with_token("bearer", &sign(KEY_C, Some("c"), &claims(|_| {})));
        let cases: Vec<(&str, &Principal, HeaderMap, Want)> = vec![
            ("lower-case scheme", &jwks, lower, Want::Same),
            (
                "other key of the set",
                &jwks,
                bearer(KEY_D, Some("d")),
                Want::Same,
            ),
            ("pem key, no kid", &pem, bearer(KEY_C, None), Want::Same),
            (
                "key d named c",
                &jwks,
                bearer(KEY_D, Some("c")),
                Want::Refused,
            ),
            (
                "unknown kid",
                &jwks,
                bearer(KEY_C, Some("x")),
                Want::Refused,
            ),
            (
                "no kid, two keys",
                &jwks,
                bearer(KEY_C, None),
                Want::Refused,
            ),
            ("pem, other key", &pem, bearer(KEY_D, None), Want::Refused),
            (
                "basic scheme",
                &jwks,
                with_token("Basic", "dGVuYW50LWE6eA=="),
                Want::Refused,
            ),
            ("no token", &jwks, headers(&[]), Want::Refused),
            (
                "scheme only",
                &jwks,
                headers(&[("authorization", b"Bearer")]),
                Want::Refused,
            ),
            (
                "not a jwt",
                &jwks,
                with_token("Bearer", "abc.def"),
                Want::Refused,
            ),
            (
                "tenant header",
                &jwks,
                headers(&[("x-tenant-id", b"tenant-a")]),
                Want::Refused,
            ),
        ];
        for (what, principal, headers, want) in cases {
            judge(what, principal.of(&headers), &base, &want);
        }
        // What the token says: one claim set, null removes the claim.
        let edits: Vec<(&str, &str, Value, Want)> = vec![
            ("refreshed", "exp", json!(now() + 3600), Want::Same),
            ("reissued", "iat", json!(now() + 30), Want::Same),
            ("other tenant", "sub", json!("tenant-b"), Want::Other),
            (
                "numeric sub",
                "sub",
                json!(9_007_199_254_740_993_u64),
                Want::Other,
            ),
            ("expired", "exp", json!(now() - 3600), Want::Refused),
            ("not yet valid", "nbf", json!(now() + 3600), Want::Refused),
            ("no exp", "exp", Value::Null, Want::Refused),
            (
                "wrong issuer",
                "iss",
                json!("https://evil.example"),
                Want::Refused,
            ),
            ("no issuer", "iss", Value::Null, Want::Refused),
            ("wrong audience", "aud", json!("refunds"), Want::Refused),
            ("no sub", "sub", Value::Null, Want::Refused),
            (
                "object sub",
                "sub",
                json!({"id": "tenant-a"}),
                Want::Refused,
            ),
            ("array sub", "sub", json!(["tenant-a"]), Want::Refused),
            ("float sub", "sub", json!(1e20), Want::Refused),
            ("bool sub", "sub", json!(true), Want::Refused),
            ("empty sub", "sub", json!(""), Want::Refused),
            ("long sub", "sub", json!("t".repeat(256)), Want::Refused),
        ];
        for (what, field, value, want) in edits {
            let edited = claims(|c| match value {
                Value::Null => drop(c.as_object_mut().unwrap().remove(field)),
                value => c[field] = value,
            });
            let token = with_token("Bearer", &sign(KEY_C, Some("c"), &edited));
            judge(what, jwks.of(&token), &base, &want);
        }
        // Two integers a float would merge stay two tenants; a string and a
        // number with the same digits are kept apart.
        let of_sub = |sub: Value| {
            let token = sign(KEY_C, Some("c"), &claims(|c| c["sub"] = sub));
            jwks.of(&with_token("Bearer", &token)).unwrap()
        };
        assert_ne!(
            of_sub(json!(9_007_199_254_740_993_u64)),
            of_sub(json!(9_007_199_254_740_992_u64))
        );
        assert_ne!(of_sub(json!(42)), of_sub(json!("42")));
    }

    #[test]
    fn an_unsigned_or_symmetric_token_is_refused() {
        let (jwks, _dir) = verifier(JWKS_CD, None);
        let valid = sign(KEY_C, Some("c"), &claims(|_| {}));
        let payload = valid.split('.').nth(1).unwrap();
        let none = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{payload}.");
        let hs = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims(|_| {}),
            &EncodingKey::from_secret(PUB_C.as_bytes()),
        )
        .unwrap();
        for token in [none, hs] {
            let problem = jwks.of(&with_token("Bearer", &token)).unwrap_err();
            assert_eq!(problem.kind, ProblemKind::Unauthenticated, "{token}");
        }
    }
}

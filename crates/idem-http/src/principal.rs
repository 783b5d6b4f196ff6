//! Who a request acts for: the principal in its scope. A route names where
//! it comes from — a header the auth layer in front sets, a claim of a JWT
//! verified here, or (fragile) a digest of the raw credential headers —
//! and a request whose principal cannot be established is refused before
//! anything is claimed. A route that names none is scoped by a digest of
//! every credential the request carries ([`DEFAULT_CREDENTIAL_HEADERS`],
//! a [`ClientCertificate`]), so that two callers authenticated differently
//! never share answers; the layer says so loudly at start.

use std::path::Path;
use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use idem_core::to_hex;
use jsonwebtoken::jwk::{JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::problem::{Problem, ProblemKind};
use crate::setting::RouteError;

/// The principal used when none of the credential headers is present.
pub const ANONYMOUS: &str = "anonymous";

/// The headers whose raw values scope a route that declares no principal:
/// every way a request commonly carries a credential to the origin —
/// HTTP authentication, a session cookie, an API key, and a client
/// certificate passed on by a TLS terminator in front (Envoy and Istio,
/// nginx, AWS ALB, Azure). Two callers who send different values of any of
/// them are two scopes; callers who send none share the `anonymous` one.
/// (`Proxy-Authorization` is not among them: it is hop-by-hop, for the
/// proxy it is sent to, and never reaches an origin's authentication.)
pub const DEFAULT_CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "cookie",
    "x-api-key",
    "x-forwarded-client-cert",
    "x-ssl-client-cert",
    "x-client-cert",
    "x-amzn-mtls-clientcert",
    "x-arr-clientcert",
];

/// The TLS client certificate a request came with (its leaf, DER), as a
/// request extension: a service that terminates TLS with client
/// authentication inserts it, and a route that declares no principal
/// counts it among the request's credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCertificate(pub bytes::Bytes);
/// The longest principal value accepted (a trusted header's value or a
/// token's claim), in bytes.
pub const PRINCIPAL_BYTES_MAX: usize = 255;
/// The longest bearer token accepted, in bytes.
pub const TOKEN_BYTES_MAX: usize = 16 * 1024;
/// The largest key file read at start, in bytes.
pub const KEYS_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// Clock skew allowed on a token's `exp` and `nbf`, in seconds.
pub const TOKEN_LEEWAY_S: u64 = 60;
/// The length of every principal in a scope, in bytes: 128 bits in hex.
/// (`anonymous` is shorter.)
pub const PRINCIPAL_DIGEST_BYTES: usize = 32;

/// Where a route's principal comes from, as declared:
/// `principal = { header = "x-tenant-id" }`, `principal = { jwt = { … } }`
/// or `principal = { credential_headers = ["authorization"] }`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum PrincipalSpec {
    /// A header the auth layer in front sets (and overwrites when a client
    /// sends it); its value names the tenant.
    Header(String),
    /// A claim of a bearer JWT whose signature, issuer, audience and expiry
    /// are verified here.
    Jwt(JwtSpec),
    /// A digest of these headers' raw values: a refreshed or re-signed
    /// credential is a new principal. Kept for compatibility, knowingly.
    CredentialHeaders(Vec<String>),
}

/// A JWT principal, as declared.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct JwtSpec {
    /// The claim naming the tenant; default `sub`.
    pub claim: Option<String>,
    /// A JWKS (JSON) or PEM public key file, read once by [`crate::Route::new`]
    /// as given; the gateway first resolves it against the config file's
    /// directory ([`PrincipalSpec::relative_to`]).
    pub keys: String,
    /// The only `iss` accepted.
    pub issuer: String,
    /// The `aud` a token must name.
    pub audience: String,
    /// Accepted signature algorithms, e.g. `["RS256"]`, `["EdDSA"]`.
    pub algorithms: Vec<String>,
}

/// How a route establishes its principal, for reports and start-up warnings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrincipalKind {
    /// A header set by the auth layer in front.
    TrustedHeader,
    /// A claim of a verified JWT.
    VerifiedClaim,
    /// A digest of raw credential headers, declared with `credential_headers`.
    CredentialDigest,
    /// A digest of every credential the request carries
    /// ([`DEFAULT_CREDENTIAL_HEADERS`], a [`ClientCertificate`]) because
    /// the route declares no principal: the fragile default.
    DefaultCredentialDigest,
}

/// A validated principal source.
#[derive(Clone, Debug)]
pub(crate) enum Principal {
    TrustedHeader(HeaderName),
    Jwt(Arc<JwtVerifier>),
    CredentialDigest {
        headers: Vec<HeaderName>,
        kind: PrincipalKind,
    },
}

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

impl PrincipalSpec {
    /// The same spec with a relative key file resolved against `dir` (the
    /// config file's directory).
    pub fn relative_to(&self, dir: &Path) -> PrincipalSpec {
        match self {
            PrincipalSpec::Jwt(jwt) => PrincipalSpec::Jwt(JwtSpec {
                keys: dir.join(&jwt.keys).to_string_lossy().into_owned(),
                ..jwt.clone()
            }),
            other => other.clone(),
        }
    }
}

impl Principal {
    /// Validates the declaration: `principal`, or the older
    /// `principal_headers`, or neither (the fragile default).
    pub(crate) fn new(
        spec: Option<&PrincipalSpec>,
        legacy_headers: Option<&[String]>,
    ) -> Result<Principal, RouteError> {
        match (spec, legacy_headers) {
            (Some(_), Some(_)) => Err(err(
                "principal_headers",
                "is the older spelling of principal = { credential_headers = [...] }; \
                 declare principal only"
                    .into(),
            )),
            (None, Some(names)) => {
                credential_digest("principal_headers", names, PrincipalKind::CredentialDigest)
            }
            (None, None) => credential_digest(
                "principal",
                &DEFAULT_CREDENTIAL_HEADERS
                    .iter()
                    .map(|h| (*h).to_owned())
                    .collect::<Vec<_>>(),
                PrincipalKind::DefaultCredentialDigest,
            ),
            (Some(PrincipalSpec::CredentialHeaders(names)), None) => credential_digest(
                "principal.credential_headers",
                names,
                PrincipalKind::CredentialDigest,
            ),
            (Some(PrincipalSpec::Header(name)), None) => trusted_header(name),
            (Some(PrincipalSpec::Jwt(jwt)), None) => {
                JwtVerifier::new(jwt).map(|v| Principal::Jwt(Arc::new(v)))
            }
        }
    }

    /// The request headers this principal is read from.
    pub(crate) fn headers(&self) -> &[HeaderName] {
        const AUTHORIZATION: &[HeaderName] = &[http::header::AUTHORIZATION];
        match self {
            Principal::TrustedHeader(name) => std::slice::from_ref(name),
            Principal::Jwt(_) => AUTHORIZATION,
            Principal::CredentialDigest { headers, .. } => headers,
        }
    }

    pub(crate) fn kind(&self) -> PrincipalKind {
        match self {
            Principal::TrustedHeader(_) => PrincipalKind::TrustedHeader,
            Principal::Jwt(_) => PrincipalKind::VerifiedClaim,
            Principal::CredentialDigest { kind, .. } => *kind,
        }
    }

    /// The principal of a request as it appears in the scope: never a raw
    /// value, always a digest (or [`ANONYMOUS`] for a credential digest
    /// with no credential), so it holds no `|`, no control character and
    /// has a fixed length.
    #[cfg(test)]
    pub(crate) fn of(&self, headers: &HeaderMap) -> Result<String, Problem> {
        self.identify(headers, &http::Extensions::new())
            .map(|(digest, _)| digest)
    }

    /// The principal's digest (as [`Principal::of`]) and, for a trusted
    /// header or a verified claim, the value it digests: what a gateway's
    /// principal → region table is keyed by. A credential digest has no
    /// such value: a raw credential names no tenant.
    pub(crate) fn identify(
        &self,
        headers: &HeaderMap,
        extensions: &http::Extensions,
    ) -> Result<(String, Option<String>), Problem> {
        match self {
            Principal::TrustedHeader(name) => {
                let value = trusted_value(headers, name)?;
                let digest = digest(&[b"header", name.as_str().as_bytes(), value.as_bytes()]);
                Ok((digest, Some(value.to_owned())))
            }
            Principal::Jwt(verifier) => verifier
                .principal(headers)
                .map(|(digest, value)| (digest, Some(value))),
            Principal::CredentialDigest {
                headers: names,
                kind,
            } => {
                let certificate = match kind {
                    PrincipalKind::DefaultCredentialDigest => extensions.get::<ClientCertificate>(),
                    _ => None,
                };
                Ok((credential_digest_of(headers, names, certificate), None))
            }
        }
    }
}

impl JwtVerifier {
    fn new(spec: &JwtSpec) -> Result<JwtVerifier, RouteError> {
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

    /// The digest of the verified claim, and the claim's text.
    fn principal(&self, headers: &HeaderMap) -> Result<(String, String), Problem> {
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

fn err(field: &'static str, reason: String) -> RouteError {
    RouteError { field, reason }
}

fn unauthenticated(detail: String) -> Problem {
    Problem::new(ProblemKind::Unauthenticated, detail)
}

fn invalid_principal(detail: String) -> Problem {
    Problem::new(ProblemKind::InvalidPrincipal, detail)
}

/// SHA-256 over length-prefixed parts, first 128 bits in hex.
fn digest(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    to_hex(&hasher.finalize()[..PRINCIPAL_DIGEST_BYTES / 2])
}

fn credential_digest(
    field: &'static str,
    names: &[String],
    kind: PrincipalKind,
) -> Result<Principal, RouteError> {
    if names.is_empty() {
        return Err(err(
            field,
            "names no header; every request would share one principal".into(),
        ));
    }
    let headers = names
        .iter()
        .map(|n| header_name(field, n))
        .collect::<Result<_, _>>()?;
    Ok(Principal::CredentialDigest { headers, kind })
}

fn trusted_header(name: &str) -> Result<Principal, RouteError> {
    let field = "principal.header";
    let header = header_name(field, name)?;
    if header == http::header::AUTHORIZATION || header == http::header::COOKIE {
        return Err(err(
            field,
            format!(
                "{name:?} carries a raw credential, not a stable identity; use principal = {{ jwt = ... }} \
                 or, knowingly, principal = {{ credential_headers = [...] }}"
            ),
        ));
    }
    Ok(Principal::TrustedHeader(header))
}

fn header_name(field: &'static str, name: &str) -> Result<HeaderName, RouteError> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| err(field, format!("{name:?} is not a valid header name")))
}

/// The value of the trusted header: exactly one, 1-255 bytes of visible
/// ASCII (spaces inside allowed) without a comma, since a comma is how an
/// intermediary joins two copies of a header into one.
fn trusted_value<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Result<&'h str, Problem> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Err(invalid_principal(format!(
            "the {name} header that names the tenant is missing"
        )));
    };
    if values.next().is_some() {
        return Err(invalid_principal(format!("{name} was sent more than once")));
    }
    let text = value
        .to_str()
        .ok()
        .filter(|t| t.bytes().all(|b| b.is_ascii_graphic() || b == b' '))
        .ok_or_else(|| invalid_principal(format!("{name} is not visible ASCII")))?;
    if text.is_empty() || text.len() > PRINCIPAL_BYTES_MAX {
        return Err(invalid_principal(format!(
            "{name} must be 1-{PRINCIPAL_BYTES_MAX} bytes"
        )));
    }
    if text.contains(',') {
        return Err(invalid_principal(format!(
            "{name} holds a comma: two values joined into one are refused"
        )));
    }
    Ok(text)
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

/// The fragile digest of raw credential headers (and a client
/// certificate), unchanged from earlier releases for the headers they
/// read, so that existing records keep their scope: a header that is
/// absent adds nothing to the digest.
fn credential_digest_of(
    headers: &HeaderMap,
    names: &[HeaderName],
    certificate: Option<&ClientCertificate>,
) -> String {
    let mut hasher = Sha256::new();
    let mut any = false;
    let parts = names
        .iter()
        .flat_map(|name| {
            headers
                .get_all(name)
                .iter()
                .map(move |v| (name.as_str(), v.as_bytes()))
        })
        .chain(certificate.map(|c| ("tls client certificate", c.0.as_ref())));
    for (name, value) in parts {
        any = true;
        hasher.update(name.as_bytes());
        hasher.update(b"\0");
        hasher.update((value.len() as u64).to_be_bytes());
        hasher.update(value);
    }
    if any {
        to_hex(&hasher.finalize()[..PRINCIPAL_DIGEST_BYTES / 2])
    } else {
        ANONYMOUS.to_owned()
    }
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
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::{Value, json};

    /// The issuer's keys (kid `c` and `d`) and someone else's.
    const KEY_C: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIFT95aEjmXzUPayoJW5PMDXif+QYStS5KM7xrVzXI8Jy\n-----END PRIVATE KEY-----\n";
    const PUB_C: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAY5kNTPbRA5TtCcSXxCo7aZV3T0v8KXQo9W+1RuyVJZ8=\n-----END PUBLIC KEY-----\n";
    const KEY_D: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTOtqcalCVsWkZUJ256UBm5nj0T1lB+ATYrIRYgqPIQ\n-----END PRIVATE KEY-----\n";
    const JWKS_CD: &str = r#"{"keys":[
        {"kty":"OKP","crv":"Ed25519","kid":"c","use":"sig","x":"Y5kNTPbRA5TtCcSXxCo7aZV3T0v8KXQo9W-1RuyVJZ8"},
        {"kty":"OKP","crv":"Ed25519","kid":"d","x":"gpqADlwrdSFnWXrikASClllU1OcySLP-dUMU6XM7W-M"}]}"#;

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

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        map
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

    #[test]
    fn a_trusted_header_is_one_readable_value() {
        let principal =
            Principal::new(Some(&PrincipalSpec::Header("x-tenant-id".into())), None).unwrap();
        let acme = principal.of(&headers(&[("x-tenant-id", b"acme")])).unwrap();
        assert_eq!(acme.len(), PRINCIPAL_DIGEST_BYTES);
        type Pairs<'a> = Vec<(&'a str, &'a [u8])>;
        let cases: Vec<(Pairs, Result<bool, ProblemKind>)> = vec![
            (
                vec![("x-tenant-id", b"acme"), ("authorization", b"Bearer a")],
                Ok(true),
            ),
            (
                vec![("x-tenant-id", b"acme"), ("authorization", b"bearer b")],
                Ok(true),
            ),
            (vec![("x-tenant-id", b"acme corp")], Ok(false)),
            (vec![("x-tenant-id", b"Acme")], Ok(false)),
            (vec![], Err(ProblemKind::InvalidPrincipal)),
            (
                vec![("x-tenant-id", b"")],
                Err(ProblemKind::InvalidPrincipal),
            ),
            (
                vec![("x-tenant-id", b"acme"), ("x-tenant-id", b"acme")],
                Err(ProblemKind::InvalidPrincipal),
            ),
            (
                vec![("x-tenant-id", b"acme,globex")],
                Err(ProblemKind::InvalidPrincipal),
            ),
            (
                vec![("x-tenant-id", b"acme\xff")],
                Err(ProblemKind::InvalidPrincipal),
            ),
            (
                vec![("x-tenant-id", b"a\tb")],
                Err(ProblemKind::InvalidPrincipal),
            ),
            (
                vec![("x-tenant-id", &[b'a'; 256])],
                Err(ProblemKind::InvalidPrincipal),
            ),
        ];
        for (pairs, want) in cases {
            let got = principal
                .of(&headers(&pairs))
                .map(|p| p == acme)
                .map_err(|p| p.kind);
            assert_eq!(got, want, "{pairs:?}");
        }
    }

    /// How a caller can be authenticated, for a route that declares no
    /// principal: a credential header (each of the defaults), a client
    /// certificate the service's own TLS saw, or nothing the layer reads.
    #[derive(Clone, Debug)]
    enum Way {
        Header(&'static str),
        Certificate,
        Nothing,
    }

    fn request_as(way: &Way, who: &[u8]) -> (HeaderMap, http::Extensions) {
        let mut extensions = http::Extensions::new();
        let map = match way {
            Way::Header(name) => headers(&[(name, who)]),
            Way::Certificate => {
                extensions.insert(ClientCertificate(bytes::Bytes::copy_from_slice(who)));
                HeaderMap::new()
            }
            Way::Nothing => HeaderMap::new(),
        };
        (map, extensions)
    }

    fn ways() -> Vec<Way> {
        let mut ways: Vec<Way> = DEFAULT_CREDENTIAL_HEADERS
            .iter()
            .map(|h| Way::Header(h))
            .collect();
        ways.extend([Way::Certificate, Way::Nothing]);
        ways
    }

    proptest::proptest! {
        /// Two callers authenticated the same way with different
        /// credentials are two principals; the same credential is one;
        /// and a caller with no credential is never put in the scope of
        /// one who has one.
        #[test]
        fn by_default_different_credentials_are_different_principals(
            way in proptest::sample::select(ways()),
            alice in "[!-~]{1,40}",
            bob in "[!-~]{1,40}",
        ) {
            let principal = Principal::new(None, None).unwrap();
            let of = |who: &str| {
                let (h, e) = request_as(&way, who.as_bytes());
                principal.identify(&h, &e).unwrap().0
            };
            let (a, b) = (of(&alice), of(&bob));
            proptest::prop_assert_eq!(&a, &of(&alice));
            match way {
                Way::Nothing => proptest::prop_assert_eq!(&a, ANONYMOUS),
                _ => {
                    proptest::prop_assert_eq!(alice == bob, a == b);
                    proptest::prop_assert_ne!(&a, ANONYMOUS);
                }
            }
        }
    }

    /// The digest of an `Authorization`-only request is the one earlier
    /// releases computed, so existing records keep their scope.
    #[test]
    fn the_default_digest_of_authorization_alone_is_unchanged() {
        let principal = Principal::new(None, None).unwrap();
        let only_authorization = Principal::new(
            Some(&PrincipalSpec::CredentialHeaders(vec![
                "authorization".into(),
            ])),
            None,
        )
        .unwrap();
        let h = headers(&[("authorization", b"Bearer t"), ("x-other", b"1")]);
        assert_eq!(
            principal.of(&h).unwrap(),
            only_authorization.of(&h).unwrap()
        );
        // A declared credential digest does not read the certificate.
        let mut e = http::Extensions::new();
        e.insert(ClientCertificate(bytes::Bytes::from_static(b"der")));
        assert_eq!(
            only_authorization.identify(&h, &e).unwrap().0,
            only_authorization.of(&h).unwrap()
        );
        assert_ne!(
            principal.identify(&h, &e).unwrap().0,
            principal.of(&h).unwrap()
        );
    }

    #[test]
    fn a_credential_digest_is_a_digest_never_the_credential() {
        let principal = Principal::new(None, None).unwrap();
        assert_eq!(principal.kind(), PrincipalKind::DefaultCredentialDigest);
        assert_eq!(principal.of(&headers(&[])).unwrap(), ANONYMOUS);
        let one = principal
            .of(&headers(&[("authorization", b"Bearer secret-1")]))
            .unwrap();
        assert!(!one.contains("secret"));
        assert_eq!(one.len(), PRINCIPAL_DIGEST_BYTES);
        let two = principal
            .of(&headers(&[("authorization", b"Bearer secret-2")]))
            .unwrap();
        assert_ne!(one, two);
        // The digest of earlier releases, so existing records keep their scope.
        assert_eq!(one, "65d5074d5ea30c24d7f205afc6a738a3");
    }

    #[test]
    fn declarations_are_validated_by_field() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.to_string_lossy().into_owned()
        };
        let jwt = |keys: String, algorithms: &[&str]| {
            PrincipalSpec::Jwt(JwtSpec {
                claim: None,
                keys,
                issuer: "i".into(),
                audience: "a".into(),
                algorithms: algorithms.iter().map(|a| a.to_string()).collect(),
            })
        };
        let jwks = file("jwks.json", JWKS_CD);
        type Case<'a> = (
            Option<PrincipalSpec>,
            Option<Vec<String>>,
            Result<PrincipalKind, &'a str>,
        );
        let cases: Vec<Case> = vec![
            (None, None, Ok(PrincipalKind::DefaultCredentialDigest)),
            (
                None,
                Some(vec!["x-api-key".into()]),
                Ok(PrincipalKind::CredentialDigest),
            ),
            (
                Some(PrincipalSpec::Header("x-tenant-id".into())),
                None,
                Ok(PrincipalKind::TrustedHeader),
            ),
            (
                Some(jwt(jwks.clone(), &["EdDSA"])),
                None,
                Ok(PrincipalKind::VerifiedClaim),
            ),
            (
                Some(jwt(file("c.pem", PUB_C), &["EdDSA"])),
                None,
                Ok(PrincipalKind::VerifiedClaim),
            ),
            (
                Some(PrincipalSpec::Header("x-tenant-id".into())),
                Some(vec!["a".into()]),
                Err("principal_headers"),
            ),
            (None, Some(vec![]), Err("principal_headers")),
            (
                Some(PrincipalSpec::CredentialHeaders(vec!["bad header".into()])),
                None,
                Err("principal.credential_headers"),
            ),
            (
                Some(PrincipalSpec::Header("cookie".into())),
                None,
                Err("principal.header"),
            ),
            (
                Some(jwt(jwks.clone(), &["none"])),
                None,
                Err("principal.jwt.algorithms"),
            ),
            (
                Some(jwt(jwks.clone(), &["HS512"])),
                None,
                Err("principal.jwt.algorithms"),
            ),
            (
                Some(jwt(file("c2.pem", PUB_C), &["EdDSA", "RS256"])),
                None,
                Err("principal.jwt.keys"),
            ),
            (
                Some(jwt(file("c3.pem", PUB_C), &["RS256"])),
                None,
                Err("principal.jwt.keys"),
            ),
            (
                Some(jwt(
                    file("oct.json", r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#),
                    &["EdDSA"],
                )),
                None,
                Err("principal.jwt.keys"),
            ),
            (
                Some(jwt(
                    file(
                        "enc.json",
                        r#"{"keys":[{"kty":"OKP","crv":"Ed25519","use":"enc","x":"gpqADlwrdSFnWXrikASClllU1OcySLP-dUMU6XM7W-M"}]}"#,
                    ),
                    &["EdDSA"],
                )),
                None,
                Err("principal.jwt.keys"),
            ),
            (
                Some(jwt(
                    file("huge.json", &" ".repeat(KEYS_FILE_BYTES_MAX as usize + 1)),
                    &["EdDSA"],
                )),
                None,
                Err("principal.jwt.keys"),
            ),
            (
                Some(jwt(
                    dir.path().join("absent").to_string_lossy().into_owned(),
                    &["EdDSA"],
                )),
                None,
                Err("principal.jwt.keys"),
            ),
        ];
        for (spec, legacy, want) in cases {
            let got = Principal::new(spec.as_ref(), legacy.as_deref())
                .map(|p| p.kind())
                .map_err(|e| e.field);
            assert_eq!(got, want, "{spec:?} {legacy:?}");
        }
    }
}

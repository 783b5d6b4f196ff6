//! Who a request acts for: the principal in its scope. A route names where
//! it comes from — a header the auth layer in front sets, a claim of a JWT
//! verified here, or (fragile) a digest of the raw credential headers —
//! and a request whose principal cannot be established is refused before
//! anything is claimed. A route that names none is scoped by a digest of
//! every credential the request carries ([`DEFAULT_CREDENTIAL_HEADERS`],
//! a [`ClientCertificate`]), so that two callers authenticated differently
//! never share answers; the layer says so loudly at start. A service that
//! authenticates in its own middleware names the principal itself, from a
//! request extension or a closure over the request ([`PrincipalSource`]).

#[cfg(feature = "jwt")]
mod jwt;

use std::path::Path;
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderMap, HeaderName};
use idem_core::to_hex;
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
    /// Named by the service itself from the request (an extension its
    /// authentication middleware set, or a closure): as trusted as that
    /// middleware.
    Application,
}

/// A principal named by the service from the request, as given to
/// `RouteBuilder::principal_fn`: `None` when the request carries none
/// (refused as a missing trusted header is).
pub(crate) type PrincipalFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// A validated principal source.
#[derive(Clone, Debug)]
pub(crate) enum Principal {
    TrustedHeader(HeaderName),
    #[cfg(feature = "jwt")]
    Jwt(Arc<jwt::JwtVerifier>),
    CredentialDigest {
        headers: Vec<HeaderName>,
        kind: PrincipalKind,
    },
    Application(PrincipalSource),
}

/// Where a service's own principal comes from, with what the refusal of a
/// request without one names.
#[derive(Clone)]
pub(crate) struct PrincipalSource {
    /// What the principal is read from, e.g. `the extension my_app::User`.
    pub(crate) from: Arc<str>,
    pub(crate) read: PrincipalFn,
}

impl std::fmt::Debug for PrincipalSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrincipalSource")
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
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
            (Some(PrincipalSpec::Jwt(jwt)), None) => jwt_principal(jwt),
        }
    }

    /// The request headers this principal is read from.
    pub(crate) fn headers(&self) -> &[HeaderName] {
        #[cfg(feature = "jwt")]
        const AUTHORIZATION: &[HeaderName] = &[http::header::AUTHORIZATION];
        match self {
            Principal::TrustedHeader(name) => std::slice::from_ref(name),
            #[cfg(feature = "jwt")]
            Principal::Jwt(_) => AUTHORIZATION,
            Principal::CredentialDigest { headers, .. } => headers,
            Principal::Application(_) => &[],
        }
    }

    pub(crate) fn kind(&self) -> PrincipalKind {
        match self {
            Principal::TrustedHeader(_) => PrincipalKind::TrustedHeader,
            #[cfg(feature = "jwt")]
            Principal::Jwt(_) => PrincipalKind::VerifiedClaim,
            Principal::CredentialDigest { kind, .. } => *kind,
            Principal::Application(_) => PrincipalKind::Application,
        }
    }

    /// The principal of a request as it appears in the scope: never a raw
    /// value, always a digest (or [`ANONYMOUS`] for a credential digest
    /// with no credential), so it holds no `|`, no control character and
    /// has a fixed length. A client certificate, carried in the request's
    /// extensions, is not seen here.
    pub(crate) fn of(&self, headers: &HeaderMap) -> Result<String, Problem> {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        parts.headers = headers.clone();
        self.identify(&parts).map(|(digest, _)| digest)
    }

    /// The principal's digest (as [`Principal::of`]) and, for a trusted
    /// header, a verified claim or the service's own, the value it
    /// digests: what a gateway's principal → region table is keyed by. A
    /// credential digest has no such value: a raw credential names no tenant.
    pub(crate) fn identify(&self, parts: &Parts) -> Result<(String, Option<String>), Problem> {
        let headers = &parts.headers;
        match self {
            Principal::TrustedHeader(name) => {
                let value = trusted_value(headers, name)?;
                let digest = digest(&[b"header", name.as_str().as_bytes(), value.as_bytes()]);
                Ok((digest, Some(value.to_owned())))
            }
            #[cfg(feature = "jwt")]
            Principal::Jwt(verifier) => verifier
                .principal(headers)
                .map(|(digest, value)| (digest, Some(value))),
            Principal::Application(source) => {
                let value = application_value(source, parts)?;
                let digest = digest(&[b"application", value.as_bytes()]);
                Ok((digest, Some(value)))
            }
            Principal::CredentialDigest {
                headers: names,
                kind,
            } => {
                let certificate = match kind {
                    PrincipalKind::DefaultCredentialDigest => {
                        parts.extensions.get::<ClientCertificate>()
                    }
                    _ => None,
                };
                Ok((credential_digest_of(headers, names, certificate), None))
            }
        }
    }
}

/// Why a route's records cannot be found by the tenant's value.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TenantSearchError {
    /// The route's principal is a digest of raw credentials: the value
    /// would be a secret, which an operator must never type or be shown.
    CredentialDigest,
    /// The value is empty or longer than [`PRINCIPAL_BYTES_MAX`].
    InvalidValue(String),
}

impl std::fmt::Display for TenantSearchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TenantSearchError::CredentialDigest => f.write_str(
                "this route's principal is a digest of raw credentials (a secret): it cannot be \
                 searched by tenant; declare principal = { header = ... } or { jwt = ... }, or \
                 search by the principal digest",
            ),
            TenantSearchError::InvalidValue(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for TenantSearchError {}

impl Principal {
    /// The principal digests the records of the tenant an operator knows as
    /// `value` carry under this principal: the digest of that header value, JWT
    /// claim (as a string, and as a number when it is an integer) or
    /// service-named principal, computed exactly as a request's is. A
    /// route scoped by raw credentials has no such value
    /// ([`TenantSearchError::CredentialDigest`]).
    pub fn tenant_digests(&self, value: &str) -> Result<Vec<String>, TenantSearchError> {
        if value.is_empty() || value.len() > PRINCIPAL_BYTES_MAX {
            return Err(TenantSearchError::InvalidValue(format!(
                "a tenant is 1-{PRINCIPAL_BYTES_MAX} bytes, not {}",
                value.len()
            )));
        }
        match self {
            Principal::TrustedHeader(name) => Ok(vec![digest(&[
                b"header",
                name.as_str().as_bytes(),
                value.as_bytes(),
            ])]),
            #[cfg(feature = "jwt")]
            Principal::Jwt(verifier) => Ok(verifier.digests_of(value)),
            Principal::Application(_) => Ok(vec![digest(&[b"application", value.as_bytes()])]),
            Principal::CredentialDigest { .. } => Err(TenantSearchError::CredentialDigest),
        }
    }
}

#[cfg(feature = "jwt")]
fn jwt_principal(spec: &JwtSpec) -> Result<Principal, RouteError> {
    jwt::JwtVerifier::new(spec).map(|v| Principal::Jwt(Arc::new(v)))
}

/// Without the `jwt` feature a JWT principal is refused where it is
/// declared: passing its requests on unverified would scope them by
/// nothing the layer checked.
#[cfg(not(feature = "jwt"))]
fn jwt_principal(_spec: &JwtSpec) -> Result<Principal, RouteError> {
    Err(err(
        "principal.jwt",
        "this build cannot verify tokens: enable the `jwt` feature of idem-http \
         (the idem binary has it)"
            .into(),
    ))
}

/// The service's own principal of a request: present, and as short as
/// any principal value; its absence is refused as a missing trusted
/// header is, before anything is claimed.
fn application_value(source: &PrincipalSource, parts: &Parts) -> Result<String, Problem> {
    let Some(value) = (source.read)(parts) else {
        return Err(invalid_principal(format!(
            "the request carries no principal ({} names none)",
            source.from
        )));
    };
    if value.is_empty() || value.len() > PRINCIPAL_BYTES_MAX {
        return Err(invalid_principal(format!(
            "the principal from {} must be 1-{PRINCIPAL_BYTES_MAX} bytes",
            source.from
        )));
    }
    Ok(value)
}

fn err(field: &'static str, reason: String) -> RouteError {
    RouteError { field, reason }
}

#[cfg(feature = "jwt")]
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The issuer's keys (kid `c` and `d`), public.
    pub(super) const PUB_C: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAY5kNTPbRA5TtCcSXxCo7aZV3T0v8KXQo9W+1RuyVJZ8=\n-----END PUBLIC KEY-----\n";
    pub(super) const JWKS_CD: &str = r#"{"keys":[
        {"kty":"OKP","crv":"Ed25519","kid":"c","use":"sig","x":"Y5kNTPbRA5TtCcSXxCo7aZV3T0v8KXQo9W-1RuyVJZ8"},
        {"kty":"OKP","crv":"Ed25519","kid":"d","x":"gpqADlwrdSFnWXrikASClllU1OcySLP-dUMU6XM7W-M"}]}"#;

    pub(super) fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        map
    }

    /// The console finds a tenant's records by the digest a request of
    /// that tenant gets; a route scoped by raw credentials refuses.
    #[test]
    fn a_tenant_value_digests_as_its_requests_do() {
        let name = HeaderName::from_static("x-tenant-id");
        let route = crate::Route::builder()
            .name("payouts")
            .principal_header(name.clone())
            .build()
            .unwrap();
        let principal = Principal::TrustedHeader(name);
        for tenant in ["acme", "Acme", "globex-7"] {
            let request = principal
                .of(&headers(&[("x-tenant-id", tenant.as_bytes())]))
                .unwrap();
            assert_eq!(route.tenant_digests(tenant).unwrap(), vec![request]);
        }
        assert!(matches!(
            route.tenant_digests(""),
            Err(TenantSearchError::InvalidValue(_))
        ));
        let secret = crate::Route::builder()
            .name("payouts")
            .principal_credential_headers([http::header::AUTHORIZATION])
            .build()
            .unwrap();
        assert_eq!(
            secret.tenant_digests("Bearer abc"),
            Err(TenantSearchError::CredentialDigest)
        );
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

    fn parts_of(headers: &HeaderMap, extensions: &http::Extensions) -> Parts {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        parts.headers = headers.clone();
        parts.extensions = extensions.clone();
        parts
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
                principal.identify(&parts_of(&h, &e)).unwrap().0
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
            only_authorization.identify(&parts_of(&h, &e)).unwrap().0,
            only_authorization.of(&h).unwrap()
        );
        assert_ne!(
            principal.identify(&parts_of(&h, &e)).unwrap().0,
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
            // Without the `jwt` feature every JWT principal is refused by name.
            let want = match &spec {
                Some(PrincipalSpec::Jwt(_)) if !cfg!(feature = "jwt") => Err("principal.jwt"),
                _ => want,
            };
            let got = Principal::new(spec.as_ref(), legacy.as_deref())
                .map(|p| p.kind())
                .map_err(|e| e.field);
            assert_eq!(got, want, "{spec:?} {legacy:?}");
        }
    }
}

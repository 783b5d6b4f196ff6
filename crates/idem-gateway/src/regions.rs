//! Per-route region modes: a claim is only as safe as the store's
//! consistency scope, so a `home-region` route claims a key only in the
//! key's home region and forwards (or refuses) the others, and a
//! `synchronous` route runs only on a synchronously replicated store
//! (checked by `idem serve` at start). Validated once with the config.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri};
use http_body_util::{BodyExt, Limited};
use idem_http::{
    AttemptOutcome, BeforeClaim, ClaimGate, Gate, HomeSpec, PrincipalKind, Problem, ProblemKind,
    RESPONSE_BYTES_MAX, RegionsSpec, Route,
};

use crate::Proxy;

/// The header a gateway adds to a request it forwards to a peer, naming its
/// own region. A gateway never forwards a request that carries it, and the
/// edge removes it before anything reaches the upstream.
pub const FORWARDED_FROM_HEADER: &str = "idem-forwarded-from";
/// The longest region name, in bytes: the record's own limit.
pub use idem_core::REGION_BYTES_MAX;
/// The most entries a principal → region table may hold.
pub const HOME_TABLE_ENTRIES_MAX: usize = 10_000;
/// The most `[peers]` a gateway may declare.
pub const PEERS_MAX: usize = 64;
/// The longest key-prefix separator, in bytes.
pub const SEPARATOR_BYTES_MAX: usize = 8;
/// Time a peer gets beyond its own upstream's connect and response
/// timeouts: it claims and completes around its forward, so a forward
/// given only the upstream's timeout would give up on every slow answer the
/// peer still delivers, and the client would see 503 for an intent that ran.
pub const PEER_MARGIN_MS: u64 = 5_000;

/// A route's validated region mode.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegionMode {
    /// One store decides every claim; nothing is checked (the default).
    Single,
    /// Only a key's home region claims it.
    HomeRegion(HomeRouting),
    /// The store must be synchronously replicated; `idem serve` checks it.
    Synchronous,
}

/// How a `home-region` route finds a key's home and treats a foreign key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HomeRouting {
    /// Where the home comes from.
    pub home: HomeSource,
    /// What a key homed elsewhere gets.
    pub on_foreign: OnForeign,
    /// Every region a key may be homed in: this one, the peers, the table's.
    pub known: BTreeSet<String>,
}

/// Where a key's home region comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HomeSource {
    /// The key's text before the first `separator` (`eu:7f3a…`).
    KeyPrefix {
        /// The text ending the region name.
        separator: String,
    },
    /// A header a trusted layer in front sets (and overwrites).
    Header(HeaderName),
    /// The principal's value (a trusted header or a verified claim).
    Principal {
        /// Principal value → region.
        table: BTreeMap<String, String>,
        /// The region of a principal the table does not name.
        default: Option<String>,
    },
}

/// What a `home-region` route does with a key homed in another region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnForeign {
    /// Forward the request to the home region's peer and relay its answer.
    Forward,
    /// Answer 421 `wrong-region`, naming the home region (and its peer).
    Problem,
}

/// The gateway's own region and its peers, as validated.
#[derive(Clone, Debug, Default)]
pub struct Regions {
    /// This gateway's region.
    pub region: Option<String>,
    /// Other regions' gateways, by region name.
    pub peers: BTreeMap<String, Uri>,
    /// What an `https://` peer is trusted through.
    pub tls: Option<crate::UpstreamTls>,
}

/// Checks a region name as routing compares it: 1-64 bytes of lower-case
/// ASCII letters, digits and `-`, starting with a letter, so that one region
/// has one spelling. Every such name also passes [`idem_core::check_region`],
/// the looser rule a record's region is stored under.
pub fn check_region(name: &str) -> Result<(), String> {
    let ok = idem_core::check_region(name).is_ok()
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a region name (1-{REGION_BYTES_MAX} bytes of lower-case letters, \
             digits and '-', starting with a letter)"
        ))
    }
}

impl RegionMode {
    /// Validates a route's `regions` setting; errors are `(field under
    /// regions, reason)`.
    pub fn new(
        spec: Option<&RegionsSpec>,
        route: &Route,
        regions: &Regions,
    ) -> Result<RegionMode, (String, String)> {
        let Some(spec) = spec else {
            return Ok(RegionMode::Single);
        };
        let err = |field: &str, reason: String| Err((format!("regions.{field}"), reason));
        let mode = spec.mode.as_deref().unwrap_or("single");
        if mode != "home-region" {
            if spec.home.is_some() || spec.on_foreign.is_some() {
                let which = if spec.home.is_some() {
                    "home"
                } else {
                    "on_foreign"
                };
                return err(
                    which,
                    format!("only applies to mode = \"home-region\", not {mode:?}"),
                );
            }
            return match mode {
                "single" => Ok(RegionMode::Single),
                "synchronous" => Ok(RegionMode::Synchronous),
                other => err(
                    "mode",
                    format!("{other:?} is not a mode; use single, home-region or synchronous"),
                ),
            };
        }
        let Some(region) = &regions.region else {
            return err(
                "mode",
                "\"home-region\" needs this gateway's region: set region = \"...\" at the top \
                 of the file"
                    .into(),
            );
        };
        let on_foreign = match spec.on_foreign.as_deref().unwrap_or("forward") {
            "forward" => OnForeign::Forward,
            "problem" => OnForeign::Problem,
            other => {
                return err(
                    "on_foreign",
                    format!("{other:?} is not an answer; use forward or problem"),
                );
            }
        };
        let Some(home) = &spec.home else {
            return err(
                "home",
                "\"home-region\" needs home = { from = \"key_prefix\" | \"header\" | \
                 \"principal\", ... }"
                    .into(),
            );
        };
        let source = home_source(home, route).map_err(|(f, r)| (format!("regions.home.{f}"), r))?;
        let mut known: BTreeSet<String> = regions.peers.keys().cloned().collect();
        known.insert(region.clone());
        if let HomeSource::Principal { table, default } = &source {
            known.extend(table.values().cloned());
            known.extend(default.iter().cloned());
        }
        if on_foreign == OnForeign::Forward
            && let Some(lost) = known
                .iter()
                .find(|r| *r != region && !regions.peers.contains_key(*r))
        {
            return err(
                "home",
                format!(
                    "names region {lost:?}, which has no [peers] entry to forward to; add \
                     {lost} = \"http://...\" under [peers], or set on_foreign = \"problem\""
                ),
            );
        }
        Ok(RegionMode::HomeRegion(HomeRouting {
            home: source,
            on_foreign,
            known,
        }))
    }
}

/// Where a `home-region` route reads a key's home from, and only the
/// fields that source takes.
fn home_source(home: &HomeSpec, route: &Route) -> Result<HomeSource, (String, String)> {
    let from = home.from.as_deref().unwrap_or("");
    let (source, allowed): (HomeSource, &[&str]) = match from {
        "key_prefix" => (key_prefix(home)?, &["separator"]),
        "header" => (header(home, route)?, &["header"]),
        "principal" => (principal(home, route)?, &["table", "default"]),
        "" => {
            return refuse(
                "from",
                "is required: key_prefix, header or principal".into(),
            );
        }
        other => {
            return refuse(
                "from",
                format!("{other:?} is not a source; use key_prefix, header or principal"),
            );
        }
    };
    let extra = [
        ("separator", home.separator.is_some()),
        ("header", home.header.is_some()),
        ("table", home.table.is_some()),
        ("default", home.default.is_some()),
    ]
    .into_iter()
    .find(|(name, set)| *set && !allowed.contains(name));
    if let Some((field, _)) = extra {
        return refuse(field, format!("does not apply to from = {from:?}"));
    }
    Ok(source)
}

/// `field` refused for `reason`.
fn refuse<T>(field: &str, reason: String) -> Result<T, (String, String)> {
    Err((field.to_owned(), reason))
}

/// `from = "key_prefix"`: the key's text before `separator`.
fn key_prefix(home: &HomeSpec) -> Result<HomeSource, (String, String)> {
    let separator = home.separator.clone().unwrap_or_else(|| ":".to_owned());
    let visible = separator.bytes().all(|b| b.is_ascii_graphic());
    if separator.is_empty() || separator.len() > SEPARATOR_BYTES_MAX || !visible {
        return refuse(
            "separator",
            format!("{separator:?} must be 1-{SEPARATOR_BYTES_MAX} visible ASCII bytes"),
        );
    }
    Ok(HomeSource::KeyPrefix { separator })
}

/// `from = "header"`: a header of its own, not one with another meaning.
fn header(home: &HomeSpec, route: &Route) -> Result<HomeSource, (String, String)> {
    let Some(raw) = &home.header else {
        return refuse("header", "from = \"header\" needs header = \"...\"".into());
    };
    let name = HeaderName::from_bytes(raw.as_bytes())
        .map_err(|_| ("header".to_owned(), format!("{raw:?} is not a header name")))?;
    let taken = route
        .contract_headers()
        .any(|h| *h == name)
        .then_some("a header the route already reads for its key or principal")
        .or(["authorization", "cookie", FORWARDED_FROM_HEADER]
            .contains(&name.as_str())
            .then_some("a header with another meaning"));
    if let Some(why) = taken {
        return refuse("header", format!("{raw:?} is {why}"));
    }
    Ok(HomeSource::Header(name))
}

/// `from = "principal"`: a table of principals' regions, and a default.
fn principal(home: &HomeSpec, route: &Route) -> Result<HomeSource, (String, String)> {
    if !matches!(
        route.principal_kind(),
        PrincipalKind::TrustedHeader | PrincipalKind::VerifiedClaim
    ) {
        return refuse(
            "from",
            "\"principal\" needs the route's principal to be a trusted header or a \
             verified JWT claim: a credential digest names no tenant"
                .into(),
        );
    }
    let table = home.table.clone().unwrap_or_default();
    if table.is_empty() && home.default.is_none() {
        return refuse(
            "table",
            "names no principal and there is no default: every key would be refused".into(),
        );
    }
    if table.len() > HOME_TABLE_ENTRIES_MAX {
        return refuse(
            "table",
            format!("{} entries; at most {HOME_TABLE_ENTRIES_MAX}", table.len()),
        );
    }
    for (principal, region) in &table {
        if principal.is_empty() || principal.len() > idem_http::PRINCIPAL_BYTES_MAX {
            return refuse(
                "table",
                format!(
                    "principal {principal:?} must be 1-{} bytes",
                    idem_http::PRINCIPAL_BYTES_MAX
                ),
            );
        }
        check_region(region).map_err(|r| ("table".to_owned(), r))?;
    }
    if let Some(default) = &home.default {
        check_region(default).map_err(|r| ("default".to_owned(), r))?;
    }
    Ok(HomeSource::Principal {
        table,
        default: home.default.clone(),
    })
}

impl HomeRouting {
    /// The key's home region, or why it has none. Pure: any key text,
    /// headers and principal give a known region or a reason, never a panic.
    pub fn home_of(
        &self,
        key: &str,
        headers: &HeaderMap,
        principal: Option<&str>,
    ) -> Result<String, String> {
        let named = match &self.home {
            HomeSource::KeyPrefix { separator } => {
                let Some((prefix, _)) = key.split_once(separator.as_str()) else {
                    return Err(format!(
                        "the key has no region prefix: write it as REGION{separator}..."
                    ));
                };
                if prefix.is_empty() {
                    return Err(format!(
                        "the key's region prefix is empty (it starts with {separator:?})"
                    ));
                }
                prefix.to_owned()
            }
            HomeSource::Header(name) => {
                let mut values = headers.get_all(name).iter();
                let value = match (values.next(), values.next()) {
                    (Some(v), None) => v,
                    (None, _) => return Err(format!("the {name} header is missing")),
                    (Some(_), Some(_)) => return Err(format!("the {name} header is sent twice")),
                };
                value
                    .to_str()
                    .map_err(|_| format!("the {name} header is not visible ASCII"))?
                    .to_owned()
            }
            HomeSource::Principal { table, default } => {
                let found = principal.and_then(|p| table.get(p)).or(default.as_ref());
                match found {
                    Some(region) => region.clone(),
                    None => {
                        return Err(
                            "the request's principal is in no region's table and the route has \
                             no default region"
                                .into(),
                        );
                    }
                }
            }
        };
        if self.known.contains(&named) {
            return Ok(named);
        }
        let shown: String = named.chars().take(REGION_BYTES_MAX).collect();
        let lower = named.to_ascii_lowercase();
        let hint = if self.known.contains(&lower) {
            format!("; region names are lower-case: did you mean {lower:?}?")
        } else {
            String::new()
        };
        let known: Vec<&str> = self.known.iter().map(String::as_str).collect();
        Err(format!(
            "{shown:?} is not a region this gateway knows ({}){hint}",
            known.join(", ")
        ))
    }
}

/// The region of the gateway that forwarded a request, taken off the
/// request at the edge ([`FORWARDED_FROM_HEADER`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardedFrom(pub String);

/// Takes [`FORWARDED_FROM_HEADER`] off `req`'s headers into an extension,
/// so it never reaches the layer's fingerprint nor the upstream.
pub fn take_forwarded_from(headers: &mut HeaderMap, extensions: &mut http::Extensions) {
    // `remove` takes every copy of the header; the first names the sender.
    let Some(value) = headers.remove(FORWARDED_FROM_HEADER) else {
        return;
    };
    let from = value
        .to_str()
        .ok()
        .unwrap_or("(unreadable)")
        .chars()
        .take(REGION_BYTES_MAX)
        .collect();
    extensions.insert(ForwardedFrom(from));
}

/// The [`ClaimGate`] of a gateway with `home-region` routes.
pub struct RegionGate {
    region: String,
    modes: Vec<RegionMode>,
    peers: BTreeMap<String, (Uri, Proxy)>,
}

impl RegionGate {
    /// A gate for `modes` (one per route, in the layer's order); `None`
    /// when no route is `home-region`.
    pub fn new(
        regions: &Regions,
        modes: &[RegionMode],
        connect_timeout: std::time::Duration,
        response_timeout: std::time::Duration,
    ) -> Option<Arc<RegionGate>> {
        let homed = modes.iter().any(|m| matches!(m, RegionMode::HomeRegion(_)));
        let region = regions.region.clone()?;
        if !homed {
            return None;
        }
        let peers = regions
            .peers
            .iter()
            .map(|(name, uri)| {
                let peer_timeout = connect_timeout
                    + response_timeout
                    + std::time::Duration::from_millis(PEER_MARGIN_MS);
                let proxy = match (&regions.tls, uri.scheme_str()) {
                    (Some(tls), Some("https")) => {
                        Proxy::with_tls(uri.clone(), connect_timeout, peer_timeout, tls)
                    }
                    _ => Proxy::new(uri.clone(), connect_timeout, peer_timeout),
                };
                (name.clone(), (uri.clone(), proxy))
            })
            .collect();
        Some(Arc::new(RegionGate {
            region,
            modes: modes.to_vec(),
            peers,
        }))
    }
}

impl ClaimGate for RegionGate {
    fn before_claim(&self, request: &BeforeClaim<'_>) -> Gate {
        let Some(RegionMode::HomeRegion(routing)) = self.modes.get(request.route) else {
            return Gate::Claim;
        };
        let parts = request.parts;
        let home = match routing.home_of(request.key.as_str(), &parts.headers, request.principal) {
            Ok(home) if home == self.region => return Gate::Claim,
            Ok(home) => home,
            Err(why) => {
                let detail = format!("{why}; nothing was claimed or forwarded");
                return answer(Problem::new(ProblemKind::UnknownHomeRegion, detail));
            }
        };
        let peer = self.peers.get(&home);
        let wrong_region = |why: String| {
            let mut problem = Problem::new(ProblemKind::WrongRegion, why)
                .member("home_region", home.clone())
                .member("region", self.region.clone());
            if let Some((uri, _)) = peer {
                problem = problem.member("home_gateway", uri.to_string());
            }
            answer(problem)
        };
        if let Some(ForwardedFrom(from)) = parts.extensions.get::<ForwardedFrom>() {
            return wrong_region(format!(
                "the key's home is {home:?}, not {:?}, and the request was already forwarded \
                 (from {from:?}): it is not forwarded again; the regions' routing disagrees; \
                 nothing was claimed here",
                self.region
            ));
        }
        if routing.on_foreign == OnForeign::Problem {
            return wrong_region(format!(
                "the key's home is {home:?}, not {:?}; send it to {home:?}'s gateway; nothing \
                 was claimed here",
                self.region
            ));
        }
        let Some((uri, proxy)) = peer.cloned() else {
            // Refused at load: a forwarding route names only regions with peers.
            return wrong_region(format!("no peer is configured for {home:?}"));
        };
        // Built field by field, which cannot fail: a builder's error would
        // need a fallback, and any fallback request is a wrong one.
        let mut forwarded = Request::new(axum::body::Body::from(request.body.clone()));
        *forwarded.method_mut() = parts.method.clone();
        *forwarded.uri_mut() = parts.uri.clone();
        *forwarded.version_mut() = parts.version;
        *forwarded.headers_mut() = parts.headers.clone();
        if let Ok(value) = HeaderValue::from_str(&self.region) {
            forwarded.headers_mut().insert(FORWARDED_FROM_HEADER, value);
        }
        let region = self.region.clone();
        Gate::Answer(Box::pin(async move {
            let response = proxy.forward(forwarded).await;
            if let Some(outcome) = response.extensions().get::<AttemptOutcome>() {
                let maybe = match outcome {
                    AttemptOutcome::NotSent => "the request never reached it",
                    _ => "it may have claimed and run the request: retry with the same key",
                };
                let detail = format!(
                    "the key's home region {home:?} (gateway {uri}) did not answer: {maybe}; \
                     nothing was claimed in {region:?}"
                );
                let problem = Problem::new(ProblemKind::PeerUnavailable, detail)
                    .member("home_region", home)
                    .member("home_gateway", uri.to_string())
                    .retry_after(1);
                return problem_response(problem);
            }
            let (parts, body) = response.into_parts();
            match Limited::new(body, RESPONSE_BYTES_MAX).collect().await {
                Ok(bytes) => Response::from_parts(parts, bytes.to_bytes()),
                Err(e) => problem_response(
                    Problem::new(
                        ProblemKind::PeerUnavailable,
                        format!(
                            "the answer of {home:?}'s gateway could not be read ({e}): it may \
                             have run the request; retry with the same key"
                        ),
                    )
                    .retry_after(1),
                ),
            }
        }))
    }
}

fn answer(problem: Problem) -> Gate {
    let response = problem_response(problem);
    Gate::Answer(Box::pin(async move { response }))
}

/// A problem response tagged with its kind, as the layer counts them.
fn problem_response(problem: Problem) -> Response<Bytes> {
    let kind = problem.kind;
    let mut response: Response<Bytes> = problem.into_response();
    response.extensions_mut().insert(kind);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GatewayConfig, Overrides};

    fn load(text: &str) -> Result<GatewayConfig, String> {
        let file = toml::from_str(text).map_err(|e: toml::de::Error| e.message().to_owned())?;
        let up = Overrides {
            upstream: Some("http://127.0.0.1:9000".into()),
            ..Default::default()
        };
        GatewayConfig::from_parts(file, Some(Path::new("idem.toml")), &up)
            .map_err(|e| e.to_string())
    }

    use std::path::Path;

    #[test]
    fn region_settings_are_refused_with_file_and_field() {
        let route = |regions: &str| {
            format!("[[route]]\nname = \"p\"\npath = \"/p\"\nregions = {regions}\n")
        };
        let eu = "region = \"eu\"\n[peers]\nus = \"http://127.0.0.1:1\"\n";
        let cases = [
            (
                route("{ mode = \"mirror\" }"),
                "route[0].regions.mode: \"mirror\" is not a mode",
            ),
            (
                route("{ mode = \"home-region\", home = { from = \"key_prefix\" } }"),
                "route[0].regions.mode: \"home-region\" needs this gateway's region",
            ),
            (
                format!(
                    "region = \"eu\"\n{}",
                    route(
                        "{ mode = \"home-region\", home = { from = \"principal\", default = \"us\" } }"
                    )
                ),
                "route[0].regions.home.from: \"principal\" needs the route's principal",
            ),
            (
                format!(
                    "region = \"eu\"\n{}principal = {{ header = \"x-t\" }}\n",
                    route(
                        "{ mode = \"home-region\", home = { from = \"principal\", table = { a = \"ap\" } } }"
                    )
                ),
                "route[0].regions.home: names region \"ap\", which has no [peers] entry",
            ),
            (
                format!(
                    "region = \"eu\"\n{}principal = {{ header = \"x-t\" }}\n",
                    route(
                        "{ mode = \"home-region\", home = { from = \"principal\", table = {} } }"
                    )
                ),
                "route[0].regions.home.table: names no principal",
            ),
            (
                format!(
                    "{eu}{}",
                    route(
                        "{ mode = \"home-region\", home = { from = \"key_prefix\", header = \"x\" } }"
                    )
                ),
                "route[0].regions.home.header: does not apply to from = \"key_prefix\"",
            ),
            (
                format!(
                    "{eu}{}",
                    route(
                        "{ mode = \"home-region\", home = { from = \"header\", header = \"idempotency-key\" } }"
                    )
                ),
                "route[0].regions.home.header: \"idempotency-key\" is a header the route already reads",
            ),
            (
                format!(
                    "{eu}{}",
                    route("{ mode = \"synchronous\", on_foreign = \"problem\" }")
                ),
                "route[0].regions.on_foreign: only applies to mode = \"home-region\"",
            ),
            (
                "region = \"EU\"".into(),
                "idem.toml: region: \"EU\" is not a region name",
            ),
            (
                "region = \"eu\"\n[peers]\nus = \"ftp://us.example\"".into(),
                "idem.toml: peers.us: \"ftp://us.example\" must be an http:// or https:// URL",
            ),
            (
                "region = \"eu\"\n[peers]\neu = \"http://h:1\"".into(),
                "idem.toml: peers.eu: is this gateway's own region",
            ),
            (
                "[peers]\nus = \"http://h:1\"".into(),
                "idem.toml: peers.us: peers need this gateway's region",
            ),
        ];
        for (text, want) in cases {
            let got = load(&text).map(|_| ()).unwrap_err();
            assert!(got.contains(want), "{text}\n{got}");
            assert!(got.starts_with("idem.toml: "), "{got}");
        }
        let ok = format!(
            "{eu}{}",
            route(
                "{ mode = \"home-region\", home = { from = \"key_prefix\" }, on_foreign = \"problem\" }"
            )
        );
        let config = load(&ok).unwrap();
        assert!(matches!(config.route_regions[0], RegionMode::HomeRegion(_)));
    }

    proptest::proptest! {
        /// Any key text and header value: a known region or a reason.
        #[test]
        fn a_home_is_a_known_region_or_a_reason(key in ".{0,40}", header in "[ -~]{0,20}") {
            let known: BTreeSet<String> = ["eu", "us"].map(String::from).into();
            let sources = [
                HomeSource::KeyPrefix { separator: ":".into() },
                HomeSource::Header(HeaderName::from_static("x-home-region")),
            ];
            let mut headers = HeaderMap::new();
            if let Ok(value) = HeaderValue::from_str(&header) {
                headers.insert("x-home-region", value);
            }
            for home in sources {
                let routing = HomeRouting { home, on_foreign: OnForeign::Problem, known: known.clone() };
                match routing.home_of(&key, &headers, None) {
                    Ok(region) => proptest::prop_assert!(known.contains(&region)),
                    Err(why) => proptest::prop_assert!(!why.is_empty()),
                }
            }
        }
    }
}

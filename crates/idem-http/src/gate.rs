//! The one seam before a claim: a gateway that must not claim some keys
//! here (a key homed in another region) looks at the request as the layer
//! has read it — path normalised, body within its limit, key parsed,
//! principal established — and answers instead of the claim. The layer
//! knows nothing of regions; `RegionsSpec` is only carried for the gateway
//! that reads a route's `regions` setting.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http::Response;
use http::request::Parts;
use idem_core::IdempotencyKey;
use serde::Deserialize;

/// A route's `regions = { … }`, as written; validated by the gateway, which
/// alone knows its own region and its peers.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RegionsSpec {
    /// `single` (default), `home-region` or `synchronous`.
    pub mode: Option<String>,
    /// Where a key's home region comes from (`home-region` only).
    pub home: Option<HomeSpec>,
    /// `forward` (default) or `problem`: what a key homed elsewhere gets.
    pub on_foreign: Option<String>,
}

/// `home = { from = "key_prefix", separator = ":" }`,
/// `home = { from = "header", header = "x-home-region" }` or
/// `home = { from = "principal", table = { acme = "eu" }, default = "eu" }`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HomeSpec {
    /// `key_prefix`, `header` or `principal`.
    pub from: Option<String>,
    /// `key_prefix`: the text ending the region name at the key's start.
    pub separator: Option<String>,
    /// `header`: the header a trusted layer sets to the key's home region.
    pub header: Option<String>,
    /// `principal`: principal value → region.
    pub table: Option<BTreeMap<String, String>>,
    /// `principal`: the region of a principal the table does not name.
    pub default: Option<String>,
}

/// One protected request just before its claim.
#[derive(Debug)]
pub struct BeforeClaim<'a> {
    /// The index of the matched route in the layer's routes.
    pub route: usize,
    /// Method, normalised path and query, headers.
    pub parts: &'a Parts,
    /// The parsed key.
    pub key: &'a IdempotencyKey,
    /// The principal's value when the route's principal is a trusted
    /// header or a verified claim; `None` for a credential digest.
    pub principal: Option<&'a str>,
    /// The whole body, within the route's limit.
    pub body: &'a Bytes,
}

/// The answer a gate gives instead of the claim.
pub type GateAnswer = Pin<Box<dyn Future<Output = Response<Bytes>> + Send>>;

/// What a gate decides.
#[non_exhaustive]
pub enum Gate {
    /// Claim here, as without a gate.
    Claim,
    /// Claim nothing here; answer with this (a problem carries its
    /// [`crate::ProblemKind`] as a response extension to be counted).
    Answer(GateAnswer),
}

/// Decides, per protected request, whether the layer claims it here.
pub trait ClaimGate: Send + Sync {
    /// Called once per protected request with a key, before its claim.
    fn before_claim(&self, request: &BeforeClaim<'_>) -> Gate;
}

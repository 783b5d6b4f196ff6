//! The one seam before a claim: a gateway that must not claim some keys
//! here (a key homed in another region) looks at the request as the layer
//! has read it — path normalised, body within its limit, key parsed,
//! principal established — and answers instead of the claim. The layer
//! knows nothing of regions.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http::Response;
use http::request::Parts;
use idem_core::IdempotencyKey;

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

//! The claims the store benchmarks make: fresh keys in one scope, one owner,
//! the default policy, and the small JSON result a payout completes with.

use anyhow::{anyhow, bail};
use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, Policy, RecordId, Scope, Store, StoredResult,
    Token,
};

/// The scope of every key, as the gateway would build it.
pub const SCOPE: &str = "POST /payouts|bench-tenant";
/// The owner every claim names.
pub const OWNER: &str = "bench";

/// The claim of `key` in `scope` with fingerprint `[fingerprint; 32]`, by
/// [`OWNER`], with the default policy.
pub fn request(scope: &Scope, key: &str, fingerprint: u8) -> anyhow::Result<ClaimRequest> {
    Ok(ClaimRequest {
        id: RecordId {
            scope: scope.clone(),
            key: IdempotencyKey::parse(key)?,
        },
        fingerprint: Fingerprint::from_bytes([fingerprint; 32]),
        legacy_fingerprint: None,
        owner: OWNER.to_owned(),
        region: None,
        policy: Policy::default(),
    })
}

/// `201 Created` with a 70-byte JSON body, what a payout completes with.
pub fn payout_result() -> anyhow::Result<StoredResult> {
    let body = br#"{"payout":"po_8f3a9c","amount":12500,"currency":"EUR","status":"paid"}"#;
    Ok(StoredResult::new(
        201,
        vec![("content-type".to_owned(), "application/json".into())],
        body.to_vec(),
    )?)
}

/// Claims the fresh key of `req`: its token, or an error if the store
/// failed or answered anything but `Acquired`.
pub async fn acquire(store: &(impl Store + ?Sized), req: &ClaimRequest) -> anyhow::Result<Token> {
    match store.claim(req).await {
        Ok(Claim::Acquired { token, .. }) => Ok(token),
        Ok(other) => bail!("fresh key {} was not acquired: {other:?}", req.id),
        Err(e) => Err(anyhow!(e).context(format!("claiming {}", req.id))),
    }
}

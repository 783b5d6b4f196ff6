//! How an invalid route setting is reported, by the route and by the
//! parts it is made of (its principal): which field, and why.

use std::fmt;

/// A route setting that is invalid: which field, and why. The field is
/// named as in the config file whichever way the route was built (a
/// builder's `lease` is `lease_ms`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteError {
    /// The field, as named in the config file.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for RouteError {}

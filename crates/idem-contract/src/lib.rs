//! Idempotency contract files: one operation's contract, judged against the
//! twelve design-review questions, with its replay horizon.
//!
//! - [`load`] / [`parse`]: a TOML file into a validated [`Contract`], or a
//!   [`ContractError`] naming file, line, column and field.
//! - [`check`]: pure; twelve [`Finding`]s and the [`Horizon`] in a [`Report`].
//! - [`cross_check`]: a gateway route's settings against its contract.
//!
//! ```
//! let text = "[operation]\nname = \"create-payout\"\n";
//! let contract = idem_contract::parse(text, "payouts.toml".as_ref()).map_err(|e| e.to_string())?;
//! let report = idem_contract::check(&contract);
//! assert!(!report.passed()); // every missing section is UNANSWERED
//! # Ok::<(), String>(())
//! ```

pub mod consumer;
mod error;
mod gateway;
pub mod horizon;
mod questions;
mod report;
pub mod schema;
mod validate;

use std::path::Path;

pub use error::{ContractError, ErrorKind};
pub use gateway::{
    Enforcer, ForwardedReference, GatewayFacts, PrincipalSource, RouteRegionMode, cross_check,
    cross_check_for, lookup_tenancy_finding, lost_tail_finding, principal_finding,
};
pub use horizon::{Horizon, format_duration, replay_horizon};
pub use questions::check;
pub use report::{Finding, Question, Report, Verdict, render_findings};
pub use schema::Contract;

/// Reads and validates the contract file at `path`.
pub fn load(path: &Path) -> Result<Contract, ContractError> {
    let text = std::fs::read_to_string(path).map_err(|e| error::io_error(path, &e))?;
    parse(&text, path)
}

/// Parses and validates contract `text`; `file` names it in errors.
pub fn parse(text: &str, file: &Path) -> Result<Contract, ContractError> {
    let loc = error::Locator::new(file, text);
    let contract: Contract = toml::from_str(text).map_err(|e| loc.toml_error(&e))?;
    validate::validate(&contract, &loc)?;
    Ok(contract)
}

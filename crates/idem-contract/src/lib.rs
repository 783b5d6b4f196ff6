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

/// A contract file judged: its twelve questions and the cross-checks of
/// what enforces it, or why the file could not be read.
pub type Judgement = Result<(Report, Vec<Finding>), ContractError>;

/// True when the file was read and every question and cross-check passed.
pub fn judgement_passed(judged: &Judgement) -> bool {
    match judged {
        Ok((report, cross)) => report.passed() && cross.iter().all(|f| f.verdict.passed()),
        Err(_) => false,
    }
}

/// One line per failure, for logs and refusals.
pub fn judgement_failures(judged: &Judgement) -> Vec<String> {
    match judged {
        Err(e) => vec![e.to_string()],
        Ok((report, cross)) => report
            .findings
            .iter()
            .chain(cross)
            .filter(|f| !f.verdict.passed())
            .map(|f| format!("{} {}: {}", f.verdict.as_str(), f.topic, f.why))
            .collect(),
    }
}

//! PostgreSQL and pool errors turned into the [`StoreError`] a caller can act
//! on: `Unavailable` when retrying later may work (the server is down,
//! restarting, overloaded, or the connection was lost: the gateway answers
//! 503 and fails closed), `Incompatible` when a person must change
//! something (credentials, permissions, a schema this version cannot use).

use std::time::Duration;

use deadpool_postgres::{PoolError, TimeoutType};
use idem_core::StoreError;
use tokio_postgres::error::SqlState;

/// What the role needs on the schema for every operation after `connect`.
const RUNTIME_GRANTS: &str = "the role needs USAGE on the schema, SELECT, INSERT, UPDATE and \
     DELETE on its table records, and USAGE and UPDATE on its sequence tokens";

/// Maps an error of a statement (or of connecting) to a store error.
pub(crate) fn from_pg(store: &str, e: &tokio_postgres::Error) -> StoreError {
    let text = chain(e);
    let Some(db) = e.as_db_error() else {
        return driver(store, e, text);
    };
    let code = db.code();
    let class = code.code().get(..2).unwrap_or("");
    let incompatible = |reason: String| StoreError::Incompatible {
        store: store.to_owned(),
        reason,
    };
    if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        return incompatible(format!("permission denied: {text}; {RUNTIME_GRANTS}"));
    }
    if *code == SqlState::INVALID_CATALOG_NAME {
        return incompatible(format!("{text}; create the database or fix the URL"));
    }
    if class == "28" {
        return incompatible(format!(
            "the server refused the credentials: {text}; fix the user or password in the URL"
        ));
    }
    if class == "42" || class == "3F" {
        return incompatible(format!(
            "the schema is not in the shape this idem expects (was it dropped or altered?): {text}"
        ));
    }
    if *code == SqlState::CHARACTER_NOT_IN_REPERTOIRE {
        return incompatible(format!(
            "PostgreSQL cannot store this text (a NUL character?): {text}"
        ));
    }
    if *code == SqlState::IN_FAILED_SQL_TRANSACTION {
        return unavailable(
            store,
            format!("{text}; the transaction failed earlier and must be rolled back"),
        );
    }
    if class == "57" && *code != SqlState::QUERY_CANCELED {
        return unavailable(
            store,
            format!(
                "the server ended the session ({text}): it is restarting or shutting down, \
                 or an administrator terminated it; retry"
            ),
        );
    }
    // Connection failures (08), cancellation (57014), overload (53),
    // serialization failures and deadlocks (40, run again already where
    // that is safe: `retry`), lock timeouts (55) and anything else: the
    // server may answer a retry.
    unavailable(store, text)
}

/// Whether the server refused a statement because the engine or the role
/// does not offer what it uses: a function revoked from the role (42501)
/// or absent (42883), or a statement the engine does not implement
/// (0A000). Managed and PG-compatible engines do this to the promotion
/// check and to `LISTEN`; a retry would meet the same refusal.
pub(crate) fn not_offered(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|code| {
        [
            SqlState::INSUFFICIENT_PRIVILEGE,
            SqlState::UNDEFINED_FUNCTION,
            SqlState::FEATURE_NOT_SUPPORTED,
        ]
        .contains(code)
    })
}

/// A pool checkout that failed: no free connection in time, or a new one
/// could not be opened.
pub(crate) fn from_pool(store: &str, e: PoolError, waited: Duration) -> StoreError {
    match e {
        PoolError::Backend(e) => from_pg(store, &e),
        PoolError::Timeout(TimeoutType::Wait) => unavailable(
            store,
            format!(
                "no pooled connection became free within {} ms; the pool is exhausted",
                waited.as_millis()
            ),
        ),
        PoolError::Timeout(TimeoutType::Create) => unavailable(
            store,
            format!(
                "cannot connect within {} ms: the server is unreachable or overloaded",
                waited.as_millis()
            ),
        ),
        other => unavailable(store, format!("the connection pool failed: {other}")),
    }
}

/// A permission error while creating or migrating the schema, said as the
/// grant that is missing.
pub(crate) fn ddl(store: &str, e: &tokio_postgres::Error, step: &str, missing: &str) -> StoreError {
    if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        return StoreError::Incompatible {
            store: store.to_owned(),
            reason: format!("permission denied to {step}: {}; {missing}", chain(e)),
        };
    }
    match from_pg(store, e) {
        StoreError::Incompatible { store, reason } => StoreError::Incompatible {
            store,
            reason: format!("cannot {step}: {reason}"),
        },
        other => other,
    }
}

/// The store cannot be used right now, for `reason`.
pub(crate) fn unavailable(store: &str, reason: String) -> StoreError {
    StoreError::Unavailable {
        store: store.to_owned(),
        reason,
    }
}

/// A row or value this version did not write.
pub(crate) fn damaged(store: &str, at: &str, why: &str) -> StoreError {
    StoreError::Incompatible {
        store: store.to_owned(),
        reason: format!("the record at {at} cannot be read: {why}"),
    }
}

/// An error and its causes on one line ([`idem_core::error_chain`]): the
/// driver's own text is only the kind ("db error", "error connecting to
/// server"), and a server's message may span lines (its detail, its hint),
/// joined here with `; ` so that a log line stays one line.
pub(crate) fn chain(e: &tokio_postgres::Error) -> String {
    idem_core::error_chain(e).replace('\n', "; ")
}

/// Errors that are not the server's answer: the connection, the driver.
fn driver(store: &str, e: &tokio_postgres::Error, text: String) -> StoreError {
    if e.is_closed() {
        return unavailable(
            store,
            format!("the connection to the server was lost ({text}); retry"),
        );
    }
    let lower = text.to_ascii_lowercase();
    if lower.contains("invalid configuration") || lower.contains("invalid connection string") {
        return StoreError::Incompatible {
            store: store.to_owned(),
            reason: text,
        };
    }
    if lower.contains("authentication") || lower.contains("password missing") {
        return StoreError::Incompatible {
            store: store.to_owned(),
            reason: format!("{text}; fix the credentials in the URL"),
        };
    }
    unavailable(store, text)
}

//! Whether a claim acknowledged by this server survives the loss of it: a
//! gateway route in `synchronous` mode runs only on a primary that waits for
//! a synchronous standby to flush every commit, checked at start and on
//! every new pooled connection, so that a reconnect after a failover to a
//! server without a standby is refused instead of trusted.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use deadpool_postgres::HookError;

/// What the pool's `post_create` hook returns.
type HookFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HookError>> + Send + 'a>>;

/// The settings a synchronous route's store is judged by, as `SHOW` reads
/// them on one session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicationSettings {
    /// `synchronous_commit` of the session.
    pub synchronous_commit: String,
    /// `synchronous_standby_names` of the server.
    pub synchronous_standby_names: String,
}

/// Why a server cannot back a `synchronous` route.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplicationError {
    /// The settings do not make a commit wait for a standby's flush.
    NotSynchronous {
        /// The settings read.
        settings: ReplicationSettings,
        /// What they allow, and what to change.
        why: String,
    },
    /// The settings could not be read.
    Unreadable {
        /// The store, as messages name it.
        store: String,
        /// The driver's or the pool's error.
        reason: String,
    },
}

/// Judges `settings`: `Ok` only when a commit waits until a synchronous
/// standby has flushed (`on`) or applied (`remote_apply`) it, and a
/// standby is named to wait for.
///
/// Refused: `off` and `local` answer before any standby has the commit;
/// `remote_write` answers once the standby's operating system has it but
/// before it is on disk there, so a standby machine that crashes with the
/// primary loses claims the clients were told about. With
/// `synchronous_standby_names` empty, every level waits for no standby.
pub fn judge(settings: &ReplicationSettings) -> Result<(), ReplicationError> {
    let refuse = |why: String| {
        Err(ReplicationError::NotSynchronous {
            settings: settings.clone(),
            why,
        })
    };
    let commit = settings.synchronous_commit.trim().to_ascii_lowercase();
    match commit.as_str() {
        "on" | "remote_apply" => {}
        "remote_write" => {
            return refuse(
                "remote_write acknowledges a commit before the standby has flushed it: a standby \
                 machine that crashes with the primary loses acknowledged claims; set \
                 synchronous_commit = on (or remote_apply)"
                    .into(),
            );
        }
        "local" | "off" => {
            return refuse(format!(
                "{commit} acknowledges a commit before any standby has it: a failover loses the \
                 claims of the replication lag; set synchronous_commit = on (or remote_apply)"
            ));
        }
        other => {
            return refuse(format!(
                "{other:?} is not a level this check knows; set synchronous_commit = on (or \
                 remote_apply)"
            ));
        }
    }
    if settings.synchronous_standby_names.trim().is_empty() {
        return refuse(
            "synchronous_standby_names is empty, so no commit waits for a standby; name the \
             synchronous standby (e.g. 'FIRST 1 (standby_a)') on the primary"
                .into(),
        );
    }
    Ok(())
}

/// Reads the settings on `client`'s session and judges them.
pub async fn check(
    client: &tokio_postgres::Client,
    store: &str,
) -> Result<ReplicationSettings, ReplicationError> {
    let unreadable = |e: tokio_postgres::Error| ReplicationError::Unreadable {
        store: store.to_owned(),
        reason: crate::error::chain(&e),
    };
    let show = async |name: &str| -> Result<String, ReplicationError> {
        let row = client
            .query_one(&format!("SHOW {name}"), &[])
            .await
            .map_err(unreadable)?;
        row.try_get::<_, String>(0).map_err(unreadable)
    };
    let settings = ReplicationSettings {
        synchronous_commit: show("synchronous_commit").await?,
        synchronous_standby_names: show("synchronous_standby_names").await?,
    };
    judge(&settings)?;
    Ok(settings)
}

/// Whether the pool's `post_create` hook checks each new connection; off
/// until [`crate::PgStore::require_synchronous_replication`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Required(Arc<AtomicBool>);

impl Required {
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// The hook: a connection that fails the check is never handed out, so
    /// the operation that wanted it fails as the store being unavailable.
    pub(crate) fn hook(&self, store: String) -> deadpool_postgres::Hook {
        let required = self.0.clone();
        deadpool_postgres::Hook::async_fn(move |client, _| -> HookFuture<'_> {
            let required = required.load(Ordering::SeqCst);
            let store = store.clone();
            Box::pin(async move {
                if !required {
                    return Ok(());
                }
                // The pool's error carries this text into the 503's detail.
                match check(client, &store).await {
                    Ok(_) => Ok(()),
                    Err(e) => Err(HookError::Message(e.to_string().into())),
                }
            })
        })
    }
}

impl fmt::Display for ReplicationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplicationError::NotSynchronous { settings, why } => write!(
                f,
                "the store is not synchronously replicated (synchronous_commit = {:?}, \
                 synchronous_standby_names = {:?}): {why}",
                settings.synchronous_commit, settings.synchronous_standby_names
            ),
            ReplicationError::Unreadable { store, reason } => write!(
                f,
                "cannot read the replication settings of {store}: {reason}"
            ),
        }
    }
}

impl std::error::Error for ReplicationError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_commit_flushed_by_a_named_standby_passes() {
        let cases = [
            ("on", "FIRST 1 (s1)", Ok(())),
            ("remote_apply", "s1", Ok(())),
            ("ON", "ANY 1 (s1, s2)", Ok(())),
            ("on", "", Err("synchronous_standby_names is empty")),
            (
                "remote_apply",
                "  ",
                Err("synchronous_standby_names is empty"),
            ),
            ("remote_write", "s1", Err("before the standby has flushed")),
            (
                "local",
                "s1",
                Err("local acknowledges a commit before any standby"),
            ),
            (
                "off",
                "s1",
                Err("off acknowledges a commit before any standby"),
            ),
            ("off", "", Err("off acknowledges")),
            ("maybe", "s1", Err("\"maybe\" is not a level")),
        ];
        for (commit, names, want) in cases {
            let settings = ReplicationSettings {
                synchronous_commit: commit.into(),
                synchronous_standby_names: names.into(),
            };
            match (judge(&settings), want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(part)) => {
                    let text = e.to_string();
                    assert!(text.contains(part), "{commit} {names:?}: {text}");
                    assert!(
                        text.contains(&format!("synchronous_commit = {commit:?}")),
                        "{text}"
                    );
                }
                (got, want) => panic!("{commit} {names:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}

//! The suspect window (`idem_core::window`) in the schema's one-row table,
//! and the promotion watch: every new pooled connection compares the
//! server it reached with the one the schema was last written on (its
//! timeline and system identifier, kept in `server_epoch`), and a server
//! that is not that one (a promoted standby, a point-in-time restore, a
//! copy in another cluster) opens the window before the connection is
//! used.
//!
//! An engine that refuses the functions the check reads (Aurora revokes
//! `pg_control_system()`, CockroachDB and YugabyteDB lack it, a role may
//! have had EXECUTE revoked) runs without it: the store starts, says once
//! in the log and in [`PromotionWatch::watching`] that promotions are not
//! noticed, and a window is opened only by hand (`open_suspect_window`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use deadpool_postgres::HookError;
use idem_core::{Clock, StoreError, SuspectWindow, Timestamp, Watching, WindowFn, WindowOpening};
use tokio_postgres::GenericClient;

use crate::error;
use crate::row::int;

/// What the pool's `post_create` hook returns.
type HookFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HookError>> + Send + 'a>>;

/// The server as the store tells servers apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Epoch {
    pub(crate) timeline: i64,
    pub(crate) system_identifier: String,
}

/// The statements, for one schema.
#[derive(Clone)]
pub(crate) struct Statements {
    read: String,
    lock: String,
    write: String,
    now: String,
    server: String,
    recorded: String,
    epoch_lock: String,
    epoch_put: String,
}

impl Statements {
    pub(crate) fn new(s: &str) -> Statements {
        Statements {
            read: format!(
                "SELECT opened_at_ms, until_ms, since_ms, cause, version \
                 FROM {s}.suspect_window WHERE id = 1"
            ),
            lock: format!("LOCK TABLE {s}.suspect_window IN EXCLUSIVE MODE"),
            write: format!(
                "INSERT INTO {s}.suspect_window \
                 (id, opened_at_ms, until_ms, since_ms, cause, version) \
                 VALUES (1, $1, $2, $3, $4, $5) ON CONFLICT (id) DO UPDATE SET \
                 opened_at_ms = EXCLUDED.opened_at_ms, until_ms = EXCLUDED.until_ms, \
                 since_ms = EXCLUDED.since_ms, cause = EXCLUDED.cause, \
                 version = EXCLUDED.version"
            ),
            now: "SELECT COALESCE($1::bigint, \
                  floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)"
                .into(),
            // The timeline is NULL on a standby, which has no WAL position
            // of its own to read one from (and takes no writes). Apart from
            // `recorded`, so that a refusal of these functions is told from
            // a refusal of the schema's table.
            server: "SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE \
                 ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint \
                 END, (SELECT system_identifier::text FROM pg_control_system())"
                .into(),
            recorded: format!(
                "SELECT timeline, system_identifier FROM {s}.server_epoch WHERE id = 1"
            ),
            epoch_lock: format!("LOCK TABLE {s}.server_epoch IN EXCLUSIVE MODE"),
            epoch_put: format!(
                "INSERT INTO {s}.server_epoch (id, timeline, system_identifier) \
                 VALUES (1, $1, $2) ON CONFLICT (id) DO UPDATE SET \
                 timeline = EXCLUDED.timeline, system_identifier = EXCLUDED.system_identifier"
            ),
        }
    }
}

/// The window the schema holds, open or closed.
pub(crate) async fn read(
    client: &impl GenericClient,
    sql: &Statements,
    store: &str,
) -> Result<Option<SuspectWindow>, StoreError> {
    let row = client
        .query_opt(&sql.read, &[])
        .await
        .map_err(|e| error::from_pg(store, &e))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let get = |i: usize| -> Result<Option<i64>, StoreError> {
        row.try_get(i).map_err(|e| error::from_pg(store, &e))
    };
    let instant = |ms: Option<i64>, what: &str| -> Result<Option<Timestamp>, StoreError> {
        ms.map(|ms| {
            u64::try_from(ms)
                .map(Timestamp::from_millis)
                .map_err(|_| StoreError::Incompatible {
                    store: store.to_owned(),
                    reason: format!("the suspect window's {what} is negative ({ms})"),
                })
        })
        .transpose()
    };
    let required = |t: Option<Timestamp>| t.unwrap_or(Timestamp::from_millis(0));
    Ok(Some(SuspectWindow {
        opened_at: required(instant(get(0)?, "opening time")?),
        until: required(instant(get(1)?, "closing time")?),
        since: instant(get(2)?, "restore point")?,
        cause: row.try_get(3).map_err(|e| error::from_pg(store, &e))?,
        version: required(instant(get(4)?, "version")?).as_millis(),
    }))
}

/// Opens or extends the window inside `tx`, against the store's clock
/// (`now`, or the database's when `None`).
pub(crate) async fn open(
    tx: &impl GenericClient,
    sql: &Statements,
    store: &str,
    (now, opening): (Option<i64>, &WindowOpening),
) -> Result<SuspectWindow, StoreError> {
    let failed = |e: tokio_postgres::Error| error::from_pg(store, &e);
    tx.execute(&sql.lock, &[]).await.map_err(failed)?;
    let held = read(tx, sql, store).await?;
    let now: i64 = tx
        .query_one(&sql.now, &[&now])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(failed)?;
    let now = Timestamp::from_millis(u64::try_from(now).unwrap_or(0));
    let window = SuspectWindow::opened(held.as_ref(), opening, now);
    let ms = |t: Timestamp| int(t.as_millis());
    tx.execute(
        &sql.write,
        &[
            &ms(window.opened_at),
            &ms(window.until),
            &window.since.map(ms),
            &window.cause,
            &int(window.version),
        ],
    )
    .await
    .map_err(failed)?;
    Ok(window)
}

/// Whether new connections are checked for a changed server, for how long
/// a window that finds one stays open, and who hears of it.
#[derive(Clone, Default)]
pub(crate) struct PromotionWatch(Arc<WatchState>);

#[derive(Default)]
struct WatchState {
    /// The window's length in milliseconds; 0: not checked.
    length_ms: AtomicU64,
    listeners: Mutex<Vec<WindowFn>>,
    /// Why the check is off although asked for: the server refused the
    /// functions it reads. Set once and kept for the store's life, so a
    /// refusal costs one statement and one line of log, not one of each
    /// per connection; a grant made later counts from the next start.
    refused: OnceLock<String>,
}

impl PromotionWatch {
    pub(crate) fn set_length(&self, length_ms: u64) {
        self.0.length_ms.store(length_ms, Ordering::SeqCst);
    }

    /// Whether the check runs; `None` when it was not asked for.
    pub(crate) fn watching(&self) -> Option<Watching> {
        if self.0.length_ms.load(Ordering::SeqCst) == 0 {
            return None;
        }
        Some(match self.0.refused.get() {
            Some(reason) => Watching::Off {
                reason: reason.clone(),
            },
            None => Watching::Active,
        })
    }

    /// Turns the check off for good after the server refused what it
    /// reads, logging it the first time.
    fn refuse(&self, store: &str, e: &tokio_postgres::Error) {
        let reason = format!(
            "the server refused the functions that tell which server it is \
             (pg_control_system(), pg_walfile_name(pg_current_wal_lsn())): {}; a promotion \
             or a restore is not noticed automatically: after one, open the suspect window \
             by hand (idem store mark-restored)",
            error::chain(e)
        );
        if self.0.refused.set(reason.clone()).is_ok() {
            tracing::warn!(store, %reason, "the promotion check is off");
        }
    }

    pub(crate) fn listen(&self, opened: WindowFn) {
        self.0
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(opened);
    }

    /// Compares the server `client` reached with the one recorded, records
    /// it when there was none, and opens the window when it changed. The
    /// window, when this call opened one. A server that refuses the
    /// functions that tell it apart ([`error::not_offered`]) turns the
    /// check off instead of failing the connection.
    pub(crate) async fn check(
        &self,
        client: &mut tokio_postgres::Client,
        sql: &Statements,
        (store, clock): (&str, Option<&dyn Clock>),
    ) -> Result<Option<SuspectWindow>, StoreError> {
        let length_ms = self.0.length_ms.load(Ordering::SeqCst);
        if length_ms == 0 || self.0.refused.get().is_some() {
            return Ok(None);
        }
        let failed = |e: tokio_postgres::Error| error::from_pg(store, &e);
        let now = match server(&*client, sql).await {
            Ok(now) => now,
            Err(e) if error::not_offered(&e) => {
                self.refuse(store, &e);
                return Ok(None);
            }
            Err(e) => return Err(failed(e)),
        };
        let Some(now) = now else {
            return Ok(None);
        };
        if recorded(&*client, sql, store).await?.as_ref() == Some(&now) {
            return Ok(None);
        }
        let tx = client.transaction().await.map_err(failed)?;
        tx.execute(&sql.epoch_lock, &[]).await.map_err(failed)?;
        // Another connection may have recorded it meanwhile.
        let held = recorded(&tx, sql, store).await?;
        if held.as_ref() == Some(&now) {
            return Ok(None);
        }
        tx.execute(&sql.epoch_put, &[&now.timeline, &now.system_identifier])
            .await
            .map_err(failed)?;
        let Some(before) = held else {
            // The first server this schema was checked on: nothing known to
            // have been lost.
            tx.commit().await.map_err(failed)?;
            return Ok(None);
        };
        let cause = if before.system_identifier == now.system_identifier {
            format!(
                "the server is not the primary written to before: timeline {} -> {} (a \
                 promotion or a point-in-time restore)",
                before.timeline, now.timeline
            )
        } else {
            format!(
                "the server is not the one written to before: system identifier {} -> {} (a \
                 restore into another cluster)",
                before.system_identifier, now.system_identifier
            )
        };
        let opening = WindowOpening {
            length_ms,
            since: None,
            cause,
        };
        let now_ms = clock.map(|c| int(c.now().as_millis()));
        let window = open(&tx, sql, store, (now_ms, &opening)).await?;
        tx.commit().await.map_err(failed)?;
        let listeners = self
            .0
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for listener in listeners {
            listener(&window);
        }
        Ok(Some(window))
    }

    /// The pool's `post_create` hook: a connection whose check fails is
    /// never handed out.
    pub(crate) fn hook(
        &self,
        sql: Statements,
        store: String,
        clock: Option<Arc<dyn Clock>>,
    ) -> deadpool_postgres::Hook {
        let watch = self.clone();
        deadpool_postgres::Hook::async_fn(move |client, _| -> HookFuture<'_> {
            let (watch, sql, store, clock) =
                (watch.clone(), sql.clone(), store.clone(), clock.clone());
            Box::pin(async move {
                let client: &mut tokio_postgres::Client = client;
                match watch.check(client, &sql, (&store, clock.as_deref())).await {
                    Ok(_) => Ok(()),
                    Err(e) => Err(HookError::Message(e.to_string().into())),
                }
            })
        })
    }
}

/// The server `client` reached; `None` on a standby. The driver's error as
/// it came, for [`error::not_offered`].
async fn server(
    client: &impl GenericClient,
    sql: &Statements,
) -> Result<Option<Epoch>, tokio_postgres::Error> {
    let row = client.query_one(&sql.server, &[]).await?;
    let timeline: Option<i64> = row.try_get(0)?;
    let system_identifier: String = row.try_get(1)?;
    Ok(timeline.map(|timeline| Epoch {
        timeline,
        system_identifier,
    }))
}

/// The server the schema was last written on, if it was ever recorded.
async fn recorded(
    client: &impl GenericClient,
    sql: &Statements,
    store: &str,
) -> Result<Option<Epoch>, StoreError> {
    let failed = |e: tokio_postgres::Error| error::from_pg(store, &e);
    let row = client.query_opt(&sql.recorded, &[]).await.map_err(failed)?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some(Epoch {
        timeline: row.try_get(0).map_err(failed)?,
        system_identifier: row.try_get(1).map_err(failed)?,
    }))
}

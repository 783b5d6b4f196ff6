//! The suspect window's one row (`idem_core::window`), read and written on
//! whichever connection the caller holds: the writer's inside its batch,
//! a reader's for [`idem_core::Store::suspect_window`].

use idem_core::{StoreError, SuspectWindow, Timestamp};
use rusqlite::{Connection, OptionalExtension};

use crate::schema;

/// The window the file holds, open or closed.
pub(crate) fn read(conn: &Connection, store: &str) -> Result<Option<SuspectWindow>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT opened_at_ms, until_ms, since_ms, cause, version FROM suspect_window \
             WHERE id = 1",
        )
        .and_then(|mut stmt| {
            stmt.query_row([], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, Option<i64>>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, i64>(4)?,
                ))
            })
            .optional()
        })
        .map_err(|e| schema::error(store, &e))?;
    let Some((opened_at, until, since, cause, version)) = row else {
        return Ok(None);
    };
    let instant = |ms: i64, what: &str| {
        u64::try_from(ms)
            .map(Timestamp::from_millis)
            .map_err(|_| StoreError::Incompatible {
                store: store.to_owned(),
                reason: format!("the suspect window's {what} is negative ({ms})"),
            })
    };
    Ok(Some(SuspectWindow {
        opened_at: instant(opened_at, "opening time")?,
        until: instant(until, "closing time")?,
        since: since.map(|ms| instant(ms, "restore point")).transpose()?,
        cause,
        version: instant(version, "version")?.as_millis(),
    }))
}

/// Replaces the file's window with `window`.
pub(crate) fn write(
    conn: &Connection,
    store: &str,
    window: &SuspectWindow,
) -> Result<(), StoreError> {
    let ms = |t: Timestamp| i64::try_from(t.as_millis()).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "INSERT OR REPLACE INTO suspect_window \
         (id, opened_at_ms, until_ms, since_ms, cause, version) VALUES (1, ?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut stmt| {
        stmt.execute(rusqlite::params![
            ms(window.opened_at),
            ms(window.until),
            window.since.map(ms),
            window.cause,
            i64::try_from(window.version).unwrap_or(i64::MAX),
        ])
    })
    .map_err(|e| schema::error(store, &e))?;
    Ok(())
}

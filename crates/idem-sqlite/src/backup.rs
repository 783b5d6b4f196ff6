//! `idem store backup`: a consistent copy of a store while it serves,
//! through SQLite's online backup (`sqlite3_backup_*`): pages are copied a
//! few at a time on a connection of its own, and a write by the store's
//! writer meanwhile restarts the copy, so the file written is the store as
//! it was at one commit, WAL included. The copy is then checked: its
//! `integrity_check`, its application id and schema version, its records.
//!
//! `idem store restore` puts such a copy back in place of the store, with
//! the suspect window open from the copy's last write
//! (`idem_core::window`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use idem_core::{StoreError, SuspectWindow, Timestamp, WindowOpening};
use rusqlite::{Connection, OpenFlags};

use crate::schema::{self, APPLICATION_ID, SCHEMA_VERSION};
use crate::window;

/// Pages copied per step, and the pause between steps that lets the
/// writer commit.
const PAGES_PER_STEP: i32 = 256;
const PAUSE: Duration = Duration::from_millis(5);

/// What a backup wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackupReport {
    /// Records in the copy.
    pub records: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// Copies the store at `from` to a new file `to` (refused when `to`
/// exists, so a backup never overwrites another), then checks the copy.
pub fn backup(from: &Path, to: &Path) -> Result<BackupReport, StoreError> {
    let name = from.display().to_string();
    if !from.exists() {
        return Err(schema::unavailable(
            &name,
            "there is no store at this path".into(),
        ));
    }
    if to.exists() {
        return Err(schema::unavailable(
            &to.display().to_string(),
            "the file exists; a backup is written to a new file only".into(),
        ));
    }
    let source = Connection::open_with_flags(
        from,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| schema::error(&name, &e))?;
    source
        .busy_timeout(Duration::from_secs(5))
        .map_err(|e| schema::error(&name, &e))?;
    let target_name = to.display().to_string();
    let written = (|| {
        let mut target = Connection::open(to).map_err(|e| schema::error(&target_name, &e))?;
        {
            let copy = rusqlite::backup::Backup::new(&source, &mut target)
                .map_err(|e| schema::error(&target_name, &e))?;
            copy.run_to_completion(PAGES_PER_STEP, PAUSE, None)
                .map_err(|e| schema::error(&target_name, &e))?;
        }
        check(&target, &target_name)
    })();
    // A copy that failed is not left behind to be mistaken for a backup.
    if written.is_err() {
        let _ = std::fs::remove_file(to);
    }
    written
}

/// The copy is a whole idem store of this schema version.
fn check(copy: &Connection, name: &str) -> Result<BackupReport, StoreError> {
    let damaged = |why: String| schema::unavailable(name, format!("the copy is not usable: {why}"));
    let integrity: String = copy
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .map_err(|e| schema::error(name, &e))?;
    if integrity != "ok" {
        return Err(damaged(format!("integrity_check says {integrity:?}")));
    }
    let pragma = |p: &str| -> Result<i64, StoreError> {
        copy.pragma_query_value(None, p, |row| row.get(0))
            .map_err(|e| schema::error(name, &e))
    };
    let (application_id, version) = (pragma("application_id")?, pragma("user_version")?);
    if application_id != i64::from(APPLICATION_ID) || version != SCHEMA_VERSION {
        return Err(damaged(format!(
            "application id {application_id:#x}, schema version {version} (expected \
             {APPLICATION_ID:#x}, {SCHEMA_VERSION})"
        )));
    }
    let records: i64 = copy
        .query_row("SELECT count(*) FROM records", [], |row| row.get(0))
        .map_err(|e| schema::error(name, &e))?;
    let pages: i64 = pragma("page_count")?;
    let page_size: i64 = pragma("page_size")?;
    Ok(BackupReport {
        records: u64::try_from(records).unwrap_or(0),
        bytes: u64::try_from(pages.saturating_mul(page_size)).unwrap_or(0),
    })
}

/// What a restore did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreReport {
    /// Records in the restored store.
    pub records: u64,
    /// The last write the backup holds (the latest instant any of its
    /// records or resolutions names), from which the store may have lost
    /// writes; `None` for an empty backup.
    pub restore_point: Option<Timestamp>,
    /// The suspect window the restored store holds.
    pub window: SuspectWindow,
    /// Where the store that was replaced was kept, if there was one.
    pub replaced: Option<PathBuf>,
}

/// Replaces the store at `store` with a copy of the backup at `from` (a
/// file `idem store backup` wrote, or any idem SQLite store of this or an
/// older schema), migrated, with the suspect window opened for
/// `window_ms` from the backup's last write: records written after it are
/// gone, and their keys are verified with the provider before they run
/// again. Refused, nothing changed, while another process has the store
/// open (stop the gateway first). The replaced store is kept beside it as
/// `<store>.replaced-<unix ms>`, never deleted.
pub fn restore(
    from: &Path,
    store: &Path,
    (window_ms, now): (u64, Timestamp),
) -> Result<RestoreReport, StoreError> {
    let name = from.display().to_string();
    if !from.is_file() {
        return Err(schema::unavailable(
            &name,
            "there is no backup file at this path".into(),
        ));
    }
    let backup = Connection::open_with_flags(
        from,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| schema::error(&name, &e))?;
    let restore_point = check_backup(&backup, &name)?;
    if store.exists() {
        claim_alone(store)?;
    }
    let restoring = sibling(store, "restoring");
    let _ = std::fs::remove_file(&restoring);
    let restoring_name = restoring.display().to_string();
    let written = (|| {
        {
            let mut target =
                Connection::open(&restoring).map_err(|e| schema::error(&restoring_name, &e))?;
            let copy = rusqlite::backup::Backup::new(&backup, &mut target)
                .map_err(|e| schema::error(&restoring_name, &e))?;
            copy.run_to_completion(PAGES_PER_STEP, PAUSE, None)
                .map_err(|e| schema::error(&restoring_name, &e))?;
        }
        let (conn, _) = schema::open_writer(&restoring, false)?;
        let opening = WindowOpening {
            length_ms: window_ms,
            since: restore_point,
            cause: format!(
                "restored from the backup {}{}",
                from.display(),
                restore_point.map_or(String::new(), |t| format!(
                    ", whose last write was at {} ms since the epoch",
                    t.as_millis()
                ))
            ),
        };
        let held = window::read(&conn, &restoring_name)?;
        let opened = SuspectWindow::opened(held.as_ref(), &opening, now);
        window::write(&conn, &restoring_name, &opened)?;
        let records: i64 = conn
            .query_row("SELECT count(*) FROM records", [], |row| row.get(0))
            .map_err(|e| schema::error(&restoring_name, &e))?;
        // Back to a rollback journal, so that the file is whole without a
        // WAL beside it when it is moved into place.
        let _: String = conn
            .query_row("PRAGMA journal_mode = DELETE", [], |row| row.get(0))
            .map_err(|e| schema::error(&restoring_name, &e))?;
        Ok((u64::try_from(records).unwrap_or(0), opened))
    })();
    let (records, window) = match written {
        Ok(done) => done,
        Err(e) => {
            let _ = std::fs::remove_file(&restoring);
            return Err(e);
        }
    };
    let store_name = store.display().to_string();
    let replaced = if store.exists() {
        let kept = sibling(store, &format!("replaced-{}", now.as_millis()));
        std::fs::rename(store, &kept).map_err(|e| {
            schema::unavailable(&store_name, format!("cannot move the store aside: {e}"))
        })?;
        Some(kept)
    } else {
        None
    };
    std::fs::rename(&restoring, store).map_err(|e| {
        schema::unavailable(
            &store_name,
            format!(
                "cannot move the restored copy {} into place: {e}",
                restoring.display()
            ),
        )
    })?;
    Ok(RestoreReport {
        records,
        restore_point,
        window,
        replaced,
    })
}

/// `path` with `.suffix` appended to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

/// The backup is a whole idem store this build can open; its last write.
fn check_backup(backup: &Connection, name: &str) -> Result<Option<Timestamp>, StoreError> {
    let unusable =
        |why: String| schema::unavailable(name, format!("the backup is not usable: {why}"));
    let integrity: String = backup
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .map_err(|e| schema::error(name, &e))?;
    if integrity != "ok" {
        return Err(unusable(format!("integrity_check says {integrity:?}")));
    }
    let pragma = |p: &str| -> Result<i64, StoreError> {
        backup
            .pragma_query_value(None, p, |row| row.get(0))
            .map_err(|e| schema::error(name, &e))
    };
    let (application_id, version) = (pragma("application_id")?, pragma("user_version")?);
    if application_id != i64::from(APPLICATION_ID) || !(1..=SCHEMA_VERSION).contains(&version) {
        return Err(unusable(format!(
            "application id {application_id:#x}, schema version {version} (expected \
             {APPLICATION_ID:#x}, 1 to {SCHEMA_VERSION})"
        )));
    }
    let journal = if version >= 2 {
        "UNION ALL SELECT max(at_ms) FROM resolutions"
    } else {
        ""
    };
    let last: Option<i64> = backup
        .query_row(
            &format!(
                "SELECT max(m) FROM (SELECT max(created_at_ms) AS m FROM records \
                 UNION ALL SELECT max(completed_at_ms) FROM records {journal})"
            ),
            [],
            |row| row.get(0),
        )
        .map_err(|e| schema::error(name, &e))?;
    Ok(last
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Timestamp::from_millis))
}

/// Makes sure no other process has the store open: leaving WAL mode is
/// refused while another connection has the file open. On success the WAL
/// is folded into the file and removed.
fn claim_alone(store: &Path) -> Result<(), StoreError> {
    let name = store.display().to_string();
    let conn = Connection::open_with_flags(
        store,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| schema::error(&name, &e))?;
    conn.busy_timeout(Duration::from_millis(500))
        .map_err(|e| schema::error(&name, &e))?;
    let in_use = || {
        schema::unavailable(
            &name,
            "another process has the store open (a gateway or a consumer): stop it, then \
             restore"
                .into(),
        )
    };
    match conn.query_row("PRAGMA journal_mode = DELETE", [], |row| {
        row.get::<_, String>(0)
    }) {
        Ok(mode) if mode.eq_ignore_ascii_case("delete") => Ok(()),
        Ok(_) => Err(in_use()),
        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => Err(in_use()),
        Err(e) => Err(schema::error(&name, &e)),
    }
}

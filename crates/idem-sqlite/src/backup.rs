//! `idem store backup`: a consistent copy of a store while it serves,
//! through SQLite's online backup (`sqlite3_backup_*`): pages are copied a
//! few at a time on a connection of its own, and a write by the store's
//! writer meanwhile restarts the copy, so the file written is the store as
//! it was at one commit, WAL included. The copy is then checked: its
//! `integrity_check`, its application id and schema version, its records.

use std::path::Path;
use std::time::Duration;

use idem_core::StoreError;
use rusqlite::{Connection, OpenFlags};

use crate::schema::{self, APPLICATION_ID, SCHEMA_VERSION};

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

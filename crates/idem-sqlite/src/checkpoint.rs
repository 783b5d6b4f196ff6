//! The WAL checkpoint off the commit path. SQLite's own autocheckpoint runs
//! inside the COMMIT that crosses its threshold: that caller (and every
//! caller of that batch, and every write queued behind it) waits while
//! thousands of pages are copied into the database file and it is synced.
//! Here the writer's commit only notices how far the WAL has grown past
//! what was copied back and wakes a thread of its own, which checkpoints on
//! its own connection in `PASSIVE` mode: it copies what no reader still
//! needs, never waits for a lock, and the writer keeps committing to the
//! WAL meanwhile.
//!
//! SQLite restarts the WAL from its beginning only when a write begins with
//! every frame copied back, which a busy writer never lets a checkpointer
//! on another connection see: it has always appended a few more. So once
//! the WAL is past [`CHECKPOINT_PAGES`] and the checkpointer has copied all
//! but [`CATCH_UP_PAGES`] of it, the writer copies those few itself in its
//! commit (a small copy and one sync of the database file, not thousands
//! of pages), and its next transaction restarts the WAL.
//!
//! The bound: if the WAL still reaches [`WAL_PAGES_MAX`] (the checkpointer
//! could not keep up, or a long read held old pages back), the writer
//! checkpoints inline, as SQLite would, so the file cannot grow without
//! end.

use std::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use rusqlite::Connection;
use rusqlite::wal::CheckpointMode;

use crate::counters::Counters;

/// WAL pages after which the checkpointer is woken. Hot pages are
/// rewritten in many commits, and a longer interval copies each one back
/// once instead of several times: 20-30 % more claim + complete pairs per
/// second in `idem-bench` than SQLite's default 1000 (measured on a 2-vCPU
/// VM, when the checkpoint still ran in the commit), for a WAL of about
/// 16 MiB with 4 KiB pages.
pub(crate) const CHECKPOINT_PAGES: c_int = 4096;

/// WAL pages at which the writer checkpoints inline, bounding the WAL at
/// about 64 MiB with 4 KiB pages.
pub(crate) const WAL_PAGES_MAX: c_int = 4 * CHECKPOINT_PAGES;

/// Pages not yet copied back that wake the checkpointer.
const WAKE_PAGES: c_int = CHECKPOINT_PAGES / 2;

/// At most this many pages not yet copied back, the WAL past
/// [`CHECKPOINT_PAGES`], the writer copies them itself so that the WAL can
/// restart.
pub(crate) const CATCH_UP_PAGES: c_int = 256;

/// How far the checkpointer has got: frames of the WAL copied back by its
/// last run. Shared by the writer's hook and the checkpointer.
#[derive(Default)]
pub(crate) struct Progress {
    copied: AtomicI32,
}

/// Has the writer's connection wake the checkpointer through `wake` when a
/// commit leaves more than [`CHECKPOINT_PAGES`] in the WAL, and checkpoint
/// inline at [`WAL_PAGES_MAX`]. Replaces SQLite's autocheckpoint on it.
pub(crate) fn hand_off(
    writer: &mut Connection,
    wake: SyncSender<()>,
    progress: Arc<Progress>,
    counters: Arc<Counters>,
) -> rusqlite::Result<()> {
    writer.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages: c_int| {
        // Fewer pages than were copied: the WAL restarted since.
        let copied = progress.copied.load(Ordering::Relaxed);
        let pending = if pages < copied {
            pages
        } else {
            pages - copied
        };
        // The commit has happened; an error returned from this hook would
        // be reported as the commit's. A checkpoint that failed is tried
        // again at a later commit.
        if pages >= WAL_PAGES_MAX {
            counters.inline_checkpoints.fetch_add(1, Ordering::Relaxed);
            let _ = wal.checkpoint_v2(CheckpointMode::PASSIVE);
        } else if pages >= CHECKPOINT_PAGES && pending <= CATCH_UP_PAGES {
            counters.catch_ups.fetch_add(1, Ordering::Relaxed);
            let _ = wal.checkpoint_v2(CheckpointMode::PASSIVE);
        } else if pending >= WAKE_PAGES {
            match wake.try_send(()) {
                // Full: the checkpointer has a wake-up pending already.
                Ok(()) | Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {
                    let _ = wal.checkpoint_v2(CheckpointMode::PASSIVE);
                }
            }
        }
        Ok(())
    }))
}

/// The checkpointer thread: one passive checkpoint per wake-up, until the
/// writer's connection (and with it the sending half) is gone.
pub(crate) fn run(
    conn: Connection,
    woken: Receiver<()>,
    progress: Arc<Progress>,
    counters: Arc<Counters>,
) {
    while woken.recv().is_ok() {
        // The pragma, not `sqlite3_wal_checkpoint_v2` by name: on this
        // connection the latter reported -1 frames (as for a database not
        // in WAL mode) where the pragma checkpointed them all.
        let ran = conn.query_row("PRAGMA main.wal_checkpoint(PASSIVE)", [], |row| {
            row.get::<_, i64>(2)
        });
        if let Ok(copied) = ran {
            let copied = c_int::try_from(copied.max(0)).unwrap_or(c_int::MAX);
            progress.copied.store(copied, Ordering::Relaxed);
            counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        }
    }
}

//! A slow disk for one process, for the durable-commit stalls a test must
//! survive: [`DiskStall::build`] compiles a small preload library (C, with
//! the system's `cc`, the compiler Rust links with) that delays every
//! `fsync` and `fdatasync` of a process while a control file names a delay.
//! A test starts the real binary with [`DiskStall::env`] and calls
//! [`DiskStall::set`] around the write it wants to stall; the binary is the
//! release code, unchanged, and its commits really wait on the disk call.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const SOURCE: &str = include_str!("disk_stall/stall_sync.c");

/// The preload library and its control file, in a directory of the test's.
pub struct DiskStall {
    library: PathBuf,
    control: PathBuf,
}

impl DiskStall {
    /// Compiles the library into `dir`; the stall starts off.
    pub fn build(dir: &Path) -> io::Result<DiskStall> {
        let source = dir.join("stall_sync.c");
        let library = dir.join("libstall_sync.so");
        std::fs::write(&source, SOURCE)?;
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&library)
            .arg(&source)
            .arg("-ldl")
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "cc could not build the disk-stall library: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let stall = DiskStall {
            library,
            control: dir.join("sync-stall-ms"),
        };
        stall.set(Duration::ZERO)?;
        Ok(stall)
    }

    /// The environment that loads the library into a child process.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".to_owned(), self.library.display().to_string()),
            (
                "IDEM_SYNC_STALL_FILE".to_owned(),
                self.control.display().to_string(),
            ),
        ]
    }

    /// Every `fsync`/`fdatasync` that starts from now on waits `delay`
    /// (zero: none); calls already waiting keep their delay.
    pub fn set(&self, delay: Duration) -> io::Result<()> {
        std::fs::write(&self.control, delay.as_millis().to_string())
    }
}

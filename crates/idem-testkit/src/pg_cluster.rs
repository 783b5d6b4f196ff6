//! A throwaway replicated PostgreSQL built from the machine's server
//! binaries: a primary and a streaming standby on spare loopback ports, in
//! a temp dir, so a test can kill the primary and promote the standby
//! without touching the shared server other tests use.
//!
//! The standby's replication connection goes wherever the caller says
//! (usually a [`crate::relay::Relay`] in front of the primary), so a test
//! can hold WAL back before the primary dies. Dropping the [`PgCluster`]
//! stops every postmaster it started (immediate) and removes the data
//! dirs, also when the test panics.
//!
//! initdb and postgres refuse to run as root: when the effective uid is 0,
//! every server command runs as the `postgres` OS user (`runuser`).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// How commits on the primary wait for the standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Replication {
    /// A commit returns once it is durable on the primary; the standby
    /// follows when it can (a failover can lose the last commits).
    Asynchronous,
    /// `synchronous_standby_names` names the standby and
    /// `synchronous_commit = remote_apply`: a commit returns once the
    /// standby has applied it, so a read there sees it.
    Synchronous,
}

/// Why the cluster could not be built or driven.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClusterError {
    /// No `initdb` under `/usr/lib/postgresql/*/bin` nor on `PATH`.
    NoServerBinaries,
    /// A file or process operation failed.
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: io::Error,
    },
    /// A server command exited unsuccessfully.
    Command {
        /// The command line.
        command: String,
        /// Its stdout and stderr.
        output: String,
    },
    /// The cluster is not in the state the call needs.
    Precondition {
        /// What is missing.
        what: String,
    },
    /// A condition was not reached in time.
    Timeout {
        /// What was waited for.
        what: String,
        /// How long, in milliseconds.
        waited_ms: u128,
    },
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::NoServerBinaries => write!(
                f,
                "no PostgreSQL server binaries: install the postgresql package \
                 (initdb under /usr/lib/postgresql/*/bin or on PATH)"
            ),
            ClusterError::Io { what, source } => write!(f, "{what}: {source}"),
            ClusterError::Command { command, output } => {
                write!(f, "{command} failed:\n{output}")
            }
            ClusterError::Precondition { what } => write!(f, "{what}"),
            ClusterError::Timeout { what, waited_ms } => {
                write!(f, "{what}: not reached within {waited_ms} ms")
            }
        }
    }
}

impl std::error::Error for ClusterError {}

/// The standby's `application_name`, as `synchronous_standby_names` and
/// `pg_stat_replication` name it.
pub const STANDBY_NAME: &str = "standby";
/// The longest wait for a server to start, stop, stream or promote.
const WAIT_MS_MAX: u64 = 60_000;
/// Between two polls of a condition.
const POLL_MS: u64 = 50;

/// One postmaster of the cluster.
#[derive(Debug)]
struct Node {
    data: PathBuf,
    log: PathBuf,
    port: u16,
    running: bool,
}

/// A primary and (once [`PgCluster::add_standby`] ran) a streaming standby.
pub struct PgCluster {
    bin: PathBuf,
    run_as_postgres: bool,
    replication: Replication,
    primary: Node,
    standby: Option<Node>,
    /// Standbys made so far, so a second one gets its own dir and log.
    standbys_made: u32,
    // Last, so it is removed after the servers are stopped.
    dir: tempfile::TempDir,
}

impl PgCluster {
    /// initdb and start a primary on a spare port: listening on 127.0.0.1
    /// only, trust auth (replication included) from 127.0.0.1,
    /// `wal_level = replica`, small `shared_buffers`, `fsync = on`.
    pub fn start_primary(replication: Replication) -> Result<PgCluster, ClusterError> {
        let bin = server_binaries()?;
        let run_as_postgres = effective_uid_is_root()?;
        let dir = tempfile::Builder::new()
            .prefix("idem-pg-cluster-")
            .tempdir()
            .map_err(io_error("create the cluster's temp dir"))?;
        if run_as_postgres {
            give_to_postgres(dir.path())?;
        }
        let primary = Node {
            data: dir.path().join("primary"),
            log: dir.path().join("primary.log"),
            port: spare_port()?,
            running: false,
        };
        let mut cluster = PgCluster {
            bin,
            run_as_postgres,
            replication,
            primary,
            standby: None,
            standbys_made: 0,
            dir,
        };
        cluster.init_primary()?;
        Ok(cluster)
    }

    /// Copies the primary with `pg_basebackup -R`, points its replication
    /// connection at `replication_via` (the primary itself, or a relay in
    /// front of it) with `application_name` [`STANDBY_NAME`], starts it
    /// on a spare port and waits until the primary sees it streaming (and,
    /// in synchronous mode, as its synchronous standby).
    pub fn add_standby(&mut self, replication_via: SocketAddr) -> Result<(), ClusterError> {
        let name = match self.standbys_made {
            0 => "standby".to_owned(),
            n => format!("standby-{}", n + 1),
        };
        self.standbys_made += 1;
        let data = self.dir.path().join(&name);
        let log = self.dir.path().join(format!("{name}.log"));
        let port = spare_port()?;
        let primary_port = self.primary.port.to_string();
        let data_arg = data.display().to_string();
        self.server_command(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary_port,
                "-U",
                "postgres",
                "-D",
                &data_arg,
                "-R",
                "-X",
                "stream",
                "--checkpoint=fast",
                "--no-sync",
            ],
        )?;
        // postgresql.auto.conf is read last: these lines win over what the
        // copy brought along. The promoted standby must not wait for a
        // synchronous standby of its own, or every commit after the
        // failover would wait forever.
        let conninfo = format!(
            "host={} port={} user=postgres application_name={STANDBY_NAME}",
            replication_via.ip(),
            replication_via.port()
        );
        append(
            &data.join("postgresql.auto.conf"),
            &format!(
                "port = {port}\nprimary_conninfo = '{conninfo}'\n\
                 synchronous_standby_names = ''\nhot_standby = on\n"
            ),
        )?;
        self.standby = Some(Node {
            data,
            log,
            port,
            running: false,
        });
        self.start_node(Role::Standby)?;
        let wanted = match self.replication {
            Replication::Synchronous => "state = 'streaming' AND sync_state = 'sync'",
            Replication::Asynchronous => "state = 'streaming'",
        };
        let query = format!(
            "SELECT count(*) FROM pg_stat_replication \
             WHERE application_name = '{STANDBY_NAME}' AND {wanted}"
        );
        self.wait_for("the standby to stream", || {
            Ok(self.psql(Role::Primary, &query)? == "1")
        })
    }

    /// The primary's address.
    pub fn primary_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.primary.port))
    }

    /// The standby's address, once there is one.
    pub fn standby_addr(&self) -> Option<SocketAddr> {
        let port = self.standby.as_ref()?.port;
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// A libpq URL naming the primary and then the standby, for `user`
    /// postgres and database `postgres`, that connects only to the one
    /// that accepts writes (`target_session_attrs=read-write`).
    pub fn multi_host_url(&self) -> String {
        let standby = self
            .standby
            .as_ref()
            .map(|s| format!(",127.0.0.1:{}", s.port))
            .unwrap_or_default();
        format!(
            "postgres://postgres@127.0.0.1:{}{standby}/postgres?target_session_attrs=read-write",
            self.primary.port
        )
    }

    /// A URL of one node alone.
    pub fn url(&self, role: Role) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.node(role).port
        )
    }

    /// Runs `sql` with psql on `role`'s node; its output, unaligned and
    /// without headers, trimmed.
    pub fn psql(&self, role: Role, sql: &str) -> Result<String, ClusterError> {
        let port = self.node(role).port.to_string();
        let args = [
            "-X",
            "-A",
            "-t",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
            sql,
        ];
        let output = self.server_command("psql", &args)?;
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// Stops the primary at once (`pg_ctl stop -m immediate`): no
    /// checkpoint, no goodbye to clients or to the standby, as a crash.
    pub fn stop_primary_immediate(&mut self) -> Result<(), ClusterError> {
        self.stop_node(Role::Primary)
    }

    /// Promotes the standby and waits until it accepts writes.
    pub fn promote_standby(&mut self) -> Result<(), ClusterError> {
        let data = self.node(Role::Standby).data.display().to_string();
        let timeout_s = (WAIT_MS_MAX / 1000).to_string();
        self.server_command("pg_ctl", &["promote", "-w", "-t", &timeout_s, "-D", &data])?;
        self.wait_for("the promoted standby to accept writes", || {
            Ok(self.psql(Role::Standby, "SELECT pg_is_in_recovery()")? == "f")
        })
    }

    /// After the primary was stopped and the standby promoted: the promoted
    /// node becomes the primary and, in synchronous mode, waits for a
    /// synchronous standby again (`synchronous_standby_names`,
    /// `remote_apply`), as a strict synchronous setup does after a
    /// failover. Until [`PgCluster::add_standby`] gives it one, its commits
    /// wait.
    pub fn adopt_promoted_standby(&mut self) -> Result<(), ClusterError> {
        if self.primary.running {
            return Err(ClusterError::Precondition {
                what: "the old primary is still running".to_owned(),
            });
        }
        let Some(promoted) = self.standby.take() else {
            return Err(ClusterError::Precondition {
                what: "there is no standby to adopt".to_owned(),
            });
        };
        self.primary = promoted;
        if self.replication == Replication::Synchronous {
            // One statement per call: ALTER SYSTEM refuses a transaction.
            for sql in [
                format!("ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'"),
                "ALTER SYSTEM SET synchronous_commit = 'remote_apply'".to_owned(),
                "SELECT pg_reload_conf()".to_owned(),
            ] {
                self.psql(Role::Primary, &sql)?;
            }
        }
        Ok(())
    }

    /// The cluster's temp dir (server logs are `*.log` in it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server log of `role`'s node, for a failure message.
    pub fn log(&self, role: Role) -> String {
        std::fs::read_to_string(self.log_path(role)).unwrap_or_default()
    }

    fn init_primary(&mut self) -> Result<(), ClusterError> {
        let data = self.primary.data.display().to_string();
        self.server_command(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ],
        )?;
        let mut conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = ''\n\
             wal_level = replica\nmax_wal_senders = 4\nwal_keep_size = '128MB'\n\
             shared_buffers = '16MB'\nmax_connections = 60\nfsync = on\n\
             synchronous_commit = on\n",
            self.primary.port
        );
        if self.replication == Replication::Synchronous {
            conf.push_str(&format!(
                "synchronous_standby_names = '{STANDBY_NAME}'\n\
                 synchronous_commit = remote_apply\n"
            ));
        }
        append(&self.primary.data.join("postgresql.conf"), &conf)?;
        std::fs::write(
            self.primary.data.join("pg_hba.conf"),
            "host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n",
        )
        .map_err(io_error("write pg_hba.conf"))?;
        self.start_node(Role::Primary)
    }

    fn start_node(&mut self, role: Role) -> Result<(), ClusterError> {
        let data = self.node(role).data.display().to_string();
        let log = self.log_path(role).display().to_string();
        let timeout_s = (WAIT_MS_MAX / 1000).to_string();
        self.server_command(
            "pg_ctl",
            &["start", "-w", "-t", &timeout_s, "-D", &data, "-l", &log],
        )?;
        self.node_mut(role).running = true;
        Ok(())
    }

    fn stop_node(&mut self, role: Role) -> Result<(), ClusterError> {
        let data = self.node(role).data.display().to_string();
        let timeout_s = (WAIT_MS_MAX / 1000).to_string();
        self.server_command(
            "pg_ctl",
            &[
                "stop",
                "-m",
                "immediate",
                "-w",
                "-t",
                &timeout_s,
                "-D",
                &data,
            ],
        )?;
        self.node_mut(role).running = false;
        Ok(())
    }

    fn node(&self, role: Role) -> &Node {
        match (role, &self.standby) {
            (Role::Standby, Some(standby)) => standby,
            _ => &self.primary,
        }
    }

    fn node_mut(&mut self, role: Role) -> &mut Node {
        match (role, &mut self.standby) {
            (Role::Standby, Some(standby)) => standby,
            _ => &mut self.primary,
        }
    }

    fn log_path(&self, role: Role) -> PathBuf {
        self.node(role).log.clone()
    }

    /// Runs one of the server's programs, as `postgres` when we are root.
    fn server_command(&self, program: &str, args: &[&str]) -> Result<Output, ClusterError> {
        let path = self.bin.join(program);
        let mut cmd = if self.run_as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(&path);
            cmd
        } else {
            Command::new(&path)
        };
        // A cwd the postgres user may read, whoever runs the test.
        cmd.args(args).current_dir(self.dir.path());
        let command = format!("{} {}", path.display(), args.join(" "));
        let output = cmd.output().map_err(|source| ClusterError::Io {
            what: format!("run {command}"),
            source,
        })?;
        if output.status.success() {
            Ok(output)
        } else {
            Err(ClusterError::Command {
                command,
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            })
        }
    }

    /// Polls `check` until it holds; its errors count as "not yet".
    fn wait_for(
        &self,
        what: &str,
        mut check: impl FnMut() -> Result<bool, ClusterError>,
    ) -> Result<(), ClusterError> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(WAIT_MS_MAX) {
            if let Ok(true) = check() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
        Err(ClusterError::Timeout {
            what: what.to_owned(),
            waited_ms: start.elapsed().as_millis(),
        })
    }
}

/// Which node of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The node created by initdb.
    Primary,
    /// The node copied from it (the primary after a promotion).
    Standby,
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        for role in [Role::Standby, Role::Primary] {
            let running = match role {
                Role::Primary => self.primary.running,
                Role::Standby => self.standby.as_ref().is_some_and(|s| s.running),
            };
            if running && self.stop_node(role).is_err() {
                kill_postmaster(&self.node(role).data);
            }
        }
    }
}

/// The newest server version's `bin` under `/usr/lib/postgresql`, else the
/// directory of `initdb` on `PATH`.
fn server_binaries() -> Result<PathBuf, ClusterError> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .find(|dir| dir.join("initdb").exists() && dir.join("pg_ctl").exists())
        .ok_or(ClusterError::NoServerBinaries)
}

/// Whether this process runs as root (the owner of `/proc/self`).
fn effective_uid_is_root() -> Result<bool, ClusterError> {
    let meta = std::fs::metadata("/proc/self").map_err(io_error("read /proc/self"))?;
    Ok(meta.uid() == 0)
}

/// Hands `dir` to the `postgres` OS user, who runs the servers.
fn give_to_postgres(dir: &Path) -> Result<(), ClusterError> {
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(io_error("read /etc/passwd"))?;
    let ids = passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        match fields.as_slice() {
            ["postgres", _, uid, gid, ..] => Some((uid.parse().ok()?, gid.parse().ok()?)),
            _ => None,
        }
    });
    let Some((uid, gid)) = ids else {
        return Err(ClusterError::Io {
            what: "find the postgres OS user in /etc/passwd".to_owned(),
            source: io::Error::new(io::ErrorKind::NotFound, "no postgres user"),
        });
    };
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
        .map_err(io_error("give the cluster's temp dir to postgres"))
}

/// A loopback port nobody listens on right now.
fn spare_port() -> Result<u16, ClusterError> {
    crate::free_port().map_err(io_error("find a spare port"))
}

fn append(path: &Path, text: &str) -> Result<(), ClusterError> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|source| ClusterError::Io {
            what: format!("open {}", path.display()),
            source,
        })?;
    file.write_all(text.as_bytes())
        .map_err(|source| ClusterError::Io {
            what: format!("write {}", path.display()),
            source,
        })
}

/// SIGKILL to the postmaster named in `data/postmaster.pid`, when
/// `pg_ctl stop` could not stop it: its children exit with it.
fn kill_postmaster(data: &Path) {
    let Ok(pidfile) = std::fs::read_to_string(data.join("postmaster.pid")) else {
        return;
    };
    if let Some(pid) = pidfile.lines().next().filter(|p| p.parse::<u32>().is_ok()) {
        let _ = Command::new("kill").args(["-KILL", pid]).status();
    }
}

fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> ClusterError {
    move |source| ClusterError::Io {
        what: what.to_owned(),
        source,
    }
}

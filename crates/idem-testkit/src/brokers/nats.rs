//! NATS JetStream: the shared local server's address, and a server of a
//! test's own that the test may stop and start again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The shared local server.
pub const URL: &str = "nats://127.0.0.1:4222";

/// A nats-server of the test's own (`-js`, its store in a directory the
/// test keeps), killed on drop even if the test fails: a test that
/// restarts its server disturbs no other test.
pub struct OwnServer {
    child: Option<Child>,
    port: u16,
    store: PathBuf,
    args: Vec<String>,
}

impl OwnServer {
    /// Starts a server on a free port of 127.0.0.1, storing in `store`, and
    /// waits (20 s at most) until it accepts connections.
    pub fn start(store: &Path) -> OwnServer {
        OwnServer::start_with(store, &[])
    }

    /// [`OwnServer::start`] with more of nats-server's flags (`--tls`,
    /// `--tlscert FILE`, `--user`, …).
    pub fn start_with(store: &Path, args: &[&str]) -> OwnServer {
        let port = crate::free_port().unwrap();
        let args = args.iter().map(|a| (*a).to_owned()).collect();
        OwnServer::start_on(port, store, args)
    }

    fn start_on(port: u16, store: &Path, args: Vec<String>) -> OwnServer {
        let child = Command::new(server_binary())
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server runs (set NATS_SERVER to its path)");
        let server = OwnServer {
            child: Some(child),
            port,
            store: store.to_owned(),
            args,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "own nats-server did not answer");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// Where clients reach it.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A clean shutdown (SIGTERM), as a service manager's restart does;
    /// killed if it has not exited within 20 s.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops it (if it runs) and starts it again on the same port and store.
    pub fn restart(&mut self) {
        self.stop();
        *self = OwnServer::start_on(self.port, &self.store.clone(), self.args.clone());
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `NATS_SERVER`, or `nats-server` where packages put it, or on `PATH`.
fn server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NATS_SERVER") {
        return path.into();
    }
    for dir in ["/usr/sbin", "/usr/bin", "/usr/local/bin"] {
        let path = Path::new(dir).join("nats-server");
        if path.exists() {
            return path;
        }
    }
    "nats-server".into()
}

//! NATS JetStream: the shared local server's address, a server of a
//! test's own that the test may stop and start again, and the trust a
//! server in operator mode is configured with (JWTs signed by NKeys and
//! the `.creds` files users present).

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

/// What a nats-server in operator mode trusts, written into a directory:
/// a config file (`-c`) that trusts one operator key and preloads one
/// account, with JetStream, and the `.creds` file of a user of that
/// account; plus the `.creds` file of a user of an account the server
/// does not know. JWTs are signed as nats-server checks them: the
/// `ed25519-nkey` algorithm, the issuer's NKey signing the header and
/// claims.
#[derive(Clone, Debug)]
pub struct Operator {
    /// The server's config: pass `-c` and this path to [`OwnServer::start_with`].
    pub config: PathBuf,
    /// A user the server accepts.
    pub creds: PathBuf,
    /// A user of an account the server does not know.
    pub stranger_creds: PathBuf,
}

impl Operator {
    /// Generates the keys and writes the files into `dir`.
    pub fn write(dir: &Path) -> Operator {
        let operator = nkeys::KeyPair::new_operator();
        let account = nkeys::KeyPair::new_account();
        let payer_jwt = account_jwt(&operator, &account, true);
        // JetStream needs a system account.
        let system = nkeys::KeyPair::new_account();
        let system_jwt = account_jwt(&operator, &system, false);
        let stranger = nkeys::KeyPair::new_account();
        let trust = Operator {
            config: dir.join("operator.conf"),
            creds: dir.join("payer.creds"),
            stranger_creds: dir.join("stranger.creds"),
        };
        std::fs::write(
            &trust.config,
            format!(
                "trusted_keys: [\"{operator}\"]\nsystem_account: {system}\nresolver: MEMORY\n\
                 resolver_preload: {{\n  {account}: \"{payer_jwt}\"\n  \
                 {system}: \"{system_jwt}\"\n}}\n",
                operator = operator.public_key(),
                account = account.public_key(),
                system = system.public_key(),
            ),
        )
        .unwrap();
        std::fs::write(&trust.creds, creds(&account)).unwrap();
        std::fs::write(&trust.stranger_creds, creds(&stranger)).unwrap();
        trust
    }
}

/// An account JWT signed by `operator`, with JetStream unlimited or off.
fn account_jwt(operator: &nkeys::KeyPair, account: &nkeys::KeyPair, jetstream: bool) -> String {
    let storage = if jetstream { -1 } else { 0 };
    let unlimited = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": storage, "disk_storage": storage, "streams": -1, "consumer": -1,
    });
    let nats = serde_json::json!({
        "limits": unlimited,
        "default_permissions": { "pub": {}, "sub": {} },
        "type": "account",
        "version": 2,
    });
    jwt(operator, &account.public_key(), "idem-test", nats)
}

/// A new user of `account`, as a `.creds` file: its JWT and NKey seed.
fn creds(account: &nkeys::KeyPair) -> String {
    let user = nkeys::KeyPair::new_user();
    let nats = serde_json::json!({
        "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
        "type": "user",
        "version": 2,
    });
    let jwt = jwt(account, &user.public_key(), "payer", nats);
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
        user.seed().unwrap()
    )
}

/// A NATS JWT about `subject`, issued and signed by `issuer`.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = b64.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let issued = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "jti": super::unique("jwt"),
        "iat": issued,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let signed = format!("{header}.{}", b64.encode(claims.to_string()));
    let signature = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", b64.encode(signature))
}

//! RabbitMQ: the local broker's address and a plain client that publishes
//! with confirms, takes messages off queues and counts and deletes them.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::tls::Pki;

use crate::services::Service;
use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

/// The local broker.
pub const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A plain client beside the code under test.
pub struct Client {
    connection: Connection,
    channel: Channel,
}

impl Client {
    /// Connects to [`URL`], with publisher confirms on.
    pub async fn connect() -> Client {
        Client::connect_to(URL).await
    }

    /// Connects to the broker at `url` (an [`OwnNode`]'s plain listener),
    /// with publisher confirms on.
    pub async fn connect_to(url: &str) -> Client {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("{}", Service::RabbitMq.missing(url, &e)));
        let channel = connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Client {
            connection,
            channel,
        }
    }

    /// Publishes to `queue` through the default exchange, persistent, and
    /// waits for the broker's confirm.
    pub async fn publish(&self, queue: &str, payload: &[u8], properties: BasicProperties) {
        self.publish_to("", queue, payload, properties).await;
    }

    /// Publishes through `exchange` with `routing_key`, persistent,
    /// mandatory, and waits for the broker's confirm.
    pub async fn publish_to(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirm = self
            .channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                options,
                payload,
                properties.with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert_eq!(
            confirm,
            Confirmation::Ack(None),
            "published to {routing_key}"
        );
    }

    /// Takes one message off `queue`, if there is one.
    pub async fn get(&self, queue: &str) -> Option<BasicGetMessage> {
        self.channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
    }

    /// Every message waiting in `queue`, taken off it.
    pub async fn drain(&self, queue: &str) -> Vec<BasicGetMessage> {
        let mut taken = Vec::new();
        while let Some(m) = self.get(queue).await {
            taken.push(m);
        }
        taken
    }

    /// (ready messages, consumers) of `queue`, which must exist. Messages
    /// a consumer holds unacknowledged are not ready.
    pub async fn declared(&self, queue: &str) -> (u32, u32) {
        let q = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::durable().passive(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (q.message_count(), q.consumer_count())
    }

    /// Deletes one queue, as an operator would, whatever it holds.
    pub async fn delete_queue(&self, name: &str) {
        self.channel
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }

    /// Deletes one exchange.
    pub async fn delete_exchange(&self, name: &str) {
        self.channel
            .exchange_delete(name.into(), ExchangeDeleteOptions::default())
            .await
            .unwrap();
    }

    /// Closes the connection.
    pub async fn close(self) {
        self.connection.close(200, "done".into()).await.unwrap();
    }
}

/// The text headers of a message taken off a queue, by name.
pub fn headers(message: &BasicGetMessage) -> std::collections::BTreeMap<String, String> {
    let Some(table) = message.delivery.properties.headers().as_ref() else {
        return std::collections::BTreeMap::new();
    };
    table
        .inner()
        .iter()
        .filter_map(|(name, value)| {
            let text = match value {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                AMQPValue::ShortString(s) => s.to_string(),
                _ => return None,
            };
            Some((name.to_string(), text))
        })
        .collect()
}

/// The payload of a message taken off a queue, as text.
pub fn body(message: &BasicGetMessage) -> String {
    String::from_utf8_lossy(&message.delivery.data).into_owned()
}

/// The message id of a message taken off a queue.
pub fn message_id(message: &BasicGetMessage) -> Option<String> {
    message
        .delivery
        .properties
        .message_id()
        .as_ref()
        .map(|m| m.as_str().to_owned())
}

/// The local broker's application, stopped (`rabbitmqctl stop_app`) until
/// this is dropped, then started again and awaited, also when the test
/// fails: every later test needs the broker. Only for a test binary of its
/// own, since every test sharing the broker sees the outage.
pub struct Outage;

impl Outage {
    /// Stops the broker's application now.
    pub fn now() -> Outage {
        let status = Command::new("rabbitmqctl")
            .arg("stop_app")
            .status()
            .expect("this test restarts the local RabbitMQ with rabbitmqctl");
        assert!(status.success(), "rabbitmqctl stop_app: {status:?}");
        Outage
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        let started = Command::new("rabbitmqctl").arg("start_app").status();
        let awaited = Command::new("rabbitmqctl")
            .args(["await_startup", "--timeout", "60"])
            .status();
        if !std::thread::panicking() {
            assert!(started.is_ok_and(|s| s.success()), "rabbitmqctl start_app");
            assert!(
                awaited.is_ok_and(|s| s.success()),
                "rabbitmqctl await_startup"
            );
        }
    }
}

/// A RabbitMQ node of the test's own, beside the shared one (its own node
/// name, ports, data and logs in a directory the test keeps): a plain
/// listener for the test's client and a TLS listener presenting
/// [`Pki::cert`] that requires a client certificate signed by [`Pki::ca`].
/// Killed on drop, also when the test fails. Starting takes about 5 s.
/// Its ports are free when chosen; another process may take one before
/// the node binds it, as with [`super::nats::OwnServer`].
pub struct OwnNode {
    child: Option<Child>,
    plain: u16,
    tls: u16,
    name: String,
    home: std::path::PathBuf,
    /// `rabbitmqctl` beside the server script.
    ctl: std::path::PathBuf,
}

impl OwnNode {
    /// Starts the node with its files in `dir` and waits (60 s at most)
    /// until both listeners accept connections. The server is Debian's
    /// `/usr/lib/rabbitmq/bin/rabbitmq-server`, or `RABBITMQ_SERVER`;
    /// `rabbitmqctl` is taken from beside it.
    pub fn start_tls(dir: &Path, pki: &Pki) -> OwnNode {
        let (plain, tls, dist) = (
            crate::free_port().unwrap(),
            crate::free_port().unwrap(),
            crate::free_port().unwrap(),
        );
        let config = dir.join("rabbitmq.conf");
        std::fs::write(
            &config,
            format!(
                "listeners.tcp.default = 127.0.0.1:{plain}\n\
                 listeners.ssl.default = 127.0.0.1:{tls}\n\
                 ssl_options.cacertfile = {ca}\n\
                 ssl_options.certfile = {cert}\n\
                 ssl_options.keyfile = {key}\n\
                 ssl_options.verify = verify_peer\n\
                 ssl_options.fail_if_no_peer_cert = true\n",
                ca = pki.ca.display(),
                cert = pki.cert.display(),
                key = pki.key.display(),
            ),
        )
        .unwrap();
        // No environment file (the shared node's names its node), no
        // plugins (the management plugin's port is the shared node's).
        std::fs::write(dir.join("env.conf"), "").unwrap();
        std::fs::write(dir.join("plugins"), "[].\n").unwrap();
        let server = std::env::var("RABBITMQ_SERVER")
            .unwrap_or_else(|_| "/usr/lib/rabbitmq/bin/rabbitmq-server".to_owned());
        let name = format!("{}@localhost", super::unique("node"));
        // A shell holds the node: it starts the server script and ends
        // when the script does, while a watcher beside it waits for the
        // shell's stdin (a pipe from this process) to close, then kills
        // the Erlang VM, whose command line names the node's home (this
        // directory). The pipe closes on drop and when this process ends,
        // however it ends, so no node outlives its test (the VM ignores
        // the terminal's SIGINT).
        let child = Command::new("sh")
            .arg("-c")
            .arg(
                r#"exec 3<&0
"$0" </dev/null &
server=$!
{ read -r _ <&3; pkill -KILL -f -- "-home $HOME "; } &
wait "$server""#,
            )
            .arg(&server)
            .stdin(Stdio::piped())
            .env("HOME", dir)
            .env("RABBITMQ_CONF_ENV_FILE", dir.join("env.conf"))
            .env("RABBITMQ_NODENAME", &name)
            .env("RABBITMQ_CONFIG_FILE", &config)
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("plugins"))
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_DIST_PORT", dist.to_string())
            .env("RABBITMQ_PID_FILE", dir.join("pid"))
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{server} runs (set RABBITMQ_SERVER to its path): {e}"));
        let node = OwnNode {
            child: Some(child),
            plain,
            tls,
            name: name.clone(),
            home: dir.to_owned(),
            ctl: Path::new(&server).with_file_name("rabbitmqctl"),
        };
        let mut node = node;
        let deadline = Instant::now() + Duration::from_secs(60);
        for port in [plain, tls] {
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                let exited = node
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten());
                assert!(
                    exited.is_none() && Instant::now() < deadline,
                    "own RabbitMQ node {name} did not answer on 127.0.0.1:{port} ({}); its log \
                     is in {}",
                    exited.map_or("still starting".to_owned(), |s| format!("it exited: {s}")),
                    dir.join("log").display()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        node
    }

    /// The plain listener, as `guest`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.plain)
    }

    /// The TLS listener's port on 127.0.0.1.
    pub fn tls_port(&self) -> u16 {
        self.tls
    }

    /// Adds a user with `password` (any characters) and every permission
    /// on the default vhost, through `rabbitmqctl`.
    pub fn add_user(&self, user: &str, password: &str) {
        for args in [
            vec!["add_user", user, password],
            vec!["set_permissions", "-p", "/", user, ".*", ".*", ".*"],
        ] {
            // Debian's /usr/sbin wrapper would run it as the rabbitmq
            // user, whose Erlang cookie is not this node's.
            let out = Command::new(&self.ctl)
                .env("HOME", &self.home)
                .env("RABBITMQ_CONF_ENV_FILE", self.home.join("env.conf"))
                .env("ERL_EPMD_ADDRESS", "127.0.0.1")
                .arg("-n")
                .arg(&self.name)
                .args(&args)
                .output()
                .expect("rabbitmqctl runs");
            assert!(
                out.status.success(),
                "rabbitmqctl {}: {}",
                args[0],
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for OwnNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

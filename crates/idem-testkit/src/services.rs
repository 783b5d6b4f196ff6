//! The services the tests talk to, and the one line a test fails with
//! when one does not answer: the service, the address it tried and the
//! command that starts it.

use std::fmt::Display;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The PostgreSQL server, role and database the tests use unless
/// `IDEM_TEST_POSTGRES_URL` names another: the `postgres` superuser, with a
/// password so that PostgreSQL's default `scram-sha-256` rule for 127.0.0.1
/// lets it in, on database `test`. Defined here only: `scripts/test.sh`
/// reads this line and brings a local server to it (creates the database,
/// gives the role this password when it has none).
pub const POSTGRES_URL_DEFAULT: &str = "postgres://postgres:idem-test@127.0.0.1:5432/test";

/// The PostgreSQL server the tests use: `IDEM_TEST_POSTGRES_URL`, or
/// [`POSTGRES_URL_DEFAULT`]. Fails the test with one line when the server
/// does not answer.
pub fn postgres_url() -> String {
    let url =
        std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| POSTGRES_URL_DEFAULT.to_owned());
    Service::require_postgres(&url);
    url
}

/// A service some tests need running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// PostgreSQL (`IDEM_TEST_POSTGRES_URL`, default [`POSTGRES_URL_DEFAULT`]).
    Postgres,
    /// NATS with JetStream (127.0.0.1:4222).
    Nats,
    /// RabbitMQ (127.0.0.1:5672).
    RabbitMq,
    /// dynalite, a DynamoDB implementation from npm
    /// (`IDEM_TEST_DYNALITE_URL`, default [`DYNALITE_URL_DEFAULT`]).
    Dynalite,
    /// moto in server mode, from PyPI: DynamoDB and SQS on one port
    /// (`IDEM_TEST_MOTO_URL`, default [`MOTO_URL_DEFAULT`]).
    Moto,
}

/// Where `scripts/test.sh` starts dynalite.
pub const DYNALITE_URL_DEFAULT: &str = "http://127.0.0.1:4567";
/// Where `scripts/test.sh` starts moto's server.
pub const MOTO_URL_DEFAULT: &str = "http://127.0.0.1:4568";

impl Service {
    fn name(self) -> &'static str {
        match self {
            Service::Postgres => "PostgreSQL",
            Service::Nats => "NATS",
            Service::RabbitMq => "RabbitMQ",
            Service::Dynalite => "dynalite",
            Service::Moto => "moto",
        }
    }

    /// The command that starts it on a Debian machine where it is
    /// installed.
    fn start(self) -> &'static str {
        match self {
            Service::Postgres => "pg_ctlcluster $(ls /etc/postgresql | tail -n1) main start",
            Service::Nats => "nats-server -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server &",
            Service::RabbitMq => "rabbitmq-server -detached",
            Service::Dynalite => "IDEM_TEST_SERVICES=dynalite bash scripts/test.sh --no-run",
            Service::Moto => "IDEM_TEST_SERVICES=moto bash scripts/test.sh --no-run",
        }
    }

    /// The HTTP endpoint of a DynamoDB emulator (its environment variable,
    /// or its default), after checking that it answers; fails the test
    /// with [`Service::missing`] when it does not. Panics for the services
    /// that are not DynamoDB emulators.
    pub fn endpoint(self) -> String {
        let (var, default) = match self {
            Service::Dynalite => ("IDEM_TEST_DYNALITE_URL", DYNALITE_URL_DEFAULT),
            Service::Moto => ("IDEM_TEST_MOTO_URL", MOTO_URL_DEFAULT),
            other => panic!("{} has no HTTP endpoint", other.name()),
        };
        let url = std::env::var(var).unwrap_or_else(|_| default.to_owned());
        let authority = url
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or_default();
        let (host, port) = authority.rsplit_once(':').unwrap_or((authority, "80"));
        match port.parse() {
            Ok(port) => self.require(host, port),
            Err(_) => panic!("{var}={url:?} names no port"),
        }
        url
    }

    /// The line a test fails with when the service at `addr` did not
    /// answer, `error` being what the client said.
    pub fn missing(self, addr: &str, error: &dyn Display) -> String {
        format!(
            "{} does not answer on {addr} ({error}): start it with `{}`, or run \
             `bash scripts/test.sh`, which installs and starts every service the tests need",
            self.name(),
            self.start()
        )
    }

    /// Panics with [`Service::missing`] unless something accepts a TCP
    /// connection at `host:port` within 2 s.
    pub fn require(self, host: &str, port: u16) {
        let addr = format!("{host}:{port}");
        let reached = addr
            .to_socket_addrs()
            .map_err(|e| e.to_string())
            .and_then(|mut addrs| {
                let first = addrs.next().ok_or("no address".to_owned())?;
                TcpStream::connect_timeout(&first, Duration::from_secs(2))
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = reached {
            panic!("{}", self.missing(&addr, &e));
        }
    }

    /// [`Service::require`] for PostgreSQL where `url` points, as the
    /// client reads it (a URL or `key=value` pairs): the first host and
    /// port, 127.0.0.1:5432 where it names none, or the Unix socket of a
    /// `host=/run/postgresql`-style directory.
    pub fn require_postgres(url: &str) {
        let config: tokio_postgres::Config = match url.parse() {
            Ok(config) => config,
            Err(e) => panic!("IDEM_TEST_POSTGRES_URL={url:?} is not a PostgreSQL URL: {e}"),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Unix(dir)) => {
                let socket = dir.join(format!(".s.PGSQL.{port}"));
                if let Err(e) = std::os::unix::net::UnixStream::connect(&socket) {
                    panic!(
                        "{}",
                        Service::Postgres.missing(&socket.display().to_string(), &e)
                    );
                }
            }
            Some(tokio_postgres::config::Host::Tcp(host)) => Service::Postgres.require(host, port),
            None => Service::Postgres.require("127.0.0.1", port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_service_the_address_and_how_to_start_it() {
        let line = Service::Nats.missing("127.0.0.1:4222", &"connection refused");
        assert!(!line.contains('\n'), "{line}");
        for part in [
            "NATS",
            "127.0.0.1:4222",
            "connection refused",
            "nats-server -a",
            "scripts/test.sh",
        ] {
            assert!(line.contains(part), "{part}: {line}");
        }
    }

    #[test]
    fn a_closed_port_fails_with_that_line() {
        let port = crate::free_port().unwrap_or(1);
        let caught = std::panic::catch_unwind(|| {
            Service::require_postgres(&format!("postgres://postgres@127.0.0.1:{port}/test"))
        });
        let said = caught
            .err()
            .and_then(|e| e.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        assert!(
            said.starts_with(&format!("PostgreSQL does not answer on 127.0.0.1:{port}")),
            "{said}"
        );
        assert!(said.contains("pg_ctlcluster"), "{said}");
    }

    #[test]
    fn a_socket_url_is_checked_at_its_socket_not_at_the_default_port() {
        let dir = tempfile::tempdir().unwrap();
        for url in [
            format!("postgres://postgres@/test?host={}", dir.path().display()),
            format!("host={} port=5433 user=postgres", dir.path().display()),
        ] {
            let panicked = std::panic::catch_unwind(|| Service::require_postgres(&url))
                .expect_err("no server listens in an empty directory");
            let said = panicked
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_default();
            let socket = dir.path().join(".s.PGSQL.");
            assert!(
                said.contains(&socket.display().to_string()),
                "{url}: {said}"
            );
            assert!(
                said.starts_with("PostgreSQL does not answer"),
                "{url}: {said}"
            );
        }
    }
}

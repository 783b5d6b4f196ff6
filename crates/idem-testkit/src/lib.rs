//! Helper processes for idem's black-box tests, and the few definitions the
//! processes and the tests that drive them must agree on.
//!
//! - `crash-writer` (`src/bin/crash-writer.rs`): claims and completes fresh
//!   keys in a SQLite store as fast as it can and reports each commit on
//!   stdout, so a test can kill it at any instant and check the file.
//! - [`relay::Relay`]: a loopback TCP relay that can stop forwarding, to
//!   freeze one client's server (PostgreSQL) without freezing it for all.
//! - [`disk_stall::DiskStall`]: a preload library that makes one process's
//!   `fsync` calls wait, for a real binary's commit stalled on the disk.
//! - [`late_ack::LateAck`]: a store wrapper whose claim answers arrive a
//!   set time after the commit, for the deadline a lease gives a forward.
//! - [`pg_cluster::PgCluster`]: a throwaway PostgreSQL primary and
//!   streaming standby on spare ports, to kill one and promote the other.
//! - [`tls::Pki`] and [`tls::TlsFront`]: a throwaway CA and server
//!   certificate, and a TLS terminator that makes a test upstream `https://`.
//! - [`services`]: the one line a test fails with when a service it
//!   needs does not answer, and the tests' PostgreSQL URL.
//! - [`trap_clock::TrapClock`]: a clock that panics once armed, which
//!   stops the SQLite store that reads it for good.
//! - [`brokers`]: a NATS server of a test's own, a plain RabbitMQ client,
//!   and unique stream and queue names, for the broker adapters' tests and
//!   the consumer's.

pub mod brokers;
pub mod disk_stall;
pub mod late_ack;
pub mod pg_cluster;
pub mod relay;
pub mod services;
pub mod sqs;
pub mod stores;
pub mod tls;
pub mod trap_clock;

/// A loopback port nobody listens on right now, for a process a test
/// starts with its port named in advance.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

use idem_core::Token;

/// The scope every record of `crash-writer` lives in.
pub const CRASH_SCOPE: &str = "crash-writer|tenant-1";

/// One line of `crash-writer`'s stdout: a completion the store confirmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    /// The record's scope.
    pub scope: String,
    /// The record's key.
    pub key: String,
    /// The token it was completed with.
    pub token: Token,
}

impl Committed {
    /// The line as printed, with its newline: `committed <scope> <key> <token>`.
    pub fn line(&self) -> String {
        format!("committed {} {} {}\n", self.scope, self.key, self.token)
    }

    /// Parses a line printed by [`Committed::line`] (newline included or
    /// not); `None` for anything else.
    pub fn parse(line: &str) -> Option<Committed> {
        let mut words = line.trim_end_matches('\n').split(' ');
        let (Some("committed"), Some(scope), Some(key), Some(token), None) = (
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
        ) else {
            return None;
        };
        Some(Committed {
            scope: scope.to_owned(),
            key: key.to_owned(),
            token: Token(token.parse().ok()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_junk_is_refused() {
        let c = Committed {
            scope: CRASH_SCOPE.to_owned(),
            key: "w3-17".to_owned(),
            token: Token(42),
        };
        assert_eq!(c.line(), "committed crash-writer|tenant-1 w3-17 42\n");
        assert_eq!(Committed::parse(&c.line()), Some(c));
        for junk in [
            "",
            "committed a b",
            "committed a b c",
            "committed a b 1 extra",
            "done a b 1",
        ] {
            assert_eq!(Committed::parse(junk), None, "{junk:?}");
        }
    }
}

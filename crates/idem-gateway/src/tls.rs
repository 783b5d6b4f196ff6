//! How the admin listener speaks, for what is mounted on it (a console's
//! cookies may be `Secure` only over TLS). The TLS files themselves are
//! `idem_process::tls`'s.

use idem_process::ServerTls;

/// How the admin listener speaks: what a browser console mounted on it
/// needs to know, since its cookies may be `Secure` only over TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminTransport {
    /// Plain HTTP: keep it on loopback or a private network.
    Plain,
    /// HTTPS, with the certificate of `admin_tls_cert_file`.
    Tls,
}

impl AdminTransport {
    /// The transport of an admin listener with `tls`, or without.
    pub fn of(tls: Option<&ServerTls>) -> AdminTransport {
        match tls {
            Some(_) => AdminTransport::Tls,
            None => AdminTransport::Plain,
        }
    }
}

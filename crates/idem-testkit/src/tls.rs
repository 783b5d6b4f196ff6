//! TLS for black-box tests: a throwaway PKI written as PEM files (a CA, a
//! server certificate it signed for the IP address 127.0.0.1 only, a
//! client certificate it signed, and an unrelated CA) and [`TlsFront`], a TLS terminator on loopback in front of
//! a plain TCP server, so any test upstream becomes an `https://` one.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// PEM files of a throwaway PKI, in one directory.
#[derive(Clone, Debug)]
pub struct Pki {
    /// The CA that signed `cert`.
    pub ca: PathBuf,
    /// A server certificate for `127.0.0.1` (an IP SAN, no DNS name).
    pub cert: PathBuf,
    /// `cert`'s private key.
    pub key: PathBuf,
    /// A client certificate (`idem consume`) the CA signed.
    pub client_cert: PathBuf,
    /// `client_cert`'s private key (PKCS#8).
    pub client_key: PathBuf,
    /// A CA that signed nothing here: trusting it trusts no server.
    pub other_ca: PathBuf,
    /// A private key that matches no certificate here.
    pub other_key: PathBuf,
}

/// A TLS terminator on an ephemeral loopback port that forwards each
/// connection's plain bytes to a target; a failed handshake ends that
/// connection only. Stops when dropped.
pub struct TlsFront {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Pki {
    /// Generates the PKI and writes it into `dir`.
    pub fn write(dir: &Path) -> io::Result<Pki> {
        let ca = issuer("idem test CA")?;
        let other = issuer("idem unrelated CA")?;
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).map_err(other_err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(other_err)?;
        let cert = params.signed_by(&key, &ca).map_err(other_err)?;
        let other_key = KeyPair::generate().map_err(other_err)?;
        let mut client_params = CertificateParams::new(Vec::new()).map_err(other_err)?;
        client_params
            .distinguished_name
            .push(DnType::CommonName, "idem consume");
        client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate().map_err(other_err)?;
        let client = client_params
            .signed_by(&client_key, &ca)
            .map_err(other_err)?;
        let pki = Pki {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            client_cert: dir.join("client-cert.pem"),
            client_key: dir.join("client-key.pem"),
            other_ca: dir.join("other-ca.pem"),
            other_key: dir.join("other-key.pem"),
        };
        std::fs::write(&pki.ca, ca.pem())?;
        std::fs::write(&pki.cert, cert.pem())?;
        std::fs::write(&pki.key, key.serialize_pem())?;
        std::fs::write(&pki.client_cert, client.pem())?;
        std::fs::write(&pki.client_key, client_key.serialize_pem())?;
        std::fs::write(&pki.other_ca, other.pem())?;
        std::fs::write(&pki.other_key, other_key.serialize_pem())?;
        Ok(pki)
    }

    /// A rustls server configuration presenting `cert`.
    pub fn server_config(&self) -> io::Result<ServerConfig> {
        let chain = CertificateDer::pem_file_iter(&self.cert)
            .map_err(other_err)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(other_err)?;
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(other_err)?;
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
            .map_err(other_err)
    }
}

impl TlsFront {
    /// Terminates TLS with `pki`'s server certificate and forwards to `target`.
    pub async fn start(pki: &Pki, target: SocketAddr) -> io::Result<TlsFront> {
        let acceptor = TlsAcceptor::from(Arc::new(pki.server_config()?));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(forward(acceptor.clone(), stream, target));
            }
        });
        Ok(TlsFront { addr, task })
    }

    /// Where clients connect, over TLS.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(acceptor: TlsAcceptor, stream: TcpStream, target: SocketAddr) {
    let Ok(mut tls) = acceptor.accept(stream).await else {
        return;
    };
    let Ok(mut plain) = TcpStream::connect(target).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
}

fn issuer(name: &str) -> io::Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(other_err)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(other_err)?).map_err(other_err)
}

fn other_err(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::other(e)
}

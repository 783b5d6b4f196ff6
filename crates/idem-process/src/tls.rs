//! TLS files for `idem serve` and `idem consume`: the roots an `https://`
//! upstream's or endpoint's certificate must chain to, and the certificate
//! a listener presents. Both are read from PEM files once, when the config
//! is loaded, so that a bad file stops the process before anything starts.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject, SectionKind};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// The largest PEM file read (CA bundle, certificate chain, key), in bytes.
pub const PEM_FILE_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// What an `https://` upstream's certificate is verified against: the
/// system's trusted roots plus those of `upstream_ca_file`. Hostname (or IP
/// address) verification and SNI are always on.
#[derive(Clone)]
pub struct UpstreamTls {
    config: Arc<ClientConfig>,
    roots: usize,
    trust: Arc<str>,
}

/// A listener's certificate chain and private key: the proxy's
/// (`tls_cert_file`) or the admin API's (`admin_tls_cert_file`).
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<ServerConfig>,
}

/// A PEM file that cannot serve: each variant names the file.
#[derive(Debug)]
#[non_exhaustive]
pub enum TlsError {
    /// The file cannot be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is larger than [`PEM_FILE_BYTES_MAX`].
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file holds no PEM section, or a broken one.
    NotPem {
        /// The file.
        path: PathBuf,
        /// What the parser found.
        reason: String,
    },
    /// The file is PEM but holds no `CERTIFICATE` section.
    NoCertificates {
        /// The file.
        path: PathBuf,
    },
    /// The file is PEM but holds no private key section.
    NoKey {
        /// The file.
        path: PathBuf,
    },
    /// rustls refused a certificate or key of the file (not a valid
    /// certificate, a key that does not match the certificate).
    Refused {
        /// The file.
        path: PathBuf,
        /// rustls's reason.
        reason: String,
    },
    /// rustls cannot build a configuration from the ring provider (none of
    /// the safe protocol versions is available).
    Unsupported {
        /// rustls's reason.
        reason: String,
    },
    /// No trusted root at all: the system has none and no CA file adds any.
    NoRoots {
        /// What loading the system's roots reported.
        system: String,
    },
}

impl UpstreamTls {
    /// The system's trusted roots (through `rustls-native-certs`, which
    /// also honours `SSL_CERT_FILE` and `SSL_CERT_DIR`) plus every
    /// certificate of `ca_file`, if given.
    pub fn load(ca_file: Option<&Path>) -> Result<UpstreamTls, TlsError> {
        let mut roots = RootCertStore::empty();
        if let Some(path) = ca_file {
            for cert in certificates(path)? {
                roots.add(cert).map_err(|e| TlsError::Refused {
                    path: path.to_path_buf(),
                    reason: format!("a certificate is not a usable trust anchor: {e}"),
                })?;
            }
        }
        let system = rustls_native_certs::load_native_certs();
        // A broken certificate in the system store is the system's
        // business; the ones that parse still count.
        let (added, _ignored) = roots.add_parsable_certificates(system.certs);
        if roots.is_empty() {
            let errors: Vec<String> = system.errors.iter().map(ToString::to_string).collect();
            return Err(TlsError::NoRoots {
                system: if errors.is_empty() {
                    format!("{added} system certificates found")
                } else {
                    errors.join("; ")
                },
            });
        }
        let mut tls = UpstreamTls::with_roots(roots)?;
        tls.trust = match ca_file {
            Some(path) => format!(
                "the system's roots and upstream_ca_file {}",
                path.file_name().map_or(path.as_os_str(), |n| n).display()
            )
            .into(),
            None => "the system's roots (no upstream_ca_file)".into(),
        };
        Ok(tls)
    }

    /// Only the certificates of `roots`, none of the system's.
    pub fn with_roots(roots: RootCertStore) -> Result<UpstreamTls, TlsError> {
        let count = roots.len();
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Unsupported {
                reason: e.to_string(),
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // `enable_early_data` stays off: with 0-RTT the request could leave
        // before the handshake fails, and a handshake failure would no
        // longer prove it was never sent.
        Ok(UpstreamTls {
            config: Arc::new(config),
            roots: count,
            trust: "the roots given".into(),
        })
    }

    /// The rustls client configuration the proxy's connector uses.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig::clone(&self.config)
    }

    /// The same configuration, shared: what an `https://` lookup trusts.
    pub fn shared_config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }

    /// What a server's certificate is checked against, in words for an
    /// error: `the system's roots and upstream_ca_file ca.pem` (the file's
    /// name only: the error may reach a client).
    pub fn trust(&self) -> Arc<str> {
        self.trust.clone()
    }
}

impl ServerTls {
    /// The certificate chain of `cert_file` (leaf first) and the private
    /// key of `key_file`; refused unless the key matches the leaf.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<ServerTls, TlsError> {
        let chain = certificates(cert_file)?;
        let key = private_key(key_file)?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| TlsError::Refused {
                path: key_file.to_path_buf(),
                reason: format!(
                    "{e} (the key must be the private key of the first certificate of {})",
                    cert_file.display()
                ),
            })?;
        // Both listeners serve HTTP/1.1 only.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(ServerTls {
            config: Arc::new(config),
        })
    }

    /// What runs the listener's handshakes (see `listen`: each in
    /// its connection's own task, under `tls_handshake_timeout_ms`).
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.clone())
    }
}

impl TlsError {
    /// The file at fault, if one is.
    pub fn path(&self) -> Option<&Path> {
        match self {
            TlsError::Read { path, .. }
            | TlsError::TooLarge { path }
            | TlsError::NotPem { path, .. }
            | TlsError::NoCertificates { path }
            | TlsError::NoKey { path }
            | TlsError::Refused { path, .. } => Some(path),
            TlsError::Unsupported { .. } | TlsError::NoRoots { .. } => None,
        }
    }
}

impl fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("roots", &self.roots)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for ServerTls {
    // The key stays out of logs and panics.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::Read { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            TlsError::TooLarge { path } => write!(
                f,
                "{} is larger than {PEM_FILE_BYTES_MAX} bytes; a PEM file is far smaller",
                path.display()
            ),
            TlsError::NotPem { path, reason } => write!(
                f,
                "{} is not a PEM file ({reason}); convert a DER file with \
                 `openssl x509 -inform der -in FILE -out FILE.pem`",
                path.display()
            ),
            TlsError::NoCertificates { path } => write!(
                f,
                "{} holds no certificate (no -----BEGIN CERTIFICATE----- section)",
                path.display()
            ),
            TlsError::NoKey { path } => write!(
                f,
                "{} holds no private key (no -----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY \
                 or EC PRIVATE KEY section)",
                path.display()
            ),
            TlsError::Unsupported { reason } => write!(f, "no TLS configuration: {reason}"),
            TlsError::Refused { path, reason } => write!(f, "{}: {reason}", path.display()),
            TlsError::NoRoots { system } => write!(
                f,
                "no trusted root certificate: the system store gave none ({system}); \
                 install ca-certificates or set upstream_ca_file"
            ),
        }
    }
}

impl std::error::Error for TlsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TlsError::Read { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// ring, explicitly: whatever other crates enable, the gateway never
/// depends on a process-wide default provider being chosen.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate of the PEM file `path`, in order; at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = sections(path)?
        .into_iter()
        .filter(|(kind, _)| *kind == SectionKind::Certificate)
        .map(|(_, der)| CertificateDer::from(der))
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificates {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The first private key of the PEM file `path`.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    sections(path)?
        .into_iter()
        .find_map(|(kind, der)| PrivateKeyDer::from_pem(kind, der))
        .ok_or_else(|| TlsError::NoKey {
            path: path.to_path_buf(),
        })
}

/// The PEM sections of `path`, read within [`PEM_FILE_BYTES_MAX`]; refused
/// when there is none or one is broken.
fn sections(path: &Path) -> Result<Vec<(SectionKind, Vec<u8>)>, TlsError> {
    let read = |source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(PEM_FILE_BYTES_MAX + 1).read_to_end(&mut bytes))
        .map_err(read)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > PEM_FILE_BYTES_MAX {
        return Err(TlsError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let not_pem = |reason: String| TlsError::NotPem {
        path: path.to_path_buf(),
        reason,
    };
    let sections = <(SectionKind, Vec<u8>)>::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, pem::Error>>()
        .map_err(|e| not_pem(e.to_string()))?;
    if sections.is_empty() {
        return Err(not_pem("no -----BEGIN ...----- section".into()));
    }
    Ok(sections)
}

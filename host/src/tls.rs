//! TLS without a proxy (`[tls]`): Herald terminates TLS on the client listener (`https://`,
//! `wss://`) and on node-to-node links itself, with rustls.
//!
//! - **Certificates are files** (PEM): `tls.cert_file` and `tls.key_file`. They are read at
//!   start — a pair that does not load refuses to start, saying why — and read again when
//!   either changes (checked every `tls.reload_check_ms`): new connections get the new
//!   certificate, open ones keep theirs. A new pair that does not load is logged and the one
//!   in use kept, so a half-written renewal never takes the node down.
//! - **Peers verify each other** against `tls.ca_file` (default: the certificates of
//!   `tls.cert_file`), by `tls.peer_server_name` or else the IP address the peer
//!   advertises. Links stay authenticated by `cluster.secret` inside the TLS session.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::TlsConfig;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("tls: cannot read {what} {path}: {reason}")]
    File { what: &'static str, path: PathBuf, reason: String },
    #[error("tls: {path} holds no certificate (PEM \"BEGIN CERTIFICATE\")")]
    NoCertificate { path: PathBuf },
    #[error("tls: the key in {key} cannot be used: {reason}")]
    Key { key: PathBuf, reason: String },
    #[error("tls: the key in {key} does not belong to the certificate in {cert}")]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("tls: {0}")]
    Setup(String),
}

/// The TLS side of a node: an acceptor for its listeners, a connector for its links.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
    peer_server_name: Option<ServerName<'static>>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").field("peer_server_name", &self.peer_server_name).finish_non_exhaustive()
    }
}

impl Tls {
    /// TLS as `config` describes it, `None` when it is off; starts watching the files
    /// (the watch stops once every clone of the returned value is dropped).
    ///
    /// # Errors
    /// [`TlsError`] naming the file or setting that is wrong.
    pub fn from_config(config: &TlsConfig) -> Result<Option<Self>, TlsError> {
        let (Some(cert_file), Some(key_file)) = (&config.cert_file, &config.key_file) else { return Ok(None) };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certificates = Arc::new(Certificates::load(cert_file, key_file, &provider)?);
        let mut server = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Setup(error.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&certificates) as Arc<dyn ResolvesServerCert>);
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let trusted = config.ca_file.as_deref().unwrap_or(cert_file);
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Setup(error.to_string()))?
            .with_root_certificates(roots(trusted)?)
            .with_no_client_auth();
        let peer_server_name = match &config.peer_server_name {
            Some(name) => Some(ServerName::try_from(name.clone()).map_err(|error| {
                TlsError::Setup(format!("tls.peer_server_name {name:?} is not a DNS name or IP address: {error}"))
            })?),
            None => None,
        };
        Certificates::watch(Arc::downgrade(&certificates), Duration::from_millis(config.reload_check_ms));
        Ok(Some(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
            peer_server_name,
        }))
    }

    /// For the listeners: the handshake of an accepted connection.
    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    /// For node-to-node links: the handshake of a link opened to `address`.
    pub fn connector(&self) -> &TlsConnector {
        &self.connector
    }

    /// The name a peer at `address` must prove (its certificate names it).
    pub fn peer_name(&self, address: std::net::SocketAddr) -> ServerName<'static> {
        self.peer_server_name.clone().unwrap_or_else(|| ServerName::IpAddress(address.ip().into()))
    }
}

/// The certificates a peer's must chain to.
fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates(path, "tls.ca_file")? {
        roots.add(certificate).map_err(|error| TlsError::File {
            what: "tls.ca_file",
            path: path.to_owned(),
            reason: format!("a certificate cannot be trusted: {error}"),
        })?;
    }
    Ok(roots)
}

fn read_certificates(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |reason: String| TlsError::File { what, path: path.to_owned(), reason };
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| file_error(error.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| file_error(error.to_string()))?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate { path: path.to_owned() });
    }
    Ok(certificates)
}

/// The certificate in use, and the files it came from.
struct Certificates {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    current: ArcSwap<CertifiedKey>,
    /// The files' modification times and sizes when last read.
    read: Mutex<Stamp>,
}

type Stamp = [Option<(SystemTime, u64)>; 2];

impl fmt::Debug for Certificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificates").field("cert_file", &self.cert_file).field("key_file", &self.key_file).finish()
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl Certificates {
    fn load(cert_file: &Path, key_file: &Path, provider: &Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let stamp = stamp(cert_file, key_file);
        let current = certified_key(cert_file, key_file, provider)?;
        Ok(Self {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            provider: Arc::clone(provider),
            current: ArcSwap::from_pointee(current),
            read: Mutex::new(stamp),
        })
    }

    /// Reads the files again if either changed since last read; keeps the pair in use when
    /// the new one does not load. Returns whether a new pair is now in use.
    fn reload_if_changed(&self) -> bool {
        let now = stamp(&self.cert_file, &self.key_file);
        {
            let mut read = self.read.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if *read == now {
                return false;
            }
            *read = now;
        }
        match certified_key(&self.cert_file, &self.key_file, &self.provider) {
            Ok(key) => {
                self.current.store(Arc::new(key));
                metrics::counter!("herald_tls_reloads_total", "outcome" => "ok").increment(1);
                tracing::info!(cert = %self.cert_file.display(), "tls: certificate reloaded; new connections use it");
                true
            }
            Err(error) => {
                metrics::counter!("herald_tls_reloads_total", "outcome" => "failed").increment(1);
                tracing::error!(%error, "tls: the changed certificate or key does not load; the one in use is kept");
                false
            }
        }
    }

    /// Checks the files every `every` while `certificates` is alive.
    fn watch(certificates: Weak<Self>, every: Duration) {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(certificates) = certificates.upgrade() else { return };
                // File reads and key parsing are blocking work, if short.
                let _ = tokio::task::spawn_blocking(move || certificates.reload_if_changed()).await;
            }
        });
    }
}

fn stamp(cert_file: &Path, key_file: &Path) -> Stamp {
    let of = |path: &Path| {
        fs::metadata(path).ok().map(|meta| (meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len()))
    };
    [of(cert_file), of(key_file)]
}

fn certified_key(cert_file: &Path, key_file: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let chain = read_certificates(cert_file, "tls.cert_file")?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|error| TlsError::File {
        what: "tls.key_file",
        path: key_file.to_owned(),
        reason: match error {
            rustls_pki_types::pem::Error::NoItemsFound => "no private key in it (PEM \"BEGIN PRIVATE KEY\")".into(),
            other => other.to_string(),
        },
    })?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|error| TlsError::Key { key: key_file.to_owned(), reason: error.to_string() })?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|_| TlsError::Mismatch { cert: cert_file.to_owned(), key: key_file.to_owned() })?;
    Ok(certified)
}

//! `[tls]`: TLS terminated by Herald itself, for the client listener (`https://`,
//! `wss://`) and for node-to-node links (`crate::tls`). Off unless both files are set.
//! Checked with the rest in [`Config::validate`](super::Config::validate).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[tls]`: certificate, key and how peers are verified.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// The certificate chain, PEM (the node's certificate first). Read again when it changes.
    pub cert_file: Option<PathBuf>,
    /// The private key of the certificate, PEM (PKCS#8, PKCS#1 or SEC1). Read again when it
    /// changes.
    pub key_file: Option<PathBuf>,
    /// Cluster mode: the certificates (PEM) a node trusts when it opens a link to another
    /// node. Unset: the certificates of `cert_file` (nodes sharing one certificate, or a
    /// chain ending in the cluster's own CA).
    pub ca_file: Option<PathBuf>,
    /// Cluster mode: the name another node's certificate must carry. Unset: the IP address
    /// the node advertises (`cluster.advertise`), which its certificate must then list.
    pub peer_server_name: Option<String>,
    /// How often the files are checked for changes, in ms.
    pub reload_check_ms: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self { cert_file: None, key_file: None, ca_file: None, peer_server_name: None, reload_check_ms: 2_000 }
    }
}

impl TlsConfig {
    /// Whether TLS is on.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some()
    }

    /// Both files or neither, and a check interval.
    ///
    /// # Errors
    /// What is wrong, naming the setting.
    pub fn validate(&self) -> Result<(), String> {
        match (&self.cert_file, &self.key_file) {
            (Some(_), Some(_)) | (None, None) => {}
            (Some(_), None) => return Err("tls.cert_file is set but tls.key_file is not; set both, or neither".into()),
            (None, Some(_)) => return Err("tls.key_file is set but tls.cert_file is not; set both, or neither".into()),
        }
        if !self.enabled() && (self.ca_file.is_some() || self.peer_server_name.is_some()) {
            return Err("tls.ca_file and tls.peer_server_name need tls.cert_file and tls.key_file".into());
        }
        if self.reload_check_ms == 0 {
            return Err("tls.reload_check_ms must be at least 1".into());
        }
        Ok(())
    }
}

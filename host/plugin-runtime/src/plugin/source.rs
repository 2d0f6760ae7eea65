//! Reading a plugin's files: the component's bytes (skipped when the file is unchanged
//! since the serving version read it) and its sidecar manifest, hashed to tell versions
//! apart.

use crate::error::PluginError;
use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// The suffix of a shadow's file stem: `NAME.shadow.wasm`.
pub(crate) const SHADOW: &str = ".shadow";
/// The suffix of a version kept for rollback: `NAME.previous.wasm` (never loaded).
pub(crate) const PREVIOUS: &str = ".previous";
/// The suffix of a version rolled back: `NAME.rejected.wasm` (never loaded).
pub(crate) const REJECTED: &str = ".rejected";

/// A plugin file's bytes and sidecar, read (and hashed) off the hot path.
pub(crate) struct Source {
    pub name: String,
    pub file: PathBuf,
    /// The component bytes; `None` when the file is the one the serving version was read
    /// from, unchanged (see [`FileStamp`]): its compiled code is reused, so the bytes are
    /// neither read nor hashed again.
    pub wasm: Option<Vec<u8>>,
    pub manifest: Option<(PathBuf, String)>,
    /// `sha256:<hex>` of the component bytes.
    pub content_hash: String,
    /// Identifies this exact source (component bytes and manifest text).
    pub fingerprint: String,
    /// The component file's identity when it was read.
    pub stamp: Option<FileStamp>,
}

/// What tells that a file is unchanged without reading it: its device and inode, size, and
/// modification and status-change times. Every write or rename changes the status-change
/// time, and nothing can set it back (unlike the modification time, which `cp -p` or
/// `touch -d` can).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    #[cfg(unix)]
    fn of(meta: &std::fs::Metadata) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        Some(Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }

    /// Elsewhere there is no status-change time to trust: every read reads the bytes.
    #[cfg(not(unix))]
    fn of(_: &std::fs::Metadata) -> Option<Self> {
        None
    }
}

/// A version already read from a file: its stamp then, and its content hash.
pub(crate) type Known<'a> = Option<(&'a FileStamp, &'a str)>;

impl Source {
    /// Reads `NAME.wasm` and, if present, `NAME.toml` beside it — skipping the component's
    /// bytes when the file still has the stamp of `known` (a version read from it before):
    /// a reload after a manifest change reads and hashes only the manifest.
    fn read_known(file: PathBuf, known: Known<'_>) -> Result<Self, PluginError> {
        let name = file
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| PluginError::NotAPluginFile(file.clone()))?
            .to_owned();
        let io = |source| PluginError::Io { path: file.clone(), source };
        let stamp = FileStamp::of(&std::fs::metadata(&file).map_err(io)?);
        let (wasm, content_hash) = match known {
            Some((then, hash)) if stamp.as_ref() == Some(then) => (None, hash.to_owned()),
            _ => {
                let wasm = std::fs::read(&file).map_err(io)?;
                let hash = format!("sha256:{}", hex(&Sha256::digest(&wasm)));
                (Some(wasm), hash)
            }
        };
        let sidecar = file.with_extension("toml");
        let manifest = match std::fs::read_to_string(&sidecar) {
            Ok(text) => Some((sidecar, text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(PluginError::Io { path: sidecar, source }),
        };
        let fingerprint = fingerprint(&content_hash, manifest.as_ref().map(|(_, text)| text.as_str()));
        Ok(Self { name, file, wasm, manifest, content_hash, fingerprint, stamp })
    }

    /// A version given as bytes rather than files (from the plugin registry): `stem` is
    /// `NAME` or `NAME.shadow`, `manifest` the manifest's text (none when empty). Its
    /// `file` names no file; it only labels the version in status and logs.
    pub fn from_bytes(stem: &str, wasm: Vec<u8>, manifest: &str) -> Self {
        let content_hash = format!("sha256:{}", hex(&Sha256::digest(&wasm)));
        let label = PathBuf::from(format!("registry/{stem}.wasm"));
        let manifest = (!manifest.is_empty()).then(|| (label.with_extension("toml"), manifest.to_owned()));
        let fingerprint = fingerprint(&content_hash, manifest.as_ref().map(|(_, text)| text.as_str()));
        Self { name: stem.to_owned(), file: label, wasm: Some(wasm), manifest, content_hash, fingerprint, stamp: None }
    }

    /// [`Source::read_known`] on a blocking thread, knowing no earlier version.
    pub async fn read_off_thread(file: PathBuf) -> Result<Self, PluginError> {
        Self::read_known_off_thread(file, None).await
    }

    /// [`Source::read_known`] on a blocking thread.
    pub async fn read_known_off_thread(file: PathBuf, known: Known<'_>) -> Result<Self, PluginError> {
        let known = known.map(|(stamp, hash)| (stamp.clone(), hash.to_owned()));
        tokio::task::spawn_blocking(move || Self::read_known(file, known.as_ref().map(|(s, h)| (s, h.as_str()))))
            .await
            .map_err(PluginError::Task)?
    }
}

/// What identifies a version: its component's hash and its manifest's text, so a manifest
/// change alone makes a new version.
fn fingerprint(content_hash: &str, manifest: Option<&str>) -> String {
    let mut h = Sha256::new();
    h.update(content_hash.as_bytes());
    if let Some(text) = manifest {
        h.update([0]);
        h.update(text.as_bytes());
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

//! Starts a `herald-relay` process on a free loopback port, for `--compare-relay`: the
//! baseline runs as its own process, like the server it is compared with.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt as _, BufReader},
    process::{Child, Command},
};

/// The line prefix `herald-relay` prints once it listens; the URL follows it.
pub const LISTENING_PREFIX: &str = "herald-relay listening on ";

/// Why the relay could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RelayProcessError {
    /// The executable could not be run.
    #[error("cannot start {path}: {source} (build it with `cargo build --release -p herald-examples`)")]
    Spawn {
        /// The executable.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// It did not say where it listens within the timeout, or said something else.
    #[error("{path} did not report its address: {detail}")]
    NoAddress {
        /// The executable.
        path: PathBuf,
        /// What happened instead.
        detail: String,
    },
}

/// A running relay process; dropping it kills the process.
#[derive(Debug)]
pub struct RelayProcess {
    /// The child, killed on drop.
    _child: Child,
    /// Its WebSocket URL.
    pub url: String,
}

impl RelayProcess {
    /// Runs `path --listen 127.0.0.1:0` and waits (up to 10 s) for the line announcing its
    /// URL.
    ///
    /// # Errors
    ///
    /// [`RelayProcessError`] if it cannot be started or does not announce an address.
    pub async fn start(path: &Path) -> Result<Self, RelayProcessError> {
        let mut child = Command::new(path)
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| RelayProcessError::Spawn { path: path.to_owned(), source })?;
        let no_address = |detail: String| RelayProcessError::NoAddress { path: path.to_owned(), detail };
        let stdout = child.stdout.take().ok_or_else(|| no_address("no stdout".to_owned()))?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .map_err(|_| no_address("timed out after 10s".to_owned()))?
            .map_err(|error| no_address(error.to_string()))?
            .ok_or_else(|| no_address("it exited".to_owned()))?;
        let url = line
            .strip_prefix(LISTENING_PREFIX)
            .ok_or_else(|| no_address(format!("unexpected first line {line:?}")))?
            .trim()
            .to_owned();
        // Keep reading (and discarding) its stdout so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self { _child: child, url })
    }

    /// The `herald-relay` next to the running executable (both are built together).
    pub fn sibling_path() -> Option<PathBuf> {
        let exe = std::env::current_exe().ok()?;
        let name = format!("herald-relay{}", std::env::consts::EXE_SUFFIX);
        Some(exe.with_file_name(name))
    }
}

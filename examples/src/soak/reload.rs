//! Hot reload under traffic: every so often the soak rewrites one plugin's manifest with a
//! new `version` (written to a temporary name, then renamed over `NAME.toml`, so the node
//! never reads half a file), which makes the node's folder watcher load the plugin again,
//! and checks `GET /admin/plugins` until the new version serves.
//!
//! Why the manifest and not the `.wasm`: a node skips a file whose bytes and manifest it
//! already serves, and a changed manifest is the smallest real change; the version is what
//! `/admin/plugins` shows, so the soak sees the reload happen rather than assume it. The
//! original manifest is put back at the end.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value;
use tokio::time::Instant;

use crate::http;

/// How long a reload may take to show in `/admin/plugins`.
const RELOAD_DEADLINE: Duration = Duration::from_secs(20);

/// Why the soak cannot hot-reload.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The folder has no plugin with a manifest to rewrite.
    #[error("no plugin with a manifest (NAME.wasm beside NAME.toml) in {0}")]
    NoPlugin(PathBuf),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The node never showed the new version.
    #[error("plugin {plugin} did not show version {version} in /admin/plugins within {RELOAD_DEADLINE:?}")]
    NotSeen {
        /// The plugin.
        plugin: String,
        /// The version written.
        version: String,
    },
}

/// One plugin the soak reloads again and again.
#[derive(Debug)]
pub struct Reloader {
    /// The plugin's name (`NAME` of `NAME.toml`).
    pub plugin: String,
    /// Its manifest.
    manifest: PathBuf,
    /// The manifest as installed, put back at the end.
    original: String,
    /// The version it names (`0.0.0` when it names none).
    base_version: String,
    /// Reloads made so far.
    count: u64,
    /// The server's `host:port` and admin key, to check a reload.
    authority: String,
    admin_key: String,
}

impl Reloader {
    /// Picks `plugin` in `dir`, or the first plugin there with a manifest (preferring
    /// `room-rate-limit`, which sits on the message path).
    ///
    /// # Errors
    ///
    /// [`ReloadError`] when there is no such plugin or its manifest cannot be read.
    pub fn new(dir: &Path, plugin: Option<&str>, authority: &str, admin_key: &str) -> Result<Self, ReloadError> {
        let has_plugin =
            |name: &str| dir.join(format!("{name}.toml")).is_file() && dir.join(format!("{name}.wasm")).is_file();
        let plugin = match plugin {
            Some(name) if has_plugin(name) => name.to_owned(),
            Some(_) => return Err(ReloadError::NoPlugin(dir.to_path_buf())),
            None if has_plugin("room-rate-limit") => "room-rate-limit".to_owned(),
            None => {
                let entries = std::fs::read_dir(dir).map_err(|source| ReloadError::Io { path: dir.into(), source })?;
                let mut names: Vec<String> = entries
                    .filter_map(Result::ok)
                    .filter_map(|entry| entry.file_name().to_str()?.strip_suffix(".toml").map(str::to_owned))
                    .filter(|name| has_plugin(name))
                    .collect();
                names.sort();
                names.into_iter().next().ok_or_else(|| ReloadError::NoPlugin(dir.to_path_buf()))?
            }
        };
        let manifest = dir.join(format!("{plugin}.toml"));
        let original =
            std::fs::read_to_string(&manifest).map_err(|source| ReloadError::Io { path: manifest.clone(), source })?;
        let base_version = version_of(&original).unwrap_or_else(|| "0.0.0".to_owned());
        Ok(Self {
            plugin,
            manifest,
            original,
            base_version,
            count: 0,
            authority: authority.to_owned(),
            admin_key: admin_key.to_owned(),
        })
    }

    /// Writes the manifest with the next version and waits until the node serves it;
    /// returns how long the node took.
    ///
    /// # Errors
    ///
    /// [`ReloadError`] when the file cannot be written or the node does not show the version.
    pub async fn reload(&mut self) -> Result<Duration, ReloadError> {
        self.count += 1;
        let version = format!("{}+soak.{}", self.base_version, self.count);
        let text = with_version(&self.original, &version);
        self.install(text).await?;
        self.wait_for(&version).await
    }

    /// Puts the original manifest back and waits until its version serves again.
    ///
    /// # Errors
    ///
    /// As [`Reloader::reload`].
    pub async fn restore(&mut self) -> Result<Duration, ReloadError> {
        if self.count == 0 {
            return Ok(Duration::ZERO);
        }
        self.install(self.original.clone()).await?;
        let version = self.base_version.clone();
        self.wait_for(&version).await
    }

    /// Writes `text` to a temporary name beside the manifest and renames it over it.
    async fn install(&self, text: String) -> Result<(), ReloadError> {
        let manifest = self.manifest.clone();
        let written = tokio::task::spawn_blocking(move || {
            let temporary = manifest.with_extension("toml.soak-tmp");
            std::fs::write(&temporary, text)
                .and_then(|()| std::fs::rename(&temporary, &manifest))
                .map_err(|source| ReloadError::Io { path: temporary, source })
        })
        .await;
        written.unwrap_or_else(|error| {
            Err(ReloadError::Io { path: self.manifest.clone(), source: std::io::Error::other(error.to_string()) })
        })
    }

    /// Polls `/admin/plugins` until the plugin serves `version`.
    async fn wait_for(&self, version: &str) -> Result<Duration, ReloadError> {
        let start = Instant::now();
        while start.elapsed() < RELOAD_DEADLINE {
            let answer = http::request(
                &self.authority,
                "GET",
                "/admin/plugins",
                Some(&self.admin_key),
                None,
                Duration::from_secs(5),
            )
            .await;
            if let Ok(response) = answer
                && serving(&response.body, &self.plugin).as_deref() == Some(version)
            {
                return Ok(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(ReloadError::NotSeen { plugin: self.plugin.clone(), version: version.to_owned() })
    }
}

/// The version `/admin/plugins` shows for `plugin`, when it is active.
fn serving(body: &str, plugin: &str) -> Option<String> {
    let answer: Value = serde_json::from_str(body).ok()?;
    let entry = answer["plugins"].as_array()?.iter().find(|entry| entry["name"] == plugin)?;
    (entry["state"] == "active").then(|| entry["version"].as_str().map(str::to_owned))?
}

/// The top-level `version = "…"` of a manifest.
fn version_of(manifest: &str) -> Option<String> {
    top_level(manifest).find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "version").then(|| value.trim().trim_matches('"').to_owned())
    })
}

/// The lines before the first table header: the manifest's top-level keys.
fn top_level(manifest: &str) -> impl Iterator<Item = &str> {
    manifest.lines().take_while(|line| !line.trim_start().starts_with('['))
}

/// The manifest with its top-level `version` set to `version` (added when it has none).
fn with_version(manifest: &str, version: &str) -> String {
    let is_version = |line: &str| line.split_once('=').is_some_and(|(key, _)| key.trim() == "version");
    let top = top_level(manifest).count();
    let mut out = format!("version = \"{version}\"\n");
    for (at, line) in manifest.lines().enumerate() {
        if at < top && is_version(line) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = "# a comment\nname = \"room-rate-limit\"\nversion = \"0.1.0\"\nhooks = [\"message-policy\"]\n\n[config]\nversion = \"keep me\"\n";

    #[test]
    fn the_top_level_version_is_replaced_and_nothing_else() {
        assert_eq!(version_of(MANIFEST).as_deref(), Some("0.1.0"));
        let changed = with_version(MANIFEST, "0.1.0+soak.3");
        assert_eq!(version_of(&changed).as_deref(), Some("0.1.0+soak.3"));
        assert_eq!(changed.matches("version").count(), 2);
        assert!(changed.contains("[config]\nversion = \"keep me\"\n"));
        assert!(changed.contains("name = \"room-rate-limit\"\n"));
        let without = "name = \"x\"\n[config]\n";
        assert_eq!(version_of(without), None);
        assert_eq!(version_of(&with_version(without, "1")).as_deref(), Some("1"));
    }

    #[test]
    fn the_serving_version_is_read_from_admin_plugins() {
        let body = r#"{"plugins":[{"name":"route-key","state":"active","version":"0.1.0"},
            {"name":"room-rate-limit","state":"active","version":"0.1.0+soak.2"}]}"#;
        assert_eq!(serving(body, "room-rate-limit").as_deref(), Some("0.1.0+soak.2"));
        assert_eq!(serving(body, "nope"), None);
        let failed = r#"{"plugins":[{"name":"x","state":"failed","version":"1"}]}"#;
        assert_eq!(serving(failed, "x"), None);
    }
}

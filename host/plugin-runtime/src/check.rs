//! Helpers behind `herald plugin check FILE.wasm` and `herald plugin new NAME`.

use crate::{
    config::{Hook, PluginHostConfig},
    error::PluginError,
    host::PluginHost,
    plugin::{Plugin, Source},
    samples::{SampleRun, run_samples},
};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What `herald plugin check` prints.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// The plugin's name (file stem).
    pub name: String,
    /// Manifest version, `0.0.0` without a manifest.
    pub version: String,
    /// The `herald:plugin` contract version it was built for.
    pub contract_version: String,
    /// `sha256:<hex>` of the component.
    pub content_hash: String,
    /// Exported hooks.
    pub hooks: Vec<Hook>,
    /// Everything it imports.
    pub imports: Vec<String>,
    /// Each hook run once.
    pub samples: Vec<SampleRun>,
}

/// Loads the plugin at `path` (with its `NAME.toml` if present) in a throwaway embedded
/// runtime, checks it against the contract and runs each hook once on sample input.
///
/// # Errors
/// The load error: unreadable file, bad manifest, wrong contract version, forbidden import,
/// no hooks, hooks differing from the manifest, or a failed instantiation.
pub async fn check(path: impl AsRef<Path>) -> Result<CheckReport, PluginError> {
    let source = Source::read_off_thread(path.as_ref().to_path_buf()).await?;
    check_source(source).await
}

/// [`check`] on a component and manifest given as bytes (an upload to the registry):
/// `name` is the plugin's name, `manifest` its TOML text (none when empty).
///
/// # Errors
/// As [`check`].
pub async fn check_bytes(name: &str, wasm: Vec<u8>, manifest: &str) -> Result<CheckReport, PluginError> {
    check_source(Source::from_bytes(name, wasm, manifest)).await
}

async fn check_source(source: Source) -> Result<CheckReport, PluginError> {
    let host = PluginHost::embedded(PluginHostConfig::default())?;
    let plugin = Plugin::load(&host.inner.runtime, source, &host.inner.deps, None, &[]).await?;
    let samples = run_samples(&plugin).await;
    Ok(CheckReport {
        name: plugin.name.to_string(),
        version: plugin.settings.version.clone(),
        contract_version: plugin.contract.version().to_owned(),
        content_hash: plugin.content_hash.clone(),
        hooks: plugin.hooks.clone(),
        imports: plugin.imports.clone(),
        samples,
    })
}

/// Where a scaffolded plugin gets `herald-sdk` from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SdkDependency {
    /// The SDK this binary carries, written into the plugin's folder as `herald-sdk/` and
    /// depended on by relative path: the folder builds wherever it is cloned, offline, with
    /// the host's own contract. The default.
    #[default]
    Bundled,
    /// A folder holding the `herald-sdk` crate (a checkout's `sdk/`).
    Path(PathBuf),
    /// A git repository holding the Herald workspace.
    Git {
        /// Clone URL.
        url: String,
        /// Branch, tag or commit; the default branch when `None`.
        rev: Option<String>,
    },
    /// A registry version requirement.
    Version(String),
}

/// What scaffolded plugins name the bundled SDK's folder.
const BUNDLED_SDK_DIR: &str = "herald-sdk";

impl SdkDependency {
    fn toml(&self) -> String {
        let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
        match self {
            SdkDependency::Bundled => format!("{{ path = {} }}", quote(BUNDLED_SDK_DIR)),
            SdkDependency::Path(p) => format!("{{ path = {} }}", quote(&p.to_string_lossy())),
            SdkDependency::Git { url, rev: Some(rev) } => format!("{{ git = {}, rev = {} }}", quote(url), quote(rev)),
            SdkDependency::Git { url, rev: None } => format!("{{ git = {} }}", quote(url)),
            SdkDependency::Version(v) => quote(v),
        }
    }

    /// Checks that the SDK can be found there, before anything is written: a folder must
    /// hold the `herald-sdk` crate (a relative one is made absolute, as the plugin's
    /// `Cargo.toml` would read it from elsewhere), and a git repository must answer
    /// `git ls-remote`. A registry requirement is left to cargo.
    ///
    /// # Errors
    /// [`ScaffoldError::SdkNotFound`] saying where it looked and what it found.
    pub fn resolve(self) -> Result<Self, ScaffoldError> {
        match self {
            SdkDependency::Path(dir) => {
                let not_found = |why: String| ScaffoldError::SdkNotFound { at: dir.display().to_string(), why };
                let manifest = dir.join("Cargo.toml");
                let text = std::fs::read_to_string(&manifest)
                    .map_err(|e| not_found(format!("cannot read {}: {e}", manifest.display())))?;
                let name = text
                    .parse::<toml::Table>()
                    .ok()
                    .and_then(|t| t.get("package")?.get("name")?.as_str().map(str::to_owned));
                if name.as_deref() != Some("herald-sdk") {
                    return Err(not_found(format!(
                        "{} is not herald-sdk's manifest (package name {name:?}); give the SDK's own folder, \
                         e.g. a Herald checkout's sdk/",
                        manifest.display()
                    )));
                }
                let absolute = dir.canonicalize().map_err(|e| not_found(e.to_string()))?;
                Ok(SdkDependency::Path(absolute))
            }
            SdkDependency::Git { url, rev } => {
                let output = std::process::Command::new("git")
                    .args(["ls-remote", "--exit-code", "--", &url])
                    .stdin(std::process::Stdio::null())
                    .output();
                let why = match output {
                    Ok(out) if out.status.success() => return Ok(SdkDependency::Git { url, rev }),
                    Ok(out) => format!("git ls-remote failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
                    Err(e) => format!("cannot run git: {e}"),
                };
                Err(ScaffoldError::SdkNotFound { at: url, why })
            }
            other => Ok(other),
        }
    }
}

/// Why `scaffold` wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    /// Not a usable crate/plugin name.
    #[error("`{0}` is not a valid plugin name: use 1-64 lowercase letters, digits and `-`, starting with a letter")]
    InvalidName(String),
    /// The target folder exists.
    #[error("{0} already exists; choose another name or folder")]
    Exists(PathBuf),
    /// The SDK is not where it was said to be.
    #[error("herald-sdk not found at {at}: {why}")]
    SdkNotFound {
        /// The path or URL given.
        at: String,
        /// What was found instead.
        why: String,
    },
    /// Writing failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

const LIB_TEMPLATE: &str = r##"//! {{name}}: a Herald plugin. Build with
//! `cargo build --target wasm32-wasip2 --release`, then copy
//! `target/wasm32-wasip2/release/{{crate}}.wasm` and `plugin.toml` into Herald's plugins
//! folder as `{{name}}.wasm` and `{{name}}.toml`.

use herald_sdk::{
    MessagePolicy, config, log,
    types::{Message, MessageDecision, Rejection},
};
use serde::Deserialize;

/// The `[config]` table of the manifest.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Settings {
    /// Words that get a message rejected.
    blocked_words: Vec<String>,
}

static SETTINGS: config::Cached<Settings> = config::Cached::new();

struct Plugin;

impl MessagePolicy for Plugin {
    fn check_message(message: Message) -> MessageDecision {
        let settings = match SETTINGS.get() {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let text = String::from_utf8_lossy(&message.body).to_lowercase();
        if let Some(word) = settings.blocked_words.iter().find(|w| text.contains(w.as_str())) {
            log::info("blocked a message", &[("sender", &message.sender), ("word", word)]);
            return MessageDecision::Reject(Rejection {
                code: "blocked-word".into(),
                reason: format!("messages may not contain `{word}`"),
                retry_after_ms: None,
            });
        }
        MessageDecision::Allow
    }
}

herald_sdk::export_plugin!(Plugin, hooks: [message_policy]);

#[cfg(test)]
mod tests {
    use super::*;
    use herald_sdk::testkit::{self, FakeHost};

    #[test]
    fn blocked_words_are_rejected() {
        let host = FakeHost::new().with_config(r#"blocked_words = ["spam"]"#);
        let decision = Plugin::check_message(testkit::message("alice", "room:lobby", "buy SPAM now"));
        assert!(matches!(decision, MessageDecision::Reject(_)));
        assert_eq!(host.logs().len(), 1);
        let decision = Plugin::check_message(testkit::message("alice", "room:lobby", "hello"));
        assert_eq!(decision, MessageDecision::Allow);
    }
}
"##;

/// Writes a new plugin crate `dir/name` (Cargo.toml, src/lib.rs with a tested
/// message-policy example, and `plugin.toml`) that depends on `herald-sdk` via `sdk`
/// (checked first: see [`SdkDependency::resolve`]; [`SdkDependency::Bundled`] also writes
/// the SDK into the crate's `herald-sdk/`). Returns the crate folder.
///
/// # Errors
/// [`ScaffoldError`] for a bad name, an existing folder, or a failed write.
pub fn scaffold(name: &str, dir: impl AsRef<Path>, sdk: &SdkDependency) -> Result<PathBuf, ScaffoldError> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        return Err(ScaffoldError::InvalidName(name.to_owned()));
    }
    let root = dir.as_ref().join(name);
    if root.exists() {
        return Err(ScaffoldError::Exists(root));
    }
    let sdk = sdk.clone().resolve()?;
    let crate_name = name.replace('-', "_");
    let cargo = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
herald-sdk = {sdk}
serde = {{ version = "1", features = ["derive"] }}

# A crate of its own, not a member of an enclosing workspace.
[workspace]

[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
panic = "abort"
strip = "debuginfo"
"#,
        sdk = sdk.toml()
    );
    let manifest = format!(
        r#"# Install next to the component as {name}.toml in Herald's plugins folder.
name = "{name}"
version = "0.1.0"
hooks = ["message-policy"]
order = 100

[failure]
message-policy = "allow"

[limits]
deadline_ms = 20
memory_mib = 8

[config]
blocked_words = ["spam"]
"#
    );
    let lib = LIB_TEMPLATE.replace("{{name}}", name).replace("{{crate}}", &crate_name);
    let files = [
        (root.join("Cargo.toml"), cargo),
        (root.join("plugin.toml"), manifest),
        (root.join("src").join("lib.rs"), lib),
        (root.join(".gitignore"), "/target\n".to_owned()),
    ];
    for (path, text) in files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|source| ScaffoldError::Io { path: parent.to_path_buf(), source })?;
        }
        std::fs::write(&path, text).map_err(|source| ScaffoldError::Io { path, source })?;
    }
    if sdk == SdkDependency::Bundled {
        let at = root.join(BUNDLED_SDK_DIR);
        crate::bundled_sdk::write_to(&at).map_err(|source| ScaffoldError::Io { path: at, source })?;
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The code of a plugin file, from its first `use` to its export line (without its
    /// doc comment and tests).
    fn plugin_code(text: &str) -> &str {
        let start = text.find("use herald_sdk::").unwrap_or(0);
        let end = text
            .find("herald_sdk::export_plugin!")
            .map_or(text.len(), |at| at + text[at..].find('\n').unwrap_or(text.len() - at));
        &text[start..end]
    }

    #[test]
    fn the_word_filter_test_guest_is_the_template_herald_plugin_new_writes() {
        // The languages test holds Python and JavaScript to this guest's answers, as the
        // Rust word filter a new user gets.
        let guest = include_str!("../tests/guests/word-filter/src/lib.rs");
        assert!(plugin_code(guest).ends_with("herald_sdk::export_plugin!(Plugin, hooks: [message_policy]);"));
        assert_eq!(plugin_code(guest), plugin_code(LIB_TEMPLATE));
    }

    #[test]
    fn scaffold_refuses_bad_names_and_existing_folders() {
        let dir = tempfile::tempdir().ok();
        let dir = dir.as_ref().map_or(Path::new("."), |d| d.path());
        let sdk = SdkDependency::Version("0.1".into());
        assert!(matches!(scaffold("Bad Name", dir, &sdk), Err(ScaffoldError::InvalidName(_))));
        assert!(matches!(scaffold("", dir, &sdk), Err(ScaffoldError::InvalidName(_))));
        let root = scaffold("my-plugin", dir, &sdk).ok();
        assert!(root.as_ref().is_some_and(|r| r.join("src/lib.rs").exists()));
        assert!(matches!(scaffold("my-plugin", dir, &sdk), Err(ScaffoldError::Exists(_))));
        let cargo = std::fs::read_to_string(dir.join("my-plugin/Cargo.toml")).unwrap_or_default();
        assert!(cargo.contains("herald-sdk = \"0.1\""), "{cargo}");
    }

    #[test]
    fn the_default_sdk_is_written_into_the_plugin_and_depended_on_by_relative_path() {
        let dir = tempfile::tempdir().ok();
        let dir = dir.as_ref().map_or(Path::new("."), |d| d.path());
        let root = scaffold("word-filter", dir, &SdkDependency::default()).ok();
        let root = root.as_deref().unwrap_or(Path::new("/nonexistent"));
        let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
        assert!(cargo.contains(r#"herald-sdk = { path = "herald-sdk" }"#), "{cargo}");
        let sdk = std::fs::read_to_string(root.join("herald-sdk/Cargo.toml")).unwrap_or_default();
        assert!(sdk.contains(r#"name = "herald-sdk""#), "{sdk}");
        assert!(root.join("herald-sdk/wit/herald-plugin.wit").exists());
    }

    #[test]
    fn an_sdk_that_cannot_be_found_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().ok();
        let dir = dir.as_ref().map_or(Path::new("."), |d| d.path());
        let missing = SdkDependency::Path(dir.join("no-such-sdk"));
        let error = scaffold("a", dir, &missing).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("herald-sdk not found at") && error.contains("no-such-sdk"), "{error}");
        assert!(!dir.join("a").exists());
        // A folder that is some other crate.
        let other = dir.join("other");
        std::fs::create_dir_all(&other).ok();
        std::fs::write(other.join("Cargo.toml"), "[package]\nname = \"serde\"\n").ok();
        let error = scaffold("b", dir, &SdkDependency::Path(other)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("not herald-sdk's manifest"), "{error}");
        // A git repository that does not answer.
        let git = SdkDependency::Git { url: dir.join("no-repo").display().to_string(), rev: None };
        let error = scaffold("c", dir, &git).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("herald-sdk not found at") && error.contains("no-repo"), "{error}");
        // The SDK folder of this checkout is found.
        let sdk = SdkDependency::Path(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk"));
        assert!(scaffold("d", dir, &sdk).is_ok());
        let cargo = std::fs::read_to_string(dir.join("d/Cargo.toml")).unwrap_or_default();
        assert!(!cargo.contains(".."), "the path is made absolute: {cargo}");
    }
}

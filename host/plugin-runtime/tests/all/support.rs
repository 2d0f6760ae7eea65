//! Builds guest plugins once and sets up hosts over temporary plugin folders; and `poll`,
//! the one way the tests wait for a condition (shared with herald-host's tests).

#[path = "../../../tests/poll/mod.rs"]
pub mod poll;

use herald_plugin_runtime::{
    BuiltinDefaults, Clock, ManualClock, MemoryKv, MemoryLimiter, PluginHost, PluginHostConfig, PluginStatus,
    types::Message,
};
use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, OnceLock},
};

/// Where the built components are.
pub struct Built {
    /// `tests/guests` components.
    pub guests: PathBuf,
    /// First-party components.
    pub first_party: PathBuf,
    /// `plugins/` (for the manifests).
    pub plugins_src: PathBuf,
}

fn cargo_build(manifest: &Path, target_dir: &Path) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--release", "--target", "wasm32-wasip2", "--manifest-path"])
        .arg(manifest)
        .env("CARGO_TARGET_DIR", target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .output()
        .expect("running cargo to build test plugins");
    assert!(
        out.status.success(),
        "building {} for wasm32-wasip2 failed (is the target installed? `rustup target add wasm32-wasip2`):\n{}",
        manifest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds every guest (once per test run).
pub fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = crate_dir.join("../..");
        let target = root.join("target/plugin-guests");
        cargo_build(&crate_dir.join("tests/guests/Cargo.toml"), &target);
        cargo_build(&root.join("plugins/Cargo.toml"), &target);
        let out = target.join("wasm32-wasip2/release");
        Built { guests: out.clone(), first_party: out, plugins_src: root.join("plugins") }
    })
}

/// Copies guest `krate` (its crate name) into `dir` as `name.wasm`, with `manifest`.
pub fn install(dir: &Path, krate: &str, name: &str, manifest: Option<&str>) {
    let b = built();
    let src = b.guests.join(format!("{}.wasm", krate.replace('-', "_")));
    std::fs::copy(&src, dir.join(format!("{name}.wasm"))).expect("copying a test plugin");
    if let Some(m) = manifest {
        std::fs::write(dir.join(format!("{name}.toml")), m).expect("writing a manifest");
    }
}

/// Installs first-party plugin `name` with its shipped manifest, `extra` appended.
pub fn install_first_party(dir: &Path, name: &str, extra: &str) {
    let b = built();
    let wasm = b.first_party.join(format!("{}.wasm", name.replace('-', "_")));
    std::fs::copy(&wasm, dir.join(format!("{name}.wasm"))).expect("copying a first-party plugin");
    let manifest = std::fs::read_to_string(b.plugins_src.join(name).join("plugin.toml")).expect("reading plugin.toml");
    std::fs::write(dir.join(format!("{name}.toml")), format!("{manifest}\n{extra}")).expect("writing manifest");
}

/// A host over a fresh temp folder, with a manual clock shared by KV and limiter.
pub struct TestHost {
    pub host: PluginHost,
    pub dir: tempfile::TempDir,
    pub clock: Arc<ManualClock>,
}

impl TestHost {
    pub fn new(config: PluginHostConfig) -> Self {
        built();
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let c: Arc<dyn Clock> = clock.clone();
        let host = PluginHost::with_clock(
            config,
            Arc::new(MemoryKv::new(c.clone())),
            Arc::new(MemoryLimiter::new(c.clone())),
            Arc::new(BuiltinDefaults),
            c,
        )
        .expect("creating a plugin host");
        Self { host, dir: tempfile::tempdir().expect("temp dir"), clock }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub async fn load(&self) -> Vec<PluginStatus> {
        self.host.load_dir(self.path()).await.expect("loading the plugins folder")
    }

    pub fn status(&self, name: &str) -> PluginStatus {
        self.host.plugin_status(name).unwrap_or_else(|| panic!("no status for {name}"))
    }
}

/// Quarantine off, so failure tests count every call.
pub fn no_quarantine() -> PluginHostConfig {
    let mut c = PluginHostConfig::default();
    c.quarantine.failures = 0;
    c
}

pub fn message(sender: &str, conversation: &str, body: &str) -> Message {
    Message {
        sender: sender.into(),
        sender_device: "d1".into(),
        conversation: conversation.into(),
        kind: 1,
        body: body.as_bytes().to_vec(),
        client_msg_id: "00000000-0000-4000-8000-000000000001".into(),
    }
}

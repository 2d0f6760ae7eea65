//! Errors of loading and managing plugins. Calls never return errors to the host: a failed
//! call is answered by the hook's failure policy and shows in [`crate::PluginStatus`].

use crate::{CONTRACT_VERSION, OLDEST_CONTRACT_VERSION};
use std::path::PathBuf;

/// Why a plugin could not be loaded, reloaded or watched. Every message names the plugin
/// and says what to change.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The sidecar manifest is not valid.
    #[error("plugin manifest {path}: {message}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong, with line and key.
        message: String,
    },
    /// The manifest's `name` differs from the file name.
    #[error("plugin file `{name}.wasm` has a manifest naming it `{manifest_name}`; make them match")]
    NameMismatch {
        /// The file stem.
        name: String,
        /// The manifest's name.
        manifest_name: String,
    },
    /// The file is not a WebAssembly component wasmtime can compile.
    #[error("plugin `{name}` is not a valid WebAssembly component: {message}")]
    Compile {
        /// The plugin.
        name: String,
        /// The compiler's message.
        message: String,
    },
    /// Built against another version of the `herald:plugin` contract.
    #[error(
        "plugin `{name}` was built for herald:plugin@{found}, but this host supports herald:plugin@{OLDEST_CONTRACT_VERSION} to \
         herald:plugin@{supported}; rebuild it against herald-sdk for contract {supported}, or run a newer host"
    )]
    UnsupportedContract {
        /// The plugin.
        name: String,
        /// The contract version the plugin was built for.
        found: String,
        /// The newest version this host supports (it supports every one from 0.1.0 on).
        supported: &'static str,
    },
    /// Imports something outside the sandbox.
    #[error(
        "plugin `{name}` imports `{import}`, which Herald does not provide; a plugin may import only \
         herald:plugin/host@{CONTRACT_VERSION} and the WASI interfaces Rust's wasm32-wasip2 std uses"
    )]
    ImportNotProvided {
        /// The plugin.
        name: String,
        /// The import's name.
        import: String,
    },
    /// A recording that cannot be read or is not of the format.
    #[error("recording {path}: {message}")]
    Recording {
        /// The recording.
        path: PathBuf,
        /// What is wrong, with the line.
        message: String,
    },
    /// Exports none of the hooks.
    #[error(
        "plugin `{name}` exports no Herald hook; export at least one of herald:plugin/{{message-policy, \
         announce-policy, route-key, degrade, connect, deliver-filter}}@{CONTRACT_VERSION} \
         (herald_sdk::export_plugin!)"
    )]
    NoHooks {
        /// The plugin.
        name: String,
    },
    /// Names two contract versions in its imports and exports.
    #[error(
        "plugin `{name}` mixes contract versions herald:plugin@{first} and herald:plugin@{second}; \
         build it against one version of herald-sdk"
    )]
    MixedContracts {
        /// The plugin.
        name: String,
        /// The version named first.
        first: &'static str,
        /// Another version named.
        second: &'static str,
    },
    /// The exports differ from the manifest's `hooks`.
    #[error("plugin `{name}`: its manifest claims hooks [{claimed}] but the component exports [{exported}]")]
    HooksMismatch {
        /// The plugin.
        name: String,
        /// Hooks the manifest lists.
        claimed: String,
        /// Hooks the component exports.
        exported: String,
    },
    /// Asks for more memory than the host allows.
    #[error("plugin `{name}` asks for {asked} MiB of memory; the host allows at most {max} MiB (max_memory_mib)")]
    MemoryCap {
        /// The plugin.
        name: String,
        /// Its `memory_mib`.
        asked: u64,
        /// The host's `max_memory_mib`.
        max: u64,
    },
    /// Linking or the trial instantiation failed.
    #[error("plugin `{name}` cannot be instantiated: {message}")]
    Instantiate {
        /// The plugin.
        name: String,
        /// wasmtime's message.
        message: String,
    },
    /// Warming a version for the registry: its sample call (the one `herald plugin check`
    /// makes) failed on this node, with this node's settings.
    #[error("plugin `{name}`: its sample {hook} call failed while warming: {message}")]
    Warm {
        /// The plugin.
        name: String,
        /// The hook whose call failed.
        hook: String,
        /// Why.
        message: String,
    },
    /// The wasmtime engine could not be configured.
    #[error("plugin engine: {0}")]
    Engine(String),
    /// A reload named a file outside the plugins folder or not ending in `.wasm`/`.toml`.
    #[error("{0} is not a plugin file (expected NAME.wasm or NAME.toml)")]
    NotAPluginFile(PathBuf),
    /// `reload` was called before `load_dir`.
    #[error("no plugins folder loaded yet; call load_dir first")]
    NoDirectory,
    /// The file watcher failed.
    #[error("watching {path} for plugin changes: {source}")]
    Watch {
        /// The folder.
        path: PathBuf,
        /// notify's error.
        #[source]
        source: notify::Error,
    },
    /// The blocking compile task died (it panicked, or the runtime is shutting down).
    #[error("plugin compile task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

//! `herald-plugin-runtime`: runs Herald's policy plugins, WebAssembly components built
//! against the `herald:plugin` contract (`proto/wit/herald-plugin.wit`, ARCHITECTURE.md §4).
//!
//! * **Loading** — [`PluginHost::load_dir`] compiles every `NAME.wasm` in a folder once (on a
//!   blocking thread), checks its imports, exports and contract version against the
//!   contract and its sidecar manifest `NAME.toml` ([`Manifest`]), and pre-instantiates it.
//! * **Calling** — [`PluginHost::message_policy`], [`announce_policy`](PluginHost::announce_policy),
//!   [`route_key`](PluginHost::route_key), [`degrade`](PluginHost::degrade) and
//!   [`connect`](PluginHost::connect) and [`deliver_filter`](PluginHost::deliver_filter) run the hook's plugins in order, each call on an
//!   instance from the plugin's pool (instantiated only when the pool is empty).
//! * **Sandbox** — per-call deadline (epoch interruption), memory and table caps, a cap on
//!   host calls per call, no files, network or environment. A failed call costs only
//!   itself: its instance is dropped, the hook's [`FailurePolicy`] answers, the failure
//!   shows in [`PluginHost::status`], and a plugin failing repeatedly is quarantined.
//! * **Hot reload** — [`PluginHost::reload`], [`reload_file`](PluginHost::reload_file) and
//!   [`watch`](PluginHost::watch) swap versions atomically; calls in flight finish on the old
//!   one; a version that fails to load leaves the old one serving.
//! * **Seams** — KV ([`PluginKv`]), rate limiter ([`RateLimiter`]), built-in defaults
//!   ([`Fallback`]) and [`Clock`] are traits; [`MemoryKv`], [`MemoryLimiter`] and
//!   [`BuiltinDefaults`] serve embedded mode.
//!
//! [`check`] and [`scaffold`] back `herald plugin check` and `herald plugin new`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod bundled_sdk;
mod call;
mod canary;
mod chains;
mod check;
mod clock;
mod compiled;
mod config;
pub mod cpu;
mod engine;
mod error;
mod fallback;
mod host;
mod kv;
mod limiter;
mod manifest;
mod plugin;
mod recording;
mod replay;
mod samples;
mod shadow;
mod state;
mod stats;
mod status;
mod watch;

pub use canary::{CanaryState, CanaryStatus, PromoteError};
pub use check::{CheckReport, ScaffoldError, SdkDependency, check, check_bytes, scaffold};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{
    CanaryPolicy, FailurePolicy, Hook, Limits, PluginHostConfig, PluginOverride, QuarantinePolicy, ShadowPolicy,
};
pub use error::PluginError;
pub use fallback::{BuiltinDefaults, Fallback};
pub use host::{Hold, PluginHost, Prepared};
pub use kv::{KvError, KvLimits, MemoryKv, PluginKv};
pub use limiter::{Limit, LimiterError, MemoryLimiter, RateLimiter};
pub use manifest::{LimitsPatch, Manifest};
pub use recording::{
    CallInput, CallOutput, Header as RecordingHeader, Record, RecordingError, RecordingOptions, RecordingStatus,
};
pub use replay::{Difference, ReplayReport, replay};
pub use samples::SampleRun;
pub use shadow::{ShadowDifferences, ShadowExample, ShadowStatus};
pub use state::LimitHit;
pub use status::{PluginState, PluginStatus};
pub use watch::PluginWatcher;

/// The newest `herald:plugin` contract version this runtime serves. It serves every
/// version from [`OLDEST_CONTRACT_VERSION`] to this one: later versions only add.
pub const CONTRACT_VERSION: &str = herald_plugin_bindings::CONTRACT_VERSION;

/// The oldest contract version this runtime serves.
pub const OLDEST_CONTRACT_VERSION: &str = herald_plugin_bindings::v0_1::CONTRACT_VERSION;

/// The contract's data types, as hooks take and return them.
pub mod types {
    pub use herald_plugin_bindings::herald::plugin::types::{
        Acceptance, AnnounceDecision, Announcement, CommandKind, ConnectDecision, ConnectRequest, Delivery, Health,
        LimitDecision, LogLevel, Message, MessageDecision, Rejection, RouteRequest, Tier,
    };
}

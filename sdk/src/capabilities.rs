//! The plugin's capabilities: thin, typed wrappers over the contract's `host` imports.
//!
//! On `wasm32` each call goes to the host. On native targets the same functions talk to the
//! [`testkit`](crate::testkit)'s fake host of the current thread, so plugin logic runs under
//! plain `cargo test`.

#[cfg(target_arch = "wasm32")]
use crate::__private::bindings::herald::plugin::host as imp;
#[cfg(not(target_arch = "wasm32"))]
use crate::testkit::host as imp;

fn ttl_ms(ttl: Option<std::time::Duration>) -> Option<u64> {
    ttl.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Key/value storage scoped to this plugin, shared by all its instances (and, in cluster
/// mode, all nodes). Keys expire after their TTL; a storage failure fails the hook call
/// (its failure policy applies), so these functions return plain values.
pub mod kv {
    use super::{imp, ttl_ms};
    use std::time::Duration;

    /// The value of `key`, or `None` when absent or expired.
    pub fn get(key: &str) -> Option<Vec<u8>> {
        imp::kv_get(key)
    }

    /// The value of `key` as UTF-8 text (lossy), or `None`.
    pub fn get_string(key: &str) -> Option<String> {
        get(key).map(|v| String::from_utf8_lossy(&v).into_owned())
    }

    /// Stores `value` under `key`, for `ttl` or until deleted when `None`.
    pub fn set(key: &str, value: &[u8], ttl: Option<Duration>) {
        imp::kv_set(key, value, ttl_ms(ttl));
    }

    /// Stores `value` only if `key` is absent; `true` when this call stored it. Atomic
    /// across instances and nodes: use it for "only once" decisions.
    pub fn set_if_absent(key: &str, value: &[u8], ttl: Option<Duration>) -> bool {
        imp::kv_set_if_absent(key, value, ttl_ms(ttl))
    }

    /// Adds `delta` to the integer at `key` (absent counts as 0) and returns the new value.
    /// `ttl` applies when the key is created. A non-integer value fails the hook call.
    pub fn increment(key: &str, delta: i64, ttl: Option<Duration>) -> i64 {
        imp::kv_increment(key, delta, ttl_ms(ttl))
    }

    /// Removes `key`; `true` when it existed.
    pub fn delete(key: &str) -> bool {
        imp::kv_delete(key)
    }
}

/// Token-bucket rate limiting (GCRA), scoped to this plugin and consistent across nodes.
pub mod limiter {
    use super::imp;
    use crate::types::LimitDecision;
    use std::time::Duration;

    /// Takes one token from bucket `key`, refilled at `per_second` tokens per second up to
    /// `burst` tokens. `Ok(())` when allowed, `Err(wait)` with the time until a token is free.
    ///
    /// A minimum interval of 0.4 s between messages is `check(key, 2.5, 1)`.
    /// `per_second` must be positive and finite, or the hook call fails.
    pub fn check(key: &str, per_second: f64, burst: u32) -> Result<(), Duration> {
        match imp::rate_limit(key, per_second, burst) {
            LimitDecision::Allowed => Ok(()),
            LimitDecision::RetryAfterMs(ms) => Err(Duration::from_millis(ms)),
        }
    }

    /// Like [`check`] with the bucket given as a minimum interval between events.
    pub fn min_interval(key: &str, interval: Duration) -> Result<(), Duration> {
        let secs = interval.as_secs_f64();
        if secs <= 0.0 {
            return Ok(());
        }
        check(key, 1.0 / secs, 1)
    }
}

/// The host's clock: the only time a plugin sees (WASI clocks read the same clock).
pub mod clock {
    use super::imp;

    /// Milliseconds since the Unix epoch.
    pub fn now_ms() -> u64 {
        imp::now_ms()
    }
}

/// Structured logging into the host's log, tagged with the plugin's name. Keep it sparse:
/// the host caps how many host calls one hook call may make.
pub mod log {
    use super::imp;
    use crate::types::LogLevel;

    /// Logs `message` with key/value `fields` at `level`.
    pub fn write(level: LogLevel, message: &str, fields: &[(&str, &str)]) {
        let fields: Vec<(String, String)> = fields.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        imp::log(level, message, &fields);
    }

    /// Logs at `debug`.
    pub fn debug(message: &str, fields: &[(&str, &str)]) {
        write(LogLevel::Debug, message, fields);
    }

    /// Logs at `info`.
    pub fn info(message: &str, fields: &[(&str, &str)]) {
        write(LogLevel::Info, message, fields);
    }

    /// Logs at `warn`.
    pub fn warn(message: &str, fields: &[(&str, &str)]) {
        write(LogLevel::Warn, message, fields);
    }

    /// Logs at `error`.
    pub fn error(message: &str, fields: &[(&str, &str)]) {
        write(LogLevel::Error, message, fields);
    }
}

/// Counters the host exports as metrics (`herald_plugin_<name>`).
pub mod counter {
    use super::imp;

    /// Adds `delta` to counter `name`.
    pub fn add(name: &str, delta: u64) {
        imp::counter_add(name, delta);
    }
}

/// The plugin's configuration: the TOML table the operator gave it (manifest `[config]`,
/// overridden by the host's config), fixed for the life of an instance.
pub mod config {
    use serde::de::DeserializeOwned;
    use std::{fmt, marker::PhantomData, sync::Arc};

    /// The configuration as TOML text (empty when none was given).
    pub fn text() -> String {
        super::imp::config()
    }

    /// The configuration parsed into `T` (fields absent from the TOML take `T`'s serde
    /// defaults). Parses on every call; use a [`Cached`] for hot paths.
    ///
    /// # Errors
    /// [`ConfigError`] when the text is not TOML or does not fit `T`.
    pub fn parse<T: DeserializeOwned>() -> Result<T, ConfigError> {
        toml::from_str(&text()).map_err(|e| ConfigError(e.to_string()))
    }

    /// The configuration did not parse; the message says where and why.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct ConfigError(pub String);

    impl fmt::Display for ConfigError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "plugin config: {}", self.0)
        }
    }

    impl std::error::Error for ConfigError {}

    /// A typed configuration parsed once per instance, for use in a `static`:
    ///
    /// ```ignore
    /// static SETTINGS: herald_sdk::config::Cached<Settings> = herald_sdk::config::Cached::new();
    /// let settings = SETTINGS.get()?;
    /// ```
    ///
    /// Under the native test kit it parses on every call, so each test's configuration is
    /// seen.
    pub struct Cached<T> {
        #[cfg(target_arch = "wasm32")]
        cell: std::sync::OnceLock<Result<Arc<T>, ConfigError>>,
        _type: PhantomData<fn() -> T>,
    }

    impl<T> fmt::Debug for Cached<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Cached")
        }
    }

    impl<T: DeserializeOwned> Cached<T> {
        /// An empty cell.
        pub const fn new() -> Self {
            Self {
                #[cfg(target_arch = "wasm32")]
                cell: std::sync::OnceLock::new(),
                _type: PhantomData,
            }
        }

        /// The parsed configuration.
        ///
        /// # Errors
        /// [`ConfigError`] when the configuration does not parse into `T`.
        pub fn get(&self) -> Result<Arc<T>, ConfigError> {
            #[cfg(target_arch = "wasm32")]
            {
                self.cell.get_or_init(|| parse::<T>().map(Arc::new)).clone()
            }
            #[cfg(not(target_arch = "wasm32"))]
            {
                parse::<T>().map(Arc::new)
            }
        }
    }

    impl<T: DeserializeOwned> Default for Cached<T> {
        fn default() -> Self {
            Self::new()
        }
    }
}

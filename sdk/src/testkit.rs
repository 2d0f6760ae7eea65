//! A fake host for native unit tests: in-memory KV with TTL, a GCRA rate limiter, a
//! settable clock, captured logs and counters, and the plugin's config.
//!
//! Each test thread has its own fake host (cargo runs each test on its own thread), so
//! tests do not see each other's state. [`FakeHost::new`] resets it:
//!
//! ```
//! use herald_sdk::{kv, testkit::FakeHost};
//! let host = FakeHost::new().with_config("limit = 3").with_now_ms(1_000);
//! assert!(kv::set_if_absent("k", b"v", Some(std::time::Duration::from_millis(500))));
//! host.advance_ms(500);
//! assert_eq!(kv::get("k"), None); // expired
//! ```
//!
//! Plugin hooks are plain associated functions, so a test calls them directly:
//! `<MyPlugin as MessagePolicy>::check_message(testkit::message("alice", "room:lobby", "hi"))`.

mod recording;

pub use recording::{CallInput, CallOutput, Case, Mismatch, Recording};

use crate::types::{Announcement, CommandKind, Health, LogLevel, Message, RouteRequest};
use std::{cell::RefCell, collections::HashMap};

/// A captured `log` call.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    /// The level it was logged at.
    pub level: LogLevel,
    /// The message.
    pub message: String,
    /// The structured fields, in order.
    pub fields: Vec<(String, String)>,
}

#[derive(Default)]
struct State {
    now_ms: u64,
    config: String,
    kv: HashMap<String, (Vec<u8>, Option<u64>)>,
    buckets: HashMap<String, f64>,
    logs: Vec<LogRecord>,
    counters: HashMap<String, u64>,
}

impl State {
    fn live(&mut self, key: &str) -> Option<&mut (Vec<u8>, Option<u64>)> {
        let now = self.now_ms;
        if self.kv.get(key).is_some_and(|(_, exp)| exp.is_some_and(|e| e <= now)) {
            self.kv.remove(key);
        }
        self.kv.get_mut(key)
    }
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State { now_ms: DEFAULT_NOW_MS, ..State::default() });
}

/// The clock's start value: 2025-01-01T00:00:00Z.
pub const DEFAULT_NOW_MS: u64 = 1_735_689_600_000;

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| f(&mut s.borrow_mut()))
}

/// Handle to this thread's fake host. Creating one resets the fake host; the handle reads
/// and steers it.
#[derive(Debug)]
pub struct FakeHost {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl FakeHost {
    /// Resets this thread's fake host: empty KV, limiter, logs and counters, no config, the
    /// clock at [`DEFAULT_NOW_MS`].
    #[must_use]
    pub fn new() -> Self {
        with(|s| *s = State { now_ms: DEFAULT_NOW_MS, ..State::default() });
        Self { _not_send: std::marker::PhantomData }
    }

    /// Sets the plugin's configuration (TOML text).
    #[must_use]
    pub fn with_config(self, toml: &str) -> Self {
        self.set_config(toml);
        self
    }

    /// Sets the clock.
    #[must_use]
    pub fn with_now_ms(self, now_ms: u64) -> Self {
        self.set_now_ms(now_ms);
        self
    }

    /// Replaces the plugin's configuration (TOML text).
    pub fn set_config(&self, toml: &str) {
        with(|s| s.config = toml.to_owned());
    }

    /// Sets the clock to `now_ms` (milliseconds since the Unix epoch).
    pub fn set_now_ms(&self, now_ms: u64) {
        with(|s| s.now_ms = now_ms);
    }

    /// Moves the clock forward by `ms`.
    pub fn advance_ms(&self, ms: u64) {
        with(|s| s.now_ms = s.now_ms.saturating_add(ms));
    }

    /// The clock's current value.
    pub fn now_ms(&self) -> u64 {
        with(|s| s.now_ms)
    }

    /// A live KV value, bypassing the plugin.
    pub fn kv_get(&self, key: &str) -> Option<Vec<u8>> {
        with(|s| s.live(key).map(|(v, _)| v.clone()))
    }

    /// Every log line the plugin wrote, oldest first.
    pub fn logs(&self) -> Vec<LogRecord> {
        with(|s| s.logs.clone())
    }

    /// The value of counter `name` (0 when never added to).
    pub fn counter(&self, name: &str) -> u64 {
        with(|s| s.counters.get(name).copied().unwrap_or(0))
    }
}

impl Default for FakeHost {
    fn default() -> Self {
        Self::new()
    }
}

/// A sample message from `sender` (device `d1`) to `conversation`, kind 1.
pub fn message(sender: &str, conversation: &str, body: &str) -> Message {
    Message {
        sender: sender.to_owned(),
        sender_device: "d1".to_owned(),
        conversation: conversation.to_owned(),
        kind: 1,
        body: body.as_bytes().to_vec(),
        client_msg_id: "00000000-0000-4000-8000-000000000001".to_owned(),
    }
}

/// A sample announcement to `room`, with an optional id.
pub fn announcement(room: &str, id: Option<&str>, content: &str) -> Announcement {
    Announcement {
        room: room.to_owned(),
        announcement_id: id.map(str::to_owned),
        sender: None,
        content: content.to_owned(),
    }
}

/// A sample route request.
pub fn route_request(command: CommandKind, user: &str, conversation: Option<&str>) -> RouteRequest {
    RouteRequest { command, user: user.to_owned(), conversation: conversation.map(str::to_owned) }
}

/// A healthy node's snapshot: every figure at rest.
pub fn idle_health() -> Health {
    Health {
        connections: 0,
        send_queue_depth_p99: 0,
        send_queue_depth_max: 0,
        store_latency_p99_ms: 0,
        redelivery_ratio: 0.0,
        cpu_load: 0.0,
        errors_per_second: 0.0,
    }
}

/// The fake host's side of the `host` imports, with the generated bindings' signatures.
#[doc(hidden)]
pub mod host {
    use super::{LogRecord, with};
    use crate::types::{LimitDecision, LogLevel};

    pub fn kv_get(key: &str) -> Option<Vec<u8>> {
        with(|s| s.live(key).map(|(v, _)| v.clone()))
    }

    pub fn kv_set(key: &str, value: &[u8], ttl_ms: Option<u64>) {
        with(|s| {
            let exp = ttl_ms.map(|t| s.now_ms.saturating_add(t));
            s.kv.insert(key.to_owned(), (value.to_vec(), exp));
        });
    }

    pub fn kv_set_if_absent(key: &str, value: &[u8], ttl_ms: Option<u64>) -> bool {
        with(|s| {
            if s.live(key).is_some() {
                return false;
            }
            let exp = ttl_ms.map(|t| s.now_ms.saturating_add(t));
            s.kv.insert(key.to_owned(), (value.to_vec(), exp));
            true
        })
    }

    /// # Panics
    /// When the stored value is not an integer (the real host fails the call).
    pub fn kv_increment(key: &str, delta: i64, ttl_ms: Option<u64>) -> i64 {
        with(|s| {
            let now = s.now_ms;
            let current = match s.live(key) {
                Some((v, _)) => std::str::from_utf8(v)
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok())
                    .unwrap_or_else(|| panic!("kv increment: value of `{key}` is not an integer")),
                None => {
                    s.kv.insert(key.to_owned(), (b"0".to_vec(), ttl_ms.map(|t| now.saturating_add(t))));
                    0
                }
            };
            let next = current.saturating_add(delta);
            if let Some(entry) = s.kv.get_mut(key) {
                entry.0 = next.to_string().into_bytes();
            }
            next
        })
    }

    pub fn kv_delete(key: &str) -> bool {
        with(|s| s.live(key).is_some() && s.kv.remove(key).is_some())
    }

    /// # Panics
    /// When `per_second` is not positive and finite (the real host fails the call).
    pub fn rate_limit(key: &str, per_second: f64, burst: u32) -> LimitDecision {
        assert!(
            per_second.is_finite() && per_second > 0.0,
            "rate-limit: per-second must be positive and finite, got {per_second}"
        );
        with(|s| {
            #[allow(clippy::cast_precision_loss)]
            let now = s.now_ms as f64;
            let interval = 1000.0 / per_second;
            let tolerance = interval * f64::from(burst.max(1) - 1);
            let tat = s.buckets.get(key).copied().unwrap_or(now).max(now);
            if tat - now > tolerance {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let wait = (tat - tolerance - now).ceil().max(1.0) as u64;
                LimitDecision::RetryAfterMs(wait)
            } else {
                s.buckets.insert(key.to_owned(), tat + interval);
                LimitDecision::Allowed
            }
        })
    }

    pub fn now_ms() -> u64 {
        with(|s| s.now_ms)
    }

    pub fn log(level: LogLevel, message: &str, fields: &[(String, String)]) {
        with(|s| s.logs.push(LogRecord { level, message: message.to_owned(), fields: fields.to_vec() }));
    }

    pub fn counter_add(name: &str, delta: u64) {
        with(|s| {
            let c = s.counters.entry(name.to_owned()).or_insert(0);
            *c = c.saturating_add(delta);
        });
    }

    pub fn config() -> String {
        with(|s| s.config.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{clock, config, counter, kv, limiter, log};
    use std::time::Duration;

    #[test]
    fn kv_values_expire_after_their_ttl() {
        let host = FakeHost::new();
        kv::set("a", b"1", Some(Duration::from_millis(100)));
        kv::set("b", b"2", None);
        host.advance_ms(99);
        assert_eq!(kv::get("a"), Some(b"1".to_vec()));
        host.advance_ms(1);
        assert_eq!(kv::get("a"), None);
        assert_eq!(kv::get_string("b").as_deref(), Some("2"));
    }

    #[test]
    fn set_if_absent_succeeds_once_until_expiry() {
        let host = FakeHost::new();
        assert!(kv::set_if_absent("id", b"x", Some(Duration::from_secs(1))));
        assert!(!kv::set_if_absent("id", b"y", Some(Duration::from_secs(1))));
        host.advance_ms(1000);
        assert!(kv::set_if_absent("id", b"z", None));
        assert!(kv::delete("id"));
        assert!(!kv::delete("id"));
    }

    #[test]
    fn increment_starts_at_zero_and_keeps_the_first_ttl() {
        let host = FakeHost::new();
        assert_eq!(kv::increment("n", 2, Some(Duration::from_millis(50))), 2);
        assert_eq!(kv::increment("n", 3, None), 5);
        host.advance_ms(50);
        assert_eq!(kv::increment("n", 1, None), 1);
    }

    #[test]
    fn limiter_allows_a_burst_then_paces() {
        let host = FakeHost::new();
        assert_eq!(limiter::check("k", 10.0, 2), Ok(()));
        assert_eq!(limiter::check("k", 10.0, 2), Ok(()));
        assert_eq!(limiter::check("k", 10.0, 2), Err(Duration::from_millis(100)));
        host.advance_ms(60);
        assert_eq!(limiter::check("k", 10.0, 2), Err(Duration::from_millis(40)));
        host.advance_ms(40);
        assert_eq!(limiter::check("k", 10.0, 2), Ok(()));
    }

    #[test]
    fn min_interval_spaces_events() {
        let host = FakeHost::new();
        let gap = Duration::from_millis(400);
        assert_eq!(limiter::min_interval("room", gap), Ok(()));
        host.advance_ms(100);
        assert_eq!(limiter::min_interval("room", gap), Err(Duration::from_millis(300)));
        host.advance_ms(300);
        assert_eq!(limiter::min_interval("room", gap), Ok(()));
    }

    #[test]
    fn clock_logs_counters_and_config_are_captured() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Settings {
            limit: u32,
        }
        let host = FakeHost::new().with_now_ms(42).with_config("limit = 7");
        assert_eq!(clock::now_ms(), 42);
        log::info("hello", &[("room", "lobby")]);
        counter::add("seen", 2);
        counter::add("seen", 1);
        assert_eq!(host.counter("seen"), 3);
        assert_eq!(host.logs()[0].fields, vec![("room".to_owned(), "lobby".to_owned())]);
        assert_eq!(config::parse::<Settings>(), Ok(Settings { limit: 7 }));
        static CACHED: config::Cached<Settings> = config::Cached::new();
        assert_eq!(CACHED.get().map(|s| s.limit), Ok(7));
        host.set_config("limit = \"many\"");
        assert!(config::parse::<Settings>().is_err());
    }
}

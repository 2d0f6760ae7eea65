//! Plugin key/value storage: the [`PluginKv`] seam and its in-memory implementation.
//!
//! Every key lives in a *scope* (the plugin's name), so plugins never see each other's
//! keys. Embedded mode uses [`MemoryKv`]; cluster mode puts Redis behind the same trait (the
//! host's `cluster/plugin_state.rs`) so limits and "only once" marks hold across nodes. Sizes are capped so a plugin cannot
//! exhaust the host's memory through its KV.

use crate::clock::Clock;
use async_trait::async_trait;
use parking_lot::Mutex;
use std::{collections::HashMap, sync::Arc, time::Duration};

/// A KV operation failed; the plugin call that made it traps and its failure policy applies.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum KvError {
    /// The value at the key is not a decimal integer, so it cannot be incremented.
    #[error("kv: value of `{0}` is not an integer, cannot increment it")]
    NotAnInteger(String),
    /// A size cap was hit.
    #[error("kv: {0}")]
    TooLarge(String),
    /// The backing store failed (e.g. Redis unreachable).
    #[error("kv backend: {0}")]
    Backend(String),
}

/// Scoped key/value storage with TTLs and atomic set-if-absent and increment.
#[async_trait]
pub trait PluginKv: Send + Sync + 'static {
    /// The live value of `key`.
    async fn get(&self, scope: &str, key: &str) -> Result<Option<Vec<u8>>, KvError>;
    /// Stores `value`; `ttl` of `None` keeps it until deleted.
    async fn set(&self, scope: &str, key: &str, value: Vec<u8>, ttl: Option<Duration>) -> Result<(), KvError>;
    /// Stores `value` if `key` is absent; `true` when stored. Atomic.
    async fn set_if_absent(
        &self,
        scope: &str,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<bool, KvError>;
    /// Adds `delta` to the integer at `key` (absent = 0, created with `ttl`). Atomic.
    async fn increment(&self, scope: &str, key: &str, delta: i64, ttl: Option<Duration>) -> Result<i64, KvError>;
    /// Removes `key`; `true` when it was live.
    async fn delete(&self, scope: &str, key: &str) -> Result<bool, KvError>;
}

/// Caps for [`MemoryKv`].
#[derive(Debug, Clone, Copy)]
pub struct KvLimits {
    /// Longest key, bytes.
    pub max_key_bytes: usize,
    /// Largest value, bytes.
    pub max_value_bytes: usize,
    /// Most live entries across all scopes.
    pub max_entries: usize,
}

impl KvLimits {
    /// Checks a key, and the value when one is written, against the caps.
    ///
    /// # Errors
    /// [`KvError::TooLarge`] naming the size and the cap.
    pub fn check(&self, key: &str, value: Option<&[u8]>) -> Result<(), KvError> {
        if key.len() > self.max_key_bytes {
            return Err(KvError::TooLarge(format!("key of {} bytes exceeds {}", key.len(), self.max_key_bytes)));
        }
        if let Some(v) = value.filter(|v| v.len() > self.max_value_bytes) {
            return Err(KvError::TooLarge(format!("value of {} bytes exceeds {}", v.len(), self.max_value_bytes)));
        }
        Ok(())
    }
}

impl Default for KvLimits {
    fn default() -> Self {
        Self { max_key_bytes: 1024, max_value_bytes: 64 * 1024, max_entries: 1_000_000 }
    }
}

struct Entry {
    value: Vec<u8>,
    expires_at_ms: Option<u64>,
}

/// In-process [`PluginKv`] for embedded mode: one map, expiry checked on access and swept
/// when the map grows.
pub struct MemoryKv {
    map: Mutex<HashMap<String, Entry>>,
    clock: Arc<dyn Clock>,
    limits: KvLimits,
}

impl std::fmt::Debug for MemoryKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryKv").field("entries", &self.map.lock().len()).finish()
    }
}

fn full_key(scope: &str, key: &str) -> String {
    let mut k = String::with_capacity(scope.len() + 1 + key.len());
    k.push_str(scope);
    k.push('\0');
    k.push_str(key);
    k
}

/// Longest `scope\0key` that [`with_lookup_key`] builds on the stack.
const STACK_KEY_BYTES: usize = 128;

/// Calls `f` with `scope\0key`. Reads and deletes only look the key up, so a short one is
/// built on the stack rather than allocated: a plugin reads its KV on most calls.
fn with_lookup_key<R>(scope: &str, key: &str, f: impl FnOnce(&str) -> R) -> R {
    let len = scope.len() + 1 + key.len();
    if len <= STACK_KEY_BYTES {
        let mut buf = [0u8; STACK_KEY_BYTES];
        buf[..scope.len()].copy_from_slice(scope.as_bytes());
        buf[scope.len() + 1..len].copy_from_slice(key.as_bytes());
        // Two strings joined by NUL are UTF-8, so this check cannot fail.
        if let Ok(k) = std::str::from_utf8(&buf[..len]) {
            return f(k);
        }
    }
    f(&full_key(scope, key))
}

/// The time of one operation, read from the clock at most once and only if the answer
/// depends on it: a key with a TTL, a full store, a TTL to set. Reading a plain key
/// never needs it, and a clock read costs as much as the rest of such a lookup.
struct Now<'a> {
    clock: &'a dyn Clock,
    ms: Option<u64>,
}

impl Now<'_> {
    fn ms(&mut self) -> u64 {
        *self.ms.get_or_insert_with(|| self.clock.now_ms())
    }
}

fn deadline(now: &mut Now<'_>, ttl: Option<Duration>) -> Option<u64> {
    ttl.map(|t| now.ms().saturating_add(u64::try_from(t.as_millis()).unwrap_or(u64::MAX)))
}

impl MemoryKv {
    /// An empty store reading `clock` for TTLs.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_limits(clock, KvLimits::default())
    }

    /// An empty store with explicit caps.
    pub fn with_limits(clock: Arc<dyn Clock>, limits: KvLimits) -> Self {
        Self { map: Mutex::new(HashMap::new()), clock, limits }
    }

    fn check_sizes(&self, key: &str, value: Option<&[u8]>) -> Result<(), KvError> {
        self.limits.check(key, value)
    }

    /// Runs `f` on the map with expired entries of `key` removed, making room first if a
    /// new entry may be added.
    fn with_live<R>(
        &self,
        key: &str,
        f: impl FnOnce(&mut HashMap<String, Entry>, &mut Now<'_>) -> Result<R, KvError>,
    ) -> Result<R, KvError> {
        let mut now = Now { clock: &*self.clock, ms: None };
        let mut map = self.map.lock();
        if map.get(key).and_then(|e| e.expires_at_ms).is_some_and(|x| x <= now.ms()) {
            map.remove(key);
        }
        if map.len() >= self.limits.max_entries && !map.contains_key(key) {
            let now = now.ms();
            map.retain(|_, e| e.expires_at_ms.is_none_or(|x| x > now));
            if map.len() >= self.limits.max_entries {
                return Err(KvError::TooLarge(format!("store holds {} entries, the cap", map.len())));
            }
        }
        f(&mut map, &mut now)
    }
}

#[async_trait]
impl PluginKv for MemoryKv {
    async fn get(&self, scope: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        with_lookup_key(scope, key, |k| self.with_live(k, |m, _| Ok(m.get(k).map(|e| e.value.clone()))))
    }

    async fn set(&self, scope: &str, key: &str, value: Vec<u8>, ttl: Option<Duration>) -> Result<(), KvError> {
        self.check_sizes(key, Some(&value))?;
        let k = full_key(scope, key);
        self.with_live(&k, |m, now| {
            m.insert(k.clone(), Entry { value, expires_at_ms: deadline(now, ttl) });
            Ok(())
        })
    }

    async fn set_if_absent(
        &self,
        scope: &str,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<bool, KvError> {
        self.check_sizes(key, Some(&value))?;
        let k = full_key(scope, key);
        self.with_live(&k, |m, now| {
            if m.contains_key(&k) {
                return Ok(false);
            }
            m.insert(k.clone(), Entry { value, expires_at_ms: deadline(now, ttl) });
            Ok(true)
        })
    }

    async fn increment(&self, scope: &str, key: &str, delta: i64, ttl: Option<Duration>) -> Result<i64, KvError> {
        self.check_sizes(key, None)?;
        let k = full_key(scope, key);
        self.with_live(&k, |m, now| {
            let entry =
                m.entry(k.clone()).or_insert_with(|| Entry { value: b"0".to_vec(), expires_at_ms: deadline(now, ttl) });
            let current = std::str::from_utf8(&entry.value)
                .ok()
                .and_then(|t| t.parse::<i64>().ok())
                .ok_or_else(|| KvError::NotAnInteger(key.to_owned()))?;
            let next = current.saturating_add(delta);
            entry.value = next.to_string().into_bytes();
            Ok(next)
        })
    }

    async fn delete(&self, scope: &str, key: &str) -> Result<bool, KvError> {
        with_lookup_key(scope, key, |k| self.with_live(k, |m, _| Ok(m.remove(k).is_some())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn store() -> (Arc<ManualClock>, MemoryKv) {
        let clock = Arc::new(ManualClock::new(1_000));
        (clock.clone(), MemoryKv::with_limits(clock, KvLimits { max_entries: 3, ..KvLimits::default() }))
    }

    #[tokio::test]
    async fn scopes_do_not_share_keys() {
        let (_, kv) = store();
        kv.set("a", "k", b"1".to_vec(), None).await.ok();
        assert_eq!(kv.get("b", "k").await, Ok(None));
        assert_eq!(kv.get("a", "k").await, Ok(Some(b"1".to_vec())));
    }

    #[tokio::test]
    async fn ttl_expiry_frees_set_if_absent() {
        let (clock, kv) = store();
        assert_eq!(kv.set_if_absent("a", "id", vec![], Some(Duration::from_millis(10))).await, Ok(true));
        assert_eq!(kv.set_if_absent("a", "id", vec![], None).await, Ok(false));
        clock.advance_ms(10);
        assert_eq!(kv.set_if_absent("a", "id", vec![], None).await, Ok(true));
    }

    #[tokio::test]
    async fn increment_counts_and_refuses_text() {
        let (_, kv) = store();
        assert_eq!(kv.increment("a", "n", 5, None).await, Ok(5));
        assert_eq!(kv.increment("a", "n", -2, None).await, Ok(3));
        kv.set("a", "t", b"x".to_vec(), None).await.ok();
        assert!(matches!(kv.increment("a", "t", 1, None).await, Err(KvError::NotAnInteger(_))));
    }

    #[tokio::test]
    async fn the_entry_cap_holds_but_expired_entries_make_room() {
        let (clock, kv) = store();
        for k in ["1", "2", "3"] {
            kv.set("a", k, vec![], Some(Duration::from_millis(5))).await.ok();
        }
        assert!(matches!(kv.set("a", "4", vec![], None).await, Err(KvError::TooLarge(_))));
        clock.advance_ms(5);
        assert_eq!(kv.set("a", "4", vec![], None).await, Ok(()));
        assert_eq!(kv.delete("a", "4").await, Ok(true));
    }
}

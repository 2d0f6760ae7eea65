//! Plugin state in Redis: the cluster implementations of the plugin runtime's two seams,
//! [`PluginKv`] ([`RedisPluginKv`]) and [`RateLimiter`] ([`RedisRateLimiter`]), so that what
//! a plugin remembers and the limits it keeps hold across every node — `room-rate-limit`'s
//! per-room pace, `announce-archive`'s once-only ids, `degrade-tiers`' state.
//!
//! Both behave as their in-process twins, [`MemoryKv`](herald_plugin_runtime::MemoryKv) and
//! [`MemoryLimiter`](herald_plugin_runtime::MemoryLimiter), and are given to the plugin host
//! by [`Plugins::start_with`](crate::plugins::Plugins::start_with).
//!
//! # Keys
//!
//! | key | type | holds | TTL |
//! |---|---|---|---|
//! | `kv:{p:<scope>:<key>}` | string | the value a plugin stored | the plugin's TTL (`PX`), or none |
//! | `limit:{p:<scope>:<key>}` | string | the bucket's theoretical arrival time (GCRA), ms of Redis's clock, as decimal text | until that time: a bucket idle that long is full again, so forgetting it is exact |
//!
//! The scope is the plugin's name; the key is whatever text the plugin chose, so it may hold
//! braces, colons or control characters. Both are escaped (`escape`) before they go into
//! the key: `%`, `{`, `}` and ASCII control characters become `%XX`, and so does `:` in the
//! scope. So the tag is always the whole `{p:…}`, which no plugin can end or reopen, the
//! first raw `:` in it ends the scope (two (scope, key) pairs never share a Redis key), and
//! non-ASCII text passes unchanged. The tag covers (scope, key) rather than the scope alone:
//! every operation touches one key, and a plugin's keys (a limiter bucket per room) then
//! spread over the cluster's slots instead of all landing on the shard of one plugin.
//!
//! # Limits
//!
//! Key and value sizes are capped as in `MemoryKv` ([`KvLimits::max_key_bytes`],
//! [`KvLimits::max_value_bytes`]; limiter keys at 1024 bytes, as in `MemoryLimiter`), checked
//! before Redis is asked, so an oversize write fails with `TooLarge` and writes nothing.
//! [`KvLimits::max_entries`] is *not* enforced: counting the live keys of every plugin
//! would cost a shared counter kept in step with TTL expiry. Redis's own `maxmemory` bounds
//! the store instead (the operator's setting; with `noeviction` a full Redis refuses writes,
//! which reach the plugin as `Backend` errors). Limiter buckets need no cap: each expires
//! when it is full again.
//!
//! # Semantics kept from the in-process twins
//!
//! * `set` without a TTL keeps the value until deleted (and clears an older TTL); with one,
//!   `SET … PX`. A TTL is counted in whole milliseconds, at least 1 (`PX 0` is an error in
//!   Redis), at most [`MAX_TTL_MS`].
//! * `set_if_absent` is `SET … NX [PX]`: of any number of concurrent attempts on every node,
//!   exactly one stores.
//! * `increment` is one script: an absent key is created holding `delta` with the TTL; a
//!   present one keeps its TTL; the sum saturates at `i64`'s bounds; a value that is not a
//!   decimal `i64` (as Rust's `i64::from_str` reads it: optional sign, digits) is
//!   [`KvError::NotAnInteger`] and stays as it was. Redis's `INCRBY` alone would refuse
//!   `+5` or `007`, which `MemoryKv` accepts, so the script first rewrites such a value in
//!   its canonical form (keeping its TTL, `SET … KEEPTTL`: Redis 6.0 or newer).
//! * The limiter is GCRA in one script reading Redis's clock (`TIME`), never a node's, so
//!   nodes whose clocks disagree still share one pace. A bucket allows `burst` calls at
//!   once (0 counts as 1), then one per `1 / per_second`; `RetryAfter` says when the next
//!   token frees up, in whole milliseconds, at least 1. The interval and tolerance are
//!   computed here exactly as `MemoryLimiter` computes them and handed to the script.
//!
//! # Failures and deadlines
//!
//! Every call carries a deadline from [`RedisTimeouts`]: `get` and the limiter's `check` —
//! the calls a policy plugin makes on every send — get `lookup`; the KV writes get `write`.
//! Inside a hook call the plugin's own deadline (`Limits::deadline_ms`, 50 ms by default)
//! bounds every host call as well and is usually the tighter of the two. A call that fails
//! or runs out of time becomes [`KvError::Backend`] or [`LimiterError::Backend`], naming
//! Redis and the step: the plugin call that made it traps, that hook's failure policy
//! answers (`room-rate-limit` lets messages through, the built-in default accepts and
//! archives announcements), and a plugin that keeps failing is quarantined by the runtime's
//! quarantine policy like any failing plugin. A write that ran out of time may still have
//! been applied by Redis; a plugin sees it as failed.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use herald_plugin_runtime::{KvError, KvLimits, Limit, LimiterError, PluginKv, RateLimiter};
use redis::Script;

use super::connection::{RedisConnection, RedisFailure};
use super::{KeyPrefix, RedisTimeouts};

/// The longest TTL written, ms (about 31,000 years): Redis refuses an expiry past the end
/// of its clock, and nothing a plugin could mean lies beyond it.
pub const MAX_TTL_MS: u64 = 1_000_000_000_000_000;

/// Longest limiter key, bytes, as in `MemoryLimiter`.
const MAX_LIMITER_KEY_BYTES: usize = 1024;

/// KEYS[1] the entry; ARGV[1] the delta (canonical decimal i64); ARGV[2] the TTL in ms for
/// a new entry, `''` for none. Returns the new value as text (a Lua number would lose the
/// low digits of a large i64), or false when the value there is not an integer.
static INCREMENT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"local value = redis.call('GET', KEYS[1])
if not value then
  if ARGV[2] == '' then
    redis.call('SET', KEYS[1], ARGV[1])
  else
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  end
  return ARGV[1]
end
local sign, digits = string.match(value, '^([+-]?)(%d+)$')
if not digits then return false end
digits = (string.gsub(digits, '^0+', ''))
if digits == '' then digits = '0' end
local limit = '9223372036854775807'
if sign == '-' then limit = '9223372036854775808' end
if #digits > 19 or (#digits == 19 and digits > limit) then return false end
local canonical = digits
if sign == '-' and digits ~= '0' then canonical = '-' .. digits end
if canonical ~= value then redis.call('SET', KEYS[1], canonical, 'KEEPTTL') end
local sum = redis.pcall('INCRBY', KEYS[1], ARGV[1])
if type(sum) == 'table' and sum.err then
  if string.find(sum.err, 'overflow', 1, true) then
    local bound = '9223372036854775807'
    if string.sub(ARGV[1], 1, 1) == '-' then bound = '-9223372036854775808' end
    redis.call('SET', KEYS[1], bound, 'KEEPTTL')
    return bound
  end
  return redis.error_reply(sum.err)
end
return redis.call('GET', KEYS[1])",
    )
});

/// GCRA. KEYS[1] the bucket; ARGV[1] the emission interval and ARGV[2] the tolerance, ms
/// (decimal text). Takes a token and returns false, or returns how long until one frees up,
/// ms as decimal text (unrounded). The time is Redis's; the arrival time is kept with
/// 17 significant digits, so fractional intervals (1/3 s) do not drift.
static GCRA: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local stored = redis.call('GET', KEYS[1])
local tat = now
if stored then tat = math.max(tonumber(stored) or now, now) end
if tat - now > tolerance then
  return string.format('%.17g', tat - tolerance - now)
end
local arrival = tat + interval
local live = math.min(math.max(math.ceil(arrival - now), 1), 1e15)
redis.call('SET', KEYS[1], string.format('%.17g', arrival), 'PX', string.format('%.0f', live))
return false",
    )
});

/// The cluster plugin KV: one Redis string per (plugin, key).
///
/// Use it in cluster mode, where every node must see what a plugin stored on any of them;
/// embedded mode keeps [`MemoryKv`](herald_plugin_runtime::MemoryKv), which needs no Redis.
pub struct RedisPluginKv {
    /// Shared with the node's other Redis seams.
    redis: RedisConnection,
    /// Names the keys; separates deployments and tests sharing one Redis.
    keys: KeyPrefix,
    /// `get` gets `lookup`; the writes get `write`.
    timeouts: RedisTimeouts,
    /// Key and value caps (`max_entries` is left to Redis's `maxmemory`, see the module doc).
    limits: KvLimits,
}

impl RedisPluginKv {
    /// Plugin KV on `redis`, under `keys`, each call bounded by `timeouts`, sizes capped by
    /// `limits` (pass the same limits as embedded mode's `MemoryKv` gets).
    pub fn new(redis: RedisConnection, keys: KeyPrefix, timeouts: RedisTimeouts, limits: KvLimits) -> Self {
        Self { redis, keys, timeouts, limits }
    }

    /// The Redis key of `key` in `scope`.
    fn entry(&self, scope: &str, key: &str) -> String {
        tagged(&self.keys, "kv:", scope, key)
    }

    /// As `MemoryKv`: the key, and the value when one is written.
    fn check_sizes(&self, key: &str, value: Option<&[u8]>) -> Result<(), KvError> {
        self.limits.check(key, value)
    }

    /// `SET key value [NX] [PX ttl]`; `true` when stored.
    async fn store(
        &self,
        what: &'static str,
        scope: &str,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
        only_if_absent: bool,
    ) -> Result<bool, KvError> {
        self.check_sizes(key, Some(&value))?;
        let mut set = redis::cmd("SET");
        set.arg(self.entry(scope, key)).arg(value);
        if only_if_absent {
            set.arg("NX");
        }
        if let Some(ttl) = ttl {
            set.arg("PX").arg(ttl_ms(ttl));
        }
        let stored: Option<String> = self.redis.query(what, self.timeouts.write, &set).await.map_err(backend)?;
        Ok(stored.is_some())
    }
}

#[async_trait]
impl PluginKv for RedisPluginKv {
    async fn get(&self, scope: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        let mut get = redis::cmd("GET");
        get.arg(self.entry(scope, key));
        self.redis.query("plugin kv get", self.timeouts.lookup, &get).await.map_err(backend)
    }

    async fn set(&self, scope: &str, key: &str, value: Vec<u8>, ttl: Option<Duration>) -> Result<(), KvError> {
        self.store("plugin kv set", scope, key, value, ttl, false).await.map(drop)
    }

    async fn set_if_absent(
        &self,
        scope: &str,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<bool, KvError> {
        self.store("plugin kv set-if-absent", scope, key, value, ttl, true).await
    }

    async fn increment(&self, scope: &str, key: &str, delta: i64, ttl: Option<Duration>) -> Result<i64, KvError> {
        self.check_sizes(key, None)?;
        let mut add = INCREMENT.prepare_invoke();
        add.key(self.entry(scope, key))
            .arg(delta.to_string())
            .arg(ttl.map(ttl_ms).map_or_else(String::new, |ms| ms.to_string()));
        let sum: Option<String> =
            self.redis.invoke("plugin kv increment", self.timeouts.write, &add).await.map_err(backend)?;
        let sum = sum.ok_or_else(|| KvError::NotAnInteger(key.to_owned()))?;
        sum.parse().map_err(|_| KvError::Backend(format!("Redis answered increment with {sum:?}, not an integer")))
    }

    async fn delete(&self, scope: &str, key: &str) -> Result<bool, KvError> {
        let mut delete = redis::cmd("DEL");
        delete.arg(self.entry(scope, key));
        let removed: u64 = self.redis.query("plugin kv delete", self.timeouts.write, &delete).await.map_err(backend)?;
        Ok(removed > 0)
    }
}

/// The cluster plugin rate limiter: one GCRA bucket per (plugin, key) in Redis, paced by
/// Redis's clock.
///
/// Use it in cluster mode, where a limit must hold across nodes (a room's messages reach
/// different owners after a ring change, announcements any node); embedded mode keeps
/// [`MemoryLimiter`](herald_plugin_runtime::MemoryLimiter).
pub struct RedisRateLimiter {
    /// Shared with the node's other Redis seams.
    redis: RedisConnection,
    /// Names the keys; separates deployments and tests sharing one Redis.
    keys: KeyPrefix,
    /// `check` gets `lookup`: it runs on the send path of every rate-limited message.
    timeouts: RedisTimeouts,
}

impl RedisRateLimiter {
    /// A limiter on `redis`, under `keys`, each call bounded by `timeouts.lookup`.
    pub fn new(redis: RedisConnection, keys: KeyPrefix, timeouts: RedisTimeouts) -> Self {
        Self { redis, keys, timeouts }
    }
}

#[async_trait]
impl RateLimiter for RedisRateLimiter {
    async fn check(&self, scope: &str, key: &str, per_second: f64, burst: u32) -> Result<Limit, LimiterError> {
        if !(per_second.is_finite() && per_second > 0.0) {
            return Err(LimiterError::BadRate(per_second.to_string()));
        }
        if key.len() > MAX_LIMITER_KEY_BYTES {
            return Err(LimiterError::TooLarge(format!("key of {} bytes exceeds {MAX_LIMITER_KEY_BYTES}", key.len())));
        }
        // The same arithmetic as MemoryLimiter; the script only adds Redis's clock.
        let interval = 1000.0 / per_second;
        let tolerance = interval * f64::from(burst.max(1) - 1);
        let mut take = GCRA.prepare_invoke();
        // `{:e}` is the shortest text that reads back as the same f64.
        take.key(tagged(&self.keys, "limit:", scope, key)).arg(format!("{interval:e}")).arg(format!("{tolerance:e}"));
        let wait: Option<String> = self
            .redis
            .invoke("plugin rate-limit check", self.timeouts.lookup, &take)
            .await
            .map_err(|failure| LimiterError::Backend(failure.to_string()))?;
        let Some(wait) = wait else { return Ok(Limit::Allowed) };
        let wait: f64 = wait
            .parse()
            .map_err(|_| LimiterError::Backend(format!("Redis answered a rate-limit check with {wait:?}")))?;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let wait = wait.ceil().max(1.0) as u64;
        Ok(Limit::RetryAfter(Duration::from_millis(wait)))
    }
}

fn backend(failure: RedisFailure) -> KvError {
    KvError::Backend(failure.to_string())
}

/// `<prefix><kind>{p:<scope>:<key>}`, both escaped: the hash tag is the whole `{…}`.
fn tagged(keys: &KeyPrefix, kind: &str, scope: &str, key: &str) -> String {
    let mut out = String::with_capacity(keys.as_str().len() + kind.len() + scope.len() + key.len() + 6);
    out.push_str(keys.as_str());
    out.push_str(kind);
    out.push_str("{p:");
    escape(&mut out, scope, true);
    out.push(':');
    escape(&mut out, key, false);
    out.push('}');
    out
}

/// Appends `text` to `out` with `%`, `{`, `}`, ASCII control characters and, if
/// `colon`, `:` written as `%XX` (hex of the byte): what could end or reopen a hash tag,
/// blur where the scope ends, or hide in `redis-cli`. Every escaped character is ASCII, so
/// the rest of the text (any UTF-8) passes unchanged and the encoding reads back uniquely.
fn escape(out: &mut String, text: &str, colon: bool) {
    for character in text.chars() {
        let needs_escape =
            matches!(character, '%' | '{' | '}') || character.is_ascii_control() || (colon && character == ':');
        match u8::try_from(character) {
            Ok(byte) if needs_escape => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push('%');
                out.push(char::from(HEX[usize::from(byte >> 4)]));
                out.push(char::from(HEX[usize::from(byte & 0xF)]));
            }
            _ => out.push(character),
        }
    }
}

/// A TTL as the whole milliseconds `PX` takes: at least 1, at most [`MAX_TTL_MS`].
fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).clamp(1, MAX_TTL_MS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::keys::tests::hash_tag;
    use proptest::prelude::*;

    #[test]
    fn keys_follow_the_layout_and_escape_what_could_break_it() {
        let keys = KeyPrefix::default();
        assert_eq!(
            tagged(&keys, "kv:", "announce-archive", "room:news|a1"),
            "herald:kv:{p:announce-archive:room:news|a1}"
        );
        assert_eq!(
            tagged(&keys, "limit:", "room-rate-limit", "r:room:lobby"),
            "herald:limit:{p:room-rate-limit:r:room:lobby}"
        );
        assert_eq!(tagged(&keys, "kv:", "a:b", "}{%\0é"), "herald:kv:{p:a%3Ab:%7D%7B%25%00é}");
        assert_eq!(hash_tag(&tagged(&keys, "kv:", "p", "x}y")), "p:p:x%7Dy");
    }

    #[test]
    fn ttls_fit_what_redis_takes() {
        assert_eq!(ttl_ms(Duration::ZERO), 1);
        assert_eq!(ttl_ms(Duration::from_micros(1500)), 1);
        assert_eq!(ttl_ms(Duration::from_secs(2)), 2000);
        assert_eq!(ttl_ms(Duration::MAX), MAX_TTL_MS);
    }

    proptest! {
        #[test]
        fn every_key_has_one_tag_and_pairs_never_collide(
            scope in "[a-z:{}%]{0,6}|\\PC{0,6}",
            key in "[a-z:{}%\u{0}]{0,8}|\\PC{0,8}",
            other_scope in "[a-z:{}%]{0,6}",
            other_key in "[a-z:{}%]{0,8}",
        ) {
            let keys = KeyPrefix::default();
            let full = tagged(&keys, "kv:", &scope, &key);
            prop_assert_eq!(full.matches('{').count(), 1, "{}", full);
            prop_assert_eq!(full.matches('}').count(), 1, "{}", full);
            prop_assert!(full.ends_with('}'), "{}", full);
            let tag = hash_tag(&full);
            prop_assert!(tag.starts_with("p:"));
            if (scope.as_str(), key.as_str()) != (other_scope.as_str(), other_key.as_str()) {
                prop_assert_ne!(full, tagged(&keys, "kv:", &other_scope, &other_key));
            }
        }
    }
}

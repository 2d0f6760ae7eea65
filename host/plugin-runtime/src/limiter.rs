//! Plugin rate limiting: the [`RateLimiter`] seam and its in-memory GCRA implementation.
//!
//! The plugin passes the rate and burst on every call (a room rule comes from its config),
//! which is why this is not `governor`: its quotas are fixed per limiter. GCRA keeps one
//! number per bucket (the theoretical arrival time), so a bucket is cheap and a Redis
//! implementation is one small script.

use crate::clock::Clock;
use async_trait::async_trait;
use parking_lot::Mutex;
use std::{collections::HashMap, sync::Arc, time::Duration};

/// The limiter's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// A token was taken.
    Allowed,
    /// Over the limit; a token frees up after this long.
    RetryAfter(Duration),
}

/// A limiter call failed; the plugin call traps and its failure policy applies.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum LimiterError {
    /// `per_second` was not positive and finite.
    #[error("rate-limit: per-second must be positive and finite, got {0}")]
    BadRate(String),
    /// Too many buckets or too long a key.
    #[error("rate-limit: {0}")]
    TooLarge(String),
    /// The backing store failed.
    #[error("rate-limit backend: {0}")]
    Backend(String),
}

/// Token buckets keyed by (scope, key), refilled at a rate given per call.
#[async_trait]
pub trait RateLimiter: Send + Sync + 'static {
    /// Takes one token from the bucket, refilled at `per_second` up to `burst`.
    async fn check(&self, scope: &str, key: &str, per_second: f64, burst: u32) -> Result<Limit, LimiterError>;
}

/// In-process GCRA limiter for embedded mode.
pub struct MemoryLimiter {
    /// Theoretical arrival time per bucket, ms since the epoch (fractional).
    buckets: Mutex<HashMap<String, f64>>,
    clock: Arc<dyn Clock>,
    max_buckets: usize,
}

impl std::fmt::Debug for MemoryLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLimiter").field("buckets", &self.buckets.lock().len()).finish()
    }
}

impl MemoryLimiter {
    /// A limiter reading `clock`, holding at most one million buckets.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_max_buckets(clock, 1_000_000)
    }

    /// A limiter holding at most `max_buckets` live buckets.
    pub fn with_max_buckets(clock: Arc<dyn Clock>, max_buckets: usize) -> Self {
        Self { buckets: Mutex::new(HashMap::new()), clock, max_buckets }
    }
}

#[async_trait]
impl RateLimiter for MemoryLimiter {
    async fn check(&self, scope: &str, key: &str, per_second: f64, burst: u32) -> Result<Limit, LimiterError> {
        if !(per_second.is_finite() && per_second > 0.0) {
            return Err(LimiterError::BadRate(per_second.to_string()));
        }
        if key.len() > 1024 {
            return Err(LimiterError::TooLarge(format!("key of {} bytes exceeds 1024", key.len())));
        }
        #[allow(clippy::cast_precision_loss)]
        let now = self.clock.now_ms() as f64;
        let interval = 1000.0 / per_second;
        let tolerance = interval * f64::from(burst.max(1) - 1);
        let bucket = format!("{scope}\0{key}");
        let mut buckets = self.buckets.lock();
        if buckets.len() >= self.max_buckets && !buckets.contains_key(&bucket) {
            // A bucket whose arrival time has passed is full again: forgetting it is exact.
            buckets.retain(|_, tat| *tat > now);
            if buckets.len() >= self.max_buckets {
                return Err(LimiterError::TooLarge(format!("{} live buckets, the cap", buckets.len())));
            }
        }
        let tat = buckets.get(&bucket).copied().unwrap_or(now).max(now);
        if tat - now > tolerance {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let wait = (tat - tolerance - now).ceil().max(1.0) as u64;
            return Ok(Limit::RetryAfter(Duration::from_millis(wait)));
        }
        buckets.insert(bucket, tat + interval);
        Ok(Limit::Allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[tokio::test]
    async fn burst_then_pacing_with_exact_retry_after() {
        let clock = Arc::new(ManualClock::new(0));
        let l = MemoryLimiter::new(clock.clone());
        assert_eq!(l.check("p", "k", 2.5, 1).await, Ok(Limit::Allowed));
        clock.advance_ms(100);
        assert_eq!(l.check("p", "k", 2.5, 1).await, Ok(Limit::RetryAfter(Duration::from_millis(300))));
        assert_eq!(l.check("q", "k", 2.5, 1).await, Ok(Limit::Allowed), "scopes are separate");
        clock.advance_ms(300);
        assert_eq!(l.check("p", "k", 2.5, 1).await, Ok(Limit::Allowed));
    }

    #[tokio::test]
    async fn bad_rates_are_errors() {
        let l = MemoryLimiter::new(Arc::new(ManualClock::new(0)));
        assert!(l.check("p", "k", 0.0, 1).await.is_err());
        assert!(l.check("p", "k", f64::NAN, 1).await.is_err());
    }

    #[tokio::test]
    async fn full_buckets_are_forgotten_when_the_cap_is_hit() {
        let clock = Arc::new(ManualClock::new(0));
        let l = MemoryLimiter::with_max_buckets(clock.clone(), 2);
        assert_eq!(l.check("p", "a", 10.0, 1).await, Ok(Limit::Allowed));
        assert_eq!(l.check("p", "b", 10.0, 1).await, Ok(Limit::Allowed));
        assert!(l.check("p", "c", 10.0, 1).await.is_err());
        clock.advance_ms(100);
        assert_eq!(l.check("p", "c", 10.0, 1).await, Ok(Limit::Allowed));
    }
}

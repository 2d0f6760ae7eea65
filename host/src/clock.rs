//! Wall-clock time behind a trait, so tests can step the clock back or freeze it.
//!
//! Durations and timers use `tokio::time` (pausable in tests); only code that needs the
//! calendar time (snowflake ids, `sent_at_ms`) asks a [`WallClock`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, as the wall clock says right now. It may step back.
pub trait WallClock: Send + Sync + 'static {
    /// The current wall time in ms since 1970-01-01T00:00:00Z.
    fn now_ms(&self) -> u64;
}

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that tests move by hand. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
    /// When non-zero, every read advances the clock by 1 ms after this many reads, so code
    /// that waits for the clock to tick makes progress without a test thread driving it.
    tick_every: u64,
    reads: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock frozen at `now_ms` until [`set`](Self::set) or [`advance`](Self::advance).
    pub fn new(now_ms: u64) -> Self {
        Self { now_ms: Arc::new(AtomicU64::new(now_ms)), tick_every: 0, reads: Arc::default() }
    }

    /// A clock that moves forward 1 ms every `reads` reads.
    pub fn ticking(now_ms: u64, reads: u64) -> Self {
        Self { tick_every: reads, ..Self::new(now_ms) }
    }

    /// Jumps to `now_ms`, forwards or backwards.
    pub fn set(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }

    /// Moves forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Steps back by `ms` (saturating at zero).
    pub fn step_back(&self, ms: u64) {
        let now = self.now_ms.load(Ordering::SeqCst);
        self.now_ms.store(now.saturating_sub(ms), Ordering::SeqCst);
    }
}

impl WallClock for ManualClock {
    fn now_ms(&self) -> u64 {
        if self.tick_every > 0 && self.reads.fetch_add(1, Ordering::Relaxed).is_multiple_of(self.tick_every) {
            return self.now_ms.fetch_add(1, Ordering::SeqCst) + 1;
        }
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// A wall clock that runs with tokio's clock from a time the test sets, and that the test
/// can step. Under a paused runtime (`tokio::time::pause`) code that sleeps until the wall
/// clock passes some time finishes at once, and sees the clock move just as far as it
/// slept; unpaused it runs in real time.
#[derive(Debug, Clone)]
pub struct TokioClock {
    /// Where tokio's clock stood when this clock was made.
    origin: tokio::time::Instant,
    /// The wall time this clock read at `origin` (moved by [`set`](Self::set)).
    at_origin_ms: Arc<AtomicU64>,
}

impl TokioClock {
    /// A clock reading `now_ms` now, and moving with tokio's clock from here.
    pub fn new(now_ms: u64) -> Self {
        Self { origin: tokio::time::Instant::now(), at_origin_ms: Arc::new(AtomicU64::new(now_ms)) }
    }

    /// Jumps to `now_ms`, forwards or backwards; it goes on running from there.
    pub fn set(&self, now_ms: u64) {
        self.at_origin_ms.store(now_ms.saturating_sub(self.elapsed_ms()), Ordering::SeqCst);
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

impl WallClock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.at_origin_ms.load(Ordering::SeqCst).saturating_add(self.elapsed_ms())
    }
}

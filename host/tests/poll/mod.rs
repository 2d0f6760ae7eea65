//! Waiting for a condition instead of sleeping a fixed time. A test that sleeps "long
//! enough" for something to happen passes or fails by the machine's speed; one that polls
//! for the thing passes as soon as it holds and fails, naming it and what it last saw,
//! only when it never does.
//!
//! One helper for every test that waits: `herald-host`'s unit tests (through `testkit`), its
//! integration tests (through `support`) and the plugin runtime's (through their `support`),
//! each including this file by path. A fixed sleep is left only where it paces load or
//! holds a window in which something must *not* happen.
//!
//! ```ignore
//! let status = poll::until("the shadow compared both calls", async || {
//!     let status = status(&herald).await;
//!     if status["compared"] == 2 { Ok(status) } else { Err(status) }
//! })
//! .await;
//! ```

#![allow(dead_code, reason = "each including crate uses what it needs")]

use std::fmt::Display;
use std::time::Duration;

/// How long a condition may take before the test fails: far beyond what a healthy run
/// needs on a loaded machine, so only a condition that never holds reaches it.
pub const WITHIN: Duration = Duration::from_secs(10);

/// How often a condition is checked when the caller does not say.
pub const EVERY: Duration = Duration::from_millis(10);

/// What a check answers: `true`, `Some(value)` or `Ok(value)` once the condition holds;
/// `false`, `None` or `Err(what it saw)` while it does not (the failure shows the last).
pub trait Check {
    type Value;
    fn holds(self) -> Result<Self::Value, String>;
}

impl Check for bool {
    type Value = ();
    fn holds(self) -> Result<(), String> {
        if self { Ok(()) } else { Err("the condition did not hold".to_owned()) }
    }
}

impl<T> Check for Option<T> {
    type Value = T;
    fn holds(self) -> Result<T, String> {
        self.ok_or_else(|| "nothing yet".to_owned())
    }
}

impl<T, E: Display> Check for Result<T, E> {
    type Value = T;
    fn holds(self) -> Result<T, String> {
        self.map_err(|seen| seen.to_string())
    }
}

/// How long to wait and how often to look.
#[derive(Debug, Clone, Copy)]
pub struct Poll {
    within: Duration,
    every: Duration,
}

impl Default for Poll {
    fn default() -> Self {
        Self { within: WITHIN, every: EVERY }
    }
}

/// A poll with the defaults ([`WITHIN`], [`EVERY`]), to adjust before waiting.
pub fn poll() -> Poll {
    Poll::default()
}

/// Polls `check` every [`EVERY`] until it holds and returns what it found; panics after
/// [`WITHIN`], naming `what` and what `check` last saw.
pub async fn until<C: Check>(what: &str, check: impl AsyncFnMut() -> C) -> C::Value {
    poll().until(what, check).await
}

impl Poll {
    /// Waits at most `within` (a condition that needs a lease to lapse, say, on top of
    /// [`WITHIN`]).
    pub fn within(self, within: Duration) -> Self {
        Self { within, ..self }
    }

    /// Looks every `every`: slower for a check that costs (a query, a process), or
    /// that a server answers from a cache refreshed that often.
    pub fn every(self, every: Duration) -> Self {
        Self { every, ..self }
    }

    /// Polls `check` until it holds and returns what it found; panics when it does not
    /// within the time allowed, naming `what` and what `check` last saw.
    pub async fn until<C: Check>(self, what: &str, check: impl AsyncFnMut() -> C) -> C::Value {
        self.try_until(what, check).await.unwrap_or_else(|timed_out| panic!("{timed_out}"))
    }

    /// As [`until`](Self::until), but a timeout is returned (as the message `until` would
    /// panic with) for the caller to add to or act on.
    ///
    /// # Errors
    /// The condition did not hold within the time allowed.
    pub async fn try_until<C: Check>(self, what: &str, mut check: impl AsyncFnMut() -> C) -> Result<C::Value, String> {
        // tokio's clock: a test with a paused clock times out in its own time.
        let deadline = tokio::time::Instant::now() + self.within;
        loop {
            match check().await.holds() {
                Ok(value) => return Ok(value),
                Err(seen) if tokio::time::Instant::now() >= deadline => {
                    return Err(format!("waited {:?} for {what}; last seen: {seen}", self.within));
                }
                Err(_) => tokio::time::sleep(self.every).await,
            }
        }
    }

    /// As [`until`](Self::until), on a thread outside any async runtime.
    pub fn until_blocking<C: Check>(self, what: &str, mut check: impl FnMut() -> C) -> C::Value {
        let deadline = std::time::Instant::now() + self.within;
        loop {
            match check().holds() {
                Ok(value) => return value,
                Err(seen) if std::time::Instant::now() >= deadline => {
                    panic!("waited {:?} for {what}; last seen: {seen}", self.within)
                }
                Err(_) => std::thread::sleep(self.every),
            }
        }
    }
}

//! The `herald` binary's allocator, and giving freed memory back to the OS.
//!
//! mimalloc rather than glibc's malloc: messages are many small short-lived allocations
//! made on one worker thread and freed on another, where glibc spent about a tenth of the
//! machine's time (its arenas' locking and free-list consolidation) in a 3-node benchmark.
//!
//! mimalloc returns a page to the OS only once the thread that owns the page sees every
//! block of it free, and a block freed by another thread (a message made on one worker
//! and dropped on the other, a connection's state) is seen only when the owner next
//! allocates from that page's size class. After a burst an idle node therefore kept its
//! peak resident size for good: 180 MiB a minute after 10,000 devices left, 36 MiB before
//! they came. [`collect_when_due`], called by each runtime worker as it goes idle, looks
//! at the worker's heap at most once per [`COLLECT_EVERY`] (a look took 70 µs at the
//! median, 0.6 ms at most, with 10,000 devices connected).
//!
//! Built `no_thp`: mimalloc otherwise asks for transparent huge pages for its heap, and a
//! 2 MiB page stays resident while any of it is in use. With them the same node kept 135
//! MiB a minute after the devices left even with the collection, and started at 37 MiB
//! instead of 22.

use std::cell::Cell;
use std::time::{Duration, Instant};

pub use mimalloc::MiMalloc;

/// Longest a worker's freed memory waits to be looked at (while the worker goes idle).
pub const COLLECT_EVERY: Duration = Duration::from_secs(5);

thread_local! {
    static LAST_COLLECT: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Collects this thread's heap unless it was collected within [`COLLECT_EVERY`]: for
/// tokio's `on_thread_park`.
pub fn collect_when_due() {
    let now = Instant::now();
    LAST_COLLECT.with(|last| {
        if last.get().is_some_and(|at| now.duration_since(at) < COLLECT_EVERY) {
            return;
        }
        last.set(Some(now));
        collect();
    });
}

/// Frees this thread's empty pages (emptied by other threads' frees too) and returns the
/// free memory of every arena to the OS.
#[allow(unsafe_code)]
pub fn collect() {
    // SAFETY: mi_collect takes no arguments to get wrong and may be called on any thread
    // at any time: it walks the calling thread's own heap and the shared arenas under
    // mimalloc's own synchronisation. With another global allocator it is a no-op on an
    // unused mimalloc.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

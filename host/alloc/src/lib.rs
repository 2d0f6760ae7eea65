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
//! Herald's Rust code allocates from mimalloc, but C libraries linked in (SQLite) allocate
//! from glibc's malloc, which keeps what they free in its arenas: a free chunk goes back to
//! the OS only from the top of an arena. [`trim_c_heap`] hands back every whole free page
//! of them; the store calls it once SQLite's caches were emptied after a burst (64 MiB
//! were kept otherwise).
//!
//! Built `no_thp`: mimalloc otherwise asks for transparent huge pages for its heap, and a
//! 2 MiB page stays resident while any of it is in use. With them the same node kept 135
//! MiB a minute after the devices left even with the collection, and started at 37 MiB
//! instead of 22.
//!
//! [`Counting`] is mimalloc that can also count what is allocated and freed through it,
//! from the moment [`start_counting`] is called (`herald serve --count-allocations`): the
//! load test reads the counts from `/metrics` to report allocations per message, and the
//! live heap ([`Allocations::live_bytes`]) beside the resident size. Until then a call
//! costs one relaxed load of a flag that never changes.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use mimalloc::MiMalloc;

/// mimalloc, counting allocations once [`start_counting`] was called.
pub struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);

/// Counters for the threads that map to one shard: each on its own cache line, so that
/// threads counting at once do not contend for one.
#[repr(align(128))]
struct Shard {
    allocations: AtomicU64,
    bytes: AtomicU64,
    freed: AtomicU64,
}

const SHARDS: usize = 32;
static COUNTS: [Shard; SHARDS] =
    [const { Shard { allocations: AtomicU64::new(0), bytes: AtomicU64::new(0), freed: AtomicU64::new(0) } }; SHARDS];
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard, plus one (0: not chosen yet). A const-initialised `Copy` cell
    /// has no destructor, so the allocator may touch it at any point of a thread's life.
    static SHARD: Cell<usize> = const { Cell::new(0) };
}

/// What was allocated since counting started: how many allocations (a `realloc` counts as
/// one), how many bytes they asked for, and how many bytes were freed (a `realloc` frees
/// the block it replaces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocations {
    pub count: u64,
    pub bytes: u64,
    pub freed_bytes: u64,
}

impl Allocations {
    /// Bytes allocated and not freed since counting started: the live heap of Rust code,
    /// short by what was allocated before counting started and is still held (a block
    /// allocated before and freed after is counted freed, so this never overstates it).
    pub fn live_bytes(&self) -> u64 {
        self.bytes.saturating_sub(self.freed_bytes)
    }
}

/// Starts counting the allocations made through [`Counting`] (idempotent).
pub fn start_counting() {
    COUNTING.store(true, Ordering::Relaxed);
}

/// The allocations counted so far; `None` when counting was never started.
pub fn allocations() -> Option<Allocations> {
    COUNTING.load(Ordering::Relaxed).then(|| {
        COUNTS.iter().fold(Allocations { count: 0, bytes: 0, freed_bytes: 0 }, |sum, shard| Allocations {
            count: sum.count + shard.allocations.load(Ordering::Relaxed),
            bytes: sum.bytes + shard.bytes.load(Ordering::Relaxed),
            freed_bytes: sum.freed_bytes + shard.freed.load(Ordering::Relaxed),
        })
    })
}

#[inline]
fn count(size: usize) {
    if let Some(shard) = counting_shard() {
        COUNTS[shard].allocations.fetch_add(1, Ordering::Relaxed);
        COUNTS[shard].bytes.fetch_add(size as u64, Ordering::Relaxed);
    }
}

#[inline]
fn count_freed(size: usize) {
    if let Some(shard) = counting_shard() {
        COUNTS[shard].freed.fetch_add(size as u64, Ordering::Relaxed);
    }
}

/// The calling thread's shard of the counters, or `None` while nothing is counted.
#[inline]
fn counting_shard() -> Option<usize> {
    if !COUNTING.load(Ordering::Relaxed) {
        return None;
    }
    let shard = SHARD
        .try_with(|shard| {
            if shard.get() == 0 {
                shard.set(NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS + 1);
            }
            shard.get() - 1
        })
        .unwrap_or(0); // a thread being torn down
    Some(shard)
}

// SAFETY: every method forwards its arguments unchanged to mimalloc's `GlobalAlloc`, which
// upholds the trait's contract; counting touches only atomics and a const-initialised
// thread-local without a destructor, and never allocates.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's guarantees for `layout` are passed on as they are.
        unsafe { MiMalloc.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { MiMalloc.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count_freed(layout.size());
        // SAFETY: `ptr` was allocated by this allocator, that is by mimalloc, with `layout`.
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        count_freed(layout.size());
        // SAFETY: `ptr` came from mimalloc with `layout`; the caller vouches for `new_size`.
        unsafe { MiMalloc.realloc(ptr, layout, new_size) }
    }
}

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

/// Returns to the OS every whole free page of glibc's malloc arenas (SQLite's memory), not
/// only what lies at the top of each. Takes each arena's lock in turn while it walks it: call
/// it when the C code is idle. A no-op where the C library is not glibc.
#[allow(unsafe_code)]
pub fn trim_c_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim takes a size (how much to leave at the top of the main arena)
        // and walks the arenas under their own locks; it is safe to call on any thread at
        // any time, and only changes which free pages stay mapped.
        unsafe {
            malloc_trim(0);
        }
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use std::ffi::c_void;

    #[allow(unsafe_code)]
    unsafe extern "C" {
        fn malloc(size: usize) -> *mut c_void;
        fn free(pointer: *mut c_void);
    }

    fn resident_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("VmRSS");
        line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).expect("a number of KiB")
    }

    /// What SQLite's page cache leaves behind: 64 MiB of pages freed below one still in use,
    /// on a thread of its own (so in an arena of its own, as SQLite's connection threads).
    #[test]
    #[allow(unsafe_code)]
    fn freed_c_memory_below_a_live_block_goes_back_to_the_os() {
        const PAGE: usize = 8 * 1024 + 200;
        let (before_trim, after_trim) = std::thread::spawn(|| {
            // SAFETY: plain malloc/free pairs; every block is written within its size and
            // freed once.
            unsafe {
                let pages: Vec<*mut c_void> = (0..8192)
                    .map(|_| {
                        let page = malloc(PAGE);
                        assert!(!page.is_null());
                        page.cast::<u8>().write_bytes(1, PAGE);
                        page
                    })
                    .collect();
                let live = malloc(PAGE);
                assert!(!live.is_null());
                for page in pages {
                    free(page);
                }
                let before_trim = resident_kib();
                super::trim_c_heap();
                let after_trim = resident_kib();
                free(live);
                (before_trim, after_trim)
            }
        })
        .join()
        .expect("joined");
        assert!(
            after_trim + 48 * 1024 < before_trim,
            "at least 48 of the 64 MiB freed go back: {before_trim} KiB resident before the trim, {after_trim} after"
        );
    }
}

//! CPU time, read from `/proc` (Linux; `None` elsewhere), and how much of it went into
//! compiling components. A node's health leaves its compile time out: a node compiling its
//! plugins, at start or on a reload, must not read its own warm-up as load and shed
//! delivery for it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Clock ticks spent compiling components, summed over every compile of this process.
static COMPILE_TICKS: AtomicU64 = AtomicU64::new(0);

/// Compiles under way: their time is counted only once each ends.
static COMPILING: AtomicUsize = AtomicUsize::new(0);

/// Clock ticks per second of the figures here (`USER_HZ`, 100 on Linux).
pub const TICKS_PER_SECOND: u64 = 100;

/// This process's user + system CPU time so far, in clock ticks.
pub fn process_ticks() -> Option<u64> {
    ticks_of("/proc/self/stat")
}

/// CPU time this process has spent compiling components so far, in clock ticks.
pub fn compile_ticks() -> u64 {
    COMPILE_TICKS.load(Ordering::Relaxed)
}

/// Whether a compile is under way: the process's CPU time includes some of it that
/// [`compile_ticks`] does not yet, so a load read now would count it.
pub fn compiling() -> bool {
    COMPILING.load(Ordering::Relaxed) > 0
}

/// Runs `compile` on this thread and counts the CPU time it took as compile time.
pub(crate) fn counted_as_compile<T>(compile: impl FnOnce() -> T) -> T {
    /// Ends the compile however `compile` ends, its time counted first.
    struct Compiling(Option<u64>);
    impl Drop for Compiling {
        fn drop(&mut self) {
            if let (Some(before), Some(after)) = (self.0, ticks_of("/proc/thread-self/stat")) {
                COMPILE_TICKS.fetch_add(after.saturating_sub(before), Ordering::Relaxed);
            }
            COMPILING.fetch_sub(1, Ordering::Relaxed);
        }
    }
    COMPILING.fetch_add(1, Ordering::Relaxed);
    let _compiling = Compiling(ticks_of("/proc/thread-self/stat"));
    compile()
}

/// User + system time of a process's or thread's `stat` file, in clock ticks.
fn ticks_of(path: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name (which may contain spaces) closed by the last ')':
    // state is the first; utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_counted_as_compile_adds_this_threads_cpu_time() {
        let before = compile_ticks();
        let spun = counted_as_compile(|| {
            // Busy for at least a few ticks of CPU time.
            let start = std::time::Instant::now();
            let mut x = 0_u64;
            while start.elapsed() < std::time::Duration::from_millis(80) {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            x
        });
        std::hint::black_box(spun);
        assert!(!compiling(), "the compile is over");
        assert!(process_ticks().is_some(), "/proc/self/stat is readable here");
        assert!(compile_ticks() > before, "80 ms of CPU on this thread is at least one tick");
    }
}

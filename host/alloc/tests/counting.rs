//! `Counting` as a program's global allocator: nothing counted until asked, then every
//! allocation and free of every thread.

use std::hint::black_box;

#[global_allocator]
static ALLOCATOR: herald_alloc::Counting = herald_alloc::Counting;

#[test]
fn allocations_of_every_thread_are_counted_once_counting_started() {
    drop(black_box(vec![0_u8; 4096]));
    assert_eq!(herald_alloc::allocations(), None, "not counting yet");

    herald_alloc::start_counting();
    let start = herald_alloc::allocations().expect("counting");
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                for _ in 0..1000 {
                    drop(black_box(vec![0_u8; 100]));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("joined");
    }
    let mut grown = black_box(Vec::<u8>::with_capacity(10));
    grown.reserve(10_000); // a realloc
    let end = herald_alloc::allocations().expect("counting");

    // Other threads of the test harness may allocate meanwhile: at least, never fewer.
    assert!(end.count - start.count >= 4001, "{start:?} → {end:?}");
    assert!(end.bytes - start.bytes >= 4 * 1000 * 100 + 10_010, "{start:?} → {end:?}");
    assert!(end.count - start.count < 4001 + 1000, "each allocation counted once: {start:?} → {end:?}");
    assert!(
        end.freed_bytes - start.freed_bytes >= 4 * 1000 * 100 + 10,
        "frees and a realloc's old block: {start:?} → {end:?}"
    );

    // The live heap: a block held counts, and stops counting once freed.
    const HELD: usize = 8 << 20;
    let held = black_box(vec![1_u8; HELD]);
    let holding = herald_alloc::allocations().expect("counting");
    drop(held);
    let released = herald_alloc::allocations().expect("counting");
    assert!(holding.live_bytes() >= end.live_bytes() + HELD as u64 - (1 << 20), "{end:?} → {holding:?}");
    assert!(released.live_bytes() + HELD as u64 - (1 << 20) <= holding.live_bytes(), "{holding:?} → {released:?}");
}

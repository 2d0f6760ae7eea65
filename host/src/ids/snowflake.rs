//! Snowflake message ids: unique cluster-wide and ordered by time.
//!
//! Layout (most significant first): 1 unused sign bit, 41 bits of milliseconds since
//! [`HERALD_EPOCH_MS`], 10 bits of node id, 12 bits of sequence within the millisecond.
//!
//! Invariants this generator keeps, whatever the wall clock does:
//! - ids from one generator strictly increase, so they never repeat;
//! - ids from generators with different node ids never collide;
//! - it never sleeps: when the clock steps back it keeps issuing from the last timestamp it
//!   used, borrowing future milliseconds once a millisecond's 4096 sequence numbers run out,
//!   and counts the step. The only wait is a spin of less than one millisecond when 4096 ids
//!   have been issued in the current millisecond (the format's ceiling of 4.096 M ids/s).
//!
//! Within one process that is all it takes. Across a restart the generator starts
//! [above](SnowflakeGenerator::starting_above) the newest id its node id committed before
//! (see [`resume`](super::resume())), so ids do not go backwards there either.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::{SystemClock, WallClock};

/// Herald's time zero, the layout's bit widths and the largest node id: defined in
/// [`crate::model`], where the store reads ids too.
pub use crate::model::{HERALD_EPOCH_MS, MAX_NODE_ID, NODE_BITS, SEQUENCE_BITS};
const _: () = assert!(MAX_NODE_ID as u64 == (1 << NODE_BITS) - 1, "node ids fill the node bits");
const MAX_SEQUENCE: u64 = (1 << SEQUENCE_BITS) - 1;
const TIMESTAMP_BITS: u32 = 41;
const MAX_TIMESTAMP: u64 = (1 << TIMESTAMP_BITS) - 1;

/// A node id outside `0..=1023`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node id {0} is out of range; it must be 0..=1023")]
pub struct NodeIdOutOfRange(pub u32);

/// The parts of a snowflake id, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnowflakeParts {
    /// Milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The node that issued it.
    pub node: u16,
    /// Its position within that millisecond.
    pub sequence: u16,
}

/// Splits an id into its timestamp, node and sequence.
pub fn decompose(id: u64) -> SnowflakeParts {
    SnowflakeParts {
        unix_ms: (id >> (NODE_BITS + SEQUENCE_BITS)) + HERALD_EPOCH_MS,
        node: ((id >> SEQUENCE_BITS) & u64::from(MAX_NODE_ID)) as u16,
        sequence: (id & MAX_SEQUENCE) as u16,
    }
}

/// Issues snowflake ids for one node.
///
/// Cheap to share behind an `Arc`: one short critical section per id.
pub struct SnowflakeGenerator<C: WallClock = SystemClock> {
    /// Pre-shifted node id, OR-ed into every id.
    node_bits: u64,
    /// Where wall time comes from.
    clock: C,
    /// The last timestamp and sequence handed out.
    state: Mutex<State>,
    /// Times the wall clock was seen to go backwards.
    clock_steps_back: AtomicU64,
    /// Milliseconds issued ahead of the wall clock because it was behind.
    borrowed_ms: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Timestamp (ms since the Herald epoch) of the last id issued.
    last_ms: u64,
    /// Sequence of the last id issued within `last_ms`.
    sequence: u64,
    /// The previous clock reading, to notice steps back.
    last_reading: u64,
}

impl SnowflakeGenerator<SystemClock> {
    /// A generator for `node` using the system clock.
    ///
    /// # Errors
    /// [`NodeIdOutOfRange`] when `node` > 1023.
    pub fn new(node: u32) -> Result<Self, NodeIdOutOfRange> {
        Self::with_clock(node, SystemClock)
    }
}

impl<C: WallClock> SnowflakeGenerator<C> {
    /// A generator for `node` that reads time from `clock`.
    ///
    /// # Errors
    /// [`NodeIdOutOfRange`] when `node` > 1023.
    pub fn with_clock(node: u32, clock: C) -> Result<Self, NodeIdOutOfRange> {
        if node > u32::from(MAX_NODE_ID) {
            return Err(NodeIdOutOfRange(node));
        }
        Ok(Self {
            node_bits: u64::from(node) << SEQUENCE_BITS,
            clock,
            state: Mutex::new(State::default()),
            clock_steps_back: AtomicU64::new(0),
            borrowed_ms: AtomicU64::new(0),
        })
    }

    /// The same generator, issuing only ids above every id of its node stamped `unix_ms`
    /// or earlier (ms since the Unix epoch): the newest committed by an earlier life of
    /// this node id. Should the clock read `unix_ms` or less when an id is asked for (it
    /// stepped back after the start-up check), the id borrows the next millisecond, as
    /// after any step back.
    #[must_use]
    pub fn starting_above(self, unix_ms: u64) -> Self {
        {
            let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            // The last id "issued" is the last one that millisecond can hold.
            state.last_ms = unix_ms.saturating_sub(HERALD_EPOCH_MS);
            state.sequence = MAX_SEQUENCE;
        }
        self
    }

    /// The next id: greater than every id this generator issued before.
    pub fn next_id(&self) -> u64 {
        // A poisoned lock only means another thread panicked mid-update of plain integers;
        // the state is still a valid (last_ms, sequence) pair.
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        loop {
            let now = self.clock.now_ms().saturating_sub(HERALD_EPOCH_MS);
            if now < state.last_reading {
                self.clock_steps_back.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("herald_ids_clock_steps_back_total").increment(1);
            }
            state.last_reading = now;

            if now > state.last_ms {
                state.last_ms = now;
                state.sequence = 0;
            } else if state.sequence < MAX_SEQUENCE {
                state.sequence += 1;
            } else if now < state.last_ms {
                // The clock is behind the ids already issued: borrow the next millisecond
                // rather than wait for the clock to catch up.
                state.last_ms += 1;
                state.sequence = 0;
                self.borrowed_ms.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("herald_ids_borrowed_ms_total").increment(1);
            } else {
                // 4096 ids in this very millisecond: wait (< 1 ms) for the clock to tick.
                std::hint::spin_loop();
                continue;
            }
            debug_assert!(state.last_ms <= MAX_TIMESTAMP, "snowflake timestamps run out in 2095");
            return (state.last_ms << (NODE_BITS + SEQUENCE_BITS)) | self.node_bits | state.sequence;
        }
    }

    /// How often the wall clock has been seen stepping back.
    pub fn clock_steps_back(&self) -> u64 {
        self.clock_steps_back.load(Ordering::Relaxed)
    }

    /// How many milliseconds were borrowed from the future while the clock was behind.
    pub fn borrowed_ms(&self) -> u64 {
        self.borrowed_ms.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use proptest::prelude::*;

    const START: u64 = HERALD_EPOCH_MS + 1_000_000;

    #[test]
    fn id_encodes_time_node_and_sequence() {
        let clock = ManualClock::new(START);
        let generator = SnowflakeGenerator::with_clock(5, clock.clone()).expect("node in range");
        let first = decompose(generator.next_id());
        assert_eq!(first, SnowflakeParts { unix_ms: START, node: 5, sequence: 0 });
        let second = decompose(generator.next_id());
        assert_eq!(second, SnowflakeParts { unix_ms: START, node: 5, sequence: 1 });
        clock.advance(3);
        assert_eq!(decompose(generator.next_id()).unix_ms, START + 3);
    }

    #[test]
    fn a_generator_started_above_a_mark_issues_only_above_it() {
        let mark = START + 5_000;
        // The highest id node 4 can have issued in the mark's millisecond.
        let highest_before =
            ((mark - HERALD_EPOCH_MS) << (NODE_BITS + SEQUENCE_BITS)) | (4 << SEQUENCE_BITS) | MAX_SEQUENCE;
        for (clock, first_ms) in [
            // Behind and frozen: the next millisecond is borrowed, with no wait.
            (ManualClock::new(mark - 2_000), mark + 1),
            // At the mark: the clock must tick first.
            (ManualClock::ticking(mark, 100), mark + 1),
            // Past it: the clock's own time.
            (ManualClock::new(mark + 3), mark + 3),
        ] {
            let generator = SnowflakeGenerator::with_clock(4, clock).expect("node in range").starting_above(mark);
            let first = generator.next_id();
            assert!(first > highest_before, "{:?} not above the mark", decompose(first));
            assert_eq!(decompose(first).unix_ms, first_ms);
            assert!(generator.next_id() > first);
        }
    }

    #[test]
    fn node_id_must_fit_ten_bits() {
        assert!(SnowflakeGenerator::new(1023).is_ok());
        assert_eq!(SnowflakeGenerator::new(1024).err(), Some(NodeIdOutOfRange(1024)));
    }

    #[test]
    fn exhausted_millisecond_waits_for_the_clock_to_tick() {
        // Ticks 1 ms every 10_000 reads: the generator must spin, not borrow.
        let clock = ManualClock::ticking(START, 10_000);
        let generator = SnowflakeGenerator::with_clock(0, clock).expect("node in range");
        let ids: Vec<u64> = (0..5000).map(|_| generator.next_id()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(generator.borrowed_ms(), 0, "a clock that ticks must not be run ahead of");
    }

    #[test]
    fn clock_step_back_borrows_future_milliseconds_without_waiting() {
        let clock = ManualClock::new(START);
        let generator = SnowflakeGenerator::with_clock(1, clock.clone()).expect("node in range");
        let before = generator.next_id();
        clock.step_back(10_000);
        // A frozen clock 10 s behind: 10_000 ids need 3 borrowed ms and no wait at all
        // (a wait would hang this test, since the clock never moves).
        let after: Vec<u64> = (0..10_000).map(|_| generator.next_id()).collect();
        assert!(after[0] > before);
        assert!(after.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(generator.clock_steps_back(), 1);
        assert_eq!(generator.borrowed_ms(), 2);
    }

    /// What the clock does between two batches of ids.
    #[derive(Debug, Clone)]
    enum Step {
        Forward(u64),
        Back(u64),
    }

    fn steps() -> impl Strategy<Value = Vec<(Step, usize)>> {
        let step = prop_oneof![
            (0u64..5).prop_map(Step::Forward),
            Just(Step::Back(1)),
            Just(Step::Back(50)),
            Just(Step::Back(10_000)),
        ];
        proptest::collection::vec((step, 1usize..6000), 1..40)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn ids_strictly_increase_across_clock_steps_back(script in steps()) {
            // Ticks now and then, so a millisecond whose 4096 ids are used up ends.
            let clock = ManualClock::ticking(START + 20_000, 5_000);
            let generator = SnowflakeGenerator::with_clock(7, clock.clone()).expect("node in range");
            let mut last = 0u64;
            for (step, count) in script {
                match step {
                    Step::Forward(ms) => clock.advance(ms),
                    Step::Back(ms) => clock.step_back(ms),
                }
                for _ in 0..count {
                    let id = generator.next_id();
                    prop_assert!(id > last, "id {id} not above {last}");
                    last = id;
                }
            }
        }

        #[test]
        fn two_nodes_never_collide(script in steps()) {
            let clock = ManualClock::ticking(START + 20_000, 5_000);
            let a = SnowflakeGenerator::with_clock(1, clock.clone()).expect("node in range");
            let b = SnowflakeGenerator::with_clock(2, clock.clone()).expect("node in range");
            let mut seen = std::collections::HashSet::new();
            for (step, count) in script {
                match step {
                    Step::Forward(ms) => clock.advance(ms),
                    Step::Back(ms) => clock.step_back(ms),
                }
                for _ in 0..count.min(2000) {
                    prop_assert!(seen.insert(a.next_id()));
                    prop_assert!(seen.insert(b.next_id()));
                }
            }
        }
    }
}

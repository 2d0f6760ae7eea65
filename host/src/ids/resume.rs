//! Resuming a node id's message ids at start: never below the ones it committed before.
//!
//! The generator keeps its ids increasing within one process whatever the clock does, but a
//! new process starts from the clock alone. Restarted with its clock behind (stepped back
//! while it was down, or its node id last leased by a machine whose clock ran ahead), a node
//! would issue ids below ones already stored, and with the same node id and millisecond even
//! the very same ids. So at start the node reads its node id's high-water mark (the
//! millisecond of the newest id it committed, raised by every commit: `store/id_marks.rs`):
//!
//! - the clock is past the mark: ids start at once;
//! - it is behind by at most `ids.max_clock_wait_ms`: the node waits, and says so in the log,
//!   until the clock has passed the mark (a wait for the clock after a step back, done once
//!   at start instead of on the path of every id, so no send ever waits for the clock);
//! - it is further behind, or does not pass the mark within that wait: the node refuses to
//!   start with [`ClockBehind`], which says by how much and what to change.
//!
//! Either way the generator then starts [above the mark](SnowflakeGenerator::starting_above),
//! so a clock that steps back again after the check cannot take ids below it either.

use std::time::Duration;

use tokio::time::Instant;

use super::snowflake::{NodeIdOutOfRange, SnowflakeGenerator};
use crate::clock::WallClock;
use crate::model::NodeId;
use crate::store::{IdMarks, StoreError};

/// The setting that bounds the wait, as an operator sets it.
const SETTING: &str = "ids.max_clock_wait_ms (HERALD_IDS__MAX_CLOCK_WAIT_MS)";

/// How much longer than `max_wait` a clock gets to pass the mark before it counts as not
/// moving: a clock being slewed runs a little slow, and timers wake a little late.
const SLACK: Duration = Duration::from_secs(1);

/// The clock is too far behind the newest id this node id committed for the node to start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClockBehind {
    /// Further behind than the node may wait.
    #[error(
        "this node's clock is {} behind the newest message id node {node} committed (stamped {mark_ms} ms after \
         the Unix epoch): ids issued now would sort below stored ones. Correct the clock (NTP), or have the node \
         wait for it at start by raising {setting} from {} to at least {}",
        seconds(*behind), max_wait.as_millis(), behind.as_millis(), setting = SETTING
    )]
    TooFar {
        /// This node's id.
        node: NodeId,
        /// The newest millisecond its ids were committed at.
        mark_ms: u64,
        /// How far the clock has to go to pass it.
        behind: Duration,
        /// The wait allowed.
        max_wait: Duration,
    },
    /// Within the wait at first, but the clock did not pass the mark in that time.
    #[error(
        "this node's clock did not pass the newest message id node {node} committed (stamped {mark_ms} ms after \
         the Unix epoch) within {} ({setting}): it is still {} behind. Is it stopped, or stepping back? Correct \
         the clock (NTP)",
        seconds(*max_wait), seconds(*behind), setting = SETTING
    )]
    NotCatchingUp {
        /// This node's id.
        node: NodeId,
        /// The newest millisecond its ids were committed at.
        mark_ms: u64,
        /// How far the clock still had to go when the wait ended.
        behind: Duration,
        /// The wait allowed.
        max_wait: Duration,
    },
}

/// Why a node's ids cannot resume, so it must not start.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The driver's error in the message only, as the store's own errors carry it.
    #[error("cannot read the id high-water mark of node {node}: {error}")]
    Store { node: NodeId, error: StoreError },
    #[error(transparent)]
    Clock(#[from] ClockBehind),
    #[error(transparent)]
    NodeId(#[from] NodeIdOutOfRange),
}

/// A generator for `node` whose ids are all above every id `node` committed before (as
/// `marks` records), reading time from `clock`; it returns once `clock` has passed the
/// newest of them, waiting up to `max_wait` for that.
///
/// # Errors
/// [`ResumeError::Clock`] when the clock is further behind than `max_wait`, or does not pass
/// the mark within it; [`ResumeError::Store`] when the mark cannot be read.
pub async fn resume<C: WallClock + Clone>(
    marks: &dyn IdMarks,
    node: NodeId,
    clock: C,
    max_wait: Duration,
) -> Result<SnowflakeGenerator<C>, ResumeError> {
    let generator = SnowflakeGenerator::with_clock(node.0, clock.clone())?;
    let Some(mark_ms) = marks.id_mark(node).await.map_err(|error| ResumeError::Store { node, error })? else {
        return Ok(generator);
    };
    wait_past(&clock, node, mark_ms, max_wait).await?;
    Ok(generator.starting_above(mark_ms))
}

/// Waits until `clock` reads later than `mark_ms`, at most `max_wait` (and a second of
/// slack for a clock being slewed); returns how long it waited. A clock already past it
/// returns at once.
///
/// # Errors
/// [`ClockBehind::TooFar`] at once when the clock is more than `max_wait` behind;
/// [`ClockBehind::NotCatchingUp`] when it has not passed the mark by the end of the wait.
pub async fn wait_past(
    clock: &impl WallClock,
    node: NodeId,
    mark_ms: u64,
    max_wait: Duration,
) -> Result<Duration, ClockBehind> {
    // Only read while the clock is at or before the mark.
    let behind = |now_ms: u64| Duration::from_millis(mark_ms + 1 - now_ms);
    let now_ms = clock.now_ms();
    if now_ms > mark_ms {
        return Ok(Duration::ZERO);
    }
    if behind(now_ms) > max_wait {
        return Err(ClockBehind::TooFar { node, mark_ms, behind: behind(now_ms), max_wait });
    }
    tracing::warn!(
        %node,
        mark_ms,
        behind_ms = behind(now_ms).as_millis(),
        "this node's clock is behind the newest message id its node id committed; waiting for it to pass that \
         before issuing ids"
    );
    let started = Instant::now();
    let deadline = started + max_wait + SLACK;
    loop {
        let now_ms = clock.now_ms();
        if now_ms > mark_ms {
            let waited = started.elapsed();
            tracing::info!(%node, waited_ms = waited.as_millis(), "the clock has passed the id high-water mark");
            return Ok(waited);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ClockBehind::NotCatchingUp { node, mark_ms, behind: behind(now_ms), max_wait });
        }
        tokio::time::sleep(behind(now_ms).min(left)).await;
    }
}

/// A duration in seconds, to the millisecond.
fn seconds(duration: Duration) -> String {
    format!("{:.3} s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use crate::clock::{ManualClock, TokioClock};
    use crate::ids::decompose;
    use crate::model::HERALD_EPOCH_MS;

    const NODE: NodeId = NodeId(3);
    const MARK: u64 = HERALD_EPOCH_MS + 86_400_000;
    const WAIT: Duration = Duration::from_secs(5);

    /// A store whose mark is fixed, or that cannot be read (`Err`).
    struct Marks(Result<Option<u64>, ()>);

    #[async_trait]
    impl IdMarks for Marks {
        async fn id_mark(&self, node: NodeId) -> Result<Option<u64>, StoreError> {
            assert_eq!(node, NODE, "the mark of this node is read");
            self.0.map_err(|()| StoreError::Unavailable("connection refused".into()))
        }
    }

    /// The highest id `NODE` can have issued in the mark's millisecond.
    fn highest_at_mark() -> u64 {
        ((MARK - HERALD_EPOCH_MS) << 22) | (u64::from(NODE.0) << 12) | 4095
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_past_the_mark_resumes_at_once() {
        let started = Instant::now();
        let clock = TokioClock::new(MARK + 10);
        let generator = resume(&Marks(Ok(Some(MARK))), NODE, clock, WAIT).await.expect("resumes");
        assert_eq!(started.elapsed(), Duration::ZERO, "no wait");
        assert_eq!(decompose(generator.next_id()).unix_ms, MARK + 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_a_little_behind_waits_until_it_passes_the_mark() {
        let started = Instant::now();
        let clock = TokioClock::new(MARK - 2_000);
        let generator = resume(&Marks(Ok(Some(MARK))), NODE, clock.clone(), WAIT).await.expect("resumes");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(2_001) && waited < Duration::from_millis(2_100), "{waited:?}");
        assert!(clock.now_ms() > MARK);
        let first = generator.next_id();
        assert!(first > highest_at_mark(), "{:?}", decompose(first));
        assert_eq!(decompose(first).unix_ms, MARK + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_far_behind_refuses_to_start_saying_by_how_much_and_what_to_change() {
        let started = Instant::now();
        let clock = TokioClock::new(MARK - 42_100);
        let error = resume(&Marks(Ok(Some(MARK))), NODE, clock, WAIT).await.err().expect("refused");
        assert_eq!(started.elapsed(), Duration::ZERO, "refused without waiting");
        let ResumeError::Clock(behind) = &error else { panic!("{error}") };
        assert_eq!(
            behind,
            &ClockBehind::TooFar { node: NODE, mark_ms: MARK, behind: Duration::from_millis(42_101), max_wait: WAIT }
        );
        let told = error.to_string();
        for part in
            ["clock is 42.101 s behind", "node 3", "HERALD_IDS__MAX_CLOCK_WAIT_MS", "from 5000 to at least 42101"]
        {
            assert!(told.contains(part), "{part:?} missing from: {told}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_that_does_not_move_is_refused_once_the_wait_is_over() {
        let started = Instant::now();
        let frozen = ManualClock::new(MARK - 1_000);
        let error = resume(&Marks(Ok(Some(MARK))), NODE, frozen, WAIT).await.err().expect("refused");
        let waited = started.elapsed();
        assert!(waited >= WAIT + SLACK && waited < WAIT + SLACK + Duration::from_millis(10), "{waited:?}");
        let ResumeError::Clock(ClockBehind::NotCatchingUp { behind, .. }) = &error else { panic!("{error}") };
        assert_eq!(*behind, Duration::from_millis(1_001));
        assert!(error.to_string().contains("still 1.001 s behind"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn no_wait_allowed_refuses_a_clock_at_the_mark() {
        let error = wait_past(&ManualClock::new(MARK), NODE, MARK, Duration::ZERO).await.expect_err("refused");
        assert!(matches!(error, ClockBehind::TooFar { behind, .. } if behind == Duration::from_millis(1)));
        assert_eq!(wait_past(&ManualClock::new(MARK + 1), NODE, MARK, Duration::ZERO).await, Ok(Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_id_that_committed_nothing_starts_at_once_on_any_clock() {
        let clock = ManualClock::new(HERALD_EPOCH_MS + 1);
        let generator = resume(&Marks(Ok(None)), NODE, clock, WAIT).await.expect("resumes");
        assert_eq!(decompose(generator.next_id()).unix_ms, HERALD_EPOCH_MS + 1);
    }

    #[tokio::test]
    async fn an_unreadable_mark_refuses_the_start_naming_the_node() {
        let clock = ManualClock::new(MARK);
        let error = resume(&Marks(Err(())), NODE, clock, WAIT).await.err().expect("refused");
        let told = error.to_string();
        assert!(told.starts_with("cannot read the id high-water mark of node 3: "), "{told}");
        assert!(told.contains("connection refused"), "{told}");
    }
}

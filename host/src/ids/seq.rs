//! Per-conversation sequence numbers from segments leased out of the `session_seq` table.
//!
//! Each conversation's seqs come from a local segment (a range reserved in the database with
//! one transaction), handed out from memory. Invariants:
//! - **Never reissued.** A range is only used after the database has moved the
//!   conversation's `max_seq` past it, so a crash (or a dropped allocator) wastes the rest of
//!   a segment — a gap — but no later allocator can be handed the same seq.
//! - **Strictly increasing per allocator.** Leases for one conversation are made one at a time
//!   (a per-conversation refill lock), and each lease is above the last, so seqs handed out in
//!   order of the per-conversation lock only go up.
//! - **Renewal does not stall.** Once a segment is `prefetch_at` used, the next ones (up to
//!   `prefetch_segments`, more for hot conversations) are leased in the background; callers
//!   only wait when a conversation outruns its prefetch.
//! - **Few round trips.** The segments missing from the prefetch are leased together, in
//!   one transaction, and split up locally. A deep prefetch (a hot conversation) is topped
//!   up only once a quarter of it is used, so a conversation using thousands of segments a
//!   second leases a few hundred times a second, not thousands.
//! - **Adaptive step.** A segment that lasted less than half the target lifetime doubles the
//!   next step, one that lasted more than twice halves it, within `[min_step, max_step]`: quiet
//!   conversations waste few seqs on a crash, hot ones rarely touch the database.
//! - **Idle entries are forgotten.** [`SeqAllocator::evict_idle`] drops conversations no seq
//!   was taken from since its last call; their next seq comes from a new lease, above all
//!   earlier ones. A lease still under way for a dropped entry is discarded, never handed to
//!   its successor, so the invariants above hold across evictions. [`SeqAllocator::forget`]
//!   and [`SeqAllocator::retain`] drop entries the same way, whether idle or not: the
//!   conversations this node no longer owns.
//! - **One fence per conversation.** Every lease is made with the caller's [`OwnerClaim`] and
//!   comes back with the [`Fence`] its messages must carry to be committed (see
//!   `store/seq_lease.rs`); each seq is handed out with its segment's fence. The segments
//!   held for a conversation all share one fence: a lease that comes back under another
//!   fence (another node owned the conversation in between) drops those still held, which
//!   could no longer commit; a lease refused ([`LeaseError::Superseded`]) drops them too.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{MAX_PREFETCH, SeqConfig};
use crate::maps::DashMap;
use crate::model::ConversationId;
use crate::store::{Fence, Lease, LeaseError, OwnerClaim, SeqLeases, SeqRange};

/// A seq and the fence of the lease it came from, which its message carries to the commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocated {
    /// The seq.
    pub seq: u64,
    /// The owner the seq was leased under.
    pub fence: Fence,
}

/// Sweeps of [`SeqAllocator::evict_idle`] per idle time: an idle conversation goes at the
/// eighth sweep after its last seq.
pub const SWEEPS_PER_IDLE: u8 = 8;

/// Hands out seqs for every conversation this node owns.
pub struct SeqAllocator {
    /// The database side of leases.
    leaser: Arc<dyn SeqLeases>,
    /// Step bounds and prefetch point.
    config: SeqConfig,
    /// Local segments, one entry per conversation in use. The fast path takes a seq under
    /// the entry's shard lock and no other (two atomic operations per seq).
    conversations: DashMap<ConversationId, Conversation>,
    /// Leases a caller had to wait for (its conversation outran the prefetch).
    foreground_leases: AtomicU64,
    /// Leases made, in the foreground or not: round trips to the database.
    leases: AtomicU64,
}

/// One conversation's local segments.
struct Conversation {
    segments: Segments,
    /// Held while leasing, so one allocator leases one segment at a time per conversation.
    /// It is also the entry's identity: a lease made for an entry that was evicted (and
    /// perhaps made again since) is dropped, not pushed into its successor.
    refill: Arc<tokio::sync::Mutex<()>>,
    /// Sweeps ([`SeqAllocator::evict_idle`]) since a seq was last taken; forgotten at
    /// [`SWEEPS_PER_IDLE`].
    idle_sweeps: u8,
}

struct Segments {
    /// The fence every segment held was leased under; `None` until the first lease.
    fence: Option<Fence>,
    /// Next seq to hand out.
    next: u64,
    /// Last seq of the current segment; the segment is used up when `next > last`.
    last: u64,
    /// Segments leased ahead of need, oldest first.
    queued: VecDeque<SeqRange>,
    /// A background lease is under way.
    prefetching: bool,
    /// Size of the next lease.
    step: u64,
    /// When the segment in use was started, to adapt the step.
    started_at: Option<Instant>,
    /// Segments to keep leased ahead, sized when a segment is put in use (see
    /// [`Segments::start`]), so the per-seq path only compares two integers.
    depth: usize,
    /// A prefetch tops the queue up to `depth` once fewer than this are queued: `depth`
    /// for a shallow prefetch, three quarters of it for a deep one (see [`refill_below`]).
    refill_below: usize,
    /// A prefetch starts once this many seqs or fewer are left in the segment in use:
    /// (1 - `prefetch_at`) of a step, worked out when the step changes.
    prefetch_below: u64,
}

/// What one attempt at the fast path found.
enum Take {
    /// A seq, and whether a prefetch should now start.
    Seq(Allocated, bool),
    /// No seq in memory: lease one.
    Empty,
}

impl Conversation {
    fn new(config: &SeqConfig) -> Self {
        Self {
            segments: Segments {
                fence: None,
                next: 1,
                last: 0,
                queued: VecDeque::new(),
                prefetching: false,
                step: config.min_step,
                started_at: None,
                depth: config.prefetch_segments,
                refill_below: refill_below(config.prefetch_segments),
                prefetch_below: prefetch_below(config.min_step, config),
            },
            refill: Arc::new(tokio::sync::Mutex::new(())),
            idle_sweeps: 0,
        }
    }

    fn take(&mut self, config: &SeqConfig) -> Take {
        self.idle_sweeps = 0;
        let s = &mut self.segments;
        if s.next > s.last {
            match s.queued.pop_front() {
                Some(range) => s.start(range, config),
                None => return Take::Empty,
            }
        }
        let Some(fence) = s.fence else { return Take::Empty };
        let seq = s.next;
        s.next += 1;
        let remaining = s.last + 1 - s.next;
        let prefetch = !s.prefetching && s.queued.len() < s.refill_below && remaining <= s.prefetch_below;
        if prefetch {
            s.prefetching = true;
        }
        Take::Seq(Allocated { seq, fence }, prefetch)
    }

    fn has_available(&self) -> bool {
        self.segments.next <= self.segments.last || !self.segments.queued.is_empty()
    }

    /// Adds a range freshly leased under `fence`: in use at once if nothing else is left,
    /// else queued. Segments held under another fence are dropped first.
    fn push(&mut self, range: SeqRange, fence: Fence, config: &SeqConfig) {
        if self.segments.fence != Some(fence) {
            self.drop_segments();
            self.segments.fence = Some(fence);
        }
        let s = &mut self.segments;
        debug_assert!(range.first > s.queued.back().map_or(s.last, |r| r.last), "leases must only go up: {range:?}");
        if s.next > s.last && s.queued.is_empty() {
            s.start(range, config);
        } else {
            s.queued.push_back(range);
        }
    }

    /// Drops every segment held (they were leased under a fence that can no longer commit):
    /// the next seq comes from a new lease, above them all.
    fn drop_segments(&mut self) {
        let s = &mut self.segments;
        s.next = s.last + 1;
        s.queued.clear();
        s.fence = None;
    }

    /// Whether `refill` is this entry's lock (the entry was not evicted and made again).
    fn is(&self, refill: &Arc<tokio::sync::Mutex<()>>) -> bool {
        Arc::ptr_eq(&self.refill, refill)
    }
}

impl Segments {
    /// Puts `range` in use and adapts the step and the prefetch depth to how long the
    /// previous segment lasted.
    fn start(&mut self, range: SeqRange, config: &SeqConfig) {
        self.next = range.first;
        self.last = range.last;
        let now = Instant::now();
        if let Some(previous) = self.started_at {
            let lasted = now.duration_since(previous);
            if lasted < config.segment_lifetime / 2 {
                self.step = (self.step * 2).min(config.max_step);
            } else if lasted > config.segment_lifetime * 2 {
                self.step = (self.step / 2).max(config.min_step);
            }
            self.depth = prefetch_depth(lasted, config);
            self.refill_below = refill_below(self.depth);
            self.prefetch_below = prefetch_below(self.step, config);
        }
        self.started_at = Some(now);
    }
}

/// Seqs left in a segment of `step` when its successor is to be leased.
fn prefetch_below(step: u64, config: &SeqConfig) -> u64 {
    ((step as f64) * (1.0 - config.prefetch_at)) as u64
}

/// Below how many queued segments a prefetch of `depth` tops up: `depth` itself up to 3
/// (each segment is replaced as it is used), then three quarters of it, so a deep queue is
/// refilled a quarter at a time, in one lease.
fn refill_below(depth: usize) -> usize {
    depth - depth / 4
}

/// How many segments to keep leased ahead when one lasts `lifetime`: `prefetch_segments`,
/// or more when segments last less than `prefetch_ahead`, enough to cover it at that pace.
fn prefetch_depth(lifetime: Duration, config: &SeqConfig) -> usize {
    let needed = config.prefetch_ahead.as_nanos().div_ceil(lifetime.as_nanos().max(1));
    usize::try_from(needed).unwrap_or(MAX_PREFETCH).clamp(config.prefetch_segments, MAX_PREFETCH)
}

/// `range` (a whole number of `step`s long) as consecutive segments of `step`.
fn split(range: SeqRange, step: u64) -> impl Iterator<Item = SeqRange> {
    let count = (range.last + 1 - range.first) / step;
    (0..count).map(move |i| {
        let first = range.first + i * step;
        SeqRange { first, last: first + step - 1 }
    })
}

impl SeqAllocator {
    /// An allocator leasing from `leaser`.
    pub fn new(leaser: Arc<dyn SeqLeases>, config: SeqConfig) -> Self {
        Self {
            leaser,
            config,
            conversations: DashMap::default(),
            foreground_leases: AtomicU64::new(0),
            leases: AtomicU64::new(0),
        }
    }

    /// The next seq of `conversation`, with the fence its message must carry: above every
    /// seq this allocator gave it before, and never given out by any allocator before.
    /// `claim` (this node, and the epoch of the ring that makes it the owner) is what any
    /// lease needed is made with, in the foreground or ahead of need.
    ///
    /// # Errors
    /// [`LeaseError::Superseded`] when a segment was needed and another node owns the
    /// conversation now (the segments still held are dropped); [`LeaseError::Database`]
    /// when the database did not give one. Nothing was consumed and the call may be retried.
    pub async fn next(
        self: &Arc<Self>,
        conversation: &ConversationId,
        claim: OwnerClaim,
    ) -> Result<Allocated, LeaseError> {
        loop {
            // Fast path: a seq from memory, under the map's shard lock, no allocation.
            let taken = self.conversations.get_mut(conversation).map(|mut entry| entry.take(&self.config));
            match taken {
                Some(Take::Seq(allocated, prefetch)) => {
                    if prefetch {
                        self.spawn_prefetch(conversation.clone(), claim);
                    }
                    return Ok(allocated);
                }
                Some(Take::Empty) | None => self.refill(conversation, claim).await?,
            }
        }
    }

    /// Leases a segment in the foreground because none is left in memory.
    async fn refill(&self, conversation: &ConversationId, claim: OwnerClaim) -> Result<(), LeaseError> {
        let refill = self.refill_lock(conversation);
        let _refilling = refill.lock().await;
        let Some(step) = self.with_entry(conversation, &refill, |c| (!c.has_available()).then_some(c.segments.step))
        else {
            return Ok(()); // evicted meanwhile: the caller's next try starts afresh
        };
        let Some(step) = step else {
            return Ok(()); // a prefetch or another caller got there first
        };
        metrics::counter!("herald_seq_foreground_leases_total").increment(1);
        self.foreground_leases.fetch_add(1, Ordering::Relaxed);
        self.leases.fetch_add(1, Ordering::Relaxed);
        let lease = self.lease(conversation, &refill, step, claim).await?;
        self.with_entry(conversation, &refill, |c| c.push(lease.range, lease.fence, &self.config));
        Ok(())
    }

    /// One lease for the entry `refill` belongs to; when another node owns the conversation
    /// now, the entry's segments are dropped, since they could no longer commit.
    async fn lease(
        &self,
        conversation: &ConversationId,
        refill: &Arc<tokio::sync::Mutex<()>>,
        step: u64,
        claim: OwnerClaim,
    ) -> Result<Lease, LeaseError> {
        let leased = self.leaser.lease(conversation, step, claim).await;
        if let Err(LeaseError::Superseded { .. }) = &leased {
            self.with_entry(conversation, refill, Conversation::drop_segments);
        }
        leased
    }

    /// Leases in the background until enough segments wait ahead: every missing segment
    /// in one lease, split up here.
    fn spawn_prefetch(self: &Arc<Self>, conversation: ConversationId, claim: OwnerClaim) {
        let allocator = Arc::clone(self);
        tokio::spawn(async move {
            let refill = allocator.refill_lock(&conversation);
            let mut result = Ok(());
            loop {
                // The (fair) refill lock is let go between leases, so a caller that ran dry
                // takes what was just leased rather than waiting for another round trip.
                let _refilling = refill.lock().await;
                let wanted = allocator
                    .with_entry(&conversation, &refill, |c| {
                        let s = &c.segments;
                        (s.queued.len() < s.refill_below).then(|| (s.step, s.depth - s.queued.len()))
                    })
                    .flatten();
                let Some((step, segments)) = wanted else { break };
                allocator.leases.fetch_add(1, Ordering::Relaxed);
                match allocator.lease(&conversation, &refill, step * segments as u64, claim).await {
                    Ok(lease) => {
                        allocator.with_entry(&conversation, &refill, |c| {
                            for segment in split(lease.range, step) {
                                c.push(segment, lease.fence, &allocator.config);
                            }
                        });
                    }
                    Err(error) => {
                        result = Err(error);
                        break;
                    }
                }
            }
            allocator.with_entry(&conversation, &refill, |c| c.segments.prefetching = false);
            if let Err(error) = result {
                // The next caller to run out leases in the foreground and sees the error.
                tracing::warn!(%conversation, %error, "seq prefetch failed");
            }
        });
    }

    /// The refill lock of `conversation`'s entry, made if there is none.
    fn refill_lock(&self, conversation: &ConversationId) -> Arc<tokio::sync::Mutex<()>> {
        if let Some(entry) = self.conversations.get(conversation) {
            return Arc::clone(&entry.refill);
        }
        let entry = self.conversations.entry(conversation.clone()).or_insert_with(|| Conversation::new(&self.config));
        Arc::clone(&entry.refill)
    }

    /// Runs `f` on `conversation`'s entry if it is still the one `refill` belongs to; `None`
    /// when it was evicted (a lease made for it is then dropped: a gap, never a reissue).
    fn with_entry<T>(
        &self,
        conversation: &ConversationId,
        refill: &Arc<tokio::sync::Mutex<()>>,
        f: impl FnOnce(&mut Conversation) -> T,
    ) -> Option<T> {
        let mut entry = self.conversations.get_mut(conversation)?;
        entry.is(refill).then(|| f(&mut entry))
    }

    /// One sweep: forgets the conversations no seq was taken from for [`SWEEPS_PER_IDLE`]
    /// sweeps, so a node's memory follows the conversations in use rather than every one
    /// it ever served. The rest of their segments is skipped (a gap); the next seq leases
    /// anew. Entries with a lease under way are kept. Returns how many were forgotten.
    ///
    /// Swept every `seq.evict_idle / SWEEPS_PER_IDLE`, a conversation is forgotten after
    /// between seven eighths of `seq.evict_idle` and all of it, and the number held stays
    /// within an eighth of its level instead of a sawtooth of one idle time's conversations.
    pub fn evict_idle(&self) -> usize {
        let before = self.conversations.len();
        self.conversations.retain(|_, c| {
            let busy = c.segments.prefetching || c.refill.try_lock().is_err();
            c.idle_sweeps = c.idle_sweeps.saturating_add(1);
            busy || c.idle_sweeps < SWEEPS_PER_IDLE
        });
        before.saturating_sub(self.conversations.len())
    }

    /// Forgets `conversation`'s segments, held or being leased: its next seq comes from a
    /// new lease, above them all (a gap). For a conversation this node may no longer own:
    /// its lease was refused, a commit was fenced, or its lease on the cluster is in doubt.
    pub fn forget(&self, conversation: &ConversationId) {
        self.conversations.remove(conversation);
    }

    /// Keeps only the conversations `keep` says yes to, forgetting the others as
    /// [`forget`](Self::forget) does, whether idle or not: after a ring change, the
    /// conversations this node no longer owns. `keep` runs under the map's shard locks: it
    /// must not call back into this allocator. Returns how many were forgotten.
    pub fn retain(&self, keep: impl Fn(&ConversationId) -> bool) -> usize {
        let before = self.conversations.len();
        self.conversations.retain(|conversation, _| keep(conversation));
        before.saturating_sub(self.conversations.len())
    }

    /// Conversations with segments in memory.
    pub fn conversations(&self) -> usize {
        self.conversations.len()
    }

    /// How many leases callers have waited for since this allocator started: one per
    /// conversation to start with, more only when a conversation outran its prefetch.
    pub fn foreground_leases(&self) -> u64 {
        self.foreground_leases.load(Ordering::Relaxed)
    }

    /// How many leases (database round trips) this allocator has made.
    pub fn leases(&self) -> u64 {
        self.leases.load(Ordering::Relaxed)
    }

    /// The step the next lease of `conversation` will ask for (for tests and metrics).
    pub fn current_step(&self, conversation: &ConversationId) -> Option<u64> {
        self.conversations.get(conversation).map(|entry| entry.segments.step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    use crate::model::NodeId;

    /// The claim of the node these tests play, at the first ring epoch.
    const CLAIM: OwnerClaim = OwnerClaim { node: NodeId(1), epoch: 1 };

    /// An in-memory `session_seq` table: pure logic, so a fake is fair here (the owner rule
    /// is the store's own, [`OwnerClaim::against`]). The real backends are tested in
    /// `tests/` against SQLite, MariaDB and PostgreSQL.
    /// Each lease takes 1 ms, unless `delays_ms` says otherwise (popped one per lease).
    #[derive(Default)]
    struct MemoryLeaser {
        rows: Mutex<HashMap<String, (u64, Fence)>>,
        leases: AtomicUsize,
        delays_ms: Mutex<VecDeque<u64>>,
    }

    #[async_trait]
    impl SeqLeases for MemoryLeaser {
        async fn lease(
            &self,
            conversation: &ConversationId,
            step: u64,
            claim: OwnerClaim,
        ) -> Result<Lease, LeaseError> {
            self.leases.fetch_add(1, Ordering::SeqCst);
            let delay = self.delays_ms.lock().expect("not poisoned").pop_front().unwrap_or(1);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let mut rows = self.rows.lock().expect("not poisoned");
            let row = rows.get(conversation.as_str()).copied();
            let fence = claim.against(row.map(|(_, fence)| fence)).map_err(|owner| LeaseError::Superseded {
                conversation: conversation.clone(),
                node: owner.node,
                epoch: owner.epoch,
            })?;
            let high = row.map_or(0, |(high, _)| high) + step;
            rows.insert(conversation.as_str().to_owned(), (high, fence));
            Ok(Lease { range: SeqRange { first: high + 1 - step, last: high }, fence })
        }
    }

    impl MemoryLeaser {
        fn high_water(&self, conversation: &ConversationId) -> u64 {
            self.rows.lock().expect("not poisoned").get(conversation.as_str()).map_or(0, |(high, _)| *high)
        }
    }

    /// The seq of an allocation (the fence is checked where it matters).
    async fn next(allocator: &Arc<SeqAllocator>, conversation: &ConversationId) -> Result<u64, LeaseError> {
        allocator.next(conversation, CLAIM).await.map(|allocated| allocated.seq)
    }

    fn conversation(name: &str) -> ConversationId {
        ConversationId::parse(name).expect("valid conversation")
    }

    #[tokio::test(start_paused = true)]
    async fn seqs_increase_and_prefetch_keeps_ahead() {
        let leaser = Arc::new(MemoryLeaser::default());
        // Segments last 20 ms here; keep only `prefetch_segments` ahead whatever the pace.
        let config = SeqConfig { min_step: 10, max_step: 10, prefetch_ahead: Duration::ZERO, ..SeqConfig::default() };
        let allocator = Arc::new(SeqAllocator::new(leaser.clone(), config));
        let room = conversation("room:lobby");
        let mut last = 0;
        for i in 0..100 {
            let started = Instant::now();
            let seq = next(&allocator, &room).await.expect("lease");
            // Time is paused and a lease takes 1 ms: only the very first call may wait.
            if i > 0 {
                assert_eq!(started.elapsed(), Duration::ZERO, "call {i} waited for a lease");
            }
            assert!(seq > last);
            last = seq;
            tokio::time::sleep(Duration::from_millis(2)).await; // the prefetch task runs
        }
        assert_eq!(last, 100, "no gaps while nothing crashed");
        // 10 segments used, and `prefetch_segments` more already leased ahead: the first
        // prefetch leased both of those at once, every later one the segment just used.
        let ahead = SeqConfig::default().prefetch_segments;
        assert_eq!(leaser.high_water(&room), (10 + ahead as u64) * 10);
        assert_eq!(leaser.leases.load(Ordering::SeqCst), 10 + ahead - 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hot_conversation_tops_up_its_prefetch_in_batches_not_a_lease_per_segment() {
        let leaser = Arc::new(MemoryLeaser::default());
        // 10 segments a ms, 20 ms of them kept ahead: 200 segments deep at least.
        let config =
            SeqConfig { min_step: 10, max_step: 10, prefetch_ahead: Duration::from_millis(20), ..SeqConfig::default() };
        let allocator = Arc::new(SeqAllocator::new(leaser.clone(), config));
        let room = conversation("room:hot");
        let mut last = 0;
        for ms in 0..300 {
            for _ in 0..100 {
                let started = Instant::now();
                let seq = next(&allocator, &room).await.expect("lease");
                if ms > 0 {
                    assert_eq!(started.elapsed(), Duration::ZERO, "a call waited for a lease at {ms} ms");
                }
                assert!(seq > last);
                last = seq;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(last >= 30_000);
        let leases = leaser.leases.load(Ordering::SeqCst) as u64;
        let segments = leaser.high_water(&room) / 10;
        assert!(segments > 3000, "{segments} segments leased");
        // A lease per segment would be 3,000 round trips; a quarter of 200 at a time, 60.
        assert!(leases * 20 < segments, "{leases} leases for {segments} segments");
        assert_eq!(allocator.leases(), leases);
        // Within a ms the calls take no time here, so the depth goes to its cap.
        let ahead = segments - last / 10;
        assert!(ahead <= MAX_PREFETCH as u64 + 1, "{ahead} segments leased ahead: more than the cap");
    }

    #[tokio::test(start_paused = true)]
    async fn a_conversation_held_at_max_step_keeps_enough_ahead_to_ride_out_a_slow_lease() {
        let leaser = Arc::new(MemoryLeaser::default());
        let config =
            SeqConfig { min_step: 10, max_step: 10, prefetch_ahead: Duration::from_millis(20), ..SeqConfig::default() };
        let allocator = Arc::new(SeqAllocator::new(leaser.clone(), config));
        let room = conversation("room:hot");
        // Leases are quick at first (0 ms) while the caller uses 10 seqs (a segment) a ms.
        leaser.delays_ms.lock().expect("not poisoned").extend([0; 200]);
        for _ in 0..100 {
            for _ in 0..10 {
                next(&allocator, &room).await.expect("lease");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Then one lease takes 10 ms: ten segments' worth. Two segments ahead would run
        // dry; 20 ms ahead must not.
        {
            let mut delays = leaser.delays_ms.lock().expect("not poisoned");
            delays.clear();
            delays.push_back(10);
            delays.extend([0; 200]);
        }
        let mut last = 0;
        for ms in 0..50 {
            for _ in 0..10 {
                let started = Instant::now();
                let seq = next(&allocator, &room).await.expect("lease");
                assert_eq!(started.elapsed(), Duration::ZERO, "a call waited for a lease at {ms} ms");
                assert!(seq > last);
                last = seq;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(allocator.foreground_leases(), 1, "only the very first segment is waited for");
    }

    #[tokio::test(start_paused = true)]
    async fn step_grows_for_hot_conversations_and_shrinks_for_quiet_ones() {
        let leaser = Arc::new(MemoryLeaser::default());
        let config = SeqConfig { min_step: 4, max_step: 64, ..SeqConfig::default() };
        let allocator = Arc::new(SeqAllocator::new(leaser, config));
        let hot = conversation("grp:hot");
        for _ in 0..500 {
            next(&allocator, &hot).await.expect("lease");
            tokio::task::yield_now().await;
        }
        assert_eq!(allocator.current_step(&hot), Some(64));
        for _ in 0..400 {
            tokio::time::sleep(Duration::from_secs(30)).await;
            next(&allocator, &hot).await.expect("lease");
        }
        assert_eq!(allocator.current_step(&hot), Some(4));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_conversations_are_forgotten_and_start_above_their_old_seqs() {
        let leaser = Arc::new(MemoryLeaser::default());
        let config = SeqConfig { min_step: 10, max_step: 10, ..SeqConfig::default() };
        let allocator = Arc::new(SeqAllocator::new(leaser.clone(), config));
        let (quiet, busy) = (conversation("dm:a:b"), conversation("room:busy"));
        let first_quiet = next(&allocator, &quiet).await.expect("lease");
        next(&allocator, &busy).await.expect("lease");
        tokio::time::sleep(Duration::from_millis(5)).await; // prefetches finish

        // Both are kept for the sweeps of one idle time but the last; `busy` is used again
        // before that one.
        for _ in 1..SWEEPS_PER_IDLE {
            assert_eq!(allocator.evict_idle(), 0);
        }
        next(&allocator, &busy).await.expect("seq");
        assert_eq!(allocator.evict_idle(), 1, "only the idle conversation goes");
        assert_eq!(allocator.conversations(), 1);

        // Coming back, it leases afresh: the rest of its old segments is a gap, never reused.
        let leases_before = leaser.leases.load(Ordering::SeqCst);
        let again = next(&allocator, &quiet).await.expect("lease");
        assert_eq!(first_quiet, 1, "the first lease was 1..=10");
        assert_eq!(again, 11, "after the whole old lease: 2..=10 are skipped, none reused");
        assert!(leaser.leases.load(Ordering::SeqCst) > leases_before, "a new lease was taken");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_for_an_evicted_entry_is_dropped_not_reused() {
        let leaser = Arc::new(MemoryLeaser::default());
        let config = SeqConfig { min_step: 10, max_step: 10, ..SeqConfig::default() };
        let allocator = Arc::new(SeqAllocator::new(leaser.clone(), config));
        let room = conversation("room:lobby");
        let mut seen = Vec::new();
        for round in 0..20 {
            // Take seqs so prefetches start, and evict while they may be under way.
            for _ in 0..7 {
                seen.push(next(&allocator, &room).await.expect("seq"));
            }
            for _ in 0..SWEEPS_PER_IDLE {
                allocator.evict_idle();
            }
            if round % 3 == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "seqs only go up across evictions: {seen:?}");
    }

    #[tokio::test]
    async fn failed_lease_is_reported_and_retry_succeeds() {
        struct Flaky(AtomicUsize);
        #[async_trait]
        impl SeqLeases for Flaky {
            async fn lease(
                &self,
                conversation: &ConversationId,
                step: u64,
                claim: OwnerClaim,
            ) -> Result<Lease, LeaseError> {
                if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(LeaseError::Database { conversation: conversation.clone(), reason: "down".into() });
                }
                let fence = Fence { node: claim.node, epoch: claim.epoch };
                Ok(Lease { range: SeqRange { first: 1, last: step }, fence })
            }
        }
        let allocator = Arc::new(SeqAllocator::new(Arc::new(Flaky(AtomicUsize::new(0))), SeqConfig::default()));
        let dm = conversation("dm:a:b");
        let error = next(&allocator, &dm).await.expect_err("first lease fails");
        assert!(error.to_string().contains("dm:a:b"), "{error}");
        assert_eq!(next(&allocator, &dm).await.expect("second lease"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_under_another_fence_drops_the_segments_still_held() {
        let leaser = Arc::new(MemoryLeaser::default());
        let config = SeqConfig { min_step: 10, max_step: 10, prefetch_ahead: Duration::ZERO, ..SeqConfig::default() };
        let allocator = Arc::new(SeqAllocator::new(leaser.clone(), config));
        let room = conversation("room:lobby");
        let first = allocator.next(&room, CLAIM).await.expect("seq");
        assert_eq!(first, Allocated { seq: 1, fence: Fence { node: CLAIM.node, epoch: 1 } });
        tokio::time::sleep(Duration::from_millis(5)).await; // the prefetch lands: 11..=30 held

        // Node 2 takes the conversation over at epoch 2, then this node takes it back at 3:
        // the segments it still holds were leased under a fence no commit will accept.
        let other = OwnerClaim { node: NodeId(2), epoch: 2 };
        let taken = leaser.lease(&room, 10, other).await.expect("node 2 takes over");
        let back = OwnerClaim { node: CLAIM.node, epoch: 3 };
        let theirs = leaser.lease(&room, 10, back).await.expect("taken back");
        assert_eq!(theirs.fence, Fence { node: CLAIM.node, epoch: 3 });
        // What this allocator holds still carries the old fence (its commits will be
        // refused and the caller forgets it) until a lease of its own comes back.
        let stale = allocator.next(&room, back).await.expect("seq");
        assert_eq!(stale.fence.epoch, 1);
        for _ in 0..40 {
            allocator.next(&room, back).await.expect("seq");
        }
        let fresh = allocator.next(&room, back).await.expect("seq");
        assert_eq!(fresh.fence, Fence { node: CLAIM.node, epoch: 3 }, "only seqs of the new fence from here");
        assert!(fresh.seq > taken.range.last, "above node 2's range: {fresh:?} vs {taken:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_lease_drops_the_segments_held_and_names_the_owner() {
        let leaser = Arc::new(MemoryLeaser::default());
        let config = SeqConfig {
            min_step: 10,
            max_step: 10,
            prefetch_segments: 1,
            prefetch_ahead: Duration::ZERO,
            ..SeqConfig::default()
        };
        let allocator = Arc::new(SeqAllocator::new(leaser.clone(), config));
        let dm = conversation("dm:a:b");
        next(&allocator, &dm).await.expect("seq");
        leaser.lease(&dm, 10, OwnerClaim { node: NodeId(2), epoch: 2 }).await.expect("node 2 takes over");

        // Use up the segment in use; the prefetch (and then the refill) are refused.
        let mut refused = None;
        for _ in 0..40 {
            match next(&allocator, &dm).await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(2)).await,
                Err(error) => {
                    refused = Some(error);
                    break;
                }
            }
        }
        let Some(LeaseError::Superseded { conversation, node, epoch }) = refused else {
            panic!("the lease must be refused once node 2 owns the conversation: {refused:?}")
        };
        assert_eq!((conversation, node, epoch), (dm.clone(), NodeId(2), 2));
        assert!(
            !allocator.conversations.get(&dm).is_some_and(|c| c.has_available()),
            "nothing held under the old fence is handed out again"
        );
        // At a newer epoch this node takes it back, above everything node 2 was given.
        let back = allocator.next(&dm, OwnerClaim { node: CLAIM.node, epoch: 3 }).await.expect("taken back");
        assert_eq!(back.fence, Fence { node: CLAIM.node, epoch: 3 });
        assert!(back.seq > 20, "{back:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn forgotten_and_unretained_conversations_lease_afresh_above_their_old_seqs() {
        let leaser = Arc::new(MemoryLeaser::default());
        let config = SeqConfig { min_step: 10, max_step: 10, ..SeqConfig::default() };
        let allocator = Arc::new(SeqAllocator::new(leaser.clone(), config));
        let (mine, theirs, gone) = (conversation("dm:a:b"), conversation("room:x"), conversation("grp:g"));
        for c in [&mine, &theirs, &gone] {
            assert_eq!(next(&allocator, c).await.expect("seq"), 1);
        }
        allocator.forget(&gone);
        assert_eq!(allocator.conversations(), 2);
        assert_eq!(allocator.retain(|c| c != &theirs), 1, "the one this node no longer owns");
        assert_eq!(allocator.retain(|_| true), 0);
        assert_eq!(allocator.conversations(), 1);
        assert_eq!(next(&allocator, &mine).await.expect("seq"), 2, "kept: its segment goes on");
        tokio::time::sleep(Duration::from_millis(5)).await;
        for c in [&theirs, &gone] {
            let high = leaser.high_water(c);
            let again = next(&allocator, c).await.expect("seq");
            assert_eq!(again, high + 1, "a new lease, above all the old ones: {c}");
        }
    }
}

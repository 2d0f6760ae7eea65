//! Dedup marks on (sender, client_msg_id): a try/cancel pair with a TTL.
//!
//! A send first takes the mark. If a later step fails the mark is cancelled, so the
//! client's retry is processed rather than swallowed; if the process dies between failure
//! and cancel, the TTL heals it. A duplicate that arrives while the original is still in
//! flight waits for the original's outcome and answers with the same ids. The unique index
//! in storage is the final guard beyond the TTL.
//!
//! In embedded mode the marks live in this process ([`LocalDedup`]), one for every send of
//! the last `delivery.dedup_ttl_ms`, so a burst leaves hundreds of thousands of them: each
//! is kept small (docs/ARCHITECTURE.md, "Memory per dedup mark"). Their number is bounded
//! (`delivery.dedup_max_marks`, the oldest go first); a mark dropped early costs only a
//! trip to the unique index, which answers the duplicate with the original's ids all the
//! same.

use std::collections::VecDeque;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hashbrown::HashTable;
use tokio::sync::watch;

use super::SendError;
use crate::maps;
use crate::model::{ClientMsgId, ConversationId, UserId};

/// The ids a stored message was given: what a duplicate is answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub message_id: u64,
    pub seq: u64,
    pub conversation: ConversationId,
}

/// The outcome of a send in flight elsewhere, once it ends.
pub type Original = Pin<Box<dyn Future<Output = Result<Outcome, SendError>> + Send>>;

/// What taking a mark found.
pub enum Mark {
    /// The mark is ours: process the send, then complete or cancel it.
    Fresh,
    /// Stored before, with these ids.
    Stored(Outcome),
    /// Being processed right now: resolves to its ids once stored, or to why to retry.
    InFlight(Original),
}

/// Dedup marks on (sender, client_msg_id). Embedded: this process ([`LocalDedup`]).
/// Cluster: shared by the nodes, since a retry may reach another owner after a ring change.
#[async_trait]
pub trait DedupMarks: Send + Sync + 'static {
    /// Takes the mark for (`sender`, `client_msg_id`), sent to `conversation`, or says who
    /// holds it. A mark may answer [`Mark::Stored`] only for the conversation its send was
    /// stored in; for another it may answer [`Mark::Fresh`] instead, leaving the unique index
    /// to answer with the original's ids and conversation.
    async fn try_mark(&self, sender: &UserId, client_msg_id: &ClientMsgId, conversation: &ConversationId) -> Mark;
    /// The send was stored: duplicates are answered with `outcome` until the mark expires.
    async fn complete(&self, sender: &UserId, client_msg_id: &ClientMsgId, outcome: Outcome);
    /// The send failed: drop the mark so a retry is processed.
    async fn cancel(&self, sender: &UserId, client_msg_id: &ClientMsgId);
    /// How many marks this process holds; marks kept elsewhere (Redis) count none here.
    fn held_here(&self) -> u64 {
        0
    }
}

/// A mark a send took ([`Mark::Fresh`]) and holds until it is completed or cancelled.
///
/// Dropped before either — the send's future dropped midway, as a timeout around it or a
/// closing connection does — it cancels the mark, so the client's retry is processed
/// rather than left waiting on a send that will never end until the mark expires. Drop
/// cannot wait, so that cancel runs as a task of its own: a retry that comes before it
/// has run finds the mark pending, and is told to retry once it is gone. Cancelling a
/// mark whose send did reach storage costs only a trip to the unique index, which answers
/// the retry with the original's ids.
pub struct HeldMark {
    marks: Arc<dyn DedupMarks>,
    /// Whose mark, until it is completed or cancelled.
    held: Option<(UserId, ClientMsgId)>,
}

impl HeldMark {
    /// The mark on (`sender`, `client_msg_id`) just taken from `marks`.
    pub fn new(marks: Arc<dyn DedupMarks>, sender: UserId, client_msg_id: ClientMsgId) -> Self {
        Self { marks, held: Some((sender, client_msg_id)) }
    }

    /// The send was stored with `outcome` ([`DedupMarks::complete`]).
    pub async fn complete(mut self, outcome: Outcome) {
        if let Some((sender, client_msg_id)) = &self.held {
            self.marks.complete(sender, client_msg_id, outcome).await;
        }
        // Let go only once done: dropped midway, the mark is cancelled instead.
        self.held = None;
    }

    /// The send failed: the mark is dropped now, before the answer that asks for a retry.
    pub async fn cancel(mut self) {
        if let Some((sender, client_msg_id)) = &self.held {
            self.marks.cancel(sender, client_msg_id).await;
        }
        self.held = None;
    }
}

impl Drop for HeldMark {
    fn drop(&mut self) {
        let Some((sender, client_msg_id)) = self.held.take() else { return };
        // Without a runtime the process is ending; the mark's TTL heals it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let marks = Arc::clone(&self.marks);
            runtime.spawn(async move { marks.cancel(&sender, &client_msg_id).await });
        }
    }
}

/// How a send in flight ends, for the duplicates waiting on it: `None` until then,
/// `Some(Some(outcome))` once stored, `Some(None)` once cancelled.
type Ending = watch::Sender<Option<Option<Outcome>>>;

/// Waits for the send holding a mark to end: its ids once stored, or why it did not store.
async fn await_original(mut original: watch::Receiver<Option<Option<Outcome>>>) -> Result<Outcome, SendError> {
    loop {
        if let Some(outcome) = original.borrow_and_update().clone() {
            return outcome.ok_or(SendError::OriginalFailed);
        }
        if original.changed().await.is_err() {
            return Err(SendError::OriginalAbandoned);
        }
    }
}

/// Shards of [`LocalDedup`]: sends of different senders rarely wait for one lock.
const SHARDS: usize = 16;

/// In-process dedup marks (embedded mode).
///
/// A mark is kept as a 128-bit fingerprint of (sender, client_msg_id) under two secret
/// SipHash keys drawn at start, not as the two strings: nobody can choose ids that collide,
/// and by chance two of 500,000 marks collide once in some 10^27 bursts. A stored mark
/// keeps a keyed hash of its conversation, not the name: a duplicate names its
/// conversation, and is answered with it when the hashes match (a client that reuses an id
/// in another conversation is answered by the unique index). A send in flight holds no
/// channel until a duplicate waits for it.
///
/// Every mark lives as long, so expiry is first in, first out: each shard keeps its marks
/// as slots in a queue in the order they were taken, and finds them through a hash table
/// of slot numbers (8 bytes an entry; the slot holds the fingerprint it is compared with).
/// A hash map of the marks themselves cost twice as much: under the steady turnover of a
/// full shard (one mark in, the oldest out) its tombstones made it grow to twice the
/// buckets its marks need, each bucket a whole mark (docs/ARCHITECTURE.md, "Memory per
/// dedup mark"). A shard hands back the room a burst made it grow to once most of its marks
/// expired.
pub struct LocalDedup {
    shards: Box<[Mutex<Shard>]>,
    keys: [RandomState; 2],
    /// Keys the hash of a stored mark's conversation.
    conversations: RandomState,
    ttl_ms: u64,
    shard_capacity: usize,
    started: Instant,
}

/// A mark's identity: (sender, client_msg_id) hashed under two independent secret keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    high: u64,
    low: u64,
}

/// One taking of a mark: whose, until when, and its state. The expiry also tells this
/// taking from an earlier one that was cancelled.
struct Slot {
    fingerprint: Fingerprint,
    expires_ms: u64,
    state: State,
}

enum State {
    /// In flight; the channel exists once a duplicate waits for the outcome.
    Pending(Option<Arc<Ending>>),
    Stored(StoredIds),
    /// Cancelled, or taken again since: no longer in the index, its slot waits to come up.
    Gone,
}

/// A stored send's ids, and its conversation as a keyed hash.
struct StoredIds {
    message_id: u64,
    seq: u64,
    conversation: u64,
}

/// A shard, locked. A panic while one was held leaves it consistent: every change to it
/// is a single queue or table operation, the index's and the slot's made together.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Default)]
struct Shard {
    /// Every taking not yet forgotten, oldest first; slot `n` (counted since the shard
    /// began) is at `slots[n - first]`.
    slots: VecDeque<Slot>,
    /// The number of `slots[0]`.
    first: u64,
    /// The number of the slot holding each live mark, hashed by its fingerprint's `low`.
    index: HashTable<u64>,
}

impl Shard {
    fn slot(&self, number: u64) -> &Slot {
        &self.slots[self.position(number)]
    }

    fn slot_mut(&mut self, number: u64) -> &mut Slot {
        let position = self.position(number);
        &mut self.slots[position]
    }

    fn position(&self, number: u64) -> usize {
        position(self.first, number)
    }

    /// The number of the slot holding `fingerprint`'s live mark.
    fn find(&self, fingerprint: Fingerprint) -> Option<u64> {
        self.index.find(fingerprint.low, |&number| self.slot(number).fingerprint == fingerprint).copied()
    }

    /// Takes slot `number`'s mark out of the index and marks it gone; returns its state.
    fn retire(&mut self, number: u64) -> State {
        let fingerprint = self.slot(number).fingerprint;
        if let Ok(entry) = self.index.find_entry(fingerprint.low, |&held| held == number) {
            entry.remove();
        }
        std::mem::replace(&mut self.slot_mut(number).state, State::Gone)
    }

    /// Queues a new pending mark for `fingerprint`.
    fn take(&mut self, fingerprint: Fingerprint, expires_ms: u64) {
        let number = self.first + self.slots.len() as u64;
        self.slots.push_back(Slot { fingerprint, expires_ms, state: State::Pending(None) });
        let Self { slots, first, index } = self;
        index.insert_unique(fingerprint.low, number, slot_hash(slots, *first));
    }

    /// Forgets the marks expired by `now_ms`, and the oldest while `capacity` slots or more
    /// are queued (one is kept free for the mark about to be taken).
    fn expire(&mut self, now_ms: u64, capacity: usize) {
        while let Some(oldest) = self.slots.front() {
            if oldest.expires_ms > now_ms && self.slots.len() < capacity {
                break;
            }
            if !matches!(oldest.state, State::Gone) {
                // A pending mark dropped here (evicted; an expired one is long abandoned)
                // drops its channel too: a duplicate waiting on it is told to retry.
                self.retire(self.first);
            }
            self.slots.pop_front();
            self.first += 1;
        }
        self.shrink_if_sparse();
    }

    /// Hands back the room a burst made the queue and the index grow to ([`maps::is_sparse`]).
    fn shrink_if_sparse(&mut self) {
        const KEEP: usize = 64;
        if maps::is_sparse(self.slots.len(), self.slots.capacity(), KEEP) {
            self.slots.shrink_to(self.slots.len() * 2);
        }
        if maps::is_sparse(self.index.len(), self.index.capacity(), KEEP) {
            let Self { slots, first, index } = self;
            index.shrink_to(index.len() * 2, slot_hash(slots, *first));
        }
    }
}

/// Where slot `number` sits in a queue whose front is slot `first`. A number in the index
/// is of a slot still queued: at least `first`, below `first + slots.len()`.
fn position(first: u64, number: u64) -> usize {
    usize::try_from(number - first).unwrap_or(usize::MAX)
}

/// The index's hasher, for when it grows or shrinks: a slot number hashes as its slot's
/// fingerprint.
fn slot_hash(slots: &VecDeque<Slot>, first: u64) -> impl Fn(&u64) -> u64 + '_ {
    move |&number| slots[position(first, number)].fingerprint.low
}

#[async_trait]
impl DedupMarks for LocalDedup {
    async fn try_mark(&self, sender: &UserId, client_msg_id: &ClientMsgId, conversation: &ConversationId) -> Mark {
        self.try_mark_now(sender, client_msg_id, conversation)
    }

    async fn complete(&self, sender: &UserId, client_msg_id: &ClientMsgId, outcome: Outcome) {
        let fingerprint = self.fingerprint(sender, client_msg_id);
        let ids = StoredIds {
            message_id: outcome.message_id,
            seq: outcome.seq,
            conversation: self.conversations.hash_one(&outcome.conversation),
        };
        let waiting = {
            let mut shard = self.shard(fingerprint);
            let Some(number) = shard.find(fingerprint) else { return };
            match std::mem::replace(&mut shard.slot_mut(number).state, State::Stored(ids)) {
                State::Pending(waiting) => waiting,
                State::Stored(_) | State::Gone => None,
            }
        };
        if let Some(waiting) = waiting {
            waiting.send_replace(Some(Some(outcome)));
        }
    }

    async fn cancel(&self, sender: &UserId, client_msg_id: &ClientMsgId) {
        let fingerprint = self.fingerprint(sender, client_msg_id);
        let removed = {
            let mut shard = self.shard(fingerprint);
            let Some(number) = shard.find(fingerprint) else { return };
            shard.retire(number)
        };
        if let State::Pending(Some(waiting)) = removed {
            waiting.send_replace(Some(None));
        }
    }

    fn held_here(&self) -> u64 {
        // Expired marks are held until their shard is next used, which on an idle node is
        // never: expire them now, so memory is freed and the count is exact.
        self.run_upkeep();
        self.len()
    }
}

impl LocalDedup {
    /// Marks that live for `ttl` from when they were taken, at most `max_marks` of them
    /// (the oldest of a shard go first; at least one a shard).
    pub fn new(ttl: Duration, max_marks: u64) -> Self {
        let max_marks = usize::try_from(max_marks).unwrap_or(usize::MAX);
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            keys: [RandomState::new(), RandomState::new()],
            conversations: RandomState::new(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            shard_capacity: (max_marks / SHARDS).max(1),
            started: Instant::now(),
        }
    }

    /// Takes the mark for (`sender`, `client_msg_id`), sent to `conversation`, or says who
    /// holds it.
    fn try_mark_now(&self, sender: &UserId, client_msg_id: &ClientMsgId, conversation: &ConversationId) -> Mark {
        self.try_mark_at(sender, client_msg_id, conversation, self.now_ms())
    }

    /// [`try_mark_now`](Self::try_mark_now) as it would go at `now_ms` (since `started`).
    fn try_mark_at(
        &self,
        sender: &UserId,
        client_msg_id: &ClientMsgId,
        conversation: &ConversationId,
        now_ms: u64,
    ) -> Mark {
        let fingerprint = self.fingerprint(sender, client_msg_id);
        let mut shard = self.shard(fingerprint);
        if let Some(number) = shard.find(fingerprint) {
            let slot = shard.slot_mut(number);
            if slot.expires_ms > now_ms {
                match &mut slot.state {
                    State::Stored(ids) if ids.conversation == self.conversations.hash_one(conversation) => {
                        let (message_id, seq) = (ids.message_id, ids.seq);
                        return Mark::Stored(Outcome { message_id, seq, conversation: conversation.clone() });
                    }
                    State::Pending(waiting) => {
                        let ending = waiting.get_or_insert_with(|| Arc::new(watch::Sender::new(None)));
                        return Mark::InFlight(Box::pin(await_original(ending.subscribe())));
                    }
                    // Stored in another conversation, which the mark cannot name: taken
                    // afresh, so the send reaches the unique index, which answers with the
                    // original.
                    State::Stored(_) | State::Gone => {}
                }
            }
            // Expired, not yet forgotten, or stored elsewhere: taken afresh below.
            shard.retire(number);
        }
        // Room for the new mark: forget what expired, or the oldest when full.
        shard.expire(now_ms, self.shard_capacity);
        shard.take(fingerprint, now_ms.saturating_add(self.ttl_ms));
        Mark::Fresh
    }

    fn fingerprint(&self, sender: &UserId, client_msg_id: &ClientMsgId) -> Fingerprint {
        let key = (sender, client_msg_id);
        Fingerprint { high: self.keys[0].hash_one(key), low: self.keys[1].hash_one(key) }
    }

    /// The shard of a mark, chosen by the half of its fingerprint the index does not hash by.
    fn shard(&self, fingerprint: Fingerprint) -> MutexGuard<'_, Shard> {
        // The remainder is below SHARDS, so it fits a usize.
        let index = (fingerprint.high % SHARDS as u64) as usize;
        lock(&self.shards[index])
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Forgets expired marks now; it also happens as marks are taken, this only makes
    /// [`LocalDedup::len`] exact and frees an idle node's memory.
    pub fn run_upkeep(&self) {
        self.upkeep_at(self.now_ms());
    }

    fn upkeep_at(&self, now_ms: u64) {
        for shard in self.shards.iter() {
            lock(shard).expire(now_ms, self.shard_capacity + 1);
        }
    }

    /// How many marks are held (expired ones too, until [`LocalDedup::run_upkeep`]).
    pub fn len(&self) -> u64 {
        let held: usize = self.shards.iter().map(|shard| lock(shard).index.len()).sum();
        u64::try_from(held).unwrap_or(u64::MAX)
    }

    /// Whether no mark is held (see [`LocalDedup::len`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> (UserId, ClientMsgId) {
        (
            UserId::parse("u").expect("valid"),
            ClientMsgId::parse(&format!("00000000-0000-4000-8000-{n:012}")).expect("valid"),
        )
    }

    fn dm() -> ConversationId {
        ConversationId::parse("dm:a:u").expect("valid")
    }

    fn outcome(message_id: u64) -> Outcome {
        Outcome { message_id, seq: 3, conversation: dm() }
    }

    #[tokio::test]
    async fn try_complete_cancel() {
        let dedup = LocalDedup::new(Duration::from_secs(60), 1000);
        let (user, id) = key(1);
        assert!(matches!(dedup.try_mark(&user, &id, &dm()).await, Mark::Fresh));
        let Mark::InFlight(waiting) = dedup.try_mark(&user, &id, &dm()).await else { panic!("in flight") };
        let Mark::InFlight(waiting_too) = dedup.try_mark(&user, &id, &dm()).await else { panic!("in flight") };
        let waiting = tokio::spawn(waiting);
        dedup.complete(&user, &id, outcome(9)).await;
        assert_eq!(waiting.await.expect("joined"), Ok(outcome(9)), "a duplicate in flight gets the original's ids");
        assert_eq!(waiting_too.await, Ok(outcome(9)), "so does every other one");
        assert!(matches!(dedup.try_mark(&user, &id, &dm()).await, Mark::Stored(o) if o == outcome(9)));

        let (user, id) = key(2);
        assert!(matches!(dedup.try_mark(&user, &id, &dm()).await, Mark::Fresh));
        let Mark::InFlight(waiting) = dedup.try_mark(&user, &id, &dm()).await else { panic!("in flight") };
        dedup.cancel(&user, &id).await;
        assert_eq!(waiting.await, Err(SendError::OriginalFailed));
        assert!(
            matches!(dedup.try_mark(&user, &id, &dm()).await, Mark::Fresh),
            "a cancelled mark lets the retry through"
        );
    }

    #[tokio::test]
    async fn marks_of_other_senders_or_ids_are_apart() {
        let dedup = LocalDedup::new(Duration::from_secs(60), 1000);
        let (user, id) = key(1);
        let (_, other_id) = key(2);
        let other_user = UserId::parse("v").expect("valid");
        assert!(matches!(dedup.try_mark(&user, &id, &dm()).await, Mark::Fresh));
        dedup.complete(&user, &id, outcome(9)).await;
        assert!(matches!(dedup.try_mark(&user, &other_id, &dm()).await, Mark::Fresh), "another id of the same sender");
        assert!(matches!(dedup.try_mark(&other_user, &id, &dm()).await, Mark::Fresh), "the same id of another sender");
        assert_eq!(dedup.len(), 3);
    }

    #[tokio::test]
    async fn a_duplicate_naming_another_conversation_is_left_to_the_unique_index() {
        let dedup = LocalDedup::new(Duration::from_secs(60), 1000);
        let (user, id) = key(1);
        let elsewhere = ConversationId::parse("dm:b:u").expect("valid");
        assert!(matches!(dedup.try_mark(&user, &id, &dm()).await, Mark::Fresh));
        dedup.complete(&user, &id, outcome(9)).await;
        assert!(
            matches!(dedup.try_mark(&user, &id, &elsewhere).await, Mark::Fresh),
            "the mark cannot name the original's conversation: the send goes on to the unique index"
        );
        // That send finds the original there and completes the mark with its ids.
        dedup.complete(&user, &id, outcome(9)).await;
        let Mark::Stored(answer) = dedup.try_mark(&user, &id, &dm()).await else { panic!("stored") };
        assert_eq!(answer, outcome(9), "the original's conversation is answered from the mark again");
    }

    /// A mark is one slot and one index entry, with nothing allocated apart: what a
    /// burst's hundred thousand marks cost (docs/ARCHITECTURE.md, "Memory per dedup mark").
    #[test]
    fn a_mark_is_a_small_slot() {
        assert!(std::mem::size_of::<Slot>() <= 56, "{} bytes", std::mem::size_of::<Slot>());
    }

    #[test]
    fn marks_expire_after_the_ttl() {
        let dedup = LocalDedup::new(Duration::from_millis(50), 1000);
        let (user, id) = key(1);
        assert!(matches!(dedup.try_mark_at(&user, &id, &dm(), 0), Mark::Fresh));
        assert!(matches!(dedup.try_mark_at(&user, &id, &dm(), 49), Mark::InFlight(_)), "held until the ttl");
        assert!(matches!(dedup.try_mark_at(&user, &id, &dm(), 50), Mark::Fresh), "an expired mark is taken afresh");
    }

    #[tokio::test]
    async fn a_mark_taken_again_after_a_cancel_lives_its_own_ttl() {
        let dedup = LocalDedup::new(Duration::from_millis(1000), 1000);
        let (user, id) = key(1);
        assert!(matches!(dedup.try_mark_at(&user, &id, &dm(), 0), Mark::Fresh));
        dedup.cancel(&user, &id).await;
        assert!(matches!(dedup.try_mark_at(&user, &id, &dm(), 600), Mark::Fresh), "the retry takes it again");
        // Past the first taking's expiry, well before the second's.
        dedup.upkeep_at(1200);
        assert!(
            matches!(dedup.try_mark_at(&user, &id, &dm(), 1200), Mark::InFlight(_)),
            "the second taking still holds it"
        );
    }

    #[test]
    fn marks_are_bounded() {
        let dedup = LocalDedup::new(Duration::from_secs(60), 100);
        for n in 0..1000 {
            let (user, id) = key(n);
            assert!(matches!(dedup.try_mark_now(&user, &id, &dm()), Mark::Fresh));
        }
        dedup.run_upkeep();
        assert!(dedup.len() <= 100, "{} marks held", dedup.len());
        let (user, id) = key(999);
        assert!(!matches!(dedup.try_mark_now(&user, &id, &dm()), Mark::Fresh), "the most recent marks are kept");
        let (user, id) = key(0);
        assert!(matches!(dedup.try_mark_now(&user, &id, &dm()), Mark::Fresh), "the oldest went first");
    }

    #[tokio::test]
    async fn a_duplicate_waiting_on_an_evicted_mark_is_told_to_retry() {
        let dedup = LocalDedup::new(Duration::from_secs(60), SHARDS as u64);
        let (user, id) = key(0);
        assert!(matches!(dedup.try_mark_now(&user, &id, &dm()), Mark::Fresh));
        let Mark::InFlight(waiting) = dedup.try_mark_now(&user, &id, &dm()) else { panic!("in flight") };
        // One mark per shard: enough others push it out of its shard.
        for n in 1..1000 {
            let (user, id) = key(n);
            dedup.try_mark_now(&user, &id, &dm());
        }
        assert_eq!(waiting.await, Err(SendError::OriginalAbandoned));
    }

    /// Under the steady turnover of full shards (one mark in, the oldest out, marks
    /// cancelled and taken again among them) the room held stays that of the marks.
    #[tokio::test]
    async fn full_shards_turning_over_stay_within_their_room() {
        const MAX: u64 = SHARDS as u64 * 1000;
        let dedup = LocalDedup::new(Duration::from_secs(60), MAX);
        for n in 0..200_000 {
            let (user, id) = key(n);
            assert!(matches!(dedup.try_mark_now(&user, &id, &dm()), Mark::Fresh));
            if n % 7 == 0 {
                dedup.cancel(&user, &id).await;
                assert!(matches!(dedup.try_mark_now(&user, &id, &dm()), Mark::Fresh), "taken again");
            }
            if n % 3 == 0 {
                dedup.complete(&user, &id, outcome(u64::from(n))).await;
            }
        }
        assert!(dedup.len() <= MAX, "{} marks held", dedup.len());
        assert!(dedup.len() >= MAX * 3 / 4, "the most recent ones are kept: {}", dedup.len());
        for shard in dedup.shards.iter() {
            let shard = shard.lock().expect("not poisoned");
            assert!(shard.slots.len() <= 1000, "{} slots queued", shard.slots.len());
            assert!(shard.slots.capacity() <= 2 * 1000, "queue room {}", shard.slots.capacity());
            assert!(shard.index.capacity() <= 4 * 1000, "index room {}", shard.index.capacity());
        }
        let (user, id) = key(199_998);
        assert!(matches!(dedup.try_mark_now(&user, &id, &dm()), Mark::Stored(o) if o == outcome(199_998)));
    }

    #[test]
    fn the_room_of_expired_marks_is_handed_back() {
        let dedup = LocalDedup::new(Duration::from_secs(60), 1_000_000);
        for n in 0..100_000 {
            let (user, id) = key(n);
            dedup.try_mark_now(&user, &id, &dm());
        }
        let room = |dedup: &LocalDedup| -> usize {
            let shards = dedup.shards.iter().map(|shard| shard.lock().expect("not poisoned"));
            shards.map(|shard| shard.index.capacity() + shard.slots.capacity()).sum()
        };
        assert!(room(&dedup) >= 200_000);
        dedup.run_upkeep();
        assert_eq!(dedup.len(), 100_000, "none expired yet");
        // As the upkeep would find them a minute later.
        dedup.upkeep_at(dedup.now_ms() + 60_001);
        assert!(dedup.is_empty());
        assert!(room(&dedup) <= SHARDS * 2 * 128, "{} slots kept for no mark", room(&dedup));
    }
}

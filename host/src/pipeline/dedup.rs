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

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
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
    /// Takes the mark for (`sender`, `client_msg_id`), or says who holds it.
    async fn try_mark(&self, sender: &UserId, client_msg_id: &ClientMsgId) -> Mark;
    /// The send was stored: duplicates are answered with `outcome` until the mark expires.
    async fn complete(&self, sender: &UserId, client_msg_id: &ClientMsgId, outcome: Outcome);
    /// The send failed: drop the mark so a retry is processed.
    async fn cancel(&self, sender: &UserId, client_msg_id: &ClientMsgId);
    /// How many marks this process holds; marks kept elsewhere (Redis) count none here.
    fn held_here(&self) -> u64 {
        0
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
/// and by chance two of 500,000 marks collide once in some 10^27 bursts. A send in flight
/// holds no channel until a duplicate waits for it. Each shard forgets its marks in the
/// order they were taken (expiry is first in, first out, as every mark lives as long), and
/// hands back the room a burst made its map grow to once most of its marks expired.
pub struct LocalDedup {
    shards: Box<[Mutex<Shard>]>,
    keys: [RandomState; 2],
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

impl Hash for Fingerprint {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Already a keyed hash: its half is the map's hash as it is.
        state.write_u64(self.low);
    }
}

/// Passes a [`Fingerprint`]'s half through as the map's hash (it is one already).
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; fold anything else in rather than ignore it.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A mark held: until when, and its state. The expiry also tells this taking of a mark from
/// an earlier one that was cancelled (two takings in the same millisecond expire together).
struct Held {
    expires_ms: u64,
    state: State,
}

enum State {
    /// In flight; the channel exists once a duplicate waits for the outcome.
    Pending(Option<Arc<Ending>>),
    Stored(Outcome),
}

/// A shard, locked. A panic while one was held leaves it consistent: every change to it is
/// a single map or queue operation.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Default)]
struct Shard {
    marks: HashMap<Fingerprint, Held, BuildHasherDefault<Prehashed>>,
    /// Marks in the order they were taken, with their expiry: an entry whose mark was
    /// cancelled (or taken again since) is skipped when it comes up.
    order: VecDeque<(Fingerprint, u64)>,
}

impl Shard {
    /// Forgets the marks expired by `now_ms`, and the oldest while more than `capacity`
    /// are held (one slot is kept free for the mark about to be taken).
    fn expire(&mut self, now_ms: u64, capacity: usize) {
        while let Some(&(fingerprint, expires_ms)) = self.order.front() {
            let current = self.marks.get(&fingerprint).filter(|held| held.expires_ms == expires_ms);
            if let Some(held) = current {
                let over = self.marks.len() >= capacity || self.order.len() > 2 * capacity;
                if held.expires_ms > now_ms && !over {
                    break;
                }
                // A pending mark dropped here (evicted; an expired one is long abandoned)
                // drops its channel too: a duplicate waiting on it is told to retry.
                self.marks.remove(&fingerprint);
            }
            self.order.pop_front();
        }
        self.shrink_if_sparse();
    }

    /// Hands back the room a burst made the map and the queue grow to ([`maps::is_sparse`]).
    fn shrink_if_sparse(&mut self) {
        const KEEP: usize = 64;
        if maps::is_sparse(self.marks.len(), self.marks.capacity(), KEEP) {
            self.marks.shrink_to(self.marks.len() * 2);
        }
        if maps::is_sparse(self.order.len(), self.order.capacity(), KEEP) {
            self.order.shrink_to(self.order.len() * 2);
        }
    }
}

#[async_trait]
impl DedupMarks for LocalDedup {
    async fn try_mark(&self, sender: &UserId, client_msg_id: &ClientMsgId) -> Mark {
        self.try_mark_now(sender, client_msg_id)
    }

    async fn complete(&self, sender: &UserId, client_msg_id: &ClientMsgId, outcome: Outcome) {
        let fingerprint = self.fingerprint(sender, client_msg_id);
        let waiting = {
            let mut shard = self.shard(fingerprint);
            let Some(held) = shard.marks.get_mut(&fingerprint) else { return };
            match std::mem::replace(&mut held.state, State::Stored(outcome.clone())) {
                State::Pending(waiting) => waiting,
                State::Stored(_) => None,
            }
        };
        if let Some(waiting) = waiting {
            waiting.send_replace(Some(Some(outcome)));
        }
    }

    async fn cancel(&self, sender: &UserId, client_msg_id: &ClientMsgId) {
        let fingerprint = self.fingerprint(sender, client_msg_id);
        let removed = self.shard(fingerprint).marks.remove(&fingerprint);
        if let Some(Held { state: State::Pending(Some(waiting)), .. }) = removed {
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
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            shard_capacity: (max_marks / SHARDS).max(1),
            started: Instant::now(),
        }
    }

    /// Takes the mark for (`sender`, `client_msg_id`), or says who holds it.
    fn try_mark_now(&self, sender: &UserId, client_msg_id: &ClientMsgId) -> Mark {
        self.try_mark_at(sender, client_msg_id, self.now_ms())
    }

    /// [`try_mark_now`](Self::try_mark_now) as it would go at `now_ms` (since `started`).
    fn try_mark_at(&self, sender: &UserId, client_msg_id: &ClientMsgId, now_ms: u64) -> Mark {
        let fingerprint = self.fingerprint(sender, client_msg_id);
        let mut shard = self.shard(fingerprint);
        match shard.marks.get_mut(&fingerprint) {
            Some(held) if held.expires_ms > now_ms => {
                return match &mut held.state {
                    State::Stored(outcome) => Mark::Stored(outcome.clone()),
                    State::Pending(waiting) => {
                        let ending = waiting.get_or_insert_with(|| Arc::new(watch::Sender::new(None)));
                        Mark::InFlight(Box::pin(await_original(ending.subscribe())))
                    }
                };
            }
            // Expired, not yet forgotten: taken afresh (its place in the order goes stale).
            Some(_) => drop(shard.marks.remove(&fingerprint)),
            None => {}
        }
        // Room for the new mark: forget what expired, or the oldest when full.
        shard.expire(now_ms, self.shard_capacity);
        let expires_ms = now_ms.saturating_add(self.ttl_ms);
        shard.marks.insert(fingerprint, Held { expires_ms, state: State::Pending(None) });
        shard.order.push_back((fingerprint, expires_ms));
        Mark::Fresh
    }

    fn fingerprint(&self, sender: &UserId, client_msg_id: &ClientMsgId) -> Fingerprint {
        let key = (sender, client_msg_id);
        Fingerprint { high: self.keys[0].hash_one(key), low: self.keys[1].hash_one(key) }
    }

    /// The shard of a mark, chosen by the half of its fingerprint the map does not hash by.
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
        let held: usize = self.shards.iter().map(|shard| lock(shard).marks.len()).sum();
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

    fn outcome(message_id: u64) -> Outcome {
        Outcome { message_id, seq: 3, conversation: ConversationId::parse("dm:a:u").expect("valid") }
    }

    #[tokio::test]
    async fn try_complete_cancel() {
        let dedup = LocalDedup::new(Duration::from_secs(60), 1000);
        let (user, id) = key(1);
        assert!(matches!(dedup.try_mark(&user, &id).await, Mark::Fresh));
        let Mark::InFlight(waiting) = dedup.try_mark(&user, &id).await else { panic!("in flight") };
        let Mark::InFlight(waiting_too) = dedup.try_mark(&user, &id).await else { panic!("in flight") };
        let waiting = tokio::spawn(waiting);
        dedup.complete(&user, &id, outcome(9)).await;
        assert_eq!(waiting.await.expect("joined"), Ok(outcome(9)), "a duplicate in flight gets the original's ids");
        assert_eq!(waiting_too.await, Ok(outcome(9)), "so does every other one");
        assert!(matches!(dedup.try_mark(&user, &id).await, Mark::Stored(o) if o == outcome(9)));

        let (user, id) = key(2);
        assert!(matches!(dedup.try_mark(&user, &id).await, Mark::Fresh));
        let Mark::InFlight(waiting) = dedup.try_mark(&user, &id).await else { panic!("in flight") };
        dedup.cancel(&user, &id).await;
        assert_eq!(waiting.await, Err(SendError::OriginalFailed));
        assert!(matches!(dedup.try_mark(&user, &id).await, Mark::Fresh), "a cancelled mark lets the retry through");
    }

    #[tokio::test]
    async fn marks_of_other_senders_or_ids_are_apart() {
        let dedup = LocalDedup::new(Duration::from_secs(60), 1000);
        let (user, id) = key(1);
        let (_, other_id) = key(2);
        let other_user = UserId::parse("v").expect("valid");
        assert!(matches!(dedup.try_mark(&user, &id).await, Mark::Fresh));
        dedup.complete(&user, &id, outcome(9)).await;
        assert!(matches!(dedup.try_mark(&user, &other_id).await, Mark::Fresh), "another id of the same sender");
        assert!(matches!(dedup.try_mark(&other_user, &id).await, Mark::Fresh), "the same id of another sender");
        assert_eq!(dedup.len(), 3);
    }

    #[test]
    fn marks_expire_after_the_ttl() {
        let dedup = LocalDedup::new(Duration::from_millis(50), 1000);
        let (user, id) = key(1);
        assert!(matches!(dedup.try_mark_at(&user, &id, 0), Mark::Fresh));
        assert!(matches!(dedup.try_mark_at(&user, &id, 49), Mark::InFlight(_)), "held until the ttl");
        assert!(matches!(dedup.try_mark_at(&user, &id, 50), Mark::Fresh), "an expired mark is taken afresh");
    }

    #[tokio::test]
    async fn a_mark_taken_again_after_a_cancel_lives_its_own_ttl() {
        let dedup = LocalDedup::new(Duration::from_millis(1000), 1000);
        let (user, id) = key(1);
        assert!(matches!(dedup.try_mark_at(&user, &id, 0), Mark::Fresh));
        dedup.cancel(&user, &id).await;
        assert!(matches!(dedup.try_mark_at(&user, &id, 600), Mark::Fresh), "the retry takes it again");
        // Past the first taking's expiry, well before the second's.
        dedup.upkeep_at(1200);
        assert!(matches!(dedup.try_mark_at(&user, &id, 1200), Mark::InFlight(_)), "the second taking still holds it");
    }

    #[test]
    fn marks_are_bounded() {
        let dedup = LocalDedup::new(Duration::from_secs(60), 100);
        for n in 0..1000 {
            let (user, id) = key(n);
            assert!(matches!(dedup.try_mark_now(&user, &id), Mark::Fresh));
        }
        dedup.run_upkeep();
        assert!(dedup.len() <= 100, "{} marks held", dedup.len());
        let (user, id) = key(999);
        assert!(!matches!(dedup.try_mark_now(&user, &id), Mark::Fresh), "the most recent marks are kept");
        let (user, id) = key(0);
        assert!(matches!(dedup.try_mark_now(&user, &id), Mark::Fresh), "the oldest went first");
    }

    #[tokio::test]
    async fn a_duplicate_waiting_on_an_evicted_mark_is_told_to_retry() {
        let dedup = LocalDedup::new(Duration::from_secs(60), SHARDS as u64);
        let (user, id) = key(0);
        assert!(matches!(dedup.try_mark_now(&user, &id), Mark::Fresh));
        let Mark::InFlight(waiting) = dedup.try_mark_now(&user, &id) else { panic!("in flight") };
        // One mark per shard: enough others push it out of its shard.
        for n in 1..1000 {
            let (user, id) = key(n);
            dedup.try_mark_now(&user, &id);
        }
        assert_eq!(waiting.await, Err(SendError::OriginalAbandoned));
    }

    #[test]
    fn the_room_of_expired_marks_is_handed_back() {
        let dedup = LocalDedup::new(Duration::from_secs(60), 1_000_000);
        for n in 0..100_000 {
            let (user, id) = key(n);
            dedup.try_mark_now(&user, &id);
        }
        let room = |dedup: &LocalDedup| -> usize {
            dedup.shards.iter().map(|shard| shard.lock().expect("not poisoned").marks.capacity()).sum()
        };
        assert!(room(&dedup) >= 100_000);
        dedup.run_upkeep();
        assert_eq!(dedup.len(), 100_000, "none expired yet");
        // As the upkeep would find them a minute later.
        dedup.upkeep_at(dedup.now_ms() + 60_001);
        assert!(dedup.is_empty());
        assert!(room(&dedup) <= SHARDS * 128, "{} slots kept for no mark", room(&dedup));
    }
}

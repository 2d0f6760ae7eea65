//! Dedup marks on (sender, client_msg_id): a try/cancel pair with a TTL.
//!
//! A send first takes the mark. If a later step fails the mark is cancelled, so the
//! client's retry is processed rather than swallowed; if the process dies between failure
//! and cancel, the TTL heals it. A duplicate that arrives while the original is still in
//! flight waits for the original's outcome and answers with the same ids. The unique index
//! in storage is the final guard beyond the TTL.
//!
//! The marks live in a [`moka`] cache: expiry and eviction are spread over its operations,
//! never one pass over every mark under a lock that sends wait for, and the number of marks
//! is bounded (`delivery.dedup_max_marks`). A mark evicted early costs only a trip to the
//! unique index, which answers the duplicate with the original's ids all the same.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use tokio::sync::watch;

use super::SendError;
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

/// One mark: the watch channel is its state — `None` while the send is in flight, then
/// `Some(Some(outcome))` once stored or `Some(None)` once cancelled.
type Slot = Arc<watch::Sender<Option<Option<Outcome>>>>;

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

/// In-process dedup marks (embedded mode).
pub struct LocalDedup {
    marks: Cache<(UserId, ClientMsgId), Slot>,
}

#[async_trait]
impl DedupMarks for LocalDedup {
    async fn try_mark(&self, sender: &UserId, client_msg_id: &ClientMsgId) -> Mark {
        self.try_mark_now(sender, client_msg_id)
    }

    async fn complete(&self, sender: &UserId, client_msg_id: &ClientMsgId, outcome: Outcome) {
        if let Some(slot) = self.marks.get(&(sender.clone(), client_msg_id.clone())) {
            slot.send_replace(Some(Some(outcome)));
        }
    }

    async fn cancel(&self, sender: &UserId, client_msg_id: &ClientMsgId) {
        if let Some(slot) = self.marks.remove(&(sender.clone(), client_msg_id.clone())) {
            slot.send_replace(Some(None));
        }
    }

    fn held_here(&self) -> u64 {
        // Expired marks are counted (and held) until the upkeep runs, which on an idle
        // node is never: run it, so memory is freed and the count is exact.
        self.run_upkeep();
        self.len()
    }
}

impl LocalDedup {
    /// Marks that live for `ttl` from when they were taken, at most
    /// `max_marks` of them (the least recently used go first).
    pub fn new(ttl: Duration, max_marks: u64) -> Self {
        let marks =
            Cache::builder().max_capacity(max_marks).time_to_live(ttl).eviction_policy(EvictionPolicy::lru()).build();
        Self { marks }
    }

    /// Takes the mark for (`sender`, `client_msg_id`), or says who holds it.
    fn try_mark_now(&self, sender: &UserId, client_msg_id: &ClientMsgId) -> Mark {
        let entry = self
            .marks
            .entry((sender.clone(), client_msg_id.clone()))
            .or_insert_with(|| Arc::new(watch::Sender::new(None)));
        if entry.is_fresh() {
            return Mark::Fresh;
        }
        let slot = entry.into_value();
        let state = slot.borrow().clone();
        match state {
            Some(Some(outcome)) => Mark::Stored(outcome),
            // In flight, or cancelled a moment ago and not yet removed: the receiver tells
            // the duplicate to retry then.
            _ => Mark::InFlight(Box::pin(await_original(slot.subscribe()))),
        }
    }

    /// Does the cache's pending upkeep now (expiry, eviction); it also happens as marks are
    /// taken, this only makes [`LocalDedup::len`] exact.
    pub fn run_upkeep(&self) {
        self.marks.run_pending_tasks();
    }

    /// How many marks are held (approximate until [`LocalDedup::run_upkeep`]).
    pub fn len(&self) -> u64 {
        self.marks.entry_count()
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

    #[tokio::test]
    async fn try_complete_cancel() {
        let dedup = LocalDedup::new(Duration::from_secs(60), 1000);
        let (user, id) = key(1);
        assert!(matches!(dedup.try_mark(&user, &id).await, Mark::Fresh));
        let Mark::InFlight(waiting) = dedup.try_mark(&user, &id).await else { panic!("in flight") };
        let waiting = tokio::spawn(waiting);
        let outcome = Outcome { message_id: 9, seq: 3, conversation: ConversationId::parse("dm:a:u").expect("valid") };
        dedup.complete(&user, &id, outcome.clone()).await;
        assert_eq!(
            waiting.await.expect("joined"),
            Ok(outcome.clone()),
            "a duplicate in flight gets the original's ids"
        );
        assert!(matches!(dedup.try_mark(&user, &id).await, Mark::Stored(o) if o == outcome));

        let (user, id) = key(2);
        assert!(matches!(dedup.try_mark(&user, &id).await, Mark::Fresh));
        let Mark::InFlight(waiting) = dedup.try_mark(&user, &id).await else { panic!("in flight") };
        dedup.cancel(&user, &id).await;
        assert_eq!(waiting.await, Err(SendError::OriginalFailed));
        assert!(matches!(dedup.try_mark(&user, &id).await, Mark::Fresh), "a cancelled mark lets the retry through");
    }

    #[test]
    fn marks_expire_after_the_ttl() {
        let dedup = LocalDedup::new(Duration::from_millis(50), 1000);
        let (user, id) = key(1);
        assert!(matches!(dedup.try_mark_now(&user, &id), Mark::Fresh));
        std::thread::sleep(Duration::from_millis(120));
        assert!(matches!(dedup.try_mark_now(&user, &id), Mark::Fresh), "an expired mark is taken afresh");
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
    }
}

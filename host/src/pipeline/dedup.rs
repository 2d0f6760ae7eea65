//! Dedup marks on (sender, client_msg_id): a try/cancel pair with a TTL.
//!
//! A send first takes the mark. If a later step fails the mark is cancelled, so the
//! client's retry is processed rather than swallowed; if the process dies between failure
//! and cancel, the TTL heals it. A duplicate that arrives while the original is still in
//! flight waits for the original's outcome and answers with the same ids. The unique index
//! in storage is the final guard beyond the TTL.

use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::model::{ClientMsgId, UserId};

/// The ids a stored message was given: what a duplicate is answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub message_id: u64,
    pub seq: u64,
    pub conversation: String,
}

/// What taking a mark found.
pub enum Mark {
    /// The mark is ours: process the send, then [`Dedup::complete`] or [`Dedup::cancel`].
    Fresh,
    /// Stored before, with these ids.
    Stored(Outcome),
    /// Being processed right now; the receiver yields `Some(outcome)` when stored, or
    /// `None` if the original failed.
    InFlight(watch::Receiver<Option<Option<Outcome>>>),
}

enum State {
    InFlight(watch::Sender<Option<Option<Outcome>>>),
    Stored(Outcome),
}

struct Entry_ {
    state: State,
    expires: Instant,
}

/// Waits for the send holding a mark to end: its ids once stored, or why it did not store.
///
/// # Errors
/// A reason to retry when the original failed or was abandoned.
pub async fn await_original(mut original: watch::Receiver<Option<Option<Outcome>>>) -> Result<Outcome, &'static str> {
    loop {
        if let Some(outcome) = original.borrow_and_update().clone() {
            return outcome.ok_or("the original send failed; retry");
        }
        if original.changed().await.is_err() {
            return Err("the original send was abandoned; retry");
        }
    }
}

/// In-process dedup marks (embedded mode; Redis `SET NX PX` in cluster mode).
pub struct Dedup {
    marks: DashMap<(UserId, ClientMsgId), Entry_>,
    ttl: Duration,
}

impl Dedup {
    /// Marks that live for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self { marks: DashMap::new(), ttl }
    }

    /// Takes the mark for (`sender`, `client_msg_id`), or says who holds it.
    pub fn try_mark(&self, sender: &UserId, client_msg_id: &ClientMsgId) -> Mark {
        let now = Instant::now();
        match self.marks.entry((sender.clone(), client_msg_id.clone())) {
            Entry::Occupied(mut occupied) if occupied.get().expires > now => match &occupied.get_mut().state {
                State::Stored(outcome) => Mark::Stored(outcome.clone()),
                State::InFlight(sender) => Mark::InFlight(sender.subscribe()),
            },
            Entry::Occupied(mut expired) => {
                let (sender, _) = watch::channel(None);
                expired.insert(Entry_ { state: State::InFlight(sender), expires: now + self.ttl });
                Mark::Fresh
            }
            Entry::Vacant(vacant) => {
                let (sender, _) = watch::channel(None);
                vacant.insert(Entry_ { state: State::InFlight(sender), expires: now + self.ttl });
                Mark::Fresh
            }
        }
    }

    /// The send was stored: later duplicates are answered with `outcome`.
    pub fn complete(&self, sender: &UserId, client_msg_id: &ClientMsgId, outcome: Outcome) {
        let key = (sender.clone(), client_msg_id.clone());
        if let Some(mut entry) = self.marks.get_mut(&key) {
            if let State::InFlight(waiters) = &entry.state {
                waiters.send_replace(Some(Some(outcome.clone())));
            }
            entry.state = State::Stored(outcome);
            entry.expires = Instant::now() + self.ttl;
        }
    }

    /// The send failed: drop the mark so a retry is processed.
    pub fn cancel(&self, sender: &UserId, client_msg_id: &ClientMsgId) {
        if let Some((_, entry)) = self.marks.remove(&(sender.clone(), client_msg_id.clone()))
            && let State::InFlight(waiters) = entry.state
        {
            waiters.send_replace(Some(None));
        }
    }

    /// Forgets expired marks; run periodically.
    pub fn sweep(&self) {
        let now = Instant::now();
        self.marks.retain(|_, entry| entry.expires > now);
    }

    /// How many marks are held.
    pub fn len(&self) -> usize {
        self.marks.len()
    }

    /// Whether no mark is held.
    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (UserId, ClientMsgId) {
        (UserId::parse("u").expect("valid"), ClientMsgId::parse("00000000-0000-4000-8000-000000000001").expect("valid"))
    }

    #[tokio::test(start_paused = true)]
    async fn try_complete_cancel_and_ttl() {
        let dedup = Dedup::new(Duration::from_secs(60));
        let (user, id) = key();
        assert!(matches!(dedup.try_mark(&user, &id), Mark::Fresh));
        let Mark::InFlight(mut waiting) = dedup.try_mark(&user, &id) else { panic!("in flight") };
        let outcome = Outcome { message_id: 9, seq: 3, conversation: "dm:a:u".into() };
        dedup.complete(&user, &id, outcome.clone());
        waiting.changed().await.expect("notified");
        assert_eq!(waiting.borrow().clone(), Some(Some(outcome.clone())));
        assert!(matches!(dedup.try_mark(&user, &id), Mark::Stored(o) if o == outcome));

        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(matches!(dedup.try_mark(&user, &id), Mark::Fresh), "an expired mark is taken afresh");
        let Mark::InFlight(mut waiting) = dedup.try_mark(&user, &id) else { panic!("in flight") };
        dedup.cancel(&user, &id);
        waiting.changed().await.expect("notified");
        assert_eq!(waiting.borrow().clone(), Some(None));
        assert!(matches!(dedup.try_mark(&user, &id), Mark::Fresh), "a cancelled mark lets the retry through");
        tokio::time::advance(Duration::from_secs(61)).await;
        dedup.sweep();
        assert!(dedup.is_empty());
    }
}

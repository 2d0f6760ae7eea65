//! What a device whose ledger was restored after a restart may lack beyond its ledger: the
//! messages its node never heard of while it was down. Only storage knows them, so the
//! backfill of such a device also reads each of its conversations that changed from the
//! ledger's `since_id` on ([`Session::since`]).
//!
//! One range read of the messages' primary key serves every device restored at once
//! ([`ChangedSince`]): the devices of a restarted node come back together, and each needs a
//! read that began after its own login (so that whatever was stored after the read reaches
//! its new connection by fan-out), which one read shared by the devices waiting on it gives.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::Delivery;
use super::session::Session;
use crate::model::{ConversationId, ConversationKind, GroupId};
use crate::store::{MessageStore, SeqSpan, StoreError};

/// Conversations changed from a message id on, each with its lowest and highest seq since.
pub type Changed = Arc<BTreeMap<ConversationId, SeqSpan>>;

/// The latest read of what changed, shared by the backfills that can use it.
#[derive(Default)]
pub struct ChangedSince {
    /// The latest read made.
    latest: std::sync::Mutex<Option<Read>>,
    /// Held across a read, so that backfills needing a newer one than `latest` wait for the
    /// read under way and take its result. A backfill that `latest` serves never waits for
    /// it: in a reconnect storm the last checks of live sessions keep a read under way, and
    /// the first pass of the next device must not queue behind them.
    reading: Mutex<()>,
}

struct Read {
    since_id: u64,
    started: Instant,
    changed: Changed,
}

impl ChangedSince {
    /// What changed from `since_id` on, read no earlier than `not_before`: a read that began
    /// then or later from an id no higher serves (it holds at least as much).
    async fn read(&self, store: &dyn MessageStore, since_id: u64, not_before: Instant) -> Result<Changed, StoreError> {
        if let Some(changed) = self.serving(since_id, not_before) {
            return Ok(changed);
        }
        let _reading = self.reading.lock().await;
        if let Some(changed) = self.serving(since_id, not_before) {
            return Ok(changed); // the read this one waited for serves
        }
        let started = Instant::now();
        let changed: Changed = Arc::new(store.changed_since(since_id).await?.into_iter().collect());
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Read { since_id, started, changed: Arc::clone(&changed) });
        Ok(changed)
    }

    /// The latest read's result, if it serves: begun no earlier than `not_before`, from an
    /// id no higher than `since_id`.
    fn serving(&self, since_id: u64, not_before: Instant) -> Option<Changed> {
        let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        latest
            .as_ref()
            .filter(|read| read.since_id <= since_id && read.started >= not_before)
            .map(|read| Arc::clone(&read.changed))
    }
}

impl Delivery {
    /// For a session that resumed from a restored ledger: adds to `positions` each of its
    /// device's conversations changed since the ledger was saved, from the seq after what
    /// the device acked there (or before the first change, if that is later), as read no
    /// earlier than `not_before`; a position already there moves back to cover the change.
    /// False when storage could not say; the caller then reads every conversation.
    pub(super) async fn add_changed(
        &self,
        session: &Session,
        since_id: u64,
        not_before: Instant,
        positions: &mut BTreeMap<ConversationId, u64>,
    ) -> bool {
        let Some(changes) = self.followed_changes(session, since_id, not_before).await else { return false };
        for (conversation, span) in changes {
            let from = first_to_read(session, &conversation, span);
            positions.entry(conversation).and_modify(|position| *position = (*position).min(from)).or_insert(from);
        }
        true
    }

    /// Backfill's last look for a session that resumed from a restored ledger: of its
    /// device's conversations changed since the ledger was saved, as read no earlier than
    /// `not_before`, those with a message past what `positions` says was read, each from
    /// there (from what `add_changed` would give, if not read at all). A conversation read
    /// through its latest change has nothing new to read. `None` when storage could not
    /// say; the caller then reads every conversation.
    pub(super) async fn unread_changes(
        &self,
        session: &Session,
        since_id: u64,
        not_before: Instant,
        positions: &BTreeMap<ConversationId, u64>,
    ) -> Option<BTreeMap<ConversationId, u64>> {
        let changes = self.followed_changes(session, since_id, not_before).await?;
        let mut unread = BTreeMap::new();
        for (conversation, span) in changes {
            let from = match positions.get(&conversation) {
                Some(&read) if read >= span.highest => continue,
                Some(&read) => read,
                None => first_to_read(session, &conversation, span),
            };
            unread.insert(conversation, from);
        }
        Some(unread)
    }

    /// The conversations `session`'s user follows that changed from `since_id` on, as read
    /// no earlier than `not_before`; `None` when storage could not say.
    async fn followed_changes(
        &self,
        session: &Session,
        since_id: u64,
        not_before: Instant,
    ) -> Option<Vec<(ConversationId, SeqSpan)>> {
        let changed = match self.changed.read(&*self.stores.messages, since_id, not_before).await {
            Ok(changed) => changed,
            Err(error) => {
                tracing::warn!(%error, "backfill: cannot read what changed while this node was down");
                return None;
            }
        };
        let mut groups: Option<BTreeSet<GroupId>> = None;
        let mut followed = Vec::new();
        for (conversation, &span) in changed.iter() {
            let follows = match conversation.kind() {
                ConversationKind::Direct(a, b) => a == session.user || b == session.user,
                ConversationKind::Group(group) => {
                    if groups.is_none() {
                        match self.stores.groups.groups_of(&session.user).await {
                            Ok(of) => groups = Some(of.into_iter().collect()),
                            Err(error) => {
                                tracing::warn!(%error, "backfill: cannot read the groups of a restored device");
                                return None;
                            }
                        }
                    }
                    groups.as_ref().is_some_and(|groups| groups.contains(&group))
                }
                // Rooms are caught up by their subscriptions (`since_seq`), not by backfill.
                ConversationKind::Room(_) => false,
            };
            if follows {
                followed.push((conversation.clone(), span));
            }
        }
        Some(followed)
    }
}

/// Where a read of a changed conversation starts for `session`: after what its device acked
/// there, or before the first change, if that is later.
fn first_to_read(session: &Session, conversation: &ConversationId, span: SeqSpan) -> u64 {
    session.acked_through(conversation).max(span.lowest.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use tokio::sync::watch;

    use super::*;
    use crate::model::{ClientMsgId, Message, UserId};
    use crate::testkit::WAIT;

    /// A store whose reads of what changed wait while its gate is shut, and are counted.
    struct Gated {
        reads: AtomicUsize,
        open: watch::Receiver<bool>,
    }

    #[async_trait]
    impl MessageStore for Gated {
        async fn messages_after(&self, _: &ConversationId, _: u64, _: u32) -> Result<Vec<Message>, StoreError> {
            Ok(Vec::new())
        }
        async fn messages_before(&self, _: &ConversationId, _: u64, _: u32) -> Result<Vec<Message>, StoreError> {
            Ok(Vec::new())
        }
        async fn latest_seq(&self, _: &ConversationId) -> Result<u64, StoreError> {
            Ok(0)
        }
        async fn changed_since(&self, _: u64) -> Result<Vec<(ConversationId, SeqSpan)>, StoreError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let _ = self.open.clone().wait_for(|open| *open).await;
            Ok(Vec::new())
        }
        async fn message_by_client_id(&self, _: &UserId, _: &ClientMsgId) -> Result<Option<Message>, StoreError> {
            Ok(None)
        }
    }

    /// In a reconnect storm the last checks of live sessions keep a read under way; the
    /// first pass of a device logged in before the latest read began takes that read, and
    /// does not queue behind the one under way.
    #[tokio::test]
    async fn a_backfill_the_latest_read_serves_does_not_wait_for_a_read_under_way() {
        let (gate, open) = watch::channel(true);
        let store = Arc::new(Gated { reads: AtomicUsize::new(0), open });
        let shared = Arc::new(ChangedSince::default());
        let logged_in = Instant::now();
        shared.read(&*store, 7, logged_in).await.expect("the first read");

        gate.send_replace(false);
        let checking = tokio::spawn({
            let (shared, store) = (Arc::clone(&shared), Arc::clone(&store));
            // A read begun after this moment is needed: a new one.
            let after = Instant::now() + Duration::from_nanos(1);
            async move { shared.read(&*store, 7, after).await }
        });
        tokio::time::timeout(WAIT, async {
            while store.reads.load(Ordering::SeqCst) < 2 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the last check's read is under way");

        let served = tokio::time::timeout(WAIT, shared.read(&*store, 7, logged_in)).await;
        assert!(served.expect("served by the latest read, not queued behind the one under way").is_ok());
        assert_eq!(store.reads.load(Ordering::SeqCst), 2, "no read of its own");

        gate.send_replace(true);
        checking.await.expect("the check ends").expect("its read");
        let later = shared.read(&*store, 7, logged_in).await;
        assert!(later.is_ok());
        assert_eq!(store.reads.load(Ordering::SeqCst), 2, "the newer read serves too");
    }
}

//! The storage seams: one trait per repository, so the layers above name what they need
//! from storage, not the [`Database`](super::Database) that provides it.
//!
//! [`Database`](super::Database) implements every trait here except [`MessageWriter`]:
//! messages are written through the [`GroupCommitter`](super::GroupCommitter), which batches
//! concurrent inserts into shared commits. Seq leases are [`SeqLeases`](super::SeqLeases),
//! beside their implementation. The types the traits speak in are here too, so the
//! implementations depend on this file and never the other way round.

use async_trait::async_trait;

use tokio::sync::oneshot;

use super::StoreError;
use super::seq_lease::Fence;
use crate::model::{ClientMsgId, ConversationId, DeviceId, GroupId, Message, UserId};

/// Reads of stored messages. Every message returned is durable: a read never shows a
/// message that a crash could still take back.
#[async_trait]
pub trait MessageStore: Send + Sync + 'static {
    /// Up to `limit` messages of `conversation` with seq > `after_seq`, ascending.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails; [`StoreError::Corrupt`] when a stored
    /// row does not hold valid ids.
    async fn messages_after(
        &self,
        conversation: &ConversationId,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<Message>, StoreError>;

    /// The newest `limit` messages of `conversation` with seq < `before_seq` (`0`: the
    /// latest messages), returned in ascending seq order.
    ///
    /// # Errors
    /// As [`messages_after`](Self::messages_after).
    async fn messages_before(
        &self,
        conversation: &ConversationId,
        before_seq: u64,
        limit: u32,
    ) -> Result<Vec<Message>, StoreError>;

    /// The highest stored seq of `conversation`, or 0 when it has no messages.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    async fn latest_seq(&self, conversation: &ConversationId) -> Result<u64, StoreError>;

    /// Every conversation with a message whose id is at least `since_id`, each with the
    /// lowest and the highest seq among those messages: what changed from a moment on (ids
    /// grow with time).
    ///
    /// # Errors
    /// As [`messages_after`](Self::messages_after).
    async fn changed_since(&self, since_id: u64) -> Result<Vec<(ConversationId, SeqSpan)>, StoreError>;

    /// The message `sender` sent with `client_msg_id`, if stored: the original of a
    /// duplicate whose dedup mark is gone.
    ///
    /// # Errors
    /// As [`messages_after`](Self::messages_after).
    async fn message_by_client_id(
        &self,
        sender: &UserId,
        client_msg_id: &ClientMsgId,
    ) -> Result<Option<Message>, StoreError>;
}

/// Where new messages are stored: batched with concurrent sends into shared commits.
#[async_trait]
pub trait MessageWriter: Send + Sync + 'static {
    /// Queues `message` for storage and returns at once with a ticket that yields the
    /// outcome once it is durable. Messages submitted one after another are committed in
    /// that order. With a `fence` (the one of the lease its seq came from), the message is
    /// stored only while that lease's owner still owns the conversation; the ticket answers
    /// [`StoreError::Fenced`] otherwise (checked on the server backends; SQLite, one node,
    /// stores it).
    ///
    /// # Errors
    /// [`StoreError::Closed`] when the writer has stopped (the server is shutting down);
    /// [`StoreError::Unavailable`] while the store's circuit breaker is open.
    async fn submit(&self, message: Message, fence: Option<Fence>) -> Result<Ticket, StoreError>;

    /// Whether inserts are taken now: false while the store's circuit breaker is open (the
    /// database did not answer), so a send is turned back before it takes a seq.
    fn available(&self) -> bool {
        true
    }
}

/// How far each device has acknowledged each conversation.
#[async_trait]
pub trait CursorStore: Send + Sync + 'static {
    /// Moves each cursor forward to its seq (never back), all or none.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the write fails; no cursor moved.
    async fn advance_cursors(&self, updates: &[CursorUpdate]) -> Result<(), StoreError>;

    /// Every cursor of one device, by conversation (rooms included: callers pick what they
    /// need). A stored conversation that is not a valid id is left out, with a warning.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    async fn cursors(&self, user: &UserId, device: &DeviceId) -> Result<Vec<(ConversationId, u64)>, StoreError>;
}

/// Groups and their members (`grp:` conversations).
#[async_trait]
pub trait GroupStore: Send + Sync + 'static {
    /// Creates a group with its first members, atomically.
    ///
    /// # Errors
    /// [`StoreError::GroupExists`] when the id is taken; nothing changed.
    async fn create_group(&self, group: &GroupId, members: &[UserId], now_ms: u64) -> Result<(), StoreError>;

    /// Adds `user` to `group`; adding a member twice is not an error.
    ///
    /// # Errors
    /// [`StoreError::NoSuchGroup`] when the group does not exist.
    async fn add_member(&self, group: &GroupId, user: &UserId, now_ms: u64) -> Result<(), StoreError>;

    /// Removes `user` from `group`. Returns whether they were a member.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the write fails.
    async fn remove_member(&self, group: &GroupId, user: &UserId) -> Result<bool, StoreError>;

    /// The members of `group`, sorted; `None` when there is no such group. A stored member
    /// that is not a valid user id is left out, with a warning.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    async fn group_members(&self, group: &GroupId) -> Result<Option<Vec<UserId>>, StoreError>;

    /// The groups `user` belongs to, sorted. A stored group that is not a valid group id is
    /// left out, with a warning.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    async fn groups_of(&self, user: &UserId) -> Result<Vec<GroupId>, StoreError>;
}

/// Which direct conversations each user takes part in (groups are in [`GroupStore`]), so a
/// device can be backfilled on conversations it has never acked.
#[async_trait]
pub trait ConversationStore: Send + Sync + 'static {
    /// Records that each of `users` takes part in `conversation`; repeating it is harmless.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the write fails.
    async fn add_user_conversation(&self, users: &[&UserId], conversation: &ConversationId) -> Result<(), StoreError>;

    /// The direct conversations `user` takes part in, sorted. A stored conversation that is
    /// not a valid id is left out, with a warning.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    async fn user_conversations(&self, user: &UserId) -> Result<Vec<ConversationId>, StoreError>;
}

/// Whether storage answers at all, for `/readyz`.
#[async_trait]
pub trait StoreProbe: Send + Sync + 'static {
    /// Whether a trivial query succeeds.
    async fn ping(&self) -> bool;
}

/// What an insert did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inserted {
    /// Stored now, durably, with the ids it was given.
    New { id: u64, seq: u64 },
    /// The (sender, client_msg_id) pair was stored before: nothing was written, and these
    /// are the original message's ids.
    Duplicate { id: u64, seq: u64, conversation: ConversationId },
}

/// A submitted insert: wait on it to learn the outcome once its batch is committed.
pub struct Ticket(pub(super) oneshot::Receiver<Result<Inserted, StoreError>>);

impl Ticket {
    /// The outcome of the insert, once durable (or failed).
    ///
    /// # Errors
    /// [`StoreError::Closed`] when the writers stopped before answering; otherwise what the
    /// database said about this row (see [`Database::insert_submissions`](super::Database::insert_submissions)).
    pub async fn wait(self) -> Result<Inserted, StoreError> {
        self.0.await.map_err(|_| StoreError::Closed)?
    }
}

/// The lowest and the highest seq of a conversation's messages in some range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SeqSpan {
    pub lowest: u64,
    pub highest: u64,
}

/// "This device has every message of the conversation up to `seq`."
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorUpdate {
    pub user: UserId,
    pub device: DeviceId,
    pub conversation: ConversationId,
    pub seq: u64,
}

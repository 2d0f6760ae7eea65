//! What a device asks for: `sync`, `history` (over WebSocket and HTTP alike), and room
//! subscriptions with catch-up.

use async_trait::async_trait;
use herald_proto::v1;

use super::session::Session;
use super::{Delivery, wire_message};
use crate::membership::Refusal;
use crate::model::{ConversationId, ConversationKind, UserId};
use crate::store::StoreError;

/// Default page of `sync` and `history` when the request says 0.
const DEFAULT_PAGE: u32 = 100;

/// What a conversation's owner has taken a seq for and not yet settled: a seq below the
/// highest stored one may still be on its way, so it is not a gap yet.
#[async_trait]
pub trait SeqFrontier: Send + Sync + 'static {
    /// The lowest seq of `conversation` still being stored, asked of the node owning it
    /// (`user` is the one asking, for the route-key hook).
    ///
    /// # Errors
    /// Why the owner could not be asked.
    async fn lowest_in_flight(&self, user: &UserId, conversation: &ConversationId) -> Result<Option<u64>, String>;
}

/// Why a pull request was refused (an `error` frame; the connection stays open).
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{0}")]
    Invalid(String),
    /// A configured limit would be passed (`limit_exceeded`).
    #[error("{0}")]
    Limit(String),
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("storage unavailable: {0}")]
    Store(#[from] StoreError),
}

impl PullError {
    /// The `error.code` of PROTOCOL.md's error frame.
    pub fn code(&self) -> &'static str {
        match self {
            PullError::Invalid(_) => "invalid",
            PullError::Limit(_) => "limit_exceeded",
            PullError::Refused(Refusal::Store(_)) | PullError::Store(_) => "unavailable",
            PullError::Refused(_) => "forbidden",
        }
    }
}

/// Which messages a page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// Those with a seq above this, oldest first.
    After(u64),
    /// The newest with a seq below this (0: the latest), returned oldest first.
    Before(u64),
}

/// A page of a conversation's messages, in ascending seq.
#[derive(Debug)]
pub struct Page {
    pub conversation: ConversationId,
    pub messages: Vec<crate::model::Message>,
    /// More messages lie beyond the page in the direction it was read.
    pub has_more: bool,
}

impl Delivery {
    /// The page size for a request's `limit` (0: the default), capped at `max_page`.
    pub fn page_size(&self, requested: u32) -> u32 {
        if requested == 0 { DEFAULT_PAGE.min(self.config.max_page) } else { requested.min(self.config.max_page) }
    }

    /// A page of `conversation` for `user` (a member): the one history path, for the
    /// `history` frame and `GET /v1/conversations/{c}/messages` alike.
    ///
    /// # Errors
    /// [`PullError`] when the user may not read it or storage fails.
    pub async fn page(
        &self,
        user: &UserId,
        conversation: ConversationId,
        from: Span,
        limit: u32,
    ) -> Result<Page, PullError> {
        self.membership.check_read(user, &conversation).await?;
        let limit = self.page_size(limit);
        // One more than asked: whether it exists says whether there is more.
        let mut messages = match from {
            Span::After(after) => self.stores.messages.messages_after(&conversation, after, limit + 1).await?,
            Span::Before(before) => self.stores.messages.messages_before(&conversation, before, limit + 1).await?,
        };
        let has_more = messages.len() > limit as usize;
        if has_more {
            match from {
                Span::After(_) => _ = messages.pop(),
                Span::Before(_) => _ = messages.remove(0),
            }
        }
        // A page the deliver-filter thins may hold fewer than `limit`: `has_more` still
        // says whether the conversation goes on past it.
        let messages = self.visible(user, messages).await;
        Ok(Page { conversation, messages, has_more })
    }

    /// Answers `history`: a page of messages before `before_seq` (0 = the latest).
    ///
    /// # Errors
    /// [`PullError`] when the conversation is invalid or not the user's.
    pub async fn history(&self, user: &UserId, request: v1::History) -> Result<v1::HistoryReply, PullError> {
        let conversation = parse(&request.conversation)?;
        let page = self.page(user, conversation, Span::Before(request.before_seq), request.limit).await?;
        Ok(v1::HistoryReply {
            conversation: page.conversation.to_string(),
            messages: page.messages.iter().map(wire_message).collect(),
            has_more: page.has_more,
        })
    }

    /// Answers `sync`: what follows each cursor, and how far each answer is complete.
    ///
    /// # Errors
    /// [`PullError`] when a conversation is invalid or not the user's, or the request
    /// carries more cursors than `max_sync_cursors`.
    pub async fn sync(&self, session: &Session, request: v1::Sync) -> Result<v1::SyncReply, PullError> {
        let max = self.config.max_sync_cursors;
        if request.cursors.len() > max {
            return Err(PullError::Limit(format!(
                "sync carries {} cursors, more than the {max} one sync may (delivery.max_sync_cursors); \
                 split it",
                request.cursors.len()
            )));
        }
        let limit = self.page_size(request.limit);
        let wanted: Vec<(ConversationId, u64)> = if request.cursors.is_empty() {
            self.device_conversations(&session.user, &session.device).await?.into_iter().collect()
        } else {
            request
                .cursors
                .iter()
                .map(|cursor| Ok((parse(&cursor.conversation)?, cursor.seq)))
                .collect::<Result<_, PullError>>()?
        };
        let mut conversations = Vec::with_capacity(wanted.len());
        for (conversation, after) in wanted {
            self.membership.check_read(&session.user, &conversation).await?;
            // In this order: the latest seq, what is still in flight, then the messages. Every
            // seq up to that latest one was taken before it was read, so one not in flight
            // when asked is settled, and the read that follows holds it if it was stored. In
            // any other order a message stored between the reads would be claimed complete
            // and never returned: the device would skip it for good.
            let latest_seq = self.stores.messages.latest_seq(&conversation).await?;
            let settled_through = self.settled_through(&session.user, &conversation, after, latest_seq).await;
            let messages = self.stores.messages.messages_after(&conversation, after, limit).await?;
            let complete_through_seq = if messages.len() as u32 == limit {
                messages.last().map_or(after, |m| m.seq).min(settled_through)
            } else {
                settled_through
            };
            // What the deliver-filter keeps from this user is a gap below
            // `complete_through_seq`: the device knows not to wait for it.
            let messages = self.visible(&session.user, messages).await;
            conversations.push(v1::ConversationSync {
                conversation: conversation.to_string(),
                messages: messages.iter().map(wire_message).collect(),
                complete_through_seq,
                latest_seq,
            });
        }
        Ok(v1::SyncReply { conversations })
    }

    /// How far a read of what follows `after`, made from now on, is complete: through
    /// `latest` (read just before), unless the owner is still storing a lower seq (not a
    /// gap, just not there yet).
    async fn settled_through(&self, user: &UserId, conversation: &ConversationId, after: u64, latest: u64) -> u64 {
        match self.frontier.lowest_in_flight(user, conversation).await {
            Ok(Some(in_flight)) => latest.min(in_flight.saturating_sub(1)).max(after),
            Ok(None) => latest.max(after),
            Err(error) => {
                // Unknown: claim nothing beyond what the device had.
                tracing::warn!(%error, %conversation, "the conversation's owner could not be asked what is in flight");
                after
            }
        }
    }

    /// Subscribes the session to a room, with catch-up from `since_seq` if asked.
    ///
    /// # Errors
    /// [`PullError::Invalid`] when `room` is not a `room:` conversation,
    /// [`PullError::Limit`] when the connection is in as many rooms as it may be.
    pub async fn subscribe(&self, session: &Session, request: v1::Subscribe) -> Result<v1::Subscribed, PullError> {
        let room = room_of(&request.room)?;
        let max = self.config.max_rooms_per_connection;
        let Some(first) = self.reach.rooms.subscribe_at_most(&room, session.id, max) else {
            return Err(PullError::Limit(format!(
                "this connection is subscribed to {max} rooms, the most it may be \
                 (delivery.max_rooms_per_connection); unsubscribe from one first"
            )));
        };
        if first && let Err(error) = self.reach.room_directory.joined(&room, self.reach.this_node).await {
            tracing::warn!(%error, %room, "room directory unavailable; messages from other nodes may miss this one");
        }
        let latest_seq = self.stores.messages.latest_seq(&room).await?;
        let messages = match request.since_seq {
            Some(since) => {
                let messages = self.stores.messages.messages_after(&room, since, self.config.max_page).await?;
                self.visible(&session.user, messages).await
            }
            None => Vec::new(),
        };
        Ok(v1::Subscribed { room: room.to_string(), latest_seq, messages: messages.iter().map(wire_message).collect() })
    }

    /// Unsubscribes the session from a room.
    ///
    /// # Errors
    /// [`PullError::Invalid`] when `room` is not a `room:` conversation.
    pub async fn unsubscribe(&self, session: &Session, request: &v1::Unsubscribe) -> Result<(), PullError> {
        let room = room_of(&request.room)?;
        if self.reach.rooms.unsubscribe(&room, session.id) {
            self.left_if_empty(&room).await;
        }
        Ok(())
    }

    /// Forgets every room subscription of a closed session.
    pub async fn drop_subscriptions(&self, session: &Session) {
        for room in self.reach.rooms.drop_connection(session.id) {
            self.left_if_empty(&room).await;
        }
    }

    /// Tells the room directory this node has no subscriber of `room` left, if so.
    async fn left_if_empty(&self, room: &ConversationId) {
        if !self.reach.rooms.has_subscribers(room)
            && let Err(error) = self.reach.room_directory.left(room, self.reach.this_node).await
        {
            tracing::warn!(%error, %room, "room directory unavailable; it keeps this node listed");
        }
    }
}

fn parse(name: &str) -> Result<ConversationId, PullError> {
    ConversationId::parse(name).map_err(|e| PullError::Invalid(e.to_string()))
}

fn room_of(name: &str) -> Result<ConversationId, PullError> {
    let room = parse(name)?;
    match room.kind() {
        ConversationKind::Room(_) => Ok(room),
        _ => Err(PullError::Invalid(format!("{name} is not a room; rooms are room:<name>"))),
    }
}

#[cfg(test)]
#[path = "pull_tests.rs"]
mod tests;

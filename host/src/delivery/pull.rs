//! What a device asks for or is owed: backfill on connect, `sync`, `history` and room
//! catch-up on `subscribe`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use herald_proto::v1;

use super::{Delivery, is_own, wire_message};
use crate::gateway::connection::{Connection, read_from};
use crate::model::{ConversationId, ConversationKind, DeviceId, UserId};
use crate::pipeline::membership::Refusal;
use crate::store::StoreError;

/// Default page of `sync` and `history` when the request says 0.
const DEFAULT_PAGE: u32 = 100;

/// Why a pull request was refused (an `error` frame; the connection stays open).
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{0}")]
    Invalid(String),
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
            PullError::Refused(Refusal::Store(_)) | PullError::Store(_) => "unavailable",
            PullError::Refused(_) => "forbidden",
        }
    }
}

impl Delivery {
    fn page(&self, requested: u32) -> u32 {
        if requested == 0 { DEFAULT_PAGE.min(self.config.max_page) } else { requested.min(self.config.max_page) }
    }

    /// Every conversation a device should follow, with its server-side cursor.
    async fn device_conversations(
        &self,
        user: &UserId,
        device: &DeviceId,
    ) -> Result<BTreeMap<ConversationId, u64>, StoreError> {
        let mut names: BTreeSet<String> = self.database.user_conversations(user).await?.into_iter().collect();
        names.extend(self.database.groups_of(user).await?.into_iter().map(|group| format!("grp:{group}")));
        let cursors = self.database.cursors(user, device).await?;
        let mut out = BTreeMap::new();
        for name in names {
            if let Ok(conversation) = ConversationId::parse(&name) {
                out.insert(conversation, 0);
            }
        }
        for (name, seq) in cursors {
            if let Ok(conversation) = ConversationId::parse(&name)
                && !matches!(conversation.kind(), ConversationKind::Room(_))
            {
                let pending = self.cursors.pending(user, device, &conversation).unwrap_or(0);
                out.insert(conversation, seq.max(pending));
            }
        }
        Ok(out)
    }

    /// Pushes to a just-connected device what its cursors lack, oldest first, waiting for
    /// room in its queue (so a reconnect storm paces itself), then lets live pushes through
    /// and catches up on what was stored meanwhile.
    ///
    /// A device back within the reconnect grace period (its connection resumed from the
    /// dropped one) is owed only a few conversations, known without asking the database:
    /// only those are read. Otherwise every conversation of the user is.
    pub async fn backfill(self: &Arc<Self>, connection: Arc<Connection>) {
        if !self.vitals.tier().backfills() {
            // Degraded: the device catches up by sync instead.
            connection.skip_backfill();
            return;
        }
        let Ok(_permit) = self.backfill_permits.acquire().await else { return };
        let resumed = connection.take_resume();
        let full = resumed.is_none();
        metrics::counter!("herald_delivery_backfills_total", "path" => if full { "full" } else { "resumed" })
            .increment(1);
        let mut positions = match resumed {
            Some(owed) => owed,
            None => match self.device_conversations(&connection.user, &connection.device).await {
                Ok(conversations) => conversations,
                Err(error) => {
                    tracing::warn!(%error, "backfill: storage unavailable; the device can sync");
                    self.vitals.count_error();
                    connection.skip_backfill();
                    return;
                }
            },
        };
        for pass in 0..2 {
            if pass == 1 {
                // Open the connection to live pushes, then look again for anything stored
                // before live pushes reached this connection: where fan-out found it not yet
                // live, and (full backfill, or too many of those to note) every conversation,
                // since one may have started while the first pass ran.
                let owed = connection.go_live();
                for (conversation, lowest) in owed.iter().flatten() {
                    read_from(&mut positions, conversation.clone(), *lowest);
                }
                let complete = owed.is_some();
                if (full || !complete)
                    && let Ok(now) = self.device_conversations(&connection.user, &connection.device).await
                {
                    for (conversation, cursor) in now {
                        positions.entry(conversation).or_insert(cursor);
                    }
                }
            }
            for (conversation, position) in &mut positions {
                if connection.is_closed() {
                    return; // gone (or closed by a shutdown): nothing more to push or read
                }
                let messages =
                    match self.database.messages_after(conversation, *position, self.config.backfill_limit).await {
                        Ok(messages) => messages,
                        Err(error) => {
                            tracing::warn!(%error, %conversation, "backfill: read failed; the device can sync");
                            self.vitals.count_error();
                            continue;
                        }
                    };
                for message in messages {
                    *position = message.seq;
                    if is_own(&connection, &message) || !connection.claim_push(conversation, message.seq) {
                        continue; // the device has it, or it was pushed live already
                    }
                    let wire = wire_message(&message);
                    let frame = v1::Frame::new(0, v1::Deliver { message: Some(wire.clone()), attempt: 1 });
                    if !connection.push_waiting(frame).await {
                        return;
                    }
                    self.vitals.count_push(1);
                    self.schedule_retry(Arc::clone(&connection), conversation.clone(), wire, 1);
                }
            }
        }
        connection.end_claims();
    }

    /// Answers `sync`: what follows each cursor, and how far each answer is complete.
    ///
    /// # Errors
    /// [`PullError`] when a conversation is invalid or not the user's.
    pub async fn sync(&self, connection: &Connection, request: v1::Sync) -> Result<v1::SyncReply, PullError> {
        let limit = self.page(request.limit);
        let wanted: Vec<(ConversationId, u64)> = if request.cursors.is_empty() {
            self.device_conversations(&connection.user, &connection.device).await?.into_iter().collect()
        } else {
            let mut wanted = Vec::with_capacity(request.cursors.len());
            for cursor in request.cursors {
                let conversation =
                    ConversationId::parse(&cursor.conversation).map_err(|e| PullError::Invalid(e.to_string()))?;
                wanted.push((conversation, cursor.seq));
            }
            wanted
        };
        let mut conversations = Vec::with_capacity(wanted.len());
        for (conversation, after) in wanted {
            self.membership.check_read(&connection.user, &conversation).await?;
            let messages = self.database.messages_after(&conversation, after, limit).await?;
            let latest_seq = self.database.latest_seq(&conversation).await?;
            let complete_through_seq = if messages.len() as u32 == limit {
                messages.last().map_or(after, |m| m.seq)
            } else {
                // Everything durable was returned; a seq still being stored is not a gap.
                match self.lanes.lowest_in_flight(&conversation) {
                    Some(in_flight) => latest_seq.min(in_flight.saturating_sub(1)).max(after),
                    None => latest_seq.max(after),
                }
            };
            conversations.push(v1::ConversationSync {
                conversation: conversation.to_string(),
                messages: messages.iter().map(wire_message).collect(),
                complete_through_seq,
                latest_seq,
            });
        }
        Ok(v1::SyncReply { conversations })
    }

    /// Answers `history`: a page of messages before `before_seq` (0 = the latest).
    ///
    /// # Errors
    /// [`PullError`] when the conversation is invalid or not the user's.
    pub async fn history(&self, user: &UserId, request: v1::History) -> Result<v1::HistoryReply, PullError> {
        let conversation =
            ConversationId::parse(&request.conversation).map_err(|e| PullError::Invalid(e.to_string()))?;
        self.membership.check_read(user, &conversation).await?;
        let limit = self.page(request.limit);
        let mut messages = self.database.messages_before(&conversation, request.before_seq, limit + 1).await?;
        let has_more = messages.len() > limit as usize;
        if has_more {
            messages.remove(0);
        }
        Ok(v1::HistoryReply {
            conversation: conversation.to_string(),
            messages: messages.iter().map(wire_message).collect(),
            has_more,
        })
    }

    /// Subscribes the connection to a room, with catch-up from `since_seq` if asked.
    ///
    /// # Errors
    /// [`PullError::Invalid`] when `room` is not a `room:` conversation.
    pub async fn subscribe(
        &self,
        connection: &Connection,
        request: v1::Subscribe,
    ) -> Result<v1::Subscribed, PullError> {
        let room = room_of(&request.room)?;
        self.rooms.subscribe(&room, connection.id);
        let latest_seq = self.database.latest_seq(&room).await?;
        let messages = match request.since_seq {
            Some(since) => self.database.messages_after(&room, since, self.config.max_page).await?,
            None => Vec::new(),
        };
        Ok(v1::Subscribed { room: room.to_string(), latest_seq, messages: messages.iter().map(wire_message).collect() })
    }

    /// Unsubscribes the connection from a room.
    ///
    /// # Errors
    /// [`PullError::Invalid`] when `room` is not a `room:` conversation.
    pub fn unsubscribe(&self, connection: &Connection, request: &v1::Unsubscribe) -> Result<(), PullError> {
        let room = room_of(&request.room)?;
        self.rooms.unsubscribe(&room, connection.id);
        Ok(())
    }
}

fn room_of(name: &str) -> Result<ConversationId, PullError> {
    let room = ConversationId::parse(name).map_err(|e| PullError::Invalid(e.to_string()))?;
    match room.kind() {
        ConversationKind::Room(_) => Ok(room),
        _ => Err(PullError::Invalid(format!("{name} is not a room; rooms are room:<name>"))),
    }
}

//! Announcements from game servers (`POST /v1/rooms/{name}/announcements`), once the
//! announce-policy hook accepted them: stored in the room (archived) or pushed only.

use std::sync::Arc;

use super::dedup::{HeldMark, Mark, Outcome};
use super::{Pipeline, SendError};
use crate::model::{ClientMsgId, ConnectionId, ConversationId, DeviceId, Message, NodeId, UserId};
use crate::routing::bus::{Origin, SendRequest};
use crate::routing::router::SendOwner;
use crate::store::{OwnerClaim, StoreError};
use herald_proto::v1::{self, send_ack::Status};

/// Application `kind` of announcements stored as room messages.
pub const ANNOUNCEMENT_KIND: u32 = 0;

/// The device an announcement is sent from.
const API_DEVICE: &str = "api";

/// What storing an announcement did.
#[derive(Debug, Clone, Copy)]
pub struct Announced {
    pub message_id: u64,
    /// 0 when not archived (not in history).
    pub seq: u64,
    pub archived: bool,
    /// The same announcement id was stored before; these are the original ids.
    pub duplicate: bool,
}

impl Announced {
    fn stored(outcome: &Outcome, duplicate: bool) -> Self {
        Self { message_id: outcome.message_id, seq: outcome.seq, archived: true, duplicate }
    }
}

impl Pipeline {
    /// Stores an accepted announcement in `room` (archived) or pushes it to the room's
    /// subscribers only (not archived). An `announcement_id` is stored once: repeating it
    /// answers with the original ids.
    ///
    /// # Errors
    /// [`SendError`] saying why nothing was stored; the caller may retry.
    pub async fn announce(
        self: &Arc<Self>,
        room: &ConversationId,
        sender: &UserId,
        announcement_id: Option<&str>,
        body: Vec<u8>,
        archive: bool,
    ) -> Result<Announced, SendError> {
        let message = Message {
            id: 0,
            conversation: room.clone(),
            seq: 0,
            sender: sender.clone(),
            sender_device: DeviceId::parse(API_DEVICE)?,
            client_msg_id: announcement_client_id(room, announcement_id),
            kind: ANNOUNCEMENT_KIND,
            body: body.into(),
            sent_at_ms: self.clock.now_ms(),
        };
        if !archive {
            let message = Message { id: self.ids.next_id(), ..message };
            let message_id = message.id;
            self.delivery.fan_out(Arc::new(message)).await;
            return Ok(Announced { message_id, seq: 0, archived: false, duplicate: false });
        }
        // Stored by the room's owner only, with its claim: another node's announcement is
        // forwarded to the owner, marked as one, and its ack comes back.
        let claim = match self.router.send_owner(sender, room).await {
            SendOwner::Here { node, epoch } => OwnerClaim { node, epoch },
            SendOwner::Elsewhere(owner) => return self.announce_at(owner, message).await,
        };
        // Held until completed or cancelled, or until this future is dropped midway (the
        // HTTP request's timeout), which cancels it too.
        let held = match self.dedup.try_mark(sender, &message.client_msg_id, room).await {
            Mark::Fresh => HeldMark::new(Arc::clone(&self.dedup), sender.clone(), message.client_msg_id.clone()),
            Mark::Stored(original) => return Ok(Announced::stored(&original, true)),
            Mark::InFlight(original) => return original.await.map(|original| Announced::stored(&original, true)),
        };
        let lane = self.lanes.get(room);
        let (message, ticket) = match self.enqueue(&lane, message, claim).await {
            Ok(queued) => queued,
            Err(error) => {
                held.cancel().await;
                return Err(error);
            }
        };
        let settled = self.settle(&lane, &message, ticket.wait().await);
        match &settled {
            Ok((_, outcome)) => held.complete(outcome.clone()).await,
            Err(_) => held.cancel().await,
        }
        self.release(&lane).await;
        self.lanes.done_with(room, lane);
        let (status, outcome) = settled?;
        Ok(Announced::stored(&outcome, status == herald_proto::v1::send_ack::Status::Duplicate))
    }
}

impl Pipeline {
    /// Has `owner` store an archived announcement, through the path a forwarded send takes,
    /// from the API's device. It goes marked as an announcement: the announce policy judged
    /// it here, so the owner stores it exactly as one posted to it — no room subscription
    /// asked, and no message-policy hook, whose limits are the players' and must not count
    /// announcements.
    async fn announce_at(&self, owner: NodeId, message: Message) -> Result<Announced, SendError> {
        let request = SendRequest {
            origin: Origin {
                user: message.sender.clone(),
                device: message.sender_device.clone(),
                node: self.router.this_node(),
                connection: ConnectionId(0),
            },
            rid: 0,
            send: v1::Send {
                client_msg_id: message.client_msg_id.to_string(),
                conversation: message.conversation.to_string(),
                kind: message.kind,
                body: message.body.clone(),
            },
            announcement: true,
        };
        let ack = self
            .bus
            // One request at a time: nothing here waits for it to be queued.
            .forward_send(owner, request, tokio::sync::oneshot::channel().0)
            .await
            .map_err(|cause| SendError::OwnerUnreachable { owner, cause })?
            .ack;
        match ack.status() {
            Status::Ok | Status::Duplicate => Ok(Announced {
                message_id: ack.message_id,
                seq: ack.seq,
                archived: true,
                duplicate: ack.status() == Status::Duplicate,
            }),
            Status::Rejected | Status::Unspecified => Err(SendError::Refused(ack.reason)),
            Status::Retry => Err(SendError::NotOwner { owner }),
        }
    }

    /// The original of an archived announcement the announce policy called a duplicate:
    /// its ids, from the dedup mark its store left (shared by every node in cluster mode),
    /// waiting for an original still being stored; once the mark is gone (expired, or
    /// evicted by `delivery.dedup_max_marks`), from the database. `None` when the original
    /// was not archived.
    ///
    /// # Errors
    /// [`StoreError`] when the database could not be asked.
    pub async fn announcement_original(
        &self,
        room: &ConversationId,
        sender: &UserId,
        announcement_id: &str,
    ) -> Result<Option<Announced>, StoreError> {
        let client_msg_id = announcement_client_id(room, Some(announcement_id));
        match self.dedup.try_mark(sender, &client_msg_id, room).await {
            Mark::Stored(original) => return Ok(Some(Announced::stored(&original, true))),
            Mark::InFlight(original) => {
                return Ok(original.await.ok().map(|original| Announced::stored(&original, true)));
            }
            Mark::Fresh => self.dedup.cancel(sender, &client_msg_id).await,
        }
        let stored = self.messages.message_by_client_id(sender, &client_msg_id).await?;
        Ok(stored.map(|original| Announced {
            message_id: original.id,
            seq: original.seq,
            archived: true,
            duplicate: true,
        }))
    }
}

/// The `client_msg_id` of an announcement: derived from (room, announcement_id), so the
/// same announcement id is stored once whatever the retries; random when none was given.
fn announcement_client_id(room: &ConversationId, announcement_id: Option<&str>) -> ClientMsgId {
    let bits: u128 = match announcement_id {
        Some(id) => {
            // FNV-1a, twice with different offsets: stable across versions and restarts.
            let fnv = |offset: u64| {
                room.as_str()
                    .bytes()
                    .chain([0])
                    .chain(id.bytes())
                    .fold(offset, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3))
            };
            (u128::from(fnv(0xcbf2_9ce4_8422_2325)) << 64) | u128::from(fnv(0x6c62_272e_07bb_0142))
        }
        None => rand::random(),
    };
    let hex = format!("{bits:032x}");
    let text = format!("{}-{}-8{}-8{}-{}", &hex[0..8], &hex[8..12], &hex[13..16], &hex[17..20], &hex[20..32]);
    ClientMsgId::parse(&text).expect("32 hex digits in 8-4-4-4-12 groups are a UUID")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_id_always_gives_the_same_client_msg_id_and_none_a_fresh_one() {
        let lobby = ConversationId::parse("room:lobby").expect("valid");
        let arena = ConversationId::parse("room:arena").expect("valid");
        let once = announcement_client_id(&lobby, Some("a1"));
        assert_eq!(once, announcement_client_id(&lobby, Some("a1")));
        assert_ne!(once, announcement_client_id(&arena, Some("a1")), "per room");
        assert_ne!(once, announcement_client_id(&lobby, Some("a2")));
        assert_ne!(announcement_client_id(&lobby, None), announcement_client_id(&lobby, None));
    }
}

//! The uplink: what happens to a `send` on the conversation's owner node.
//!
//! validate → membership → dedup mark → (per conversation, in order) seq → snowflake id →
//! queue for group commit → wait until durable → `send_ack` → release to fan-out in seq
//! order. Any failure after the dedup mark cancels it and answers `RETRY`, so the client's
//! retry is processed, never swallowed (ARCHITECTURE.md §2).

pub mod dedup;
pub mod lanes;
pub mod membership;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use dashmap::DashSet;
use herald_proto::v1::{self, Frame, send_ack::Status};

use crate::clock::WallClock;
use crate::delivery::Delivery;
use crate::gateway::connection::Connection;
use crate::health::Vitals;
use crate::ids::{SeqAllocator, SnowflakeGenerator};
use crate::model::{ClientMsgId, ConversationId, ConversationKind};
use crate::model::{DeviceId, UserId};
use crate::plugins::types::{CommandKind, Message as HookMessage, MessageDecision, RouteRequest};
use crate::plugins::{Hook, PluginHost};
use crate::routing::ring::Ring;
use crate::store::group_commit::Ticket;
use crate::store::{Database, GroupCommitter, Inserted, NewMessage, StoreError, StoredMessage};

use dedup::{Dedup, Mark, Outcome, await_original};
use lanes::{Lane, Lanes};
use membership::{Membership, Refusal};

/// Retry-after hint for a transient failure.
const RETRY_AFTER_MS: u32 = 200;

/// How an admitted send continues.
pub enum Admission {
    /// Answered at once (rejected, or a duplicate of a stored message).
    Done(v1::SendAck),
    /// Queued: run this to completion; it sends the ack itself and fans out.
    Wait(Pin<Box<dyn Future<Output = ()> + Send>>),
}

/// Everything the uplink needs.
pub struct Pipeline {
    pub database: Database,
    pub committer: GroupCommitter,
    pub seqs: Arc<SeqAllocator>,
    pub ids: Arc<SnowflakeGenerator>,
    pub dedup: Arc<Dedup>,
    pub lanes: Arc<Lanes>,
    pub membership: Arc<Membership>,
    pub delivery: Arc<Delivery>,
    pub clock: Arc<dyn WallClock>,
    /// Direct conversations already recorded in `user_conversations` by this process.
    pub known_direct: DashSet<ConversationId>,
    /// The route-key (step 2) and message-policy (step 4) hooks.
    pub plugins: Arc<PluginHost>,
    /// Which node owns a routing key (step 2).
    pub ring: Ring,
    /// This node.
    pub node_id: u32,
    /// Errors clients see, for the health snapshot.
    pub vitals: Arc<Vitals>,
}

/// Where a command goes (step 2): the routing key and the node owning it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Routed {
    pub key: String,
    /// `None` only for an empty ring.
    pub owner: Option<u32>,
}

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

/// How a queued message ended.
enum Settled {
    Stored(Outcome),
    Duplicate(Outcome),
    Failed,
}

/// Application `kind` of announcements stored as room messages.
pub const ANNOUNCEMENT_KIND: u32 = 0;

fn ack(status: Status, send: &v1::Send, reason: impl Into<String>) -> v1::SendAck {
    v1::SendAck {
        client_msg_id: send.client_msg_id.clone(),
        status: status as i32,
        conversation: send.conversation.clone(),
        reason: reason.into(),
        retry_after_ms: if status == Status::Retry { RETRY_AFTER_MS } else { 0 },
        ..v1::SendAck::default()
    }
}

fn with_ids(mut ack: v1::SendAck, outcome: &Outcome) -> v1::SendAck {
    ack.message_id = outcome.message_id;
    ack.seq = outcome.seq;
    ack.conversation.clone_from(&outcome.conversation);
    ack
}

impl Pipeline {
    /// Runs the in-order part of a send (call sends of one connection one at a time, in
    /// the order they arrived); the rest comes back as [`Admission::Wait`].
    pub async fn admit(self: &Arc<Self>, connection: &Arc<Connection>, rid: u32, send: v1::Send) -> Admission {
        let client_msg_id = match ClientMsgId::parse(&send.client_msg_id) {
            Ok(id) => id,
            Err(error) => return Admission::Done(ack(Status::Rejected, &send, error.to_string())),
        };
        let conversation = match ConversationId::parse(&send.conversation) {
            Ok(conversation) => conversation,
            Err(error) => return Admission::Done(ack(Status::Rejected, &send, error.to_string())),
        };
        match self.membership.check_send(&connection.user, connection.id, &conversation).await {
            Ok(()) => {}
            Err(Refusal::Store(error)) => {
                tracing::warn!(%error, "membership check failed");
                self.vitals.count_error();
                return Admission::Done(ack(Status::Retry, &send, "storage unavailable; retry"));
            }
            Err(refusal) => return Admission::Done(ack(Status::Rejected, &send, refusal.to_string())),
        }
        if let Some(owner) =
            self.send_owner(&connection.user, &conversation).await.filter(|&owner| owner != self.node_id)
        {
            // Only cluster mode has other owners, and it forwards; here the ring is this node.
            return Admission::Done(ack(
                Status::Retry,
                &send,
                format!("conversation owned by node {owner}, which is not reachable from here"),
            ));
        }
        match self.dedup.try_mark(&connection.user, &client_msg_id) {
            Mark::Fresh => {}
            Mark::Stored(outcome) => return Admission::Done(with_ids(ack(Status::Duplicate, &send, ""), &outcome)),
            Mark::InFlight(original) => {
                let connection = Arc::clone(connection);
                return Admission::Wait(Box::pin(async move {
                    let reply = match await_original(original).await {
                        Ok(outcome) => with_ids(ack(Status::Duplicate, &send, ""), &outcome),
                        Err(reason) => ack(Status::Retry, &send, reason),
                    };
                    connection.push(Frame::new(rid, reply));
                }));
            }
        }
        let cancel = |reason: &str| {
            self.dedup.cancel(&connection.user, &client_msg_id);
            Admission::Done(ack(Status::Retry, &send, reason))
        };
        let mut body = send.body.clone();
        if self.plugins.has_hook(Hook::MessagePolicy) {
            let hook_input = HookMessage {
                sender: connection.user.to_string(),
                sender_device: connection.device.to_string(),
                conversation: conversation.to_string(),
                kind: send.kind,
                body: body.to_vec(),
                client_msg_id: client_msg_id.as_str().to_owned(),
            };
            match self.plugins.message_policy(&hook_input).await {
                MessageDecision::Allow => {}
                MessageDecision::Rewrite(rewritten) => body = rewritten.into(),
                MessageDecision::Reject(rejection) => {
                    self.dedup.cancel(&connection.user, &client_msg_id);
                    let mut refused = ack(Status::Rejected, &send, format!("{}: {}", rejection.code, rejection.reason));
                    refused.retry_after_ms =
                        rejection.retry_after_ms.map_or(0, |ms| u32::try_from(ms).unwrap_or(u32::MAX));
                    return Admission::Done(refused);
                }
            }
        }
        if let Err(error) = self.record_direct(&conversation).await {
            tracing::warn!(%error, "recording a direct conversation failed");
            return cancel("storage unavailable; retry");
        }
        let lane = self.lanes.get(&conversation);
        let (message, ticket) = match self
            .enqueue(
                &lane,
                &conversation,
                &connection.user,
                &connection.device,
                &client_msg_id,
                send.kind,
                body.to_vec(),
            )
            .await
        {
            Ok(queued) => queued,
            Err(reason) => return cancel(reason),
        };
        let pipeline = Arc::clone(self);
        let connection = Arc::clone(connection);
        Admission::Wait(Box::pin(async move {
            let outcome = ticket.wait().await;
            let reply = match pipeline.settle(&lane, &message, outcome) {
                Settled::Stored(stored) => with_ids(ack(Status::Ok, &send, ""), &stored),
                Settled::Duplicate(original) => with_ids(ack(Status::Duplicate, &send, ""), &original),
                Settled::Failed => {
                    pipeline.vitals.count_error();
                    ack(Status::Retry, &send, "storage failed; retry with the same client_msg_id")
                }
            };
            connection.push(Frame::new(rid, reply));
            pipeline.release(&lane).await;
        }))
    }

    /// Step 2 for a send: the node owning the conversation's routing key. The route-key hook
    /// is asked only when a plugin provides one (the built-in key is the conversation).
    async fn send_owner(&self, user: &UserId, conversation: &ConversationId) -> Option<u32> {
        if self.plugins.has_hook(Hook::RouteKey) {
            self.route(CommandKind::Send, user, Some(conversation)).await.owner
        } else {
            self.ring.owner(conversation.as_str())
        }
    }

    /// Where `command` of `user` on `conversation` goes: the key (from the route-key hook
    /// or the built-in default) and its owner on the ring.
    pub async fn route(&self, command: CommandKind, user: &UserId, conversation: Option<&ConversationId>) -> Routed {
        let request =
            RouteRequest { command, user: user.to_string(), conversation: conversation.map(ToString::to_string) };
        let key = self.plugins.route_key(&request).await;
        let owner = self.ring.owner(&key);
        Routed { key, owner }
    }

    /// Records, once per process, that both users of a direct conversation take part in it.
    async fn record_direct(&self, conversation: &ConversationId) -> Result<(), StoreError> {
        if let ConversationKind::Direct(a, b) = conversation.kind()
            && !self.known_direct.contains(conversation)
        {
            self.database.add_user_conversation(&[&a, &b], conversation).await?;
            self.known_direct.insert(conversation.clone());
        }
        Ok(())
    }

    /// Steps 5-7 in conversation order: seq, snowflake id, queued for group commit.
    #[allow(clippy::too_many_arguments)]
    async fn enqueue(
        &self,
        lane: &Lane,
        conversation: &ConversationId,
        sender: &UserId,
        sender_device: &DeviceId,
        client_msg_id: &ClientMsgId,
        kind: u32,
        body: Vec<u8>,
    ) -> Result<(NewMessage, Ticket), &'static str> {
        let _in_order = lane.admit.lock().await;
        let seq = self.seqs.next(conversation).await.map_err(|error| {
            tracing::warn!(%error, "no seq");
            "storage unavailable; retry"
        })?;
        let message = NewMessage {
            id: self.ids.next_id(),
            conversation: conversation.clone(),
            seq,
            sender: sender.clone(),
            sender_device: sender_device.clone(),
            client_msg_id: client_msg_id.clone(),
            kind,
            body,
            sent_at_ms: self.clock.now_ms(),
        };
        let ticket = self.committer.submit(message.clone()).await.map_err(|_| "server shutting down; retry")?;
        lane.admitted(seq);
        Ok((message, ticket))
    }

    /// Stores an accepted announcement in `room` (archived) or pushes it to the room's
    /// subscribers only (not archived). An `announcement_id` is stored once: repeating it
    /// answers with the original ids.
    ///
    /// # Errors
    /// A message saying storage failed; nothing was stored and the caller may retry.
    pub async fn announce(
        &self,
        room: &ConversationId,
        sender: &UserId,
        announcement_id: Option<&str>,
        body: Vec<u8>,
        archive: bool,
    ) -> Result<Announced, String> {
        let device = DeviceId::parse("api").map_err(|e| e.to_string())?;
        if !archive {
            let message = StoredMessage {
                id: self.ids.next_id(),
                conversation: room.to_string(),
                seq: 0,
                sender: sender.to_string(),
                sender_device: device.to_string(),
                client_msg_id: String::new(),
                kind: ANNOUNCEMENT_KIND,
                body,
                sent_at_ms: self.clock.now_ms(),
            };
            let message_id = message.id;
            self.delivery.fan_out(Arc::new(message)).await;
            return Ok(Announced { message_id, seq: 0, archived: false, duplicate: false });
        }
        let client_msg_id = announcement_client_id(room, announcement_id);
        let duplicate =
            |o: &Outcome| Ok(Announced { message_id: o.message_id, seq: o.seq, archived: true, duplicate: true });
        match self.dedup.try_mark(sender, &client_msg_id) {
            Mark::Fresh => {}
            Mark::Stored(original) => return duplicate(&original),
            Mark::InFlight(original) => {
                return await_original(original).await.map_or_else(|reason| Err(reason.into()), |o| duplicate(&o));
            }
        }
        let lane = self.lanes.get(room);
        let (message, ticket) =
            match self.enqueue(&lane, room, sender, &device, &client_msg_id, ANNOUNCEMENT_KIND, body).await {
                Ok(queued) => queued,
                Err(reason) => {
                    self.dedup.cancel(sender, &client_msg_id);
                    return Err(reason.into());
                }
            };
        let settled = self.settle(&lane, &message, ticket.wait().await);
        self.release(&lane).await;
        match settled {
            Settled::Stored(stored) => {
                Ok(Announced { message_id: stored.message_id, seq: stored.seq, archived: true, duplicate: false })
            }
            Settled::Duplicate(original) => duplicate(&original),
            Settled::Failed => Err("storage failed; retry".into()),
        }
    }

    /// Updates the dedup mark and the lane with a storage outcome.
    fn settle(&self, lane: &Lane, message: &NewMessage, outcome: Result<Inserted, StoreError>) -> Settled {
        match outcome {
            Ok(Inserted::New { id, seq }) => {
                let stored = Outcome { message_id: id, seq, conversation: message.conversation.to_string() };
                self.dedup.complete(&message.sender, &message.client_msg_id, stored.clone());
                lane.finished(seq, Some(Arc::new(stored_message(message))));
                metrics::counter!("herald_pipeline_messages_stored_total").increment(1);
                Settled::Stored(stored)
            }
            Ok(Inserted::Duplicate { id, seq, conversation }) => {
                // Stored before the mark's TTL began: the seq we took is a gap.
                lane.finished(message.seq, None);
                let original = Outcome { message_id: id, seq, conversation };
                self.dedup.complete(&message.sender, &message.client_msg_id, original.clone());
                Settled::Duplicate(original)
            }
            Err(error) => {
                tracing::warn!(%error, conversation = %message.conversation, "storing a message failed");
                lane.finished(message.seq, None);
                self.dedup.cancel(&message.sender, &message.client_msg_id);
                metrics::counter!("herald_pipeline_store_failures_total").increment(1);
                Settled::Failed
            }
        }
    }

    /// Fans out, in seq order, every stored message at the head of the lane.
    async fn release(&self, lane: &Lane) {
        let _in_order = lane.release.lock().await;
        for message in lane.releasable() {
            self.delivery.fan_out(message).await;
        }
    }
}

fn stored_message(message: &NewMessage) -> StoredMessage {
    StoredMessage {
        id: message.id,
        conversation: message.conversation.to_string(),
        seq: message.seq,
        sender: message.sender.to_string(),
        sender_device: message.sender_device.to_string(),
        client_msg_id: message.client_msg_id.as_str().to_owned(),
        kind: message.kind,
        body: message.body.clone(),
        sent_at_ms: message.sent_at_ms,
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

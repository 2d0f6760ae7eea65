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
use crate::ids::{SeqAllocator, SnowflakeGenerator};
use crate::model::{ClientMsgId, ConversationId, ConversationKind};
use crate::store::{Database, GroupCommitter, Inserted, NewMessage, StoredMessage};

use dedup::{Dedup, Mark, Outcome};
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
}

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
                return Admission::Done(ack(Status::Retry, &send, "storage unavailable; retry"));
            }
            Err(refusal) => return Admission::Done(ack(Status::Rejected, &send, refusal.to_string())),
        }
        match self.dedup.try_mark(&connection.user, &client_msg_id) {
            Mark::Fresh => {}
            Mark::Stored(outcome) => return Admission::Done(with_ids(ack(Status::Duplicate, &send, ""), &outcome)),
            Mark::InFlight(mut original) => {
                let connection = Arc::clone(connection);
                return Admission::Wait(Box::pin(async move {
                    let reply = loop {
                        if let Some(outcome) = original.borrow_and_update().clone() {
                            break match outcome {
                                Some(outcome) => with_ids(ack(Status::Duplicate, &send, ""), &outcome),
                                None => ack(Status::Retry, &send, "the original send failed; retry"),
                            };
                        }
                        if original.changed().await.is_err() {
                            break ack(Status::Retry, &send, "the original send was abandoned; retry");
                        }
                    };
                    connection.push(Frame::new(rid, reply));
                }));
            }
        }
        let cancel = |reason: &str| {
            self.dedup.cancel(&connection.user, &client_msg_id);
            Admission::Done(ack(Status::Retry, &send, reason))
        };
        if let ConversationKind::Direct(a, b) = conversation.kind()
            && !self.known_direct.contains(&conversation)
        {
            if let Err(error) = self.database.add_user_conversation(&[&a, &b], &conversation).await {
                tracing::warn!(%error, "recording a direct conversation failed");
                return cancel("storage unavailable; retry");
            }
            self.known_direct.insert(conversation.clone());
        }

        let lane = self.lanes.get(&conversation);
        let (message, ticket) = {
            let _in_order = lane.admit.lock().await;
            let seq = match self.seqs.next(&conversation).await {
                Ok(seq) => seq,
                Err(error) => {
                    tracing::warn!(%error, "no seq");
                    return cancel("storage unavailable; retry");
                }
            };
            let message = NewMessage {
                id: self.ids.next_id(),
                conversation: conversation.clone(),
                seq,
                sender: connection.user.clone(),
                sender_device: connection.device.clone(),
                client_msg_id: client_msg_id.clone(),
                kind: send.kind,
                body: send.body.to_vec(),
                sent_at_ms: self.clock.now_ms(),
            };
            match self.committer.submit(message.clone()).await {
                Ok(ticket) => {
                    lane.admitted(seq);
                    (message, ticket)
                }
                Err(_) => return cancel("server shutting down; retry"),
            }
        };
        let pipeline = Arc::clone(self);
        let connection = Arc::clone(connection);
        Admission::Wait(Box::pin(async move {
            let outcome = ticket.wait().await;
            let reply = pipeline.settle(&lane, &send, &message, outcome);
            connection.push(Frame::new(rid, reply));
            pipeline.release(&lane).await;
        }))
    }

    /// Turns a storage outcome into the ack, and updates the dedup mark and the lane.
    fn settle(
        &self,
        lane: &Lane,
        send: &v1::Send,
        message: &NewMessage,
        outcome: Result<Inserted, crate::store::StoreError>,
    ) -> v1::SendAck {
        match outcome {
            Ok(Inserted::New { id, seq }) => {
                let stored = Outcome { message_id: id, seq, conversation: message.conversation.to_string() };
                self.dedup.complete(&message.sender, &message.client_msg_id, stored.clone());
                lane.finished(seq, Some(Arc::new(stored_message(message))));
                metrics::counter!("herald_pipeline_messages_stored_total").increment(1);
                with_ids(ack(Status::Ok, send, ""), &stored)
            }
            Ok(Inserted::Duplicate { id, seq, conversation }) => {
                // Stored before the mark's TTL began: the seq we took is a gap.
                lane.finished(message.seq, None);
                let original = Outcome { message_id: id, seq, conversation };
                self.dedup.complete(&message.sender, &message.client_msg_id, original.clone());
                with_ids(ack(Status::Duplicate, send, ""), &original)
            }
            Err(error) => {
                tracing::warn!(%error, conversation = %message.conversation, "storing a message failed");
                lane.finished(message.seq, None);
                self.dedup.cancel(&message.sender, &message.client_msg_id);
                metrics::counter!("herald_pipeline_store_failures_total").increment(1);
                ack(Status::Retry, send, "storage failed; retry with the same client_msg_id")
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

//! The uplink: what happens to a `send` on the conversation's owner node.
//!
//! validate → membership → owner (forwarded over the bus when another node owns it) → dedup
//! mark → message-policy hook (a client's send; an announcement another node forwarded was
//! judged by the announce policy) → (per conversation, in order) seq → snowflake id → queue for
//! group commit → wait until durable → `send_ack` → release to fan-out in seq order. Any
//! failure after the dedup mark cancels it and answers `RETRY`, so the client's retry is
//! processed, never swallowed (ARCHITECTURE.md §2); so does a send dropped midway, its
//! future abandoned by whoever awaited it ([`dedup::HeldMark`]).
//!
//! Acting as the owner is fenced (cluster mode): seqs are leased with the claim (this node,
//! the epoch of the very ring view that made it the owner), and each message carries its
//! lease's fence to the commit. A node whose cluster lease is in doubt, whose lease is
//! refused because another node took the conversation over, or whose commit is refused for
//! the same reason answers `RETRY` and forgets the conversation's segments, so the retry —
//! forwarded to the new owner once the ring says so, or leased afresh — starts clean.
//!
//! The pipeline takes a [`SendRequest`] and answers a [`SendAck`] addressed to its origin;
//! it never sees a socket, nor which mode the node runs in.

pub mod announce;
pub mod dedup;
pub mod lanes;
mod stage;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use herald_proto::v1::{self, send_ack::Status};
use tracing::Instrument;

use crate::clock::WallClock;
use crate::delivery::Delivery;
use crate::health::Vitals;
use crate::ids::seq::Allocated;
use crate::ids::{SeqAllocator, SnowflakeGenerator};
use crate::maps::Keyed;
use crate::membership::{Membership, Refusal};
use crate::model::{ClientMsgId, ConversationId, ConversationKind, InvalidId, Message, NodeId};
use crate::plugins::types::{Message as HookMessage, MessageDecision};
use crate::plugins::{Hook, PluginHost};
use crate::routing::bus::{BusError, NodeBus, Queued, SendAck, SendRequest};
use crate::routing::router::{Router, SendOwner};
use crate::store::Ticket;
use crate::store::{ConversationStore, Inserted, LeaseError, MessageStore, MessageWriter, OwnerClaim, StoreError};
use crate::telemetry::registered;

use dedup::{DedupMarks, HeldMark, Mark, Outcome};
use lanes::{Lane, Lanes};
use stage::{Stage, StageName};

/// Retry-after hint for a transient failure.
const RETRY_AFTER_MS: u32 = 200;

/// Why a send was not stored: each answers `REJECTED` (do not retry as is) or `RETRY`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Invalid(#[from] InvalidId),
    #[error("{0}")]
    Refused(String),
    #[error("{code}: {reason}")]
    Policy { code: String, reason: String, retry_after_ms: Option<u32> },
    #[error("storage unavailable; retry")]
    StorageUnavailable,
    #[error("storage failed; retry with the same client_msg_id")]
    StoreFailed,
    #[error("server shutting down; retry")]
    ShuttingDown,
    /// The client is told only that the owner is out of reach; why stays in the source,
    /// for the logs.
    #[error("conversation owned by node {owner}, which is not reachable from here")]
    OwnerUnreachable {
        owner: NodeId,
        #[source]
        cause: BusError,
    },
    #[error("forwarded to this node, which no longer owns the conversation (node {owner} does); retry")]
    NotOwner { owner: NodeId },
    #[error("node {owner} owns the conversation and this request cannot be passed on to it; send it there")]
    OwnedElsewhere { owner: NodeId },
    #[error(
        "this node cannot act as the conversation's owner just now (another node took it over, or this node's \
         cluster lease is in doubt); retry"
    )]
    Fenced,
    #[error("the original send failed; retry")]
    OriginalFailed,
    #[error("the original send was abandoned; retry")]
    OriginalAbandoned,
}

impl SendError {
    /// The `send_ack` status this error answers with.
    pub fn status(&self) -> Status {
        match self {
            Self::Invalid(_) | Self::Refused(_) | Self::Policy { .. } => Status::Rejected,
            _ => Status::Retry,
        }
    }

    /// The `retry_after_ms` hint this error answers with.
    pub fn retry_after_ms(&self) -> u32 {
        match self {
            Self::Policy { retry_after_ms, .. } => retry_after_ms.unwrap_or(0),
            _ if self.status() == Status::Retry => RETRY_AFTER_MS,
            _ => 0,
        }
    }
}

impl From<Refusal> for SendError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Store(error) => {
                tracing::warn!(%error, "membership check failed");
                Self::StorageUnavailable
            }
            other => Self::Refused(other.to_string()),
        }
    }
}

/// Runs once a send's ack is on its way: releases stored messages to fan-out in seq order.
pub type FanOut = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A send that ended: its ack, and the fan-out to run after the ack is written.
pub struct Settled {
    pub ack: SendAck,
    pub fan_out: Option<FanOut>,
}

/// How an admitted send continues.
pub enum Admission {
    /// Answered at once (rejected, or a duplicate of a stored message).
    Done(SendAck),
    /// Queued, forwarded, or waiting for an original: run this to completion, write the ack,
    /// then run the fan-out.
    Wait(Pin<Box<dyn Future<Output = Settled> + Send>>),
}

/// What a pipeline is built from: the seams it uses, chosen where the node is assembled.
pub struct PipelineParts {
    pub writer: Arc<dyn MessageWriter>,
    /// Where the original of a duplicate whose dedup mark is gone is looked up.
    pub messages: Arc<dyn MessageStore>,
    pub conversations: Arc<dyn ConversationStore>,
    pub seqs: Arc<SeqAllocator>,
    pub ids: Arc<SnowflakeGenerator>,
    pub dedup: Arc<dyn DedupMarks>,
    /// Shared with the [`OwnerFrontier`](lanes::OwnerFrontier) that answers what is in flight.
    pub lanes: Arc<Lanes>,
    pub membership: Arc<Membership>,
    pub delivery: Arc<Delivery>,
    pub router: Arc<Router>,
    pub bus: Arc<dyn NodeBus>,
    pub clock: Arc<dyn WallClock>,
    pub plugins: Arc<PluginHost>,
    pub vitals: Arc<Vitals>,
    /// A direct conversation not sent to for this long is forgotten as recorded (zero:
    /// never); the next send records it again, harmlessly.
    pub known_direct_idle: Duration,
}

/// The uplink of one node.
pub struct Pipeline {
    writer: Arc<dyn MessageWriter>,
    messages: Arc<dyn MessageStore>,
    conversations: Arc<dyn ConversationStore>,
    seqs: Arc<SeqAllocator>,
    ids: Arc<SnowflakeGenerator>,
    dedup: Arc<dyn DedupMarks>,
    lanes: Arc<Lanes>,
    membership: Arc<Membership>,
    delivery: Arc<Delivery>,
    /// Step 2: the owner of a send.
    router: Arc<Router>,
    /// Forwards sends this node does not own.
    bus: Arc<dyn NodeBus>,
    clock: Arc<dyn WallClock>,
    /// Direct conversations already recorded in `user_conversations` by this process
    /// (bounded; one forgotten is recorded again, harmlessly).
    known_direct: moka::sync::Cache<ConversationId, (), Keyed>,
    /// The message-policy hook (step 4).
    plugins: Arc<PluginHost>,
    /// Errors clients see, for the health snapshot.
    vitals: Arc<Vitals>,
}

/// Most direct conversations remembered as recorded (each costs a few hundred bytes).
const MAX_KNOWN_DIRECT: u64 = 1_000_000;

impl Pipeline {
    /// Direct conversations remembered as recorded. Does the cache's pending upkeep first:
    /// expired entries are counted (and held) until it runs, which on an idle node is never.
    pub fn known_direct(&self) -> u64 {
        self.known_direct.run_pending_tasks();
        self.known_direct.entry_count()
    }

    pub fn new(parts: PipelineParts) -> Self {
        let known_direct = moka::sync::Cache::builder().max_capacity(MAX_KNOWN_DIRECT);
        let known_direct = if parts.known_direct_idle.is_zero() {
            known_direct.build_with_hasher(Keyed::default())
        } else {
            known_direct.time_to_idle(parts.known_direct_idle).build_with_hasher(Keyed::default())
        };
        Self {
            writer: parts.writer,
            messages: parts.messages,
            conversations: parts.conversations,
            seqs: parts.seqs,
            ids: parts.ids,
            dedup: parts.dedup,
            lanes: parts.lanes,
            membership: parts.membership,
            delivery: parts.delivery,
            router: parts.router,
            bus: parts.bus,
            clock: parts.clock,
            known_direct,
            plugins: parts.plugins,
            vitals: parts.vitals,
        }
    }
}

/// The ack of `request` with `status`.
fn ack(request: &SendRequest, status: Status) -> SendAck {
    SendAck {
        to: request.origin.clone(),
        rid: request.rid,
        ack: v1::SendAck {
            client_msg_id: request.send.client_msg_id.clone(),
            status: status as i32,
            conversation: request.send.conversation.clone(),
            ..v1::SendAck::default()
        },
    }
}

/// The ack of a send that was not stored.
fn refused(request: &SendRequest, error: &SendError) -> SendAck {
    let mut answer = ack(request, error.status());
    answer.ack.reason = error.to_string();
    answer.ack.retry_after_ms = error.retry_after_ms();
    answer
}

/// The ack of a stored send (`status` OK, or DUPLICATE with the original's ids).
fn stored(request: &SendRequest, status: Status, outcome: &Outcome) -> SendAck {
    let mut answer = ack(request, status);
    answer.ack.message_id = outcome.message_id;
    answer.ack.seq = outcome.seq;
    answer.ack.conversation = outcome.conversation.to_string();
    answer
}

fn settled(ack: SendAck) -> Settled {
    Settled { ack, fan_out: None }
}

impl Pipeline {
    /// Runs the in-order part of a send (call sends of one connection one at a time, in
    /// the order they arrived); the rest comes back as [`Admission::Wait`]. Each send runs in
    /// a `send` span naming its user and conversation, and its seq once it has one.
    pub async fn admit(self: &Arc<Self>, request: SendRequest) -> Admission {
        let span = tracing::debug_span!(
            "send",
            user = %request.origin.user,
            conversation = %request.send.conversation,
            seq = tracing::field::Empty,
        );
        match self.admit_here(request).instrument(span.clone()).await {
            Admission::Wait(rest) => Admission::Wait(Box::pin(rest.instrument(span))),
            done => done,
        }
    }

    async fn admit_here(self: &Arc<Self>, request: SendRequest) -> Admission {
        let (client_msg_id, conversation) = match self.check(&request).await {
            Ok(checked) => checked,
            Err(error) => return Admission::Done(refused(&request, &error)),
        };
        let claim = match self.router.send_owner(&request.origin.user, &conversation).await {
            SendOwner::Here { node, epoch } => OwnerClaim { node, epoch },
            SendOwner::Elsewhere(owner) => {
                if request.origin.node != self.router.this_node() {
                    // Forwarded here, but the ring moved on meanwhile: one hop only, so two
                    // nodes whose views differ for a moment never pass a send back and forth.
                    return Admission::Done(refused(&request, &SendError::NotOwner { owner }));
                }
                return self.forward_in_order(owner, request).await;
            }
        };
        let sender = request.origin.user.clone();
        let marking = Stage::start(StageName::Mark);
        let mark = self.dedup.try_mark(&sender, &client_msg_id, &conversation).await;
        marking.done();
        // From here on the mark is held: every way out completes or cancels it, and so does
        // this future (or the wait it hands back) dropped midway.
        let held = match mark {
            Mark::Fresh => HeldMark::new(Arc::clone(&self.dedup), sender, client_msg_id.clone()),
            Mark::Stored(outcome) => return Admission::Done(stored(&request, Status::Duplicate, &outcome)),
            Mark::InFlight(original) => {
                return Admission::Wait(Box::pin(async move {
                    settled(match original.await {
                        Ok(outcome) => stored(&request, Status::Duplicate, &outcome),
                        Err(error) => refused(&request, &error),
                    })
                }));
            }
        };
        let queueing = Stage::start(StageName::Queue);
        let queued = self.queue(&request, client_msg_id.clone(), conversation, claim).await;
        queueing.done();
        match queued {
            Ok((lane, message, ticket)) => {
                Admission::Wait(Box::pin(self.clone().finish(request, lane, message, ticket, held)))
            }
            Err(error) => {
                held.cancel().await;
                Admission::Done(refused(&request, &error))
            }
        }
    }

    /// Step 1: valid ids, and a sender allowed to send there.
    async fn check(&self, request: &SendRequest) -> Result<(ClientMsgId, ConversationId), SendError> {
        let client_msg_id = ClientMsgId::parse(&request.send.client_msg_id)?;
        let conversation = ConversationId::parse(&request.send.conversation)?;
        if request.announcement && !matches!(conversation.kind(), ConversationKind::Room(_)) {
            // Only a room takes announcements; anything else so marked is a confused peer,
            // and must not skip the message policy by it.
            return Err(SendError::Refused(format!("an announcement goes to a room, not to {conversation}")));
        }
        // A room subscription is known on the node holding the connection, which checked it
        // before forwarding.
        let here = request.origin.node == self.router.this_node();
        let connection = here.then_some(request.origin.connection);
        if let Err(refusal) = self.membership.check_send(&request.origin.user, connection, &conversation).await {
            let error = SendError::from(refusal);
            if error == SendError::StorageUnavailable {
                self.vitals.count_error();
            }
            return Err(error);
        }
        Ok((client_msg_id, conversation))
    }

    /// Step 2, another node owns it: that node processes the send and answers. The send is
    /// handed to the link to its owner before this returns, so a connection's next send (the
    /// gateway admits them one at a time) goes out after it, and the owner, which admits a
    /// connection's forwarded sends in the order they arrive, gives them seqs in the order
    /// they were sent.
    async fn forward_in_order(self: &Arc<Self>, owner: NodeId, request: SendRequest) -> Admission {
        let (queued, on_queued) = tokio::sync::oneshot::channel();
        let mut forwarding = Box::pin(Arc::clone(self).forward(owner, request, queued));
        tokio::select! {
            biased;
            settled = &mut forwarding => Admission::Wait(Box::pin(std::future::ready(settled))),
            // Queued, or never will be (the sender dropped): the rest runs in the caller's task.
            _ = on_queued => Admission::Wait(forwarding),
        }
    }

    async fn forward(self: Arc<Self>, owner: NodeId, request: SendRequest, queued: Queued) -> Settled {
        let failed = |cause| refused(&request, &SendError::OwnerUnreachable { owner, cause });
        settled(match self.bus.forward_send(owner, request.clone(), queued).await {
            Ok(ack) => ack,
            Err(cause) => failed(cause),
        })
    }

    /// Steps 4-7 with the dedup mark held: the policy hook, then seq, id and the queue.
    async fn queue(
        &self,
        request: &SendRequest,
        client_msg_id: ClientMsgId,
        conversation: ConversationId,
        claim: OwnerClaim,
    ) -> Result<(Arc<Lane>, Message, Ticket), SendError> {
        if !self.writer.available() {
            // The store's breaker is open: answer RETRY now, before a seq is taken.
            self.vitals.count_error();
            return Err(SendError::StorageUnavailable);
        }
        let body = self.apply_policy(request, &conversation, &client_msg_id).await?;
        self.record_direct(&conversation).await.map_err(|error| {
            tracing::warn!(%error, "recording a direct conversation failed");
            SendError::StorageUnavailable
        })?;
        let lane = self.lanes.get(&conversation);
        let draft = Message {
            id: 0,
            conversation,
            seq: 0,
            sender: request.origin.user.clone(),
            sender_device: request.origin.device.clone(),
            client_msg_id,
            kind: request.send.kind,
            body,
            sent_at_ms: 0,
        };
        let (message, ticket) = self.enqueue(&lane, draft, claim).await?;
        Ok((lane, message, ticket))
    }

    /// Step 4: the message-policy hook may allow, rewrite or reject the body of a client's
    /// send. An announcement forwarded by another node was judged by the announce policy
    /// there, and is stored as one posted here, which never meets this hook: its limits are
    /// the players', and an announcement counted against them would spend their budget.
    async fn apply_policy(
        &self,
        request: &SendRequest,
        conversation: &ConversationId,
        client_msg_id: &ClientMsgId,
    ) -> Result<bytes::Bytes, SendError> {
        let body = request.send.body.clone();
        if request.announcement || !self.plugins.has_hook(Hook::MessagePolicy) {
            return Ok(body);
        }
        let input = HookMessage {
            sender: request.origin.user.to_string(),
            sender_device: request.origin.device.to_string(),
            conversation: conversation.to_string(),
            kind: request.send.kind,
            body: body.to_vec(),
            client_msg_id: client_msg_id.to_string(),
        };
        // Boxed: a hook call is a deep future (1.7 KB), and inline it made every send's
        // future 3.4 KB, plugin or not, allocated and copied for each frame a connection
        // reads (a send or a deliver_ack; gateway/dispatch.rs boxes a frame's handling).
        // Boxed here, the allocation is made only when the hook runs.
        match Box::pin(self.plugins.message_policy(&input)).await {
            MessageDecision::Allow => Ok(body),
            MessageDecision::Rewrite(rewritten) => Ok(rewritten.into()),
            MessageDecision::Reject(rejection) => Err(SendError::Policy {
                code: rejection.code,
                reason: rejection.reason,
                retry_after_ms: rejection.retry_after_ms.map(|ms| u32::try_from(ms).unwrap_or(u32::MAX)),
            }),
        }
    }

    /// Waits until the message is durable (or not), answers, and hands back the fan-out
    /// (which completes the `held` mark of a stored send). A send not stored has its mark
    /// cancelled before it is answered, so the retry the answer asks for is processed.
    async fn finish(
        self: Arc<Self>,
        request: SendRequest,
        lane: Arc<Lane>,
        message: Message,
        ticket: Ticket,
        held: HeldMark,
    ) -> Settled {
        let committing = Stage::start(StageName::Commit);
        let outcome = ticket.wait().await;
        committing.done();
        let (ack, to_complete) = match self.settle(&lane, &message, outcome) {
            Ok((status, outcome)) => (stored(&request, status, &outcome), Some((held, outcome))),
            Err(error) => {
                held.cancel().await;
                self.vitals.count_error();
                (refused(&request, &error), None)
            }
        };
        // The mark is completed once the ack is on its way, beside the fan-out: neither the
        // ack nor the delivery waits for it. Meanwhile a duplicate finds the mark pending
        // and waits for the stored ids, as it would for any send in flight.
        let fan_out: FanOut = Box::pin(
            async move {
                let complete = async {
                    if let Some((held, outcome)) = to_complete {
                        let completing = Stage::start(StageName::Complete);
                        held.complete(outcome).await;
                        completing.done();
                    }
                };
                futures_util::future::join(complete, self.release(&lane)).await;
                self.lanes.done_with(&message.conversation, lane);
            }
            .instrument(tracing::Span::current()),
        );
        Settled { ack, fan_out: Some(fan_out) }
    }

    /// Records, once per process, that both users of a direct conversation take part in it.
    async fn record_direct(&self, conversation: &ConversationId) -> Result<(), StoreError> {
        if let ConversationKind::Direct(a, b) = conversation.kind()
            && !self.known_direct.contains_key(conversation)
        {
            self.conversations.add_user_conversation(&[&a, &b], conversation).await?;
            self.known_direct.insert(conversation.clone(), ());
        }
        Ok(())
    }

    /// Steps 5-7 in conversation order: seq (leased with `claim`), snowflake id, queued for
    /// group commit with the seq's fence. Whether this node may act as an owner at all is
    /// asked before the seq is taken and again just before the message is queued.
    async fn enqueue(
        &self,
        lane: &Lane,
        mut message: Message,
        claim: OwnerClaim,
    ) -> Result<(Message, Ticket), SendError> {
        let _in_order = lane.admit.lock().await;
        if !self.router.may_act_as_owner() {
            return Err(self.fenced(&message.conversation, "this node's cluster lease is in doubt"));
        }
        let Allocated { seq, fence } = match self.seqs.next(&message.conversation, claim).await {
            Ok(allocated) => allocated,
            Err(error @ LeaseError::Superseded { .. }) => {
                return Err(self.fenced(&message.conversation, &error.to_string()));
            }
            Err(error) => {
                tracing::warn!(%error, "no seq");
                return Err(SendError::StorageUnavailable);
            }
        };
        message.seq = seq;
        tracing::Span::current().record("seq", message.seq);
        message.id = self.ids.next_id();
        message.sent_at_ms = self.clock.now_ms();
        if !self.router.may_act_as_owner() {
            // The seq taken is a gap.
            return Err(self.fenced(&message.conversation, "this node's cluster lease is in doubt"));
        }
        let ticket = self.writer.submit(message.clone(), Some(fence)).await.map_err(|error| match error {
            StoreError::Unavailable(_) => SendError::StorageUnavailable,
            _ => SendError::ShuttingDown,
        })?;
        lane.admitted(message.seq);
        Ok((message, ticket))
    }

    /// This node may not act as `conversation`'s owner just now (`why`): its segments are
    /// forgotten, so the next send leases afresh (or is refused again) rather than take seqs
    /// no commit would accept.
    fn fenced(&self, conversation: &ConversationId, why: &str) -> SendError {
        tracing::info!(%conversation, why, "not acting as the conversation's owner; the sender retries");
        self.seqs.forget(conversation);
        metrics::counter!("herald_pipeline_fenced_sends_total").increment(1);
        SendError::Fenced
    }

    /// Updates the lane with a storage outcome: the status and ids to answer with (a new
    /// message's, or those of the original the unique index found), or why it was not stored.
    fn settle(
        &self,
        lane: &Lane,
        message: &Message,
        outcome: Result<Inserted, StoreError>,
    ) -> Result<(Status, Outcome), SendError> {
        match outcome {
            Ok(Inserted::New { id, seq }) => {
                let stored = Outcome { message_id: id, seq, conversation: message.conversation.clone() };
                lane.finished(seq, Some(Arc::new(message.clone())));
                registered!(counter, "herald_pipeline_messages_stored_total").increment(1);
                self.vitals.count_stored();
                Ok((Status::Ok, stored))
            }
            Ok(Inserted::Duplicate { id, seq, conversation }) => {
                // Stored before the mark's TTL began: the seq we took is a gap.
                lane.finished(message.seq, None);
                Ok((Status::Duplicate, Outcome { message_id: id, seq, conversation }))
            }
            Err(error) => {
                lane.finished(message.seq, None);
                if let StoreError::Fenced { .. } = error {
                    return Err(self.fenced(&message.conversation, &error.to_string()));
                }
                tracing::warn!(%error, conversation = %message.conversation, "storing a message failed");
                metrics::counter!("herald_pipeline_store_failures_total").increment(1);
                Err(SendError::StoreFailed)
            }
        }
    }

    /// Fans out, in seq order, every stored message at the head of the lane.
    async fn release(&self, lane: &Lane) {
        let releasing = Stage::start(StageName::Release);
        let _in_order = lane.release.lock().await;
        for message in lane.releasable() {
            let fanning = Stage::start(StageName::FanOut);
            self.delivery.fan_out(message).await;
            fanning.done();
        }
        releasing.done();
    }
}

#[cfg(test)]
mod tests;

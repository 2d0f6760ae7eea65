//! Per-conversation ordering on the owner node.
//!
//! A lane makes "take a seq, take an id, queue for storage" one step per conversation, so
//! messages reach the group-commit queue in seq order, and releases stored messages to
//! fan-out strictly in seq order, even when their commits finish out of order. It also
//! knows the lowest seq still in flight, so `sync` can say how far its answer is complete
//! without mistaking a not-yet-durable message for a gap.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::delivery::pull::SeqFrontier;
use crate::maps::DashMap;
use crate::model::{ConversationId, Message, UserId};
use crate::routing::bus::NodeBus;
use crate::routing::router::{Router, SendOwner};

/// One conversation's lane.
#[derive(Default)]
pub struct Lane {
    /// Held while allocating a seq and queueing the message.
    pub admit: tokio::sync::Mutex<()>,
    /// Held while releasing stored messages to fan-out, so releases go out in order.
    pub release: tokio::sync::Mutex<()>,
    /// Messages admitted and not yet released, in seq order.
    in_flight: Mutex<VecDeque<Slot>>,
}

struct Slot {
    seq: u64,
    state: SlotState,
}

enum SlotState {
    Pending,
    Stored(Arc<Message>),
    Failed,
}

impl Lane {
    /// Records that `seq` was admitted (call while holding `admit`).
    pub fn admitted(&self, seq: u64) {
        self.slots().push_back(Slot { seq, state: SlotState::Pending });
    }

    /// Records how `seq` ended: stored (`Some`) or failed (`None`).
    pub fn finished(&self, seq: u64, stored: Option<Arc<Message>>) {
        let mut slots = self.slots();
        if let Some(slot) = slots.iter_mut().find(|slot| slot.seq == seq) {
            slot.state = stored.map_or(SlotState::Failed, SlotState::Stored);
        }
    }

    /// Takes the stored messages at the head of the lane, in seq order, up to the first one
    /// still pending (call while holding `release`).
    pub fn releasable(&self) -> Vec<Arc<Message>> {
        let mut slots = self.slots();
        let mut out = Vec::new();
        while let Some(front) = slots.front() {
            match &front.state {
                SlotState::Pending => break,
                SlotState::Stored(message) => out.push(Arc::clone(message)),
                SlotState::Failed => {}
            }
            slots.pop_front();
        }
        out
    }

    /// The lowest seq admitted but not yet durable (or failed), if any.
    pub fn lowest_in_flight(&self) -> Option<u64> {
        self.slots().iter().find(|slot| matches!(slot.state, SlotState::Pending)).map(|slot| slot.seq)
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, VecDeque<Slot>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Every conversation's lane on this node.
#[derive(Default)]
pub struct Lanes {
    lanes: DashMap<ConversationId, Arc<Lane>>,
}

impl Lanes {
    /// The lane of `conversation`, made on first use.
    pub fn get(&self, conversation: &ConversationId) -> Arc<Lane> {
        if let Some(lane) = self.lanes.get(conversation) {
            return Arc::clone(&lane);
        }
        Arc::clone(&self.lanes.entry(conversation.clone()).or_default())
    }

    /// The lowest seq of `conversation` still in flight, if any.
    pub fn lowest_in_flight(&self, conversation: &ConversationId) -> Option<u64> {
        self.lanes.get(conversation).and_then(|lane| lane.lowest_in_flight())
    }

    /// A send or announcement is done with `lane`, the lane of `conversation`: forgets it
    /// at once when nobody else holds it and nothing is in flight on it. Such a lane is
    /// indistinguishable from a new one (the next message makes it again), so the lanes in
    /// memory are those of the conversations with sends in flight.
    pub fn done_with(&self, conversation: &ConversationId, lane: Arc<Lane>) {
        drop(lane);
        // The shard is locked while deciding: no one can take the lane meanwhile.
        self.lanes.remove_if(conversation, |_, lane| Arc::strong_count(lane) == 1 && lane.slots().is_empty());
    }

    /// Forgets the lanes nobody holds and nothing is in flight on: those a send gave up
    /// on before [`done_with`](Self::done_with) (a refused send, an abandoned wait).
    /// Returns how many were forgotten.
    pub fn evict_idle(&self) -> usize {
        let before = self.lanes.len();
        // The shard is locked while deciding: no one can take the lane meanwhile.
        self.lanes.retain(|_, lane| Arc::strong_count(lane) > 1 || !lane.slots().is_empty());
        before.saturating_sub(self.lanes.len())
    }

    /// Lanes in memory.
    pub fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Whether no lane is in memory.
    pub fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }
}

/// Answers what the owner of a conversation has in flight: this node's lanes when it owns
/// it, else the owner, asked over the bus.
pub struct OwnerFrontier {
    pub lanes: Arc<Lanes>,
    pub router: Arc<Router>,
    pub bus: Arc<dyn NodeBus>,
}

#[async_trait]
impl SeqFrontier for OwnerFrontier {
    async fn lowest_in_flight(&self, user: &UserId, conversation: &ConversationId) -> Result<Option<u64>, String> {
        match self.router.send_owner(user, conversation).await {
            SendOwner::Elsewhere(owner) => {
                self.bus.lowest_in_flight(owner, conversation).await.map_err(|error| error.to_string())
            }
            SendOwner::Here { .. } => Ok(self.lanes.lowest_in_flight(conversation)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(seq: u64) -> Option<Arc<Message>> {
        Some(Arc::new(Message {
            id: seq,
            conversation: ConversationId::parse("dm:a:b").expect("valid"),
            seq,
            sender: crate::model::UserId::parse("a").expect("valid"),
            sender_device: crate::model::DeviceId::parse("d").expect("valid"),
            client_msg_id: crate::model::ClientMsgId::parse("00000000-0000-4000-8000-000000000000").expect("valid"),
            kind: 0,
            body: bytes::Bytes::new(),
            sent_at_ms: 0,
        }))
    }

    #[test]
    fn only_lanes_nobody_holds_with_nothing_in_flight_are_forgotten() {
        let lanes = Lanes::default();
        let (idle, held, busy) = (
            ConversationId::parse("dm:a:b").expect("valid"),
            ConversationId::parse("dm:a:c").expect("valid"),
            ConversationId::parse("room:lobby").expect("valid"),
        );
        drop(lanes.get(&idle));
        let holder = lanes.get(&held);
        lanes.get(&busy).admitted(7);
        assert_eq!(lanes.evict_idle(), 1);
        assert_eq!(lanes.len(), 2);
        assert_eq!(lanes.lowest_in_flight(&busy), Some(7), "the busy lane kept its slot");
        assert!(Arc::ptr_eq(&holder, &lanes.get(&held)), "the held lane is still the same one");
        lanes.get(&busy).finished(7, stored(7));
        assert_eq!(lanes.get(&busy).releasable().len(), 1);
        drop(holder);
        assert_eq!(lanes.evict_idle(), 2);
        assert!(lanes.is_empty());
    }

    #[test]
    fn a_lane_is_forgotten_when_its_last_user_is_done_with_it() {
        let lanes = Lanes::default();
        let conversation = ConversationId::parse("dm:a:b").expect("valid");
        let (first, second) = (lanes.get(&conversation), lanes.get(&conversation));
        first.admitted(1);
        second.admitted(2);
        first.finished(1, stored(1));
        second.finished(2, stored(2));
        assert_eq!(first.releasable().len(), 2);

        lanes.done_with(&conversation, first);
        assert_eq!(lanes.len(), 1, "the second send still holds it");
        lanes.done_with(&conversation, second);
        assert!(lanes.is_empty(), "nobody holds it and nothing is in flight");

        let busy = lanes.get(&conversation);
        busy.admitted(3);
        lanes.done_with(&conversation, busy);
        assert_eq!(lanes.lowest_in_flight(&conversation), Some(3), "a lane with a seq in flight stays");
    }

    #[test]
    fn releases_in_seq_order_whatever_order_commits_finish() {
        let lane = Lane::default();
        for seq in [4, 5, 6, 7] {
            lane.admitted(seq);
        }
        lane.finished(6, stored(6));
        assert!(lane.releasable().is_empty(), "4 is still pending");
        assert_eq!(lane.lowest_in_flight(), Some(4));
        lane.finished(5, None);
        lane.finished(4, stored(4));
        let seqs: Vec<u64> = lane.releasable().iter().map(|m| m.seq).collect();
        assert_eq!(seqs, vec![4, 6], "failed 5 is skipped, 7 still pending");
        assert_eq!(lane.lowest_in_flight(), Some(7));
        lane.finished(7, stored(7));
        assert_eq!(lane.releasable().len(), 1);
        assert_eq!(lane.lowest_in_flight(), None);
    }
}

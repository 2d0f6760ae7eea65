//! One device's connection as delivery sees it: who it is, where its frames go (an
//! [`Outbox`]), and the ledger of what was pushed, claimed and owed.
//!
//! Reconnect grace (ARCHITECTURE.md §3): a dropped session is *parked* for a while instead
//! of forgotten. Fan-out still offers it messages, which it notes as owed. When the same
//! device connects again, the new session *resumes from* the old one: it takes the old one's
//! acks and what it owes, and from then on the old one forwards every offer to it. So a
//! quick reconnect's backfill reads only the conversations the device may lack, not every
//! conversation the user is in. A device that comes back on another node resumes the same
//! way: this node hands the old session's ledger over ([`Session::hand_over`]) and passes
//! the offers that still reach the old session on to that node. Every decision about one session (live or not, parked,
//! resumed, which seqs were pushed) is made under its one `ledger` lock, so an offer can
//! never fall between two of them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use herald_proto::SharedFrame;
use herald_proto::v1::Frame;

use super::rtt::RttEstimate;
use crate::maps::HashMap;
use crate::model::{ConnectionId, ConversationId, DeviceId, DeviceLedger, NodeId, UserId};

/// Where a session's frames go: the gateway's socket writer for a local connection.
///
/// Invariant of every implementation: a frame is queued, never written in the caller's
/// task, and a queue that overflows closes the connection (slow consumer) rather than
/// growing or blocking, so one slow client can never stall delivery to others.
#[async_trait]
pub trait Outbox: Send + Sync + 'static {
    /// Queues `frame` without waiting; returns whether it was queued.
    fn push(&self, frame: Frame) -> bool;
    /// Queues a frame shared with other connections (a room message), without waiting;
    /// returns whether it was queued. A socket writer keeps it shared, so it is encoded
    /// once for all of them; this default queues a copy.
    fn push_shared(&self, frame: &Arc<SharedFrame>) -> bool {
        self.push(frame.frame().clone())
    }
    /// Queues `frame`, waiting for room (backfill paces itself to the client); returns
    /// whether it was queued.
    async fn push_waiting(&self, frame: Frame) -> bool;
    /// Whether the connection is closing: nothing more will be written.
    fn is_closed(&self) -> bool;
}

/// A device's authenticated connection, for delivery.
pub struct Session {
    /// Unique on this node.
    pub id: ConnectionId,
    pub user: UserId,
    pub device: DeviceId,
    outbox: Arc<dyn Outbox>,
    /// False while the device is being backfilled; live pushes skip it until then. Changed
    /// only under the `ledger` lock.
    live: AtomicBool,
    /// Highest seq the device acked, per conversation (acks are cumulative).
    acked: Mutex<HashMap<ConversationId, u64>>,
    /// What was pushed and what is owed; see [`Ledger`].
    ledger: Mutex<Ledger>,
    /// Per conversation, the newest first push not yet acked: its seq, `sent_at_ms`
    /// (`None` for a backfill push, whose message may be old), and when it was pushed. The
    /// ack that covers it is one sample of the connection's round trip, and for a live push
    /// one of send→deliver-ack latency.
    newest_push: Mutex<HashMap<ConversationId, NewestPush>>,
    /// This connection's round trips, for its ack timeout.
    pub rtt: RttEstimate,
}

/// The newest first push of a conversation not yet acked (see `Session::note_push`).
#[derive(Clone, Copy)]
struct NewestPush {
    seq: u64,
    /// When its message was stored; `None` for a backfill push.
    sent_at_ms: Option<u64>,
    pushed_at: Instant,
}

/// What became of one offer to a session (see [`Session::offer`]).
pub enum Offered {
    /// Push it to this connection (the push is claimed there).
    Push(Arc<Session>),
    /// The device's new connection is on this node: pass the message on to it there.
    Forward(NodeId),
    /// Nothing to push now: the device has it, or it is noted as owed.
    Held,
}

impl Offered {
    /// The connection to push to, if any.
    pub fn into_push(self) -> Option<Arc<Session>> {
        match self {
            Self::Push(session) => Some(session),
            Self::Forward(_) | Self::Held => None,
        }
    }
}

/// The connection of the same device that took over from a session.
enum Successor {
    /// On this node.
    Here(Arc<Session>),
    /// On another node, which took the ledger over.
    Elsewhere(NodeId),
}

/// Most conversations a connection notes as owed while it is not live; past this a
/// reconnect falls back to a full backfill.
pub const MAX_OWED_CONVERSATIONS: usize = 4096;

/// Where the device stands, for pushes and for a reconnect.
#[derive(Default)]
struct Ledger {
    /// Per conversation, the seqs pushed and not yet matched or acked.
    pushed: HashMap<ConversationId, BTreeSet<u64>>,
    /// Backfill is over: a seq still in `pushed` is one backfill pushed (or read) before its
    /// live fan-out came — which happens when backfill reads a message between its commit
    /// and its fan-out — so that fan-out is skipped once.
    backfill_done: bool,
    /// Per conversation, the first and the highest seq claimed for this connection: what a
    /// device that drops may not have received.
    claimed: HashMap<ConversationId, (u64, u64)>,
    /// Per conversation, the lowest seq offered while this connection could not take it
    /// (not live yet, or parked).
    owed: HashMap<ConversationId, u64>,
    /// More conversations were owed than [`MAX_OWED_CONVERSATIONS`]; `owed` is incomplete.
    overflowed: bool,
    /// Dropped, and waiting for its device to come back (reconnect grace).
    parked: bool,
    /// The connection of the same device that took over; offers go there now.
    successor: Option<Successor>,
    /// Set on a connection that resumed from its predecessor: the conversations its
    /// backfill reads, each with the seq after which the device may lack messages.
    resume: Option<BTreeMap<ConversationId, u64>>,
}

impl Ledger {
    /// The first-push check shared by backfill and fan-out; records what was claimed.
    fn claim(&mut self, conversation: &ConversationId, seq: u64) -> bool {
        let first = if !self.backfill_done {
            self.pushed.entry(conversation.clone()).or_default().insert(seq)
        } else if let Some(pushed) = self.pushed.get_mut(conversation) {
            let first = !pushed.remove(&seq);
            if pushed.is_empty() {
                self.pushed.remove(conversation);
            }
            first
        } else {
            true
        };
        if first {
            match self.claimed.get_mut(conversation) {
                Some((low, high)) => {
                    *low = (*low).min(seq);
                    *high = (*high).max(seq);
                }
                None => _ = self.claimed.insert(conversation.clone(), (seq, seq)),
            }
        }
        first
    }

    /// Notes that `seq` of `conversation` was offered and could not be taken.
    fn owe(&mut self, conversation: &ConversationId, seq: u64) {
        if let Some(lowest) = self.owed.get_mut(conversation) {
            *lowest = (*lowest).min(seq);
        } else if self.owed.len() < MAX_OWED_CONVERSATIONS {
            self.owed.insert(conversation.clone(), seq);
        } else {
            self.overflowed = true;
        }
    }
}

impl Session {
    /// A session whose frames go to `outbox`; not live until its backfill says so.
    pub fn new(id: ConnectionId, user: UserId, device: DeviceId, outbox: Arc<dyn Outbox>) -> Self {
        Self {
            id,
            user,
            device,
            outbox,
            live: AtomicBool::new(false),
            acked: Mutex::default(),
            ledger: Mutex::new(Ledger::default()),
            newest_push: Mutex::default(),
            rtt: RttEstimate::default(),
        }
    }

    /// Notes a first push of `seq` of `conversation`: live (`sent_at_ms` given, when it was
    /// stored) or by backfill (`None`).
    pub fn note_push(&self, conversation: &ConversationId, seq: u64, sent_at_ms: Option<u64>) {
        let push = NewestPush { seq, sent_at_ms, pushed_at: Instant::now() };
        let mut newest = self.newest_push.lock().unwrap_or_else(|p| p.into_inner());
        match newest.get_mut(conversation) {
            Some(entry) if entry.seq >= seq => {}
            Some(entry) => *entry = push,
            None => _ = newest.insert(conversation.clone(), push),
        }
    }

    /// When an ack through `seq` covers the newest push of `conversation` noted, that
    /// push's `sent_at_ms` (live pushes) and when it was pushed (once: the note is dropped).
    pub fn ack_covers_newest_push(&self, conversation: &ConversationId, seq: u64) -> Option<(Option<u64>, Instant)> {
        let mut newest = self.newest_push.lock().unwrap_or_else(|p| p.into_inner());
        let push = *newest.get(conversation)?;
        (push.seq <= seq).then(|| {
            newest.remove(conversation);
            (push.sent_at_ms, push.pushed_at)
        })
    }

    /// Queues `frame` without waiting; returns whether it was queued.
    pub fn push(&self, frame: Frame) -> bool {
        self.outbox.push(frame)
    }

    /// Queues a frame shared with other connections without waiting; returns whether it
    /// was queued.
    pub fn push_shared(&self, frame: &Arc<SharedFrame>) -> bool {
        self.outbox.push_shared(frame)
    }

    /// Queues `frame`, waiting for room; returns whether it was queued.
    pub async fn push_waiting(&self, frame: Frame) -> bool {
        self.outbox.push_waiting(frame).await
    }

    /// Whether the connection is closing.
    pub fn is_closed(&self) -> bool {
        self.outbox.is_closed()
    }

    /// Whether live pushes may go to this connection (its backfill is done).
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::SeqCst)
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets live pushes through, and returns what was offered before (per conversation, the
    /// lowest seq), which backfill's last pass must read — `None` when more conversations
    /// were offered than could be noted, so that pass must read every conversation.
    pub fn go_live(&self) -> Option<HashMap<ConversationId, u64>> {
        let mut ledger = self.ledger();
        self.live.store(true, Ordering::SeqCst);
        let owed = std::mem::take(&mut ledger.owed);
        (!std::mem::take(&mut ledger.overflowed)).then_some(owed)
    }

    /// Lets live pushes through only if nothing was offered since the last look; otherwise
    /// stays closed to them and returns what was, as [`go_live`](Self::go_live) does, for
    /// backfill to push first (so that no live push overtakes an older message).
    pub fn go_live_if_nothing_owed(&self) -> Option<Option<HashMap<ConversationId, u64>>> {
        let mut ledger = self.ledger();
        if ledger.owed.is_empty() && !ledger.overflowed {
            self.live.store(true, Ordering::SeqCst);
            return None;
        }
        let owed = std::mem::take(&mut ledger.owed);
        Some((!std::mem::take(&mut ledger.overflowed)).then_some(owed))
    }

    /// Records a cumulative ack; returns whether it moved the device's position forward.
    pub fn record_ack(&self, conversation: &ConversationId, seq: u64) -> bool {
        let mut acked = self.acked.lock().unwrap_or_else(|p| p.into_inner());
        let position = acked.entry(conversation.clone()).or_default();
        let moved = seq > *position;
        *position = (*position).max(seq);
        drop(acked);
        self.forget_claims_through(conversation, seq);
        moved
    }

    /// Claims the first push of `seq` of `conversation`: false if backfill or live push
    /// already pushed it, or the device acked it already.
    pub fn claim_push(&self, conversation: &ConversationId, seq: u64) -> bool {
        seq > self.acked_through(conversation) && self.ledger().claim(conversation, seq)
    }

    /// Live fan-out offers `seq` of `conversation` to this device: [`Offered::Push`] names
    /// the connection to push it to, having claimed the push there. Nothing is pushed when
    /// the device has it, or cannot take it now — not live yet, or parked — in which case it
    /// is noted as owed. A connection that another took over passes the offer on: to it
    /// here, or as [`Offered::Forward`] to the node holding it.
    pub fn offer(self: &Arc<Self>, conversation: &ConversationId, seq: u64) -> Offered {
        if seq <= self.acked_through(conversation) {
            return Offered::Held;
        }
        let mut ledger = self.ledger();
        match &ledger.successor {
            Some(Successor::Here(successor)) => {
                let successor = Arc::clone(successor);
                drop(ledger);
                return successor.offer(conversation, seq);
            }
            Some(Successor::Elsewhere(node)) => return Offered::Forward(*node),
            None => {}
        }
        if ledger.parked || !self.is_live() {
            ledger.owe(conversation, seq);
            return Offered::Held;
        }
        if ledger.claim(conversation, seq) { Offered::Push(Arc::clone(self)) } else { Offered::Held }
    }

    /// The connection dropped: keep it for a while. False (nothing to keep) when another
    /// connection of this node took over already, or its backfill never finished — the
    /// device then gets a full backfill when it returns. One whose device went on on another
    /// node is kept to pass on the offers that still reach it here.
    pub fn park(&self) -> bool {
        let mut ledger = self.ledger();
        match ledger.successor {
            Some(Successor::Here(_)) => return false,
            Some(Successor::Elsewhere(_)) => {}
            None if !ledger.backfill_done => return false,
            None => {}
        }
        ledger.parked = true;
        true
    }

    /// This new connection of the same device takes over from `previous` (kicked, or
    /// parked): from now on `previous` passes every offer here. When `previous` knows all
    /// its device may lack, this connection takes its acks and those conversations, and its
    /// backfill reads only them (see [`Session::take_resume`]); returns whether it did.
    pub fn resume_from(self: &Arc<Self>, previous: &Session) -> bool {
        match previous.take_over(Successor::Here(Arc::clone(self))) {
            Some(ledger) => {
                self.resume_with(ledger);
                true
            }
            None => false,
        }
    }

    /// The device connected again on `node`, which takes over from this connection: from
    /// now on every offer here is passed on there ([`Offered::Forward`]). Returns the
    /// ledger for that node's new connection ([`Session::resume_with`]) when this one knows
    /// all its device may lack.
    pub fn hand_over(&self, node: NodeId) -> Option<DeviceLedger> {
        self.take_over(Successor::Elsewhere(node))
    }

    /// Makes `successor` the connection offers go to from now on (once), and returns this
    /// one's ledger if it knows all its device may lack.
    fn take_over(&self, successor: Successor) -> Option<DeviceLedger> {
        let mut old = self.ledger();
        if old.successor.is_some() {
            return None;
        }
        old.successor = Some(successor);
        if !old.backfill_done || old.overflowed {
            return None;
        }
        let acked: BTreeMap<ConversationId, u64> =
            self.acked.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(c, &s)| (c.clone(), s)).collect();
        let mut read_after = BTreeMap::new();
        for (conversation, &(low, high)) in &old.claimed {
            let acked_through = acked.get(conversation).copied().unwrap_or(0);
            if high > acked_through {
                read_after.insert(conversation.clone(), acked_through.max(low.saturating_sub(1)));
            }
        }
        for (conversation, &lowest) in &old.owed {
            read_from(&mut read_after, conversation.clone(), lowest);
        }
        Some(DeviceLedger { acked, read_after })
    }

    /// This new connection resumes from the ledger of the one its device left: it takes its
    /// acks, and its backfill reads only the conversations the device may lack. A second
    /// ledger (the device left connections on two nodes) adds to the first.
    pub fn resume_with(&self, ledger: DeviceLedger) {
        let mut acked = self.acked.lock().unwrap_or_else(|p| p.into_inner());
        for (conversation, seq) in ledger.acked {
            let position = acked.entry(conversation).or_default();
            *position = (*position).max(seq);
        }
        drop(acked);
        let mut own = self.ledger();
        match &mut own.resume {
            Some(positions) => {
                for (conversation, after) in ledger.read_after {
                    read_from(positions, conversation, after.saturating_add(1));
                }
            }
            None => own.resume = Some(ledger.read_after),
        }
    }

    /// This connection's backfill reads every conversation after all: one of the
    /// connections its device left did not know all the device may lack.
    pub fn backfill_in_full(&self) {
        self.ledger().resume = None;
    }

    /// For backfill, once: the conversations to read, each with the seq to read after, when
    /// this connection resumed from its predecessor; `None` means read everything.
    pub fn take_resume(&self) -> Option<BTreeMap<ConversationId, u64>> {
        self.ledger().resume.take()
    }

    /// No backfill for this connection: live pushes go through now, and what the device
    /// lacks it pulls with `sync`.
    pub fn skip_backfill(&self) {
        self.go_live();
        self.end_claims();
    }

    /// Backfill is over: from now on a live push is skipped only if backfill pushed it.
    pub fn end_claims(&self) {
        self.ledger().backfill_done = true;
    }

    /// Once backfill is over, claims up to an acked seq are no longer needed (live fan-out
    /// of those has come, or the device has them); dropping them keeps the set small.
    fn forget_claims_through(&self, conversation: &ConversationId, seq: u64) {
        let mut ledger = self.ledger();
        if !ledger.backfill_done {
            return;
        }
        if let Some(pushed) = ledger.pushed.get_mut(conversation) {
            *pushed = pushed.split_off(&seq.saturating_add(1));
            if pushed.is_empty() {
                ledger.pushed.remove(conversation);
            }
        }
    }

    /// The highest seq of `conversation` this connection acked.
    pub fn acked_through(&self, conversation: &ConversationId) -> u64 {
        self.acked.lock().unwrap_or_else(|p| p.into_inner()).get(conversation).copied().unwrap_or(0)
    }
}

/// Makes a backfill that reads after `positions` read `conversation` from seq `lowest` on
/// (at least: a position already lower stays).
pub fn read_from(positions: &mut BTreeMap<ConversationId, u64>, conversation: ConversationId, lowest: u64) {
    let from = lowest.saturating_sub(1);
    positions.entry(conversation).and_modify(|position| *position = (*position).min(from)).or_insert(from);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An outbox that takes every frame and drops it.
    struct Sink;

    #[async_trait]
    impl Outbox for Sink {
        fn push(&self, _frame: Frame) -> bool {
            true
        }
        async fn push_waiting(&self, _frame: Frame) -> bool {
            true
        }
        fn is_closed(&self) -> bool {
            false
        }
    }

    fn connection() -> Session {
        let user = UserId::parse("bob").expect("user");
        let device = DeviceId::parse("phone").expect("device");
        Session::new(ConnectionId(1), user, device, Arc::new(Sink))
    }

    #[test]
    fn a_session_owing_messages_stays_closed_to_live_pushes_until_they_are_read() {
        let connection = Arc::new(connection());
        let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
        assert!(connection.offer(&dm, 3).into_push().is_none(), "offered during backfill: owed");
        assert!(connection.offer(&dm, 4).into_push().is_none());

        let owed = connection.go_live_if_nothing_owed().expect("something is owed").expect("noted");
        assert_eq!(owed, [(dm.clone(), 3)].into_iter().collect(), "read from the lowest seq owed");
        assert!(!connection.is_live(), "not live while 3 and 4 are still to be pushed from storage");
        assert!(
            connection.offer(&dm, 5).into_push().is_none(),
            "a later message is owed too, not pushed ahead of them"
        );

        let owed = connection.go_live_if_nothing_owed().expect("5 is owed").expect("noted");
        assert_eq!(owed, [(dm.clone(), 5)].into_iter().collect());
        assert!(connection.go_live_if_nothing_owed().is_none(), "nothing new owed: live");
        assert!(connection.is_live());
        assert!(connection.offer(&dm, 6).into_push().is_some(), "pushed live from now on");
    }

    #[test]
    fn a_message_backfill_pushed_is_not_pushed_again_by_a_late_fan_out() {
        let connection = connection();
        let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
        // Backfill reads seq 5 between its commit and its fan-out, and pushes it.
        assert!(connection.claim_push(&dm, 5));
        connection.end_claims();
        // The fan-out of 5 comes after backfill ended: skipped, once.
        assert!(!connection.claim_push(&dm, 5));
        assert!(connection.claim_push(&dm, 6), "a later message goes out");
    }

    #[test]
    fn while_backfilling_the_first_push_wins() {
        let connection = connection();
        let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
        assert!(connection.claim_push(&dm, 3), "live pushes first");
        assert!(!connection.claim_push(&dm, 3), "backfill then skips it");
        connection.end_claims();
        assert!(connection.claim_push(&dm, 4));
    }

    #[test]
    fn an_acked_message_is_never_pushed_by_a_late_fan_out() {
        let connection = connection();
        let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
        assert!(connection.claim_push(&dm, 5));
        connection.end_claims();
        // The device acks 5 (dropping the claim) before the fan-out of 5 arrives.
        connection.record_ack(&dm, 5);
        assert!(!connection.claim_push(&dm, 5));
        assert!(connection.claim_push(&dm, 6));
    }

    fn connection_of(id: u64) -> Arc<Session> {
        Arc::new(Session::new(
            ConnectionId(id),
            UserId::parse("bob").expect("user"),
            DeviceId::parse("phone").expect("device"),
            Arc::new(Sink),
        ))
    }

    /// A connection whose backfill is over and that took live pushes.
    fn settled(id: u64) -> Arc<Session> {
        let connection = connection_of(id);
        connection.go_live();
        connection.end_claims();
        connection
    }

    #[test]
    fn a_parked_connection_notes_offers_and_its_successor_resumes_with_exactly_what_is_owed() {
        let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
        let grp = ConversationId::parse("grp:team").expect("conversation");
        let read = ConversationId::parse("dm:bob:carol").expect("conversation");
        let old = settled(1);
        // Pushed and acked: 3 of read, 4..=5 of dm; pushed and not acked: 6 of dm.
        for (conversation, seq) in [(&read, 3), (&dm, 4), (&dm, 5), (&dm, 6)] {
            assert!(old.offer(conversation, seq).into_push().is_some_and(|to| Arc::ptr_eq(&to, &old)));
        }
        old.record_ack(&read, 3);
        old.record_ack(&dm, 5);
        assert!(old.park());
        assert!(
            old.offer(&grp, 9).into_push().is_none() && old.offer(&grp, 8).into_push().is_none(),
            "parked: noted, not pushed"
        );
        assert!(old.offer(&dm, 7).into_push().is_none());

        let new = connection_of(2);
        assert!(new.resume_from(&old));
        let resume = new.take_resume().expect("resumed");
        let expected: BTreeMap<ConversationId, u64> = [(dm.clone(), 5), (grp.clone(), 7)].into_iter().collect();
        assert_eq!(resume, expected, "from the ack on, and from the lowest seq offered while parked");
        assert_eq!(new.acked_through(&read), 3, "acks carried over");

        // An offer that still reaches the old connection goes to the new one: owed while it
        // is not live, pushed once it is.
        assert!(old.offer(&grp, 10).into_push().is_none());
        assert_eq!(new.go_live().expect("complete").get(&grp), Some(&10));
        new.end_claims();
        assert!(old.offer(&grp, 11).into_push().is_some_and(|to| Arc::ptr_eq(&to, &new)));
        assert!(!new.resume_from(&old) && !connection_of(3).resume_from(&old), "taken over once");
    }

    #[test]
    fn a_connection_handed_over_to_another_node_passes_every_later_offer_there() {
        let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
        let grp = ConversationId::parse("grp:team").expect("conversation");
        let old = settled(1);
        for seq in [4, 5] {
            assert!(old.offer(&dm, seq).into_push().is_some());
        }
        old.record_ack(&dm, 4);
        assert!(old.park());
        assert!(old.offer(&grp, 9).into_push().is_none(), "parked: owed");

        let ledger = old.hand_over(NodeId(2)).expect("complete");
        assert_eq!(ledger.acked, [(dm.clone(), 4)].into_iter().collect(), "its acks");
        assert_eq!(ledger.read_after, [(dm.clone(), 4), (grp.clone(), 8)].into_iter().collect(), "what it may lack");
        assert!(matches!(old.offer(&grp, 10), Offered::Forward(NodeId(2))), "passed on, not owed here");
        assert!(old.offer(&dm, 4).into_push().is_none(), "acked: nothing to pass on");
        assert!(old.hand_over(NodeId(3)).is_none(), "handed over once");
        assert!(matches!(old.offer(&grp, 11), Offered::Forward(NodeId(2))), "to the first taker");

        // An open connection handed over is kept when it closes, to pass offers on.
        let open = settled(3);
        assert!(open.hand_over(NodeId(2)).is_some());
        assert!(open.park());
        assert!(matches!(open.offer(&dm, 6), Offered::Forward(NodeId(2))));
    }

    #[test]
    fn two_ledgers_resumed_from_read_from_the_lower_position_and_keep_the_higher_ack() {
        let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
        let grp = ConversationId::parse("grp:team").expect("conversation");
        let new = connection_of(9);
        new.resume_with(DeviceLedger {
            acked: [(dm.clone(), 4)].into_iter().collect(),
            read_after: [(dm.clone(), 4)].into_iter().collect(),
        });
        new.resume_with(DeviceLedger {
            acked: [(dm.clone(), 2)].into_iter().collect(),
            read_after: [(dm.clone(), 2), (grp.clone(), 7)].into_iter().collect(),
        });
        assert_eq!(new.acked_through(&dm), 4);
        let expected: BTreeMap<ConversationId, u64> = [(dm.clone(), 2), (grp, 7)].into_iter().collect();
        assert_eq!(new.take_resume(), Some(expected));
        new.resume_with(DeviceLedger::default());
        new.backfill_in_full();
        assert_eq!(new.take_resume(), None, "a full backfill after all");
    }

    #[test]
    fn a_connection_whose_backfill_never_finished_is_not_resumed_from() {
        let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
        let old = connection_of(1);
        assert!(!old.park(), "it may not know all its device lacks");
        let new = connection_of(2);
        assert!(!new.resume_from(&old));
        assert!(new.take_resume().is_none(), "a full backfill");
        // Offers still move on to the new connection.
        assert!(old.offer(&dm, 4).into_push().is_none());
        assert_eq!(new.go_live().expect("complete").get(&dm), Some(&4));
    }

    #[test]
    fn too_many_conversations_offered_before_going_live_make_backfill_read_everything() {
        let connection = connection_of(1);
        for n in 0..=MAX_OWED_CONVERSATIONS {
            let conversation = ConversationId::parse(&format!("grp:g{n}")).expect("conversation");
            assert!(connection.offer(&conversation, 1).into_push().is_none(), "not live yet");
        }
        assert!(connection.go_live().is_none(), "the noted set is incomplete");
        connection.end_claims();
        assert!(connection.park(), "once live, it starts afresh");
        assert!(connection_of(2).resume_from(&connection));
    }

    #[test]
    fn too_many_owed_conversations_fall_back_to_a_full_backfill() {
        let old = settled(1);
        assert!(old.park());
        for n in 0..=MAX_OWED_CONVERSATIONS {
            let conversation = ConversationId::parse(&format!("grp:g{n}")).expect("conversation");
            assert!(old.offer(&conversation, 1).into_push().is_none());
        }
        assert!(!connection_of(2).resume_from(&old));
    }
}

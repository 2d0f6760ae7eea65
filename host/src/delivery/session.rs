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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use herald_proto::SharedFrame;
use herald_proto::v1::Frame;

use super::rtt::RttEstimate;
use crate::maps::{HashMap, HashSet};
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

/// The outbox of a session restored after a restart, whose connection is long gone: it
/// takes nothing.
struct Gone;

#[async_trait]
impl Outbox for Gone {
    fn push(&self, _frame: Frame) -> bool {
        false
    }
    async fn push_waiting(&self, _frame: Frame) -> bool {
        false
    }
    fn is_closed(&self) -> bool {
        true
    }
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
    /// Counts the changes to what [`Session::snapshot`] would say, so that an unchanged
    /// ledger is not saved again.
    changes: AtomicU64,
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
    /// Conversations backfill is still catching up on once the connection is live: offers
    /// of these are noted as owed, not pushed, until backfill has read what they owe, so no
    /// live push overtakes an older message still to come from storage.
    held: HashSet<ConversationId>,
    /// Dropped, and waiting for its device to come back (reconnect grace).
    parked: bool,
    /// The connection of the same device that took over; offers go there now.
    successor: Option<Successor>,
    /// Set on a connection that resumed from its predecessor: the conversations its
    /// backfill reads, each with the seq after which the device may lack messages.
    resume: Option<BTreeMap<ConversationId, u64>>,
    /// From a ledger restored after a restart ([`DeviceLedger::since_id`]): the lowest
    /// message id this node may have missed for the device; every conversation changed
    /// from it on is read too.
    since: Option<u64>,
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
            changes: AtomicU64::new(0),
        }
    }

    /// A parked session rebuilt from a ledger saved before this node restarted
    /// ([`Session::snapshot`]): its device's old connection, as if it had dropped just now.
    /// Offers are noted as owed, and a new connection of the device resumes from it as
    /// from any parked session.
    pub fn restored(id: ConnectionId, user: UserId, device: DeviceId, ledger: DeviceLedger) -> Self {
        let session = Self::new(id, user, device, Arc::new(Gone));
        *session.acked.lock().unwrap_or_else(|p| p.into_inner()) = ledger.acked.into_iter().collect();
        let mut own = session.ledger();
        own.backfill_done = true;
        own.parked = true;
        own.since = ledger.since_id;
        for (conversation, after) in ledger.read_after {
            own.owe(&conversation, after.saturating_add(1));
        }
        drop(own);
        session
    }

    /// How many times what [`Session::snapshot`] says may have changed; equal counts mean
    /// an equal snapshot.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Relaxed);
    }

    /// Where the device stands now, for saving: what a connection taking over from this one
    /// would get ([`Session::hand_over`]), without taking over. `None` when this one does
    /// not know all its device may lack (backfill not over, too much owed) or another
    /// connection took over already.
    pub fn snapshot(&self) -> Option<DeviceLedger> {
        let ledger = self.ledger();
        if ledger.successor.is_some() {
            return None;
        }
        self.ledger_of(&ledger)
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
        ledger.held.clear();
        let owed = std::mem::take(&mut ledger.owed);
        (!std::mem::take(&mut ledger.overflowed)).then_some(owed)
    }

    /// Backfill's catch-up step: lets live pushes through in every conversation offered
    /// nothing since the last look, and returns the ones that were (per conversation, the
    /// lowest seq), which stay held — their offers still noted as owed — until backfill has
    /// pushed what they owe from storage and a later look finds nothing new offered. An
    /// empty answer means the connection is live in every conversation. `None` when more
    /// conversations were offered than could be noted: nothing goes live, and backfill must
    /// read every conversation.
    pub fn go_live_except_owed(&self) -> Option<HashMap<ConversationId, u64>> {
        let mut ledger = self.ledger();
        if std::mem::take(&mut ledger.overflowed) {
            ledger.owed.clear();
            return None;
        }
        let owed = std::mem::take(&mut ledger.owed);
        ledger.held = owed.keys().cloned().collect();
        self.live.store(true, Ordering::SeqCst);
        Some(owed)
    }

    /// Records a cumulative ack; returns whether it moved the device's position forward.
    pub fn record_ack(&self, conversation: &ConversationId, seq: u64) -> bool {
        let mut acked = self.acked.lock().unwrap_or_else(|p| p.into_inner());
        let position = acked.entry(conversation.clone()).or_default();
        let moved = seq > *position;
        *position = (*position).max(seq);
        drop(acked);
        if moved {
            self.changed();
        }
        self.forget_claims_through(conversation, seq);
        moved
    }

    /// Claims the first push of `seq` of `conversation`: false if backfill or live push
    /// already pushed it, or the device acked it already.
    pub fn claim_push(&self, conversation: &ConversationId, seq: u64) -> bool {
        let claimed = seq > self.acked_through(conversation) && self.ledger().claim(conversation, seq);
        if claimed {
            self.changed();
        }
        claimed
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
        if ledger.parked || !self.is_live() || ledger.held.contains(conversation) {
            ledger.owe(conversation, seq);
            drop(ledger);
            self.changed();
            return Offered::Held;
        }
        if ledger.claim(conversation, seq) {
            drop(ledger);
            self.changed();
            Offered::Push(Arc::clone(self))
        } else {
            Offered::Held
        }
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
        self.changed();
        self.ledger_of(&old)
    }

    /// What `ledger` (this session's, locked) says the device may lack, if it knows all.
    fn ledger_of(&self, ledger: &Ledger) -> Option<DeviceLedger> {
        if !ledger.backfill_done || ledger.overflowed {
            return None;
        }
        let acked: BTreeMap<ConversationId, u64> =
            self.acked.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(c, &s)| (c.clone(), s)).collect();
        let mut read_after = BTreeMap::new();
        for (conversation, &(low, high)) in &ledger.claimed {
            let acked_through = acked.get(conversation).copied().unwrap_or(0);
            if high > acked_through {
                read_after.insert(conversation.clone(), acked_through.max(low.saturating_sub(1)));
            }
        }
        for (conversation, &lowest) in &ledger.owed {
            read_from(&mut read_after, conversation.clone(), lowest);
        }
        Some(DeviceLedger { acked, read_after, since_id: ledger.since })
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
        own.since = match (own.since, ledger.since_id) {
            (Some(ours), Some(theirs)) => Some(ours.min(theirs)),
            (ours, theirs) => ours.or(theirs),
        };
        match &mut own.resume {
            Some(positions) => {
                for (conversation, after) in ledger.read_after {
                    read_from(positions, conversation, after.saturating_add(1));
                }
            }
            None => own.resume = Some(ledger.read_after),
        }
        drop(own);
        self.changed();
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

    /// For a backfill that resumed from a restored ledger: the lowest message id its node
    /// may have missed; conversations changed from it on are read too. Cleared once read.
    pub fn since(&self) -> Option<u64> {
        self.ledger().since
    }

    /// Backfill read every conversation changed since [`Session::since`]: this connection
    /// now knows all its device may lack without it.
    pub fn clear_since(&self) {
        self.ledger().since = None;
        self.changed();
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
#[path = "session_tests.rs"]
mod tests;

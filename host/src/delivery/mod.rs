//! The downlink: pushing stored messages to devices, acks and retries, backfill on connect,
//! and pull (`sync`, `history`, room catch-up).
//!
//! Push when online, pull when not (ARCHITECTURE.md §3). A pushed message not acked is
//! pushed again after the ack timeout, the wait doubling each time (capped, with jitter), up
//! to `max_attempts`; then it waits for the device to pull. Room messages are pushed once:
//! no retries, but a node that could not be asked at all is asked again (`hops`).
//!
//! Delivery pushes to [`Session`]s through their [`Outbox`](session::Outbox) and reaches
//! devices held by other nodes through the [`NodeBus`]; it never sees a socket.

pub mod backfill;
pub mod cursors;
pub mod filter;
mod hops;
pub mod ledgers;
pub mod pull;
pub mod restored;
mod retries;
pub mod rtt;
pub mod session;
pub mod sessions;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use herald_proto::SharedFrame;
use herald_proto::v1::{self, Frame};
use tokio::sync::Semaphore;

use crate::clock::{SystemClock, WallClock};
use crate::config::DeliveryConfig;
use crate::health::Vitals;
use crate::maps::{HashMap, HashSet};
use crate::membership::Membership;
use crate::model::{ConversationId, ConversationKind, Message, NodeId, UserId};
use crate::routing::bus::{Addressed, NodeBus};
use crate::routing::rooms::{RoomDirectory, Rooms};
use crate::routing::{Route, RouteTable};
use crate::store::{ConversationStore, CursorStore, GroupStore, MessageStore};
use crate::telemetry::{Throttle, registered};

use cursors::CursorBuffer;
use filter::RecipientFilter;
use hops::{Ask, Hop, HopRetries};
use pull::SeqFrontier;
use retries::{Pending, RetryTimers};
use session::{Offered, Session};
use sessions::Sessions;

/// The repositories delivery reads and writes.
pub struct DeliveryStores {
    pub messages: Arc<dyn MessageStore>,
    pub cursors: Arc<dyn CursorStore>,
    pub conversations: Arc<dyn ConversationStore>,
    pub groups: Arc<dyn GroupStore>,
}

/// What delivery reaches devices through: this node's sessions and room subscribers, the
/// route table and room directory for the rest of the cluster, and the bus to other nodes.
pub struct Reach {
    pub this_node: NodeId,
    pub sessions: Arc<Sessions>,
    pub rooms: Arc<Rooms>,
    pub routes: Arc<dyn RouteTable>,
    pub room_directory: Arc<dyn RoomDirectory>,
    pub bus: Arc<dyn NodeBus>,
}

/// The downlink of one node.
pub struct Delivery {
    config: DeliveryConfig,
    reach: Reach,
    membership: Arc<Membership>,
    stores: DeliveryStores,
    /// Asks a conversation's owner what it has not settled yet (for `complete_through_seq`).
    frontier: Arc<dyn SeqFrontier>,
    /// Acked positions waiting to be written.
    cursors: CursorBuffer,
    /// Bounds how many devices are backfilled at once.
    backfill_permits: Semaphore,
    /// Push and redelivery counts, and the tier in force (set from the degrade hook).
    vitals: Arc<Vitals>,
    /// Pushes waiting for their ack timeout.
    retries: RetryTimers,
    /// Deliveries another node could not be asked, waiting to be asked again.
    hops: HopRetries,
    /// Who of a message's recipients must not get it (the `deliver-filter` hook).
    filter: Arc<dyn RecipientFilter>,
    /// What changed while this node was down, for devices whose ledgers it restored.
    changed: restored::ChangedSince,
}

/// The wire form of a stored message.
pub fn wire_message(message: &Message) -> v1::Message {
    v1::Message {
        id: message.id,
        conversation: message.conversation.to_string(),
        seq: message.seq,
        sender: message.sender.to_string(),
        sender_device: message.sender_device.to_string(),
        kind: message.kind,
        body: message.body.clone(),
        sent_at_ms: message.sent_at_ms,
    }
}

fn deliver(message: v1::Message, attempt: u32) -> Frame {
    Frame::new(0, v1::Deliver { message: Some(message), attempt })
}

/// "There is more, pull it": what pull-only delivery sends instead of the message.
fn sync_hint(message: &Message) -> Frame {
    Frame::new(0, v1::SyncHint { conversation: message.conversation.to_string(), latest_seq: message.seq })
}

impl Delivery {
    pub fn new(
        config: DeliveryConfig,
        reach: Reach,
        membership: Arc<Membership>,
        stores: DeliveryStores,
        frontier: Arc<dyn SeqFrontier>,
        vitals: Arc<Vitals>,
        filter: Arc<dyn RecipientFilter>,
    ) -> Self {
        let backfill_permits = Semaphore::new(config.backfill_concurrency);
        let hops = HopRetries::new(Duration::from_millis(config.hop_retry_for_ms), config.hop_retry_max_pending);
        Self {
            config,
            reach,
            membership,
            stores,
            frontier,
            cursors: CursorBuffer::default(),
            backfill_permits,
            vitals,
            retries: RetryTimers::start(),
            hops,
            filter,
            changed: restored::ChangedSince::default(),
        }
    }

    /// Of `users`, those the deliver-filter drops from `message`'s recipients: none without
    /// a filter, and never the sender.
    async fn dropped(&self, message: &Message, users: &[UserId]) -> HashSet<UserId> {
        if !self.filter.active() {
            return HashSet::default();
        }
        let recipients: Vec<UserId> = users.iter().filter(|&user| *user != message.sender).cloned().collect();
        if recipients.is_empty() {
            return HashSet::default();
        }
        let dropped = self.filter.dropped(message, &recipients).await;
        if !dropped.is_empty() {
            metrics::counter!("herald_delivery_filtered_total").increment(dropped.len() as u64);
        }
        dropped
    }

    /// Whether the deliver-filter lets `user` have `message` (backfill and the pull paths).
    async fn visible_to(&self, user: &UserId, message: &Message) -> bool {
        !self.filter.active() || self.dropped(message, std::slice::from_ref(user)).await.is_empty()
    }

    /// `messages` without those the deliver-filter keeps from `user`.
    async fn visible(&self, user: &UserId, messages: Vec<Message>) -> Vec<Message> {
        if !self.filter.active() {
            return messages;
        }
        let mut kept = Vec::with_capacity(messages.len());
        for message in messages {
            if self.visible_to(user, &message).await {
                kept.push(message);
            }
        }
        kept
    }

    /// This node.
    pub fn this_node(&self) -> NodeId {
        self.reach.this_node
    }

    /// The sessions of this node's connections.
    pub fn sessions(&self) -> &Sessions {
        &self.reach.sessions
    }

    /// The bus to the other nodes.
    pub fn bus(&self) -> &dyn NodeBus {
        self.reach.bus.as_ref()
    }

    /// Pushes a just-stored message to every online device that should have it: every
    /// device of every member but the one that sent it (room: every subscriber). In the
    /// pull-only tier they get a `sync_hint` instead, and pull.
    pub async fn fan_out(self: &Arc<Self>, message: Arc<Message>) {
        let mut members: Vec<UserId> = match message.conversation.kind() {
            ConversationKind::Room(_) => return self.publish_room(message).await,
            ConversationKind::Direct(a, b) => vec![a, b],
            ConversationKind::Group(group) => match self.membership.group_members(&group).await {
                Ok(Some(members)) => members.as_ref().clone(),
                Ok(None) => return,
                Err(error) => {
                    // The message is stored; members pull it when they next sync.
                    tracing::warn!(%error, "group members unavailable for fan-out");
                    return;
                }
            },
        };
        let dropped = self.dropped(&message, &members).await;
        if !dropped.is_empty() {
            members.retain(|user| !dropped.contains(user));
        }
        // Every device of every member in one lookup; parked sessions are found even when
        // the route table cannot be read.
        let (routes, mut elsewhere, addressed) = match self.reach.routes.devices_of(&members).await {
            Ok(routes) => {
                // Each user once per node, however many of their devices it holds.
                let mut elsewhere: HashMap<NodeId, BTreeSet<UserId>> = HashMap::default();
                for route in routes.values().flatten().filter(|route| route.node != self.reach.this_node) {
                    elsewhere.entry(route.node).or_default().insert(route.user.clone());
                }
                (routes, elsewhere, Addressed::ByRoute)
            }
            Err(error) => {
                // Where the members' devices are is unknown, not absent: every other node
                // is asked to push to whichever of them it holds. A connected device would
                // otherwise wait for its next sync, which a live connection never makes.
                static ROUTES_DOWN: Throttle = Throttle::new();
                if let Some(suppressed) = ROUTES_DOWN.allow() {
                    tracing::warn!(%error, suppressed, "route table unavailable for fan-out; asking every node");
                }
                metrics::counter!("herald_delivery_unrouted_total").increment(1);
                let everyone: BTreeSet<UserId> = members.iter().cloned().collect();
                let elsewhere = self.reach.bus.peers().into_iter().map(|node| (node, everyone.clone())).collect();
                (HashMap::default(), elsewhere, Addressed::Everywhere)
            }
        };
        let wire = self.wire_for(&message);
        for user in &members {
            for node in self.push_here(&message, wire.as_ref(), user, routes.get(user).map_or(&[], Vec::as_slice)) {
                // An old session of the user's here passes the message on to the node its
                // device went on to, with this fan-out's other hops to that node.
                elsewhere.entry(node).or_default().insert(user.clone());
            }
        }
        let elsewhere = elsewhere.into_iter().map(|(node, users)| (node, users.into_iter().collect()));
        self.deliver_elsewhere(&message, elsewhere, addressed).await;
        registered!(counter, "herald_delivery_fanouts_total").increment(1);
    }

    /// Asks each node to push `message` to its devices of the users named with it, one hop
    /// per node, all at once.
    async fn deliver_elsewhere(
        self: &Arc<Self>,
        message: &Arc<Message>,
        hops: impl Iterator<Item = (NodeId, Vec<UserId>)>,
        addressed: Addressed,
    ) {
        let hops = hops.map(|(node, users)| {
            let message = Arc::clone(message);
            async move {
                let outcome = self.reach.bus.deliver(node, Arc::clone(&message), &users, addressed).await;
                outcome.map_err(|error| (error, Hop { node, message, ask: Ask::Deliver { users, addressed } }))
            }
        });
        for (error, hop) in join_all(hops).await.into_iter().filter_map(Result::err) {
            // Stored, so nothing is lost: a hop that never reached the node is asked again
            // in the background, and past that those devices get it when they next sync
            // or reconnect.
            static NODE_DOWN: Throttle = Throttle::new();
            if let Some(suppressed) = NODE_DOWN.allow() {
                tracing::warn!(%error, suppressed, "a node holding recipients could not be reached");
            }
            self.retry_hop(hop, &error);
        }
    }

    /// Pushes `message` to the devices of `users` connected to this node (another node's
    /// fan-out, arriving over the bus); a user named twice is pushed to once.
    ///
    /// The devices are this node's own sessions of those users: no route lookup. A user
    /// named with no session here at all was sent here by a stale route (from the sender's
    /// cache, or left behind by a failed logout): the routes naming this node for that user
    /// are then looked up and those without a connection removed, in the background —
    /// unless the delivery was sent to every node ([`Addressed::Everywhere`]), which names
    /// users wherever they are.
    ///
    /// An old session here of a device that went on to another node passes the message on
    /// to that node; this returns once it has (or could not), so a conversation's messages
    /// reach the device's new connection in the order they came here.
    pub async fn deliver_here(self: &Arc<Self>, message: &Message, users: &[UserId], addressed: Addressed) {
        let users: BTreeSet<&UserId> = users.iter().collect();
        let wire = self.wire_for(message);
        let mut absent = Vec::new();
        let mut onward: HashMap<NodeId, Vec<UserId>> = HashMap::default();
        for user in users {
            let (here, forward) = self.push_to_sessions(message, wire.as_ref(), user);
            if !here {
                absent.push(user.clone());
            }
            for node in forward {
                onward.entry(node).or_default().push(user.clone());
            }
        }
        if !absent.is_empty() && addressed == Addressed::ByRoute {
            self.forget_stale_routes_of(absent);
        }
        if onward.is_empty() {
            return;
        }
        self.deliver_elsewhere(&Arc::new(message.clone()), onward.into_iter(), Addressed::ByRoute).await;
    }

    /// Removes the routes of `users` that name this node but no connection of it.
    fn forget_stale_routes_of(self: &Arc<Self>, users: Vec<UserId>) {
        let delivery = Arc::clone(self);
        tokio::spawn(async move {
            let Ok(routes) = delivery.reach.routes.devices_of(&users).await else { return };
            for route in routes.into_values().flatten() {
                if route.node == delivery.reach.this_node && delivery.reach.sessions.get(route.connection).is_none() {
                    delivery.forget_stale(route);
                }
            }
        });
    }

    /// Removes a route found stale, if it still names that connection, and drops every
    /// cached copy of its user's routes: a failed delivery ends the window of a stale cache
    /// at once instead of at its TTL. In the background: the delivery goes on.
    fn forget_stale(&self, route: Route) {
        metrics::counter!("herald_route_stale_total").increment(1);
        let routes = Arc::clone(&self.reach.routes);
        tokio::spawn(async move {
            if let Err(error) = routes.forget_stale(&route).await {
                tracing::debug!(%error, "a stale route could not be removed");
            }
        });
    }

    /// The wire form of `message`, built once for all its recipients; `None` in the
    /// pull-only tier, where they get a `sync_hint` instead.
    fn wire_for(&self, message: &Message) -> Option<v1::Message> {
        self.vitals.tier().pushes().then(|| wire_message(message))
    }

    /// Pushes `message` (as `wire`, or a `sync_hint` when pull-only) to `user`'s devices on
    /// this node, and removes the routes naming a connection of this node that is gone.
    ///
    /// The devices are found by user, not by the routes' connection ids: a route read just
    /// before a device reconnected names its old connection, and the message must reach
    /// whichever of its sessions, old (parked, or passing offers to its successor) or new,
    /// is here when it is offered. Returns the nodes an old session passes it on to.
    fn push_here(
        self: &Arc<Self>,
        message: &Message,
        wire: Option<&v1::Message>,
        user: &UserId,
        routes: &[Route],
    ) -> Vec<NodeId> {
        for route in routes.iter().filter(|route| route.node == self.reach.this_node) {
            // A session is in place before its route is written and removed (or parked)
            // only after its route was, so a route of this node without one names a
            // connection that is gone: read from a cache, or left behind by a failed logout.
            if !self.reach.sessions.holds(user, route.connection) {
                self.forget_stale(route.clone());
            }
        }
        self.push_to_sessions(message, wire, user).1
    }

    /// Pushes `message` to `user`'s sessions on this node: the open ones, and the parked
    /// ones, which note it as owed for their return; the sending device is skipped.
    /// Returns whether `user` has any session here, open or parked, and the nodes holding
    /// the new connections that old sessions here pass the message on to.
    fn push_to_sessions(
        self: &Arc<Self>,
        message: &Message,
        wire: Option<&v1::Message>,
        user: &UserId,
    ) -> (bool, Vec<NodeId>) {
        let sessions = self.reach.sessions.here(user);
        let mut forward = Vec::new();
        for session in &sessions {
            if message.is_from(&session.user, &session.device) {
                continue;
            }
            match wire {
                None if session.is_live() => _ = session.push(sync_hint(message)),
                None => {}
                Some(wire) => match session.offer(&message.conversation, message.seq) {
                    Offered::Push(session) => self.push_tracked(&session, &message.conversation, wire.clone(), 1),
                    Offered::Forward(node) if !forward.contains(&node) => forward.push(node),
                    Offered::Forward(_) | Offered::Held => {}
                },
            }
        }
        (!sessions.is_empty(), forward)
    }

    /// A room message: to this node's subscribers, and to the other nodes with subscribers.
    async fn publish_room(self: &Arc<Self>, message: Arc<Message>) {
        self.push_to_room_here(&message).await;
        let nodes = match self.reach.room_directory.nodes(&message.conversation).await {
            Ok(nodes) => nodes.into_iter().filter(|&node| node != self.reach.this_node).collect::<Vec<_>>(),
            Err(error) => {
                // Which nodes have subscribers is unknown: every other node is asked, and
                // one without any has nothing to do.
                static DIRECTORY_DOWN: Throttle = Throttle::new();
                if let Some(suppressed) = DIRECTORY_DOWN.allow() {
                    tracing::warn!(%error, suppressed, "room directory unavailable; publishing to every node");
                }
                self.reach.bus.peers()
            }
        };
        if nodes.is_empty() {
            return;
        }
        let Err(failed) = self.reach.bus.publish_room(&nodes, Arc::clone(&message)).await else { return };
        for error in failed {
            // Stored, so subscribers can catch up; a node that was never asked is asked
            // again in the background, one that may have been is not (rooms push once).
            static NODE_DOWN: Throttle = Throttle::new();
            if let Some(suppressed) = NODE_DOWN.allow() {
                tracing::warn!(%error, suppressed, "a node with room subscribers could not be reached");
            }
            self.retry_hop(Hop { node: error.node(), message: Arc::clone(&message), ask: Ask::Room }, &error);
        }
    }

    /// Pushes a room message to this node's subscribers of its room (no retries: a
    /// subscriber catches up from history). The frame is shared: encoded once per
    /// encoding, however many subscribers take it. With a deliver-filter, this node's
    /// subscribers are one batch of recipients.
    pub async fn push_to_room_here(&self, message: &Message) {
        let frame = self.wire_for(message).map_or_else(|| sync_hint(message), |wire| deliver(wire, 1));
        let frame = Arc::new(SharedFrame::new(frame));
        let subscribers = self.reach.rooms.subscribers(&message.conversation).into_iter().filter_map(|id| {
            self.reach.sessions.get(id).filter(|session| !message.is_from(&session.user, &session.device))
        });
        if !self.filter.active() {
            subscribers.for_each(|session| _ = session.push_shared(&frame));
            return;
        }
        let subscribers: Vec<Arc<Session>> = subscribers.collect();
        let users: Vec<UserId> =
            subscribers.iter().map(|session| session.user.clone()).collect::<BTreeSet<_>>().into_iter().collect();
        let dropped = self.dropped(message, &users).await;
        for session in subscribers.iter().filter(|session| !dropped.contains(&session.user)) {
            session.push_shared(&frame);
        }
    }

    /// Pushes `message` and arranges for it to be pushed again until acked.
    fn push_tracked(
        self: &Arc<Self>,
        session: &Arc<Session>,
        conversation: &ConversationId,
        message: v1::Message,
        attempt: u32,
    ) {
        if session.push(deliver(message.clone(), attempt)) {
            self.vitals.count_push(attempt);
            if attempt == 1 {
                session.note_push(conversation, message.seq, Some(message.sent_at_ms));
            }
            self.schedule_retry(Arc::clone(session), conversation.clone(), message, attempt);
        }
    }

    /// After the backoff for `attempt`, pushes `message` again unless it was acked by
    /// then, the device went away, the attempts are used up, or the tier sheds retries
    /// (the device then syncs). Each first push ends in one of those, counted in
    /// `herald_delivery_settled_total{outcome}` (`acked`, `closed`, `given_up`, `shed`):
    /// the delivery success rate is `acked` over all.
    fn schedule_retry(
        self: &Arc<Self>,
        session: Arc<Session>,
        conversation: ConversationId,
        message: v1::Message,
        attempt: u32,
    ) {
        let config = &self.config;
        let ack_timeout_ms = session.rtt.ack_timeout_ms(config.ack_timeout_ms, config.ack_timeout_max_ms);
        let after = backoff(config, ack_timeout_ms, attempt);
        self.retries.schedule(after, Pending { delivery: Arc::clone(self), session, conversation, message, attempt });
    }

    /// The wait of a push is over (called by the retry timers): pushes it again, or
    /// settles it.
    fn retry_due(self: Arc<Self>, due: Pending) {
        let Pending { session, conversation, message, attempt, .. } = due;
        let outcome = if session.acked_through(&conversation) >= message.seq {
            "acked"
        } else if session.is_closed() {
            "closed"
        } else if attempt >= self.config.max_attempts {
            "given_up"
        } else if !self.vitals.tier().retries() {
            "shed"
        } else {
            self.push_tracked(&session, &conversation, message, attempt + 1);
            return;
        };
        metrics::counter!("herald_delivery_settled_total", "outcome" => outcome).increment(1);
    }

    /// Deliveries another node could not be asked, waiting to be asked again.
    pub fn waiting_hops(&self) -> usize {
        self.hops.waiting()
    }

    /// Pushes waiting for their ack (each holds its message until then).
    pub fn pending_retries(&self) -> usize {
        self.retries.pending()
    }

    /// A connection closed: the pushes waiting for its acks are settled now rather than at
    /// the end of their waits.
    pub fn connection_closed(&self, session: &Session) {
        self.retries.closed(session.id);
    }

    /// A cumulative ack from a device: stops retries up to `seq` and moves its cursor.
    /// An ack that covers the newest live push is a sample of send→deliver-ack latency
    /// (`herald_deliver_ack_seconds`, from the message's `sent_at_ms`).
    pub async fn ack(&self, session: &Session, conversation: &ConversationId, seq: u64) {
        if self.membership.check_read(&session.user, conversation).await.is_err() {
            return; // not theirs: nothing to record
        }
        if session.record_ack(conversation, seq) {
            self.cursors.record(&session.user, &session.device, conversation, seq);
            self.retries.acked(session.id, conversation.clone(), seq);
        }
        let Some((sent_at_ms, pushed_at)) = session.ack_covers_newest_push(conversation, seq) else { return };
        session.rtt.sample(pushed_at.elapsed());
        if let Some(sent_at_ms) = sent_at_ms {
            // Another node's clock may be a little ahead: never a negative latency.
            let millis = SystemClock.now_ms().saturating_sub(sent_at_ms);
            registered!(histogram, "herald_deliver_ack_seconds").record(millis as f64 / 1000.0);
            self.vitals.deliver_acks.record(Duration::from_millis(millis));
        }
    }

    /// Writes coalesced cursors every flush interval, for as long as it is polled.
    pub async fn flush_cursors_periodically(self: Arc<Self>) {
        let mut every = tokio::time::interval(Duration::from_millis(self.config.cursor_flush_ms));
        loop {
            every.tick().await;
            self.flush_cursors().await;
        }
    }

    /// Writes the cursors noted so far.
    pub async fn flush_cursors(&self) {
        self.cursors.flush(self.stores.cursors.as_ref()).await;
    }
}

/// The wait after push number `attempt`: the connection's ack timeout (`ack_timeout_ms`,
/// see [`rtt`]) × 2^(attempt-1), capped at the backoff maximum, plus a random 0..jitter
/// share of itself.
pub fn backoff(config: &DeliveryConfig, ack_timeout_ms: u64, attempt: u32) -> Duration {
    let base = ack_timeout_ms.saturating_mul(1u64 << attempt.saturating_sub(1).min(20));
    let capped = base.min(config.backoff_max_ms.max(ack_timeout_ms));
    let jitter = rand::random::<f64>() * config.jitter;
    Duration::from_millis(capped + (capped as f64 * jitter) as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn backoff_doubles_caps_and_jitters_within_bounds() {
        let config = crate::config::DeliveryConfig {
            ack_timeout_ms: 2000,
            backoff_max_ms: 60_000,
            jitter: 0.3,
            ..Default::default()
        };
        let base = [2000u64, 4000, 8000, 16_000, 32_000, 60_000, 60_000];
        for (attempt, expected) in (1..).zip(base) {
            for _ in 0..50 {
                let wait = super::backoff(&config, config.ack_timeout_ms, attempt).as_millis() as u64;
                assert!((expected..=expected * 13 / 10).contains(&wait), "attempt {attempt}: {wait} ms");
            }
        }
    }
}

#[cfg(test)]
mod backfill_tests;
#[cfg(test)]
mod fan_out_tests;
#[cfg(test)]
mod retry_tests;

//! Room subscriptions: which connections of this node are subscribed to which room now
//! ([`Rooms`]), and which nodes have subscribers of a room ([`RoomDirectory`]).
//!
//! Rooms are broadcast: a room message goes to the connections subscribed at that moment,
//! with no per-device retry; a subscriber catches up from history (`since_seq`). The node
//! owning a room publishes each message to the nodes the directory names; each pushes it to
//! its own subscribers.

use async_trait::async_trait;

use super::RouteError;
use crate::maps::{DashMap, HashSet};
use crate::model::{ConnectionId, ConversationId, NodeId};

/// Which nodes have subscribers of which rooms. Embedded: this process. Cluster: shared by
/// every node.
#[async_trait]
pub trait RoomDirectory: Send + Sync + 'static {
    /// `node` has its first subscriber of `room`.
    async fn joined(&self, room: &ConversationId, node: NodeId) -> Result<(), RouteError>;
    /// `node` has no subscriber of `room` any more.
    async fn left(&self, room: &ConversationId, node: NodeId) -> Result<(), RouteError>;
    /// The nodes with subscribers of `room`.
    async fn nodes(&self, room: &ConversationId) -> Result<Vec<NodeId>, RouteError>;
}

/// The room directory of one process.
#[derive(Default)]
pub struct MemoryRoomDirectory {
    nodes: DashMap<ConversationId, HashSet<NodeId>>,
}

#[async_trait]
impl RoomDirectory for MemoryRoomDirectory {
    async fn joined(&self, room: &ConversationId, node: NodeId) -> Result<(), RouteError> {
        self.nodes.entry(room.clone()).or_default().insert(node);
        Ok(())
    }

    async fn left(&self, room: &ConversationId, node: NodeId) -> Result<(), RouteError> {
        if let Some(mut nodes) = self.nodes.get_mut(room) {
            nodes.remove(&node);
        }
        self.nodes.remove_if(room, |_, nodes| nodes.is_empty());
        Ok(())
    }

    async fn nodes(&self, room: &ConversationId) -> Result<Vec<NodeId>, RouteError> {
        Ok(self.nodes.get(room).map(|nodes| nodes.iter().copied().collect()).unwrap_or_default())
    }
}

/// Subscriptions, both ways: room → connections, and connection → rooms (for clean-up).
#[derive(Default)]
pub struct Rooms {
    subscribers: DashMap<ConversationId, HashSet<ConnectionId>>,
    subscriptions: DashMap<ConnectionId, HashSet<ConversationId>>,
}

impl Rooms {
    /// Rooms with a subscriber here, and connections with a subscription.
    pub fn sizes(&self) -> (usize, usize) {
        (self.subscribers.len(), self.subscriptions.len())
    }

    /// Subscribes `connection` to `room`; returns whether it is the room's first subscriber
    /// on this node.
    pub fn subscribe(&self, room: &ConversationId, connection: ConnectionId) -> bool {
        self.subscribe_at_most(room, connection, usize::MAX).unwrap_or(false)
    }

    /// Subscribes `connection` to `room` unless that would make more than `max` rooms for
    /// it (subscribing again to one of its rooms always passes); returns whether it is the
    /// room's first subscriber on this node, or `None` when refused.
    pub fn subscribe_at_most(&self, room: &ConversationId, connection: ConnectionId, max: usize) -> Option<bool> {
        {
            // The connection's own set first, under its lock: two subscribes of one
            // connection cannot both take its last place.
            let mut rooms = self.subscriptions.entry(connection).or_default();
            if rooms.len() >= max && !rooms.contains(room) {
                return None;
            }
            rooms.insert(room.clone());
        }
        let mut subscribers = self.subscribers.entry(room.clone()).or_default();
        let first = subscribers.is_empty();
        subscribers.insert(connection);
        Some(first)
    }

    /// Unsubscribes `connection` from `room`; returns whether it was subscribed.
    pub fn unsubscribe(&self, room: &ConversationId, connection: ConnectionId) -> bool {
        let removed = self.subscribers.get_mut(room).is_some_and(|mut c| c.remove(&connection));
        self.subscribers.remove_if(room, |_, c| c.is_empty());
        if let Some(mut rooms) = self.subscriptions.get_mut(&connection) {
            rooms.remove(room);
        }
        self.subscriptions.remove_if(&connection, |_, r| r.is_empty());
        removed
    }

    /// Whether `connection` is subscribed to `room`.
    pub fn is_subscribed(&self, room: &ConversationId, connection: ConnectionId) -> bool {
        self.subscribers.get(room).is_some_and(|c| c.contains(&connection))
    }

    /// The connections subscribed to `room` now.
    pub fn subscribers(&self, room: &ConversationId) -> Vec<ConnectionId> {
        self.subscribers.get(room).map(|c| c.iter().copied().collect()).unwrap_or_default()
    }

    /// Every room with a subscriber on this node.
    pub fn rooms(&self) -> Vec<ConversationId> {
        self.subscribers.iter().map(|entry| entry.key().clone()).collect()
    }

    /// Whether `room` has a subscriber on this node.
    pub fn has_subscribers(&self, room: &ConversationId) -> bool {
        self.subscribers.contains_key(room)
    }

    /// Forgets every subscription of a closed connection; returns the rooms it was in.
    pub fn drop_connection(&self, connection: ConnectionId) -> Vec<ConversationId> {
        let Some((_, rooms)) = self.subscriptions.remove(&connection) else { return Vec::new() };
        for room in &rooms {
            if let Some(mut c) = self.subscribers.get_mut(room) {
                c.remove(&connection);
            }
            self.subscribers.remove_if(room, |_, c| c.is_empty());
        }
        rooms.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_are_tracked_both_ways_and_cleaned_up() {
        let rooms = Rooms::default();
        let lobby = ConversationId::parse("room:lobby").expect("valid");
        let arena = ConversationId::parse("room:arena").expect("valid");
        let (one, two) = (ConnectionId(1), ConnectionId(2));
        assert!(rooms.subscribe(&lobby, one), "the first subscriber on this node");
        assert!(!rooms.subscribe(&lobby, two));
        assert!(rooms.subscribe(&arena, one));
        let third = ConversationId::parse("room:third").expect("valid");
        assert_eq!(rooms.subscribe_at_most(&third, one, 2), None, "one is in two rooms already");
        assert_eq!(rooms.subscribe_at_most(&lobby, one, 2), Some(false), "again to its own room: fine");
        assert!(!rooms.is_subscribed(&third, one));
        assert!(rooms.is_subscribed(&lobby, two));
        assert!(rooms.unsubscribe(&lobby, two));
        assert!(!rooms.unsubscribe(&lobby, two));
        let mut left = rooms.drop_connection(one);
        left.sort();
        assert_eq!(left, vec![arena.clone(), lobby.clone()]);
        assert!(!rooms.has_subscribers(&lobby));
        assert!(rooms.subscribers(&lobby).is_empty());
        assert!(rooms.subscribers(&arena).is_empty());
    }
}

//! Room subscriptions on this node: which connections are subscribed to which room now.
//!
//! Rooms are broadcast: a room message goes to the connections subscribed at that moment,
//! with no per-device retry; a subscriber catches up from history (`since_seq`).

use std::collections::HashSet;

use dashmap::DashMap;

use super::ConnectionId;
use crate::model::ConversationId;

/// Subscriptions, both ways: room → connections, and connection → rooms (for clean-up).
#[derive(Default)]
pub struct Rooms {
    subscribers: DashMap<ConversationId, HashSet<ConnectionId>>,
    subscriptions: DashMap<ConnectionId, HashSet<ConversationId>>,
}

impl Rooms {
    /// Subscribes `connection` to `room`.
    pub fn subscribe(&self, room: &ConversationId, connection: ConnectionId) {
        self.subscribers.entry(room.clone()).or_default().insert(connection);
        self.subscriptions.entry(connection).or_default().insert(room.clone());
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

    /// Forgets every subscription of a closed connection.
    pub fn drop_connection(&self, connection: ConnectionId) {
        if let Some((_, rooms)) = self.subscriptions.remove(&connection) {
            for room in rooms {
                if let Some(mut c) = self.subscribers.get_mut(&room) {
                    c.remove(&connection);
                }
                self.subscribers.remove_if(&room, |_, c| c.is_empty());
            }
        }
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
        rooms.subscribe(&lobby, 1);
        rooms.subscribe(&lobby, 2);
        rooms.subscribe(&arena, 1);
        assert!(rooms.is_subscribed(&lobby, 2));
        assert!(rooms.unsubscribe(&lobby, 2));
        assert!(!rooms.unsubscribe(&lobby, 2));
        rooms.drop_connection(1);
        assert!(rooms.subscribers(&lobby).is_empty());
        assert!(rooms.subscribers(&arena).is_empty());
    }
}

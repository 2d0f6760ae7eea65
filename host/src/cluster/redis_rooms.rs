//! The room directory in Redis: which nodes have subscribers of a room, so the room's owner
//! publishes each message once to each of them.
//!
//! `room:{r:<room>}:nodes` is a set of node ids: a node adds itself when its first
//! connection subscribes to the room and removes itself when its last one leaves
//! ([`Rooms::subscribe`](crate::routing::rooms::Rooms::subscribe) says which). A node that
//! dies without leaving stays listed until cleared; publishing to it fails like any
//! unreachable node, which loses nothing (room subscribers catch up from history).
//! Clearing a dead node from every room is left to the session that assembles cluster mode
//! (a per-node set of its rooms, like `route:gw`, would make it one pass).

use async_trait::async_trait;

use super::connection::RedisConnection;
use super::{KeyPrefix, RedisTimeouts};
use crate::model::{ConversationId, NodeId};
use crate::routing::RouteError;
use crate::routing::rooms::RoomDirectory;

/// The cluster room directory: one Redis set per room.
pub struct RedisRoomDirectory {
    /// Shared with the node's other Redis seams.
    redis: RedisConnection,
    /// Names the keys; separates deployments and tests sharing one Redis.
    keys: KeyPrefix,
    /// `nodes` gets `lookup`; joining and leaving get `write`.
    timeouts: RedisTimeouts,
}

impl RedisRoomDirectory {
    /// A room directory on `redis`, under `keys`, each call bounded by `timeouts`.
    pub fn new(redis: RedisConnection, keys: KeyPrefix, timeouts: RedisTimeouts) -> Self {
        Self { redis, keys, timeouts }
    }
}

#[async_trait]
impl RoomDirectory for RedisRoomDirectory {
    async fn joined(&self, room: &ConversationId, node: NodeId) -> Result<(), RouteError> {
        let mut join = redis::cmd("SADD");
        join.arg(self.keys.room_nodes(room)).arg(node.0);
        Ok(self.redis.query("room join", self.timeouts.write, &join).await?)
    }

    async fn left(&self, room: &ConversationId, node: NodeId) -> Result<(), RouteError> {
        let mut leave = redis::cmd("SREM");
        leave.arg(self.keys.room_nodes(room)).arg(node.0);
        Ok(self.redis.query("room leave", self.timeouts.write, &leave).await?)
    }

    async fn nodes(&self, room: &ConversationId) -> Result<Vec<NodeId>, RouteError> {
        let mut members = redis::cmd("SMEMBERS");
        members.arg(self.keys.room_nodes(room));
        let nodes: Vec<u32> = self.redis.query("room nodes lookup", self.timeouts.lookup, &members).await?;
        Ok(nodes.into_iter().map(NodeId).collect())
    }
}

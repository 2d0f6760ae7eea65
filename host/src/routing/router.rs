//! Step 2 of a command (ARCHITECTURE.md §2): its routing key, and the node owning that key on
//! the ring in force.
//!
//! The key comes from the `route-key` hook when a plugin provides one; the built-in key is
//! the conversation for sends and the user otherwise.

use std::sync::Arc;

use super::topology::Topology;
use crate::model::{ConversationId, NodeId, UserId};
use crate::plugins::types::{CommandKind, RouteRequest};
use crate::plugins::{Hook, PluginHost};

/// Where a command goes: its routing key and the node owning it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Routed {
    pub key: String,
    /// `None` only for an empty ring.
    pub owner: Option<NodeId>,
}

/// Picks routing keys and their owners.
pub struct Router {
    plugins: Arc<PluginHost>,
    topology: Arc<dyn Topology>,
    this_node: NodeId,
}

impl Router {
    pub fn new(plugins: Arc<PluginHost>, topology: Arc<dyn Topology>, this_node: NodeId) -> Self {
        Self { plugins, topology, this_node }
    }

    /// This node.
    pub fn this_node(&self) -> NodeId {
        self.this_node
    }

    /// The cluster membership this router reads.
    pub fn topology(&self) -> &dyn Topology {
        self.topology.as_ref()
    }

    /// Where `command` of `user` on `conversation` goes.
    pub async fn route(&self, command: CommandKind, user: &UserId, conversation: Option<&ConversationId>) -> Routed {
        let request =
            RouteRequest { command, user: user.to_string(), conversation: conversation.map(ToString::to_string) };
        let key = self.plugins.route_key(&request).await;
        let owner = self.topology.view().owner(&key);
        Routed { key, owner }
    }

    /// The node owning a send of `user` to `conversation` (the hook is asked only when a
    /// plugin provides it: the built-in key is the conversation).
    pub async fn send_owner(&self, user: &UserId, conversation: &ConversationId) -> Option<NodeId> {
        if self.plugins.has_hook(Hook::RouteKey) {
            self.route(CommandKind::Send, user, Some(conversation)).await.owner
        } else {
            self.topology.view().owner(conversation.as_str())
        }
    }
}

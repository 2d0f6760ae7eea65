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

/// The owner of a send, as one view of the ring decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOwner {
    /// This node processes the send: the ring of `epoch` names it (or is empty). `node` and
    /// `epoch` are what this node claims the conversation's seqs with, taken from the very
    /// view that made the decision, so a claim never names an epoch whose ring gave the
    /// conversation to another node.
    Here { node: NodeId, epoch: u64 },
    /// Another node owns it: the send goes there.
    Elsewhere(NodeId),
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
        let key = self.key(command, user, conversation).await;
        let owner = self.topology.view().owner(&key);
        Routed { key, owner }
    }

    /// The routing key of `command`: the route-key hook's, or the built-in one.
    async fn key(&self, command: CommandKind, user: &UserId, conversation: Option<&ConversationId>) -> String {
        let request =
            RouteRequest { command, user: user.to_string(), conversation: conversation.map(ToString::to_string) };
        // Boxed: a hook call is a deep future (1.6 KB), and inline it would size every
        // send's future for it, plugin or not (`pipeline::Pipeline::apply_policy` says more).
        Box::pin(self.plugins.route_key(&request)).await
    }

    /// Where `user`'s connections are meant to land: the key is the user, the owner its home
    /// node (`None` without `cluster.placement`: any node serves it as well as another).
    pub fn home(&self, user: &UserId) -> Routed {
        Routed { key: user.to_string(), owner: self.topology.view().home(user.as_str()) }
    }

    /// Who owns a send of `user` to `conversation` (the hook is asked only when a plugin
    /// provides it: the built-in key is the conversation), with the epoch of the view that
    /// decided it when it is this node.
    pub async fn send_owner(&self, user: &UserId, conversation: &ConversationId) -> SendOwner {
        let key = if self.plugins.has_hook(Hook::RouteKey) {
            Some(self.key(CommandKind::Send, user, Some(conversation)).await)
        } else {
            None
        };
        let view = self.topology.view();
        match view.owner(key.as_deref().unwrap_or(conversation.as_str())) {
            Some(owner) if owner != self.this_node => SendOwner::Elsewhere(owner),
            _ => SendOwner::Here { node: self.this_node, epoch: view.epoch },
        }
    }

    /// Whether this node may act as an owner at all right now: take seqs and commit for
    /// the conversations the ring gives it. False once its cluster lease may have lapsed
    /// (see [`Topology::holds_lease`]); always true in embedded mode.
    pub fn may_act_as_owner(&self) -> bool {
        self.topology.holds_lease()
    }
}

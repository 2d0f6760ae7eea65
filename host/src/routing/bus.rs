//! Node-to-node traffic: what one node asks of another.
//!
//! A send is processed on the node owning its conversation, a message is pushed by the node
//! holding its device's connection, and a room message reaches every node with subscribers.
//! The pipeline and delivery ask the [`NodeBus`] for each of these and never learn how it is
//! carried. Embedded mode is a cluster of one: [`LocalBus`] has no other node to reach, so a
//! call naming another node fails with [`BusError::Unreachable`] (in embedded mode the ring
//! and the route table never name one).

use std::sync::Arc;

use async_trait::async_trait;
use herald_proto::v1;

use super::Route;
use crate::model::{ConnectionId, ConversationId, DeviceId, DeviceLedger, GroupId, Message, NodeId, UserId};

/// Where a send came from, and so where its ack must go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub user: UserId,
    pub device: DeviceId,
    /// The node holding the sender's connection.
    pub node: NodeId,
    pub connection: ConnectionId,
}

/// A `send` frame with who sent it: the pipeline's input, on whichever node owns it.
#[derive(Debug, Clone)]
pub struct SendRequest {
    pub origin: Origin,
    /// The frame's request id, echoed on the ack.
    pub rid: u32,
    pub send: v1::Send,
    /// An archived announcement another node took over HTTP and its announce-policy hook
    /// accepted, forwarded to the room's owner to be stored. The owner stores it as one
    /// posted to it: the message-policy hook, which judges clients' sends, is not asked, so
    /// no chat limit counts it. Never set for a client's send.
    pub announcement: bool,
}

/// Told once a forwarded send is on its way to its owner (handed to the link, in order with
/// the sends handed over before it) or never will be: the sender's connection may then hand
/// over its next send. Dropping it tells the same.
pub type Queued = tokio::sync::oneshot::Sender<()>;

/// The answer to a [`SendRequest`], addressed to its origin.
#[derive(Debug, Clone)]
pub struct SendAck {
    pub to: Origin,
    pub rid: u32,
    pub ack: v1::SendAck,
}

/// Another node could not be asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BusError {
    #[error("node {0} is not reachable from here")]
    Unreachable(NodeId),
    /// The node was not asked: its breaker is open, a link to it could not be opened, or
    /// it refused the request.
    #[error("node {node} did not answer: {cause}")]
    Failed {
        node: NodeId,
        #[source]
        cause: Cause,
    },
    /// The request went out but its link broke before the answer came: the node may have
    /// carried it out.
    #[error("the link to node {node} broke before it answered: {cause}")]
    Broken {
        node: NodeId,
        #[source]
        cause: Cause,
    },
    /// The request went out but its answer did not come within the deadline: the node may
    /// well have carried it out, late (overloaded, paused).
    #[error("node {node} did not answer in time: {cause}")]
    Late {
        node: NodeId,
        #[source]
        cause: Cause,
    },
}

/// Why a [`BusError`] happened: the socket's or TLS's own error where there is one, else a
/// message. Shared: a link that fails fails every request waiting on it with the same one.
/// As elsewhere on the I/O seams, the error's message repeats it, so `%error` says all.
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// A [`Cause`] from an error, or a message where there is none.
pub fn cause(what: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Cause {
    Arc::from(what.into())
}

/// Two failures are the same when they are of the same kind, for the same node, and say
/// the same of their cause (a cause is an error, which has no equality of its own).
impl PartialEq for BusError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Unreachable(a), Self::Unreachable(b)) => a == b,
            (Self::Failed { node: a, cause: x }, Self::Failed { node: b, cause: y })
            | (Self::Broken { node: a, cause: x }, Self::Broken { node: b, cause: y })
            | (Self::Late { node: a, cause: x }, Self::Late { node: b, cause: y }) => {
                a == b && x.to_string() == y.to_string()
            }
            _ => false,
        }
    }
}

impl Eq for BusError {}

impl BusError {
    /// Whether the node may have carried the request out: it went out, and either its link
    /// broke or its answer was late. Every other failure means it was never asked.
    pub fn may_have_landed(&self) -> bool {
        matches!(self, Self::Broken { .. } | Self::Late { .. })
    }

    /// The node that could not be asked.
    pub fn node(&self) -> NodeId {
        match self {
            Self::Unreachable(node)
            | Self::Failed { node, .. }
            | Self::Broken { node, .. }
            | Self::Late { node, .. } => *node,
        }
    }
}

/// `Ok` when no node failed, else every node's error: what a call to several nodes at once
/// ([`NodeBus::publish_room`]) answers.
///
/// # Errors
/// `failed`, when it holds any.
pub fn each_asked(failed: Vec<BusError>) -> Result<(), Vec<BusError>> {
    if failed.is_empty() { Ok(()) } else { Err(failed) }
}

/// Why a node is asked to push a message to some of its devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressed {
    /// The route table names a device of each user there. A user with no session there
    /// was named by a stale route, which the node then removes.
    ByRoute,
    /// Every node is asked, since the route table could not be read (a lookup past its
    /// deadline, Redis cut off): each pushes to whichever of the users' devices it holds,
    /// and a user it holds none of says nothing about its routes.
    Everywhere,
}

/// What a node asks of the others.
#[async_trait]
pub trait NodeBus: Send + Sync + 'static {
    /// Has `owner` process `request`; returns its ack. `queued` is told once the request is
    /// on its way (or cannot be): a connection's sends reach their owner in the order they
    /// were handed over, when each is handed over only after the one before was queued.
    async fn forward_send(&self, owner: NodeId, request: SendRequest, queued: Queued) -> Result<SendAck, BusError>;
    /// Has `node` push `message` to the devices of `users` connected there.
    async fn deliver(
        &self,
        node: NodeId,
        message: Arc<Message>,
        users: &[UserId],
        addressed: Addressed,
    ) -> Result<(), BusError>;
    /// Has each of `nodes` push a room message to its subscribers of the room, all at
    /// once.
    ///
    /// # Errors
    /// One error for each node that could not be asked.
    async fn publish_room(&self, nodes: &[NodeId], message: Arc<Message>) -> Result<(), Vec<BusError>>;
    /// Has the node holding `route` close that connection (its device connected again, on
    /// this node) and hand over what it knows of the device: its ledger, when that is
    /// complete, for the new connection to resume from; from then on it passes the messages
    /// still offered to the old connection on to this node.
    async fn take_over(&self, route: &Route) -> Result<Option<DeviceLedger>, BusError>;
    /// Asks `owner` for the lowest seq of `conversation` it has taken and not yet settled.
    async fn lowest_in_flight(&self, owner: NodeId, conversation: &ConversationId) -> Result<Option<u64>, BusError>;
    /// Tells every other node that `group`'s members changed, so it drops what it cached;
    /// returns once each node it could reach has (best effort: a node out of reach lets
    /// its cached list expire).
    async fn group_changed(&self, group: &GroupId);
    /// Every other live node, as this node last saw the cluster: whom to ask when the route
    /// table or the room directory cannot say.
    fn peers(&self) -> Vec<NodeId>;
}

/// Embedded mode's bus: a cluster of one node, with no other to reach.
#[derive(Debug, Default)]
pub struct LocalBus;

#[async_trait]
impl NodeBus for LocalBus {
    async fn forward_send(&self, owner: NodeId, _request: SendRequest, _queued: Queued) -> Result<SendAck, BusError> {
        Err(BusError::Unreachable(owner))
    }

    async fn deliver(
        &self,
        node: NodeId,
        _message: Arc<Message>,
        _users: &[UserId],
        _addressed: Addressed,
    ) -> Result<(), BusError> {
        Err(BusError::Unreachable(node))
    }

    async fn publish_room(&self, nodes: &[NodeId], _message: Arc<Message>) -> Result<(), Vec<BusError>> {
        each_asked(nodes.iter().map(|&node| BusError::Unreachable(node)).collect())
    }

    async fn take_over(&self, route: &Route) -> Result<Option<DeviceLedger>, BusError> {
        Err(BusError::Unreachable(route.node))
    }

    async fn lowest_in_flight(&self, owner: NodeId, _conversation: &ConversationId) -> Result<Option<u64>, BusError> {
        Err(BusError::Unreachable(owner))
    }

    async fn group_changed(&self, _group: &GroupId) {}

    fn peers(&self) -> Vec<NodeId> {
        Vec::new()
    }
}

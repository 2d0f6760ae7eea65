//! Node-to-node links: cluster mode's [`NodeBus`](crate::routing::bus::NodeBus).
//!
//! A send is processed on the node owning its conversation, a message is pushed by the node
//! holding its device's connection, a room message reaches every node with subscribers.
//! [`PeerBus`] carries these requests to other nodes; [`PeerServer`] accepts them and hands
//! each to a [`PeerHandler`], which `node.rs` implements over the pipeline, delivery and the
//! gateway. The pipeline and delivery see only the `NodeBus` trait.
//!
//! # The link
//!
//! One TCP connection per (caller, called) pair, opened by the caller on first use and
//! reopened after a failure, with backoff. It is multiplexed: every request carries a `u64`
//! id and its response the same id, so many requests are in flight at once and a slow one
//! (a send waiting for its commit) never holds up a fast one (a delivery) — the called node
//! runs each request in a task of its own. Links are one-way: node A's requests to B travel
//! on A's link to B; B's requests to A on B's link to A.
//!
//! Frames are a 4-byte big-endian length and one protobuf `herald.peer.v1.PeerFrame`
//! (`proto/herald/v1/peer.proto`), which embeds the client protocol's `Send`, `SendAck` and
//! `Message` unchanged. A frame over [`MAX_FRAME_BYTES`] (over [`MAX_HANDSHAKE_FRAME_BYTES`]
//! before the handshake ends), a frame that does not decode or one that does not belong at
//! that point closes the link; a request that decodes but names an invalid id or an unknown
//! kind, a send whose origin is not the calling node, or a kick of a route on another node
//! is answered with a failure and the link stays open. Nothing a peer sends can panic a
//! node.
//!
//! # Handshake
//!
//! The called node sends a challenge (its protocol version, its node id, a random nonce);
//! the caller answers with its version, its node id, a nonce of its own and
//! `HMAC-SHA256(cluster.secret, "herald-peer client" ‖ nonce ‖ node id)`; the called node
//! checks it in constant time and answers with its own proof over the caller's nonce, or
//! refuses and closes. The secret never crosses the wire, both sides prove they know it, and
//! a caller that reaches a node other than the one it meant (a stale address) learns so
//! before sending anything. A caller that has not finished its hello within
//! [`PeerTimeouts::hello`] is dropped.
//!
//! The proof covers the opening only: frames after it are neither authenticated nor
//! encrypted by the link itself. That is why a link leaving loopback runs inside TLS
//! (`[tls]`, [`PeerBus::with_tls`], [`PeerServer::with_tls`]), unless the operator declares
//! the network private (`cluster.plaintext_peers`); the configuration refuses anything else
//! at start ([`ClusterConfig::check_links`](crate::config::ClusterConfig::check_links)).
//!
//! # Failures
//!
//! Every call has a deadline ([`PeerTimeouts`]); past it, or when the link breaks, or when
//! the peer cannot be reached, the call fails at once with a [`BusError`] that says whether
//! the request went out (`Late`: past its deadline; `Broken`: its link broke before the
//! answer) or never did (`Failed`), and the caller falls back as the bus contract says (a
//! forwarded send answers `RETRY`; a delivery, or a room message that never went out, is
//! asked again with backoff for a while, `delivery/hops.rs`, then pulled by its device).
//! A link that broke is reopened on the next call; a peer that could not be reached is
//! tried again only after a backoff (doubling from
//! [`PeerTimeouts::reconnect_min`] to [`PeerTimeouts::reconnect_max`]), and calls meanwhile
//! fail without waiting. A peer whose link opens but whose calls keep failing or timing out
//! (paused, overloaded, cut off mid-stream) is caught by its circuit breaker
//! ([`crate::breaker`], named `peer:<node>`): `cluster.breaker_failures` such calls in a row
//! over at least `cluster.breaker_span_ms` open it, calls then fail at once for `cluster.breaker_open_ms`, and the probe after that
//! goes over a fresh link. A refusal the peer answered with counts as an answer.
//!
//! Counters: `herald_cluster_peer_requests_total{kind, outcome}` for every call
//! (`outcome`: `ok`, `failed`, `timeout`, `unreachable`, `refused` by the breaker) and
//! `herald_cluster_peer_refused_total{reason}` for links this node refused.
//!
//! [`BusError`]: crate::routing::bus::BusError

mod client;
mod frame;
mod handshake;
mod link;
mod server;
mod wire;

pub(crate) use wire::{decode_saved_ledger, encode_saved_ledger};

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::model::{ConversationId, DeviceLedger, GroupId, Message, NodeId, UserId};
use crate::pipeline::Admission;
use crate::routing::Route;
use crate::routing::bus::{Addressed, SendRequest};

/// The read side of an open link: a TCP socket's, or a TLS session's (`[tls]`).
type ReadHalf = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
/// The write side of an open link.
type WriteHalf = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// Splits a link's stream into halves its reader and writer tasks own.
fn split<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static>(stream: S) -> (ReadHalf, WriteHalf) {
    let (read, write) = tokio::io::split(stream);
    (Box::new(read), Box::new(write))
}

pub use client::PeerBus;
pub use frame::{MAX_FRAME_BYTES, MAX_HANDSHAKE_FRAME_BYTES};
pub use server::PeerServer;

/// The link protocol this build speaks; both ends of a link must speak the same one.
pub const PROTOCOL_VERSION: u32 = 1;

/// Where each node accepts links: its advertised `cluster.advertise` address.
///
/// Implemented by cluster membership (node leases in Redis); tests use a map.
pub trait PeerAddresses: Send + Sync + 'static {
    /// The address `node` accepts links on, or `None` when no live node has that id.
    fn address_of(&self, node: NodeId) -> Option<SocketAddr>;
    /// Every live node (this one included).
    fn nodes(&self) -> Vec<NodeId>;
}

/// What a node does for the others: the called side of every [`NodeBus`] method.
///
/// [`PeerServer`] runs each request in a task of its own, so an implementation may take as
/// long as the work takes; the caller's deadline, not this trait, bounds how long it waits.
///
/// [`NodeBus`]: crate::routing::bus::NodeBus
#[async_trait]
pub trait PeerHandler: Send + Sync + 'static {
    /// Admits a send this node owns, forwarded by the node holding the sender's connection:
    /// the in-order part ([`Pipeline::admit`](crate::pipeline::Pipeline::admit)). The
    /// server admits one connection's sends one at a time, in the order they arrived, runs
    /// the rest of each on its own, writes its ack back, then runs its fan-out in a task of
    /// its own — always, even when the link broke meanwhile, since later messages wait for
    /// it.
    async fn admit_send(&self, request: SendRequest) -> Admission;
    /// Pushes `message` to the devices of `users` connected to this node, named by the
    /// caller's route lookup or sent to every node (`addressed`).
    async fn deliver(&self, message: Message, users: Vec<UserId>, addressed: Addressed);
    /// Pushes a room message to this node's subscribers of its room.
    async fn publish_room(&self, message: Message);
    /// Closes the connection of `route`, held by this node (its device connected again).
    /// With `hand_over`, the node holding the device's new connection: returns the old
    /// connection's ledger when it is complete, and passes the messages still offered to
    /// the old connection on to that node from now on.
    async fn kick(&self, route: Route, hand_over: Option<NodeId>) -> Option<DeviceLedger>;
    /// The lowest seq of `conversation` this node has taken and not yet settled.
    async fn lowest_in_flight(&self, conversation: ConversationId) -> Option<u64>;
    /// `users`' routes changed on the calling node: forget what is cached of them.
    async fn routes_changed(&self, users: Vec<UserId>);
    /// `group`'s members changed on the calling node: forget what is cached of them.
    async fn group_changed(&self, group: GroupId);
}

/// `cluster.secret`: what every node of a cluster shares, and proves it knows when it opens
/// a link. Never printed, never sent.
#[derive(Clone)]
pub struct PeerSecret(Arc<[u8]>);

/// A `cluster.secret` that cannot authenticate anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cluster.secret is empty; set the same non-empty secret on every node")]
pub struct EmptySecret;

impl PeerSecret {
    /// Wraps the configured secret.
    ///
    /// # Errors
    /// [`EmptySecret`] when `secret` is empty.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, EmptySecret> {
        let secret = secret.as_ref();
        if secret.is_empty() { Err(EmptySecret) } else { Ok(Self(secret.into())) }
    }

    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for PeerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PeerSecret(***)")
    }
}

/// How long each part of a link may take. One value serves both [`PeerBus`] and
/// [`PeerServer`], built once from the settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTimeouts {
    /// A forwarded send: its owner admits, stores and commits it before answering, so this
    /// is the longest. Past it the sender hears `RETRY`.
    pub forward_send: Duration,
    /// Every other request (deliver, room publish, kick, lowest in flight): the called node
    /// answers as soon as it has handed the work on.
    pub request: Duration,
    /// Opening a link: TCP connect and handshake, as the caller sees them (also bounded by
    /// the deadline of the call that opens it).
    pub connect: Duration,
    /// How long the called node waits for a new link's hello before dropping it.
    pub hello: Duration,
    /// Wait before the first retry of a peer that could not be reached; doubles with each
    /// failure in a row.
    pub reconnect_min: Duration,
    /// The longest wait between retries of a peer that could not be reached.
    pub reconnect_max: Duration,
}

impl Default for PeerTimeouts {
    fn default() -> Self {
        Self {
            forward_send: Duration::from_secs(2),
            request: Duration::from_millis(500),
            connect: Duration::from_secs(1),
            hello: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
        }
    }
}

/// The kinds of request, as named in metrics and errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ForwardSend,
    Deliver,
    PublishRoom,
    Kick,
    LowestInFlight,
    RoutesChanged,
    GroupChanged,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::ForwardSend => "forward_send",
            Self::Deliver => "deliver",
            Self::PublishRoom => "publish_room",
            Self::Kick => "kick",
            Self::LowestInFlight => "lowest_in_flight",
            Self::RoutesChanged => "routes_changed",
            Self::GroupChanged => "group_changed",
        }
    }
}

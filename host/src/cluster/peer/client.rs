//! [`PeerBus`]: the calling side of the node-to-node links, cluster mode's
//! [`NodeBus`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use futures_util::future::join_all;
use herald_proto::peer::v1::request::Kind as WireKind;
use herald_proto::peer::v1::response::Outcome;
use herald_proto::peer::v1::{Failure, InFlight};
use tokio::time::Instant;

use super::link::{CallError, Link};
use super::{Kind, PeerAddresses, PeerSecret, PeerTimeouts, wire};
use crate::breaker::{Breaker, BreakerConfig, BreakerState, BreakerStatus};
use crate::model::{ConversationId, DeviceLedger, GroupId, Message, NodeId, UserId};
use crate::routing::Route;
use crate::routing::bus::{Addressed, BusError, Cause, NodeBus, Queued, SendAck, SendRequest, cause, each_asked};
use crate::routing::cache::RouteChanges;
use crate::tls::Tls;

/// Cluster mode's [`NodeBus`]: one multiplexed link per peer, opened on first use.
///
/// Use it rather than [`LocalBus`](crate::routing::bus::LocalBus) whenever the ring can
/// name another node. Every call ends within its deadline ([`PeerTimeouts`]); a peer that
/// cannot be reached fails calls at once until its backoff has passed, and a peer whose
/// link is open but which keeps failing or not answering (paused, overloaded) does too, for
/// as long as its [`Breaker`] is open.
pub struct PeerBus {
    /// This node, as it introduces itself.
    local: NodeId,
    /// Proves this node to its peers.
    secret: PeerSecret,
    /// Where each peer is; asked on every call, so a node that moved is found.
    addresses: Arc<dyn PeerAddresses>,
    timeouts: PeerTimeouts,
    /// The setting of each peer's breaker.
    breaker: BreakerConfig,
    /// Every peer called so far, with its link.
    peers: Mutex<HashMap<NodeId, Arc<Peer>>>,
    /// Links are TLS when set (`[tls]`).
    tls: Option<Tls>,
}

/// One peer as this node calls it.
struct Peer {
    /// The open link, read without locking on every call.
    link: ArcSwapOption<Link>,
    /// Opened by calls failing or timing out in a row; while open, calls fail at once.
    breaker: Breaker,
    /// Held while a link is opened, so concurrent callers wait for one attempt rather than
    /// each making their own; holds the backoff after failed attempts.
    opening: tokio::sync::Mutex<Backoff>,
}

/// Failed attempts to open a link to one peer, in a row.
#[derive(Default)]
struct Backoff {
    failures: u32,
    /// The address that failed; another address is tried at once.
    address: Option<SocketAddr>,
    /// No attempt before this.
    retry_at: Option<Instant>,
    /// Why the last attempt failed, repeated to the calls refused meanwhile.
    last_error: Option<Cause>,
}

/// A call refused while the backoff after failed attempts to open a link runs.
#[derive(Debug, thiserror::Error)]
#[error("{last}; next attempt in {wait:?}")]
struct HeldOff {
    #[source]
    last: Cause,
    wait: Duration,
}

impl PeerBus {
    /// A bus for node `local`, proving itself with `secret`, finding peers through
    /// `addresses`. Opens nothing until the first call.
    pub fn new(local: NodeId, secret: PeerSecret, addresses: Arc<dyn PeerAddresses>, timeouts: PeerTimeouts) -> Self {
        Self {
            local,
            secret,
            addresses,
            timeouts,
            breaker: BreakerConfig::default(),
            peers: Mutex::new(HashMap::new()),
            tls: None,
        }
    }

    /// This bus opening its links over TLS with `tls` (`None`: plain TCP).
    #[must_use]
    pub fn with_tls(mut self, tls: Option<Tls>) -> Self {
        self.tls = tls;
        self
    }

    /// This bus with each peer's breaker set to `config` (default: [`BreakerConfig::default`]).
    #[must_use]
    pub fn with_breakers(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// The breaker of each peer called so far (`/admin/cluster`).
    pub fn breakers(&self) -> Vec<BreakerStatus> {
        let peers = self.peers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut statuses: Vec<BreakerStatus> = peers.values().map(|peer| peer.breaker.status()).collect();
        statuses.sort_by(|a, b| a.name.cmp(&b.name));
        statuses
    }

    fn peer(&self, node: NodeId) -> Arc<Peer> {
        let mut peers = self.peers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let peer = peers.entry(node).or_insert_with(|| {
            Arc::new(Peer {
                link: ArcSwapOption::empty(),
                breaker: Breaker::new(format!("peer:{node}"), self.breaker),
                opening: tokio::sync::Mutex::default(),
            })
        });
        Arc::clone(peer)
    }

    /// The open link to `node`, opening one if there is none (or it closed, or the node
    /// moved) and the backoff allows.
    async fn link(&self, node: NodeId, peer: &Peer) -> Result<Arc<Link>, BusError> {
        let address = self.addresses.address_of(node).ok_or(BusError::Unreachable(node))?;
        let usable =
            |link: &Option<Arc<Link>>| link.as_ref().filter(|l| l.is_open() && l.address() == address).cloned();
        if let Some(link) = usable(&peer.link.load_full()) {
            return Ok(link);
        }
        let mut backoff = peer.opening.lock().await;
        // Another caller may have opened it while this one waited.
        if let Some(link) = usable(&peer.link.load_full()) {
            return Ok(link);
        }
        let now = Instant::now();
        if backoff.address == Some(address)
            && let Some(retry_at) = backoff.retry_at.filter(|&at| at > now)
        {
            let last = backoff.last_error.clone().unwrap_or_else(|| cause("opening a link failed"));
            return Err(BusError::Failed { node, cause: cause(HeldOff { last, wait: retry_at - now }) });
        }
        peer.link.store(None);
        // Counted as failed until it succeeds: an attempt cut short by this call's deadline
        // (a peer that drops packets) then holds the next callers off like any failure,
        // instead of each of them spending its whole deadline on a new attempt.
        let previous = backoff.failures > 0;
        backoff.failures = backoff.failures.saturating_add(1);
        backoff.address = Some(address);
        backoff.retry_at = Some(now + self.reconnect_delay(backoff.failures));
        backoff.last_error = Some(cause(format!("opening a link to node {node} at {address} did not finish in time")));
        match Link::open(node, address, self.local, &self.secret, self.tls.as_ref(), self.timeouts.connect).await {
            Ok(link) => {
                let link = Arc::new(link);
                peer.link.store(Some(Arc::clone(&link)));
                if previous {
                    tracing::info!(%node, %address, "peer link open again");
                }
                *backoff = Backoff::default();
                Ok(link)
            }
            Err(error) => {
                tracing::warn!(%node, %address, failures = backoff.failures, %error, "cannot open a peer link");
                let error = cause(error);
                backoff.last_error = Some(Arc::clone(&error));
                Err(BusError::Failed { node, cause: error })
            }
        }
    }

    /// How long to wait after `failures` failed attempts in a row: doubling from
    /// `reconnect_min` up to `reconnect_max`, plus up to a fifth more so that nodes which
    /// lost a peer together do not all retry at the same instant.
    fn reconnect_delay(&self, failures: u32) -> Duration {
        let doubled = self.timeouts.reconnect_min.saturating_mul(1 << failures.saturating_sub(1).min(16));
        let delay = doubled.min(self.timeouts.reconnect_max.max(self.timeouts.reconnect_min));
        delay + delay.mul_f64(rand::random::<f64>() / 5.0)
    }

    /// Sends one request to `node` and waits for its outcome, all within the deadline of
    /// its kind.
    async fn call(&self, node: NodeId, kind: Kind, request: WireKind) -> Result<Outcome, BusError> {
        self.call_queued(node, kind, request, None).await
    }

    /// As [`call`](Self::call), telling `queued` once the request is handed to the link (or
    /// never will be).
    async fn call_queued(
        &self,
        node: NodeId,
        kind: Kind,
        request: WireKind,
        queued: Option<Queued>,
    ) -> Result<Outcome, BusError> {
        let deadline = match kind {
            Kind::ForwardSend => self.timeouts.forward_send,
            _ => self.timeouts.request,
        };
        let peer = self.peer(node);
        if !peer.breaker.permits() {
            metrics::counter!("herald_cluster_peer_requests_total", "kind" => kind.name(), "outcome" => "refused")
                .increment(1);
            let why = format!("node {node} was not asked: its circuit breaker is open after repeated failures");
            return Err(BusError::Failed { node, cause: cause(why) });
        }
        // The inner result is the peer's answer: a refusal is an answer, and says nothing
        // against the link.
        // Whether the request is in an open link's queue, from where it goes out whatever
        // this call does: a deadline that passes after that leaves open whether the peer
        // carried it out; one that passes while the link is still being opened, or while
        // the request waits for room in a full queue, does not (it never leaves, and a
        // delivery hop counted as possibly landed would never be asked again).
        let handed_over = AtomicBool::new(false);
        let exchange = async {
            let link = self.link(node, &peer).await?;
            let on_queued = || {
                handed_over.store(true, Ordering::Relaxed);
                if let Some(queued) = queued {
                    let _ = queued.send(());
                }
            };
            match link.call(request, on_queued).await {
                Ok(Some(Outcome::Failure(Failure { message, .. }))) => Ok(Err(BusError::Failed {
                    node,
                    cause: cause(format!("node {node} refused the request: {message}")),
                })),
                Ok(Some(outcome)) => Ok(Ok(outcome)),
                Ok(None) => Ok(Err(BusError::Failed {
                    node,
                    cause: cause(format!("node {node} answered in a form unknown here")),
                })),
                Err(CallError::NotSent(cause)) => Err(BusError::Failed { node, cause }),
                Err(CallError::Broken(cause)) => Err(BusError::Broken { node, cause }),
            }
        };
        // `answered`: whether the peer answered at all (the link works), for its breaker.
        let started = std::time::Instant::now();
        let exchanged = tokio::time::timeout(deadline, exchange).await;
        metrics::histogram!("herald_cluster_peer_request_seconds", "kind" => kind.name())
            .record(started.elapsed().as_secs_f64());
        let (result, outcome, answered) = match exchanged {
            Ok(Ok(Ok(answer))) => (Ok(answer), "ok", Some(true)),
            Ok(Ok(Err(refused))) => (Err(refused), "failed", Some(true)),
            // A node that left the ring is no failure of its link.
            Ok(Err(error @ BusError::Unreachable(_))) => (Err(error), "unreachable", None),
            Ok(Err(error)) => (Err(error), "failed", Some(false)),
            Err(_) => {
                let cause = cause(format!("node {node} did not answer {} within {deadline:?}", kind.name()));
                let error = if handed_over.load(Ordering::Relaxed) {
                    BusError::Late { node, cause }
                } else {
                    BusError::Failed { node, cause }
                };
                (Err(error), "timeout", Some(false))
            }
        };
        match answered {
            Some(true) => peer.breaker.success(),
            Some(false) => {
                peer.breaker.failure();
                // The probe after the open period goes over a fresh link: the old one may
                // be dead without either end having noticed (a peer cut off mid-stream).
                if peer.breaker.state() == BreakerState::Open {
                    peer.link.store(None);
                }
            }
            None => {}
        }
        metrics::counter!("herald_cluster_peer_requests_total", "kind" => kind.name(), "outcome" => outcome)
            .increment(1);
        result
    }
}

/// A response that does not belong to the request it answers.
fn unexpected(node: NodeId, kind: Kind) -> BusError {
    BusError::Failed { node, cause: cause(format!("node {node} answered {} with something else", kind.name())) }
}

/// Expects a request's plain completion.
fn done(node: NodeId, kind: Kind, outcome: Outcome) -> Result<(), BusError> {
    match outcome {
        Outcome::Done(_) => Ok(()),
        _ => Err(unexpected(node, kind)),
    }
}

#[async_trait]
impl NodeBus for PeerBus {
    async fn forward_send(&self, owner: NodeId, request: SendRequest, queued: Queued) -> Result<SendAck, BusError> {
        match self.call_queued(owner, Kind::ForwardSend, wire::forward_send(&request), Some(queued)).await? {
            Outcome::SendAck(ack) => Ok(SendAck { to: request.origin, rid: request.rid, ack }),
            _ => Err(unexpected(owner, Kind::ForwardSend)),
        }
    }

    async fn deliver(
        &self,
        node: NodeId,
        message: Arc<Message>,
        users: &[UserId],
        addressed: Addressed,
    ) -> Result<(), BusError> {
        let outcome = self.call(node, Kind::Deliver, wire::deliver(&message, users, addressed)).await?;
        done(node, Kind::Deliver, outcome)
    }

    async fn publish_room(&self, nodes: &[NodeId], message: Arc<Message>) -> Result<(), Vec<BusError>> {
        // Built once; each copy shares the body's bytes.
        let request = wire::publish_room(&message);
        let calls = nodes.iter().map(|&node| {
            let request = request.clone();
            async move { done(node, Kind::PublishRoom, self.call(node, Kind::PublishRoom, request).await?) }
        });
        each_asked(join_all(calls).await.into_iter().filter_map(Result::err).collect())
    }

    async fn take_over(&self, route: &Route) -> Result<Option<DeviceLedger>, BusError> {
        let node = route.node;
        match self.call(node, Kind::Kick, wire::kick(route, true)).await? {
            // A node that predates hand-overs, or an old connection that cannot resume.
            Outcome::Done(_) => Ok(None),
            Outcome::Ledger(ledger) => wire::ledger_from(ledger).map(Some).map_err(|error| BusError::Failed {
                node,
                cause: cause(format!("node {node} handed over a bad ledger: {error}")),
            }),
            _ => Err(unexpected(node, Kind::Kick)),
        }
    }

    async fn group_changed(&self, group: &GroupId) {
        self.announce(Kind::GroupChanged, wire::group_changed(group)).await;
    }

    async fn lowest_in_flight(&self, owner: NodeId, conversation: &ConversationId) -> Result<Option<u64>, BusError> {
        match self.call(owner, Kind::LowestInFlight, wire::lowest_in_flight(conversation)).await? {
            Outcome::InFlight(InFlight { seq }) => Ok(seq),
            _ => Err(unexpected(owner, Kind::LowestInFlight)),
        }
    }

    fn peers(&self) -> Vec<NodeId> {
        self.addresses.nodes().into_iter().filter(|&node| node != self.local).collect()
    }
}

/// A login is announced to every other live node, all at once; a node that cannot be
/// reached within the request deadline is skipped (its cache entry expires by itself).
#[async_trait]
impl RouteChanges for PeerBus {
    async fn routes_changed(&self, users: &[UserId]) {
        self.announce(Kind::RoutesChanged, wire::routes_changed(users)).await;
    }
}

impl PeerBus {
    /// Sends `request` to every other live node at once and waits for their answers; a
    /// node that cannot be reached within the request deadline is skipped.
    async fn announce(&self, kind: Kind, request: WireKind) {
        let calls = self.peers().into_iter().map(|node| {
            let request = request.clone();
            async move {
                let outcome = self.call(node, kind, request).await;
                if let Err(error) = outcome.and_then(|outcome| done(node, kind, outcome)) {
                    tracing::debug!(%node, %error, kind = kind.name(), "a change was not announced");
                }
            }
        });
        join_all(calls).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nowhere;

    impl PeerAddresses for Nowhere {
        fn address_of(&self, _node: NodeId) -> Option<SocketAddr> {
            None
        }

        fn nodes(&self) -> Vec<NodeId> {
            Vec::new()
        }
    }

    #[test]
    fn reconnect_delays_double_from_the_least_up_to_the_most() {
        let timeouts = PeerTimeouts {
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(1),
            ..PeerTimeouts::default()
        };
        let secret = PeerSecret::new("s").expect("not empty");
        let bus = PeerBus::new(NodeId(1), secret, Arc::new(Nowhere), timeouts);
        for (failures, least_ms) in [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1000), (u32::MAX, 1000)] {
            let delay = bus.reconnect_delay(failures);
            let least = Duration::from_millis(least_ms);
            assert!(delay >= least && delay <= least.mul_f64(1.2), "{failures} failures: {delay:?}");
        }
    }
}

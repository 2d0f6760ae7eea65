//! [`PeerServer`]: the called side of the node-to-node links.
//!
//! Accepts links on `cluster.peer_listen`, admits those whose caller proves it knows
//! `cluster.secret`, and runs each request in a task of its own through the
//! [`PeerHandler`], writing its response back on the link whenever it is ready. A link's
//! reader takes at most [`MAX_IN_FLIGHT`] requests at a time; past that it stops reading,
//! and TCP slows the caller down.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use herald_proto::peer::v1::failure::Code;
use herald_proto::peer::v1::response::Outcome;
use herald_proto::peer::v1::{Done, Failure, InFlight, PeerFrame, Response, peer_frame::Body};
use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinSet;

use super::frame::{self, AbortOnDrop, FrameError, MAX_FRAME_BYTES, Outgoing};
use super::handshake::{self, Rejection};
use super::wire::{self, Call, WireError};
use super::{PeerHandler, PeerSecret, PeerTimeouts, ReadHalf, WriteHalf};
use crate::maps::HashMap;
use crate::model::{ConnectionId, NodeId};
use crate::pipeline::{Admission, FanOut, Settled};
use crate::tls::Tls;

/// Requests of one link being handled at once.
const MAX_IN_FLIGHT: usize = 1024;

/// Responses waiting for a link's writer.
const OUTBOUND_QUEUE: usize = 1024;

/// Pause after a failed accept (out of file descriptors, say), so the loop does not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Accepts the links other nodes open to this one and answers their requests.
pub struct PeerServer {
    /// This node, as it answers challenges.
    node: NodeId,
    /// What callers must prove they know.
    secret: PeerSecret,
    /// Does what the requests ask.
    handler: Arc<dyn PeerHandler>,
    timeouts: PeerTimeouts,
    /// Links are TLS when set (`[tls]`).
    tls: Option<Tls>,
}

impl PeerServer {
    /// A server for node `node`, admitting callers that know `secret` and handing their
    /// requests to `handler`. Uses [`PeerTimeouts::hello`] for the handshake and
    /// [`PeerTimeouts::forward_send`] as the longest wait to write a response.
    pub fn new(node: NodeId, secret: PeerSecret, handler: Arc<dyn PeerHandler>, timeouts: PeerTimeouts) -> Self {
        Self { node, secret, handler, timeouts, tls: None }
    }

    /// This server accepting TLS links only, with `tls` (`None`: plain TCP).
    #[must_use]
    pub fn with_tls(mut self, tls: Option<Tls>) -> Self {
        self.tls = tls;
        self
    }

    /// Accepts links on `listener` until `stop` turns true (or its sender is dropped), then
    /// closes every link and returns. Requests already handed to the handler run to their
    /// end; their responses are not sent.
    pub async fn serve(self, listener: TcpListener, mut stop: watch::Receiver<bool>) {
        let server = Arc::new(self);
        let mut links = JoinSet::new();
        // A dropped sender stops the server too: nobody is left to stop it.
        let stopping = async move {
            let _ = stop.wait_for(|&stopped| stopped).await;
        };
        tokio::pin!(stopping);
        loop {
            tokio::select! {
                () = &mut stopping => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, address)) => {
                        links.spawn(Arc::clone(&server).serve_link(stream, address));
                    }
                    Err(error) => {
                        tracing::warn!(%error, "accepting a peer link failed");
                        tokio::time::sleep(ACCEPT_PAUSE).await;
                    }
                },
                Some(_) = links.join_next(), if !links.is_empty() => {}
            }
        }
        links.shutdown().await;
    }

    /// Admits one link, then reads its requests until it ends.
    async fn serve_link(self: Arc<Self>, stream: TcpStream, address: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let admitted = async {
            let Some(tls) = &self.tls else {
                let mut stream = stream;
                let caller = handshake::admit(&mut stream, self.node, &self.secret).await?;
                let (read, write) = stream.into_split();
                return Ok::<(NodeId, ReadHalf, WriteHalf), Rejection>((caller, Box::new(read), Box::new(write)));
            };
            let mut stream = tls.acceptor().accept(stream).await.map_err(|error| {
                metrics::counter!("herald_tls_handshake_failures_total").increment(1);
                Rejection::Broken(format!("tls handshake failed: {error}"))
            })?;
            let caller = handshake::admit(&mut stream, self.node, &self.secret).await?;
            let (read, write) = super::split(stream);
            Ok((caller, read, write))
        };
        let (caller, read, write) = match tokio::time::timeout(self.timeouts.hello, admitted).await {
            Ok(Ok(opened)) => opened,
            Ok(Err(Rejection::Refused { reason, claimed, message })) => {
                metrics::counter!("herald_cluster_peer_refused_total", "reason" => reason.as_str_name()).increment(1);
                let claimed = claimed.map(|node| node.0);
                tracing::warn!(peer = %address, ?claimed, reason = reason.as_str_name(), %message, "refused a peer link");
                return;
            }
            Ok(Err(Rejection::Broken(reason))) => {
                tracing::debug!(peer = %address, %reason, "a peer link ended during its handshake");
                return;
            }
            Err(_) => {
                metrics::counter!("herald_cluster_peer_refused_total", "reason" => "HELLO_TIMEOUT").increment(1);
                tracing::warn!(peer = %address, limit = ?self.timeouts.hello, "dropped a peer link that sent no hello in time");
                return;
            }
        };
        tracing::info!(peer = %address, node = %caller, "peer link open");
        let (outbound, queue) = mpsc::channel(OUTBOUND_QUEUE);
        let _writer = AbortOnDrop(tokio::spawn(frame::write_queue(write, queue)).abort_handle());
        let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let mut reader = BufReader::new(read);
        let mut order = SendOrder::default();
        let broken = loop {
            let request = match frame::read(&mut reader, MAX_FRAME_BYTES).await {
                Ok(PeerFrame { body: Some(Body::Request(request)) }) => request,
                Ok(_) => break Some("a frame that is not a request".to_owned()),
                Err(FrameError::Closed) => break None,
                Err(error) => break Some(error.to_string()),
            };
            let Ok(permit) = Arc::clone(&permits).acquire_owned().await else { break None };
            let id = request.id;
            let call = Call::decode(request.kind, caller, self.node);
            // A send takes its turn here, in the order the link carried it.
            let turn = match &call {
                Ok(Call::Send(send)) => Some(order.turn(send.origin.connection)),
                _ => None,
            };
            tokio::spawn(Arc::clone(&self).answer(caller, id, call, turn, outbound.clone(), permit));
        };
        match broken {
            None => tracing::info!(peer = %address, node = %caller, "peer link closed by the caller"),
            Some(reason) => tracing::warn!(peer = %address, node = %caller, %reason, "peer link closed: broken"),
        }
    }

    /// Handles one request and writes its response; then, for a send, runs its fan-out.
    async fn answer(
        self: Arc<Self>,
        caller: NodeId,
        id: u64,
        call: Result<Call, WireError>,
        turn: Option<Turn>,
        outbound: mpsc::Sender<Outgoing>,
        permit: OwnedSemaphorePermit,
    ) {
        let (outcome, fan_out) = match call {
            Ok(call) => self.run(call, turn).await,
            Err(error) => {
                tracing::warn!(node = %caller, request = id, %error, "refused a malformed peer request");
                (Outcome::Failure(Failure { code: Code::BadRequest.into(), message: error.to_string() }), None)
            }
        };
        let response = PeerFrame { body: Some(Body::Response(Response { id, outcome: Some(outcome) })) };
        match frame::encode(&response) {
            Ok(frame) => {
                // The ack is on its way before the fan-out starts; a link that broke or
                // stalled does not keep the fan-out waiting past the forward deadline.
                let (written, on_written) = oneshot::channel();
                let sent = async {
                    if outbound.send(Outgoing { frame, written: Some(written) }).await.is_ok() {
                        let _ = on_written.await;
                    }
                };
                let _ = tokio::time::timeout(self.timeouts.forward_send, sent).await;
            }
            Err(error) => tracing::warn!(node = %caller, request = id, %error, "a peer response cannot be sent"),
        }
        drop(permit);
        if let Some(fan_out) = fan_out {
            tokio::spawn(fan_out);
        }
    }

    /// Hands one request to the handler: its outcome, and the fan-out of a send. A send is
    /// admitted once the sends its connection forwarded before it have been (`turn`).
    async fn run(&self, call: Call, mut turn: Option<Turn>) -> (Outcome, Option<FanOut>) {
        let done = Outcome::Done(Done {});
        match call {
            Call::Send(request) => {
                if let Some(turn) = turn.as_mut() {
                    turn.wait().await;
                }
                let admitted = self.handler.admit_send(request).await;
                // Admitted: the connection's next send may be.
                drop(turn);
                let settled = match admitted {
                    Admission::Done(ack) => Settled { ack, fan_out: None },
                    Admission::Wait(rest) => rest.await,
                };
                (Outcome::SendAck(settled.ack.ack), settled.fan_out)
            }
            Call::Deliver(message, users, addressed) => {
                self.handler.deliver(message, users, addressed).await;
                (done, None)
            }
            Call::PublishRoom(message) => {
                self.handler.publish_room(message).await;
                (done, None)
            }
            Call::Kick(route, hand_over) => match self.handler.kick(route, hand_over).await {
                Some(ledger) => (Outcome::Ledger(wire::ledger(&ledger)), None),
                None => (done, None),
            },
            Call::LowestInFlight(conversation) => {
                (Outcome::InFlight(InFlight { seq: self.handler.lowest_in_flight(conversation).await }), None)
            }
            Call::RoutesChanged(users) => {
                self.handler.routes_changed(users).await;
                (done, None)
            }
            Call::GroupChanged(group) => {
                self.handler.group_changed(group).await;
                (done, None)
            }
        }
    }
}

/// The order in which one link's forwarded sends are admitted: per sending connection, the
/// order the link carried them (the caller hands a connection's sends to the link one after
/// the other). Sends of different connections do not wait for each other. Held by the
/// link's reader alone.
#[derive(Default)]
struct SendOrder {
    /// Per connection, what its latest send's turn tells when dropped.
    last: HashMap<ConnectionId, oneshot::Receiver<()>>,
    /// Past this many entries, those whose send was admitted already are dropped.
    sweep_at: usize,
}

/// Entries a link's [`SendOrder`] keeps before it first drops the settled ones.
const SEND_ORDER_SWEEP: usize = 1024;

impl SendOrder {
    /// The next send of `connection`: it waits for the one before it.
    fn turn(&mut self, connection: ConnectionId) -> Turn {
        let (admitted, signal) = oneshot::channel();
        let after = self.last.insert(connection, signal);
        if self.last.len() > self.sweep_at.max(SEND_ORDER_SWEEP) {
            // An entry whose send was admitted (its turn dropped) has nothing to wait for.
            self.last.retain(|_, signal| matches!(signal.try_recv(), Err(oneshot::error::TryRecvError::Empty)));
            self.sweep_at = self.last.len() * 2;
        }
        Turn { after, _holds_the_next: admitted }
    }
}

/// One forwarded send's place in its connection's order: dropped once the send is
/// admitted, which lets the connection's next send go (so does a task that ends early).
struct Turn {
    /// Resolves once the connection's previous send's turn was dropped.
    after: Option<oneshot::Receiver<()>>,
    /// Held until this send is admitted; its receiver is the next send's `after`.
    _holds_the_next: oneshot::Sender<()>,
}

impl Turn {
    /// Waits until the connection's previous send was admitted.
    async fn wait(&mut self) {
        if let Some(after) = self.after.take() {
            let _ = after.await;
        }
    }
}

//! One open link to a peer, as its caller holds it: requests out, responses matched back to
//! their requests by id.
//!
//! Two tasks serve a link: a writer that drains the queue of outgoing frames, and a reader
//! that hands each response to the request waiting for it. When either ends, the link is
//! closed: every request waiting on it fails at once with the reason, and none can start on
//! it any more ([`Link::is_open`] turns false, and [`PeerBus`](super::PeerBus) opens a new
//! one on the next call). A link dropped while requests are queued still writes them (for a
//! few seconds at most): each went out as far as its caller knows.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_proto::peer::v1::{PeerFrame, Request, peer_frame::Body, request::Kind as WireKind, response::Outcome};
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::frame::{self, AbortOnDrop, FrameError, MAX_FRAME_BYTES, Outgoing};
use super::{PeerSecret, ReadHalf, WriteHalf, handshake};
use crate::maps::HashMap;
use crate::model::NodeId;
use crate::routing::bus::{Cause, cause};
use crate::tls::Tls;

/// Frames waiting for a link's writer. A caller finding it full waits, within its deadline:
/// that is the link's backpressure.
const OUTBOUND_QUEUE: usize = 1024;

/// What a request waits for: the peer's outcome (`None`: one this build does not know), or
/// why the link closed under it.
type Answer = Result<Option<Outcome>, Cause>;

/// Why a link could not be opened, a request could not go out on it, or it closed; phrased
/// for the operator, with the socket's, TLS's or frame's error as its source.
#[derive(Debug, thiserror::Error)]
pub(super) enum LinkError {
    #[error("cannot connect to node {node} at {address}: {source}")]
    Connect { node: NodeId, address: SocketAddr, source: std::io::Error },
    #[error("tls handshake with node {node} at {address} failed: {source}")]
    Tls { node: NodeId, address: SocketAddr, source: std::io::Error },
    /// The peer refused this node, or is not the node expected.
    #[error("{0}")]
    Handshake(String),
    #[error("node {node} at {address} did not complete a handshake within {limit:?}")]
    HandshakeTimeout { node: NodeId, address: SocketAddr, limit: Duration },
    #[error("the request cannot be sent: {0}")]
    Unsendable(#[source] FrameError),
    #[error("the link to node {node} was closed")]
    Closed { node: NodeId },
    #[error("writing to node {node} failed: {source}")]
    Write { node: NodeId, source: std::io::Error },
    #[error("node {node} broke the link protocol (a frame that is not a response)")]
    Protocol { node: NodeId },
    #[error("node {node} closed the link")]
    ClosedByPeer { node: NodeId },
    #[error("the link to node {node} failed: {source}")]
    Read { node: NodeId, source: FrameError },
}

/// A link open to one peer.
pub(super) struct Link {
    /// The peer's address when the link was opened; a new address means a new link.
    address: SocketAddr,
    /// The id of the next request; ids are never reused on a link.
    next_id: AtomicU64,
    /// To the writer task.
    outbound: mpsc::Sender<Outgoing>,
    /// Requests waiting for their response.
    pending: Arc<Pending>,
    /// The reader task, stopped when the link is dropped.
    _reader: AbortOnDrop,
    /// The writer task, which outlives the link for as long as it takes to write what was
    /// queued (see [`Flush`]).
    _writer: Flush,
}

/// How long a dropped link's writer may still take to write what was queued before it.
const FLUSH_GRACE: Duration = Duration::from_secs(5);

/// Lets a dropped link's writer finish what was queued, within [`FLUSH_GRACE`]. A request
/// in the queue counts as gone out ([`Link::call`] said so), and a caller that stopped
/// waiting for its answer will not ask again (a delivery hop counted late): dropping the
/// link — a breaker that opened replaces it — must not drop the request with it. The
/// queue's sender goes with the link, so the writer ends once the queue is empty; a socket
/// that takes nothing more is given up after the grace.
struct Flush(tokio::task::AbortHandle);

impl Drop for Flush {
    fn drop(&mut self) {
        let writer = self.0.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(FLUSH_GRACE).await;
                    writer.abort();
                });
            }
            Err(_) => writer.abort(),
        }
    }
}

impl Link {
    /// Connects to `node` at `address` (over TLS with `tls`) and completes the handshake,
    /// within `limit`.
    ///
    /// # Errors
    /// [`LinkError`]: why the link could not be opened.
    pub(super) async fn open(
        node: NodeId,
        address: SocketAddr,
        local: NodeId,
        secret: &PeerSecret,
        tls: Option<&Tls>,
        limit: Duration,
    ) -> Result<Self, LinkError> {
        let opening = async {
            let mut stream =
                TcpStream::connect(address).await.map_err(|source| LinkError::Connect { node, address, source })?;
            // Requests are small and latency matters more than packet count.
            let _ = stream.set_nodelay(true);
            let Some(tls) = tls else {
                handshake::introduce(&mut stream, address, local, node, secret).await.map_err(LinkError::Handshake)?;
                let (read, write) = stream.into_split();
                return Ok::<(ReadHalf, WriteHalf), LinkError>((Box::new(read), Box::new(write)));
            };
            let mut stream = tls
                .connector()
                .connect(tls.peer_name(address), stream)
                .await
                .map_err(|source| LinkError::Tls { node, address, source })?;
            handshake::introduce(&mut stream, address, local, node, secret).await.map_err(LinkError::Handshake)?;
            Ok(super::split(stream))
        };
        let (read, write) = tokio::time::timeout(limit, opening).await.map_err(|_| LinkError::HandshakeTimeout {
            node,
            address,
            limit,
        })??;
        let (outbound, queue) = mpsc::channel(OUTBOUND_QUEUE);
        let pending = Arc::new(Pending::default());
        let writer = tokio::spawn({
            let pending = Arc::clone(&pending);
            async move {
                let closed = match frame::write_queue(write, queue).await {
                    Ok(()) => LinkError::Closed { node },
                    Err(source) => LinkError::Write { node, source },
                };
                pending.close(cause(closed));
            }
        });
        let writer = Flush(writer.abort_handle());
        let reader = tokio::spawn(read_responses(node, BufReader::new(read), Arc::clone(&pending)));
        let reader = AbortOnDrop(reader.abort_handle());
        Ok(Self { address, next_id: AtomicU64::new(1), outbound, pending, _reader: reader, _writer: writer })
    }

    /// Whether requests can still be sent on this link.
    pub(super) fn is_open(&self) -> bool {
        !self.pending.is_closed()
    }

    pub(super) fn address(&self) -> SocketAddr {
        self.address
    }

    /// Sends one request and waits for its outcome; the caller bounds the wait. Once the
    /// request is in the writer's queue, behind every request queued before it,
    /// `on_queued` runs (never, when it does not get there): from then on the request goes
    /// out even if the caller stops waiting, and the peer may carry it out.
    ///
    /// # Errors
    /// Why no outcome came, and whether the request left: [`CallError::NotSent`] when it is
    /// too large for a frame or the link had closed, [`CallError::Broken`] when the link
    /// closed after it was queued.
    pub(super) async fn call(
        &self,
        kind: WireKind,
        on_queued: impl FnOnce() + Send,
    ) -> Result<Option<Outcome>, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = PeerFrame { body: Some(Body::Request(Request { id, kind: Some(kind) })) };
        let frame = frame::encode(&frame).map_err(|error| CallError::NotSent(cause(LinkError::Unsendable(error))))?;
        let answer = self.pending.register(id).map_err(CallError::NotSent)?;
        // Removes the entry if this call is dropped (its deadline passed) before an answer.
        let _waiting = Waiting { pending: &self.pending, id };
        if self.outbound.send(Outgoing { frame, written: None }).await.is_err() {
            return Err(CallError::NotSent(self.pending.reason()));
        }
        on_queued();
        answer.await.unwrap_or_else(|_| Err(self.pending.reason())).map_err(CallError::Broken)
    }
}

/// Why a request got no outcome.
#[derive(Debug)]
pub(super) enum CallError {
    /// It never left: too large for a frame, or the link had closed.
    NotSent(Cause),
    /// It was queued to the link, which closed before the answer came: the peer may have
    /// carried it out.
    Broken(Cause),
}

/// Reads responses until the link ends, then closes it.
async fn read_responses(node: NodeId, mut reader: BufReader<ReadHalf>, pending: Arc<Pending>) {
    let closed = loop {
        match frame::read(&mut reader, MAX_FRAME_BYTES).await {
            Ok(PeerFrame { body: Some(Body::Response(response)) }) => pending.answer(response.id, response.outcome),
            Ok(_) => {
                tracing::warn!(%node, "a peer sent a frame that is not a response; closing the link");
                break LinkError::Protocol { node };
            }
            Err(FrameError::Closed) => break LinkError::ClosedByPeer { node },
            Err(source) => {
                tracing::warn!(%node, error = %source, "reading from a peer failed; closing the link");
                break LinkError::Read { node, source };
            }
        }
    };
    pending.close(cause(closed));
}

/// The requests in flight on a link, and whether it closed.
#[derive(Default)]
struct Pending {
    state: Mutex<PendingState>,
}

#[derive(Default)]
struct PendingState {
    /// Why the link closed; set once, after which nothing waits on it.
    closed: Option<Cause>,
    /// Each request in flight, by id.
    waiting: HashMap<u64, oneshot::Sender<Answer>>,
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, PendingState> {
        // A panic elsewhere cannot leave the map half-updated: each step is one insert or
        // remove. Keep serving with what is there.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for `id`'s response, unless the link has closed.
    fn register(&self, id: u64) -> Result<oneshot::Receiver<Answer>, Cause> {
        let mut state = self.lock();
        if let Some(reason) = &state.closed {
            return Err(reason.clone());
        }
        let (sender, receiver) = oneshot::channel();
        state.waiting.insert(id, sender);
        Ok(receiver)
    }

    /// Hands a response to its request; one nobody waits for any more (it timed out) is
    /// dropped.
    fn answer(&self, id: u64, outcome: Option<Outcome>) {
        if let Some(waiting) = self.lock().waiting.remove(&id) {
            let _ = waiting.send(Ok(outcome));
        }
    }

    fn forget(&self, id: u64) {
        self.lock().waiting.remove(&id);
    }

    /// Closes the link: every waiting request fails with `reason`, and no new one starts.
    fn close(&self, reason: Cause) {
        let waiting = {
            let mut state = self.lock();
            state.closed.get_or_insert_with(|| Arc::clone(&reason));
            std::mem::take(&mut state.waiting)
        };
        for (_, request) in waiting {
            let _ = request.send(Err(Arc::clone(&reason)));
        }
    }

    fn is_closed(&self) -> bool {
        self.lock().closed.is_some()
    }

    fn reason(&self) -> Cause {
        self.lock().closed.clone().unwrap_or_else(|| cause("the link closed"))
    }
}

/// Forgets a request when its caller stops waiting.
struct Waiting<'a> {
    pending: &'a Pending,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.pending.forget(self.id);
    }
}

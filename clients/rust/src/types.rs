//! What the client hands to the application: messages, send results and its events.

use std::fmt;
use std::time::Duration;

use crate::wire::v1;
use bytes::Bytes;

use crate::error::ClientError;

/// A stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The snowflake id.
    pub id: u64,
    /// `dm:<a>:<b>`, `grp:<id>` or `room:<name>`.
    pub conversation: String,
    /// Position in the conversation, increasing (gaps allowed); 0 for an unarchived announcement.
    pub seq: u64,
    /// Who sent it.
    pub sender: String,
    /// From which of the sender's devices.
    pub sender_device: String,
    /// Application-defined.
    pub kind: u32,
    /// The content.
    pub body: Bytes,
    /// When the server stored it, ms since the Unix epoch.
    pub sent_at_ms: u64,
}

impl From<v1::Message> for Message {
    fn from(wire: v1::Message) -> Self {
        Self {
            id: wire.id,
            conversation: wire.conversation,
            seq: wire.seq,
            sender: wire.sender,
            sender_device: wire.sender_device,
            kind: wire.kind,
            body: wire.body,
            sent_at_ms: wire.sent_at_ms,
        }
    }
}

/// What a `send` resolved with: the message is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The message's id.
    pub message_id: u64,
    /// Its seq.
    pub seq: u64,
    /// The conversation it is stored in (for a `duplicate`, the original's).
    pub conversation: String,
    /// The id the send carried (the caller's or a random UUID).
    pub client_msg_id: String,
    /// The server had it already (a resend of a stored message): the ids are the original's.
    pub duplicate: bool,
}

/// Where the client is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The socket is opening, or `connect` awaits its answer.
    Connecting,
    /// After the server's `connected`: only now are frames written.
    Connected,
    /// Waiting for the next attempt (backoff, or `go_away`'s wait).
    Reconnecting,
    /// Final: `close()` or a close the client does not retry.
    Closed,
}

/// A session began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectedInfo {
    /// The user in force (a connect hook may map the token's user).
    pub user_id: String,
    /// This device.
    pub device_id: String,
    /// The node serving the session.
    pub node_id: u32,
    /// The server's id of the session.
    pub session_id: String,
    /// How often the server writes at least.
    pub heartbeat_ms: u32,
    /// The URL connected to (a `go_away` may have named another node).
    pub url: String,
    /// A reconnect, not the first connection of this client.
    pub reconnect: bool,
}

/// A socket closed: a session that ended, or an attempt that never reached `connected`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisconnectedInfo {
    /// The close code (4000: the client found the server silent or the attempt timed out;
    /// 1006: the socket dropped without a close frame).
    pub code: u16,
    /// The close reason.
    pub reason: String,
    /// The socket had reached `connected`.
    pub was_connected: bool,
    /// Whether the client tries again, and after how long.
    pub reconnect_in: Option<Duration>,
}

/// After a reconnect: every room re-joined and the catch-up probe answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumedInfo {
    /// From the drop to the resumption.
    pub offline: Duration,
    /// Sends resent with their original `client_msg_id`.
    pub resent_sends: usize,
    /// Rooms re-joined from their last seq.
    pub rooms: usize,
}

/// The server drains (`go_away`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoAwayInfo {
    /// Why.
    pub reason: String,
    /// Wait this long after the close before reconnecting.
    pub reconnect_after_ms: u32,
    /// Where to reconnect, when the server named another node.
    pub reconnect_url: Option<String>,
}

/// A send was answered `RETRY`; it is written again after the wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryInfo {
    /// The send's id, kept for the resend.
    pub client_msg_id: String,
    /// Where it goes.
    pub conversation: String,
    /// The server's words.
    pub reason: String,
    /// The wait before the resend.
    pub retry_after_ms: u32,
}

/// A page of history, ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryPage {
    /// The conversation read.
    pub conversation: String,
    /// Ascending seq.
    pub messages: Vec<Message>,
    /// There are older messages.
    pub has_more: bool,
}

/// One conversation of a `sync` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncedConversation {
    /// The conversation.
    pub conversation: String,
    /// What follows the cursor, ascending.
    pub messages: Vec<Message>,
    /// Every message at or below it was returned or does not exist.
    pub complete_through_seq: u64,
    /// The newest seq of the conversation.
    pub latest_seq: u64,
}

/// A room joined: where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribed {
    /// `room:<name>`.
    pub room: String,
    /// The room's newest seq.
    pub latest_seq: u64,
}

/// An incoming message, handed over once, in seq order within its conversation.
///
/// With [`AckMode::Auto`](crate::AckMode::Auto) the message counts as handled when this
/// value is dropped: keep it until the application is done with the message, and the
/// client stores its seq and acknowledges it only then. With `Manual`, call
/// [`Client::ack`](crate::Client::ack).
pub struct Delivery {
    /// The message.
    pub message: Message,
    /// Tells the client the message was handled, on drop.
    #[expect(dead_code, reason = "held for its Drop: the message is handled when the delivery is dropped")]
    pub(crate) handled: Option<HandledGuard>,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery").field("message", &self.message).finish_non_exhaustive()
    }
}

impl std::ops::Deref for Delivery {
    type Target = Message;
    fn deref(&self) -> &Message {
        &self.message
    }
}

/// Reports one delivery handled to the client's driver when dropped. The report is a
/// closure the driver's core gives, so that this module need not know the core's commands.
pub(crate) struct HandledGuard(Option<Box<dyn FnOnce() + Send + Sync>>);

impl HandledGuard {
    pub(crate) fn new(report: impl FnOnce() + Send + Sync + 'static) -> Self {
        Self(Some(Box::new(report)))
    }
}

impl Drop for HandledGuard {
    fn drop(&mut self) {
        if let Some(report) = self.0.take() {
            report();
        }
    }
}

/// What the client tells the application, in the order it happened.
#[derive(Debug)]
pub enum Event {
    /// The state changed.
    State(State),
    /// A session began.
    Connected(ConnectedInfo),
    /// A socket closed (for every socket, reached `connected` or not).
    Disconnected(DisconnectedInfo),
    /// After a reconnect, the client is current again.
    Resumed(ResumedInfo),
    /// The server drains.
    GoAway(GoAwayInfo),
    /// A send was answered `RETRY`.
    Retry(RetryInfo),
    /// An incoming message.
    Message(Delivery),
    /// Something went wrong that no call is waiting for.
    Error(ClientError),
}

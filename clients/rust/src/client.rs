//! The application's handle: `connect`, `send`, `subscribe`, reads, acks and `close`.

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

use crate::core::{Command, Core};
use crate::driver;
use crate::error::{ClientError, SendError};
use crate::options::{ClientOptions, SendOptions};
use crate::types::{Event, HistoryPage, Message, Sent, State, Subscribed, SyncedConversation};

/// A Herald client: one WebSocket session at a time, kept up across drops, following
/// PROTOCOL.md and clients/SPEC.md. Cheap to clone; every clone drives the same session.
#[derive(Debug, Clone)]
pub struct Client {
    commands: mpsc::UnboundedSender<Command>,
    state: watch::Receiver<State>,
}

/// The client's events, in the order they happened. Read them steadily: incoming messages
/// are acked only once their [`Delivery`](crate::Delivery) is dropped (auto acks), and while
/// `ClientOptions::event_capacity` events wait unread the client reads nothing more from
/// the server (it holds back rather than queue without bound; nothing is lost).
#[derive(Debug)]
pub struct Events {
    /// Bounded by `ClientOptions::event_capacity`: see there what a full channel does.
    events: mpsc::Receiver<Event>,
}

impl Events {
    /// The next event; `None` once the client is closed and every event was read.
    pub async fn next(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// The next event if one is waiting now.
    pub fn try_next(&mut self) -> Option<Event> {
        self.events.try_recv().ok()
    }
}

impl Client {
    /// Creates a client and starts connecting in the background, on the current tokio
    /// runtime. The events (connected, messages, …) come through the returned [`Events`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn connect(options: ClientOptions) -> (Self, Events) {
        let (commands, receiver) = mpsc::unbounded_channel();
        let ((events_tx, events), outlet) = driver::Outlet::new(options.event_capacity.max(1));
        let (state_tx, state) = watch::channel(State::Connecting);
        let core = Core::new(options, events_tx, commands.downgrade(), state_tx);
        tokio::spawn(driver::run(core, receiver, outlet));
        (Self { commands, state }, Events { events })
    }

    /// Where the client is now.
    pub fn state(&self) -> State {
        *self.state.borrow()
    }

    /// Waits until the client is connected (at once if it is).
    ///
    /// # Errors
    ///
    /// [`ClientError::Closed`] once the client is closed.
    pub async fn connected(&self) -> Result<(), ClientError> {
        let mut state = self.state.clone();
        let reached =
            state.wait_for(|state| matches!(state, State::Connected | State::Closed)).await.map(|state| *state);
        match reached {
            Ok(State::Connected) => Ok(()),
            _ => Err(ClientError::Closed { code: 1000, reason: "client closed".to_owned() }),
        }
    }

    /// Sends a message. Resolves once the server stored it (`OK`, or `DUPLICATE` for a
    /// resend it had already stored). A `RETRY` or a lost connection resends it with the
    /// same `client_msg_id`, so one call stores one message.
    ///
    /// # Errors
    ///
    /// [`SendError::Rejected`] on `REJECTED` (or a body over `max_body_bytes`, not sent),
    /// [`SendError::Abandoned`] when the client closed or the timeout passed first.
    pub async fn send(
        &self,
        conversation: impl Into<String>,
        body: impl Into<Bytes>,
        options: SendOptions,
    ) -> Result<Sent, SendError> {
        let conversation = conversation.into();
        let client_msg_id = options.client_msg_id.unwrap_or_else(uuid_v4);
        let (reply, answer) = oneshot::channel();
        let command = Command::Send {
            conversation: conversation.clone(),
            kind: options.kind,
            body: body.into(),
            client_msg_id: client_msg_id.clone(),
            timeout: options.timeout,
            reply,
        };
        let abandoned = || SendError::Abandoned {
            why: "the client is closed".to_owned(),
            client_msg_id: client_msg_id.clone(),
            conversation: conversation.clone(),
        };
        if self.commands.send(command).is_err() {
            return Err(abandoned());
        }
        answer.await.unwrap_or_else(|_| Err(abandoned()))
    }

    /// Joins a room (`room:<name>`, or just `<name>`) until [`Client::unsubscribe`] or the
    /// end of the client. After every reconnect it is joined again from the last seq seen
    /// (`since_seq`), so nothing posted meanwhile is missed.
    ///
    /// # Errors
    ///
    /// [`ClientError::Server`] when refused (the room is forgotten), [`ClientError::Closed`].
    pub async fn subscribe(&self, room: &str) -> Result<Subscribed, ClientError> {
        let (reply, answer) = oneshot::channel();
        self.ask(Command::Subscribe { room: room_name(room), reply }, answer).await
    }

    /// Leaves a room; its last seq is kept, so joining it again later catches up from there.
    pub fn unsubscribe(&self, room: &str) {
        let _ = self.commands.send(Command::Unsubscribe { room: room_name(room) });
    }

    /// A page of history before `before_seq` (0: the latest), ascending; `limit` 0 means 100.
    ///
    /// # Errors
    ///
    /// [`ClientError::Server`] (`forbidden`, `invalid`, …), [`ClientError::Closed`].
    pub async fn history(&self, conversation: &str, before_seq: u64, limit: u32) -> Result<HistoryPage, ClientError> {
        let (reply, answer) = oneshot::channel();
        self.ask(Command::History { conversation: conversation.to_owned(), before_seq, limit, reply }, answer).await
    }

    /// Pulls what follows each `(conversation, seq)` cursor (none: every direct and group
    /// conversation, from the server's cursors of this device). Returned, not emitted.
    ///
    /// # Errors
    ///
    /// [`ClientError::Server`], [`ClientError::Closed`].
    pub async fn sync(&self, cursors: Vec<(String, u64)>, limit: u32) -> Result<Vec<SyncedConversation>, ClientError> {
        let (reply, answer) = oneshot::channel();
        self.ask(Command::Sync { cursors, limit, reply }, answer).await
    }

    /// With [`AckMode::Manual`](crate::AckMode::Manual): `message` and everything before it
    /// in its conversation are handled (cumulative); stores its seq and acks it.
    pub fn ack(&self, message: &Message) {
        let _ = self.commands.send(Command::Ack { conversation: message.conversation.clone(), seq: message.seq });
    }

    /// Closes the client for good. First, when connected, it waits (up to
    /// `ClientOptions::close_timeout`) until every [`Delivery`](crate::Delivery) already
    /// handed over is handled (dropped), reading no new messages meanwhile: keep reading
    /// [`Events`] while it runs, or drop them. Then it writes the acks, closes the socket,
    /// and returns. Sends without a final answer fail with [`SendError::Abandoned`]: await
    /// the sends that matter before closing.
    pub async fn close(&self) {
        driver::close(&self.commands).await;
    }

    async fn ask<T>(
        &self,
        command: Command,
        answer: oneshot::Receiver<Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        let closed = || ClientError::Closed { code: 1000, reason: "client closed".to_owned() };
        self.commands.send(command).map_err(|_| closed())?;
        answer.await.unwrap_or_else(|_| Err(closed()))
    }
}

fn room_name(room: &str) -> String {
    if room.starts_with("room:") { room.to_owned() } else { format!("room:{room}") }
}

/// A random (version 4) UUID, the default `client_msg_id`.
pub fn uuid_v4() -> String {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_version_4_and_differ() {
        let one = uuid_v4();
        assert_eq!(one.len(), 36);
        assert_eq!(&one[14..15], "4");
        assert!(matches!(&one[19..20], "8" | "9" | "a" | "b"));
        assert_ne!(one, uuid_v4());
    }
}

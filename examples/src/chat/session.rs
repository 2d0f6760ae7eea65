//! The chat client's state machine: what a typed line or an incoming frame changes, what
//! to print and which frames to send. No I/O here, so the behaviour of `herald-chat` is
//! tested frame by frame without a server; the binary only moves lines and frames.
//!
//! Invariants: every `deliver` is acknowledged; a message is printed once even if it
//! arrives again (redelivery, sync after reconnect), by its id; a send stays pending
//! until a final `send_ack` and is resent with the same `client_msg_id` after a reconnect,
//! so a server that follows PROTOCOL.md stores it once.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    time::Duration,
};

use bytes::Bytes;
use herald_proto::v1::{self, Frame, frame::Body, send_ack::Status};

use super::command::{Command, HELP, display_body, parse_command};
use crate::ids::random_uuid;

/// The `kind` of chat text messages (app-defined; the web page uses the same).
pub const TEXT_KIND: u32 = 1;
/// Default page size of `/history`.
pub const HISTORY_PAGE: u32 = 20;
/// Resends after RETRY before the client gives up on a message.
const MAX_RETRIES: u32 = 5;

/// What the I/O loop should do after an event.
#[derive(Debug, Default, PartialEq)]
pub struct Effects {
    /// Lines to show the user, in order.
    pub print: Vec<String>,
    /// Frames to write, in order (only if connected; see [`ChatState::on_line`]).
    pub send: Vec<Frame>,
    /// Sends to repeat after a delay (RETRY), by `client_msg_id`.
    pub retry: Vec<(Duration, String)>,
    /// The server asked us to reconnect after this long (`go_away`).
    pub reconnect_after: Option<Duration>,
    /// ... and to another node, at this URL (`go_away.reconnect_url`; `None`: the same).
    pub reconnect_url: Option<String>,
    /// The user asked to leave.
    pub quit: bool,
}

impl Effects {
    fn print(line: impl Into<String>) -> Self {
        Self { print: vec![line.into()], ..Self::default() }
    }
}

/// A send without its final `send_ack` yet.
#[derive(Debug, Clone)]
struct PendingSend {
    /// The frame body, resent as is.
    send: v1::Send,
    /// RETRYs so far.
    retries: u32,
}

/// Where `/history` continues.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HistoryCursor {
    /// The conversation paged.
    conversation: String,
    /// The oldest seq shown so far; the next page ends before it.
    before_seq: u64,
    /// The beginning was reached.
    exhausted: bool,
}

/// Everything the chat client remembers across frames and reconnects.
#[derive(Debug)]
pub struct ChatState {
    /// The logged-in user.
    me: String,
    /// Where plain text goes.
    conversation: Option<String>,
    /// Rooms joined, re-subscribed after a reconnect.
    rooms: BTreeSet<String>,
    /// Sends awaiting their final `send_ack`, in the order typed.
    pending: Vec<(String, PendingSend)>,
    /// Ids of the messages already printed, or sent from here: never printed (again).
    seen_ids: HashSet<u64>,
    /// Highest seq received per conversation: the cursor when a `sync_hint` asks to pull.
    latest_seq: HashMap<String, u64>,
    /// Paging position of `/history`.
    history: Option<HistoryCursor>,
    /// The rid of the next request.
    next_rid: u32,
    /// Print a line for every accepted send too, not only for failures.
    verbose: bool,
}

impl ChatState {
    /// The state of a client for user `me`.
    pub fn new(me: &str, verbose: bool) -> Self {
        Self {
            me: me.to_owned(),
            conversation: None,
            rooms: BTreeSet::new(),
            pending: Vec::new(),
            seen_ids: HashSet::new(),
            latest_seq: HashMap::new(),
            history: None,
            next_rid: 1,
            verbose,
        }
    }

    /// Where plain text goes now.
    pub fn conversation(&self) -> Option<&str> {
        self.conversation.as_deref()
    }

    /// Sends still waiting for their final `send_ack`.
    pub fn pending_sends(&self) -> usize {
        self.pending.len()
    }

    fn rid(&mut self) -> u32 {
        let rid = self.next_rid;
        self.next_rid = self.next_rid.checked_add(1).unwrap_or(1);
        rid
    }

    /// What to do after (re)connecting: join the rooms again, resend what is pending, and
    /// pull anything that arrived meanwhile.
    pub fn on_connected(&mut self) -> Effects {
        let mut effects = Effects::default();
        let rooms: Vec<String> = self.rooms.iter().cloned().collect();
        for room in rooms {
            let rid = self.rid();
            effects.send.push(Frame::new(rid, v1::Subscribe { room, since_seq: None }));
        }
        let sends: Vec<v1::Send> = self.pending.iter().map(|(_, p)| p.send.clone()).collect();
        for send in sends {
            let rid = self.rid();
            effects.send.push(Frame::new(rid, send));
        }
        if !self.pending.is_empty() {
            effects.print.push(format!("(resending {} unacknowledged message(s))", self.pending.len()));
        }
        effects
    }

    /// Handles a typed line. When not `connected`, text is kept and sent after the
    /// reconnect; requests that need an answer now are refused with a note.
    pub fn on_line(&mut self, line: &str, connected: bool) -> Effects {
        match parse_command(line, &self.me) {
            Command::Nothing => Effects::default(),
            Command::Quit => Effects { quit: true, ..Effects::default() },
            Command::Help => Effects::print(HELP),
            Command::Invalid(message) => Effects::print(format!("! {message}")),
            Command::To(conversation) => {
                let note = format!("now talking in {conversation}");
                self.conversation = Some(conversation);
                Effects::print(note)
            }
            Command::Join(room) => {
                self.rooms.insert(room.clone());
                self.conversation = Some(room.clone());
                if !connected {
                    return Effects::print(format!("will join {room} once connected"));
                }
                let rid = self.rid();
                Effects { send: vec![Frame::new(rid, v1::Subscribe { room, since_seq: None })], ..Effects::default() }
            }
            Command::Leave(room) => {
                let room =
                    room.or_else(|| self.conversation.clone().filter(|conversation| conversation.starts_with("room:")));
                let Some(room) = room else {
                    return Effects::print("! /leave which room? You are not in one.");
                };
                self.rooms.remove(&room);
                if self.conversation.as_ref() == Some(&room) {
                    self.conversation = None;
                }
                let mut effects = Effects::print(format!("left {room}"));
                if connected {
                    let rid = self.rid();
                    effects.send.push(Frame::new(rid, v1::Unsubscribe { room }));
                }
                effects
            }
            Command::History(limit) => self.history_request(limit, connected),
            Command::Sync => {
                if !connected {
                    return Effects::print("! not connected; /sync again once connected");
                }
                let rid = self.rid();
                Effects {
                    send: vec![Frame::new(rid, v1::Sync { cursors: Vec::new(), limit: 0 })],
                    ..Effects::default()
                }
            }
            Command::Text(text) => self.send_text(text, connected),
        }
    }

    fn send_text(&mut self, text: String, connected: bool) -> Effects {
        let Some(conversation) = self.conversation.clone() else {
            return Effects::print("! pick a conversation first: /to <user> or /join <room>");
        };
        let client_msg_id = random_uuid();
        let send = v1::Send {
            client_msg_id: client_msg_id.clone(),
            conversation,
            kind: TEXT_KIND,
            body: Bytes::from(text.into_bytes()),
        };
        self.pending.push((client_msg_id, PendingSend { send: send.clone(), retries: 0 }));
        if !connected {
            return Effects::print("(not connected: the message will be sent on reconnect)");
        }
        let rid = self.rid();
        Effects { send: vec![Frame::new(rid, send)], ..Effects::default() }
    }

    fn history_request(&mut self, limit: Option<u32>, connected: bool) -> Effects {
        let Some(conversation) = self.conversation.clone() else {
            return Effects::print("! pick a conversation first: /to <user> or /join <room>");
        };
        if !connected {
            return Effects::print("! not connected; /history again once connected");
        }
        let before_seq = match &self.history {
            Some(cursor) if cursor.conversation == conversation => {
                if cursor.exhausted {
                    return Effects::print(format!("--- no older messages in {conversation} ---"));
                }
                cursor.before_seq
            }
            _ => 0,
        };
        let rid = self.rid();
        Effects {
            send: vec![Frame::new(rid, v1::History { conversation, before_seq, limit: limit.unwrap_or(HISTORY_PAGE) })],
            ..Effects::default()
        }
    }

    /// The frame to resend for a RETRY whose wait is over, if it is still pending.
    pub fn resend(&mut self, client_msg_id: &str) -> Effects {
        let Some(send) =
            self.pending.iter().find(|(id, _)| id == client_msg_id).map(|(_, pending)| pending.send.clone())
        else {
            return Effects::default();
        };
        let rid = self.rid();
        Effects { send: vec![Frame::new(rid, send)], ..Effects::default() }
    }

    /// Handles a frame from the server.
    pub fn on_frame(&mut self, frame: Frame) -> Effects {
        match frame.body {
            Some(Body::Deliver(deliver)) => match deliver.message {
                Some(message) => {
                    let mut effects = Effects::default();
                    effects.send.push(deliver_ack(&message));
                    self.show(&message, "", &mut effects);
                    effects
                }
                None => Effects::default(),
            },
            Some(Body::SendAck(ack)) => self.on_send_ack(ack),
            Some(Body::HistoryReply(reply)) => self.on_history(reply),
            Some(Body::SyncReply(reply)) => self.on_sync(reply),
            Some(Body::Subscribed(subscribed)) => {
                let mut effects =
                    Effects::print(format!("joined {} (latest seq {})", subscribed.room, subscribed.latest_seq));
                for message in &subscribed.messages {
                    self.show(message, "", &mut effects);
                }
                if let Some(last) = subscribed.messages.last() {
                    effects.send.push(deliver_ack(last));
                }
                effects
            }
            Some(Body::SyncHint(hint)) => {
                let seq = self.latest_seq.get(&hint.conversation).copied().unwrap_or(0);
                if hint.latest_seq <= seq {
                    return Effects::default();
                }
                let rid = self.rid();
                Effects {
                    send: vec![Frame::new(
                        rid,
                        v1::Sync { cursors: vec![v1::Cursor { conversation: hint.conversation, seq }], limit: 0 },
                    )],
                    ..Effects::default()
                }
            }
            Some(Body::Ping(ping)) if ping.reply => {
                Effects { send: vec![Frame::new(frame.rid, v1::Pong { time_ms: ping.time_ms })], ..Effects::default() }
            }
            Some(Body::GoAway(go_away)) => {
                let reconnect_url = Some(go_away.reconnect_url).filter(|url| !url.is_empty());
                let to = reconnect_url.as_deref().map(|url| format!(" to {url}")).unwrap_or_default();
                Effects {
                    print: vec![format!(
                        "(server is going away: {}; reconnecting{to} in {} ms)",
                        go_away.reason, go_away.reconnect_after_ms
                    )],
                    reconnect_after: Some(Duration::from_millis(u64::from(go_away.reconnect_after_ms))),
                    reconnect_url,
                    ..Effects::default()
                }
            }
            Some(Body::Error(error)) => {
                Effects::print(format!("! server error {} (request {}): {}", error.code, error.rid, error.message))
            }
            Some(Body::Ping(_) | Body::Pong(_) | Body::Connected(_)) | None => Effects::default(),
            Some(other) => Effects::print(format!("! unexpected {} frame", other.name())),
        }
    }

    fn on_send_ack(&mut self, ack: v1::SendAck) -> Effects {
        let Some(position) = self.pending.iter().position(|(id, _)| *id == ack.client_msg_id) else {
            return Effects::default();
        };
        match ack.status() {
            Status::Ok | Status::Duplicate => {
                self.pending.remove(position);
                // Our own message is now part of the conversation: a sync must not print it.
                self.seen_ids.insert(ack.message_id);
                if self.verbose {
                    Effects::print(format!("(sent to {} as seq {})", ack.conversation, ack.seq))
                } else {
                    Effects::default()
                }
            }
            Status::Retry => {
                let pending = &mut self.pending[position].1;
                pending.retries += 1;
                if pending.retries > MAX_RETRIES {
                    self.pending.remove(position);
                    return Effects::print(format!(
                        "! message to {} NOT sent: server kept asking to retry ({})",
                        ack.conversation, ack.reason
                    ));
                }
                let wait = Duration::from_millis(u64::from(ack.retry_after_ms));
                Effects {
                    print: vec![format!(
                        "(server busy: retrying message to {} in {} ms)",
                        ack.conversation, ack.retry_after_ms
                    )],
                    retry: vec![(wait, ack.client_msg_id)],
                    ..Effects::default()
                }
            }
            Status::Rejected | Status::Unspecified => {
                let (_, pending) = self.pending.remove(position);
                let text = display_body(&pending.send.body, pending.send.kind);
                Effects::print(format!(
                    "! message to {} REJECTED: {} (was: {text})",
                    ack.conversation,
                    if ack.reason.is_empty() { "no reason given" } else { &ack.reason }
                ))
            }
        }
    }

    fn on_history(&mut self, reply: v1::HistoryReply) -> Effects {
        let mut effects = Effects::print(format!("--- history of {} ---", reply.conversation));
        for message in &reply.messages {
            effects.print.push(format_message(message, &format!(" #{}", message.seq)));
        }
        let oldest = reply.messages.first().map(|message| message.seq);
        let before_seq = match (&self.history, oldest) {
            (_, Some(oldest)) => oldest,
            (Some(cursor), None) if cursor.conversation == reply.conversation => cursor.before_seq,
            _ => 0,
        };
        self.history = Some(HistoryCursor {
            conversation: reply.conversation.clone(),
            before_seq,
            exhausted: !reply.has_more || oldest.is_none(),
        });
        effects.print.push(if reply.has_more && oldest.is_some() {
            format!("--- {} messages; /history for older ---", reply.messages.len())
        } else {
            "--- beginning of the conversation ---".to_owned()
        });
        effects
    }

    fn on_sync(&mut self, reply: v1::SyncReply) -> Effects {
        let mut effects = Effects::default();
        let mut again = Vec::new();
        for conversation in reply.conversations {
            for message in &conversation.messages {
                self.show(message, "", &mut effects);
            }
            if let Some(last) = conversation.messages.iter().max_by_key(|m| m.seq) {
                effects.send.push(deliver_ack(last));
            }
            if conversation.latest_seq > conversation.complete_through_seq && !conversation.messages.is_empty() {
                again.push(v1::Cursor {
                    conversation: conversation.conversation,
                    seq: conversation.complete_through_seq,
                });
            }
        }
        if !again.is_empty() {
            let rid = self.rid();
            effects.send.push(Frame::new(rid, v1::Sync { cursors: again, limit: 0 }));
        }
        effects
    }

    /// Prints a message unless it was shown before.
    fn show(&mut self, message: &v1::Message, note: &str, effects: &mut Effects) {
        let latest = self.latest_seq.entry(message.conversation.clone()).or_default();
        *latest = (*latest).max(message.seq);
        if !self.seen_ids.insert(message.id) {
            return;
        }
        effects.print.push(format_message(message, note));
    }
}

/// The cumulative acknowledgement of `message`.
fn deliver_ack(message: &v1::Message) -> Frame {
    Frame::new(0, v1::DeliverAck { conversation: message.conversation.clone(), seq: message.seq })
}

/// `[conversation] sender: text`, with `note` after the conversation.
pub fn format_message(message: &v1::Message, note: &str) -> String {
    format!("[{}{note}] {}: {}", message.conversation, message.sender, display_body(&message.body, message.kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: u64, sender: &str, text: &str) -> v1::Message {
        v1::Message {
            id: 1000 + seq,
            conversation: "dm:alice:bob".to_owned(),
            seq,
            sender: sender.to_owned(),
            sender_device: "cli".to_owned(),
            kind: TEXT_KIND,
            body: Bytes::from(text.to_owned()),
            sent_at_ms: 0,
        }
    }

    fn deliver(seq: u64, text: &str) -> Frame {
        Frame::new(0, v1::Deliver { message: Some(message(seq, "bob", text)), attempt: 1 })
    }

    fn sent(effects: &Effects) -> v1::Send {
        match effects.send.first().and_then(|f| f.body.clone()) {
            Some(Body::Send(send)) => send,
            other => panic!("expected a send, got {other:?}"),
        }
    }

    fn ack(send: &v1::Send, status: Status, seq: u64, reason: &str) -> Frame {
        Frame::new(
            1,
            v1::SendAck {
                client_msg_id: send.client_msg_id.clone(),
                status: status.into(),
                message_id: 77,
                seq,
                conversation: send.conversation.clone(),
                reason: reason.to_owned(),
                retry_after_ms: 10,
            },
        )
    }

    #[test]
    fn text_goes_to_the_current_dm() {
        let mut chat = ChatState::new("alice", false);
        let effects = chat.on_line("hello", true);
        assert!(effects.send.is_empty(), "no conversation yet");
        assert!(effects.print[0].starts_with('!'));
        chat.on_line("/to bob", true);
        let send = sent(&chat.on_line("hello bob", true));
        assert_eq!(send.conversation, "dm:alice:bob");
        assert_eq!(send.body, Bytes::from_static(b"hello bob"));
        assert_eq!(send.kind, TEXT_KIND);
        assert_eq!(send.client_msg_id.len(), 36);
        assert_eq!(chat.pending_sends(), 1);
    }

    #[test]
    fn delivers_are_printed_once_and_always_acked() {
        let mut chat = ChatState::new("alice", false);
        let effects = chat.on_frame(deliver(5, "hi alice"));
        assert_eq!(effects.print, ["[dm:alice:bob] bob: hi alice"]);
        assert_eq!(effects.send, [Frame::new(0, v1::DeliverAck { conversation: "dm:alice:bob".to_owned(), seq: 5 })]);
        let again = chat.on_frame(deliver(5, "hi alice"));
        assert!(again.print.is_empty(), "a redelivery is not printed twice");
        assert_eq!(again.send.len(), 1, "but it is acknowledged again");
    }

    #[test]
    fn send_acks_settle_or_explain() {
        let mut chat = ChatState::new("alice", false);
        chat.on_line("/to bob", true);
        let send = sent(&chat.on_line("one", true));
        assert_eq!(chat.on_frame(ack(&send, Status::Ok, 3, "")), Effects::default());
        assert_eq!(chat.pending_sends(), 0);

        let send = sent(&chat.on_line("two", true));
        let effects = chat.on_frame(ack(&send, Status::Rejected, 0, "too long"));
        assert_eq!(chat.pending_sends(), 0);
        assert!(effects.print[0].contains("REJECTED: too long"), "{:?}", effects.print);

        let send = sent(&chat.on_line("three", true));
        let effects = chat.on_frame(ack(&send, Status::Retry, 0, "busy"));
        assert_eq!(effects.retry, [(Duration::from_millis(10), send.client_msg_id.clone())]);
        let resent = sent(&chat.resend(&send.client_msg_id));
        assert_eq!(resent.client_msg_id, send.client_msg_id, "same id on resend");
    }

    #[test]
    fn pending_sends_are_resent_after_reconnect() {
        let mut chat = ChatState::new("alice", false);
        chat.on_line("/join lobby", false);
        let offline = chat.on_line("queued", false);
        assert!(offline.send.is_empty());
        let effects = chat.on_connected();
        let bodies: Vec<&str> = effects.send.iter().map(|f| f.body.as_ref().map_or("none", Body::name)).collect();
        assert_eq!(bodies, ["subscribe", "send"]);
    }

    #[test]
    fn history_pages_backwards() {
        let mut chat = ChatState::new("alice", false);
        chat.on_line("/to bob", true);
        let first = chat.on_line("/history 2", true);
        let Some(Body::History(history)) = first.send[0].body.clone() else {
            panic!("expected history");
        };
        assert_eq!((history.before_seq, history.limit), (0, 2));
        let reply = v1::HistoryReply {
            conversation: "dm:alice:bob".to_owned(),
            messages: vec![message(8, "bob", "b"), message(9, "alice", "c")],
            has_more: true,
        };
        let shown = chat.on_frame(Frame::new(1, reply));
        assert_eq!(shown.print[1], "[dm:alice:bob #8] bob: b");
        let next = chat.on_line("/history", true);
        let Some(Body::History(history)) = next.send[0].body.clone() else {
            panic!("expected history");
        };
        assert_eq!(history.before_seq, 8);
        let end = v1::HistoryReply {
            conversation: "dm:alice:bob".to_owned(),
            messages: vec![message(1, "bob", "a")],
            has_more: false,
        };
        chat.on_frame(Frame::new(2, end));
        let done = chat.on_line("/history", true);
        assert!(done.send.is_empty());
    }

    #[test]
    fn pings_that_ask_are_answered_with_the_same_rid() {
        let mut chat = ChatState::new("alice", false);
        let effects = chat.on_frame(Frame::new(9, v1::Ping { time_ms: 5, reply: true }));
        assert_eq!(effects.send, [Frame::new(9, v1::Pong { time_ms: 5 })]);
        let plain = chat.on_frame(Frame::new(0, v1::Ping { time_ms: 6, reply: false }));
        assert!(plain.send.is_empty() && plain.print.is_empty(), "a plain ping needs no answer: {plain:?}");
    }

    #[test]
    fn go_away_naming_another_node_reconnects_there() {
        let mut chat = ChatState::new("alice", false);
        let away = |url: &str| {
            Frame::new(
                0,
                v1::GoAway { reason: "draining".to_owned(), reconnect_after_ms: 250, reconnect_url: url.to_owned() },
            )
        };

        let elsewhere = chat.on_frame(away("ws://127.0.0.1:7080/v1/ws"));
        assert_eq!(elsewhere.reconnect_after, Some(Duration::from_millis(250)));
        assert_eq!(elsewhere.reconnect_url.as_deref(), Some("ws://127.0.0.1:7080/v1/ws"));
        assert!(elsewhere.print[0].contains("to ws://127.0.0.1:7080/v1/ws"), "{:?}", elsewhere.print);

        let same = chat.on_frame(away(""));
        assert_eq!(same.reconnect_url, None, "no URL: the same server");
    }
}

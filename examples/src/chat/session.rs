//! What `herald-chat` does with a typed line and with the client's events. The protocol
//! work is the `herald-client` library's; this module turns lines into its calls and its
//! events into lines for the terminal.
//!
//! Typed messages are sent one after another, each awaited, so they are stored in the order
//! typed (the library would keep call order too, but a task per line would not). Output
//! from the tasks the session starts (send outcomes, history pages) goes through the
//! `Printer`, so the binary prints from one place.

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use herald_client::{Client, Event, Message, SendError, SendOptions, State};
use tokio::{sync::mpsc, task::JoinHandle};

use super::command::{Command, HELP, display_body, parse_command};

/// The `kind` of chat text messages (app-defined; the web page uses the same).
pub const TEXT_KIND: u32 = 1;
/// Default page size of `/history`.
pub const HISTORY_PAGE: u32 = 20;

/// Lines for the terminal, in the order they should appear.
pub type Printer = mpsc::UnboundedSender<String>;

/// Whether the chat goes on after a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// The user asked to leave.
    Quit,
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

/// One user's chat on one client.
#[derive(Debug)]
pub struct ChatSession {
    /// The library's client, shared with the tasks below.
    client: Client,
    /// The logged-in user, for `/to` and dm names.
    me: String,
    /// Where plain text goes.
    conversation: Option<String>,
    /// Where `/history` continues; written by the task that prints a page.
    history: Arc<Mutex<Option<HistoryCursor>>>,
    /// Typed messages for the sending task, in order.
    texts: Option<mpsc::UnboundedSender<(String, String)>>,
    /// Typed messages not yet stored (queued or awaiting their answer).
    unsettled: Arc<AtomicUsize>,
    /// The task that sends the typed messages one after another.
    sender: Option<JoinHandle<()>>,
    /// Where lines go.
    printer: Printer,
}

impl ChatSession {
    /// A chat for `me` on `client`; `verbose` also prints a line per stored send.
    pub fn new(client: Client, me: &str, verbose: bool, printer: Printer) -> Self {
        let (texts, queue) = mpsc::unbounded_channel();
        let unsettled = Arc::new(AtomicUsize::new(0));
        let sender =
            tokio::spawn(send_in_order(client.clone(), queue, Arc::clone(&unsettled), printer.clone(), verbose));
        Self {
            client,
            me: me.to_owned(),
            conversation: None,
            history: Arc::new(Mutex::new(None)),
            texts: Some(texts),
            unsettled,
            sender: Some(sender),
            printer,
        }
    }

    /// Where plain text goes now.
    pub fn conversation(&self) -> Option<&str> {
        self.conversation.as_deref()
    }

    /// Typed messages not yet stored.
    pub fn unsettled(&self) -> usize {
        self.unsettled.load(Ordering::SeqCst)
    }

    fn print(&self, line: impl Into<String>) {
        let _ = self.printer.send(line.into());
    }

    /// Acts on a typed line.
    pub fn on_line(&mut self, line: &str) -> Flow {
        match parse_command(line, &self.me) {
            Command::Nothing => {}
            Command::Quit => return Flow::Quit,
            Command::Help => self.print(HELP),
            Command::Invalid(message) => self.print(format!("! {message}")),
            Command::To(conversation) => {
                self.print(format!("now talking in {conversation}"));
                self.conversation = Some(conversation);
            }
            Command::Join(room) => {
                self.conversation = Some(room.clone());
                self.join(room);
            }
            Command::Leave(room) => {
                let room =
                    room.or_else(|| self.conversation.clone().filter(|conversation| conversation.starts_with("room:")));
                let Some(room) = room else {
                    self.print("! /leave which room? You are not in one.");
                    return Flow::Continue;
                };
                self.client.unsubscribe(&room);
                if self.conversation.as_ref() == Some(&room) {
                    self.conversation = None;
                }
                self.print(format!("left {room}"));
            }
            Command::History(limit) => self.history(limit),
            Command::Sync => self.sync(),
            Command::Text(text) => self.send_text(text),
        }
        Flow::Continue
    }

    /// Joins `room` for the life of the client: the library joins it again after every
    /// reconnect, from the last seq seen.
    fn join(&self, room: String) {
        if self.client.state() != State::Connected {
            self.print(format!("will join {room} once connected"));
        }
        let (client, printer) = (self.client.clone(), self.printer.clone());
        tokio::spawn(async move {
            let line = match client.subscribe(&room).await {
                Ok(joined) => format!("joined {} (latest seq {})", joined.room, joined.latest_seq),
                Err(error) => format!("! could not join {room}: {error}"),
            };
            let _ = printer.send(line);
        });
    }

    fn send_text(&mut self, text: String) {
        let Some(conversation) = self.conversation.clone() else {
            self.print("! pick a conversation first: /to <user> or /join <room>");
            return;
        };
        let Some(texts) = &self.texts else { return };
        if self.client.state() != State::Connected {
            self.print("(not connected: the message will be sent on reconnect)");
        }
        self.unsettled.fetch_add(1, Ordering::SeqCst);
        if texts.send((conversation, text)).is_err() {
            self.unsettled.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn history(&self, limit: Option<u32>) {
        let Some(conversation) = self.conversation.clone() else {
            self.print("! pick a conversation first: /to <user> or /join <room>");
            return;
        };
        let before_seq = match &*self.history.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(cursor) if cursor.conversation == conversation => {
                if cursor.exhausted {
                    self.print(format!("--- no older messages in {conversation} ---"));
                    return;
                }
                cursor.before_seq
            }
            _ => 0,
        };
        let (client, printer, cursor) = (self.client.clone(), self.printer.clone(), Arc::clone(&self.history));
        tokio::spawn(async move {
            let page = match client.history(&conversation, before_seq, limit.unwrap_or(HISTORY_PAGE)).await {
                Ok(page) => page,
                Err(error) => {
                    let _ = printer.send(format!("! history of {conversation}: {error}"));
                    return;
                }
            };
            let _ = printer.send(format!("--- history of {} ---", page.conversation));
            for message in &page.messages {
                let _ = printer.send(format_message(message, &format!(" #{}", message.seq)));
            }
            let oldest = page.messages.first().map(|message| message.seq);
            let _ = printer.send(if page.has_more && oldest.is_some() {
                format!("--- {} messages; /history for older ---", page.messages.len())
            } else {
                "--- beginning of the conversation ---".to_owned()
            });
            *cursor.lock().unwrap_or_else(PoisonError::into_inner) = Some(HistoryCursor {
                conversation: page.conversation,
                before_seq: oldest.unwrap_or(before_seq),
                exhausted: !page.has_more || oldest.is_none(),
            });
        });
    }

    /// Shows what the server holds for this device and it has not acknowledged. The
    /// messages also arrive as usual (they are pushed again); this only lists them.
    fn sync(&self) {
        let (client, printer) = (self.client.clone(), self.printer.clone());
        tokio::spawn(async move {
            match client.sync(Vec::new(), 0).await {
                Ok(conversations) => {
                    let count: usize = conversations.iter().map(|c| c.messages.len()).sum();
                    let _ = printer.send(format!("--- sync: {count} message(s) not acknowledged ---"));
                    for message in conversations.iter().flat_map(|c| &c.messages) {
                        let _ = printer.send(format_message(message, &format!(" #{}", message.seq)));
                    }
                }
                Err(error) => {
                    let _ = printer.send(format!("! sync: {error}"));
                }
            }
        });
    }

    /// Leaves: waits up to `grace` for the typed messages to be stored, then closes the
    /// client (a message still unsettled is abandoned: it may or may not be stored).
    /// Returns how many were not stored in time. Read the client's events meanwhile.
    pub async fn finish(&mut self, grace: Duration) -> usize {
        self.texts = None;
        if let Some(sender) = self.sender.as_mut()
            && tokio::time::timeout(grace, sender).await.is_ok()
        {
            // Done: a finished task's handle must not be awaited again.
            self.sender = None;
        }
        let unsettled = self.unsettled();
        self.client.close().await;
        if let Some(sender) = self.sender.take() {
            // The close settled whatever was left (abandoned); the task prints that and ends.
            let _ = sender.await;
        }
        unsettled
    }
}

/// Sends each typed message and waits for it to be stored before the next; prints the
/// outcomes that need the user's attention.
async fn send_in_order(
    client: Client,
    mut texts: mpsc::UnboundedReceiver<(String, String)>,
    unsettled: Arc<AtomicUsize>,
    printer: Printer,
    verbose: bool,
) {
    while let Some((conversation, text)) = texts.recv().await {
        let options = SendOptions { kind: TEXT_KIND, ..SendOptions::default() };
        let line = match client.send(conversation.clone(), text.clone(), options).await {
            Ok(sent) => verbose.then(|| format!("(sent to {} as seq {})", sent.conversation, sent.seq)),
            Err(SendError::Rejected { reason, .. }) => {
                let reason = if reason.is_empty() { "no reason given".to_owned() } else { reason };
                Some(format!("! message to {conversation} REJECTED: {reason} (was: {text})"))
            }
            Err(other) => Some(format!("! message to {conversation} NOT sent: {other} (was: {text})")),
        };
        unsettled.fetch_sub(1, Ordering::SeqCst);
        if let Some(line) = line {
            let _ = printer.send(line);
        }
    }
}

/// The lines an event prints (none for most state changes).
pub fn describe_event(event: &Event) -> Vec<String> {
    match event {
        Event::Message(delivery) => vec![format_message(delivery, "")],
        Event::Connected(info) => vec![format!(
            "connected to {} as {} (device {}); type /help for commands",
            info.url, info.user_id, info.device_id
        )],
        Event::Disconnected(info) => {
            let reason = if info.reason.is_empty() { String::new() } else { format!(": {}", info.reason) };
            match (info.reconnect_in, info.code) {
                (Some(wait), code) => {
                    vec![format!("(disconnected ({code}{reason}); reconnecting in {:.1}s)", wait.as_secs_f64())]
                }
                (None, 4001) => vec![format!(
                    "! the server refused the token (4001{reason}); for a --dev server use dev:<user>, \
                     otherwise pass --token"
                )],
                (None, 4003) => vec![format!("! not allowed to connect (4003{reason})")],
                (None, 4009) => {
                    vec![
                        "! kicked (4009): the same user and device connected elsewhere; use another --device"
                            .to_owned(),
                    ]
                }
                (None, 1000) => Vec::new(),
                (None, code) => vec![format!("! disconnected for good ({code}{reason})")],
            }
        }
        Event::Resumed(info) => vec![format!(
            "(back after {:.1}s: {} message(s) resent, {} room(s) caught up)",
            info.offline.as_secs_f64(),
            info.resent_sends,
            info.rooms
        )],
        Event::GoAway(info) => {
            let to = info.reconnect_url.as_deref().map(|url| format!(" to {url}")).unwrap_or_default();
            vec![format!("(server is going away: {}; reconnecting{to} in {} ms)", info.reason, info.reconnect_after_ms)]
        }
        Event::Retry(info) => {
            vec![format!("(server busy: retrying message to {} in {} ms)", info.conversation, info.retry_after_ms)]
        }
        Event::Error(error) => vec![format!("! {error}")],
        Event::State(_) => Vec::new(),
    }
}

/// `[conversation] sender: text`, with `note` after the conversation.
pub fn format_message(message: &Message, note: &str) -> String {
    format!("[{}{note}] {}: {}", message.conversation, message.sender, display_body(&message.body, message.kind))
}

#[cfg(test)]
mod tests {
    use herald_client::{ConnectedInfo, DisconnectedInfo, GoAwayInfo};

    use super::*;

    fn message(seq: u64, sender: &str, text: &str) -> Message {
        Message {
            id: 1000 + seq,
            conversation: "dm:alice:bob".to_owned(),
            seq,
            sender: sender.to_owned(),
            sender_device: "cli".to_owned(),
            kind: TEXT_KIND,
            body: text.as_bytes().to_vec().into(),
            sent_at_ms: 0,
        }
    }

    #[test]
    fn messages_print_as_conversation_sender_text() {
        assert_eq!(format_message(&message(3, "bob", "hi"), ""), "[dm:alice:bob] bob: hi");
        assert_eq!(format_message(&message(3, "bob", "hi"), " #3"), "[dm:alice:bob #3] bob: hi");
    }

    #[test]
    fn connection_events_say_what_happens_next() {
        let connected = Event::Connected(ConnectedInfo {
            user_id: "alice".to_owned(),
            device_id: "cli".to_owned(),
            node_id: 1,
            session_id: "s".to_owned(),
            heartbeat_ms: 12_000,
            url: "ws://127.0.0.1:7070/v1/ws".to_owned(),
            reconnect: false,
        });
        assert_eq!(
            describe_event(&connected),
            ["connected to ws://127.0.0.1:7070/v1/ws as alice (device cli); type /help for commands"]
        );
        let lost = Event::Disconnected(DisconnectedInfo {
            code: 1006,
            reason: String::new(),
            was_connected: true,
            reconnect_in: Some(Duration::from_millis(1500)),
        });
        assert_eq!(describe_event(&lost), ["(disconnected (1006); reconnecting in 1.5s)"]);
        let kicked = Event::Disconnected(DisconnectedInfo {
            code: 4009,
            reason: "replaced".to_owned(),
            was_connected: true,
            reconnect_in: None,
        });
        assert!(describe_event(&kicked)[0].starts_with("! kicked (4009)"));
        let going = Event::GoAway(GoAwayInfo {
            reason: "draining".to_owned(),
            reconnect_after_ms: 300,
            reconnect_url: Some("ws://127.0.0.1:7071/v1/ws".to_owned()),
        });
        assert_eq!(
            describe_event(&going),
            ["(server is going away: draining; reconnecting to ws://127.0.0.1:7071/v1/ws in 300 ms)"]
        );
        assert!(describe_event(&Event::State(State::Connecting)).is_empty());
    }
}

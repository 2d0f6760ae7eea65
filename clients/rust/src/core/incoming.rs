//! Incoming messages: ordered per conversation, gaps pulled with `sync`, handed to the
//! application once each, stored and acked after it handled them.

use std::collections::VecDeque;
use std::time::Duration;

use crate::wire::v1;
use tokio::time::Instant;

use super::{Command, Core, Request, Waiter, fail_request};
use crate::error::ClientError;
use crate::options::AckMode;
use crate::order::{ConversationOrder, Release};
use crate::types::{Delivery, Event, HandledGuard, HistoryPage, Message, State, Subscribed, SyncedConversation};

/// Longest wait between pulls of a gap the server cannot close yet (seqs still in flight).
const MAX_PULL_DELAY: Duration = Duration::from_secs(5);

pub(crate) struct Conversation {
    room: bool,
    pub(super) order: ConversationOrder<Message>,
    /// The last position handled and stored.
    handled: Option<u64>,
    /// Auto acks: released positions in seq order, and whether each was handled yet.
    unhandled: VecDeque<(u64, bool)>,
    pub(super) pulling: bool,
    /// When the gap is pulled if the cursor has not moved from `gap_cursor` by then.
    pub(super) gap_at: Option<Instant>,
    gap_cursor: Option<u64>,
    pull_delay: Duration,
}

impl Core {
    pub(super) fn conversation(&mut self, name: &str) -> &mut Conversation {
        if !self.conversations.contains_key(name) {
            let room = name.starts_with("room:");
            let stored = self.options.store.get(&self.store_key(name));
            let conversation = Conversation {
                room,
                // Direct and group conversations start where the server's pushes start (its
                // cursor of this device); rooms start at `subscribed`.
                order: ConversationOrder::new(stored, !room),
                handled: stored,
                unhandled: VecDeque::new(),
                pulling: false,
                gap_at: None,
                gap_cursor: None,
                pull_delay: self.options.gap_timeout,
            };
            self.conversations.insert(name.to_owned(), conversation);
        }
        self.conversations.get_mut(name).expect("inserted above")
    }

    fn store_key(&self, conversation: &str) -> String {
        let user = self.info.as_ref().map_or("", |info| info.user_id.as_str());
        format!("{user}/{}/{conversation}", self.options.device_id)
    }

    fn is_own(&self, message: &Message) -> bool {
        self.info.as_ref().is_some_and(|info| message.sender == info.user_id && message.sender_device == info.device_id)
    }

    pub(super) fn on_incoming(&mut self, wire: v1::Message) {
        let message = Message::from(wire);
        let name = message.conversation.clone();
        if message.seq == 0 {
            // An announcement that was not archived has no place in the order: emit it as it comes.
            self.emit(Event::Message(Delivery { message, handled: None }));
            return;
        }
        let own = self.is_own(&message);
        let conversation = self.conversation(&name);
        match conversation.order.offer(message.seq, message, own) {
            Some(released) => {
                self.release(&name, released);
                self.check_gap(&name);
            }
            None => {
                // A redelivery: our ack was lost with a connection. Acknowledge again.
                if let Some(handled) = conversation.handled.filter(|_| !conversation.room) {
                    self.queue_ack(&name, handled);
                }
            }
        }
    }

    /// This device's send was stored at `seq`: its place is taken, not a gap.
    pub(super) fn own_stored(&mut self, name: &str, seq: u64) {
        let released = self.conversation(name).order.mark_own(seq);
        self.release(name, released);
        self.check_gap(name);
    }

    pub(super) fn on_subscribed(&mut self, rid: u32, subscribed: v1::Subscribed) {
        self.room_rids.remove(&rid);
        let room = subscribed.room;
        let mut released = Vec::new();
        let conversation = self.conversation(&room);
        if conversation.order.cursor.is_none() {
            released.extend(conversation.order.set_baseline(subscribed.latest_seq));
        }
        let messages: Vec<(Message, bool)> = subscribed
            .messages
            .into_iter()
            .map(|wire| {
                let message = Message::from(wire);
                let own = self.is_own(&message);
                (message, own)
            })
            .collect();
        let order = &mut self.conversation(&room).order;
        for (message, own) in messages {
            released.extend(order.offer(message.seq, message, own).unwrap_or_default());
        }
        order.raise_target(subscribed.latest_seq);
        self.release(&room, released);
        self.check_gap(&room);
        for waiter in self.rooms.get_mut(&room).map(std::mem::take).unwrap_or_default() {
            let _ = waiter.send(Ok(Subscribed { room: room.clone(), latest_seq: subscribed.latest_seq }));
        }
        if let Some(resuming) = &mut self.resuming {
            resuming.rooms.remove(&room);
        }
        self.maybe_resumed();
    }

    pub(super) fn on_sync_hint(&mut self, name: &str, latest_seq: u64) {
        let order = &mut self.conversation(name).order;
        // Nothing known of it: start just before the hinted message rather than replay it all.
        let released =
            if order.cursor.is_none() { order.set_baseline(latest_seq.saturating_sub(1)) } else { Vec::new() };
        order.raise_target(latest_seq);
        let lacking = order.lacking();
        self.release(name, released);
        if lacking {
            self.pull(name);
        }
    }

    pub(super) fn on_history_reply(&mut self, rid: u32, reply: v1::HistoryReply) {
        let Some(request) = self.requests.remove(&rid) else {
            return;
        };
        match request.waiter {
            Waiter::History(waiter) => {
                let page = HistoryPage {
                    conversation: reply.conversation,
                    messages: reply.messages.into_iter().map(Message::from).collect(),
                    has_more: reply.has_more,
                };
                let _ = waiter.send(Ok(page));
            }
            waiter => {
                let error = ClientError::Protocol("expected sync_reply, got history_reply".to_owned());
                fail_request(Request { body: request.body, waiter }, &error);
            }
        }
    }

    pub(super) fn on_sync_reply(&mut self, rid: u32, reply: v1::SyncReply) {
        let Some(request) = self.requests.remove(&rid) else {
            return;
        };
        match request.waiter {
            Waiter::Sync(waiter) => {
                let conversations = reply
                    .conversations
                    .into_iter()
                    .map(|entry| SyncedConversation {
                        conversation: entry.conversation,
                        messages: entry.messages.into_iter().map(Message::from).collect(),
                        complete_through_seq: entry.complete_through_seq,
                        latest_seq: entry.latest_seq,
                    })
                    .collect();
                let _ = waiter.send(Ok(conversations));
            }
            Waiter::History(waiter) => {
                let _ = waiter.send(Err(ClientError::Protocol("expected history_reply, got sync_reply".to_owned())));
            }
            Waiter::Probe => {
                for entry in reply.conversations {
                    self.apply_sync(entry, true);
                }
                if let Some(resuming) = &mut self.resuming {
                    resuming.probe = false;
                }
                self.maybe_resumed();
            }
            Waiter::Pull { conversation: name, from } => {
                let conversation = self.conversation(&name);
                conversation.pulling = false;
                if let Some(entry) = reply.conversations.into_iter().find(|entry| entry.conversation == name) {
                    self.apply_sync(entry, false);
                }
                let gap_timeout = self.options.gap_timeout;
                let conversation = self.conversation(&name);
                let progressed = conversation.order.cursor.unwrap_or(0) > from;
                if !conversation.order.lacking() {
                    return;
                }
                if progressed {
                    conversation.pull_delay = gap_timeout;
                    self.pull(&name);
                } else {
                    // Seqs still being stored on the server: ask again later, less and less often.
                    conversation.pull_delay = (conversation.pull_delay * 2).min(MAX_PULL_DELAY);
                    self.check_gap(&name);
                }
            }
        }
    }

    /// Applies one conversation of a sync reply. `from_server_cursor`: the reply started at
    /// the server's cursor of this device (the probe), so its completeness says nothing
    /// about ours unless we had no position of our own.
    fn apply_sync(&mut self, entry: v1::ConversationSync, from_server_cursor: bool) {
        let name = entry.conversation;
        let messages: Vec<(Message, bool)> = entry
            .messages
            .into_iter()
            .map(|wire| {
                let message = Message::from(wire);
                let own = self.is_own(&message);
                (message, own)
            })
            .collect();
        let order = &mut self.conversation(&name).order;
        let mut released = Vec::new();
        let trust_complete = !from_server_cursor || order.cursor.is_none();
        if order.cursor.is_none() {
            let start = messages.first().map_or(entry.complete_through_seq, |(first, _)| first.seq.saturating_sub(1));
            released.extend(order.set_baseline(start));
        }
        for (message, own) in messages {
            released.extend(order.offer(message.seq, message, own).unwrap_or_default());
        }
        order.raise_target(entry.latest_seq);
        if trust_complete {
            released.extend(order.complete_through(entry.complete_through_seq));
        }
        self.release(&name, released);
        self.check_gap(&name);
    }

    /// Arms the gap timer of a conversation that lacks something, or disarms it.
    pub(super) fn check_gap(&mut self, name: &str) {
        let connected = self.state == State::Connected;
        let gap_timeout = self.options.gap_timeout;
        let conversation = self.conversation(name);
        if !conversation.order.lacking() {
            conversation.gap_at = None;
            conversation.pull_delay = gap_timeout;
            return;
        }
        if conversation.pulling || conversation.gap_at.is_some() || !connected {
            return;
        }
        // Wait a moment first: the missing message is often our own send's ack, or a push on its way.
        conversation.gap_cursor = conversation.order.cursor;
        conversation.gap_at = Some(Instant::now() + conversation.pull_delay);
    }

    pub(super) fn gap_timers(&mut self, now: Instant) {
        let due: Vec<String> = self
            .conversations
            .iter()
            .filter(|(_, conversation)| conversation.gap_at.is_some_and(|at| at <= now))
            .map(|(name, _)| name.clone())
            .collect();
        for name in due {
            let conversation = self.conversation(&name);
            conversation.gap_at = None;
            if conversation.order.cursor != conversation.gap_cursor {
                self.check_gap(&name);
            } else if conversation.order.lacking() {
                self.pull(&name);
            }
        }
    }

    /// Pulls what follows the cursor with `sync`, until the gap is closed.
    fn pull(&mut self, name: &str) {
        let connected = self.state == State::Connected;
        let conversation = self.conversation(name);
        let Some(from) = conversation.order.cursor else {
            return;
        };
        if !connected || conversation.pulling {
            return;
        }
        conversation.gap_at = None;
        conversation.pulling = true;
        let cursors = vec![v1::Cursor { conversation: name.to_owned(), seq: from }];
        let body = v1::Sync { cursors, limit: 0 }.into();
        self.transmit_request(Request { body, waiter: Waiter::Pull { conversation: name.to_owned(), from } });
    }

    pub(super) fn pull_failed(&mut self, name: &str, error: ClientError) {
        let conversation = self.conversation(name);
        conversation.pulling = false;
        if matches!(&error, ClientError::Server { code, .. } if code != "unavailable") {
            // It cannot be read (no longer a member, say): stop waiting, release what we hold.
            let released = conversation.order.release_all();
            self.emit(Event::Error(error));
            self.release(name, released);
        } else {
            conversation.pull_delay = (conversation.pull_delay * 2).min(MAX_PULL_DELAY);
            self.check_gap(name);
        }
    }

    /// Hands released messages to the application, in order; skipped seqs count as handled.
    fn release(&mut self, name: &str, released: Vec<Release<Message>>) {
        if released.is_empty() {
            return;
        }
        let auto = self.options.ack == AckMode::Auto;
        for step in released {
            match step.message {
                Some(message) => {
                    let handled = self.commands.upgrade().filter(|_| auto).map(|commands| {
                        let (conversation, seq) = (name.to_owned(), step.seq);
                        // A closed client has no use for the report any more.
                        HandledGuard::new(move || drop(commands.send(Command::Handled { conversation, seq })))
                    });
                    if handled.is_some() {
                        self.conversation(name).unhandled.push_back((step.seq, false));
                    }
                    self.emit(Event::Message(Delivery { message, handled }));
                }
                // In manual mode the app says when a message is handled; skipped seqs wait for that.
                None if auto => self.conversation(name).unhandled.push_back((step.seq, true)),
                None => {}
            }
        }
        self.advance(name);
    }

    /// Stores and acks the handled prefix of what was released.
    fn advance(&mut self, name: &str) {
        let conversation = self.conversation(name);
        let mut last = None;
        while let Some((seq, true)) = conversation.unhandled.front().copied() {
            conversation.unhandled.pop_front();
            last = Some(seq);
        }
        if let Some(seq) = last {
            self.mark_handled(name, seq);
        }
    }

    /// Deliveries handed to the application and not yet handled (dropped).
    pub(super) fn deliveries_in_hand(&self) -> bool {
        self.conversations.values().any(|conversation| conversation.unhandled.iter().any(|(_, handled)| !handled))
    }

    pub(super) fn delivery_handled(&mut self, name: &str, seq: u64) {
        let Some(conversation) = self.conversations.get_mut(name) else {
            return;
        };
        if let Some(entry) = conversation.unhandled.iter_mut().find(|(at, _)| *at == seq) {
            entry.1 = true;
            self.advance(name);
        }
    }

    /// Manual acks: `seq` and everything before it in the conversation are handled.
    pub(super) fn manual_ack(&mut self, name: &str, seq: u64) {
        let Some(cursor) = self.conversations.get(name).and_then(|conversation| conversation.order.cursor) else {
            return;
        };
        if seq > 0 {
            self.mark_handled(name, seq.min(cursor));
        }
    }

    fn mark_handled(&mut self, name: &str, seq: u64) {
        let key = self.store_key(name);
        let conversation = self.conversation(name);
        if conversation.handled.is_some_and(|handled| seq <= handled) {
            return;
        }
        conversation.handled = Some(seq);
        let room = conversation.room;
        self.options.store.set(&key, seq);
        // Rooms are pushed once and never redelivered: no ack (it would only cost a cursor write).
        if !room {
            self.queue_ack(name, seq);
        }
    }

    fn queue_ack(&mut self, name: &str, seq: u64) {
        self.ack_due.insert(name.to_owned(), seq);
        if self.ack_at.is_none() {
            self.ack_at = Some(Instant::now() + self.options.ack_delay);
        }
    }

    /// Writes the acks due (cumulative, one per conversation); kept for later when offline.
    pub(super) fn flush_acks(&mut self) {
        self.ack_at = None;
        if !self.socket_open || self.info.is_none() || self.state != State::Connected {
            return;
        }
        for (conversation, seq) in std::mem::take(&mut self.ack_due) {
            self.transmit(v1::DeliverAck { conversation, seq }.into(), 0);
        }
    }
}

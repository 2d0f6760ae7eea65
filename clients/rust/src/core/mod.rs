//! The client's state machine: every decision of SPEC.md, without any I/O.
//!
//! The driver (`driver.rs`) owns the socket and the clock's waits; it feeds this core the
//! application's commands, the server's frames, timer expiries and socket closes, and writes
//! out whatever frames the core queued in its outbox. Keeping the core free of I/O keeps
//! the rules (what is resent, when a gap is pulled, when acks go out) in one place.
//!
//! Invariant: frames are queued only while a socket is open; everything that must survive a
//! lost connection (pending sends, rooms, requests of the application, acks) is kept here
//! and queued again on the next `connected`.

mod connection;
mod incoming;
mod sends;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::wire::v1::{self, frame::Body};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::error::{ClientError, SendError};
use crate::options::{AckMode, ClientOptions};
use crate::pacing::{FrameBudget, SendWindow};
use crate::types::{
    ConnectedInfo, DisconnectedInfo, Event, GoAwayInfo, HistoryPage, Sent, State, Subscribed, SyncedConversation,
};

pub(crate) use incoming::Conversation;
use sends::PendingSend;

/// Close code for a socket the client dropped itself (silent server, timeout).
pub(crate) const CLIENT_DROP: u16 = 4000;
/// Close code reported for a socket that ended without a close frame.
pub(crate) const ABNORMAL: u16 = 1006;
/// A connection that held this long counts as good: the backoff starts over after it.
const STABLE_AFTER: Duration = Duration::from_secs(5);
/// The server writes within `heartbeat_ms`; the margin for the network (PROTOCOL.md).
const HEARTBEAT_MARGIN: Duration = Duration::from_secs(3);
/// After `go_away`, how long the server's close may take before the client drops the socket.
const GO_AWAY_CLOSE_WAIT: Duration = Duration::from_secs(2);

/// What the application (through [`Client`](crate::Client)) asks of the driver.
pub(crate) enum Command {
    Send {
        conversation: String,
        kind: u32,
        body: bytes::Bytes,
        client_msg_id: String,
        timeout: Option<Duration>,
        reply: oneshot::Sender<Result<Sent, SendError>>,
    },
    Subscribe {
        room: String,
        reply: oneshot::Sender<Result<Subscribed, ClientError>>,
    },
    Unsubscribe {
        room: String,
    },
    History {
        conversation: String,
        before_seq: u64,
        limit: u32,
        reply: oneshot::Sender<Result<HistoryPage, ClientError>>,
    },
    Sync {
        cursors: Vec<(String, u64)>,
        limit: u32,
        reply: oneshot::Sender<Result<Vec<SyncedConversation>, ClientError>>,
    },
    /// Manual acks: everything up to `seq` is handled.
    Ack {
        conversation: String,
        seq: u64,
    },
    /// A delivery was dropped (auto acks).
    Handled {
        conversation: String,
        seq: u64,
    },
    Close {
        done: oneshot::Sender<()>,
    },
}

/// Who waits for a request's reply.
pub(crate) enum Waiter {
    History(oneshot::Sender<Result<HistoryPage, ClientError>>),
    Sync(oneshot::Sender<Result<Vec<SyncedConversation>, ClientError>>),
    /// The catch-up probe after `connected`.
    Probe,
    /// A gap pull of one conversation from a cursor.
    Pull {
        conversation: String,
        from: u64,
    },
}

/// A request: its frame body (kept to write it again after a reconnect) and its waiter.
pub(crate) struct Request {
    body: Body,
    waiter: Waiter,
}

impl Request {
    /// The application's reads are written again after a reconnect; internal ones re-arm.
    fn resend(&self) -> bool {
        matches!(self.waiter, Waiter::History(_) | Waiter::Sync(_))
    }
}

/// A reconnect under way: `resumed` waits for the rooms and the probe.
struct Resuming {
    offline: Duration,
    resent_sends: usize,
    rooms: std::collections::BTreeSet<String>,
    probe: bool,
    room_count: usize,
}

pub(crate) struct Core {
    pub(crate) options: ClientOptions,
    events: mpsc::UnboundedSender<Event>,
    /// The state, for [`Client::state`](crate::Client::state).
    state_watch: watch::Sender<State>,
    /// For the handled guards of deliveries. Weak: once the application dropped every
    /// handle (and every delivery), the driver's queue ends and the client closes.
    commands: mpsc::WeakUnboundedSender<Command>,
    state: State,
    info: Option<ConnectedInfo>,
    ever_connected: bool,
    /// Where the next attempt goes (a `go_away` may have named another node).
    url: String,
    token: Option<String>,
    token_expired: bool,
    auth_failures: u32,
    go_away: Option<GoAwayInfo>,
    backoff: Backoff,
    /// When the next attempt may start (while reconnecting).
    pub(crate) reconnect_at: Option<Instant>,
    connect_deadline: Option<Instant>,
    go_away_deadline: Option<Instant>,
    socket_open: bool,
    last_heard: Instant,
    last_ping: Instant,
    connected_at: Instant,
    dropped_at: Instant,
    silence_limit: Duration,
    ping_when_silent: bool,
    /// The server asks for the pongs it needs (`Ping.reply`); an older one wants all answered.
    server_asks: bool,
    next_rid: u32,
    sends: BTreeMap<u64, PendingSend>,
    send_index: HashMap<String, u64>,
    next_send: u64,
    sends_on_wire: usize,
    window: SendWindow,
    budget: FrameBudget,
    pump_at: Option<Instant>,
    requests: HashMap<u32, Request>,
    queued_requests: Vec<Request>,
    rooms: BTreeMap<String, Vec<oneshot::Sender<Result<Subscribed, ClientError>>>>,
    room_rids: HashMap<u32, String>,
    conversations: HashMap<String, Conversation>,
    ack_due: BTreeMap<String, u64>,
    ack_at: Option<Instant>,
    resuming: Option<Resuming>,
    outbox: Vec<v1::Frame>,
    drop_request: Option<(u16, String)>,
    /// `close()` calls waiting for the socket's close to be written.
    close_waiters: Vec<oneshot::Sender<()>>,
    /// A `close()` waits until then for the deliveries in the application's hands, so that
    /// their acks go out on this connection; no new message is read meanwhile.
    closing_until: Option<Instant>,
}

impl Core {
    pub(crate) fn new(
        options: ClientOptions,
        events: mpsc::UnboundedSender<Event>,
        commands: mpsc::WeakUnboundedSender<Command>,
        state_watch: watch::Sender<State>,
    ) -> Self {
        let now = Instant::now();
        Self {
            url: options.url.clone(),
            backoff: Backoff::new(options.reconnect),
            window: SendWindow::new(options.max_in_flight_sends),
            budget: FrameBudget::new(options.max_frames_per_second),
            options,
            events,
            state_watch,
            commands,
            state: State::Connecting,
            info: None,
            ever_connected: false,
            token: None,
            token_expired: false,
            auth_failures: 0,
            go_away: None,
            reconnect_at: None,
            connect_deadline: None,
            go_away_deadline: None,
            socket_open: false,
            last_heard: now,
            last_ping: now,
            connected_at: now,
            dropped_at: now,
            silence_limit: Duration::from_secs(15),
            ping_when_silent: true,
            server_asks: false,
            next_rid: 1,
            sends: BTreeMap::new(),
            send_index: HashMap::new(),
            next_send: 0,
            sends_on_wire: 0,
            pump_at: None,
            requests: HashMap::new(),
            queued_requests: Vec::new(),
            rooms: BTreeMap::new(),
            room_rids: HashMap::new(),
            conversations: HashMap::new(),
            ack_due: BTreeMap::new(),
            ack_at: None,
            resuming: None,
            outbox: Vec::new(),
            drop_request: None,
            close_waiters: Vec::new(),
            closing_until: None,
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// A `close()` waits for deliveries to be handled: the driver reads no new frames.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing_until.is_some()
    }

    /// The driver is not reading the socket (the application's events are full): what the
    /// server may have said meanwhile is unread, not missing, so its silence does not count.
    pub(crate) fn reading_paused(&mut self) {
        self.last_heard = Instant::now();
    }

    /// The driver is done: the `close()` calls return.
    pub(crate) fn finish_close(&mut self) {
        for waiter in self.close_waiters.drain(..) {
            let _ = waiter.send(());
        }
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn take_outbox(&mut self) -> Vec<v1::Frame> {
        std::mem::take(&mut self.outbox)
    }

    pub(crate) fn take_drop_request(&mut self) -> Option<(u16, String)> {
        self.drop_request.take()
    }

    pub(crate) fn emit(&self, event: Event) {
        // Nobody listening is the application's choice; the client goes on.
        let _ = self.events.send(event);
    }

    pub(super) fn set_state(&mut self, state: State) {
        if self.state != state {
            self.state = state;
            self.state_watch.send_replace(state);
            self.emit(Event::State(state));
        }
    }

    // --- commands -------------------------------------------------------------------------

    pub(crate) fn on_command(&mut self, command: Command) {
        match command {
            Command::Send { conversation, kind, body, client_msg_id, timeout, reply } => {
                self.add_send(conversation, kind, body, client_msg_id, timeout, reply);
            }
            Command::Subscribe { room, reply } => {
                if self.is_closed() {
                    let _ = reply.send(Err(closed_error()));
                    return;
                }
                self.rooms.entry(room.clone()).or_default().push(reply);
                if self.state == State::Connected {
                    self.send_subscribe(&room);
                }
            }
            Command::Unsubscribe { room } => {
                if let Some(waiters) = self.rooms.remove(&room) {
                    for waiter in waiters {
                        let _ = waiter.send(Err(ClientError::Unsubscribed(room.clone())));
                    }
                    self.transmit(v1::Unsubscribe { room }.into(), 0);
                }
            }
            Command::History { conversation, before_seq, limit, reply } => {
                let body = v1::History { conversation, before_seq, limit }.into();
                self.request(Request { body, waiter: Waiter::History(reply) });
            }
            Command::Sync { cursors, limit, reply } => {
                let cursors = cursors.into_iter().map(|(conversation, seq)| v1::Cursor { conversation, seq }).collect();
                self.request(Request { body: v1::Sync { cursors, limit }.into(), waiter: Waiter::Sync(reply) });
            }
            Command::Ack { conversation, seq } => self.manual_ack(&conversation, seq),
            Command::Handled { conversation, seq } => {
                self.delivery_handled(&conversation, seq);
                if self.is_closing() && !self.deliveries_in_hand() {
                    self.close();
                }
            }
            Command::Close { done } => {
                self.close_waiters.push(done);
                let waits = self.state == State::Connected && self.options.ack == AckMode::Auto;
                if waits && self.deliveries_in_hand() {
                    let until = Instant::now() + self.options.close_timeout;
                    self.closing_until.get_or_insert(until);
                } else {
                    self.close();
                }
            }
        }
    }

    /// Ends the client: queued acks go out (the driver writes them before closing the
    /// socket), everything waiting is rejected.
    pub(crate) fn close(&mut self) {
        self.closing_until = None;
        if self.is_closed() {
            return;
        }
        let was_connected = self.state == State::Connected;
        self.flush_acks();
        self.shut_down(1000, "closed by the client");
        if was_connected {
            self.emit(Event::Disconnected(DisconnectedInfo {
                code: 1000,
                reason: "closed by the client".to_owned(),
                was_connected,
                reconnect_in: None,
            }));
        }
    }

    pub(super) fn request(&mut self, request: Request) {
        if self.is_closed() {
            fail_request(request, &closed_error());
        } else if self.state == State::Connected {
            self.transmit_request(request);
        } else {
            self.queued_requests.push(request);
        }
    }

    pub(super) fn transmit_request(&mut self, request: Request) {
        let rid = self.rid();
        self.transmit(request.body.clone(), rid);
        self.requests.insert(rid, request);
    }

    pub(super) fn send_subscribe(&mut self, room: &str) {
        let since_seq = self.conversation(room).order.cursor;
        let rid = self.rid();
        self.room_rids.insert(rid, room.to_owned());
        self.transmit(v1::Subscribe { room: room.to_owned(), since_seq }.into(), rid);
    }

    pub(super) fn rid(&mut self) -> u32 {
        let rid = self.next_rid;
        self.next_rid = self.next_rid.checked_add(1).unwrap_or(1);
        rid
    }

    pub(super) fn transmit(&mut self, body: Body, rid: u32) {
        if self.socket_open {
            self.budget.spend(Instant::now());
            self.outbox.push(v1::Frame { rid, body: Some(body) });
        }
    }

    // --- frames and timers ----------------------------------------------------------------

    pub(crate) fn on_frame(&mut self, frame: v1::Frame) {
        self.last_heard = Instant::now();
        let rid = frame.rid;
        match frame.body {
            Some(Body::Connected(connected)) => self.on_connected(connected),
            Some(Body::SendAck(ack)) => self.on_send_ack(ack),
            Some(Body::Deliver(deliver)) => {
                if let Some(message) = deliver.message {
                    self.on_incoming(message);
                }
            }
            Some(Body::SyncReply(reply)) => self.on_sync_reply(rid, reply),
            Some(Body::HistoryReply(reply)) => self.on_history_reply(rid, reply),
            Some(Body::Subscribed(subscribed)) => self.on_subscribed(rid, subscribed),
            Some(Body::SyncHint(hint)) => self.on_sync_hint(&hint.conversation, hint.latest_seq),
            Some(Body::Ping(ping)) => {
                // Answered when the server asks (`reply`); a server from before the field (no
                // `client_timeout_ms` in `connected`) never asks, so every ping is answered.
                if ping.reply || !self.server_asks {
                    self.transmit(v1::Pong { time_ms: ping.time_ms }.into(), rid);
                }
            }
            Some(Body::Pong(_)) => {}
            Some(Body::GoAway(go_away)) => self.on_go_away(go_away),
            Some(Body::Error(error)) => {
                let rid = if rid == 0 { error.rid } else { rid };
                self.on_server_error(rid, error.code, error.message);
            }
            Some(other) => self.emit(Event::Error(ClientError::Protocol(format!(
                "unexpected frame from the server: {}",
                other.name()
            )))),
            None => self.emit(Event::Error(ClientError::Protocol("a frame without a body".to_owned()))),
        }
    }

    pub(super) fn on_server_error(&mut self, rid: u32, code: String, message: String) {
        let error = ClientError::Server { code, message, rid };
        if let Some(request) = self.requests.remove(&rid) {
            match request.waiter {
                Waiter::Probe => {
                    self.emit(Event::Error(error));
                    if let Some(resuming) = &mut self.resuming {
                        resuming.probe = false;
                    }
                    self.maybe_resumed();
                }
                Waiter::Pull { conversation, .. } => self.pull_failed(&conversation, error),
                waiter => fail_request(Request { body: request.body, waiter }, &error),
            }
            return;
        }
        if let Some(room) = self.room_rids.remove(&rid) {
            for waiter in self.rooms.remove(&room).unwrap_or_default() {
                let _ = waiter.send(Err(error.clone()));
            }
            if let Some(resuming) = &mut self.resuming {
                resuming.rooms.remove(&room);
            }
            self.maybe_resumed();
        }
        self.emit(Event::Error(error));
    }

    /// When the driver must call [`Core::on_timer`] next.
    pub(crate) fn next_wakeup(&self) -> Option<Instant> {
        let mut next = [
            self.reconnect_at,
            self.connect_deadline,
            self.go_away_deadline,
            self.ack_at,
            self.pump_at,
            self.closing_until,
        ]
        .into_iter()
        .flatten()
        .min();
        let mut consider = |at: Instant| next = Some(next.map_or(at, |current| current.min(at)));
        if self.state == State::Connected {
            // Never an instant already past: the driver would wake at once, again and again.
            consider(self.last_heard + self.silence_limit + Duration::from_millis(1));
            if self.ping_when_silent {
                consider(self.last_heard.max(self.last_ping) + self.silence_limit / 2);
            }
        }
        for send in self.sends.values() {
            if let Some(deadline) = send.deadline {
                consider(deadline);
            }
        }
        for conversation in self.conversations.values() {
            if let Some(at) = conversation.gap_at {
                consider(at);
            }
        }
        next
    }

    pub(crate) fn on_timer(&mut self, now: Instant) {
        if self.connect_deadline.is_some_and(|at| at <= now) {
            self.connect_deadline = None;
            let timeout = self.options.connect_timeout;
            self.abandon(format!("no connected within {} ms", timeout.as_millis()));
        }
        if self.go_away_deadline.is_some_and(|at| at <= now) {
            self.go_away_deadline = None;
            let reason = self.go_away.as_ref().map_or_else(String::new, |go_away| go_away.reason.clone());
            self.abandon(reason);
        }
        if self.state == State::Connected {
            let silent = now.saturating_duration_since(self.last_heard);
            if silent > self.silence_limit {
                self.abandon(format!("server silent for {} ms", silent.as_millis()));
            } else if self.ping_when_silent
                && silent >= self.silence_limit / 2
                && now.saturating_duration_since(self.last_ping) >= self.silence_limit / 2
            {
                self.last_ping = now;
                let time_ms = unix_ms();
                self.transmit(v1::Ping { time_ms, reply: false }.into(), 0);
            }
        }
        if self.ack_at.is_some_and(|at| at <= now) {
            self.flush_acks();
        }
        self.expire_sends(now);
        if self.pump_at.is_some_and(|at| at <= now) {
            self.pump();
        }
        self.gap_timers(now);
        if self.closing_until.is_some_and(|at| at <= now) {
            // The application kept its deliveries past the close timeout: their acks are
            // lost with this client, and the server pushes them again to the device.
            self.close();
        }
    }
}

fn closed_error() -> ClientError {
    ClientError::Closed { code: 1000, reason: "client closed".to_owned() }
}

fn fail_request(request: Request, error: &ClientError) {
    match request.waiter {
        Waiter::History(reply) => {
            let _ = reply.send(Err(error.clone()));
        }
        Waiter::Sync(reply) => {
            let _ = reply.send(Err(error.clone()));
        }
        Waiter::Probe | Waiter::Pull { .. } => {}
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests;

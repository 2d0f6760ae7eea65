//! The connection's life: tokens, attempts, `connected`, drops and the decision to
//! reconnect (backoff, `go_away`, fatal closes), and the end of the client.

use std::time::Duration;

use crate::wire::v1;
use tokio::time::Instant;

use super::{
    CLIENT_DROP, Core, GO_AWAY_CLOSE_WAIT, HEARTBEAT_MARGIN, Request, Resuming, STABLE_AFTER, Waiter, fail_request,
};
use crate::error::ClientError;
use crate::options::{Token, TokenReason};
use crate::types::{ConnectedInfo, DisconnectedInfo, Event, GoAwayInfo, ResumedInfo, State};

impl Core {
    /// Whether the next attempt needs a token from the provider, and why.
    pub(crate) fn token_needed(&self) -> Option<TokenReason> {
        match (&self.options.token, &self.token) {
            (Token::Fixed(_), _) => None,
            (Token::Provider(_), None) => Some(TokenReason::Initial),
            (Token::Provider(_), Some(_)) if self.token_expired => Some(TokenReason::Expired),
            _ => None,
        }
    }

    pub(crate) fn set_token(&mut self, token: String) {
        self.token = Some(token);
        self.token_expired = false;
    }

    pub(crate) fn token_failed(&mut self, why: String) {
        self.emit(Event::Error(ClientError::Token(why)));
        let delay = self.backoff.next(rand::random());
        self.schedule_reconnect(delay);
    }

    /// A socket is about to be opened.
    pub(crate) fn begin_attempt(&mut self) {
        self.reconnect_at = None;
        self.go_away = None;
        self.set_state(State::Connecting);
        self.connect_deadline = Some(Instant::now() + self.options.connect_timeout);
    }

    /// The socket opened: the `connect` frame goes first.
    pub(crate) fn socket_opened(&mut self) {
        self.socket_open = true;
        let token = match &self.options.token {
            Token::Fixed(token) => token.clone(),
            Token::Provider(_) => self.token.clone().unwrap_or_default(),
        };
        let info = &self.options.client_info;
        let client = Some(v1::ClientInfo { name: info.name.clone(), version: info.version.clone() });
        let rid = self.rid();
        self.transmit(v1::Connect { token, device_id: self.options.device_id.clone(), client }.into(), rid);
    }

    /// Asks the driver to drop the socket without a closing handshake.
    pub(super) fn abandon(&mut self, reason: String) {
        if self.drop_request.is_none() {
            self.drop_request = Some((CLIENT_DROP, reason));
        }
    }

    /// A socket closed, or an attempt failed: decide whether and when to try again.
    pub(crate) fn on_drop(&mut self, code: u16, reason: String) {
        self.socket_open = false;
        self.outbox.clear();
        self.drop_request = None;
        let was_connected = self.state == State::Connected;
        self.connect_deadline = None;
        self.go_away_deadline = None;
        self.reset_connection_state(code, &reason);
        if self.is_closing() {
            // A close was waiting for acks this socket can no longer carry.
            self.close();
        }
        if self.is_closed() {
            return;
        }
        let now = Instant::now();
        if was_connected {
            self.dropped_at = now;
            if now.duration_since(self.connected_at) >= STABLE_AFTER {
                self.backoff.reset();
            }
        }
        let mut fatal = matches!(code, 4003 | 4009);
        let delay;
        if code == 4001 {
            // The token was refused: ask the provider for a new one, at once the first time.
            self.auth_failures += 1;
            self.token_expired = true;
            fatal |=
                matches!(self.options.token, Token::Fixed(_)) || self.auth_failures >= self.options.max_auth_failures;
            delay = if self.auth_failures == 1 { Duration::ZERO } else { self.backoff.next(rand::random()) };
        } else if let Some(go_away) = self.go_away.take() {
            // The server drains: it spread the waits itself, and may name another node.
            delay = Duration::from_millis(u64::from(go_away.reconnect_after_ms));
            if let Some(url) = go_away.reconnect_url {
                self.url = url;
            }
            self.backoff.reset();
        } else {
            // A URL from go_away that does not answer: back to the configured one.
            if !was_connected {
                self.url = self.options.url.clone();
            }
            delay = self.backoff.next(rand::random());
        }
        if fatal {
            self.emit(Event::Disconnected(DisconnectedInfo {
                code,
                reason: reason.clone(),
                was_connected,
                reconnect_in: None,
            }));
            self.shut_down(code, &reason);
            return;
        }
        self.emit(Event::Disconnected(DisconnectedInfo { code, reason, was_connected, reconnect_in: Some(delay) }));
        self.schedule_reconnect(delay);
    }

    pub(super) fn schedule_reconnect(&mut self, delay: Duration) {
        if self.is_closed() {
            return;
        }
        self.set_state(State::Reconnecting);
        self.reconnect_at = Some(Instant::now() + delay);
    }

    /// What a lost connection takes with it; what it leaves (sends, rooms, cursors) is resent.
    pub(super) fn reset_connection_state(&mut self, code: u16, reason: &str) {
        self.unwire_sends();
        let error = ClientError::Closed { code, reason: reason.to_owned() };
        for (_, request) in self.requests.drain() {
            if request.resend() {
                self.queued_requests.push(request);
            } else {
                fail_request(request, &error);
            }
        }
        self.room_rids.clear();
        for conversation in self.conversations.values_mut() {
            conversation.pulling = false;
            conversation.gap_at = None;
        }
        self.resuming = None;
    }

    /// Ends the client for good: nothing more is sent or retried; everything waiting is rejected.
    pub(super) fn shut_down(&mut self, code: u16, reason: &str) {
        self.set_state(State::Closed);
        self.reconnect_at = None;
        self.pump_at = None;
        self.ack_at = None;
        self.reset_connection_state(code, reason);
        let error = ClientError::Closed { code, reason: reason.to_owned() };
        self.abandon_all_sends(&error.to_string());
        for request in std::mem::take(&mut self.queued_requests) {
            fail_request(request, &error);
        }
        for waiters in self.rooms.values_mut() {
            for waiter in waiters.drain(..) {
                let _ = waiter.send(Err(error.clone()));
            }
        }
        if code != 1000 || reason != "closed by the client" {
            self.emit(Event::Error(error));
        }
    }

    pub(super) fn on_connected(&mut self, connected: v1::Connected) {
        self.connect_deadline = None;
        let reconnect = self.ever_connected;
        if self.info.as_ref().is_some_and(|info| info.user_id != connected.user_id) {
            self.conversations.clear();
        }
        self.ever_connected = true;
        self.auth_failures = 0;
        let now = Instant::now();
        self.connected_at = now;
        self.last_heard = now;
        self.last_ping = now;
        let info = ConnectedInfo {
            user_id: connected.user_id,
            device_id: connected.device_id,
            node_id: connected.node_id,
            session_id: connected.session_id,
            heartbeat_ms: connected.heartbeat_ms,
            url: self.url.clone(),
            reconnect,
        };
        // Dead-server detection: silence past the server's heartbeat plus a margin, capped by
        // dead_after; when the server's heartbeat is slower than that cap, ping it ourselves.
        self.server_asks = connected.client_timeout_ms > 0;
        let heartbeat = Duration::from_millis(u64::from(connected.heartbeat_ms));
        let dead_after = self.options.dead_after;
        self.silence_limit =
            if heartbeat.is_zero() { dead_after } else { dead_after.min(heartbeat + HEARTBEAT_MARGIN) };
        self.ping_when_silent = heartbeat.is_zero() || heartbeat + HEARTBEAT_MARGIN > dead_after;
        self.info = Some(info.clone());
        self.set_state(State::Connected);
        self.emit(Event::Connected(info));

        // Rooms first: a send to a room passes only once this connection is subscribed.
        let rooms: Vec<String> = self.rooms.keys().cloned().collect();
        if reconnect {
            self.resuming = Some(Resuming {
                offline: now.duration_since(self.dropped_at),
                resent_sends: self.sends.len(),
                rooms: rooms.iter().cloned().collect(),
                probe: self.options.catch_up_on_connect,
                room_count: rooms.len(),
            });
        }
        for room in &rooms {
            self.send_subscribe(room);
        }
        if self.options.catch_up_on_connect {
            let body = v1::Sync { cursors: Vec::new(), limit: 1 }.into();
            self.transmit_request(Request { body, waiter: Waiter::Probe });
        }
        for request in std::mem::take(&mut self.queued_requests) {
            self.transmit_request(request);
        }
        self.pump();
        self.flush_acks();
        let names: Vec<String> = self.conversations.keys().cloned().collect();
        for name in names {
            self.check_gap(&name);
        }
        self.maybe_resumed();
    }

    pub(super) fn maybe_resumed(&mut self) {
        let done = self.resuming.as_ref().is_some_and(|resuming| resuming.rooms.is_empty() && !resuming.probe);
        if let Some(resuming) = self.resuming.take_if(|_| done) {
            self.emit(Event::Resumed(ResumedInfo {
                offline: resuming.offline,
                resent_sends: resuming.resent_sends,
                rooms: resuming.room_count,
            }));
        }
    }

    pub(super) fn on_go_away(&mut self, go_away: v1::GoAway) {
        let info = GoAwayInfo {
            reason: go_away.reason,
            reconnect_after_ms: go_away.reconnect_after_ms,
            reconnect_url: Some(go_away.reconnect_url).filter(|url| !url.is_empty()),
        };
        self.go_away = Some(info.clone());
        self.emit(Event::GoAway(info));
        // Acks still owed go out before the server closes (it drops what is queued for us).
        self.flush_acks();
        // The server closes with 1012 right after; if that close gets lost, drop it ourselves.
        self.go_away_deadline = Some(Instant::now() + GO_AWAY_CLOSE_WAIT);
    }
}

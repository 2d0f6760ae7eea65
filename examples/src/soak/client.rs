//! One client slot of the soak: connects as its identity, sends its share of the traffic
//! (direct, group and room messages), acks what it is pushed, pulls now and then (`sync`,
//! `history`, room changes), and ends its connection when its lifetime is over, a storm
//! hits, or the soak stops. Then it comes back: often as itself, sometimes as a new device
//! or a brand-new user.
//!
//! Invariant: a slot holds at most one connection, and every wait is bounded (the
//! connection's own timeouts, its lifetime, the stop signal), so the soak ends on time.

use std::{collections::HashMap, sync::Arc, time::Duration};

use herald_proto::{
    Encoding,
    v1::{self, Frame, frame::Body, send_ack::Status},
};
use tokio::{
    sync::{Semaphore, watch},
    time::{Instant, MissedTickBehavior},
};

use super::{
    until_stopped,
    world::{Counters, World},
};
use crate::{
    connection::{Connection, ConnectionError},
    ids::{ClientMsgIds, dm_conversation},
};

/// Bounds a connect and a login.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// Sends a slot may have unanswered before it skips its turn.
const MAX_UNACKED: usize = 32;
/// Messages asked for per `sync` conversation or `history` page.
const PAGE: u32 = 20;

/// How a slot behaves; the same for every slot.
#[derive(Debug, Clone)]
pub(super) struct Behaviour {
    /// The server's WebSocket URL.
    pub url: String,
    /// Time between two sends of one slot.
    pub send_every: Duration,
    /// Mean time between two pulls (`sync`, `history`, a room change) of one slot.
    pub pull_every: Duration,
    /// Mean lifetime of a connection; each lasts 0.25–1.75 times it.
    pub lifetime: Duration,
    /// Share of reconnects that come back as a new user.
    pub new_user_share: f64,
    /// Share of reconnects that come back as a new device of the same user.
    pub new_device_share: f64,
    /// A user this old comes back as a new user at its next churn (zero: no limit).
    pub max_user_age: Duration,
}

/// What the soak tells its slots.
#[derive(Debug, Clone)]
pub(super) struct Signals {
    /// Becomes true when the soak stops: close and do not come back.
    pub stop: watch::Receiver<bool>,
    /// Counts reconnect storms: on each, drop the connection and reconnect at once.
    pub storms: watch::Receiver<u64>,
}

/// Why a connection ended.
enum Ended {
    /// The soak is over.
    Stop,
    /// A reconnect storm.
    Storm,
    /// Its lifetime was over.
    Churn,
    /// The server closed it or it failed.
    Lost,
}

/// Runs slot `slot` until the soak stops.
pub(super) async fn run_slot(
    world: Arc<World>,
    slot: usize,
    behaviour: Arc<Behaviour>,
    permits: Arc<Semaphore>,
    mut signals: Signals,
    started: Instant,
) {
    let counters = &world.counters;
    // Spread the first connects over a second so they do not all queue at once.
    tokio::time::sleep(Duration::from_millis(rand::random_range(0..1000))).await;
    while !*signals.stop.borrow() {
        let identity = world.identity(slot);
        let connection = {
            let Ok(_permit) = permits.acquire().await else { return };
            connect(&behaviour.url, &identity.user, &identity.device).await
        };
        let mut connection = match connection {
            Ok(connection) => connection,
            Err(_) => {
                Counters::bump(&counters.connect_failures);
                if wait_or_stop(&mut signals.stop, Duration::from_secs(1)).await {
                    return;
                }
                continue;
            }
        };
        Counters::bump(&counters.connects);
        signals.storms.mark_unchanged();
        world.set_online(slot, true);
        let lifetime = behaviour.lifetime.mul_f64(rand::random_range(0.25..1.75));
        let mut session = Session::new(&world, &identity.user, started);
        let ended = session.run(&mut connection, &behaviour, &mut signals, lifetime).await;
        world.set_online(slot, false);
        match ended {
            Ended::Stop => {
                connection.close(1000, "soak over").await;
                return;
            }
            Ended::Storm => {
                // No close frame: the socket just goes, as when a network drops everyone.
                Counters::bump(&counters.storm_drops);
                drop(connection);
            }
            Ended::Churn => {
                Counters::bump(&counters.churned);
                if rand::random_bool(0.5) {
                    connection.close(1000, "bye").await;
                } else {
                    drop(connection);
                }
                let draw: f64 = rand::random();
                let too_old = !behaviour.max_user_age.is_zero() && world.user_age(slot) >= behaviour.max_user_age;
                if too_old || draw < behaviour.new_user_share {
                    world.new_user(slot);
                } else if draw < behaviour.new_user_share + behaviour.new_device_share {
                    world.new_device(slot);
                }
                let pause = Duration::from_millis(rand::random_range(0..2000));
                if wait_or_stop(&mut signals.stop, pause).await {
                    return;
                }
            }
            Ended::Lost => {
                Counters::bump(&counters.lost);
                if wait_or_stop(&mut signals.stop, Duration::from_millis(500)).await {
                    return;
                }
            }
        }
    }
}

/// Sleeps `pause` unless the soak stops first; returns whether it stopped.
async fn wait_or_stop(stop: &mut watch::Receiver<bool>, pause: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(pause) => {}
        _ = until_stopped(stop) => {}
    }
    *stop.borrow()
}

/// Opens a connection and logs in with a dev token.
async fn connect(url: &str, user: &str, device: &str) -> Result<Connection, ConnectionError> {
    let mut connection = Connection::open(url, Encoding::Proto, CONNECT_TIMEOUT).await?;
    connection.login(&format!("dev:{user}"), device, "herald-soak", CONNECT_TIMEOUT).await?;
    Ok(connection)
}

/// One connection's state.
struct Session<'a> {
    world: &'a World,
    /// The user this connection is.
    me: &'a str,
    /// When the soak started (rooms change with the time into it).
    started: Instant,
    /// The highest seq pushed per `dm:`/`grp:` conversation, for `history` and `sync_hint`.
    seen: HashMap<String, u64>,
    /// Rooms subscribed to.
    rooms: Vec<String>,
    /// Sends without a `send_ack` yet.
    unacked: usize,
    ids: ClientMsgIds,
}

impl<'a> Session<'a> {
    fn new(world: &'a World, me: &'a str, started: Instant) -> Self {
        Self { world, me, started, seen: HashMap::new(), rooms: Vec::new(), unacked: 0, ids: ClientMsgIds::new() }
    }

    async fn run(
        &mut self,
        connection: &mut Connection,
        behaviour: &Behaviour,
        signals: &mut Signals,
        lifetime: Duration,
    ) -> Ended {
        let end = Instant::now() + lifetime;
        let first_send = Instant::now() + behaviour.send_every.mul_f64(rand::random());
        let mut sends = tokio::time::interval_at(first_send, behaviour.send_every);
        sends.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut next_pull = Instant::now() + behaviour.pull_every.mul_f64(rand::random_range(0.5..1.5));
        // Most clients sit in one room of the moment.
        if rand::random_bool(0.7) && self.join_room(connection, false).await.is_err() {
            return Ended::Lost;
        }
        loop {
            let step = tokio::select! {
                biased;
                _ = until_stopped(&mut signals.stop) => return Ended::Stop,
                _ = signals.storms.changed() => return Ended::Storm,
                _ = tokio::time::sleep_until(end) => return Ended::Churn,
                frame = connection.recv() => match frame {
                    Ok(frame) => self.answer(connection, frame).await,
                    Err(_) => return Ended::Lost,
                },
                _ = sends.tick() => self.send(connection).await,
                _ = tokio::time::sleep_until(next_pull) => {
                    next_pull = Instant::now() + behaviour.pull_every.mul_f64(rand::random_range(0.5..1.5));
                    self.pull(connection).await
                }
            };
            if step.is_err() {
                return Ended::Lost;
            }
        }
    }

    /// Answers one frame from the server.
    async fn answer(&mut self, connection: &mut Connection, frame: Frame) -> Result<(), ConnectionError> {
        let counters = &self.world.counters;
        match frame.body {
            Some(Body::SendAck(ack)) => {
                self.unacked = self.unacked.saturating_sub(1);
                match ack.status() {
                    Status::Ok | Status::Duplicate => Counters::bump(&counters.acked),
                    Status::Retry => Counters::bump(&counters.retried),
                    Status::Rejected | Status::Unspecified => Counters::bump(&counters.rejected),
                }
            }
            Some(Body::Deliver(deliver)) => {
                Counters::bump(&counters.delivered);
                if let Some(message) = deliver.message
                    && !message.conversation.starts_with("room:")
                    && message.seq > 0
                {
                    let seen = self.seen.entry(message.conversation.clone()).or_default();
                    *seen = (*seen).max(message.seq);
                    let ack = v1::DeliverAck { conversation: message.conversation, seq: message.seq };
                    connection.send(&Frame::new(0, ack)).await?;
                }
            }
            Some(Body::SyncHint(hint)) => {
                let from = self.seen.get(&hint.conversation).copied().unwrap_or(0);
                let cursor = v1::Cursor { conversation: hint.conversation, seq: from };
                let rid = connection.next_rid();
                connection.send(&Frame::new(rid, v1::Sync { cursors: vec![cursor], limit: PAGE })).await?;
            }
            Some(Body::Ping(ping)) => connection.answer_ping(frame.rid, &ping).await?,
            Some(Body::SyncReply(_) | Body::HistoryReply(_) | Body::Subscribed(_)) => Counters::bump(&counters.pulls),
            Some(Body::Error(_)) => Counters::bump(&counters.errors),
            _ => {}
        }
        Ok(())
    }

    /// Sends one message, unless too many are unanswered: mostly direct, then to a group of
    /// this user, sometimes to a room it is in.
    async fn send(&mut self, connection: &mut Connection) -> Result<(), ConnectionError> {
        if self.unacked >= MAX_UNACKED {
            return Ok(());
        }
        let draw: f64 = rand::random();
        let conversation = if draw < 0.05 && !self.rooms.is_empty() {
            Some(format!("room:{}", self.rooms[rand::random_range(0..self.rooms.len())]))
        } else if draw < 0.35 {
            self.world.group_of(self.me)
        } else {
            None
        };
        let Some(conversation) =
            conversation.or_else(|| self.world.random_peer(self.me).map(|peer| dm_conversation(self.me, &peer)))
        else {
            return Ok(());
        };
        let send = v1::Send {
            client_msg_id: self.ids.next_id(),
            conversation,
            kind: 1,
            body: format!("soak from {}", self.me).into_bytes().into(),
        };
        let rid = connection.next_rid();
        connection.send(&Frame::new(rid, send)).await?;
        self.unacked += 1;
        Counters::bump(&self.world.counters.sent);
        Ok(())
    }

    /// One pull: a `sync` of everything, a `history` page of a conversation seen, or a
    /// move to another room of the moment.
    async fn pull(&mut self, connection: &mut Connection) -> Result<(), ConnectionError> {
        let rid = connection.next_rid();
        match rand::random_range(0..3) {
            0 => connection.send(&Frame::new(rid, v1::Sync { cursors: Vec::new(), limit: PAGE })).await,
            1 if !self.seen.is_empty() => {
                let at = rand::random_range(0..self.seen.len());
                let (conversation, _) = self.seen.iter().nth(at).map(|(c, s)| (c.clone(), *s)).unwrap_or_default();
                connection.send(&Frame::new(rid, v1::History { conversation, before_seq: 0, limit: PAGE })).await
            }
            _ => {
                if let Some(room) = self.rooms.pop() {
                    let rid = connection.next_rid();
                    connection.send(&Frame::new(rid, v1::Unsubscribe { room: format!("room:{room}") })).await?;
                }
                self.join_room(connection, true).await
            }
        }
    }

    /// Subscribes to a random room of the moment, asking for the last few messages when
    /// `catch_up`.
    async fn join_room(&mut self, connection: &mut Connection, catch_up: bool) -> Result<(), ConnectionError> {
        let room = self.world.random_room(self.started.elapsed());
        if self.rooms.contains(&room) {
            return Ok(());
        }
        let rid = connection.next_rid();
        let since_seq = catch_up.then_some(0);
        connection.send(&Frame::new(rid, v1::Subscribe { room: format!("room:{room}"), since_seq })).await?;
        self.rooms.push(room);
        Ok(())
    }
}

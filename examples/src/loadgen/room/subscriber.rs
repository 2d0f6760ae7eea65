//! One subscriber of a room run: subscribed to its room, it times and counts every
//! `deliver` until the run stops. It sends nothing but `pong`s: room messages are pushed
//! once and never redelivered, so they need no `deliver_ack`.

use std::{collections::HashMap, sync::Arc};

use herald_proto::v1::{self, Frame, frame::Body};
use tokio::sync::{Semaphore, watch};

use super::{super::payload::Payload, Plan, RoomShared, connect_and_subscribe, publisher_index};
use crate::{
    connection::{Connection, ConnectionError},
    loadgen::{Phase, SeenCounters, Shared},
};

/// Most frames handled between two flushes.
const BATCH: usize = 64;

/// Runs one subscriber from connect to close.
pub(super) async fn run(
    plan: Plan,
    shared: Arc<Shared>,
    room: Arc<RoomShared>,
    mut phase: watch::Receiver<Phase>,
    gate: Arc<Semaphore>,
) {
    let connection = {
        let _permit = gate.acquire().await;
        connect_and_subscribe(&plan, &shared).await
    };
    let connection = match connection {
        Ok(connection) => {
            shared.counters.connected.incr();
            room.subscribed[plan.room].incr();
            connection
        }
        Err(error) => {
            shared.counters.connect_failures.incr();
            shared.note_error(|| format!("subscriber {} could not connect: {error}", plan.user));
            return;
        }
    };
    let mut subscriber = Subscriber { plan, shared, room, connection, seen: HashMap::new(), dirty: false, alive: true };
    subscriber.run(&mut phase).await;
    subscriber.connection.close(1000, "load test over").await;
}

/// A connected subscriber's state.
struct Subscriber {
    plan: Plan,
    shared: Arc<Shared>,
    room: Arc<RoomShared>,
    connection: Connection,
    /// Which messages of each publisher arrived, by publisher number.
    seen: HashMap<usize, SeenCounters>,
    /// Frames were fed but not flushed.
    dirty: bool,
    /// The connection still works.
    alive: bool,
}

impl Subscriber {
    async fn run(&mut self, phase: &mut watch::Receiver<Phase>) {
        loop {
            if *phase.borrow_and_update() == Phase::Stopped || !self.alive {
                break;
            }
            tokio::select! {
                biased;
                changed = phase.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                received = self.connection.recv() => {
                    self.on_received(received).await;
                    for _ in 0..BATCH {
                        match self.connection.recv_ready() {
                            Some(received) => self.on_received(received).await,
                            None => break,
                        }
                    }
                }
            }
            if self.dirty && self.alive {
                self.dirty = false;
                if let Err(error) = self.connection.flush().await {
                    self.lost(&error);
                }
            }
        }
    }

    fn lost(&mut self, error: &ConnectionError) {
        if self.alive {
            self.alive = false;
            self.shared.counters.disconnects.incr();
            let user = &self.plan.user;
            self.shared.note_error(|| format!("subscriber {user} lost its connection: {error}"));
        }
    }

    async fn on_received(&mut self, received: Result<Frame, ConnectionError>) {
        let frame = match received {
            Ok(frame) => frame,
            Err(error) => {
                self.lost(&error);
                return;
            }
        };
        let counters = &self.shared.counters;
        match frame.body {
            Some(Body::Deliver(deliver)) => {
                if deliver.attempt > 1 {
                    counters.redelivered.incr();
                }
                match deliver.message {
                    Some(message) => self.on_message(&message),
                    None => counters.corrupt.incr(),
                }
            }
            Some(Body::Ping(ping)) if ping.reply => {
                if self.alive {
                    match self.connection.feed(&Frame::new(frame.rid, v1::Pong { time_ms: ping.time_ms })).await {
                        Ok(()) => self.dirty = true,
                        Err(error) => self.lost(&error),
                    }
                }
            }
            Some(Body::Pong(_)) => {}
            Some(Body::SyncHint(_)) => counters.sync_hints.incr(),
            Some(Body::GoAway(_)) => {
                counters.go_aways.incr();
                let user = &self.plan.user;
                self.shared.note_error(|| format!("subscriber {user} was told to go away (server draining)"));
                self.alive = false;
            }
            Some(Body::Error(error)) => {
                counters.server_errors.incr();
                self.shared
                    .note_error(|| format!("server error for rid {}: {}: {}", error.rid, error.code, error.message));
            }
            Some(Body::Ping(_)) => {}
            _ => counters.unexpected.incr(),
        }
    }

    /// Counts and times one room message.
    fn on_message(&mut self, message: &v1::Message) {
        let shared = &self.shared;
        let counters = &shared.counters;
        let now_us = shared.now_us();
        let publisher = publisher_index(&shared.config.user_prefix, &message.sender);
        let (Some(publisher), true) = (publisher, message.conversation == self.plan.conversation) else {
            counters.unexpected.incr();
            return;
        };
        let Some(payload) = Payload::decode(&message.body, shared.config.body_bytes) else {
            counters.corrupt.incr();
            return;
        };
        if message.id == 0 {
            counters.corrupt.incr();
        }
        if !self.seen.entry(publisher).or_default().insert(payload.counter) {
            counters.duplicates.incr();
            return;
        }
        counters.delivered.incr();
        if shared.in_window(now_us) {
            counters.window_delivered.incr();
        }
        if shared.in_window(payload.sent_us) {
            shared.latency.record(self.plan.slot, now_us.saturating_sub(payload.sent_us));
        }
        if let Some(timeline) = &shared.timeline {
            let (sent_us, delivered_us) = (shared.since_start(payload.sent_us), shared.since_start(now_us));
            timeline.record_delivery(self.plan.slot, sent_us, delivered_us, false);
        }
        if self.room.settle(publisher, payload.counter)
            && let Some(credits) = shared.credits.get(publisher)
        {
            credits.add_permits(1);
        }
    }
}

//! One publisher of a room run: subscribed to its room (a send to a room needs it), it
//! sends into the room on its schedule, or as fast as its in-flight credits allow, and
//! resends after RETRY as the pair mode's users do.
//!
//! A REJECTED send (a room rate-limit plugin, say) is counted, frees its credit and, when
//! it carries `retry_after_ms`, pauses this publisher for that long: a rate limit is
//! answered by waiting, not by a flood of sends refused one after another. A RETRY pauses
//! it too, and its resends are spaced one wait apart. In rate mode the sends that fell due
//! during a pause are skipped, not sent in a burst after it; the published rate then shows
//! the server's pace.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use bytes::Bytes;
use herald_proto::v1::{self, Frame, frame::Body, send_ack::Status};
use tokio::{
    sync::{Semaphore, watch},
    time::{Instant, sleep_until},
};

use super::{super::payload::Payload, Plan, RoomShared, connect_and_subscribe, publisher_index};
use crate::{
    connection::{Connection, ConnectionError},
    ids::ClientMsgIds,
    loadgen::{Phase, Shared},
};

/// The `kind` of load-test messages, as in the pair mode.
const LOAD_KIND: u32 = 2;
/// Most frames handled or sends written between two flushes.
const BATCH: usize = 64;
/// How late a scheduled send may be and still be stamped with its real time.
const TIMER_SLACK: Duration = Duration::from_millis(2);
/// Resends after RETRY before a send is given up.
const MAX_RETRIES: u32 = 5;
/// How often messages stuck in flight are looked for.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// A send that has no final `send_ack` yet.
#[derive(Debug)]
struct Pending {
    /// Its counter (in the body, and the key of its in-flight entry).
    counter: u64,
    /// Body timestamp, microseconds after the epoch.
    sent_us: u64,
    /// When it was last written, for the `send_ack` latency.
    written: Instant,
    /// What to resend after RETRY.
    body: Bytes,
    /// Resends so far.
    retries: u32,
}

/// Runs one publisher from connect to close.
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
            room.publishers_connected.incr();
            connection
        }
        Err(error) => {
            shared.counters.connect_failures.incr();
            shared.note_error(|| format!("publisher {} could not connect: {error}", plan.user));
            return;
        }
    };
    let mut publisher = Publisher {
        plan,
        shared,
        room,
        connection,
        ids: ClientMsgIds::new(),
        next_counter: 0,
        pending: HashMap::new(),
        retries: VecDeque::new(),
        next_due: None,
        hold_until: None,
        dirty: false,
        alive: true,
    };
    publisher.run(&mut phase).await;
    publisher.connection.close(1000, "load test over").await;
}

/// A connected publisher's state.
struct Publisher {
    plan: Plan,
    shared: Arc<Shared>,
    room: Arc<RoomShared>,
    connection: Connection,
    /// Source of `client_msg_id`s.
    ids: ClientMsgIds,
    /// The counter of the next message.
    next_counter: u64,
    /// Sends awaiting their final `send_ack`, by `client_msg_id`.
    pending: HashMap<String, Pending>,
    /// Sends to repeat after RETRY, with when, in due order.
    retries: VecDeque<(Instant, String)>,
    /// In rate mode, when the next send is due.
    next_due: Option<Instant>,
    /// No new sends before this: the wait a REJECTED `send_ack` asked for.
    hold_until: Option<Instant>,
    /// Frames were fed but not flushed.
    dirty: bool,
    /// The connection still works.
    alive: bool,
}

impl Publisher {
    async fn run(&mut self, phase: &mut watch::Receiver<Phase>) {
        let shared = Arc::clone(&self.shared);
        let credits = &shared.credits[self.plan.index];
        let mut next_sweep = Instant::now() + SWEEP_EVERY;
        loop {
            let current = *phase.borrow_and_update();
            if current == Phase::Stopped || !self.alive {
                break;
            }
            let sending = current == Phase::Running;
            if sending && self.next_due.is_none() {
                let start = shared.instant_at(shared.start_us.load(Ordering::Relaxed));
                self.next_due = Some(start + self.plan.offset);
            }
            if let (Some(hold), Some(due)) = (self.hold_until, self.next_due) {
                self.skip_missed(hold, due);
            }
            let due = self.next_due.unwrap_or_else(Instant::now).max(self.hold_until.unwrap_or_else(Instant::now));
            let retry_due = self.retries.front().map(|(due, _)| *due);
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
                () = sleep_until(retry_due.unwrap_or(due)), if retry_due.is_some() => self.resend_due().await,
                () = sleep_until(next_sweep) => {
                    next_sweep = Instant::now() + SWEEP_EVERY;
                    let expired = self.room.expire(self.plan.index, shared.config.drain_timeout);
                    credits.add_permits(expired);
                }
                permit = async {
                    sleep_until(due).await;
                    credits.acquire().await
                }, if sending => {
                    if let Ok(permit) = permit {
                        permit.forget();
                        self.send_burst(credits).await;
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

    /// In rate mode, moves the schedule past a pause (sends due during it are skipped).
    fn skip_missed(&mut self, hold: Instant, due: Instant) {
        if let Some(interval) = self.plan.interval.filter(|interval| !interval.is_zero())
            && due < hold
        {
            let missed = (hold - due).as_secs_f64() / interval.as_secs_f64();
            self.next_due = Some(due + interval.mul_f64(missed.ceil()));
        }
        if hold <= Instant::now() {
            self.hold_until = None;
        }
    }

    /// Sends one message (its credit already taken), then as many more as are due and
    /// have credits, up to a batch.
    async fn send_burst(&mut self, credits: &Semaphore) {
        let now = Instant::now();
        for sent in 0..BATCH {
            if sent > 0 {
                match credits.try_acquire() {
                    Ok(permit) => permit.forget(),
                    Err(_) => return,
                }
            }
            let stamp = match (self.plan.interval, self.next_due) {
                (Some(interval), Some(due)) => {
                    self.next_due = Some(due + interval);
                    let lag = now.saturating_duration_since(due);
                    if self.shared.in_window(self.shared.micros_since_epoch(due)) {
                        let lag_us = u64::try_from(lag.as_micros()).unwrap_or(u64::MAX);
                        self.shared.send_lag.record(self.plan.slot, lag_us);
                    }
                    if lag <= TIMER_SLACK { now } else { due }
                }
                _ => now,
            };
            self.send_new(stamp).await;
            let paused = self.hold_until.is_some_and(|hold| hold > now);
            let not_due = self.plan.interval.is_some() && self.next_due.is_some_and(|due| due > now);
            if !self.alive || paused || not_due {
                return;
            }
        }
    }

    async fn send_new(&mut self, stamp: Instant) {
        let shared = &self.shared;
        let sent_us = shared.micros_since_epoch(stamp);
        let counter = self.next_counter;
        self.next_counter += 1;
        let body = Payload { sent_us, counter }.encode(shared.config.body_bytes);
        let client_msg_id = self.ids.next_id();
        shared.counters.sent.incr();
        if shared.in_window(sent_us) {
            shared.counters.window_sent.incr();
        }
        if let Some(timeline) = &shared.timeline {
            timeline.record_sent(self.plan.slot, shared.since_start(sent_us));
        }
        self.room.track(self.plan.index, counter, self.plan.room);
        self.pending.insert(
            client_msg_id.clone(),
            Pending { counter, sent_us, written: Instant::now(), body: body.clone(), retries: 0 },
        );
        self.write_send(client_msg_id, body).await;
    }

    async fn write_send(&mut self, client_msg_id: String, body: Bytes) {
        let rid = self.connection.next_rid();
        let send = v1::Send { client_msg_id, conversation: self.plan.conversation.clone(), kind: LOAD_KIND, body };
        self.write(&Frame::new(rid, send)).await;
    }

    async fn write(&mut self, frame: &Frame) {
        if !self.alive {
            return;
        }
        match self.connection.feed(frame).await {
            Ok(()) => self.dirty = true,
            Err(error) => self.lost(&error),
        }
    }

    async fn resend_due(&mut self) {
        let now = Instant::now();
        while let Some((due, _)) = self.retries.front() {
            if *due > now {
                break;
            }
            let Some((_, client_msg_id)) = self.retries.pop_front() else { break };
            if let Some(pending) = self.pending.get_mut(&client_msg_id) {
                pending.written = Instant::now();
                let body = pending.body.clone();
                self.shared.counters.resent.incr();
                self.write_send(client_msg_id, body).await;
            }
        }
    }

    fn lost(&mut self, error: &ConnectionError) {
        if self.alive {
            self.alive = false;
            self.shared.counters.disconnects.incr();
            // Their acks cannot arrive any more: the drain need not wait for them.
            self.shared.counters.given_up.add(self.pending.len() as u64);
            for (_, pending) in self.pending.drain() {
                self.room.abandon(self.plan.index, pending.counter);
            }
            let user = &self.plan.user;
            self.shared.note_error(|| format!("publisher {user} lost its connection: {error}"));
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
            Some(Body::SendAck(ack)) => self.on_send_ack(ack),
            // Another publisher of the same room: not a subscriber's delivery.
            Some(Body::Deliver(deliver))
                if deliver.message.as_ref().is_some_and(|message| {
                    publisher_index(&self.shared.config.user_prefix, &message.sender).is_some()
                }) =>
            {
                self.room.publisher_received.incr();
            }
            Some(Body::SyncHint(_)) => counters.sync_hints.incr(),
            Some(Body::Ping(ping)) if ping.reply => {
                self.write(&Frame::new(frame.rid, v1::Pong { time_ms: ping.time_ms })).await
            }
            Some(Body::Ping(_) | Body::Pong(_)) => {}
            Some(Body::GoAway(_)) => {
                counters.go_aways.incr();
                let user = &self.plan.user;
                self.shared.note_error(|| format!("publisher {user} was told to go away (server draining)"));
                self.alive = false;
            }
            Some(Body::Error(error)) => {
                counters.server_errors.incr();
                self.shared
                    .note_error(|| format!("server error for rid {}: {}: {}", error.rid, error.code, error.message));
            }
            _ => counters.unexpected.incr(),
        }
    }

    fn on_send_ack(&mut self, ack: v1::SendAck) {
        let shared = &self.shared;
        let counters = &shared.counters;
        let credits = &shared.credits[self.plan.index];
        let status = ack.status();
        let Some(pending) = self.pending.get_mut(&ack.client_msg_id) else {
            counters.unexpected.incr();
            return;
        };
        match status {
            Status::Ok | Status::Duplicate => {
                if status == Status::Ok {
                    counters.ack_ok.incr();
                } else {
                    counters.ack_duplicate.incr();
                }
                if ack.message_id == 0 || ack.conversation != self.plan.conversation {
                    counters.corrupt.incr();
                }
                self.room.accepted[self.plan.room].incr();
                if shared.in_window(pending.sent_us) {
                    let micros = u64::try_from(pending.written.elapsed().as_micros()).unwrap_or(u64::MAX);
                    shared.ack_latency.record(self.plan.slot, micros);
                }
                let counter = pending.counter;
                self.pending.remove(&ack.client_msg_id);
                if self.room.settle(self.plan.index, counter) {
                    credits.add_permits(1);
                }
            }
            Status::Retry if pending.retries < MAX_RETRIES => {
                counters.ack_retry.incr();
                pending.retries += 1;
                // One publisher sends far faster than a pair's user, so its RETRYs come in
                // runs (the connection's bucket is empty): resend one per wait, not the
                // whole run after the first wait, and hold new sends meanwhile, or the
                // resends alone would pass the server's frames-per-second limit (4029).
                let wait = Duration::from_millis(u64::from(ack.retry_after_ms).max(1));
                let now = Instant::now();
                let due = self.retries.back().map_or(now, |(last, _)| (*last).max(now)) + wait;
                self.hold_until = Some(self.hold_until.map_or(due, |earlier| earlier.max(due)));
                self.retries.push_back((due, ack.client_msg_id));
            }
            Status::Retry | Status::Rejected | Status::Unspecified => {
                if status == Status::Retry {
                    counters.ack_retry.incr();
                    counters.given_up.incr();
                } else {
                    counters.ack_rejected.incr();
                    let user = &self.plan.user;
                    shared.note_error(|| format!("send by publisher {user} rejected: {}", ack.reason));
                    if ack.retry_after_ms > 0 {
                        let hold = Instant::now() + Duration::from_millis(u64::from(ack.retry_after_ms));
                        self.hold_until = Some(self.hold_until.map_or(hold, |earlier| earlier.max(hold)));
                    }
                }
                let counter = pending.counter;
                self.pending.remove(&ack.client_msg_id);
                if self.room.abandon(self.plan.index, counter) {
                    credits.add_permits(1);
                }
            }
        }
    }
}

//! One simulated user: connects, then sends to its partner while acknowledging what the
//! partner sends, until the run stops.
//!
//! Everything a user does happens on one task that owns its connection: reads have
//! priority, a burst of buffered frames is answered with one flush, and sends are gated by
//! the user's credits (messages in flight) and, in rate mode, by its schedule.

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

use super::{Phase, Shared, UserPlan, payload::Payload, payload::SeenCounters};
use crate::{
    connection::{Connection, ConnectionError},
    ids::ClientMsgIds,
};

/// The `kind` of load-test messages (app-defined; any value works).
const LOAD_KIND: u32 = 2;
/// Most frames handled or sends written between two flushes.
const BATCH: usize = 64;
/// How late a scheduled send may be and still be stamped with its real time: tokio's
/// timer wakes up to about a millisecond late, which is not the server's doing.
const TIMER_SLACK: Duration = Duration::from_millis(2);
/// Resends after RETRY before a send is given up.
const MAX_RETRIES: u32 = 5;

/// What a user hands back at the end: the ids it saw, if the run verifies them.
#[derive(Debug, Default)]
pub(super) struct UserOutcome {
    /// Message ids acknowledged OK or DUPLICATE to this user's sends.
    pub acked_ids: Vec<u64>,
    /// Message ids this user received from its partner.
    pub delivered_ids: Vec<u64>,
}

/// A send that has no final `send_ack` yet.
#[derive(Debug)]
struct Pending {
    /// Body timestamp (scheduled send time), microseconds after the epoch.
    sent_us: u64,
    /// When it was last written (its resend, after a RETRY), for the `send_ack` latency.
    written: Instant,
    /// What to resend after RETRY.
    body: Bytes,
    /// Resends so far.
    retries: u32,
}

/// Runs one user from connect to close.
pub(super) async fn run_user(
    plan: UserPlan,
    shared: Arc<Shared>,
    mut phase: watch::Receiver<Phase>,
    gate: Arc<Semaphore>,
) -> UserOutcome {
    let connection = {
        let _permit = gate.acquire().await;
        connect(&plan, &shared).await
    };
    let connection = match connection {
        Ok(connection) => {
            shared.counters.connected.incr();
            connection
        }
        Err(error) => {
            shared.counters.connect_failures.incr();
            shared.note_error(|| format!("{} could not connect: {error}", plan.user));
            return UserOutcome::default();
        }
    };
    let verify = shared.config.verify;
    let mut user = User {
        plan,
        shared,
        connection,
        ids: ClientMsgIds::new(),
        next_counter: 0,
        pending: HashMap::new(),
        retries: VecDeque::new(),
        seen: SeenCounters::default(),
        last_seq: 0,
        next_due: None,
        dirty: false,
        alive: true,
        outcome: UserOutcome::default(),
        verify,
    };
    user.run(&mut phase).await;
    let User { connection, outcome, .. } = user;
    connection.close(1000, "load test over").await;
    outcome
}

async fn connect(plan: &UserPlan, shared: &Shared) -> Result<Connection, ConnectionError> {
    let config = &shared.config;
    let mut connection = Connection::open(&plan.url, config.encoding, config.connect_timeout).await?;
    connection
        .login(&config.token_mode.token(&plan.user), &config.device, "herald-loadgen", config.connect_timeout)
        .await?;
    Ok(connection)
}

/// A connected user's state.
struct User {
    plan: UserPlan,
    shared: Arc<Shared>,
    connection: Connection,
    /// Source of `client_msg_id`s.
    ids: ClientMsgIds,
    /// The counter of the next message this user sends.
    next_counter: u64,
    /// Sends awaiting their final `send_ack`, by `client_msg_id`.
    pending: HashMap<String, Pending>,
    /// Sends to repeat after RETRY, with when, in due order.
    retries: VecDeque<(Instant, String)>,
    /// Which of the partner's messages arrived.
    seen: SeenCounters,
    /// Highest seq received in the conversation: the cursor for `sync`.
    last_seq: u64,
    /// In rate mode, when the next send is due.
    next_due: Option<Instant>,
    /// Frames were fed but not flushed.
    dirty: bool,
    /// The connection still works.
    alive: bool,
    /// The ids seen, if verifying.
    outcome: UserOutcome,
    /// Keep ids for the end-of-run cross-check.
    verify: bool,
}

impl User {
    async fn run(&mut self, phase: &mut watch::Receiver<Phase>) {
        let shared = Arc::clone(&self.shared);
        let credits = &shared.credits[self.plan.index];
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
            let due = self.next_due.unwrap_or_else(Instant::now);
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
                () = sleep_until(retry_due.unwrap_or(due)), if retry_due.is_some() => {
                    self.resend_due().await;
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
            // Rate mode stamps the scheduled time, so a backlog counts as latency; lateness
            // within the timer's granularity is the generator's, not the server's.
            let stamp = match (self.plan.interval, self.next_due) {
                (Some(interval), Some(due)) => {
                    self.next_due = Some(due + interval);
                    let lag = now.saturating_duration_since(due);
                    let due_us = self.shared.micros_since_epoch(due);
                    if self.shared.in_window(due_us) {
                        let lag_us = u64::try_from(lag.as_micros()).unwrap_or(u64::MAX);
                        self.shared.send_lag.record(self.plan.index, lag_us);
                    }
                    if lag <= TIMER_SLACK { now } else { due }
                }
                _ => now,
            };
            self.send_new(stamp).await;
            if !self.alive {
                return;
            }
            if self.next_due.is_some_and(|due| due > now) && self.plan.interval.is_some() {
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
            timeline.record_sent(self.plan.index, shared.since_start(sent_us));
        }
        self.pending.insert(
            client_msg_id.clone(),
            Pending { sent_us, written: Instant::now(), body: body.clone(), retries: 0 },
        );
        self.write_send(client_msg_id, body).await;
    }

    async fn write_send(&mut self, client_msg_id: String, body: Bytes) {
        let rid = self.connection.next_rid();
        let frame = Frame::new(
            rid,
            v1::Send { client_msg_id, conversation: self.plan.conversation.clone(), kind: LOAD_KIND, body },
        );
        self.write(&frame).await;
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
            let Some((_, client_msg_id)) = self.retries.pop_front() else {
                break;
            };
            if let Some(pending) = self.pending.get_mut(&client_msg_id) {
                // send → send_ack is the latency of the attempt the server took in: the
                // wait it asked for shows in the RETRY count and in send → deliver.
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
            let user = &self.plan.user;
            self.shared.note_error(|| format!("{user} lost its connection: {error}"));
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
            Some(Body::Deliver(deliver)) => {
                if deliver.attempt > 1 {
                    counters.redelivered.incr();
                }
                if let Some(message) = deliver.message {
                    let ack = v1::DeliverAck { conversation: message.conversation.clone(), seq: message.seq };
                    self.on_message(message);
                    self.write(&Frame::new(0, ack)).await;
                    self.shared.counters.deliver_acks.incr();
                } else {
                    counters.corrupt.incr();
                }
            }
            Some(Body::SyncHint(hint)) => {
                counters.sync_hints.incr();
                if hint.conversation == self.plan.conversation && hint.latest_seq > self.last_seq {
                    self.request_sync().await;
                }
            }
            Some(Body::SyncReply(reply)) => self.on_sync_reply(reply).await,
            // Only a ping that asks is answered (PROTOCOL.md): the others cost a frame each.
            Some(Body::Ping(ping)) if ping.reply => {
                let pong = v1::Pong { time_ms: ping.time_ms };
                self.write(&Frame::new(frame.rid, pong)).await;
            }
            Some(Body::Ping(_) | Body::Pong(_)) => {}
            Some(Body::GoAway(_)) => {
                counters.go_aways.incr();
                let user = &self.plan.user;
                self.shared.note_error(|| format!("{user} was told to go away (server draining)"));
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
                if ack.message_id == 0 || ack.seq == 0 || ack.conversation != self.plan.conversation {
                    counters.corrupt.incr();
                }
                if shared.in_window(pending.sent_us) {
                    let micros = u64::try_from(pending.written.elapsed().as_micros()).unwrap_or(u64::MAX);
                    shared.ack_latency.record(self.plan.index, micros);
                }
                if self.verify {
                    self.outcome.acked_ids.push(ack.message_id);
                }
                self.pending.remove(&ack.client_msg_id);
            }
            Status::Retry if pending.retries < MAX_RETRIES => {
                counters.ack_retry.incr();
                pending.retries += 1;
                let wait = Duration::from_millis(u64::from(ack.retry_after_ms));
                // Keep the queue in due order: waits differ between acks.
                let due = Instant::now() + wait;
                let position = self.retries.partition_point(|(other, _)| *other <= due);
                self.retries.insert(position, (due, ack.client_msg_id));
            }
            Status::Retry => {
                counters.ack_retry.incr();
                counters.given_up.incr();
                self.give_back_credit();
                self.pending.remove(&ack.client_msg_id);
            }
            Status::Rejected | Status::Unspecified => {
                counters.ack_rejected.incr();
                let user = &self.plan.user;
                shared.note_error(|| format!("send by {user} rejected: {}", ack.reason));
                self.give_back_credit();
                self.pending.remove(&ack.client_msg_id);
            }
        }
    }

    /// A send will never be delivered: let the user send another in its place.
    fn give_back_credit(&self) {
        self.shared.credits[self.plan.index].add_permits(1);
    }

    /// Handles a message received from the partner, by deliver or sync.
    fn on_message(&mut self, message: v1::Message) {
        let shared = &self.shared;
        let counters = &shared.counters;
        let now_us = shared.now_us();
        if message.conversation != self.plan.conversation || message.sender != self.plan.partner {
            counters.unexpected.incr();
            return;
        }
        let Some(payload) = Payload::decode(&message.body, shared.config.body_bytes) else {
            counters.corrupt.incr();
            return;
        };
        if message.id == 0 || message.seq == 0 {
            counters.corrupt.incr();
        }
        self.last_seq = self.last_seq.max(message.seq);
        if !self.seen.insert(payload.counter) {
            counters.duplicates.incr();
            return;
        }
        counters.delivered.incr();
        shared.credits[self.plan.partner_index].add_permits(1);
        if shared.in_window(now_us) {
            counters.window_delivered.incr();
        }
        if shared.in_window(payload.sent_us) {
            let latency = now_us.saturating_sub(payload.sent_us);
            shared.latency.record(self.plan.index, latency);
            shared.pair_latency(self.plan.crosses).record(self.plan.index, latency);
        }
        if let Some(timeline) = &shared.timeline {
            let (sent_us, delivered_us) = (shared.since_start(payload.sent_us), shared.since_start(now_us));
            timeline.record_delivery(self.plan.index, sent_us, delivered_us, self.plan.crosses);
        }
        if self.verify {
            self.outcome.delivered_ids.push(message.id);
        }
    }

    async fn request_sync(&mut self) {
        let rid = self.connection.next_rid();
        let sync = v1::Sync {
            cursors: vec![v1::Cursor { conversation: self.plan.conversation.clone(), seq: self.last_seq }],
            limit: 0,
        };
        self.write(&Frame::new(rid, sync)).await;
    }

    async fn on_sync_reply(&mut self, reply: v1::SyncReply) {
        let mut again = false;
        for conversation in reply.conversations {
            if conversation.conversation != self.plan.conversation {
                continue;
            }
            let cursor = self.last_seq;
            let mut highest = None;
            for message in conversation.messages {
                highest = highest.max(Some(message.seq));
                self.on_message(message);
            }
            if let Some(seq) = highest {
                let ack = v1::DeliverAck { conversation: self.plan.conversation.clone(), seq };
                self.write(&Frame::new(0, ack)).await;
                self.shared.counters.deliver_acks.incr();
            }
            self.last_seq = self.last_seq.max(conversation.complete_through_seq);
            // Pull again only while each round makes progress.
            again = conversation.latest_seq > self.last_seq && self.last_seq > cursor;
        }
        if again {
            self.request_sync().await;
        }
    }
}

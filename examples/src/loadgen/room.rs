//! Room fan-out mode of the load generator: N subscriber connections spread evenly over R
//! `room:` conversations, a few publisher connections sending into the rooms, and every
//! delivery timed.
//!
//! Subscribers only listen: they `subscribe` to their room during the connect phase and
//! then count and time each `deliver`. They send no `deliver_ack`, since PROTOCOL.md
//! pushes a room message once and never again, so an ack would only add load that a real
//! room client need not make. Publishers `subscribe` too (a send to a room is REJECTED
//! unless the connection is subscribed) and send into their room on a schedule or as fast
//! as their in-flight limit allows. A publisher's message is in flight until its
//! `send_ack` arrived *and* every subscriber of its room received it, so "as fast as
//! possible" stays bounded: no subscriber ever has more than `in_flight × publishers of
//! its room` frames queued, far below any slow-consumer limit. A message still short of a
//! subscriber after the drain timeout frees its credit anyway (counted as `expired`), so a
//! lost subscriber cannot stall its publisher.
//!
//! The run reuses the pair mode's phases, counters, histograms and [`Report`]: `delivered`
//! counts deliveries to subscribers (so `delivered_per_s` is deliveries per second over
//! all subscribers), `sent` counts published messages, and [`RoomFigures`] adds what only
//! rooms have — above all the deliveries expected (accepted messages × connected
//! subscribers of their room) against those received after the drain.

mod publisher;
mod subscriber;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use herald_proto::Encoding;
use tokio::{
    sync::{Semaphore, watch},
    time::Instant,
};

use super::{
    LoadConfig, LoadError, Phase, Shared, endpoint_of, micros, progress,
    report::{Report, RoomFigures},
    stats::{CountSnapshot, Counter, Counters, LatencyRecorder, LatencySummary},
    timeline::TimelineRecorder,
};
use herald_proto::v1::{self, Frame, frame::Body};

use crate::{Connection, ids::is_valid_name};

/// How a room run is laid out: which connections listen to and publish into which room.
///
/// Subscriber `i` listens to room `i mod rooms` and publisher `j` publishes into room
/// `j mod rooms`, so both are spread evenly: room sizes differ by at most one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomLoad {
    /// Rooms (`room:<prefix>-r<n>`), at least 1.
    pub rooms: usize,
    /// Subscriber connections over all rooms, at least one per room.
    pub subscribers: usize,
    /// Publisher connections, at least one per room.
    pub publishers: usize,
}

impl RoomLoad {
    /// One publisher per room.
    pub fn new(rooms: usize, subscribers: usize) -> Self {
        Self { rooms, subscribers, publishers: rooms }
    }

    /// The room subscriber `index` listens to.
    pub fn room_of_subscriber(&self, index: usize) -> usize {
        index % self.rooms.max(1)
    }

    /// The room publisher `index` sends into.
    pub fn room_of_publisher(&self, index: usize) -> usize {
        index % self.rooms.max(1)
    }

    /// How many subscribers listen to `room`.
    pub fn subscribers_in(&self, room: usize) -> usize {
        spread(self.subscribers, self.rooms, room)
    }

    /// How many publishers send into `room`.
    pub fn publishers_in(&self, room: usize) -> usize {
        spread(self.publishers, self.rooms, room)
    }

    /// Every connection of the run: subscribers, then publishers.
    pub fn connections(&self) -> usize {
        self.subscribers + self.publishers
    }

    fn validate(&self) -> Result<(), String> {
        if self.rooms == 0 {
            return Err("--rooms must be at least 1".to_owned());
        }
        if self.subscribers < self.rooms {
            return Err(format!(
                "--subscribers ({}) must be at least --rooms ({}): every room needs a subscriber",
                self.subscribers, self.rooms
            ));
        }
        if self.publishers < self.rooms {
            return Err(format!(
                "--publishers ({}) must be at least --rooms ({}): every room needs a publisher",
                self.publishers, self.rooms
            ));
        }
        Ok(())
    }
}

/// How many of `count` items land on slot `slot` of `slots` when item `i` goes to slot
/// `i mod slots`.
fn spread(count: usize, slots: usize, slot: usize) -> usize {
    if slots == 0 || slot >= slots {
        return 0;
    }
    count / slots + usize::from(slot < count % slots)
}

/// Deliveries a room run should see: each accepted message once per subscriber of its
/// room. `accepted[r]` and `subscribers[r]` are room `r`'s; missing entries count as 0.
pub fn expected_deliveries(accepted: &[u64], subscribers: &[u64]) -> u64 {
    accepted.iter().zip(subscribers).map(|(messages, listeners)| messages.saturating_mul(*listeners)).sum()
}

/// The conversation id of room `index`.
pub fn room_id(prefix: &str, index: usize) -> String {
    format!("room:{prefix}-r{index:04}")
}

/// The user id of subscriber `index`.
pub fn subscriber_id(prefix: &str, index: usize) -> String {
    format!("{prefix}-s{index:05}")
}

/// The user id of publisher `index`.
pub fn publisher_id(prefix: &str, index: usize) -> String {
    format!("{prefix}-p{index:03}")
}

/// The publisher number in a sender id made by [`publisher_id`], or `None` for any other
/// sender.
pub fn publisher_index(prefix: &str, sender: &str) -> Option<usize> {
    let digits = sender.strip_prefix(prefix)?.strip_prefix("-p")?;
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Room-only state shared by every connection task of a run.
#[derive(Debug)]
struct RoomShared {
    /// Conversation id of each room.
    room_ids: Vec<String>,
    /// Subscribers of each room that connected and subscribed (fixed once sending starts).
    subscribed: Vec<Counter>,
    /// Publishers that connected and subscribed.
    publishers_connected: Counter,
    /// Messages accepted (`send_ack` OK or DUPLICATE) into each room.
    accepted: Vec<Counter>,
    /// Per publisher: its messages in flight, by counter.
    in_flight: Vec<Mutex<HashMap<u64, InFlight>>>,
    /// Messages publishers received from other publishers.
    publisher_received: Counter,
    /// In-flight credits freed by the timeout.
    expired: Counter,
}

/// A published message not yet fully settled.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    /// Events still awaited: its `send_ack`, and one delivery per subscriber of its room.
    remaining: u64,
    /// When it was first written, for the timeout.
    written: Instant,
}

impl RoomShared {
    /// Deliveries expected so far, from the messages accepted until now.
    fn expected(&self) -> u64 {
        let accepted: Vec<u64> = self.accepted.iter().map(Counter::get).collect();
        let subscribed: Vec<u64> = self.subscribed.iter().map(Counter::get).collect();
        expected_deliveries(&accepted, &subscribed)
    }

    /// Publisher `publisher` wrote message `counter` into `room`.
    fn track(&self, publisher: usize, counter: u64, room: usize) {
        let remaining = self.subscribed[room].get() + 1;
        let mut table = self.in_flight[publisher].lock().unwrap_or_else(|p| p.into_inner());
        table.insert(counter, InFlight { remaining, written: Instant::now() });
    }

    /// One awaited event of `publisher`'s message `counter` happened; `true` if that was
    /// the last, so the message no longer holds a credit.
    fn settle(&self, publisher: usize, counter: u64) -> bool {
        let Some(table) = self.in_flight.get(publisher) else { return false };
        let mut table = table.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = table.get_mut(&counter) else { return false };
        entry.remaining = entry.remaining.saturating_sub(1);
        if entry.remaining == 0 {
            table.remove(&counter);
            true
        } else {
            false
        }
    }

    /// The message will never be delivered (REJECTED, given up): forget it; `true` if it
    /// still held a credit.
    fn abandon(&self, publisher: usize, counter: u64) -> bool {
        let mut table = self.in_flight[publisher].lock().unwrap_or_else(|p| p.into_inner());
        table.remove(&counter).is_some()
    }

    /// Forgets `publisher`'s messages written longer than `timeout` ago; how many.
    fn expire(&self, publisher: usize, timeout: Duration) -> usize {
        let mut table = self.in_flight[publisher].lock().unwrap_or_else(|p| p.into_inner());
        let before = table.len();
        table.retain(|_, entry| entry.written.elapsed() < timeout);
        let expired = before - table.len();
        self.expired.add(expired as u64);
        expired
    }
}

/// One connection's place in a room run.
#[derive(Debug, Clone)]
struct Plan {
    /// Subscriber or publisher number, from 0.
    index: usize,
    /// Its number over all connections (subscribers first), for shards and URLs.
    slot: usize,
    /// Its user id.
    user: String,
    /// The URL it connects to.
    url: String,
    /// Its room's number.
    room: usize,
    /// Its room's conversation id.
    conversation: String,
    /// Publishers in rate mode: time between sends.
    interval: Option<Duration>,
    /// Publishers in rate mode: when the first send is due after the start.
    offset: Duration,
}

/// Opens `plan`'s connection, logs in and subscribes to its room, within the connect
/// timeout.
async fn connect_and_subscribe(plan: &Plan, shared: &Shared) -> Result<Connection, String> {
    let config = &shared.config;
    let timeout = config.connect_timeout;
    let mut connection =
        Connection::open(&plan.url, config.encoding, timeout).await.map_err(|error| error.to_string())?;
    connection
        .login(&config.token_mode.token(&plan.user), &config.device, "herald-loadgen", timeout)
        .await
        .map_err(|error| error.to_string())?;
    let rid = connection.next_rid();
    let subscribe = v1::Subscribe { room: plan.conversation.clone(), since_seq: None };
    connection.send(&Frame::new(rid, subscribe)).await.map_err(|error| error.to_string())?;
    let answered = tokio::time::timeout(timeout, async {
        loop {
            match connection.recv().await {
                Ok(Frame { rid: answer, body: Some(Body::Subscribed(_)) }) if answer == rid => return Ok(()),
                Ok(Frame { body: Some(Body::Error(error)), .. }) if error.rid == rid => {
                    return Err(format!(
                        "subscribe to {} refused: {}: {}",
                        plan.conversation, error.code, error.message
                    ));
                }
                Ok(_) => {}
                Err(error) => return Err(error.to_string()),
            }
        }
    })
    .await
    .map_err(|_| format!("no answer to subscribe within {timeout:?}"))?;
    answered.map(|()| connection)
}

/// Checks the room settings (called by [`LoadConfig::validate`]).
pub(super) fn validate(config: &LoadConfig, load: &RoomLoad) -> Result<(), LoadError> {
    let fail = |message: String| Err(LoadError::Config(message));
    if let Err(message) = load.validate() {
        return fail(message);
    }
    let names = [
        subscriber_id(&config.user_prefix, load.subscribers.saturating_sub(1)),
        publisher_id(&config.user_prefix, load.publishers.saturating_sub(1)),
        room_id(&config.user_prefix, load.rooms.saturating_sub(1)),
    ];
    for name in names {
        let bare = name.strip_prefix("room:").unwrap_or(&name);
        if !is_valid_name(bare) {
            return fail(format!("`{name}` is not a valid id: --user-prefix must be A-Z a-z 0-9 . _ @ -, short"));
        }
    }
    Ok(())
}

/// Runs one room load test (see the module docs).
///
/// # Errors
///
/// [`LoadError::Config`] for settings out of range, [`LoadError::NoConnections`] if no
/// connection could be made.
pub(super) async fn run(config: LoadConfig, load: RoomLoad) -> Result<Report, LoadError> {
    let connections = load.connections();
    let shards = connections.clamp(1, 64);
    let interval = (config.rate > 0).then(|| Duration::from_secs_f64(load.publishers as f64 / config.rate as f64));
    let room = Arc::new(RoomShared {
        room_ids: (0..load.rooms).map(|index| room_id(&config.user_prefix, index)).collect(),
        subscribed: (0..load.rooms).map(|_| Counter::default()).collect(),
        publishers_connected: Counter::default(),
        accepted: (0..load.rooms).map(|_| Counter::default()).collect(),
        in_flight: (0..load.publishers).map(|_| Mutex::new(HashMap::new())).collect(),
        publisher_received: Counter::default(),
        expired: Counter::default(),
    });
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        start_us: AtomicU64::new(u64::MAX),
        window_start_us: AtomicU64::new(u64::MAX),
        window_end_us: AtomicU64::new(u64::MAX),
        counters: Counters::default(),
        latency: LatencyRecorder::new(shards),
        same_endpoint_latency: LatencyRecorder::new(1),
        cross_endpoint_latency: LatencyRecorder::new(1),
        ack_latency: LatencyRecorder::new(shards),
        send_lag: LatencyRecorder::new(shards),
        timeline: config.timeline.then(|| {
            let seconds = config.warmup.saturating_add(config.duration).saturating_add(config.drain_timeout);
            TimelineRecorder::new(seconds.as_secs_f64().ceil() as usize + 2)
        }),
        credits: (0..load.publishers).map(|_| Semaphore::new(config.in_flight)).collect(),
        first_error: Mutex::new(None),
        config,
    });
    let config = &shared.config;
    let (phase_tx, phase_rx) = watch::channel(Phase::Connecting);
    let gate = Arc::new(Semaphore::new(config.connect_concurrency));
    let progress = progress::Progress::new(config.progress, &config.label, connections as u64);
    let url_of = |slot: usize| config.urls[endpoint_of(slot, config.urls.len())].clone();

    let mut tasks = Vec::with_capacity(connections);
    for index in 0..load.subscribers {
        let room_index = load.room_of_subscriber(index);
        let plan = Plan {
            index,
            slot: index,
            user: subscriber_id(&config.user_prefix, index),
            url: url_of(index),
            room: room_index,
            conversation: room.room_ids[room_index].clone(),
            interval: None,
            offset: Duration::ZERO,
        };
        let (shared, room, phase, gate) = (Arc::clone(&shared), Arc::clone(&room), phase_rx.clone(), Arc::clone(&gate));
        tasks.push(tokio::spawn(subscriber::run(plan, shared, room, phase, gate)));
    }
    for index in 0..load.publishers {
        let room_index = load.room_of_publisher(index);
        let slot = load.subscribers + index;
        let plan = Plan {
            index,
            slot,
            user: publisher_id(&config.user_prefix, index),
            url: url_of(slot),
            room: room_index,
            conversation: room.room_ids[room_index].clone(),
            interval,
            offset: interval.map_or(Duration::ZERO, |every| every.mul_f64(index as f64 / load.publishers as f64)),
        };
        let (shared, room, phase, gate) = (Arc::clone(&shared), Arc::clone(&room), phase_rx.clone(), Arc::clone(&gate));
        tasks.push(tokio::spawn(publisher::run(plan, shared, room, phase, gate)));
    }
    drop(phase_rx);

    // Connect phase, bounded as the pair mode's.
    let connect_started = Instant::now();
    let waves = connections.div_ceil(config.connect_concurrency) as u32;
    let connect_deadline = connect_started + config.connect_timeout * 2 * (waves + 1);
    loop {
        let done = shared.counters.connected.get() + shared.counters.connect_failures.get();
        progress.connecting(done, shared.counters.connect_failures.get());
        if done >= connections as u64 || Instant::now() >= connect_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connect_time = connect_started.elapsed();
    let subscribed: u64 = room.subscribed.iter().map(Counter::get).sum();
    if subscribed == 0 || room.publishers_connected.get() == 0 {
        let _ = phase_tx.send(Phase::Stopped);
        progress.finish();
        for task in tasks {
            task.abort();
        }
        let first_error = shared.first_error.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_else(|| {
            format!("{subscribed} subscribers and {} publishers connected", room.publishers_connected.get())
        });
        return Err(LoadError::NoConnections { url: config.url_list(), first_error });
    }

    // Run phase: warm-up, then the window.
    let start_us = shared.now_us() + 20_000;
    let window_start_us = start_us + micros(config.warmup);
    let window_end_us = window_start_us + micros(config.duration);
    shared.start_us.store(start_us, Ordering::Relaxed);
    shared.window_start_us.store(window_start_us, Ordering::Relaxed);
    shared.window_end_us.store(window_end_us, Ordering::Relaxed);
    let _ = phase_tx.send(Phase::Running);
    let run_end = shared.instant_at(window_end_us);
    progress.running(config.warmup + config.duration);
    loop {
        let now = Instant::now();
        progress.tick(&CountSnapshot::of(&shared.counters), now.saturating_duration_since(shared.instant_at(start_us)));
        if now >= run_end {
            break;
        }
        tokio::time::sleep((run_end - now).min(Duration::from_millis(200))).await;
    }

    // Drain phase: no new sends; wait until every send settled and every expected
    // delivery arrived, or the timeout.
    let _ = phase_tx.send(Phase::Draining);
    progress.draining();
    let drain_started = Instant::now();
    let drained = loop {
        let counters = &shared.counters;
        let settled = counters.sends_settled() >= counters.sent.get();
        if settled && counters.delivered.get() >= room.expected() {
            break true;
        }
        if drain_started.elapsed() >= config.drain_timeout {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let drain_time = drain_started.elapsed();
    let _ = phase_tx.send(Phase::Stopped);
    for task in tasks {
        // Closing takes at most about a second per connection, all in parallel.
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    progress.finish();

    let counts = CountSnapshot::of(&shared.counters);
    let expected = room.expected();
    let figures = RoomFigures {
        rooms: load.rooms as u64,
        subscribers: load.subscribers as u64,
        subscribers_connected: room.subscribed.iter().map(Counter::get).sum(),
        publishers: load.publishers as u64,
        publishers_connected: room.publishers_connected.get(),
        expected,
        received: counts.delivered,
        missing: expected.saturating_sub(counts.delivered),
        publisher_received: room.publisher_received.get(),
        expired: room.expired.get(),
    };
    Ok(Report {
        label: config.label.clone(),
        url: config.url_list(),
        endpoints: config.urls.len() as u64,
        encoding: match config.encoding {
            Encoding::Proto => "proto",
            Encoding::Json => "json",
        },
        users: connections as u64,
        rate: config.rate,
        in_flight: config.in_flight as u64,
        body_bytes: config.body_bytes as u64,
        warmup: config.warmup,
        duration: config.duration,
        connect_time,
        drain_time,
        drained,
        counts,
        latency: LatencySummary::of(&shared.latency.merged()),
        ack_latency: LatencySummary::of(&shared.ack_latency.merged()),
        send_lag: (config.rate > 0).then(|| LatencySummary::of(&shared.send_lag.merged())),
        first_error: shared.first_error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        timeline: shared.timeline.as_ref().map(TimelineRecorder::timeline),
        rooms: Some(figures),
        ..Report::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribers_spread_evenly_over_rooms() {
        let load = RoomLoad::new(10, 1000);
        assert!((0..10).all(|room| load.subscribers_in(room) == 100));
        let uneven = RoomLoad { rooms: 3, subscribers: 10, publishers: 4 };
        assert_eq!((0..3).map(|room| uneven.subscribers_in(room)).collect::<Vec<_>>(), [4, 3, 3]);
        assert_eq!((0..3).map(|room| uneven.publishers_in(room)).collect::<Vec<_>>(), [2, 1, 1]);
        assert_eq!(uneven.subscribers_in(3), 0, "no such room");
        // The counts agree with where each connection goes.
        let mut counted = [0; 3];
        for subscriber in 0..uneven.subscribers {
            counted[uneven.room_of_subscriber(subscriber)] += 1;
        }
        assert_eq!(counted, [4, 3, 3]);
        assert_eq!(uneven.room_of_publisher(3), 0);
        assert_eq!(uneven.connections(), 14);
        let one = RoomLoad::new(1, 10_000);
        assert_eq!((one.subscribers_in(0), one.publishers_in(0)), (10_000, 1));
    }

    #[test]
    fn every_room_needs_a_subscriber_and_a_publisher() {
        assert!(RoomLoad::new(10, 1000).validate().is_ok());
        assert!(RoomLoad::new(0, 10).validate().is_err());
        assert!(RoomLoad::new(10, 9).validate().is_err());
        assert!(RoomLoad { rooms: 2, subscribers: 10, publishers: 1 }.validate().is_err());
    }

    #[test]
    fn expected_deliveries_are_messages_times_their_rooms_subscribers() {
        assert_eq!(expected_deliveries(&[5], &[10_000]), 50_000);
        assert_eq!(expected_deliveries(&[1, 2, 0], &[1000, 999, 1000]), 1000 + 1998);
        assert_eq!(expected_deliveries(&[], &[]), 0);
        assert_eq!(expected_deliveries(&[u64::MAX], &[2]), u64::MAX, "saturates");
    }

    #[test]
    fn ids_name_rooms_and_find_publishers_again() {
        assert_eq!(room_id("lg-abc", 3), "room:lg-abc-r0003");
        assert_eq!(subscriber_id("lg-abc", 42), "lg-abc-s00042");
        assert_eq!(publisher_id("lg-abc", 7), "lg-abc-p007");
        assert_eq!(publisher_index("lg-abc", &publisher_id("lg-abc", 7)), Some(7));
        assert_eq!(publisher_index("lg-abc", &publisher_id("lg-abc", 1234)), Some(1234));
        assert_eq!(publisher_index("lg-abc", "lg-abc-s00007"), None);
        assert_eq!(publisher_index("lg-abc", "lg-xyz-p007"), None);
        assert_eq!(publisher_index("lg-abc", "lg-abc-p"), None);
        assert_eq!(publisher_index("lg-abc", "lg-abc-p+7"), None);
    }

    #[test]
    fn a_message_holds_its_credit_until_acked_and_delivered_to_every_subscriber() {
        let room = RoomShared {
            room_ids: vec![room_id("t", 0)],
            subscribed: vec![Counter::default()],
            publishers_connected: Counter::default(),
            accepted: vec![Counter::default()],
            in_flight: vec![Mutex::new(HashMap::new())],
            publisher_received: Counter::default(),
            expired: Counter::default(),
        };
        room.subscribed[0].add(2);
        room.track(0, 0, 0);
        assert!(!room.settle(0, 0), "acked");
        assert!(!room.settle(0, 0), "first subscriber");
        assert!(room.settle(0, 0), "second subscriber: settled");
        assert!(!room.settle(0, 0), "already settled");
        room.track(0, 1, 0);
        assert!(room.abandon(0, 1));
        assert!(!room.abandon(0, 1));
        room.track(0, 2, 0);
        assert_eq!(room.expire(0, Duration::from_secs(60)), 0);
        assert_eq!(room.expire(0, Duration::ZERO), 1);
        assert_eq!(room.expired.get(), 1);
        room.accepted[0].add(3);
        assert_eq!(room.expected(), 6);
    }
}

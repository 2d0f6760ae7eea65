//! Intake protection: what a node takes in before it pushes back, so a surge is told to
//! come back later instead of queueing until every send is late (docs/decisions/0002).
//!
//! Token buckets (GCRA, the `governor` crate) on new sends per connection, per user and per
//! node, and on HTTP requests per client address; a cap on sends taken in and not yet done
//! (the node's backlog); caps on WebSocket connections per node and per IP address. Nothing
//! over a limit is dropped in silence or disconnected: a send gets `send_ack` RETRY with
//! `retry_after_ms`, an HTTP request 429 with `Retry-After`, a connection over a cap is
//! refused at the upgrade (503 node full, 429 too many from one address). Sized by
//! `[intake]` ([`IntakeConfig`]); `herald_intake_refused_total{limit}` counts the refusals
//! and `herald_send_backlog` shows the backlog.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, NotUntil, Quota, RateLimiter};

use super::delay::DelayGate;
use crate::config::IntakeConfig;
use crate::maps::DashMap;
use crate::model::UserId;

/// What a connection refused for a cap is told to wait before trying again.
const CONNECTION_RETRY: Duration = Duration::from_secs(5);
/// How often idle users' and addresses' buckets are forgotten.
const FORGET_EVERY: Duration = Duration::from_secs(60);

/// The limit that refused something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `intake.sends_per_connection`.
    Connection,
    /// `intake.sends_per_user`.
    User,
    /// `intake.sends_per_node`.
    Node,
    /// `intake.max_sends_in_flight`.
    Backlog,
    /// `intake.send_delay_target_ms`.
    Delay,
    /// `intake.http_requests_per_ip`.
    HttpClient,
    /// `intake.max_connections`.
    Connections,
    /// `intake.max_connections_per_ip`.
    ConnectionsPerIp,
}

impl Limit {
    /// The `limit` label of `herald_intake_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::User => "user",
            Self::Node => "node",
            Self::Backlog => "backlog",
            Self::Delay => "delay",
            Self::HttpClient => "http_client",
            Self::Connections => "connections",
            Self::ConnectionsPerIp => "connections_per_ip",
        }
    }

    /// What the client is told.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Connection => "too many sends on this connection (intake.sends_per_connection); retry later",
            Self::User => "too many sends by this user (intake.sends_per_user); retry later",
            Self::Node => "the server is taking in all it can (intake.sends_per_node); retry later",
            Self::Backlog => "the server's backlog is full (intake.max_sends_in_flight); retry later",
            Self::Delay => "the server answers sends slowly just now (intake.send_delay_target_ms); retry later",
            Self::HttpClient => "too many requests from this address (intake.http_requests_per_ip); retry later",
            Self::Connections => "this server holds all the connections it may (intake.max_connections)",
            Self::ConnectionsPerIp => "too many connections from this address (intake.max_connections_per_ip)",
        }
    }
}

/// A refusal: which limit, and how long until trying again can succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub limit: Limit,
    pub retry_after: Duration,
}

impl Refused {
    fn new(limit: Limit, retry_after: Duration) -> Self {
        metrics::counter!("herald_intake_refused_total", "limit" => limit.label()).increment(1);
        Self { limit, retry_after }
    }

    /// `retry_after` in whole milliseconds, at least 1.
    pub fn retry_after_ms(&self) -> u32 {
        u32::try_from(self.retry_after.as_millis()).unwrap_or(u32::MAX).max(1)
    }

    /// `retry_after` in whole seconds, rounded up (HTTP's `Retry-After`).
    pub fn retry_after_secs(&self) -> u64 {
        u64::try_from(self.retry_after.as_millis().div_ceil(1000)).unwrap_or(u64::MAX).max(1)
    }

    /// The HTTP answer: 503 when the node holds all the connections it may, 429 otherwise;
    /// `Retry-After` (seconds) and `retry-after-ms`, and PROTOCOL.md's error body with code
    /// `rate_limited` or `overloaded` and `retry_after_ms`.
    pub fn into_response(self) -> Response {
        let (status, code) = match self.limit {
            Limit::Connections => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            _ => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
        };
        let retry_after_ms = self.retry_after_ms();
        let body = serde_json::json!({
            "error": { "code": code, "message": self.limit.reason(), "retry_after_ms": retry_after_ms }
        });
        let mut response = (status, Json(body)).into_response();
        let headers = response.headers_mut();
        headers.insert(header::RETRY_AFTER, HeaderValue::from(self.retry_after_secs()));
        headers.insert("retry-after-ms", HeaderValue::from(retry_after_ms));
        response
    }
}

/// `rate` per second with `burst` (0: the rate) on top; `None` when `rate` is 0 (off).
fn quota(rate: u32, burst: u32) -> Option<Quota> {
    let rate = NonZeroU32::new(rate)?;
    Some(Quota::per_second(rate).allow_burst(NonZeroU32::new(burst).unwrap_or(rate)))
}

/// One connection's own bucket of sends.
pub struct SendBudget(Option<DefaultDirectRateLimiter>);

/// One connection's bucket of frames (`gateway.frames_per_second`): every frame it sends,
/// WebSocket pings included, takes a token. A client past it and its burst is flooding,
/// not sending fast (sends are turned back long before, with RETRY), and is closed.
pub struct FrameBudget {
    bucket: Option<DefaultDirectRateLimiter>,
    /// The rate, for the close reason.
    pub rate: u32,
}

impl FrameBudget {
    /// `rate` frames per second with `burst` on top; 0 turns it off.
    pub fn new(rate: u32, burst: u32) -> Self {
        Self { bucket: quota(rate, burst).map(RateLimiter::direct), rate }
    }

    /// Takes a token for one frame; `false` when the connection is over its budget.
    pub fn take(&self) -> bool {
        self.bucket.as_ref().is_none_or(|bucket| bucket.check().is_ok())
    }
}

/// A send taken in: counts in the node's backlog until dropped (once it is acked and
/// pushed, or refused).
#[must_use = "the send counts in the backlog while this is held"]
pub struct InFlight {
    backlog: Arc<AtomicUsize>,
    gate: Arc<DelayGate>,
}

impl InFlight {
    /// The send was answered after waiting `waited` for its ack: what the delay gate
    /// watches.
    pub fn answered(&self, waited: Duration) {
        self.gate.answered(waited, self.backlog.load(Ordering::Relaxed) > 1);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.backlog.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A WebSocket connection counted against the caps, until dropped.
#[must_use = "the connection counts against the caps while this is held"]
pub struct ConnectionPermit {
    intake: Arc<Intake>,
    ip: Option<IpAddr>,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        self.intake.connections.fetch_sub(1, Ordering::Relaxed);
        if let Some(ip) = self.ip {
            self.intake.per_ip.remove_if_mut(&ip, |_, count| {
                *count -= 1;
                *count == 0
            });
        }
    }
}

/// The node's intake: its buckets and counts.
pub struct Intake {
    config: IntakeConfig,
    clock: DefaultClock,
    per_user: Option<DefaultKeyedRateLimiter<UserId>>,
    per_node: Option<DefaultDirectRateLimiter>,
    per_http_client: Option<DefaultKeyedRateLimiter<IpAddr>>,
    in_flight: Arc<AtomicUsize>,
    /// Turns new sends back while none taken in is answered quickly.
    delay: Arc<DelayGate>,
    /// The next turn [`Intake::next_turn`] hands out, µs after `started`.
    next_turn_us: AtomicU64,
    started: std::time::Instant,
    connections: AtomicUsize,
    /// Open connections per address (only while `max_connections_per_ip` is set).
    per_ip: DashMap<IpAddr, usize>,
}

impl Intake {
    /// The intake `config` describes; call [`Intake::start_upkeep`] once it is shared.
    pub fn new(config: IntakeConfig) -> Self {
        Self {
            per_user: quota(config.sends_per_user, config.user_burst).map(RateLimiter::keyed),
            per_node: quota(config.sends_per_node, config.node_burst).map(RateLimiter::direct),
            per_http_client: quota(config.http_requests_per_ip, config.http_burst).map(RateLimiter::keyed),
            clock: DefaultClock::default(),
            in_flight: Arc::new(AtomicUsize::new(0)),
            delay: Arc::new(DelayGate::new(Duration::from_millis(u64::from(config.send_delay_target_ms)))),
            next_turn_us: AtomicU64::new(0),
            started: std::time::Instant::now(),
            connections: AtomicUsize::new(0),
            per_ip: DashMap::default(),
            config,
        }
    }

    /// Every second, publishes the backlog gauge; every minute, forgets the buckets of
    /// users and addresses that are full again (idle), so the maps hold only the active.
    /// Stops when the intake is dropped.
    pub fn start_upkeep(self: &Arc<Self>) {
        let intake: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut ticks = 0u64;
            loop {
                tick.tick().await;
                let Some(intake) = intake.upgrade() else { return };
                metrics::gauge!("herald_send_backlog").set(intake.backlog() as f64);
                ticks += 1;
                if ticks.is_multiple_of(FORGET_EVERY.as_secs()) {
                    intake.forget_idle();
                }
            }
        });
    }

    /// Forgets idle users' and addresses' buckets.
    pub fn forget_idle(&self) {
        if let Some(limiter) = &self.per_user {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        if let Some(limiter) = &self.per_http_client {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }

    /// Buckets held for users and HTTP client addresses (idle ones are forgotten every minute).
    pub fn buckets(&self) -> usize {
        self.per_user.as_ref().map_or(0, RateLimiter::len) + self.per_http_client.as_ref().map_or(0, RateLimiter::len)
    }

    /// Sends taken in and not yet done.
    pub fn backlog(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Open WebSocket connections counted.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// A new connection's bucket of sends.
    pub fn send_budget(&self) -> SendBudget {
        SendBudget(quota(self.config.sends_per_connection, self.config.connection_burst).map(RateLimiter::direct))
    }

    /// Takes in one send by `user` on the connection whose bucket is `budget`, or says
    /// which limit refuses it and for how long. Checked in order: the backlog, the delay
    /// gate, the connection, the user, the node (a send refused late has used the earlier buckets'
    /// tokens, as an attempt should).
    ///
    /// # Errors
    /// [`Refused`] naming the limit and when to retry.
    pub fn admit_send(&self, budget: &SendBudget, user: &UserId) -> Result<InFlight, Refused> {
        let taken = self.in_flight.fetch_add(1, Ordering::Relaxed);
        let in_flight = InFlight { backlog: Arc::clone(&self.in_flight), gate: Arc::clone(&self.delay) };
        if self.config.max_sends_in_flight > 0 && taken >= self.config.max_sends_in_flight {
            return Err(Refused::new(Limit::Backlog, self.spread_floor()));
        }
        if self.delay.is_shut(taken > 0) {
            return Err(Refused::new(Limit::Delay, self.spread_floor()));
        }
        if let Some(limiter) = &budget.0 {
            limiter.check().map_err(|wait| self.refused(Limit::Connection, &wait))?;
        }
        if let Some(limiter) = &self.per_user {
            limiter.check_key(user).map_err(|wait| self.refused(Limit::User, &wait))?;
        }
        if let Some(limiter) = &self.per_node {
            limiter.check().map_err(|wait| {
                let wait = wait.wait_time_from(self.clock.now());
                Refused::new(Limit::Node, self.next_turn(wait))
            })?;
        }
        Ok(in_flight)
    }

    /// Takes in one HTTP request from `client`.
    ///
    /// # Errors
    /// [`Refused`] with when to retry.
    pub fn admit_http(&self, client: IpAddr) -> Result<(), Refused> {
        match &self.per_http_client {
            Some(limiter) => limiter.check_key(&client).map_err(|wait| self.refused(Limit::HttpClient, &wait)),
            None => Ok(()),
        }
    }

    /// Counts a new WebSocket connection from `ip` (unknown when the server was not given
    /// client addresses), or refuses it: the node is full, or `ip` has its share.
    ///
    /// # Errors
    /// [`Refused`] naming the cap.
    pub fn open_connection(self: &Arc<Self>, ip: Option<IpAddr>) -> Result<ConnectionPermit, Refused> {
        let open = self.connections.fetch_add(1, Ordering::Relaxed);
        let mut permit = ConnectionPermit { intake: Arc::clone(self), ip: None };
        if self.config.max_connections > 0 && open >= self.config.max_connections {
            return Err(Refused::new(Limit::Connections, CONNECTION_RETRY));
        }
        if let (Some(ip), cap @ 1..) = (ip, self.config.max_connections_per_ip) {
            let mut count = self.per_ip.entry(ip).or_insert(0);
            *count += 1;
            permit.ip = Some(ip);
            if *count > cap {
                drop(count);
                return Err(Refused::new(Limit::ConnectionsPerIp, CONNECTION_RETRY));
            }
        }
        Ok(permit)
    }

    /// The wait told to a send the node bucket refused: its turn in a queue of the
    /// sends turned back, which hands out turns `1 / sends_per_node` apart from
    /// `node_retry_after_ms` on. The clients come back at the pace the node takes sends
    /// in, however many were turned back (a wait of the bucket's own, a fraction of a
    /// millisecond, would bring them all back at once to fight over one token, and a
    /// fixed wait would bring back every one of them each period). At most
    /// `node_retry_after_max_ms`; at least `wait`, when the bucket has a token again.
    fn next_turn(&self, wait: Duration) -> Duration {
        let rate = u64::from(self.config.sends_per_node.max(1));
        let step = (1_000_000 / rate).max(1);
        let floor = u64::from(self.config.node_retry_after_ms) * 1_000;
        let most = u64::from(self.config.node_retry_after_max_ms.max(self.config.node_retry_after_ms)) * 1_000;
        let now = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut turn = 0;
        // Infallible: the closure always returns Some.
        let _ = self.next_turn_us.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
            turn = next.max(now + floor).min(now + most);
            Some(turn + step)
        });
        Duration::from_micros(turn - now).max(wait)
    }

    /// The wait told to a send the backlog cap or the delay gate refused: `node_retry_after_ms` to twice
    /// that, at random, so the clients turned back do not all return at once.
    fn spread_floor(&self) -> Duration {
        let floor = u64::from(self.config.node_retry_after_ms);
        Duration::from_millis(floor + rand::random_range(0..floor.max(1)))
    }

    fn refused(&self, limit: Limit, wait: &NotUntil<<DefaultClock as Clock>::Instant>) -> Refused {
        Refused::new(limit, wait.wait_time_from(self.clock.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserId {
        UserId::parse(name).expect("a valid user id")
    }

    fn config() -> IntakeConfig {
        IntakeConfig {
            sends_per_connection: 10,
            connection_burst: 5,
            sends_per_user: 0,
            sends_per_node: 0,
            max_sends_in_flight: 0,
            ..IntakeConfig::default()
        }
    }

    #[test]
    fn a_connection_gets_its_burst_then_a_wait_of_about_one_token() {
        let intake = Intake::new(config());
        let budget = intake.send_budget();
        let alice = user("alice");
        let taken: Vec<_> = (0..5).map(|_| intake.admit_send(&budget, &alice).expect("taken in")).collect();
        let refused = intake.admit_send(&budget, &alice).err().expect("refused");
        assert_eq!(refused.limit, Limit::Connection);
        // 10 a second: the next token is at most 100 ms away.
        assert!(refused.retry_after <= Duration::from_millis(100), "{refused:?}");
        assert!(refused.retry_after_ms() >= 1);
        assert_eq!(intake.backlog(), 5, "a refused send does not stay in the backlog");
        drop(taken);
        assert_eq!(intake.backlog(), 0);
        // Another connection has a bucket of its own.
        assert!(intake.admit_send(&intake.send_budget(), &alice).is_ok());
    }

    #[test]
    fn a_user_is_limited_over_all_their_connections() {
        let intake = Intake::new(IntakeConfig { sends_per_user: 3, user_burst: 3, ..config() });
        let alice = user("alice");
        for _ in 0..3 {
            drop(intake.admit_send(&intake.send_budget(), &alice).expect("taken in"));
        }
        let refused = intake.admit_send(&intake.send_budget(), &alice).err().expect("refused");
        assert_eq!(refused.limit, Limit::User);
        assert!(intake.admit_send(&intake.send_budget(), &user("bob")).is_ok(), "bob has his own");
        assert_eq!(intake.per_user.as_ref().map_or(0, RateLimiter::len), 2, "a bucket per user");
    }

    /// The gate itself is tested in `delay.rs`; here, that its verdict reaches the intake.
    /// The sleeps only end a window (set-up); what is refused does not depend on their length.
    #[test]
    fn sends_answered_slowly_for_a_whole_window_turn_new_ones_back_until_one_is_quick() {
        let intake = Intake::new(IntakeConfig { send_delay_target_ms: 10, ..config() });
        let budget = intake.send_budget();
        let still_waiting = intake.admit_send(&budget, &user("a")).expect("taken in");
        let slow = intake.admit_send(&budget, &user("a")).expect("taken in");
        slow.answered(Duration::from_millis(50));
        drop(slow);
        std::thread::sleep(super::super::delay::WINDOW);
        let refused = intake.admit_send(&budget, &user("a")).err().expect("refused");
        assert_eq!((refused.limit, refused.limit.label()), (Limit::Delay, "delay"));
        assert!(refused.retry_after >= Duration::from_millis(100), "node_retry_after_ms at least: {refused:?}");
        still_waiting.answered(Duration::from_millis(2));
        std::thread::sleep(super::super::delay::WINDOW);
        assert!(intake.admit_send(&budget, &user("a")).is_ok(), "one quick answer opens it again");
    }

    #[test]
    fn the_backlog_cap_refuses_until_a_send_is_done() {
        let intake = Intake::new(IntakeConfig { max_sends_in_flight: 2, sends_per_connection: 0, ..config() });
        let budget = intake.send_budget();
        let first = intake.admit_send(&budget, &user("a")).expect("taken in");
        let _second = intake.admit_send(&budget, &user("a")).expect("taken in");
        let refused = intake.admit_send(&budget, &user("a")).err().expect("refused");
        assert_eq!(refused.limit, Limit::Backlog);
        let floor = Duration::from_millis(100);
        assert!((floor..2 * floor).contains(&refused.retry_after), "{refused:?}");
        drop(first);
        assert!(intake.admit_send(&budget, &user("a")).is_ok());
    }

    #[test]
    fn the_node_bucket_holds_across_users() {
        let intake =
            Intake::new(IntakeConfig { sends_per_node: 2, node_burst: 2, sends_per_connection: 0, ..config() });
        drop(intake.admit_send(&intake.send_budget(), &user("a")).expect("taken in"));
        drop(intake.admit_send(&intake.send_budget(), &user("b")).expect("taken in"));
        assert_eq!(intake.admit_send(&intake.send_budget(), &user("c")).err().expect("refused").limit, Limit::Node);
    }

    #[test]
    fn sends_refused_for_the_node_are_given_turns_at_the_nodes_pace() {
        let intake = Intake::new(IntakeConfig {
            sends_per_node: 100,
            node_burst: 1,
            sends_per_connection: 0,
            node_retry_after_ms: 50,
            node_retry_after_max_ms: 300,
            ..config()
        });
        drop(intake.admit_send(&intake.send_budget(), &user("a")).expect("taken in"));
        let waits: Vec<Duration> = (0..60)
            .map(|_| intake.admit_send(&intake.send_budget(), &user("b")).err().expect("refused").retry_after)
            .collect();
        // The bucket's own wait is at most 10 ms (100 a second). The turned-back are told
        // to come back from 50 ms on, one turn per 10 ms (the node's pace), and never
        // later than 300 ms.
        let ms = Duration::from_millis;
        assert!(waits.iter().all(|wait| (ms(45)..=ms(300)).contains(wait)), "{waits:?}");
        assert!(waits[0] <= ms(50), "the first turn is at the floor: {:?}", waits[0]);
        assert!((ms(140)..=ms(150)).contains(&waits[10]), "ten turns later, 100 ms later: {:?}", waits[10]);
        assert!(waits[30..].iter().all(|wait| *wait >= ms(290)), "capped at the most: {:?}", &waits[30..]);
        // Turns not taken lapse: once the queue is in the past, a refusal is at the floor again.
        std::thread::sleep(ms(350));
        drop(intake.admit_send(&intake.send_budget(), &user("a")).expect("a token again"));
        let refused = intake.admit_send(&intake.send_budget(), &user("c")).err().expect("refused");
        assert!(refused.retry_after <= ms(50), "{refused:?}");
    }

    #[test]
    fn connection_caps_count_open_connections_and_free_them_when_closed() {
        let intake = Arc::new(Intake::new(IntakeConfig { max_connections: 3, max_connections_per_ip: 2, ..config() }));
        let (a, b): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().expect("an address"), "10.0.0.2".parse().expect("an address"));
        let first = intake.open_connection(Some(a)).expect("taken in");
        let second = intake.open_connection(Some(a)).expect("taken in");
        assert_eq!(intake.open_connection(Some(a)).err().expect("refused").limit, Limit::ConnectionsPerIp);
        let _third = intake.open_connection(Some(b)).expect("taken in");
        assert_eq!(intake.open_connection(Some(b)).err().expect("refused").limit, Limit::Connections);
        assert_eq!(intake.connections(), 3, "refused connections are not counted");
        drop(first);
        let again = intake.open_connection(Some(a)).expect("taken in");
        assert_eq!(intake.per_ip.get(&a).map(|count| *count), Some(2));
        drop(second);
        drop(again);
        assert!(intake.per_ip.get(&a).is_none(), "an address with no connection is forgotten");
    }

    #[test]
    fn a_rate_of_zero_turns_a_limit_off() {
        let intake = Intake::new(IntakeConfig {
            sends_per_connection: 0,
            sends_per_user: 0,
            sends_per_node: 0,
            max_sends_in_flight: 0,
            http_requests_per_ip: 0,
            ..IntakeConfig::default()
        });
        let budget = intake.send_budget();
        let held: Vec<_> = (0..10_000).map(|_| intake.admit_send(&budget, &user("a")).expect("taken in")).collect();
        assert_eq!(intake.backlog(), held.len());
        assert!((0..10_000).all(|_| intake.admit_http("10.0.0.1".parse().expect("an address")).is_ok()));
    }

    #[test]
    fn http_clients_are_limited_per_address() {
        let intake = Intake::new(IntakeConfig { http_requests_per_ip: 1, http_burst: 2, ..config() });
        let (a, b): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().expect("an address"), "10.0.0.2".parse().expect("an address"));
        assert!(intake.admit_http(a).is_ok() && intake.admit_http(a).is_ok());
        let refused = intake.admit_http(a).expect_err("refused");
        assert_eq!(refused.limit, Limit::HttpClient);
        assert_eq!(refused.retry_after_secs(), 1);
        assert!(intake.admit_http(b).is_ok());
    }
}

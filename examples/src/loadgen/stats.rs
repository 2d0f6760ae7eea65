//! What a load run counts and measures: event counters shared by every simulated user,
//! latency histograms, and the [`Report`] they add up to.
//!
//! Counters are relaxed atomics (they are read for progress and once at the end, never to
//! synchronise); histograms are sharded behind mutexes so a thousand user tasks rarely
//! meet on one lock.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use super::{room::RoomFigures, timeline::Timeline};

/// Highest latency a histogram records precisely, in microseconds (one minute); larger
/// values are clamped to it.
pub(super) const MAX_TRACKED_US: u64 = 60_000_000;

/// One event counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn incr(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Everything a run counts. "Window" counters only count events inside the measurement
/// window (after warm-up, before the end of the duration).
#[derive(Debug, Default)]
pub struct Counters {
    /// Users whose connect and login succeeded.
    pub connected: Counter,
    /// Users whose connect or login failed.
    pub connect_failures: Counter,
    /// Distinct messages sent (a resend after RETRY is not counted again).
    pub sent: Counter,
    /// Messages sent inside the window.
    pub window_sent: Counter,
    /// Resends after a RETRY `send_ack`.
    pub resent: Counter,
    /// `send_ack` OK.
    pub ack_ok: Counter,
    /// `send_ack` DUPLICATE.
    pub ack_duplicate: Counter,
    /// `send_ack` REJECTED.
    pub ack_rejected: Counter,
    /// `send_ack` RETRY.
    pub ack_retry: Counter,
    /// Sends abandoned after too many RETRYs.
    pub given_up: Counter,
    /// Distinct messages received by their recipient (deliver or sync).
    pub delivered: Counter,
    /// Distinct messages received inside the window.
    pub window_delivered: Counter,
    /// Messages received again (redelivery or overlap of deliver and sync).
    pub duplicates: Counter,
    /// Delivers with `attempt` > 1.
    pub redelivered: Counter,
    /// `deliver_ack`s sent.
    pub deliver_acks: Counter,
    /// Received messages whose body, ids, sender or conversation were wrong.
    pub corrupt: Counter,
    /// Frames that made no sense (unknown `client_msg_id`, a frame the client never asks
    /// for).
    pub unexpected: Counter,
    /// `error` frames from the server.
    pub server_errors: Counter,
    /// Connections lost during the run.
    pub disconnects: Counter,
    /// `sync_hint`s received (push degraded to pull).
    pub sync_hints: Counter,
    /// `go_away`s received.
    pub go_aways: Counter,
}

impl Counters {
    /// Every count that means something went wrong.
    pub fn errors(&self) -> u64 {
        self.connect_failures.get()
            + self.ack_rejected.get()
            + self.given_up.get()
            + self.corrupt.get()
            + self.unexpected.get()
            + self.server_errors.get()
            + self.disconnects.get()
    }

    /// Sends whose outcome is final: acknowledged OK, DUPLICATE or REJECTED, or given up.
    pub fn sends_settled(&self) -> u64 {
        self.ack_ok.get() + self.ack_duplicate.get() + self.ack_rejected.get() + self.given_up.get()
    }
}

/// A latency histogram split into shards, each behind its own lock.
#[derive(Debug)]
pub struct LatencyRecorder {
    /// Shard `i` serves the users whose index is `i` modulo the shard count.
    shards: Vec<Mutex<Histogram<u64>>>,
}

impl LatencyRecorder {
    /// A recorder with `shards` shards (at least one).
    ///
    /// # Panics
    ///
    /// Never in practice: the histogram bounds are constants that hdrhistogram accepts.
    pub fn new(shards: usize) -> Self {
        Self { shards: (0..shards.max(1)).map(|_| Mutex::new(new_histogram())).collect() }
    }

    /// Records one latency, in microseconds, on the shard of user `user`.
    pub fn record(&self, user: usize, micros: u64) {
        let shard = &self.shards[user % self.shards.len()];
        let mut histogram = shard.lock().unwrap_or_else(|poison| poison.into_inner());
        histogram.saturating_record(micros.clamp(1, MAX_TRACKED_US));
    }

    /// All shards merged.
    pub fn merged(&self) -> Histogram<u64> {
        let mut total = new_histogram();
        for shard in &self.shards {
            let histogram = shard.lock().unwrap_or_else(|poison| poison.into_inner());
            // Same bounds on both sides: adding cannot fail.
            let _ = total.add(&*histogram);
        }
        total
    }
}

#[allow(clippy::expect_used, reason = "constant bounds that hdrhistogram accepts")]
fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_TRACKED_US, 3).expect("valid histogram bounds")
}

/// Percentiles of a latency histogram, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest value.
    pub max_us: u64,
    /// Mean.
    pub mean_us: f64,
}

impl LatencySummary {
    /// Summarises a histogram (all zero if it is empty).
    pub fn of<T: hdrhistogram::Counter>(histogram: &Histogram<T>) -> Self {
        if histogram.is_empty() {
            return Self::default();
        }
        Self {
            count: histogram.len(),
            p50_us: histogram.value_at_quantile(0.50),
            p90_us: histogram.value_at_quantile(0.90),
            p99_us: histogram.value_at_quantile(0.99),
            p999_us: histogram.value_at_quantile(0.999),
            max_us: histogram.max(),
            mean_us: histogram.mean(),
        }
    }

    /// The summary as a JSON object (`count`, `p50_us`, … `max_us`, `mean_us`).
    pub fn to_json(self) -> Value {
        json!({
            "count": self.count,
            "p50_us": self.p50_us,
            "p90_us": self.p90_us,
            "p99_us": self.p99_us,
            "p999_us": self.p999_us,
            "max_us": self.max_us,
            "mean_us": (self.mean_us * 10.0).round() / 10.0,
        })
    }
}

/// Cross-check of ids, when the run kept them (`--verify`): every message acknowledged
/// OK must reach its recipient with the same id, and nothing else may arrive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verification {
    /// Distinct message ids acknowledged OK or DUPLICATE to senders.
    pub acked_ids: u64,
    /// Distinct message ids received by recipients.
    pub delivered_ids: u64,
    /// Acknowledged but never received.
    pub missing: u64,
    /// Received but never acknowledged to the sender.
    pub unacknowledged: u64,
}

impl Verification {
    /// Whether every acknowledged message arrived and nothing else did.
    pub fn is_exact(&self) -> bool {
        self.missing == 0 && self.unacknowledged == 0 && self.acked_ids == self.delivered_ids
    }
}

/// The outcome of one load run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// What was measured (`herald`, `relay`, …).
    pub label: String,
    /// The target URL; several are comma-separated.
    pub url: String,
    /// How many URLs the users were spread over (round-robin).
    pub endpoints: u64,
    /// Pairs of users.
    pub pairs: u64,
    /// Pairs whose two users connected to different URLs.
    pub cross_endpoint_pairs: u64,
    /// `proto` or `json`.
    pub encoding: &'static str,
    /// Simulated users.
    pub users: u64,
    /// Target total send rate (0 = as fast as the in-flight limit allows).
    pub rate: u64,
    /// In-flight limit per user.
    pub in_flight: u64,
    /// Body size.
    pub body_bytes: u64,
    /// Warm-up before the window.
    pub warmup: Duration,
    /// Length of the measurement window.
    pub duration: Duration,
    /// Time to connect and log in every user.
    pub connect_time: Duration,
    /// Time spent waiting for in-flight messages after the window.
    pub drain_time: Duration,
    /// Whether every sent message settled before the drain timeout.
    pub drained: bool,
    /// Counter values at the end.
    pub counts: CountSnapshot,
    /// Send → deliver latency of messages sent inside the window.
    pub latency: LatencySummary,
    /// The same, of pairs whose users connected to one URL.
    pub same_endpoint_latency: LatencySummary,
    /// The same, of pairs whose users connected to different URLs.
    pub cross_endpoint_latency: LatencySummary,
    /// Send → `send_ack` latency of messages sent inside the window.
    pub ack_latency: LatencySummary,
    /// In rate mode, how far behind schedule the generator wrote its sends (lateness up
    /// to 2 ms is stamped as the real send time, beyond that it counts as latency).
    pub send_lag: Option<LatencySummary>,
    /// The id cross-check, if asked for.
    pub verification: Option<Verification>,
    /// The first failure any user saw (connect, lost connection, rejected send).
    pub first_error: Option<String>,
    /// The run second by second, if it was asked for ([`super::LoadConfig::timeline`]).
    pub timeline: Option<Timeline>,
    /// A room run's own figures; `None` for pairs. In a room run `users` counts every
    /// connection, `counts.sent` the messages published and `counts.delivered` the
    /// deliveries to subscribers.
    pub rooms: Option<RoomFigures>,
}

/// The counters' values at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs, reason = "one field per Counters field, documented there")]
pub struct CountSnapshot {
    pub connected: u64,
    pub connect_failures: u64,
    pub sent: u64,
    pub window_sent: u64,
    pub resent: u64,
    pub ack_ok: u64,
    pub ack_duplicate: u64,
    pub ack_rejected: u64,
    pub ack_retry: u64,
    pub given_up: u64,
    pub delivered: u64,
    pub window_delivered: u64,
    pub duplicates: u64,
    pub redelivered: u64,
    pub deliver_acks: u64,
    pub corrupt: u64,
    pub unexpected: u64,
    pub server_errors: u64,
    pub disconnects: u64,
    pub sync_hints: u64,
    pub go_aways: u64,
    pub errors: u64,
}

impl CountSnapshot {
    /// What the drain still waited for: sends without a final answer (neither accepted,
    /// rejected nor given up after RETRYs), and accepted ones not yet delivered.
    pub fn not_drained(&self) -> (u64, u64) {
        let accepted = self.ack_ok + self.ack_duplicate;
        let answered = accepted + self.ack_rejected + self.given_up;
        (self.sent.saturating_sub(answered), accepted.saturating_sub(self.delivered))
    }

    /// Reads every counter.
    pub fn of(counters: &Counters) -> Self {
        Self {
            connected: counters.connected.get(),
            connect_failures: counters.connect_failures.get(),
            sent: counters.sent.get(),
            window_sent: counters.window_sent.get(),
            resent: counters.resent.get(),
            ack_ok: counters.ack_ok.get(),
            ack_duplicate: counters.ack_duplicate.get(),
            ack_rejected: counters.ack_rejected.get(),
            ack_retry: counters.ack_retry.get(),
            given_up: counters.given_up.get(),
            delivered: counters.delivered.get(),
            window_delivered: counters.window_delivered.get(),
            duplicates: counters.duplicates.get(),
            redelivered: counters.redelivered.get(),
            deliver_acks: counters.deliver_acks.get(),
            corrupt: counters.corrupt.get(),
            unexpected: counters.unexpected.get(),
            server_errors: counters.server_errors.get(),
            disconnects: counters.disconnects.get(),
            sync_hints: counters.sync_hints.get(),
            go_aways: counters.go_aways.get(),
            errors: counters.errors(),
        }
    }
}

impl Report {
    /// Distinct messages delivered per second of the window.
    pub fn delivered_per_second(&self) -> f64 {
        per_second(self.counts.window_delivered, self.duration)
    }

    /// Distinct messages sent per second of the window.
    pub fn sent_per_second(&self) -> f64 {
        per_second(self.counts.window_sent, self.duration)
    }

    /// The report as one JSON object, for scripts.
    pub fn to_json(&self) -> Value {
        let c = &self.counts;
        let mut value = json!({
            "label": self.label,
            "url": self.url,
            "endpoints": self.endpoints,
            "pairs": self.pairs,
            "cross_endpoint_pairs": self.cross_endpoint_pairs,
            "encoding": self.encoding,
            "users": self.users,
            "connected": c.connected,
            "rate": self.rate,
            "in_flight": self.in_flight,
            "body_bytes": self.body_bytes,
            "warmup_s": self.warmup.as_secs_f64(),
            "duration_s": self.duration.as_secs_f64(),
            "connect_s": round3(self.connect_time.as_secs_f64()),
            "drain_s": round3(self.drain_time.as_secs_f64()),
            "drained": self.drained,
            "sent_per_s": self.sent_per_second().round(),
            "delivered_per_s": self.delivered_per_second().round(),
            "counts": {
                "connect_failures": c.connect_failures,
                "sent": c.sent,
                "window_sent": c.window_sent,
                "resent": c.resent,
                "send_ack_ok": c.ack_ok,
                "send_ack_duplicate": c.ack_duplicate,
                "send_ack_rejected": c.ack_rejected,
                "send_ack_retry": c.ack_retry,
                "given_up": c.given_up,
                "delivered": c.delivered,
                "window_delivered": c.window_delivered,
                "duplicates": c.duplicates,
                "redelivered": c.redelivered,
                "deliver_acks": c.deliver_acks,
                "corrupt": c.corrupt,
                "unexpected": c.unexpected,
                "server_errors": c.server_errors,
                "disconnects": c.disconnects,
                "sync_hints": c.sync_hints,
                "go_aways": c.go_aways,
                "errors": c.errors,
            },
            "latency": self.latency.to_json(),
            "same_endpoint_latency": self.same_endpoint_latency.to_json(),
            "cross_endpoint_latency": self.cross_endpoint_latency.to_json(),
            "send_ack_latency": self.ack_latency.to_json(),
        });
        if let (Some(rooms), Some(object)) = (&self.rooms, value.as_object_mut()) {
            object.insert("rooms".to_owned(), rooms.to_json());
        }
        if let (Some(lag), Some(object)) = (self.send_lag, value.as_object_mut()) {
            object.insert("send_lag".to_owned(), lag.to_json());
        }
        if let (Some(error), Some(object)) = (&self.first_error, value.as_object_mut()) {
            object.insert("first_error".to_owned(), json!(error));
        }
        if let (Some(verification), Some(object)) = (self.verification, value.as_object_mut()) {
            object.insert(
                "verification".to_owned(),
                json!({
                    "acked_ids": verification.acked_ids,
                    "delivered_ids": verification.delivered_ids,
                    "missing": verification.missing,
                    "unacknowledged": verification.unacknowledged,
                    "exact": verification.is_exact(),
                }),
            );
        }
        value
    }

    /// A few lines for people. The lines and their words are what scripts grep (e.g.
    /// `send->deliver latency:`): add lines rather than change these. With several
    /// endpoints, lines on the pairs and their latencies follow the overall latency.
    pub fn to_text(&self) -> String {
        if let Some(rooms) = &self.rooms {
            return self.room_text(rooms);
        }
        let c = &self.counts;
        let mut text = format!(
            "{label}: {url} ({encoding}), {connected}/{users} users connected in {connect:.2}s, \
             rate {rate}, {body} B bodies, in-flight {in_flight}/user\n\
             \x20 window {window:.1}s after {warmup:.1}s warm-up: \
             sent {sent_rate:.0} msg/s, delivered {delivered_rate:.0} msg/s\n\
             \x20 send->deliver latency: p50 {p50} p99 {p99} p999 {p999} max {max} ({n} samples)\n\
             {by_endpoint}\
             \x20 send->send_ack latency: p50 {a50} p99 {a99} p999 {a999} max {amax}\n\
             \x20 totals: sent {sent} ack OK {ok} dup {dup} rejected {rej} retry {retry} | \
             delivered {delivered} acked {acks} dup {dups} redelivered {redelivered} | \
             errors {errors}{drained}",
            label = self.label,
            url = self.url,
            encoding = self.encoding,
            connected = c.connected,
            users = self.users,
            connect = self.connect_time.as_secs_f64(),
            rate = if self.rate == 0 { "max".to_owned() } else { format!("{}/s", self.rate) },
            body = self.body_bytes,
            in_flight = self.in_flight,
            window = self.duration.as_secs_f64(),
            warmup = self.warmup.as_secs_f64(),
            sent_rate = self.sent_per_second(),
            delivered_rate = self.delivered_per_second(),
            p50 = format_us(self.latency.p50_us),
            p99 = format_us(self.latency.p99_us),
            p999 = format_us(self.latency.p999_us),
            max = format_us(self.latency.max_us),
            n = self.latency.count,
            by_endpoint = self.by_endpoint_text(),
            a50 = format_us(self.ack_latency.p50_us),
            a99 = format_us(self.ack_latency.p99_us),
            a999 = format_us(self.ack_latency.p999_us),
            amax = format_us(self.ack_latency.max_us),
            sent = c.sent,
            ok = c.ack_ok,
            dup = c.ack_duplicate,
            rej = c.ack_rejected,
            retry = c.ack_retry,
            delivered = c.delivered,
            acks = c.deliver_acks,
            dups = c.duplicates,
            redelivered = c.redelivered,
            errors = c.errors,
            drained = if self.drained {
                String::new()
            } else {
                let (unanswered, undelivered) = c.not_drained();
                format!(
                    " (not drained at the drain timeout: {unanswered} sends without a final answer, \
                     {undelivered} accepted and not yet delivered)"
                )
            },
        );
        if let Some(verification) = self.verification {
            text.push_str(&format!(
                "\n  ids: {} acked, {} delivered, {} missing, {} unacknowledged: {}",
                verification.acked_ids,
                verification.delivered_ids,
                verification.missing,
                verification.unacknowledged,
                if verification.is_exact() { "exact" } else { "MISMATCH" }
            ));
        }
        if let Some(lag) = self.send_lag {
            text.push_str(&format!(
                "\n  generator lag behind schedule: p50 {} p99 {} max {}",
                format_us(lag.p50_us),
                format_us(lag.p99_us),
                format_us(lag.max_us)
            ));
        }
        if let Some(error) = &self.first_error {
            text.push_str(&format!("\n  first error: {error}"));
        }
        text
    }

    /// [`Report::to_text`] of a room run: the same latency lines, with deliveries counted
    /// per subscriber and the expected ones checked.
    fn room_text(&self, rooms: &RoomFigures) -> String {
        let c = &self.counts;
        let mut text = format!(
            "{label}: {url} ({encoding}), rooms: {rooms} room(s), {subscribed}/{subscribers} subscribers and \
             {published_by}/{publishers} publishers connected in {connect:.2}s, rate {rate}, {body} B bodies, \
             in-flight {in_flight}/publisher\n\
             \x20 window {window:.1}s after {warmup:.1}s warm-up: \
             published {sent_rate:.0} msg/s, deliveries {delivered_rate:.0}/s over all subscribers\n\
             \x20 send->deliver latency: p50 {p50} p99 {p99} p999 {p999} max {max} ({n} samples)\n\
             \x20 send->send_ack latency: p50 {a50} p99 {a99} p999 {a999} max {amax}\n\
             \x20 deliveries: expected {expected}, received {received}, missing {missing} \
             (after {drain:.2}s of drain{drained}) | duplicates {dups}\n\
             \x20 publishes: sent {sent} ack OK {ok} dup {dup} | rejected {rej} retry {retry} given up {given_up} \
             (paced or refused by the server, not deliveries) | freed by timeout {expired} | errors {errors}",
            label = self.label,
            url = self.url,
            encoding = self.encoding,
            rooms = rooms.rooms,
            subscribed = rooms.subscribers_connected,
            subscribers = rooms.subscribers,
            published_by = rooms.publishers_connected,
            publishers = rooms.publishers,
            connect = self.connect_time.as_secs_f64(),
            rate = if self.rate == 0 { "max".to_owned() } else { format!("{}/s", self.rate) },
            body = self.body_bytes,
            in_flight = self.in_flight,
            window = self.duration.as_secs_f64(),
            warmup = self.warmup.as_secs_f64(),
            sent_rate = self.sent_per_second(),
            delivered_rate = self.delivered_per_second(),
            p50 = format_us(self.latency.p50_us),
            p99 = format_us(self.latency.p99_us),
            p999 = format_us(self.latency.p999_us),
            max = format_us(self.latency.max_us),
            n = self.latency.count,
            a50 = format_us(self.ack_latency.p50_us),
            a99 = format_us(self.ack_latency.p99_us),
            a999 = format_us(self.ack_latency.p999_us),
            amax = format_us(self.ack_latency.max_us),
            expected = rooms.expected,
            received = rooms.received,
            missing = rooms.missing,
            drain = self.drain_time.as_secs_f64(),
            drained = if self.drained { "" } else { ", timed out" },
            dups = c.duplicates,
            sent = c.sent,
            ok = c.ack_ok,
            dup = c.ack_duplicate,
            rej = c.ack_rejected,
            retry = c.ack_retry,
            given_up = c.given_up,
            expired = rooms.expired,
            errors = c.errors,
        );
        if rooms.publisher_received > 0 {
            text.push_str(&format!("\n  publishers received {} of each other's messages", rooms.publisher_received));
        }
        if let Some(lag) = self.send_lag {
            text.push_str(&format!(
                "\n  generator lag behind schedule: p50 {} p99 {} max {}",
                format_us(lag.p50_us),
                format_us(lag.p99_us),
                format_us(lag.max_us)
            ));
        }
        if let Some(error) = &self.first_error {
            text.push_str(&format!("\n  first error: {error}"));
        }
        text
    }

    /// With several endpoints: how many pairs crossed them, and the send → deliver latency
    /// of same-endpoint and cross-endpoint pairs, each line ending in a newline. Empty with
    /// one endpoint, so a one-server run prints what it always did.
    fn by_endpoint_text(&self) -> String {
        if self.endpoints <= 1 {
            return String::new();
        }
        let pairs = self.pairs;
        let cross = self.cross_endpoint_pairs;
        let share = if pairs > 0 { 100.0 * cross as f64 / pairs as f64 } else { 0.0 };
        let line = |name: &str, latency: &LatencySummary| {
            format!(
                "  {name} pairs, send->deliver: p50 {} p99 {} p999 {} max {} ({} samples)\n",
                format_us(latency.p50_us),
                format_us(latency.p99_us),
                format_us(latency.p999_us),
                format_us(latency.max_us),
                latency.count,
            )
        };
        format!(
            "  endpoints: {endpoints}, users round-robin; pairs: {pairs}, cross-endpoint {cross} ({share:.1}%), \
             same-endpoint {same}\n{same_line}{cross_line}",
            endpoints = self.endpoints,
            same = pairs - cross.min(pairs),
            same_line = line("same-endpoint", &self.same_endpoint_latency),
            cross_line = line("cross-endpoint", &self.cross_endpoint_latency),
        )
    }
}

/// `count / duration` in events per second (0 for an empty duration).
pub fn per_second(count: u64, duration: Duration) -> f64 {
    let seconds = duration.as_secs_f64();
    if seconds > 0.0 { count as f64 / seconds } else { 0.0 }
}

/// Microseconds as a short human string: `850us`, `3.20ms`, `1.50s`.
pub fn format_us(micros: u64) -> String {
    if micros < 1_000 {
        format!("{micros}us")
    } else if micros < 1_000_000 {
        format!("{:.2}ms", micros as f64 / 1_000.0)
    } else {
        format!("{:.2}s", micros as f64 / 1_000_000.0)
    }
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A send given up after RETRYs, or rejected, is settled: only sends still waiting
    /// for an answer, and accepted ones still on their way, kept the drain waiting.
    #[test]
    fn the_drain_waits_for_unanswered_sends_and_undelivered_accepted_ones_only() {
        let counts = CountSnapshot {
            sent: 10,
            ack_ok: 6,
            ack_duplicate: 1,
            ack_rejected: 1,
            given_up: 1,
            delivered: 5,
            ..CountSnapshot::default()
        };
        assert_eq!(counts.not_drained(), (1, 2));
    }

    #[test]
    fn microseconds_read_well() {
        assert_eq!(format_us(850), "850us");
        assert_eq!(format_us(3_200), "3.20ms");
        assert_eq!(format_us(1_500_000), "1.50s");
    }

    #[test]
    fn rates_divide_by_the_window() {
        assert_eq!(per_second(500, Duration::from_millis(500)), 1000.0);
        assert_eq!(per_second(5, Duration::ZERO), 0.0);
    }

    #[test]
    fn sharded_latencies_merge() {
        let recorder = LatencyRecorder::new(4);
        for user in 0..100 {
            recorder.record(user, 1_000);
        }
        recorder.record(7, 0);
        recorder.record(7, u64::MAX);
        let summary = LatencySummary::of(&recorder.merged());
        assert_eq!(summary.count, 102);
        assert!((995..=1005).contains(&summary.p50_us));
        assert!(summary.max_us >= MAX_TRACKED_US);
    }

    #[test]
    fn empty_histograms_summarise_to_zero() {
        assert_eq!(LatencySummary::of(&LatencyRecorder::new(1).merged()), LatencySummary::default());
    }

    #[test]
    fn report_json_names_the_figures_scripts_read() {
        let report = Report {
            label: "relay".to_owned(),
            duration: Duration::from_secs(2),
            counts: CountSnapshot { window_delivered: 100, ..CountSnapshot::default() },
            verification: Some(Verification { acked_ids: 3, delivered_ids: 3, ..Verification::default() }),
            ..Report::default()
        };
        let json = report.to_json();
        assert_eq!(json["delivered_per_s"], 50.0);
        assert_eq!(json["label"], "relay");
        assert_eq!(json["verification"]["exact"], true);
        assert!(json["latency"]["p999_us"].is_u64());
        assert!(!report.to_text().is_empty());
    }
}

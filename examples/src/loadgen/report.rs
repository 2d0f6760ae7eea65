//! The outcome of a load run, [`Report`], with the figures only a room run has
//! ([`RoomFigures`]) and the id cross-check ([`Verification`]): what the counters and
//! histograms of `stats.rs` add up to, as text for people and JSON for scripts.

use std::time::Duration;

use serde_json::{Value, json};

use super::stats::{CountSnapshot, LatencySummary, format_us, per_second, round3};
use super::timeline::Timeline;

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

/// What only a room run measures, beside the pair mode's figures in [`Report`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomFigures {
    /// Rooms.
    pub rooms: u64,
    /// Subscriber connections asked for.
    pub subscribers: u64,
    /// Subscribers that connected and subscribed.
    pub subscribers_connected: u64,
    /// Publisher connections asked for.
    pub publishers: u64,
    /// Publishers that connected and subscribed.
    pub publishers_connected: u64,
    /// Deliveries expected: each accepted message × its room's connected subscribers.
    pub expected: u64,
    /// Distinct deliveries to subscribers.
    pub received: u64,
    /// Expected deliveries that never arrived, counted after the drain.
    pub missing: u64,
    /// Messages publishers got from other publishers of their room (not counted as
    /// deliveries).
    pub publisher_received: u64,
    /// Messages whose in-flight credit was freed by the timeout, not by a full delivery.
    pub expired: u64,
}

impl RoomFigures {
    /// The figures as one JSON object.
    pub fn to_json(&self) -> Value {
        json!({
            "rooms": self.rooms,
            "subscribers": self.subscribers,
            "subscribers_connected": self.subscribers_connected,
            "publishers": self.publishers,
            "publishers_connected": self.publishers_connected,
            "expected_deliveries": self.expected,
            "received_deliveries": self.received,
            "missing_deliveries": self.missing,
            "publisher_received": self.publisher_received,
            "expired": self.expired,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

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

//! When the writer pings. Two promises meet here: the client hears from the server at
//! least every `heartbeat` (so a client notices a dead server within a heartbeat and a
//! margin, PROTOCOL.md), and the server hears from the client before `client_timeout`
//! runs out (so an idle client that answers is never closed).
//!
//! Any frame the server writes is a sign of life, so a busy connection gets no pings; an
//! idle one gets one per `heartbeat`. Only a ping that asks (`reply`) wants a `pong`, and
//! the server asks only when the client has been silent long enough that its timeout
//! nears: an idle connection's ping asks once the silence is three heartbeats short of
//! the timeout (so one of its regular pings asks, never an extra one), a busy connection
//! gets a ping that asks two heartbeats short of it, and an ask not answered is repeated a
//! heartbeat later, in time for the timeout. A frequent heartbeat then costs a write per
//! interval, not a write and a read.
//!
//! Pings are sent a little early, at the start of the node-wide slot of `grain` their
//! moment falls in, so that the idle connections' pings go out together: a worker woken
//! once writes hundreds of them, where pings spread over the second would wake the
//! runtime for each (and a wake-up costs an idle node more than the write).

use std::time::Duration;

use tokio::time::Instant;

/// The writer's heartbeat state: when it last wrote and last asked for an answer.
#[derive(Debug)]
pub(super) struct Heartbeat {
    every: Duration,
    /// A silence from the client at least this long makes a regular ping ask for a `pong`.
    ask_after: Duration,
    /// A silence this long gets a ping that asks, due or not (a busy connection's).
    ask_by: Duration,
    /// How much earlier than its moment a ping may go, to share a slot with others.
    grain: Duration,
    wrote_at: Instant,
    asked_at: Option<Instant>,
}

/// A ping to send now; `reply` when it asks for a `pong`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Due {
    pub reply: bool,
}

impl Heartbeat {
    /// Pings after `every` without a write; asks for an answer from three intervals before
    /// `client_timeout` on (a busy connection from two before). Each moment may come up to
    /// a twentieth of `every` early (at most [`MAX_GRAIN`]).
    pub(super) fn new(every: Duration, client_timeout: Duration, now: Instant) -> Self {
        Self::with_grain(every, client_timeout, (every / 20).min(MAX_GRAIN), now)
    }

    fn with_grain(every: Duration, client_timeout: Duration, grain: Duration, now: Instant) -> Self {
        let ask_after = client_timeout.saturating_sub(every.saturating_mul(3));
        let ask_by = client_timeout.saturating_sub(every.saturating_mul(2));
        Self { every, ask_after, ask_by, grain, wrote_at: now, asked_at: None }
    }

    /// Frames were written at `now`.
    pub(super) fn wrote(&mut self, now: Instant) {
        self.wrote_at = now;
    }

    /// Whether to ping at `now`, the client last heard at `heard_at`.
    pub(super) fn due(&mut self, now: Instant, heard_at: Instant) -> Option<Due> {
        let early = now + self.grain;
        let reply = if early >= self.wrote_at + self.every {
            early >= heard_at + self.ask_after
        } else if early >= self.ask_moment(heard_at) {
            true
        } else {
            return None;
        };
        if reply {
            self.asked_at = Some(now);
        }
        self.wrote_at = now;
        Some(Due { reply })
    }

    /// The next moment [`Heartbeat::due`] may say to ping: the writer sleeps until then.
    /// Never later than the moment itself, at most `grain` earlier: the start of the next
    /// node-wide slot once the moment is less than `grain` away.
    pub(super) fn next(&self, heard_at: Instant) -> Instant {
        let moment = (self.wrote_at + self.every).min(self.ask_moment(heard_at));
        slot_after(moment.checked_sub(self.grain).unwrap_or(moment), self.grain)
    }

    /// When a ping that asks is due whether or not the connection is idle: once the client
    /// has been silent for `ask_by`, or a heartbeat after an ask no answer followed.
    fn ask_moment(&self, heard_at: Instant) -> Instant {
        match self.asked_at {
            Some(asked) if asked >= heard_at => asked + self.every,
            _ => heard_at + self.ask_by,
        }
    }
}

/// The longest a ping may come early to share a slot.
const MAX_GRAIN: Duration = Duration::from_millis(500);

/// The first boundary of a node-wide slot of `grain` at or after `moment` (`moment` itself
/// for no grain). Slots count from the first time this is asked, so every connection of the
/// node shares them.
fn slot_after(moment: Instant, grain: Duration) -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let grain_ns = grain.as_nanos();
    if grain_ns == 0 {
        return moment;
    }
    let epoch = *EPOCH.get_or_init(Instant::now);
    let Some(since) = moment.checked_duration_since(epoch) else { return moment };
    let slots = since.as_nanos().div_ceil(grain_ns);
    u64::try_from(slots * grain_ns).map_or(moment, |ns| epoch + Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn beat() -> (Heartbeat, Instant) {
        let start = Instant::now();
        (Heartbeat::with_grain(10 * S, 90 * S, Duration::ZERO, start), start)
    }

    #[test]
    fn an_idle_connection_is_pinged_every_interval_and_asked_before_its_timeout() {
        let (mut beat, start) = beat();
        let heard = start;
        let mut pings = Vec::new();
        let mut now = start;
        while now < start + 100 * S {
            now = beat.next(heard);
            if let Some(due) = beat.due(now, heard) {
                pings.push(((now - start).as_secs(), due.reply));
            }
        }
        let asked: Vec<u64> = pings.iter().filter(|(_, reply)| *reply).map(|(at, _)| *at).collect();
        assert_eq!(asked, vec![60, 70, 80, 90, 100], "asked from three intervals before the timeout, each interval");
        let every: Vec<u64> = pings.iter().map(|(at, _)| *at).collect();
        assert_eq!(every, (1..=10).map(|n| n * 10).collect::<Vec<_>>(), "one ping per interval, no more");
    }

    #[test]
    fn a_client_that_answers_gets_one_ping_an_interval_and_no_more() {
        let (mut beat, start) = beat();
        let (mut heard, mut now) = (start, start);
        let mut pings = Vec::new();
        while now < start + 300 * S {
            now = beat.next(heard);
            if let Some(due) = beat.due(now, heard) {
                pings.push((now - start).as_secs());
                if due.reply {
                    heard = now + Duration::from_millis(2);
                }
            }
        }
        assert_eq!(pings, (1..=30).map(|n| n * 10).collect::<Vec<_>>(), "the asks ride on the regular pings");
    }

    #[test]
    fn an_answer_stops_the_asking_until_the_next_long_silence() {
        let (mut beat, start) = beat();
        assert_eq!(beat.due(start + 70 * S, start), Some(Due { reply: true }), "a late ping asks at once");
        // The pong arrived a moment later.
        let heard = start + 70 * S + Duration::from_millis(5);
        assert_eq!(beat.due(start + 80 * S, heard), Some(Due { reply: false }), "a plain ping: heard 10 s ago");
        assert_eq!(beat.next(heard), start + 90 * S);
        assert_eq!(beat.due(heard + 70 * S, heard), Some(Due { reply: true }), "asked again 70 s after the answer");
    }

    #[test]
    fn writes_postpone_plain_pings_but_never_the_ask() {
        let (mut beat, start) = beat();
        // The server writes every second (a room's broadcasts); the client never writes.
        for second in 1..=69 {
            beat.wrote(start + second * S);
            assert_eq!(beat.due(start + second * S, start), None, "no ping while frames flow ({second} s)");
        }
        assert_eq!(beat.next(start), start + 70 * S, "the ask is due at 70 s whatever was written");
        assert_eq!(beat.due(start + 70 * S, start), Some(Due { reply: true }));
    }

    #[test]
    fn pings_share_slots_and_come_early_never_late() {
        let start = Instant::now();
        let grain = Duration::from_millis(500);
        let mut beats: Vec<Heartbeat> =
            (0..50u64).map(|n| Heartbeat::new(10 * S, 90 * S, start + Duration::from_millis(n * 37))).collect();
        let slots: std::collections::BTreeSet<Instant> = beats.iter().map(|beat| beat.next(start)).collect();
        assert!(slots.len() <= 5, "50 connections opened over 1.8 s ping in a few slots: {}", slots.len());
        for (n, beat) in beats.iter_mut().enumerate() {
            let opened = start + Duration::from_millis(n as u64 * 37);
            let at = beat.next(start);
            assert!(at <= opened + 10 * S && at + grain >= opened + 10 * S, "within a grain before its moment");
            assert_eq!(beat.due(at, start), Some(Due { reply: false }), "due when its slot comes");
        }
    }

    #[test]
    fn a_short_timeout_asks_at_every_ping() {
        let start = Instant::now();
        let mut beat = Heartbeat::with_grain(10 * S, 20 * S, Duration::ZERO, start);
        assert_eq!(beat.next(start), start, "nothing to wait for: ask at once");
        assert_eq!(beat.due(start, start), Some(Due { reply: true }));
        assert_eq!(beat.next(start), start + 10 * S);
    }
}
